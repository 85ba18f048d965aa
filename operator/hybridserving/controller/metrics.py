"""Operator metrics (Prometheus): how often it reconciles, how long it takes, what it writes."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("hybridserving_reconciles_total", "Reconcile passes, by result.", ["result"])
DURATION = Histogram(
    "hybridserving_reconcile_duration_seconds", "Time of one reconcile pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ACTIONS = Counter("hybridserving_actions_total", "Writes the planner asked for and the API accepted.", ["verb", "kind"])
ACTION_ERRORS = Counter("hybridserving_action_errors_total", "Writes the API refused (not conflicts).", ["kind"])
CONFLICTS = Counter("hybridserving_conflicts_total", "Passes cut short by a 409/404 (retried from a fresh read).")
ROLE_SWITCHES = Counter(
    "hybridserving_role_switches_total", "Instances whose pods the operator moved to a new role (in place).",
    ["from_role", "to_role"],
)
QUEUE_DEPTH = Gauge("hybridserving_queue_depth", "HybridServings waiting for a reconcile.")
