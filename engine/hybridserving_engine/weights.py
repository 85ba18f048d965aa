"""Fill a node-local weights directory from a model hub, once per node.

Runs as the engine pod's `weights` init container. Every pod on a node mounts the same host
directory, so the first pod downloads and every later pod (a restart, a gang restart, a
role switch that relaunches, another instance on the node) finds the completed copy and
starts at once. Pods that arrive while a download runs wait on the same file lock instead
of downloading a second time.

The hub protocol is the Hugging Face Hub's HTTP API (also served by its mirrors and proxies):
`GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true` lists the files (`siblings`,
each with its `size`: the total a download's progress is measured against) and the commit the
revision names now (`sha`), and `GET {endpoint}/{repo}/resolve/{commit}/{file}` returns one,
with `Authorization: Bearer <token>` for gated or private repositories. Every file is fetched
at that one commit, so a branch that moves during a download cannot mix two commits in a copy;
the copy records it. The token goes to the endpoint's own origin only: the hub redirects large
files to a CDN or a presigned store URL, which gets the request without it. A download
interrupted half-way resumes file by file: files already complete at their announced size are
kept. The listing is the hub's word, not a path: a name that would leave the copy's directory
fails the fill.

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
import re
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from hybridserving.contract import ENV_LAUNCHER_PORT, WEIGHTS_PROGRESS_PATH

log = logging.getLogger("hybridserving.weights")

COMPLETE = ".complete"
PARTIAL = ".part"
CHUNK = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"
# The progress file is rewritten at most this often: a TB download reads ~10^6 chunks.
PROGRESS_EVERY_S = 0.5


class FetchError(Exception):
    """A download that cannot succeed as configured (said in words for the pod status)."""


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect with the token only while it stays on the endpoint's origin (an https
    page sent to http is another origin): urllib would send it to any host (the token is
    carried as an unredirected header, which urllib drops, and put back here)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        token = req.unredirected_hdrs.get("Authorization")
        if new is not None and token and _origin(newurl) == _origin(req.full_url):
            new.add_unredirected_header("Authorization", token)
        return new


_OPENER = urllib.request.build_opener(_Redirects)


@dataclass(frozen=True)
class Listing:
    """A revision as the hub lists it: its files' sizes (None where it does not say) and the
    commit it names now (None where a mirror does not say)."""

    sizes: dict[str, int | None]
    commit: str | None


@dataclass(frozen=True)
class Source:
    repo: str
    revision: str
    endpoint: str
    token: str | None

    def _request(self, url: str) -> urllib.request.Request:
        request = urllib.request.Request(url, headers={"User-Agent": "hybridserving-weights"})
        if self.token:
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return request

    def _open(self, path: str, timeout: float = 60.0) -> http.client.HTTPResponse:
        url = f"{self.endpoint.rstrip('/')}/{path}"
        try:
            response: http.client.HTTPResponse = _OPENER.open(self._request(url), timeout=timeout)
            return response
        except urllib.error.HTTPError as e:
            hint = {401: "the token is missing or wrong (check weights.tokenSecretRef)",
                    403: "the token has no access to this repository (gated: accept its terms)",
                    404: "no such repository, revision or file"}.get(e.code, e.reason)
            raise FetchError(f"{e.code} from the hub for {self.repo}@{self.revision}: {hint}") from None
        except urllib.error.URLError as e:
            raise FetchError(f"hub {self.endpoint} unreachable: {e.reason}") from None
        except (http.client.HTTPException, ValueError) as e:  # a garbled answer, an endpoint that is no URL
            raise FetchError(f"hub {self.endpoint} did not answer as an HTTP server: {e!r}") from None

    def files(self) -> Listing:
        """Every file of the revision, with its size, and the commit the revision names."""
        repo = urllib.parse.quote(self.repo)
        with self._open(f"api/models/{repo}/revision/{urllib.parse.quote(self.revision, safe='')}?blobs=true") as r:
            try:
                info = json.load(r)
                siblings = info["siblings"]
                # A mirror or a proxy's error page can answer 200 with anything else.
                if not isinstance(siblings, list) or not siblings:
                    raise ValueError("no files listed")
                sizes = {s["rfilename"]: s["size"] if isinstance(s.get("size"), int) else None
                         for s in sorted(siblings, key=lambda s: s["rfilename"])}
                commit = info.get("sha")
            except (ValueError, AttributeError, TypeError, KeyError) as e:
                raise FetchError(f"{self.endpoint} did not answer the file list of {self.repo}@{self.revision} "
                                 f"as the hub's API does ({type(e).__name__}: {e}); is HF_ENDPOINT a hub?") from None
            except http.client.HTTPException as e:
                raise FetchError(f"the file list of {self.repo}@{self.revision} broke off: {e!r}") from None
        for name in sizes:
            _check_name(name, self)
        return Listing(sizes, commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit) else None)

    def download(self, name: str, target: Path, size: int | None = None, commit: str | None = None,
                 advanced: Callable[[int], None] = lambda n: None) -> int:
        """One file into `target` (written aside, flushed to disk, then renamed); its size in bytes.
        `size` is what the listing announced, `commit` the revision's commit to fetch it at;
        `advanced` hears of every chunk written."""
        revision = commit or self.revision
        path = (f"{urllib.parse.quote(self.repo)}/resolve/{urllib.parse.quote(revision, safe='')}/"
                f"{urllib.parse.quote(name)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + PARTIAL)
        with self._open(path) as r, open(partial, "wb") as out:
            header = r.headers.get("Content-Length")
            try:
                while chunk := r.read1(CHUNK):  # what has arrived, up to CHUNK: progress moves within a file
                    out.write(chunk)
                    advanced(len(chunk))
            except http.client.HTTPException as e:  # a chunked body cut short (IncompleteRead)
                raise FetchError(f"{name}: the download broke off after {out.tell()} bytes: {e!r}") from None
            out.flush()
            os.fsync(out.fileno())  # on disk before it is renamed: a node that crashes keeps no empty shard
        got = partial.stat().st_size
        for expected in (header, size):
            if expected is not None and str(expected).isdigit() and int(expected) != got:
                raise FetchError(f"{name}: got {got} of {expected} bytes")
        os.replace(partial, target)
        _sync_directory(target.parent)
        return got


def _check_name(name: object, source: Source) -> None:
    """Refuse a listed name that is no plain relative path inside the copy (`..`, absolute, the
    copy's own bookkeeping): a hostile or broken endpoint must not write beside the copy, where
    other fleets' copies are."""
    parts = name.split("/") if isinstance(name, str) else [""]
    if (not isinstance(name, str) or "\0" in name or any(p in ("", ".", "..") for p in parts)
            or name in (COMPLETE, COMPLETE + ".tmp") or name.endswith(PARTIAL)):
        raise FetchError(f"{source.endpoint} listed a file name that is no path inside the copy: {name!r} "
                         f"({source.repo}@{source.revision}); refusing to write it (is HF_ENDPOINT the hub?)")


def _sync_directory(directory: Path) -> None:
    """Make the renames in `directory` durable (a rename is only a directory entry until then)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    started = time.monotonic()
    marker = directory / COMPLETE
    done = _completed(marker)  # a finished copy needs no lock, nor a cache this user may write
    if done is not None:
        return {**done, "downloaded": False, "seconds": round(time.monotonic() - started, 3)}
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Read-only and open to all: a lock another user created still locks (flock needs no write).
        lock = os.open(directory.parent / f".{directory.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    except PermissionError as e:
        raise FetchError(_not_writable(directory.parent, e)) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node; the others wait for it
        done = _completed(marker)
        if done is not None:
            return {**done, "downloaded": False, "seconds": round(time.monotonic() - started, 3)}
        try:
            return {**_download_all(source, directory), "seconds": round(time.monotonic() - started, 3)}
        except PermissionError as e:
            raise FetchError(_not_writable(directory, e)) from None
    finally:
        os.close(lock)


def _download_all(source: Source, directory: Path) -> dict[str, object]:
    """The fill under the node's lock: what is missing, at the listing's commit, then the marker."""
    listing = source.files()
    sizes = listing.sizes
    progress = Progress(progress_file(directory), source, sizes)
    progress.write()  # at once: a file left by an earlier, failed attempt is not this one's
    kept = {name for name in sizes if _whole(directory / name, sizes[name])}
    _check_space(directory, sum(size or 0 for name, size in sizes.items() if name not in kept))
    total = 0
    for name, size in sizes.items():
        target = directory / name
        if name in kept:
            got = target.stat().st_size
            progress.advance(got)
        else:
            got = source.download(name, target, size, listing.commit, progress.advance)
            log.info("%s: %d bytes so far", name, total + got)
        total += got
        progress.file_done()
    for leftover in directory.rglob(f"*{PARTIAL}"):  # an earlier attempt's, of a file now whole
        leftover.unlink(missing_ok=True)
    done = {"repo": source.repo, "revision": source.revision, "commit": listing.commit, "files": len(sizes),
            "bytes": total}
    aside = directory / (COMPLETE + ".tmp")
    with open(aside, "w") as out:
        out.write(json.dumps(done))
        out.flush()
        os.fsync(out.fileno())
    os.replace(aside, directory / COMPLETE)  # whole or absent: a node that lost power mid-write fills again
    _sync_directory(directory)
    return {**done, "downloaded": True, "downloadedFiles": len(sizes) - len(kept)}


def _whole(path: Path, size: int | None) -> bool:
    """Whether an earlier attempt left this file whole: at its listed size (any size where the
    listing gives none; only finished files were ever renamed into place)."""
    try:
        return path.is_file() and (size is None or path.stat().st_size == size)
    except OSError:
        return False


def _check_space(directory: Path, needed: int) -> None:
    """Fail before a download that cannot fit rather than fill the node's disk half-way (a full
    disk on the kubelet's filesystem puts the node under DiskPressure and evicts other pods)."""
    free = shutil.disk_usage(directory.parent).free
    if needed > free:
        raise FetchError(f"the node cache has {free / 1e9:.1f} GB free and the copy needs {needed / 1e9:.1f} GB "
                         "more: free space in spec.model.weights.nodeCachePath on this node (older copies there "
                         "that no fleet uses can be removed) or size the disk for two copies of the model")


def _not_writable(path: Path, error: OSError) -> str:
    return (f"the node cache is not writable by this pod's user (uid {os.getuid()}): {error.strerror} on "
            f"{error.filename or path}. The kubelet creates a missing hostPath directory owned by root; create "
            "spec.model.weights.nodeCachePath on every GPU node owned by the engine's user (uid 65532 unless the "
            "pod template sets runAsUser), e.g. `install -d -o 65532 -g 65532 /var/lib/hybridserving/models`. "
            "Fleets that share a node cache must run as the same user")


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
    except (FetchError, KeyError, OSError, ValueError, http.client.HTTPException) as e:
        message = f"missing setting {e}" if isinstance(e, KeyError) else str(e) or repr(e)
        log.error("weights: %s", message)
        termination.write_text(message)
        return 1
    log.info("weights: %s", json.dumps(outcome))
    termination.write_text(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
