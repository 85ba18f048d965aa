"""SGLang 0.5.23's API keys, on the simulator's routes: the same callers refused, the same answer.

`allowed` is `sglang/srt/utils/auth.py:74-151` (`decide_request_auth`) for the routes the simulator
serves, none of which is ADMIN_FORCE (the only level refused with 403); `middleware` answers a
refusal as `add_api_key_middleware` does (lines 192-204): 401 `{"error": "Unauthorized"}`. SGLang
installs it only when a key is set (`entrypoints/http_server.py:2887-2898`): without keys every
route stays open.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

# Routes SGLang marks `@auth_level(AuthLevel.ADMIN_OPTIONAL)` (entrypoints/http_server.py:1025-1026
# /flush_cache, 1635-1636 /pd_role_switch, 1721-1722 /abort_request, 1831-1832 /pause_generation,
# 1844-1845 /continue_generation): with an admin key set they take that key only.
ADMIN_OPTIONAL = frozenset({"/flush_cache", "/pd_role_switch", "/abort_request", "/pause_generation",
                            "/continue_generation"})
# Always open, matched by prefix, "to support k8s probes and Prometheus scraping" (utils/auth.py:101-106).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# The simulator's own fault switch is no SGLang route: tests drive it with no key.
SIMULATOR_PREFIX = "/sim/"


def _bearer_matches(authorization: str | None, expected: str) -> bool:
    """`Authorization: Bearer <key>`, scheme in any case, compared in constant time (lines 108-117)."""
    if not authorization:
        return False
    parts = authorization.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return hmac.compare_digest(parts[1].encode(), expected.encode())


def allowed(method: str, path: str, authorization: str | None, api_key: str | None,
            admin_api_key: str | None) -> bool:
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES) or path.startswith(SIMULATOR_PREFIX):
        return True
    if path in ADMIN_OPTIONAL:
        expected = admin_api_key or api_key
    else:
        expected = api_key  # NORMAL routes: only --api-key counts, even with an admin key set
    return expected is None or _bearer_matches(authorization, expected)


def middleware(api_key: str | None, admin_api_key: str | None) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not allowed(request.method, request.path, request.headers.get("Authorization"), api_key, admin_api_key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check
