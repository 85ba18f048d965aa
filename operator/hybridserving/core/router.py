"""The router as a production component: probes, resources, spread, a disruption budget, metrics,
a graceful exit.

smg (1.13) answers `/liveness` while its process serves and `/readiness` only once it has
healthy workers of both roles in PD mode (503 before), so a router replica that lost its
workers leaves the Service instead of answering 503 to clients. Metrics are served on their
own port (`--prometheus-host/--prometheus-port`), named `metrics` on the router pods (which the
chart's `routers` PodMonitor scrapes) and on the router Service.

A router pod that goes (a roll of the router, a retired pairing key, a drained node) first
sleeps in its preStop hook while the Service stops sending it requests (endpoint removal and
SIGTERM happen at once, and the removal takes a moment to reach every proxy), then gets
SIGTERM, on which smg stops being ready and drains what it has in flight for up to
`--shutdown-grace-period-secs`, inside the pod's termination grace period.

smg's worker overload veto is switched off (`--disable-worker-overload-protection`). smg 1.13
leaves a worker out of routing once its waiting requests reach 8 (or its KV usage 0.8) while
"another worker is under the thresholds", and it counts a worker it is draining before removal
(5 s, on every scale-down, role switch, roll or deleted pod) as that other worker. With the veto
on the only worker left, every request of the role gets 503 "No available decode workers" until
the drain ends. SGLang's decode counts the requests still waiting for their prefill's KV as
waiting (`managers/scheduler_components/load_inquirer.py:114-141`), so a decode behind a busy
prefill reaches 8 without being loaded at all. The routing policies still balance by load.

smg's circuit breaker is switched off too (`--disable-circuit-breaker`). In PD mode smg records a
request's outcome on both workers of its pair (model_gateway/src/routers/http/pd_router.rs,
`prefill.record_outcome` and `decode.record_outcome` after each dual dispatch), and the breaker
opens after 10 consecutive failures for 60 s. An engine that crashes with ten requests in flight
thereby opens the circuit of each healthy worker of the other role it was paired with; with one
such worker (or all of them hit) every request is answered 503 "No available prefill workers"
for a minute. Without the breaker, smg retries a failed request (up to 5 attempts) on a freshly
selected pair.

What shuts a dead engine out instead is smg's health check of each worker, which blames the
worker it probes alone: every second (`--health-check-interval-secs 1`), on the engine's `/ready`
(status only, 503 while paused or shutting down: `entrypoints/http_server.py:714-718`,
`managers/tokenizer_manager.py:728-734`), out after two failures and back after two answers
(smg's success threshold). smg's defaults (`/health` every 60 s, three failures) left a crashed
engine routed until its pod stopped being Ready (up to 30 s, the kubelet's `/ready` probe) and,
with the `cache_aware` prefill policy, every request whose prefix it held was retried on it
alone and failed. An unhealthy worker stays registered and probed
(`--no-remove-unhealthy-workers`, as without discovery), so it comes back when its engine does
whether or not its pod left Ready meanwhile; discovery still drops the workers of pods that are
deleted or not Ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybridserving.api.pods import canonical_quantity
from hybridserving.api.v1alpha1 import RouterSpec
from hybridserving.core.naming import LABEL_PAIRING
from hybridserving.core.observed import parse_time

METRICS_PORT_NAME = "metrics"
PRESTOP_SECONDS = 5
DRAIN_SECONDS = 110  # smg's --shutdown-grace-period-secs
# How smg treats a worker that is busy or failing: see the module docstring for each.
HEALTH_FLAGS = ("--health-check-endpoint", "/ready", "--health-check-interval-secs", "1",
                "--health-failure-threshold", "2", "--no-remove-unhealthy-workers")
WORKER_FLAGS = ("--disable-worker-overload-protection", "--disable-circuit-breaker", *HEALTH_FLAGS)
TERMINATION_GRACE_SECONDS = PRESTOP_SECONDS + DRAIN_SECONDS + 5
# How long the fleet may have no available router, while a pair it could route to serves, before
# status calls it Degraded: a router rolled or rescheduled is back well within it (readiness every
# 5 s, smg's first worker health check), a router that cannot start or stays unready is not.
UNAVAILABLE_SECONDS = 180.0


def container_fields(router: RouterSpec) -> dict[str, Any]:
    """Probes and resources of the router container."""
    return {
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 2, "timeoutSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "initialDelaySeconds": 10,
                          "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 2},
        # As the apiserver stores them (canonical, no empty map): anything else reads as drift.
        "resources": {kind: {name: canonical_quantity(q) for name, q in amounts.items()}
                      for kind, amounts in router.resources.to_wire().items() if amounts},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }


def pod_fields(router: RouterSpec, selector: dict[str, str]) -> dict[str, Any]:
    """Time to drain on the way out; replicas on different nodes where possible: one node's
    loss leaves the others routing."""
    grace = {"terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS}
    if router.replicas < 2:
        return grace
    return {**grace, "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"},
    }]}}}


def disruption_budget(router: RouterSpec, meta: dict[str, Any], selector: dict[str, str]) -> dict[str, Any] | None:
    """With two or more replicas, node drains take one router at a time (none to protect with one).

    A router that is not ready may always be evicted (`AlwaysAllow`): smg is unready whenever it
    has no healthy worker of a role, which is when GPU nodes are being drained, and the default
    policy would then refuse every eviction and hang the drain of the router's node.
    """
    if router.replicas < 2:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                 "selector": {"matchLabels": selector}},
    }


@dataclass(frozen=True)
class RouterDeployment:
    """A router Deployment as its controller reports it (`status`), which is what clients meet."""

    name: str
    pairing_key: str
    replicas: int
    available: int
    unavailable_since: float | None
    """When its `Available` condition turned False (when it was created, while it has none yet);
    None while it is Available or its times are unknown."""
    replica_failure: str | None = None
    """Why its ReplicaSet cannot create pods (`ReplicaFailure` True: quota, admission), if it cannot."""

    @classmethod
    def from_manifest(cls, obj: Mapping[str, Any]) -> RouterDeployment:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        available = conditions.get("Available")
        if available is None:
            since = parse_time(meta.get("creationTimestamp"))
        else:
            since = parse_time(available.get("lastTransitionTime")) if available.get("status") == "False" else None
        failure = conditions.get("ReplicaFailure") or {}
        reason = failure.get("reason") or "ReplicaFailure"
        return cls(
            name=meta.get("name", ""),
            pairing_key=(meta.get("labels") or {}).get(LABEL_PAIRING, ""),
            replicas=int((obj.get("spec") or {}).get("replicas") or 0),
            available=int(status.get("availableReplicas") or 0),
            unavailable_since=since,
            replica_failure=((f"{reason}: {failure['message']}" if failure.get("message") else reason)
                             if failure.get("status") == "True" else None),
        )


@dataclass(frozen=True)
class RouterHealth:
    """Whether clients can reach the fleet through its router, and why the router is degraded, if it is."""

    available: bool
    message: str
    trouble: str | None = None


def health(routers: Sequence[RouterDeployment], paired_since: Mapping[str, float], now: float,
           grace: float = UNAVAILABLE_SECONDS) -> RouterHealth:
    """The fleet's router health from its router Deployments (those not on their way out).

    The fleet serves while any router replica is available: the Service spans every router
    Deployment. With none, it is degraded once that has lasted longer than `grace` counted from
    when a router could have been ready: smg is ready only with a ready prefill and decode of its
    pairing key (`paired_since`: since when each key has had one), so a fleet still loading its
    engines is starting, not degraded. A Deployment that cannot create its pods is degraded at once.
    """
    failures = [f"{r.name} cannot create pods ({r.replica_failure})" for r in routers if r.replica_failure]
    counts = ", ".join(f"{r.name} {r.available}/{r.replicas}" for r in routers) or "no router Deployment yet"
    if any(r.available for r in routers):
        return RouterHealth(True, f"router replicas available: {counts}", "; ".join(failures) or None)
    message = f"no router replica is available ({counts}): clients get no answer"
    down_since = max((now if r.unavailable_since is None else r.unavailable_since for r in routers), default=now)
    could_since = min((paired_since[r.pairing_key] for r in routers if r.pairing_key in paired_since), default=None)
    troubles = list(failures)
    if could_since is not None and now - max(down_since, could_since) > grace:
        troubles.insert(0, f"the router has had no available replica for {now - max(down_since, could_since):.0f}s "
                           f"while a prefill and a decode of its pairing key serve ({counts})")
    return RouterHealth(False, message, "; ".join(troubles) or None)
