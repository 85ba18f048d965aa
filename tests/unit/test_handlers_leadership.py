"""The kopf wiring with --leader-elect, against the in-memory apiserver and real (short) lease
timing: a standby's startup returns at once (/healthz fails until it has), the standby
takes no work from the queue, ticks no fleet and writes nothing until it takes the Lease, and a
graceful stop hands the Lease over only after the pass under way has ended."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kubernetes import client

from hybridserving.controller import __main__ as operator_main
from hybridserving.controller import handlers, switching
from hybridserving.controller.kube import Kube
from hybridserving.controller.leadership import Election, Leadership
from support.apiserver import MemoryApi

LEASE = ("Lease", "hybridserving-operator")
ELECTION = Election(namespace="ops", identity="b", lease_seconds=0.8, renew_deadline_seconds=0.6,
                    retry_seconds=0.05)
# The API the replica's own calls (the CRD schema check) would reach: a port nothing listens on.
UNREACHABLE = client.Configuration(host="http://127.0.0.1:9")
FLEET = {"apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
         "metadata": {"name": "f", "namespace": "ns", "resourceVersion": "1"}, "spec": {}}


class Operator:
    """What the replica did, in order: reconcile passes, role-switch ticks, lease handovers."""

    def __init__(self, api: MemoryApi) -> None:
        self.api = api
        self.log: list[str] = []
        self.lease_kube: Kube | None = None
        self.writers: dict[str, Kube] = {}  # the Kube each part acted through
        self.pass_may_end = threading.Event()
        self.pass_may_end.set()

    def holder(self) -> str:
        return self.api.store[LEASE]["spec"]["holderIdentity"]


@pytest.fixture
def operator(monkeypatch: pytest.MonkeyPatch) -> Iterator[Operator]:
    api = MemoryApi()
    api.create("Lease", "ops", {"metadata": {"name": LEASE[1]},
                                "spec": {"holderIdentity": "a", "leaseDurationSeconds": 1,
                                         "renewTime": "2026-01-01T00:00:00.000000Z"}})
    api.writes.clear()
    op = Operator(api)

    def leadership(kube: Kube, election: Election) -> Leadership:
        op.lease_kube = kube
        return Leadership(api, election)  # type: ignore[arg-type]

    def reconcile(kube: Any, namespace: str, name: str, *_: Any, **__: Any) -> SimpleNamespace:
        op.writers["reconcile"] = kube
        op.log.append(f"pass {namespace}/{name} by {op.holder()}")
        op.pass_may_end.wait(10)
        op.log.append("pass ended")
        return SimpleNamespace(gone=False, conflict=False, errors=[], requeue_after=None)

    def tick(self: switching.SwitchController, namespace: str, name: str) -> switching.TickReport:
        op.writers["switch"] = self.kube  # type: ignore[assignment]
        op.log.append(f"tick {namespace}/{name} by {op.holder()}")
        return switching.TickReport()

    real_release = Leadership.release

    def release(self: Leadership) -> None:
        op.log.append("release")
        real_release(self)

    monkeypatch.setattr(handlers, "Leadership", leadership)
    monkeypatch.setattr(handlers, "reconcile", reconcile)
    monkeypatch.setattr(switching.SwitchController, "tick", tick)
    monkeypatch.setattr(Leadership, "release", release)
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(
        kube=Kube(client.ApiClient(UNREACHABLE)), election=ELECTION, switch_interval_seconds=0.05))  # type: ignore[arg-type]
    yield op
    assert handlers._runtime is None, "the test stops the operator"


def event(obj: dict[str, Any]) -> Any:
    return {"type": "ADDED", "object": obj}


async def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def acting() -> bool:
    return handlers.runtime().leading.is_set()


def test_a_standby_starts_at_once_and_acts_only_once_it_holds_the_lease(operator: Operator) -> None:
    async def scenario() -> None:
        # The Lease is a's and fresh: b must wait its full duration (1 s on b's clock), yet kopf's
        # startup goes on at once.
        await asyncio.wait_for(handlers.start(settings=kopf.OperatorSettings()), 0.5)
        await handlers.fleet_changed(event=event(FLEET), namespace="ns", name="f")
        assert not acting() and operator.holder() == "a"
        await wait_until(lambda: "pass ns/f by b" in operator.log and "tick ns/f by b" in operator.log)
        assert acting()
        assert all(entry.endswith("by b") for entry in operator.log if entry.startswith(("pass ns", "tick")))
        await handlers.stop()
        assert operator.holder() == ""

    asyncio.run(scenario())


def test_a_standby_acts_on_nothing_and_writes_nothing_while_the_leader_renews(operator: Operator) -> None:
    renewing = threading.Event()

    def leader_a() -> None:
        # a's Lease lasts 5 s (on b's clock, from each renewal it sees), so only b taking it could end it.
        a = Leadership(operator.api, Election(namespace="ops", identity="a", lease_seconds=5,  # type: ignore[arg-type]
                                              renew_deadline_seconds=4, retry_seconds=0.05))
        while not renewing.wait(0.05):
            a.try_acquire_or_renew()

    async def scenario() -> None:
        threading.Thread(target=leader_a, daemon=True).start()
        await asyncio.wait_for(handlers.start(settings=kopf.OperatorSettings()), 2)
        await handlers.fleet_changed(event=event(FLEET), namespace="ns", name="f")
        await asyncio.sleep(1.5)  # past the first record's 1 s: only a's renewals keep b standing by
        assert operator.log == [] and not acting()
        renewing.set()
        await handlers.stop()  # a standby stops without having acted; it had nothing to release
        # Every write was a's renewal: b never took the Lease (a could not have taken it back).
        assert operator.holder() == "a" and operator.api.writes
        assert all(kind == "Lease" for _, kind in operator.api.writes)

    asyncio.run(scenario())


def test_the_reconcile_and_the_role_switches_write_through_the_leaders_fence(operator: Operator) -> None:
    """A frozen leader's workers must not write on waking (tests/unit/test_leadership.py): every
    writer of the replica asks the fence of the Lease it holds, and the Lease's own calls do not."""
    operator.api.store[LEASE]["spec"]["holderIdentity"] = ""  # free: b leads at once

    async def scenario() -> None:
        await handlers.start(settings=kopf.OperatorSettings())
        await handlers.fleet_changed(event=event(FLEET), namespace="ns", name="f")
        await wait_until(lambda: set(operator.writers) == {"reconcile", "switch"})
        leadership = handlers.runtime().leadership
        assert leadership is not None
        for part, kube in operator.writers.items():
            assert kube.fence == leadership.fence, f"the {part} writes unfenced"
        await handlers.stop()

    asyncio.run(scenario())
    assert operator.lease_kube is not None and operator.lease_kube.fence is None


