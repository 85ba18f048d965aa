"""An instance whose pod waits past its grace (gated from scheduling, containers never created) reads
`Stalled`, not `Starting`: `kubectl get hybridservinginstances` shows what `Degraded` names."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hybridserving.api.instance import HybridServingInstanceSpec, InstancePorts
from hybridserving.contract import ANNOTATION_ROLE
from hybridserving.controller.status import instance_phase, instance_status
from hybridserving.core.desired import InstancePlan
from hybridserving.core.health import InstanceView
from hybridserving.core.naming import ANNOTATION_CONFIG_HASH, LABEL_INSTANCE, LABEL_NODE_RANK
from hybridserving.core.observed import ObservedInstance, ObservedPod
from hybridserving.core.stalled import CONTAINER_CREATING_SECONDS, SCHEDULING_GATED_SECONDS, UNTRIED_SECONDS
from hybridserving.core.switching import ANNOTATION_SWITCH, SwitchState

NOW = 1_764_842_450.0
CONFIG = "a" * 20
GATE = "kueue.x-k8s.io/admission"


def at(seconds_ago: float) -> str:
    return dt.datetime.fromtimestamp(NOW - seconds_ago, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(rank: int = 0, *, gated_for: float | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A current pod of instance fleet-0, created `gated_for` seconds ago with a scheduling gate."""
    return {
        "metadata": {"name": f"fleet-0-{rank}", "creationTimestamp": at(gated_for or 30),
                     "labels": {LABEL_INSTANCE: "fleet-0", LABEL_NODE_RANK: str(rank)},
                     "annotations": {ANNOTATION_CONFIG_HASH: CONFIG, ANNOTATION_ROLE: "decode"}},
        "spec": {"schedulingGates": [{"name": GATE}]} if gated_for is not None else {"nodeName": f"node-{rank}"},
        "status": status or {"phase": "Pending"},
    }


def creating(seconds: float, *, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """Containers the kubelet could create `seconds` ago, `metrics` still in ContainerCreating."""
    return {"phase": "Pending", "startTime": at(seconds), "containerStatuses": [
        engine or {"name": "engine", "ready": False, "restartCount": 0,
                   "state": {"waiting": {"reason": "ContainerCreating"}}},
        {"name": "metrics", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}},
    ]}


def view(*pods: dict[str, Any], phase: str | None = None, annotations: dict[str, str] | None = None,
         now: float | None = NOW) -> InstanceView:
    ports = InstancePorts(http=30000, bootstrap=30001, dist_init=30002, engine_info_bootstrap=30003)
    spec = HybridServingInstanceSpec(role="decode", index=0, nodes=len(pods), config_hash=CONFIG, ports=ports)
    plan = InstancePlan(name="fleet-0", index=0, role="decode", nodes=len(pods), ports=ports,
                        template_hash=CONFIG[:10], config_hash=CONFIG, manifest={}, pods=list(pods), service=None)
    observed = ObservedInstance(name="fleet-0", uid="u", resource_version="1", spec=spec, phase=phase,
                                annotations=annotations or {})
    return InstanceView(plan, observed, [ObservedPod.from_manifest(p, now) for p in pods], now)


def ready_condition(v: InstanceView) -> dict[str, Any]:
    status = instance_status(v, 1)
    [ready] = status.conditions
    return ready.model_dump(by_alias=True)


def test_a_pod_gated_past_its_grace_makes_the_instance_stalled_naming_the_pod_and_its_gate() -> None:
    v = view(pod(gated_for=SCHEDULING_GATED_SECONDS + 180))
    assert instance_phase(v) == "Stalled"
    assert instance_status(v, 1).phase == "Stalled"
    ready = ready_condition(v)
    assert (ready["status"], ready["reason"]) == ("False", "SchedulingGated")
    assert ready["message"].startswith("Stalled: 0/1 pod(s) ready; pod fleet-0-0 has waited 5 min")
    assert GATE in ready["message"]


def test_a_pod_gated_within_its_grace_is_still_starting() -> None:
    v = view(pod(gated_for=SCHEDULING_GATED_SECONDS - 10))
    assert instance_phase(v) == "Starting"
    assert ready_condition(v)["reason"] == "Starting"


def test_a_pod_its_scheduler_never_tried_makes_the_instance_stalled_naming_the_scheduler() -> None:
    untried = pod()
    untried["metadata"]["creationTimestamp"] = at(UNTRIED_SECONDS + 120)
    untried["spec"] = {"schedulerName": "volcano"}
    v = view(untried)
    assert instance_phase(v) == "Stalled"
    ready = ready_condition(v)
    assert ready["reason"] == "NoScheduler"
    assert "pod fleet-0-0 has waited 5 min for a scheduler named 'volcano' to try it" in ready["message"]
    untried["metadata"]["creationTimestamp"] = at(UNTRIED_SECONDS - 30)
    assert instance_phase(view(untried)) == "Starting"


def test_containers_not_created_past_their_grace_make_the_instance_stalled() -> None:
    v = view(pod(status=creating(CONTAINER_CREATING_SECONDS + 300)))
    assert instance_phase(v) == "Stalled"
    ready = ready_condition(v)
    assert ready["reason"] == "ContainerNotCreated"
    assert "pod fleet-0-0 has waited 15 min for its container(s) engine, metrics to be created" in ready["message"]
    assert instance_phase(view(pod(status=creating(CONTAINER_CREATING_SECONDS - 60)))) == "Starting"


def test_one_stalled_rank_makes_the_whole_gang_stalled() -> None:
    running = {"phase": "Running", "startTime": at(900), "containerStatuses": [
        {"name": "engine", "ready": False, "restartCount": 0, "state": {"running": {"startedAt": at(890)}}}]}
    v = view(pod(0, status=running), pod(1, gated_for=600))
    assert instance_phase(v) == "Stalled"
    assert "pod fleet-0-1 has waited 10 min" in ready_condition(v)["message"]


def test_a_crash_looping_or_blocked_container_wins_over_a_stall() -> None:
    looping = {"name": "engine", "ready": False, "restartCount": 4,
               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 1, "finishedAt": at(20)}}}
    assert instance_phase(view(pod(status=creating(3600, engine=looping)))) == "CrashLoop"
    pulling = {"phase": "Pending", "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 0,
                                                          "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
    assert instance_phase(view(pod(0, status=pulling), pod(1, status=creating(3600)))) == "Blocked"


def test_a_switch_phase_wins_over_a_stall_and_the_reconcile_leaves_it_alone() -> None:
    v = view(pod(gated_for=3600), phase="Draining")
    assert instance_phase(v) == "Draining"
    assert "phase" not in instance_status(v, 1).model_fields_set
    record = SwitchState.start("decode", "prefill", "in-place", "test", 0.0).to_annotation()
    recorded = view(pod(gated_for=3600), phase="Starting", annotations={ANNOTATION_SWITCH: record})
    assert "phase" not in instance_status(recorded, 1).model_fields_set


def test_pods_read_without_a_time_are_not_called_stalled() -> None:
    assert instance_phase(view(pod(gated_for=3600), now=None)) == "Starting"
