"""kopf wiring: every watch event becomes "reconcile this HybridServing", nothing more.

No create/update/delete handlers: those are edge-triggered and make kopf write progress
annotations and finalizers onto the HybridServing. Only `on.event` handlers, which keep no
state: events on the HybridServing and on its children (found by the
`hybridserving.io/name` label) feed one coalescing queue, a resync adds every known
HybridServing every `resync_seconds` (healing drift on kinds that are not watched), and
kopf's initial listing on start-up is the resume.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import kopf

from hybridserving.api.v1alpha1 import GROUP, INSTANCE_PLURAL, PLURAL, VERSION
from hybridserving.controller import metrics
from hybridserving.controller.leadership import Election, Leadership
from hybridserving.controller import switching as role_switching
from hybridserving.controller.kube import Kube
from hybridserving.controller.queue import Key, WorkQueue
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
    engine_policy: EnginePolicy = field(default_factory=EnginePolicy)
    progress_deadline_seconds: float = PROGRESS_DEADLINE_SECONDS
    kube: Kube | None = field(default=None, repr=False)  # injected by tests and benchmarks
    switch_interval_seconds: float = role_switching.TICK_SECONDS  # role-switch controller tick
    election: Election | None = None  # leader election (several replicas); None: this replica always acts


OPTIONS = Options()


@dataclass
class Runtime:
    kube: Kube
    queue: WorkQueue
    resync: asyncio.Task[None]
    switcher: asyncio.Task[None] | None = None  # the role-switch controller (controller/switching.py)
    leadership: Leadership | None = None


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
    kube = OPTIONS.kube or Kube.from_environment(OPTIONS.kubeconfig, pool_size=OPTIONS.workers * 2 + 2)
    leadership = None
    if OPTIONS.election is not None:
        # Standby until this replica leads: kopf starts no watch before the startup handlers end,
        # so a standby neither reconciles nor switches anything.
        leadership = Leadership(kube, OPTIONS.election)
        await asyncio.to_thread(leadership.acquire)
        threading.Thread(target=leadership.hold, name="lease", daemon=True).start()
    metrics.LEADER.set(1)

    async def work(key: Key) -> float | None:
        namespace, name = key
        try:
            outcome = await asyncio.to_thread(reconcile, kube, namespace, name, None, OPTIONS.engine_policy,
                                              OPTIONS.progress_deadline_seconds)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        if outcome.gone:
            queue.forget(key)
            metrics.RECONCILES.labels("gone").inc()
            return None
        result = "conflict" if outcome.conflict else "error" if outcome.errors else "ok"
        metrics.RECONCILES.labels(result).inc()
        for error in outcome.errors:
            log.warning("%s/%s: %s", namespace, name, error)
        return outcome.requeue_after if outcome.requeue_after is not None else OPTIONS.resync_seconds

    queue = WorkQueue(work, workers=OPTIONS.workers)
    queue.start()

    async def resync() -> None:
        while True:
            await asyncio.sleep(OPTIONS.resync_seconds)
            for key in list(queue.known):
                queue.add(key)

    _runtime = Runtime(kube=kube, queue=queue, resync=asyncio.create_task(resync(), name="resync"),
                       leadership=leadership)
    # Role switches: every fleet the queue knows, ticked every few seconds.
    _runtime.switcher = asyncio.create_task(
        role_switching.run(kube, lambda: list(queue.known), interval=OPTIONS.switch_interval_seconds),
        name="role-switch")


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    global _runtime
    if _runtime is not None:
        _runtime.resync.cancel()
        if _runtime.switcher is not None:
            _runtime.switcher.cancel()
        await _runtime.queue.stop()
        if _runtime.leadership is not None:
            await asyncio.to_thread(_runtime.leadership.release)
        metrics.LEADER.set(0)
        _runtime = None


@kopf.on.event(GROUP, VERSION, PLURAL)
def fleet_changed(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    key = (namespace, name)
    if event.get("type") == "DELETED":
        runtime().queue.forget(key)
    else:
        runtime().queue.add(key)


def _child_changed(namespace: str, labels: dict[str, str], **_: Any) -> None:
    runtime().queue.add((namespace, labels[LABEL_NAME]))


# Children whose changes the fleet must react to at once: pods (readiness, failures, deletions),
# instances (role switches), and what the router and the rendezvous depend on.
for _group, _version, _plural in (
    (GROUP, VERSION, INSTANCE_PLURAL),
    ("", "v1", "pods"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("apps", "v1", "deployments"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
):
    kopf.on.event(_group, _version, _plural, labels={LABEL_NAME: kopf.PRESENT},
                  id=f"{_plural}-changed")(_child_changed)
