"""All-or-nothing admission of an instance's pods.

Without it the scheduler binds pods one by one: a 4-node instance in a cluster with three
free nodes binds three pods, which hold 24 GPUs while the fourth waits. Two mechanisms
clusters run are rendered here:

* `Workload`: Kubernetes' Workload API (scheduling.k8s.io/v1alpha1, kube-scheduler with the
  GenericWorkload and GangScheduling feature gates). One Workload per instance, owned by
  the instance, with one pod group whose gang policy needs all of its pods; each pod points
  at it with `spec.workloadRef`. The scheduler binds none of them until all of them fit.
* `Kueue`: Kueue's plain-pod groups (the `kueue.x-k8s.io/pod-group-name` label and the
  `pod-group-total-count` annotation, plus the queue label), admitted by Kueue as one unit.

The pod group is named after the instance only (never the role), so a role switch leaves
the pods' gang membership alone.
"""

from __future__ import annotations

from typing import Any

from hybridserving.api.v1alpha1 import HybridServingSpec

WORKLOAD_API_VERSION = "scheduling.k8s.io/v1alpha1"
WORKLOAD_KIND = "Workload"
POD_GROUP = "engine"
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"


def uses_workload(spec: HybridServingSpec) -> bool:
    return spec.gang.mode == "Workload"


def workload_name(instance: str, nodes: int) -> str:
    """Named by its size too: a Workload's pod groups are immutable, so a new size is a new Workload."""
    return f"{instance}-n{nodes}"


def workload(instance: str, namespace: str, nodes: int, metadata: dict[str, Any]) -> dict[str, Any]:
    """The Workload of one instance: one gang of all its pods."""
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": WORKLOAD_KIND,
        "metadata": {**metadata, "name": workload_name(instance, nodes), "namespace": namespace},
        "spec": {"podGroups": [{"name": POD_GROUP, "policy": {"gang": {"minCount": nodes}}}]},
    }


def pod_spec_fields(spec: HybridServingSpec, instance: str, nodes: int) -> dict[str, Any]:
    """Pod spec fields that put a pod into its instance's gang."""
    if uses_workload(spec):
        return {"workloadRef": {"name": workload_name(instance, nodes), "podGroup": POD_GROUP}}
    return {}


def pod_metadata(spec: HybridServingSpec, instance: str, nodes: int) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod into its instance's gang."""
    if spec.gang.mode != "Kueue":
        return {}, {}
    labels = {KUEUE_POD_GROUP: instance}
    if spec.gang.queue_name:
        labels[KUEUE_QUEUE] = spec.gang.queue_name
    return labels, {KUEUE_TOTAL: str(nodes)}
