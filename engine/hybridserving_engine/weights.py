"""Fill a node-local weights directory from a model hub, once per node.

Runs as the engine pod's `weights` init container. Every pod on a node mounts the same host
directory, so the first pod downloads and every later pod (a restart, a gang restart, a
role switch that relaunches, another instance on the node) finds the completed copy and
starts at once. Pods that arrive while a download runs wait on the same file lock instead
of downloading a second time.

The hub protocol is the Hugging Face Hub's HTTP API (also served by its mirrors and proxies):
`GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true` lists the files (`siblings`,
each with its `size`: the total a download's progress is measured against), and
`GET {endpoint}/{repo}/resolve/{revision}/{file}` returns one, with `Authorization: Bearer
<token>` for gated or private repositories. A download interrupted half-way resumes file by
file: files already complete at their announced size are kept.

While it runs, the step records its progress (bytes done and total, files done and total) in
`.<directory>.progress` next to the copy, and serves that file as JSON at `GET /weights` on the
pod's launcher port (`HYBRIDSERVING_LAUNCHER_HOST` / `HYBRIDSERVING_LAUNCHER_PORT`: the launcher
does not run before the init step ends, and the operator may already reach that port). A pod
that waits on the node's lock serves the same file, so it reports the download it waits for.
The operator reads it (it never gives engine pods API access); a port it cannot bind only
means no progress is served.

The outcome goes to the termination message (`HYBRIDSERVING_TERMINATION_LOG`, else
/dev/termination-log), which the kubelet copies into the pod status for the operator:
a JSON object on success, the error on failure.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from hybridserving.contract import ENV_LAUNCHER_PORT, WEIGHTS_PROGRESS_PATH

log = logging.getLogger("hybridserving.weights")

COMPLETE = ".complete"
CHUNK = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"
# The progress file is rewritten at most this often: a TB download reads ~10^6 chunks.
PROGRESS_EVERY_S = 0.5


class FetchError(Exception):
    """A download that cannot succeed as configured (said in words for the pod status)."""


@dataclass(frozen=True)
class Source:
    repo: str
    revision: str
    endpoint: str
    token: str | None

    def _request(self, url: str) -> urllib.request.Request:
        headers = {"User-Agent": "hybridserving-weights"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return urllib.request.Request(url, headers=headers)

    def _open(self, path: str, timeout: float = 60.0) -> http.client.HTTPResponse:
        url = f"{self.endpoint.rstrip('/')}/{path}"
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(self._request(url), timeout=timeout)
            return response
        except urllib.error.HTTPError as e:
            hint = {401: "the token is missing or wrong (check weights.tokenSecretRef)",
                    403: "the token has no access to this repository (gated: accept its terms)",
                    404: "no such repository, revision or file"}.get(e.code, e.reason)
            raise FetchError(f"{e.code} from the hub for {self.repo}@{self.revision}: {hint}") from None
        except urllib.error.URLError as e:
            raise FetchError(f"hub {self.endpoint} unreachable: {e.reason}") from None

    def files(self) -> dict[str, int | None]:
        """Every file of the revision and its size (None where the hub does not say)."""
        repo = urllib.parse.quote(self.repo)
        with self._open(f"api/models/{repo}/revision/{urllib.parse.quote(self.revision, safe='')}?blobs=true") as r:
            try:
                info = json.load(r)
                siblings = info.get("siblings") or []
                # A mirror or a proxy's error page can answer 200 with anything else.
                return {s["rfilename"]: s["size"] if isinstance(s.get("size"), int) else None
                        for s in sorted(siblings, key=lambda s: s["rfilename"])}
            except (ValueError, AttributeError, TypeError, KeyError) as e:
                raise FetchError(f"{self.endpoint} did not answer the file list of {self.repo}@{self.revision} "
                                 f"as the hub's API does ({type(e).__name__}: {e}); is HF_ENDPOINT a hub?") from None
            except http.client.HTTPException as e:
                raise FetchError(f"the file list of {self.repo}@{self.revision} broke off: {e!r}") from None

    def download(self, name: str, target: Path, advanced: Callable[[int], None] = lambda n: None) -> int:
        """One file into `target` (written aside, then renamed); its size in bytes. `advanced` hears
        of every chunk written."""
        path = (f"{urllib.parse.quote(self.repo)}/resolve/{urllib.parse.quote(self.revision, safe='')}/"
                f"{urllib.parse.quote(name)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        with self._open(path) as r, open(partial, "wb") as out:
            expected = r.headers.get("Content-Length")
            try:
                while chunk := r.read1(CHUNK):  # what has arrived, up to CHUNK: progress moves within a file
                    out.write(chunk)
                    advanced(len(chunk))
            except http.client.HTTPException as e:  # a chunked body cut short (IncompleteRead)
                raise FetchError(f"{name}: the download broke off after {out.tell()} bytes: {e!r}") from None
        size = partial.stat().st_size
        if expected is not None and int(expected) != size:
            raise FetchError(f"{name}: got {size} of {expected} bytes")
        os.replace(partial, target)
        return size


def progress_file(directory: Path) -> Path:
    """Where the fill of `directory` records its progress: next to it, like the node's lock."""
    return directory.parent / f".{directory.name}.progress"


