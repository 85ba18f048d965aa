"""A model hub on loopback speaking the two Hugging Face Hub endpoints the weights fill uses.

It counts every file download, so tests can show that a node downloads once and that
restarts and role switches reuse the node's copy; it checks the bearer token, so tests can
show that the token reached the pod from its Secret.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], token: str | None = None, host: str = "127.0.0.1") -> None:
        self.repos = repos
        self.token = token
        self.downloads: Counter[tuple[str, str]] = Counter()
        self.refused = 0
        self.failing = False  # answer 503 to everything (an outage)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if hub.failing:
                    return self._send(HTTPStatus.SERVICE_UNAVAILABLE, b'{"error": "unavailable"}')
                if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    hub.refused += 1
                    return self._send(HTTPStatus.UNAUTHORIZED, b'{"error": "Invalid credentials"}')
                path = unquote(self.path.split("?", 1)[0]).lstrip("/")
                if path.startswith("api/models/"):
                    repo, _, _revision = path.removeprefix("api/models/").rpartition("/revision/")
                    files = hub.repos.get(repo)
                    if files is None:
                        return self._send(HTTPStatus.NOT_FOUND, b'{"error": "Repository not found"}')
                    body = {"id": repo, "sha": "0" * 40, "siblings": [{"rfilename": f} for f in sorted(files)]}
                    return self._send(HTTPStatus.OK, json.dumps(body).encode())
                for repo, files in hub.repos.items():
                    prefix = f"{repo}/resolve/"
                    if path.startswith(prefix):
                        name = path.removeprefix(prefix).split("/", 1)[1]
                        if name in files:
                            hub.downloads[(repo, name)] += 1
                            return self._send(HTTPStatus.OK, files[name], "application/octet-stream")
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
