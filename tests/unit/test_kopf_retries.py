"""kopf's own API calls (discovery, listings, watches) outlast any apiserver outage.

kopf escalates a call that still fails after its back-offs (about 54 s by default); an escalated
discovery ends the operator and an escalated 5xx or 403 ends a watch for good. The settings the
operator gives kopf keep retrying at the last back-off instead.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import kopf
import pytest
from kopf._cogs.clients import api, errors
from kubernetes import client

from hybridserving.controller import handlers

FAILURES = 12  # more than kopf's eight back-offs


class Unavailable:
    """A 503 as a load balancer answers while no apiserver is behind it."""

    status = 503
    headers: dict[str, str] = {}

    async def json(self) -> dict[str, Any]:
        return {"kind": "Status", "code": 503, "message": "no healthy upstream"}

    def raise_for_status(self) -> None:
        raise aiohttp.ClientResponseError(None, (), status=503)  # type: ignore[arg-type]


class Served:
    status = 200


class Session:
    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    async def request(self, **_: Any) -> Any:
        self.calls += 1
        if self.calls > FAILURES:
            return Served()
        if self.calls % 2:
            raise aiohttp.ClientConnectionError("connection refused")
        return Unavailable()


class Context:
    server = "https://apiserver"

    def __init__(self) -> None:
        self.session = Session()


def outage(settings: kopf.OperatorSettings, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[float]]:
    """One GET through kopf's request path against an apiserver away for FAILURES attempts."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(api.asyncio, "sleep", sleep)
    context = Context()
    result = asyncio.run(api.request("get", "/api", settings=settings, context=context,  # type: ignore[arg-type]
                                     logger=handlers.log))
    return result, slept


def test_kopf_alone_gives_up_after_its_back_offs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises((aiohttp.ClientConnectionError, errors.APIServerError)):
        outage(kopf.OperatorSettings(), monkeypatch)


def test_the_operators_settings_retry_until_the_apiserver_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = kopf.OperatorSettings()

    async def start() -> None:
        await handlers.start(settings=settings)
        await handlers.stop()

    monkeypatch.setattr(handlers.OPTIONS, "kube", handlers.Kube(client.ApiClient()))
    monkeypatch.setattr(handlers.OPTIONS, "election", None)
    monkeypatch.setattr(handlers, "act", lambda rt: None)
    asyncio.run(start())
    result, slept = outage(settings, monkeypatch)
    assert isinstance(result, Served)
    assert slept == [1, 1, 2, 3, 5, 8, 13, 21, 21, 21, 21, 21]
    assert list(itertools.islice(settings.networking.error_backoffs, 9)) == slept[:9], "afresh for each call"  # type: ignore[call-overload]