class Progress:
    """The running download's figures, kept in the progress file (replaced whole, never torn)."""

    def __init__(self, path: Path, source: Source, sizes: dict[str, int | None]) -> None:
        self.path = path
        self.head = {"repo": source.repo, "revision": source.revision}
        known = [size for size in sizes.values() if size is not None]
        self.bytes_total = sum(known) if len(known) == len(sizes) else None
        self.files_total = len(sizes)
        self.bytes_done = self.files_done = 0
        self.written_at: float | None = None

    def advance(self, n: int) -> None:
        self.bytes_done += n
        if self.written_at is None or time.monotonic() - self.written_at >= PROGRESS_EVERY_S:
            self.write()

    def file_done(self) -> None:
        self.files_done += 1
        self.write()

    def write(self) -> None:
        doc = {**self.head, "bytesDone": self.bytes_done, "bytesTotal": self.bytes_total,
               "filesDone": self.files_done, "filesTotal": self.files_total}
        aside = self.path.with_name(self.path.name + ".tmp")
        aside.write_text(json.dumps(doc))
        os.replace(aside, self.path)
        self.written_at = time.monotonic()


def fill(source: Source, directory: Path) -> dict[str, object]:
    """Make `directory` a complete copy of the repository; download only what is missing."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.parent / f".{directory.name}.lock"
    started = time.monotonic()
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node; the others wait for it
        marker = directory / COMPLETE
        done = _completed(marker)
        if done is not None:
            return {**done, "downloaded": False, "seconds": round(time.monotonic() - started, 3)}
        sizes = source.files()
        progress = Progress(progress_file(directory), source, sizes)
        progress.write()  # at once: a file left by an earlier, failed attempt is not this one's
        total = downloaded_files = 0
        for name in sizes:
            target = directory / name
            if target.exists():
                size = target.stat().st_size
                total += size
                progress.advance(size)
            else:
                total += source.download(name, target, progress.advance)
                downloaded_files += 1
                log.info("%s: %d bytes so far", name, total)
            progress.file_done()
        done = {"repo": source.repo, "revision": source.revision, "files": len(sizes), "bytes": total}
        aside = marker.with_name(marker.name + ".tmp")
        aside.write_text(json.dumps(done))
        os.replace(aside, marker)  # whole or absent: a node that lost power mid-write fills again
        return {**done, "downloaded": True, "downloadedFiles": downloaded_files,
                "seconds": round(time.monotonic() - started, 3)}


def _completed(marker: Path) -> dict[str, object] | None:
    """What a finished fill recorded, or None where it did not finish: no marker, or one an older
    version left torn (written in place) or empty, which would otherwise fail every pod on the node.
    The files are checked again then; only finished ones were renamed into place."""
    try:
        done = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) else None


def serve_progress(path: Path, host: str, port: int) -> ThreadingHTTPServer | None:
    """Serve the progress file at `GET /weights` until shut down; None when the port cannot be bound
    (progress is then unknown to the operator, and the fill goes on regardless)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            try:
                body = path.read_bytes() if self.path.split("?", 1)[0] == WEIGHTS_PROGRESS_PATH else None
                status = HTTPStatus.OK if body is not None else HTTPStatus.NOT_FOUND
            except OSError:  # no download has recorded anything yet
                body, status = None, HTTPStatus.NOT_FOUND
            body = body or b'{"error": "no progress recorded"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        log.warning("weights: progress not served on %s:%d (%s)", host, port, e)
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="progress", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    env = os.environ
    termination = Path(env.get("HYBRIDSERVING_TERMINATION_LOG", "/dev/termination-log"))
    try:
        source = Source(
            repo=env["HYBRIDSERVING_WEIGHTS_REPO"],
            revision=env.get("HYBRIDSERVING_WEIGHTS_REVISION") or "main",
            endpoint=env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT,
            token=env.get("HF_TOKEN") or None,
        )
        directory = Path(env["HYBRIDSERVING_WEIGHTS_DIR"])
        port = env.get(ENV_LAUNCHER_PORT, "")
        server = serve_progress(progress_file(directory), env.get("HYBRIDSERVING_LAUNCHER_HOST") or "0.0.0.0",
                                int(port)) if port.isdigit() else None
        try:
            outcome = fill(source, directory)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
    except (FetchError, KeyError, OSError) as e:
        message = f"missing setting {e}" if isinstance(e, KeyError) else str(e)
        log.error("weights: %s", message)
        termination.write_text(message)
        return 1
    log.info("weights: %s", json.dumps(outcome))
    termination.write_text(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
