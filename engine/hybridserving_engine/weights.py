"""Fill a node-local weights directory from a model hub, once per node.

Runs as the engine pod's `weights` init container. Every pod on a node mounts the same host
directory, so the first pod downloads and every later pod (a restart, a gang restart, a
role switch that relaunches, another instance on the node) finds the completed copy and
starts at once. Pods that arrive while a download runs wait on the same file lock instead
of downloading a second time.

The hub protocol is the Hugging Face Hub's HTTP API (also served by its mirrors and proxies):
`GET {endpoint}/api/models/{repo}/revision/{revision}` lists the files (`siblings`), and
`GET {endpoint}/{repo}/resolve/{revision}/{file}` returns one, with `Authorization: Bearer
<token>` for gated or private repositories. A download interrupted half-way resumes file by
file: files already complete at their announced size are kept.

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
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("hybridserving.weights")

COMPLETE = ".complete"
CHUNK = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"


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

    def files(self) -> list[str]:
        repo = urllib.parse.quote(self.repo)
        with self._open(f"api/models/{repo}/revision/{urllib.parse.quote(self.revision, safe='')}") as r:
            info = json.load(r)
        return sorted(s["rfilename"] for s in info.get("siblings") or [])

    def download(self, name: str, target: Path) -> int:
        """One file into `target` (written aside, then renamed); its size in bytes."""
        path = (f"{urllib.parse.quote(self.repo)}/resolve/{urllib.parse.quote(self.revision, safe='')}/"
                f"{urllib.parse.quote(name)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        with self._open(path) as r, open(partial, "wb") as out:
            expected = r.headers.get("Content-Length")
            shutil.copyfileobj(r, out, CHUNK)
        size = partial.stat().st_size
        if expected is not None and int(expected) != size:
            raise FetchError(f"{name}: got {size} of {expected} bytes")
        os.replace(partial, target)
        return size


def fill(source: Source, directory: Path) -> dict[str, object]:
    """Make `directory` a complete copy of the repository; download only what is missing."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.parent / f".{directory.name}.lock"
    started = time.monotonic()
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node; the others wait for it
        marker = directory / COMPLETE
        if marker.exists():
            done = json.loads(marker.read_text())
            return {**done, "downloaded": False, "seconds": round(time.monotonic() - started, 3)}
        names = source.files()
        total = downloaded_files = 0
        for name in names:
            target = directory / name
            if target.exists():
                total += target.stat().st_size
                continue
            total += source.download(name, target)
            downloaded_files += 1
            log.info("%s: %d bytes so far", name, total)
        done = {"repo": source.repo, "revision": source.revision, "files": len(names), "bytes": total}
        marker.write_text(json.dumps(done))
        return {**done, "downloaded": True, "downloadedFiles": downloaded_files,
                "seconds": round(time.monotonic() - started, 3)}


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
        outcome = fill(source, Path(env["HYBRIDSERVING_WEIGHTS_DIR"]))
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
