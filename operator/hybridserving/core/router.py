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
"""

from __future__ import annotations

from typing import Any

from hybridserving.api.v1alpha1 import RouterSpec

METRICS_PORT_NAME = "metrics"
PRESTOP_SECONDS = 5
DRAIN_SECONDS = 110  # smg's --shutdown-grace-period-secs
TERMINATION_GRACE_SECONDS = PRESTOP_SECONDS + DRAIN_SECONDS + 5


def container_fields(router: RouterSpec) -> dict[str, Any]:
    """Probes and resources of the router container."""
    return {
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 2, "timeoutSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "initialDelaySeconds": 10,
                          "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 2},
        "resources": router.resources.to_wire(),
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
    """With two or more replicas, node drains take one router at a time (none to protect with one)."""
    if router.replicas < 2:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }
