"""The operator's liveness endpoint, `/healthz` on `--health-port` (the chart's liveness probe).

kopf's own endpoint answers 200 for as long as its event loop runs, which is no longer proof of
work once passes run on threads (core/liveness.py). Its probe handlers (`@kopf.on.probe`) cannot
say more: one that raises holds the request through kopf's retries (a minute apart by default) or,
marked permanent, turns it into a bare 500 with a traceback logged at every probe. This endpoint
runs in the same event loop, so it still stops answering when the loop stops, and it answers 503
with the reason when the operator is not running or a pass is stuck.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from hybridserving.core.liveness import Unhealthy

PATH = "/healthz"

Check = Callable[[], Unhealthy | None]


def application(check: Check) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        unhealthy = check()
        if unhealthy is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=unhealthy.describe() + "\n")

    app = web.Application()
    app.add_routes([web.get(PATH, healthz)])
    return app


async def listen(check: Check, host: str, port: int) -> web.AppRunner:
    """Serve `check` at /healthz on `host`:`port` (0: any free port) until the runner is cleaned up."""
    runner = web.AppRunner(application(check), handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