def test_the_lease_calls_time_out_within_the_renew_deadline(operator: Operator) -> None:
    async def scenario() -> None:
        await handlers.start(settings=kopf.OperatorSettings())
        await handlers.stop()

    asyncio.run(scenario())
    assert operator.lease_kube is not None
    assert operator.lease_kube.request_timeout == ELECTION.request_timeout_seconds
    assert operator.lease_kube.api.configuration.retries is False  # one timeout per call, not four
    assert 2 * ELECTION.request_timeout_seconds + ELECTION.retry_seconds <= ELECTION.renew_deadline_seconds


async def lead_with_a_pass_under_way(operator: Operator) -> None:
    """Start b, which leads at once, and hold a reconcile pass of ns/f until `pass_may_end`."""
    await handlers.start(settings=kopf.OperatorSettings())
    await wait_until(acting)
    operator.pass_may_end.clear()
    await handlers.fleet_changed(event=event(FLEET), namespace="ns", name="f")
    await wait_until(lambda: "pass ns/f by b" in operator.log)


def test_a_graceful_stop_hands_the_lease_over_only_after_the_pass_under_way(operator: Operator) -> None:
    operator.api.store[LEASE]["spec"]["holderIdentity"] = ""  # free: b leads at once

    async def scenario() -> None:
        await lead_with_a_pass_under_way(operator)
        stopping = asyncio.create_task(handlers.stop())
        await asyncio.sleep(0.5)
        assert not stopping.done() and operator.holder() == "b" and "release" not in operator.log
        operator.pass_may_end.set()
        await asyncio.wait_for(stopping, 5)
        assert operator.log.index("pass ended") < operator.log.index("release")
        assert operator.holder() == ""

    asyncio.run(scenario())


def test_a_fleets_role_switch_ticks_wait_for_its_reconcile_pass_under_way(operator: Operator) -> None:
    """A pass removing an instance and a tick switching another must not decide side by side
    (handlers.InFlight.running): ticks come every 0.05 s, and none of the fleet's runs while its
    pass does."""
    operator.api.store[LEASE]["spec"]["holderIdentity"] = ""  # free: b leads at once

    async def scenario() -> None:
        await lead_with_a_pass_under_way(operator)
        await asyncio.sleep(0.5)
        during = operator.log[operator.log.index("pass ns/f by b") + 1:]
        operator.pass_may_end.set()
        await wait_until(lambda: "pass ended" in operator.log
                         and "tick ns/f by b" in operator.log[operator.log.index("pass ended"):])
        await handlers.stop()
        assert during == [], "a tick ran while the fleet's pass did"

    asyncio.run(scenario())


def test_the_kubeconfig_flag_reaches_kopfs_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from kubernetes.config import kube_config

    async def operator(**_: Any) -> None:
        return None

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", "~/.kube/config")
    monkeypatch.setattr(kopf, "operator", operator)
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options())
    monkeypatch.setenv(operator_main.OPERATOR_KEY_ENV, "k" * 32)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    path = str(tmp_path / "config")
    assert operator_main.main(["--kubeconfig", path, "--metrics-port", "0"]) == 0
    assert kube_config.KUBE_CONFIG_DEFAULT_LOCATION == path


def test_watch_event_handlers_run_on_the_event_loop() -> None:
    """kopf runs a plain-function handler on an executor thread, and the work queue (an
    asyncio.Queue, its timers and sets) is the event loop's alone: each watch handler must be a
    coroutine, which kopf awaits on the loop."""
    watching = kopf.get_default_registry()._watching.get_all_handlers()
    assert {h.id for h in watching} >= {"fleet_changed", "pods-changed", "hybridservinginstances-changed"}
    assert [h.id for h in watching if not inspect.iscoroutinefunction(h.fn)] == []
