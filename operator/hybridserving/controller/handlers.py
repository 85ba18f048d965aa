"""kopf wiring: every watch event becomes "reconcile this HybridServing", nothing more.

No create/update/delete handlers: those are edge-triggered and make kopf write progress
annotations and finalizers onto the HybridServing. Only `on.event` handlers: events on the
HybridServing and on its children (found by the `hybridserving.io/name` label) feed the read
cache (cache.py) and one coalescing queue, a resync adds every known HybridServing every
`resync_seconds`, and kopf's initial listing on start-up is the resume.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import kopf

from hybridserving.api.v1alpha1 import GROUP, INSTANCE_KIND, KIND, PLURAL, VERSION
from hybridserving.controller import metrics
from hybridserving.controller.leadership import Election, Leadership
from hybridserving.controller import switching as role_switching
from hybridserving.controller.cache import CachedKube, ObjectCache
from hybridserving.controller.engines import Engines
from hybridserving.controller.kube import OWNED_KINDS, RESOURCES, Kube
from hybridserving.controller.queue import Key, Pass, WorkQueue
from hybridserving.controller.reconcile import reconcile
from hybridserving.controller.status import PROGRESS_DEADLINE_SECONDS
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


OPTIONS = Options()


@dataclass
class Runtime:
    kube: Kube
    queue: WorkQueue
    resync: asyncio.Task[None]
    cache: ObjectCache
    switcher: asyncio.Task[None] | None = None  # the role-switch controller (controller/switching.py)
    leadership: Leadership | None = None
    engines: Engines | None = None  # the reconcile's engine reads (controller/engines.py)


_runtime: Runtime | None = None


def runtime() -> Runtime:
    assert _runtime is not None, "the operator has not started"
    return _runtime


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _runtime
    # Silent watches are the classic kopf failure (kopf #698, #204): time them out.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # The reconcile posts its own Events; kopf's log-to-Event posting would double them.
    settings.posting.enabled = False
    direct = OPTIONS.kube or Kube.from_environment(OPTIONS.kubeconfig, pool_size=OPTIONS.workers * 2 + 2)
    # Reads of what the handlers below watch come from the cache they feed; writes feed it too.
    cache = ObjectCache(CACHED_KINDS, max_age=OPTIONS.relist_seconds)
    kube = CachedKube(direct.api, cache)
    leadership = None
    if OPTIONS.election is not None:
        # Standby until this replica leads: kopf starts no watch before the startup handlers end,
        # so a standby neither reconciles nor switches anything.
        leadership = Leadership(direct.sibling("lease"), OPTIONS.election)
        await asyncio.to_thread(leadership.acquire)
        threading.Thread(target=leadership.hold, name="lease", daemon=True).start()
    metrics.LEADER.set(1)

    # The reconcile's own reads of engine pods: the progress of running weights downloads.
    engines = Engines()

    async def work(key: Key) -> Pass:
        namespace, name = key
        try:
            outcome = await asyncio.to_thread(reconcile, kube, namespace, name, None, OPTIONS.engine_policy,
                                              OPTIONS.progress_deadline_seconds, operator_key=OPTIONS.operator_key,
                                              fill_probe=engines.fill_progress_many)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        if outcome.gone:
            queue.forget(key)
            metrics.RECONCILES.labels("gone").inc()
            return Pass(None)
        result = "conflict" if outcome.conflict else "error" if outcome.errors else "ok"
        metrics.RECONCILES.labels(result).inc()
        for error in outcome.errors:
            log.warning("%s/%s: %s", namespace, name, error)
        return Pass(outcome.requeue_after if outcome.requeue_after is not None else OPTIONS.resync_seconds,
                    failed=bool(outcome.errors))

    queue = WorkQueue(work, workers=OPTIONS.workers)
    queue.start()

    async def resync() -> None:
        while True:
            await asyncio.sleep(OPTIONS.resync_seconds)
            for key in list(queue.known):
                queue.add(key)

    _runtime = Runtime(kube=kube, queue=queue, resync=asyncio.create_task(resync(), name="resync"),
                       cache=cache, leadership=leadership, engines=engines)
    # Role switches: every fleet the queue knows, ticked every few seconds.
    _runtime.switcher = asyncio.create_task(
        role_switching.run(kube.sibling("switch"), lambda: list(queue.known), interval=OPTIONS.switch_interval_seconds,
                           engine_policy=OPTIONS.engine_policy,
                           operator_key=OPTIONS.operator_key),
        name="role-switch")


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    global _runtime
    if _runtime is not None:
        _runtime.resync.cancel()
        if _runtime.switcher is not None:
            _runtime.switcher.cancel()
        await _runtime.queue.stop()
        if _runtime.engines is not None:
            _runtime.engines.close()
        if _runtime.leadership is not None:
            await asyncio.to_thread(_runtime.leadership.release)
        metrics.LEADER.set(0)
        _runtime = None


@kopf.on.event(GROUP, VERSION, PLURAL)
def fleet_changed(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    assert namespace is not None, "HybridServing is namespaced"
    key = (namespace, name)
    runtime().cache.apply_event(KIND, event["type"], dict(event["object"]))
    if event.get("type") == "DELETED":
        runtime().queue.forget(key)
    else:
        runtime().queue.add(key)


# Every kind a reconcile observes is watched, so the cache can answer for all of them (the
# alpha Workload excepted: it is listed only for fleets that ask for it).
CACHED_KINDS = (KIND, INSTANCE_KIND, "Pod", *OWNED_KINDS)
_KIND_OF_PLURAL = {RESOURCES[kind].plural: kind for kind in CACHED_KINDS}


def _child_changed(event: kopf.RawEvent, resource: kopf.Resource, namespace: str | None,
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
