"""kopf wiring: every watch event becomes "reconcile this HybridServing", nothing more.

No create/update/delete handlers: those are edge-triggered and make kopf write progress
annotations and finalizers onto the HybridServing. Only `on.event` handlers: events on the
HybridServing and on its children (found by the `hybridserving.io/name` label) feed the read
cache (cache.py) and one coalescing queue, a resync adds every known HybridServing every
`resync_seconds`, and kopf's initial listing on start-up is the resume.

With --leader-elect a standby runs the same watches, so its cache and queue are current when it
takes the Lease, but it takes nothing from the queue and ticks no role switch until then (`act`).
It does serve the admission webhook, whose checks read and write nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import kopf

from hybridserving.api.v1alpha1 import GROUP, INSTANCE_KIND, KIND, PLURAL, VERSION
from hybridserving.controller import crdcheck, metrics
from hybridserving.controller.leadership import Election, Leadership
from hybridserving.controller import switching as role_switching
from hybridserving.controller.cache import CachedKube, ObjectCache
from hybridserving.controller.engines import Engines
from hybridserving.controller.kube import OWNED_KINDS, RESOURCES, Kube, describe_failure
from hybridserving.controller.queue import Key, Pass, WorkQueue
from hybridserving.controller.reconcile import reconcile, report_failing
from hybridserving.controller.status import PROGRESS_DEADLINE_SECONDS
from hybridserving.core import liveness
from hybridserving.core.naming import LABEL_NAME
from hybridserving.core.privileges import EnginePolicy

log = logging.getLogger("hybridserving.controller")


@dataclass
class Options:
    """How the operator runs; `__main__` sets these from its flags before starting kopf."""

    kubeconfig: str | None = None
    workers: int = 4
    resync_seconds: float = 60.0
    relist_seconds: float = 600.0  # the read cache LISTs a fleet's objects again after this long
    engine_policy: EnginePolicy = field(default_factory=EnginePolicy)
    progress_deadline_seconds: float = PROGRESS_DEADLINE_SECONDS
    kube: Kube | None = field(default=None, repr=False)  # injected by tests and benchmarks (its API client)
    switch_interval_seconds: float = role_switching.TICK_SECONDS  # role-switch controller tick
    election: Election | None = None  # leader election (several replicas); None: this replica always acts
    operator_key: bytes = field(default=b"", repr=False)  # derives each fleet's engine key (core/enginekey.py)
    stuck_pass_seconds: float = liveness.STUCK_PASS_SECONDS  # a pass or tick this old fails liveness; 0: never
    crd_check_seconds: float = crdcheck.CHECK_SECONDS  # how often the installed CRDs' schema digests are compared


OPTIONS = Options()


class RetryForever:
    """kopf's back-off between failed API calls of its own (discovery, listings, watches), its
    last step repeated without end. kopf gives up on a call once its back-offs run out (about
    54 s by default) and what follows does not come back: a failed discovery ends the operator, so
    a replica started while the apiserver is away crash-loops through the kubelet's growing
    back-off (up to 5 min after the apiserver returns), and a watch request refused with a 5xx or
    a 403 (a load balancer in front of absent apiservers, an apiserver still starting) past them
    ends that watch for good while the process runs on. Iterated afresh for each call."""

    def __init__(self, seconds: tuple[float, ...]) -> None:
        self.seconds = seconds

    def __iter__(self) -> Iterator[float]:
        return itertools.chain(self.seconds, itertools.repeat(self.seconds[-1]))


KOPF_BACKOFFS = RetryForever((1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0))


STOP_GRACE_SECONDS = 20.0
"""How long a graceful stop waits for the passes and ticks under way, within the pod's grace (the
chart's `hybridserving.terminationGracePeriodSeconds` adds it up)."""


