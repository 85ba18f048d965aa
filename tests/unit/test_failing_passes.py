"""A fleet whose reconcile passes keep raising stops saying Ready.

A pass that raises (a LIST refused after an RBAC change, an apiserver answering 500, a bug) never
reaches the point where it writes status, so what status last said stayed in place: a fleet
nobody could observe for an hour still said Ready. Once passes have failed for
`FAILING_REPORTED_AFTER_SECONDS` in a row, Ready turns Unknown and Degraded True with the error,
and the next pass that completes says what it observes again.
"""

from __future__ import annotations

import asyncio
import copy
import time
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY

from hybridserving.controller import handlers, queue, switching
from hybridserving.controller import reconcile as rec
from hybridserving.controller.kube import Kube, KubeError
from hybridserving.controller.status import failing_status
from hybridserving.core import liveness
from hybridserving.core.liveness import FAILING_REPORTED_AFTER_SECONDS, failed_again
from support.apiserver import NS, MemoryApi
from support.fleets import settle

FORBIDDEN = ('403: pods is forbidden: User "system:serviceaccount:hs:hybridserving" cannot list '
             'resource "pods" in API group "" in the namespace "default"')


def test_a_streak_is_reported_once_it_has_lasted_a_minute_and_names_the_last_error() -> None:
    streak = failed_again(None, "500: etcdserver: request timed out", 100.0)
    assert not streak.reported(100.0 + FAILING_REPORTED_AFTER_SECONDS - 1)
    streak = failed_again(streak, FORBIDDEN, 100.0 + FAILING_REPORTED_AFTER_SECONDS)
    assert streak.passes == 2 and streak.since == 100.0
    assert streak.reported(100.0 + FAILING_REPORTED_AFTER_SECONDS)
    assert streak.describe(175.0) == (
        "2 reconcile passes in a row failed over 75s, so what this status last said is no longer observed: "
        f"{FORBIDDEN}; retried with a growing back-off")


def test_ready_turns_unknown_and_degraded_names_the_failure_the_rest_stays_as_it_was(api: MemoryApi) -> None:
    settle(api)
    before = {c["type"]: c for c in api.status()["conditions"]}
    status = failing_status(api.status(), "it failed", 1)
    after = {c["type"]: c for c in status["conditions"]}
    assert list(after) == list(before), "the same conditions, in the same order"
    assert (after["Ready"]["status"], after["Ready"]["reason"]) == ("Unknown", "ReconcileFailed")
    assert (after["Degraded"]["status"], after["Degraded"]["reason"]) == ("True", "ReconcileFailed")
    assert after["Ready"]["message"] == after["Degraded"]["message"] == "it failed"
    for kept in ("LayoutValid", "Progressing", "RoleSwitching"):
        assert after[kept] == before[kept]
    assert status["ready"] == "Unknown"


def test_the_fleet_says_so_with_one_warning_and_the_next_pass_that_completes_says_ready_again(
        api: MemoryApi) -> None:
    settle(api)

    def warnings() -> list[dict[str, Any]]:
        return [o for (k, _), o in sorted(api.store.items()) if k == "Event" and o["type"] == "Warning"]

    message = failed_again(None, FORBIDDEN, 0.0).describe(61.0)
    rec.report_failing(api, NS, "fleet", message)
    ready, degraded = api.condition("Ready"), api.condition("Degraded")
    assert (ready["status"], ready["reason"], ready["message"]) == ("Unknown", "ReconcileFailed", message)
    assert (degraded["status"], degraded["reason"]) == ("True", "ReconcileFailed")
    assert api.status()["ready"] == "Unknown"
    assert [(w["reason"], w["message"]) for w in warnings()] == [("ReconcileFailed", message)]
    rec.report_failing(api, NS, "fleet", message.replace("1 reconcile", "2 reconcile"))
    assert len(warnings()) == 1, "one Warning for the streak, not one per pass"

    rec.reconcile(api, NS, "fleet")
    assert (api.condition("Ready")["status"], api.condition("Degraded")["status"]) == ("True", "False")
    assert api.status()["ready"] == "True"


def condition_gauge(type_: str, status: str) -> float | None:
    return REGISTRY.get_sample_value("hybridserving_fleet_condition",
                                     {"namespace": NS, "hybridserving": "fleet", "type": type_, "status": status})


def test_a_refused_report_is_logged_and_the_condition_gauges_say_it_anyway(
        api: MemoryApi, caplog: pytest.LogCaptureFixture) -> None:
    settle(api)
    assert condition_gauge("Ready", "True") == 1.0
    api.down = True
    rec.report_failing(api, NS, "fleet", "it failed")
    assert "could not report failing passes (0: connection refused)" in caplog.text
    assert (condition_gauge("Ready", "True"), condition_gauge("Ready", "Unknown")) == (0.0, 1.0)
    assert condition_gauge("Degraded", "True") == 1.0, "the fleet-not-ready alerts read these"
    assert condition_gauge("LayoutValid", "True") == 1.0, "the other series stay"
    api.down = False
    rec.reconcile(api, NS, "fleet")
    assert (condition_gauge("Ready", "True"), condition_gauge("Degraded", "True")) == (1.0, 0.0)


