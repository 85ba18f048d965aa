"""Pods that wait without failing: never tried by a scheduler, or containers never created.

None shows as an error anywhere else. A pod with `spec.schedulingGates` (Kueue holds a pod
group until its queue admits it) is not even tried by the scheduler, so it never turns
Unschedulable: it waits, possibly forever, for quota that is not coming. A pod whose
`spec.schedulerName` names a scheduler that is not running (a misspelt name, Volcano or a
coscheduler not installed) waits the same way: only the scheduler it names would write its
`PodScheduled` condition, so it has none. A container in
ContainerCreating waits for a volume that does not attach, a network plugin that gives no
address, or an image that never finishes pulling; the kubelet reports those only as pod Events.
Past a grace that normal starts stay within, each names a reason of the fleet's `Degraded`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from hybridserving.core.observed import ObservedPod

# Kueue admits a group whose quota is free within seconds; one gated for minutes waits for
# quota (or for a queue that does not exist).
SCHEDULING_GATED_SECONDS = 120.0
# A running scheduler writes PodScheduled on its first attempt, within seconds of the creation
# even behind a queue of thousands of pods; minutes without one mean no scheduler has the name.
UNTRIED_SECONDS = 180.0
# Creating a container (volumes, network, the image pull) takes seconds to minutes; one still
# at it after 10 minutes is stuck on something the pod's Events name.
CONTAINER_CREATING_SECONDS = 600.0

StallReason = Literal["SchedulingGated", "NoScheduler", "ContainerNotCreated"]


@dataclass(frozen=True)
class StalledPod:
    """A pod waiting longer than its grace: why, on what (the gates or the containers), since when."""

    pod: str
    reason: StallReason
    on: tuple[str, ...]
    since: float

    def describe(self, now: float) -> str:
        minutes = f"{(now - self.since) / 60:.0f} min"
        if self.reason == "SchedulingGated":
            return (f"pod {self.pod} has waited {minutes} on its scheduling gate(s) {', '.join(self.on)} "
                    "(the scheduler does not try it until they are removed)")
        if self.reason == "NoScheduler":
            return (f"pod {self.pod} has waited {minutes} for a scheduler named {self.on[0]!r} to try it "
                    "(no PodScheduled condition: is that scheduler running, and is "
                    "spec.podTemplate.schedulerName spelt as it is deployed?)")
        return f"pod {self.pod} has waited {minutes} for its container(s) {', '.join(self.on)} to be created"


def scheduling_gated(pod: ObservedPod, now: float) -> StalledPod | None:
    """Gated from scheduling for longer than `SCHEDULING_GATED_SECONDS` since its creation (a pod
    carries its gates from its creation until they are removed)."""
    if pod.deleting or not pod.scheduling_gates or pod.created_at is None:
        return None
    if now - pod.created_at <= SCHEDULING_GATED_SECONDS:
        return None
    return StalledPod(pod.name, "SchedulingGated", pod.scheduling_gates, pod.created_at)


def never_tried(pod: ObservedPod, now: float) -> StalledPod | None:
    """Neither bound, gated nor tried by its scheduler for longer than `UNTRIED_SECONDS` since its
    creation."""
    if (pod.deleting or pod.scheduling_tried or pod.scheduling_gates or pod.node_name
            or pod.phase != "Pending" or pod.created_at is None):
        return None
    if now - pod.created_at <= UNTRIED_SECONDS:
        return None
    return StalledPod(pod.name, "NoScheduler", (pod.scheduler_name,), pod.created_at)


def container_not_created(pod: ObservedPod, now: float) -> StalledPod | None:
    """Containers in ContainerCreating for longer than `CONTAINER_CREATING_SECONDS` since the
    kubelet could create them."""
    if pod.deleting or not pod.not_created or pod.creatable_since is None:
        return None
    if now - pod.creatable_since <= CONTAINER_CREATING_SECONDS:
        return None
    return StalledPod(pod.name, "ContainerNotCreated", pod.not_created, pod.creatable_since)


def stalled(pods: Iterable[ObservedPod], now: float) -> list[StalledPod]:
    """The pods stalled, each for its first reason (a pod not yet scheduled has no containers to
    create)."""
    out: list[StalledPod] = []
    for pod in pods:
        found = scheduling_gated(pod, now) or never_tried(pod, now) or container_not_created(pod, now)
        if found is not None:
            out.append(found)
    return out
