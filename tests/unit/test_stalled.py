"""Pods that wait without failing: gated from scheduling, or containers never created (`core.stalled`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hybridserving.core.observed import ObservedPod
from hybridserving.core.stalled import (
    UNTRIED_SECONDS,
    StalledPod,
    container_not_created,
    never_tried,
    scheduling_gated,
    stalled,
)

NOW = 1_764_842_450.0  # 2025-12-04T10:00:50Z


def at(seconds_ago: float) -> str:
    return dt.datetime.fromtimestamp(NOW - seconds_ago, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# The default scheduler's first attempt on a pod that fits no node.
UNSCHEDULABLE = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}]}


def pod(name: str = "fleet-0-0", gates: tuple[str, ...] = (), created_ago: float = 3600.0,
        status: dict[str, Any] | None = None, deleting: bool = False, scheduler: str | None = None) -> ObservedPod:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": at(created_ago)}
    if deleting:
        meta["deletionTimestamp"] = at(0)
    spec: dict[str, Any] = {"schedulingGates": [{"name": g} for g in gates]} if gates else {}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return ObservedPod.from_manifest({"metadata": meta, "spec": spec, "status": status or UNSCHEDULABLE}, NOW)


def creating(started_ago: float, **status: Any) -> dict[str, Any]:
    return {"phase": "Pending", "startTime": at(started_ago), **status,
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 0,
                                   "state": {"waiting": {"reason": "ContainerCreating"}}}]}


def test_a_pod_gated_past_two_minutes_is_stalled_naming_its_gates() -> None:
    gates = ("kueue.x-k8s.io/admission", "example.com/quota")
    assert scheduling_gated(pod(gates=gates, created_ago=119), NOW) is None, "Kueue admits within seconds"
    found = scheduling_gated(pod(gates=gates, created_ago=300), NOW)
    assert found == StalledPod("fleet-0-0", "SchedulingGated", gates, NOW - 300)
    assert "kueue.x-k8s.io/admission, example.com/quota" in found.describe(NOW)
    assert "5 min" in found.describe(NOW)
    assert scheduling_gated(pod(created_ago=3600), NOW) is None, "no gates: the scheduler has it"
    gated = pod(gates=gates, created_ago=3600, status={"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]})
    assert scheduling_gated(gated, NOW) is not None, "the apiserver marks a gated pod so: still gated"
    assert scheduling_gated(pod(gates=gates, created_ago=3600, deleting=True), NOW) is None


def test_a_pod_no_scheduler_has_tried_past_three_minutes_is_stalled_naming_the_scheduler() -> None:
    untried = {"phase": "Pending"}  # what the apiserver keeps until a scheduler of its name tries it
    assert never_tried(pod(scheduler="volcano", created_ago=UNTRIED_SECONDS - 5, status=untried), NOW) is None
    found = never_tried(pod(scheduler="volcano", created_ago=600, status=untried), NOW)
    assert found == StalledPod("fleet-0-0", "NoScheduler", ("volcano",), NOW - 600)
    assert "10 min for a scheduler named 'volcano' to try it" in found.describe(NOW)
    assert "spec.podTemplate.schedulerName" in found.describe(NOW)
    assert never_tried(pod(created_ago=600, status=untried), NOW) == StalledPod(
        "fleet-0-0", "NoScheduler", ("default-scheduler",), NOW - 600), "no schedulerName: the default one"
    assert never_tried(pod(scheduler="volcano", created_ago=600), NOW) is None, "tried, and unschedulable"
    assert never_tried(pod(created_ago=600, status=untried, deleting=True), NOW) is None
    assert never_tried(pod(gates=("kueue.x-k8s.io/admission",), created_ago=600, status=untried), NOW) is None, \
        "gated: its scheduler does not try it yet"
    bound = ObservedPod.from_manifest({"metadata": {"name": "fleet-0-0", "creationTimestamp": at(600)},
                                       "spec": {"nodeName": "gpu-0"}, "status": untried}, NOW)
    assert never_tried(bound, NOW) is None, "bound by its creator (nodeName set): no scheduler needed"


def test_containers_creating_past_ten_minutes_are_stalled_naming_them() -> None:
    assert container_not_created(pod(status=creating(599)), NOW) is None
    found = container_not_created(pod(status=creating(900)), NOW)
    assert found == StalledPod("fleet-0-0", "ContainerNotCreated", ("engine",), NOW - 900)
    assert "container(s) engine to be created" in found.describe(NOW)
    running = {"phase": "Running", "startTime": at(3600),
               "containerStatuses": [{"name": "engine", "state": {"running": {"startedAt": at(3000)}}}]}
    assert container_not_created(pod(status=running), NOW) is None
    assert container_not_created(pod(status={"phase": "Pending", "containerStatuses": [
        {"name": "engine", "state": {"waiting": {"reason": "ContainerCreating"}}}]}), NOW) is None, \
        "no time to count from: not yet acknowledged by a kubelet"


def test_creation_is_timed_from_when_the_kubelet_could_start_it() -> None:
    after_init = creating(3600, initContainerStatuses=[
        {"name": "weights", "state": {"terminated": {"exitCode": 0, "finishedAt": at(60)}}}])
    assert container_not_created(pod(status=after_init), NOW) is None, "a long weights download is no stall"
    restarted = creating(3600)
    restarted["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1, "finishedAt": at(30)}}
    assert container_not_created(pod(status=restarted), NOW) is None


def test_each_pod_is_stalled_for_its_first_reason() -> None:
    pods = [pod("a-0-0", gates=("kueue.x-k8s.io/admission",), status=creating(3600)),
            pod("b-0-0", status=creating(3600)), pod("c-0-0"), pod("d-0-0", status={"phase": "Pending"})]
    assert [(p.pod, p.reason) for p in stalled(pods, NOW)] == [
        ("a-0-0", "SchedulingGated"), ("b-0-0", "ContainerNotCreated"), ("d-0-0", "NoScheduler")]
