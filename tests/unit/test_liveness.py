"""A reconcile pass or role-switch tick that never ends fails the operator's liveness probe.

Passes run on threads that nothing can stop: one that hangs holds its fleet for good, and a few
of them stop the operator while its event loop, and a probe that asks only that, stays well.
/healthz (controller/health.py) answers 503 naming the fleet once the oldest pass has run longer
than --stuck-pass-seconds, and the operator logs it once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import kopf
import pytest
from prometheus_client import REGISTRY

from hybridserving.controller import __main__ as operator_main
from hybridserving.controller import handlers, health, switching
from hybridserving.controller.kube import Kube
from hybridserving.core.liveness import (
    STUCK_PASS_SECONDS,
    NotRunning,
    Running,
    StuckPass,
    oldest_seconds,
    stuck_pass,
)

FLEET = {"apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
         "metadata": {"name": "f", "namespace": "ns", "resourceVersion": "1"}, "spec": {}}


# The decision.

A = Running("ns", "a", "reconcile pass", 100.0)
B = Running("ns", "b", "role-switch tick", 40.0)


def test_nothing_running_is_never_stuck() -> None:
    assert stuck_pass([], 1e9, 600) is None
    assert oldest_seconds([], 1e9) == 0.0


def test_the_oldest_pass_past_the_limit_is_stuck() -> None:
    assert stuck_pass([A, B], 640.0, 600) is None  # B has run exactly 600 s
    stuck = stuck_pass([A, B], 700.0, 600)
    assert stuck == StuckPass(B, 660.0, 600)
    assert stuck.describe().startswith("the role-switch tick of ns/b has run for 660s")
    assert oldest_seconds([A, B], 700.0) == 660.0


def test_a_zero_limit_turns_the_check_off() -> None:
    assert stuck_pass([A, B], 1e9, 0) is None


# The tracker.

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_tracker_names_the_oldest_pass_and_logs_it_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    inflight = handlers.InFlight(clock)
    caplog.set_level(logging.ERROR, "hybridserving.controller")
    with inflight.running(("ns", "a"), "reconcile pass"):
        clock.now += 30
        with inflight.running(("ns", "b"), "role-switch tick"):
            assert inflight.oldest_seconds() == 30.0
            assert inflight.stuck(60) is None
            clock.now += 31
            stuck = inflight.stuck(60)
            assert stuck is not None and stuck.running == Running("ns", "a", "reconcile pass", 1000.0)
            assert stuck.seconds == 61.0
            assert inflight.stuck(60) == StuckPass(stuck.running, 61.0, 60)
        # Once a's pass ends, b's tick is the oldest; it is reported in its turn.
    assert [r.getMessage() for r in caplog.records] == [
        "the reconcile pass of ns/a has run for 61s (a pass running longer than 60s is stuck): "
        "it holds its fleet until the operator restarts"]
    assert inflight.oldest_seconds() == 0.0 and inflight.stuck(60) is None
    assert inflight.wait_idle(0)


def test_a_pass_stuck_again_after_the_first_ended_is_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    inflight = handlers.InFlight(clock)
    caplog.set_level(logging.ERROR, "hybridserving.controller")
    for _ in range(2):
        with inflight.running(("ns", "a"), "reconcile pass"):
            clock.now += 100
            assert inflight.stuck(60) is not None
            assert inflight.stuck(60) is not None
    assert len(caplog.records) == 2


def test_wait_idle_waits_for_every_pass() -> None:
    inflight = handlers.InFlight()
    release = threading.Event()

    def hold() -> None:
        with inflight.running(("ns", "a"), "reconcile pass"):
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert not inflight.wait_idle(0.05)
    finally:
        release.set()
        thread.join()
    assert inflight.wait_idle(0)


def test_a_fleets_passes_and_ticks_take_turns_and_other_fleets_do_not_wait() -> None:
    """A tick of fleet a waits for a's pass under way, and counts as running while it waits; a tick
    of fleet b runs beside it."""
    inflight = handlers.InFlight()
    release = threading.Event()
    order: list[str] = []

    def work(fleet: str, what: str, hold: bool = False) -> None:
        with inflight.running(("ns", fleet), what):  # type: ignore[arg-type]
            order.append(f"{what} {fleet}")
            if hold:
                release.wait(5)
            order.append(f"{what} {fleet} ended")

    holder = threading.Thread(target=work, args=("a", "reconcile pass", True))
    holder.start()
    while not order:
        time.sleep(0.01)
    waiter = threading.Thread(target=work, args=("a", "role-switch tick"))
    waiter.start()
    other = threading.Thread(target=work, args=("b", "role-switch tick"))
    other.start()
    other.join(5)
    waiter.join(0.2)
    try:
        assert order == ["reconcile pass a", "role-switch tick b", "role-switch tick b ended"]
        assert waiter.is_alive() and not inflight.wait_idle(0.05)
    finally:
        release.set()
        holder.join()
        waiter.join()
    assert order[3:] == ["reconcile pass a ended", "role-switch tick a", "role-switch tick a ended"]
    assert inflight.wait_idle(0) and inflight.oldest_seconds() == 0.0


def test_one_waiting_its_turn_is_timed_from_its_turn() -> None:
    """The pass a tick waits behind is the one stuck; once it ends, the tick is not reported for
    the time it waited."""
    clock = Clock()
    inflight = handlers.InFlight(clock)
    events = {what: threading.Event() for what in ("pass holds", "pass may end", "tick holds", "tick may end")}

    def work(what: str) -> None:
        with inflight.running(("ns", "a"), what):  # type: ignore[arg-type]
            short = what.split()[-1]
            events[f"{short} holds"].set()
            events[f"{short} may end"].wait(5)

    holder = threading.Thread(target=work, args=("reconcile pass",))
    holder.start()
    assert events["pass holds"].wait(5)
    waiter = threading.Thread(target=work, args=("role-switch tick",))
    waiter.start()
    clock.now += 100
    stuck = inflight.stuck(60)
    assert stuck is not None and stuck.running.work == "reconcile pass"
    events["pass may end"].set()
    assert events["tick holds"].wait(5)
    assert inflight.stuck(60) is None and inflight.oldest_seconds() == 0.0
    events["tick may end"].set()
    holder.join()
    waiter.join()


# The flag.

def test_the_flag_defaults_to_ten_minutes_and_zero_turns_it_off() -> None:
    assert operator_main.arguments().parse_args([]).stuck_pass_seconds == STUCK_PASS_SECONDS == 600
    assert operator_main.arguments().parse_args(["--stuck-pass-seconds", "0"]).stuck_pass_seconds == 0


# The endpoint, with the operator's real wiring: a reconcile pass that blocks until released.

@pytest.fixture
def pass_may_end(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    may_end = threading.Event()

    def reconcile(*_: Any, **__: Any) -> SimpleNamespace:
        may_end.wait(10)
        return SimpleNamespace(gone=False, conflict=False, errors=[], requeue_after=None)

    def tick(self: switching.SwitchController, namespace: str, name: str) -> switching.TickReport:
        return switching.TickReport()

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(switching.SwitchController, "tick", tick)
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(
        kube=Kube(None), switch_interval_seconds=0.05, stuck_pass_seconds=1.0))  # type: ignore[arg-type]
    yield may_end
    may_end.set()
    assert handlers._runtime is None, "the test stops the operator"


def test_healthz_fails_while_a_pass_is_stuck_and_recovers_when_it_ends(
        pass_may_end: threading.Event, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "hybridserving.controller")

    async def scenario() -> None:
        probe = await health.listen(handlers.unhealthy, "127.0.0.1", 0)
        host, port = probe.addresses[0][:2]
        url = f"http://{host}:{port}{health.PATH}"
        async with aiohttp.ClientSession() as session:
            async def get() -> tuple[int, str]:
                async with session.get(url) as response:
                    return response.status, await response.text()

            try:
                assert await get() == (503, NotRunning().describe() + "\n")
                await handlers.start(settings=kopf.OperatorSettings())
                assert await get() == (200, "ok\n")

                await handlers.fleet_changed(event={"type": "ADDED", "object": FLEET}, namespace="ns", name="f")
                await asyncio.sleep(0.1)
                assert await get() == (200, "ok\n")  # the pass runs, not yet for long
                assert REGISTRY.get_sample_value("hybridserving_oldest_pass_seconds") >= 0.1

                await asyncio.sleep(1.0)
                status, text = await get()
                assert status == 503
                assert text.startswith("the reconcile pass of ns/f has run for ")
                assert "longer than 1s is stuck" in text
                assert await get() == (status, text)  # still failing; logged only once
                assert REGISTRY.get_sample_value("hybridserving_oldest_pass_seconds") >= 1.0

                pass_may_end.set()
                deadline = time.monotonic() + 5
                while (await get())[0] != 200:
                    assert time.monotonic() < deadline, "still unhealthy after the pass ended"
                    await asyncio.sleep(0.02)
            finally:
                pass_may_end.set()
                await handlers.stop()
                await probe.cleanup()

    asyncio.run(scenario())
    logged = [r for r in caplog.records if r.name == "hybridserving.controller"]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    assert logged[0].getMessage().startswith("the reconcile pass of ns/f has run for ")


def test_the_operator_serves_healthz_beside_kopf_and_not_kopfs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answers: list[int] = []

    async def operator(**kwargs: Any) -> None:
        assert kwargs.get("liveness_endpoint") is None
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as r:
            answers.append(r.status)

    monkeypatch.setattr(kopf, "operator", operator)
    asyncio.run(operator_main.run(operator_main.arguments().parse_args(["--health-port", str(port)])))
    assert answers == [503]  # kopf has not run the startup handler
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # closed with kopf
