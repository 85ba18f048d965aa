"""A model hub on loopback speaking the two Hugging Face Hub endpoints the weights fill uses.

It counts every file download, so tests can show that a node downloads once and that
restarts and role switches reuse the node's copy; it checks the bearer token, so tests can
show that the token reached the pod from its Secret. Like the Hub, it lists file sizes only
when asked with `?blobs=true`. `bytes_per_second` throttles every download, so a test can
watch one in progress. `sha` is the commit every revision names (a test moves it, as a branch
moves), and every download records the revision it asked for; `redirect_to` sends downloads
to another hub, as the Hub sends large files to its CDN, and `authorizations` records the
Authorization header of every request (None without one).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], token: str | None = None, host: str = "127.0.0.1",
                 bytes_per_second: float | None = None) -> None:
        self.repos = repos
        self.token = token
        self.bytes_per_second = bytes_per_second
        self.downloads: Counter[tuple[str, str]] = Counter()
        self.refused = 0
        self.failing = False  # answer 503 to everything (an outage)
        self.sha = "0" * 40
        self.revisions: Counter[str] = Counter()
        self.redirect_to: FakeHub | None = None
        self.authorizations: list[str | None] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json",
                      rate: float | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                step = len(body) if rate is None else max(1, int(rate / 10))
                for start in range(0, len(body), step):
                    self.wfile.write(body[start:start + step])
                    if rate is not None:
                        self.wfile.flush()
                        time.sleep(step / rate)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hub.authorizations.append(self.headers.get("Authorization"))
                if hub.failing:
                    return self._send(HTTPStatus.SERVICE_UNAVAILABLE, b'{"error": "unavailable"}')
                if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    hub.refused += 1
                    return self._send(HTTPStatus.UNAUTHORIZED, b'{"error": "Invalid credentials"}')
                raw_path, _, query = self.path.partition("?")
                path = unquote(raw_path).lstrip("/")
                if path.startswith("api/models/"):
                    repo, _, _revision = path.removeprefix("api/models/").rpartition("/revision/")
                    files = hub.repos.get(repo)
                    if files is None:
                        return self._send(HTTPStatus.NOT_FOUND, b'{"error": "Repository not found"}')
                    blobs = parse_qs(query).get("blobs") == ["true"]
                    body = {"id": repo, "sha": hub.sha, "siblings": [
                        {"rfilename": f, **({"size": len(files[f])} if blobs else {})} for f in sorted(files)]}
                    return self._send(HTTPStatus.OK, json.dumps(body).encode())
                for repo, files in hub.repos.items():
                    prefix = f"{repo}/resolve/"
                    if path.startswith(prefix):
                        revision, name = path.removeprefix(prefix).split("/", 1)
                        if hub.redirect_to is not None:
                            self.send_response(HTTPStatus.FOUND)
                            self.send_header("Location", f"{hub.redirect_to.endpoint}{self.path}")
                            self.send_header("Content-Length", "0")
                            return self.end_headers()
                        if name in files:
                            hub.revisions[revision] += 1
                            hub.downloads[(repo, name)] += 1
                            return self._send(HTTPStatus.OK, files[name], "application/octet-stream",
                                              hub.bytes_per_second)
                self._send(HTTPStatus.NOT_FOUND, b'{"error": "Entry not found"}')

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