@dataclass
class _Turn:
    """One fleet's turn: its lock and how many passes and ticks hold it or wait for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class InFlight:
    """The blocking passes and ticks running on threads, each with its fleet and start time, one at
    a time per fleet. Cancelling the asyncio task that awaits one leaves the thread running and
    writing, so a graceful stop waits for this to empty before it hands the Lease over; and one
    that never ends makes the liveness endpoint fail (core/liveness.py)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._running: dict[Key, liveness.Running] = {}  # the one holding each fleet's turn
        self._reported: set[liveness.Running] = set()
        self._idle = threading.Condition()
        self._turns: dict[Key, _Turn] = {}

    @contextmanager
    def running(self, key: Key, work: liveness.Work) -> Iterator[None]:
        """Count the pass or tick over fleet `key` while the block runs, once the fleet's other
        pass or tick has ended.

        The reconcile and the role switches each decide from the whole fleet and act on one
        instance: a pass removes one (a smaller total) because the role's others serve, a tick
        starts switching one because the others serve. Side by side, each could take the instance
        the other counted on; both conditional writes land, as they touch different objects, and
        the role is left with none serving. In turn, each decides from the other's writes (the
        read cache holds them). A graceful stop waits for one waiting its turn too; the liveness
        check times it from its turn, as the one it waits for is the one stuck."""
        with self._idle:
            turn = self._turns.setdefault(key, _Turn())
            turn.users += 1
        try:
            with turn.lock:
                entry = liveness.Running(*key, work, self._clock())
                with self._idle:
                    self._running[key] = entry
                try:
                    yield
                finally:
                    with self._idle:
                        del self._running[key]
                        self._reported.discard(entry)
        finally:
            with self._idle:
                turn.users -= 1
                if not turn.users:
                    del self._turns[key]
                self._idle.notify_all()

    def oldest_seconds(self) -> float:
        with self._idle:
            return liveness.oldest_seconds(self._running.values(), self._clock())

    def stuck(self, limit: float) -> liveness.StuckPass | None:
        """The pass or tick run longer than `limit` seconds, if any; logged at ERROR the first time."""
        with self._idle:
            stuck = liveness.stuck_pass(self._running.values(), self._clock(), limit)
            if stuck is None:
                return None
            first = stuck.running not in self._reported
            self._reported.add(stuck.running)
        if first:
            log.error("%s: it holds its fleet until the operator restarts", stuck.describe())
        return stuck

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing runs; False when some pass or tick still runs after `timeout` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._turns, timeout)


class CountedSwitches(role_switching.SwitchController):
    """The role-switch controller, its ticks counted in `inflight`."""

    def __init__(self, kube: Kube, engines: Engines, inflight: InFlight, *, operator_key: bytes,
                 engine_policy: EnginePolicy) -> None:
        super().__init__(kube, engines, operator_key=operator_key, engine_policy=engine_policy)
        self.inflight = inflight

    def tick(self, namespace: str, name: str) -> role_switching.TickReport:
        with self.inflight.running((namespace, name), "role-switch tick"):
            return super().tick(namespace, name)


@dataclass
class Runtime:
    kube: Kube
    queue: WorkQueue
    cache: ObjectCache
    engines: Engines  # the reconcile's engine reads (controller/engines.py)
    inflight: InFlight
    leading: asyncio.Event  # set once this replica acts: at once alone, on taking the Lease with --leader-elect
    leadership: Leadership | None = None
    switch_engines: Engines | None = None  # the role switches' engine reads, from when this replica acts
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # resync, role switches, election, CRD check
    # Fleets whose role-switch ticks are failing now (switching.run keeps it), for status to say so.
    failing_ticks: dict[Key, liveness.FailingPasses] = field(default_factory=dict)


_runtime: Runtime | None = None


