"""Operator metrics (Prometheus): how often it reconciles, how long it takes, what it writes.

The labelled counters of passes and switches hold every label set at 0 from the start: a series
Prometheus first sees at 1 shows no `increase()`, so an alert would miss the first failed switch
after each operator start.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import Counter, Gauge, Histogram

from hybridserving.core.switching import Mode, Outcome

ReconcileResult = Literal["ok", "conflict", "error", "gone"]
SwitchReason = Literal["policy", "on-call"]
"""What started a role switch: the policy, or an on-call request on the instance."""
FINISHED_OUTCOMES = tuple(o for o in get_args(Outcome) if o != "InProgress")

RECONCILES = Counter("hybridserving_reconciles_total", "Reconcile passes, by result.", ["result"])
for _result in get_args(ReconcileResult):
    RECONCILES.labels(_result)
DURATION = Histogram(
    "hybridserving_reconcile_duration_seconds", "Time of one reconcile pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ACTIONS = Counter(
    "hybridserving_actions_total",
    "Writes the planner asked for and the API accepted, by verb, kind and cause (core.actions.Cause).",
    ["verb", "kind", "cause"],
)
ACTION_ERRORS = Counter("hybridserving_action_errors_total", "Writes the API refused (not conflicts).", ["kind"])
API_READS = Counter(
    "hybridserving_api_reads_total",
    "GETs and LISTs sent to the API server, by the part of the operator that made them "
    "(reconcile, switch, lease, crd).",
    ["component", "verb", "kind"],
)
CONFLICTS = Counter("hybridserving_conflicts_total", "Passes cut short by a 409/404 (retried from a fresh read).")
ROLE_SWITCHES = Counter(
    "hybridserving_role_switches_total", "Instances whose pods the operator moved to a new role (in place).",
    ["from_role", "to_role"],
)
QUEUE_DEPTH = Gauge("hybridserving_queue_depth",
                    "HybridServings waiting for a reconcile (0 on a standby replica, which runs none).")
OLDEST_PASS_SECONDS = Gauge(
    "hybridserving_oldest_pass_seconds",
    "How long the oldest reconcile pass or role-switch tick still running has run (0: none runs); "
    "past --stuck-pass-seconds the liveness endpoint fails.",
)
CRD_SCHEMA_CURRENT = Gauge(
    "hybridserving_crd_schema_current",
    "1 when the installed CRD carries the schema digest this operator was built with; 0 when it carries "
    "another, none (an earlier release's) or is missing. Set by every replica, leader or not.",
    ["crd"],
)
LEADER = Gauge("hybridserving_leader", "1 while this replica acts (holds the leader lease, or runs without election).")

# Role-switch controller (controller/switching.py). `reason` is a SwitchReason.
ROLE_SWITCHES_STARTED = Counter(
    "hybridserving_role_switches_started_total", "Role switches the controller started, by reason and mode.",
    ["reason", "mode"],
)
ROLE_SWITCH_OUTCOMES = Counter(
    "hybridserving_role_switch_outcomes_total",
    "Role switches finished, by reason, outcome (Succeeded, Aborted, Refused, Failed) and mode.",
    ["reason", "outcome", "mode"],
)
for _reason in get_args(SwitchReason):
    for _mode in get_args(Mode):
        ROLE_SWITCHES_STARTED.labels(_reason, _mode)
        for _outcome in FINISHED_OUTCOMES:
            ROLE_SWITCH_OUTCOMES.labels(_reason, _outcome, _mode)
ROLE_SWITCH_TICKS = Counter(
    "hybridserving_role_switch_ticks_total",
    "Role-switch ticks of one fleet, by result (ran, skipped: switching off and nothing in flight, error).",
    ["result"],
)
ROLE_SWITCH_PHASE_SECONDS = Histogram(
    "hybridserving_role_switch_phase_seconds",
    "Time an instance spent in each step of a role switch (Unroute, Drain, Switch, Verify, Route, Restore, Restart).",
    ["phase", "mode"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
)
ROLE_SWITCH_DURATION = Histogram(
    "hybridserving_role_switch_duration_seconds", "Start to routed-in-the-new-role of successful switches.",
    ["mode"], buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
)

# Per-fleet state for alerts (docs/runbooks). `namespace` is the fleet's, so the ServiceMonitor keeps
# the operator's labels (honorLabels). `status` follows kube-state-metrics: one series per value,
# 1 for the current one, so `status="False"` alerts need no join.
FLEET_CONDITION = Gauge(
    "hybridserving_fleet_condition", "1 when the HybridServing's condition `type` has this `status`, else 0.",
    ["namespace", "hybridserving", "type", "status"],
)
INSTANCE_RESTARTS = Gauge(
    "hybridserving_instance_restarts",
    "Container restarts of an instance's pods as the kubelet counts them (restartCount, summed).",
    ["namespace", "hybridserving", "hybridserving_instance"],
)
INSTANCE_CRASH_LOOPING = Gauge(
    "hybridserving_instance_crash_looping",
    "1 while a container of the instance waits in CrashLoopBackOff, or restarted within the last "
    "10 minutes and is not Ready yet (between two exits), else 0.",
    ["namespace", "hybridserving", "hybridserving_instance"],
)
INSTANCE_SWITCHING = Gauge(
    "hybridserving_instance_switching", "1 while the instance is in a role switch (any step), else 0.",
    ["namespace", "hybridserving", "hybridserving_instance"],
)
INSTANCE_RELAUNCHING = Gauge(
    "hybridserving_instance_relaunching",
    "1 while a role switch relaunches the instance's engine (its Switch step by relaunch, bounded by the "
    "launcher's start-up limit, an hour, where every other step takes minutes), else 0.",
    ["namespace", "hybridserving", "hybridserving_instance"],
)