def test_a_pass_that_raises_is_timed_like_one_that_completes(api: MemoryApi) -> None:
    def timed() -> float:
        return REGISTRY.get_sample_value("hybridserving_reconcile_duration_seconds_count") or 0.0

    settle(api)
    before = timed()
    api.down = True
    with pytest.raises(KubeError):
        rec.reconcile(api, NS, "fleet")
    assert timed() == before + 1
    api.down = False
    rec.reconcile(api, NS, "fleet")
    assert timed() == before + 2


# The operator's real wiring: passes that raise, on the work queue's back-off, then one that completes.

FLEET = {"apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
         "metadata": {"name": "f", "namespace": "ns", "resourceVersion": "1"}, "spec": {}}


def test_the_operator_reports_a_streak_past_the_limit_and_forgets_it_after_a_pass_that_completes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[Exception | None] = [KubeError(403, FORBIDDEN[5:]), RuntimeError("boom"),
                                        KubeError(500, "etcdserver: timeout"), None, RuntimeError("again")]
    reports: list[str] = []
    passes: list[float] = []

    def reconcile(*_: Any, **__: Any) -> SimpleNamespace:
        passes.append(time.monotonic())
        failure = failures.pop(0) if failures else None
        if failure is not None:
            raise failure
        return SimpleNamespace(gone=False, conflict=False, errors=[], requeue_after=None)

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    counted: list[bool] = []  # the report counted as work under way: a graceful stop waits for its write

    def report_failing(kube: Any, namespace: str, name: str, message: str) -> None:
        reports.append(message)
        counted.append(not handlers.runtime().inflight.wait_idle(0))

    monkeypatch.setattr(handlers, "report_failing", report_failing)
    monkeypatch.setattr(liveness, "FAILING_REPORTED_AFTER_SECONDS", 0.15)
    monkeypatch.setattr(queue, "FAILURE_BACKOFF_SECONDS", 0.1)
    monkeypatch.setattr(switching.SwitchController, "tick", lambda *_: switching.TickReport())
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(kube=Kube(None)))  # type: ignore[arg-type]

    async def scenario() -> None:
        await handlers.start(settings=kopf.OperatorSettings())
        try:
            await handlers.fleet_changed(event={"type": "ADDED", "object": FLEET}, namespace="ns", name="f")
            for count in (4, 6):
                deadline = time.monotonic() + 5
                while len(passes) < count:
                    assert time.monotonic() < deadline, f"only {len(passes)} passes"
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.05)
                # the fourth pass completed: nothing comes back until the fleet changes
                await handlers.fleet_changed(event={"type": "MODIFIED", "object": FLEET}, namespace="ns", name="f")
        finally:
            await handlers.stop()

    asyncio.run(scenario())
    # Passes at 0, 0.1 and 0.3 s: only the third has failed for longer than the limit.
    assert len(reports) == 1 and reports[0].startswith("3 reconcile passes in a row failed over ")
    assert counted == [True]
    assert reports[0].endswith(": 500: etcdserver: timeout; retried with a growing back-off")
    # The fifth pass failed after one that completed: a new streak, too young to report.
    assert handlers._runtime is None