def runtime() -> Runtime:
    assert _runtime is not None, "the operator has not started"
    return _runtime


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Build the runtime and return at once: /healthz fails until the runtime is built (`unhealthy`)
    and kopf serves the webhook only after the startup handlers end, so a standby that waited here
    for the Lease would fail its liveness probe.
    A standby's watches feed the cache and the queue, but nothing takes work from the queue and no
    role switch runs until it leads (`act`)."""
    global _runtime
    # Silent watches are the classic kopf failure (kopf #698, #204): time them out.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = KOPF_BACKOFFS
    # The reconcile posts its own Events; kopf's log-to-Event posting would double them.
    settings.posting.enabled = False
    direct = OPTIONS.kube or Kube.from_environment(OPTIONS.kubeconfig, pool_size=OPTIONS.workers * 2 + 2)
    # Reads of what the handlers below watch come from the cache they feed; writes feed it too.
    cache = ObjectCache(CACHED_KINDS, max_age=OPTIONS.relist_seconds)
    leadership = None if OPTIONS.election is None else Leadership(
        direct.unretried("lease", request_timeout=OPTIONS.election.request_timeout_seconds), OPTIONS.election)
    # Every write of an electing replica passes its fence; the Lease's own calls do not.
    kube = CachedKube(direct.api, cache, fence=None if leadership is None else leadership.fence)
    # The reconcile's own reads of engine pods: the progress of running weights downloads.
    engines = Engines()
    inflight = InFlight()
    metrics.OLDEST_PASS_SECONDS.set_function(inflight.oldest_seconds)

    failing: dict[Key, liveness.FailingPasses] = {}

    async def work(key: Key) -> Pass:
        namespace, name = key

        ticks = _runtime.failing_ticks.get(key) if _runtime is not None else None
        now = time.monotonic()
        switch_trouble = ticks.describe(now) if ticks is not None and ticks.reported(now) else None

        def one_pass() -> Any:
            with inflight.running(key, "reconcile pass"):
                return reconcile(kube, namespace, name, None, OPTIONS.engine_policy,
                                 OPTIONS.progress_deadline_seconds, operator_key=OPTIONS.operator_key,
                                 fill_probe=engines.fill_progress_many, switch_trouble=switch_trouble)

        try:
            outcome = await asyncio.to_thread(one_pass)
        except Exception as exc:
            metrics.RECONCILES.labels("error").inc()
            failed_at = time.monotonic()
            streak = failing[key] = liveness.failed_again(failing.get(key), describe_failure(exc), failed_at)
            if streak.reported(failed_at):
                def report() -> None:
                    # Counted as part of the pass: a graceful stop waits for it before handing the Lease over.
                    with inflight.running(key, "reconcile pass"):
                        report_failing(kube, namespace, name, streak.describe(failed_at))

                await asyncio.to_thread(report)
            raise
        failing.pop(key, None)
        if outcome.gone:
            queue.forget(key)
            metrics.RECONCILES.labels("gone").inc()
            return Pass(None)
        result: metrics.ReconcileResult = "conflict" if outcome.conflict else "error" if outcome.errors else "ok"
        metrics.RECONCILES.labels(result).inc()
        for error in outcome.errors:
            log.warning("%s/%s: %s", namespace, name, error)
        return Pass(outcome.requeue_after if outcome.requeue_after is not None else OPTIONS.resync_seconds,
                    failed=bool(outcome.errors))

    queue = WorkQueue(work, workers=OPTIONS.workers)
    _runtime = Runtime(kube=kube, queue=queue, cache=cache, engines=engines, inflight=inflight,
                       leading=asyncio.Event(), leadership=leadership)
    # Every replica, leader or standby: it reads only, and an alert should not wait for a failover.
    _runtime.tasks.append(asyncio.create_task(crdcheck.run(direct.sibling("crd"), OPTIONS.crd_check_seconds),
                                              name="crd-schema-check"))
    if leadership is None:
        act(_runtime)
        return
    _runtime.tasks.append(asyncio.create_task(elect(_runtime, leadership), name="leader-election"))


def unhealthy() -> liveness.Unhealthy | None:
    """What the liveness endpoint fails on: the operator not started (a startup handler that keeps
    failing), or a pass or tick run past `Options.stuck_pass_seconds`."""
    rt = _runtime
    return liveness.NotRunning() if rt is None else rt.inflight.stuck(OPTIONS.stuck_pass_seconds)


async def elect(rt: Runtime, leadership: Leadership) -> None:
    """Stand by until this replica takes the Lease, then keep renewing it and act."""
    await asyncio.to_thread(leadership.acquire)
    if not leadership.leading:
        return  # stopped while standing by
    threading.Thread(target=leadership.hold, name="lease", daemon=True).start()
    act(rt)


def act(rt: Runtime) -> None:
    """Start acting: the reconcile workers take every fleet queued meanwhile (each known fleet is
    queued once, by its watch events), the resync and the role switches start."""
    rt.queue.start()

    async def resync() -> None:
        while True:
            await asyncio.sleep(OPTIONS.resync_seconds)
            for key in list(rt.queue.known):
                rt.queue.add(key)

    rt.tasks.append(asyncio.create_task(resync(), name="resync"))
    # Role switches: every fleet the queue knows, ticked every few seconds.
    kube = rt.kube.sibling("switch")
    rt.switch_engines = Engines()
    switches = CountedSwitches(kube, rt.switch_engines, rt.inflight, operator_key=OPTIONS.operator_key,
                               engine_policy=OPTIONS.engine_policy)
    rt.tasks.append(asyncio.create_task(
        role_switching.run(kube, lambda: list(rt.queue.known),
                           interval=OPTIONS.switch_interval_seconds, controller=switches,
                           failing=rt.failing_ticks),
        name="role-switch"))
    rt.leading.set()
    metrics.LEADER.set(1)



@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    """Stop acting, wait (at most STOP_GRACE_SECONDS) for the passes and ticks already on threads,
    and only then hand the Lease over: a standby must not start while this replica still writes.
    Work still running past the grace keeps the Lease held (renewed until the process ends) and
    it runs out the usual way."""
    global _runtime
    if _runtime is None:
        return
    rt = _runtime
    rt.leading.clear()
    for task in rt.tasks:
        task.cancel()
    await asyncio.gather(*rt.tasks, return_exceptions=True)
    await rt.queue.stop()
    idle = await asyncio.to_thread(rt.inflight.wait_idle, STOP_GRACE_SECONDS)
    rt.engines.close()
    if rt.switch_engines is not None:
        rt.switch_engines.close()
    if rt.leadership is not None:
        if idle:
            await asyncio.to_thread(rt.leadership.release)
        else:
            log.warning("passes or role-switch ticks still run after %.0fs; the lease is left to run out",
                        STOP_GRACE_SECONDS)
    metrics.LEADER.set(0)
    _runtime = None


# The event handlers are coroutines: kopf runs a plain function on an executor thread, and the
# work queue (an asyncio.Queue, its timers and sets) is the event loop's alone.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def fleet_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    assert namespace is not None, "HybridServing is namespaced"
    key = (namespace, name)
    runtime().cache.apply_event(KIND, event["type"], dict(event["object"]))
    if event.get("type") == "DELETED":
        # One last pass: it finds the fleet gone, drops its gauges and forgets it. Nothing else
        # would bring that pass to a fleet without children (an invalid spec), and a pass still
        # running re-records the gauges after any drop made here.
        runtime().queue.add(key)
    else:
        runtime().queue.add(key, early=not reports_failing(dict(event["object"])))


def reports_failing(body: Mapping[str, Any]) -> bool:
    """Whether the fleet's status is the failing report (`report_failing`) made for its current
    spec. An event on such a fleet that brings no new generation (the echo of that report's own
    write, above all) cannot make the next pass succeed: it waits for the failure back-off, or
    every report would run the next failing pass at once, and that one the next report."""
    conditions: list[dict[str, Any]] = (body.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), {})
    return (ready.get("reason") == "ReconcileFailed"
            and ready.get("observedGeneration") == (body.get("metadata") or {}).get("generation"))


# Every kind a reconcile observes is watched, so the cache can answer for all of them (the
# alpha Workload excepted: it is listed only for fleets that ask for it).
CACHED_KINDS = (KIND, INSTANCE_KIND, "Pod", *OWNED_KINDS)
_KIND_OF_PLURAL = {RESOURCES[kind].plural: kind for kind in CACHED_KINDS}


async def _child_changed(event: kopf.RawEvent, resource: kopf.Resource, namespace: str | None,
                         labels: kopf.Labels, **_: Any) -> None:
    assert namespace is not None, "a fleet's children live in its namespace"
    runtime().cache.apply_event(_KIND_OF_PLURAL[resource.plural], event["type"], dict(event["object"]))
    runtime().queue.add((namespace, labels[LABEL_NAME]))


# Children whose changes the fleet must react to at once: pods (readiness, failures, deletions),
# instances (role switches), and what the router and the rendezvous depend on.
for _kind in CACHED_KINDS[1:]:
    _resource = RESOURCES[_kind]
    kopf.on.event(_resource.group, _resource.version, _resource.plural, labels={LABEL_NAME: kopf.PRESENT},
                  id=f"{_resource.plural}-changed")(_child_changed)
