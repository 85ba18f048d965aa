"""The router as a production component: probes, resources, spread, a disruption budget, metrics,
a graceful exit.

smg (1.13) answers `/liveness` while its process serves and `/readiness` only once it has
healthy workers of both roles in PD mode (503 before), so a router replica that lost its
workers leaves the Service instead of answering 503 to clients. Metrics are served on their
own port (`--prometheus-host/--prometheus-port`) and exposed on the router Service as
`metrics`, which the chart's ServiceMonitor (or any scraper) selects.

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
"""

from __future__ import annotations

from typing import Any

from hybridserving.api.pods import canonical_quantity
from hybridserving.api.v1alpha1 import RouterSpec

METRICS_PORT_NAME = "metrics"
PRESTOP_SECONDS = 5
DRAIN_SECONDS = 110  # smg's --shutdown-grace-period-secs
OVERLOAD_FLAGS = ("--disable-worker-overload-protection",)
TERMINATION_GRACE_SECONDS = PRESTOP_SECONDS + DRAIN_SECONDS + 5


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