def test_the_failing_report_does_not_bring_the_fleet_back_before_its_back_off_a_spec_change_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """report_failing's status write comes back as a watch event on the fleet. It used to queue the
    fleet at once: a pass that raised again, another report, another event, back to back at API
    speed. The echo, and any event on the fleet that carries no new spec, waits for the back-off;
    a new generation (the user's edit, perhaps the fix) runs at once."""
    body = copy.deepcopy(FLEET)
    body["metadata"]["generation"] = 1
    passes: list[float] = []
    reports: list[str] = []
    loop: asyncio.AbstractEventLoop | None = None

    def reconcile(*_: Any, **__: Any) -> SimpleNamespace:
        passes.append(time.monotonic())
        raise KubeError(403, FORBIDDEN[5:])

    async def watch(obj: dict[str, Any]) -> None:
        """What kopf does with the write's watch event, on its event loop."""
        await handlers.fleet_changed(event={"type": "MODIFIED", "object": obj}, namespace="ns", name="f")

    def write(**changes: Any) -> None:
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        body.update(changes)
        assert loop is not None
        asyncio.run_coroutine_threadsafe(watch(copy.deepcopy(body)), loop)

    def report_failing(kube: Any, namespace: str, name: str, message: str) -> None:
        reports.append(message)
        write(status=failing_status(body.get("status") or {}, message, body["metadata"]["generation"]))

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(handlers, "report_failing", report_failing)
    monkeypatch.setattr(liveness, "FAILING_REPORTED_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(queue, "FAILURE_BACKOFF_SECONDS", 0.4)
    monkeypatch.setattr(queue, "FAILURE_BACKOFF_MAX_SECONDS", 0.4)
    monkeypatch.setattr(switching.SwitchController, "tick", lambda *_: switching.TickReport())
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(kube=Kube(None)))  # type: ignore[arg-type]

    async def next_pass(within: float) -> float:
        count = len(passes)
        deadline = time.monotonic() + within
        while len(passes) == count:
            assert time.monotonic() < deadline, f"no pass within {within}s"
            await asyncio.sleep(0.005)
        return passes[-1]

    async def scenario() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        await handlers.start(settings=kopf.OperatorSettings())
        try:
            await watch(copy.deepcopy(body))
            await asyncio.sleep(1.0)
            # Passes at 0, 0.4 and 0.8 s: the back-off, not the reports' own events, sets the pace.
            assert 2 <= len(passes) <= 4, f"{len(passes)} passes in 1 s on a 0.4 s back-off"
            assert len(reports) == len(passes), "one report per failed pass, each a status write"
            # A status-only change by someone else waits too.
            last = await next_pass(1.0)
            write(status={**body["status"], "switches": []})
            assert await next_pass(1.0) - last >= 0.35
            # The user edits the spec: run at once, back-off or not.
            last = await next_pass(1.0)
            await asyncio.sleep(0.05)
            body["metadata"]["generation"] += 1
            write(spec={"paused": True})
            assert await next_pass(0.2) - last < 0.3
        finally:
            await handlers.stop()

    asyncio.run(scenario())


# Role-switch ticks that keep failing: RoleSwitching stops saying Idle.

def test_a_fleet_whose_role_switch_ticks_keep_failing_says_so_in_role_switching_once(api: MemoryApi) -> None:
    settle(api)
    trouble = failed_again(None, FORBIDDEN, 0.0, "role-switch tick").describe(61.0)
    assert trouble.startswith("1 role-switch tick in a row failed over 61s, so no role switch starts, advances or "
                              "finishes: 403: ")
    for _ in range(2):
        rec.reconcile(api, NS, "fleet", switch_trouble=trouble)
    switching_ = api.condition("RoleSwitching")
    assert (switching_["status"], switching_["reason"], switching_["message"]) == (
        "Unknown", "SwitchTicksFailing", trouble)
    assert api.condition("Ready")["status"] == "True", "the fleet serves; only its switching is in doubt"
    warnings = [o for (k, _), o in api.store.items() if k == "Event" and o["type"] == "Warning"]
    assert [(w["reason"], w["message"]) for w in warnings] == [("SwitchTicksFailing", trouble)]
    rec.reconcile(api, NS, "fleet")
    assert (api.condition("RoleSwitching")["status"], api.condition("RoleSwitching")["reason"]) == ("False", "Idle")


def test_the_operator_hands_a_reported_tick_streak_to_the_fleets_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real role-switch loop and work queue: ticks that raise, then the fleet's next pass."""
    seen: list[str | None] = []

    def reconcile(*_: Any, switch_trouble: str | None = None, **__: Any) -> SimpleNamespace:
        seen.append(switch_trouble)
        return SimpleNamespace(gone=False, conflict=False, errors=[], requeue_after=None)

    def tick(*_: Any) -> switching.TickReport:
        raise KubeError(403, 'hybridservings.hybridserving.io "f" is forbidden')

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(switching.SwitchController, "tick", tick)
    monkeypatch.setattr(liveness, "FAILING_REPORTED_AFTER_SECONDS", 0.6)
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(kube=Kube(None),  # type: ignore[arg-type]
                                                              switch_interval_seconds=0.02))

    async def one_pass() -> None:
        count = len(seen)
        await handlers.fleet_changed(event={"type": "MODIFIED", "object": FLEET}, namespace="ns", name="f")
        deadline = time.monotonic() + 5
        while len(seen) == count:
            assert time.monotonic() < deadline, "no pass"
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        await handlers.start(settings=kopf.OperatorSettings())
        try:
            await one_pass()  # the fleet is known from here: its ticks start, and fail
            await asyncio.sleep(0.05)
            await one_pass()  # failing for less than the limit: not reported
            await asyncio.sleep(0.8)
            await one_pass()
        finally:
            await handlers.stop()

    asyncio.run(scenario())
    assert seen[:2] == [None, None]
    assert seen[2] is not None and " role-switch ticks in a row failed over " in seen[2], seen
    assert seen[2].endswith('403: hybridservings.hybridserving.io "f" is forbidden; retried with a growing back-off')
