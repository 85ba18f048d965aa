"""What the operator found of a fleet in the cluster, parsed once into typed values.

The planner and the health rules read these, never raw manifests: a field the apiserver
leaves out (a pod not yet scheduled, an instance without status) has one default here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridserving.api.base import FROM_CLUSTER
from hybridserving.api.instance import HybridServingInstanceSpec
from hybridserving.core import weights
from hybridserving.core.naming import ANNOTATION_RESTART_GENERATION, LABEL_INSTANCE, LABEL_NODE_RANK, LABEL_SURGE

ObjectKey = tuple[str, str]  # (kind, name)

# The kubelet forgets a container's restart back-off once it has gone this long without an exit
# (twice its 300 s cap: pkg/util/flowcontrol/backoff.go, hasExpired). Until then a restarted
# container that is not Ready is still in its loop, also while it runs between two exits.
CRASH_LOOP_MEMORY_SECONDS = 600.0


# Waiting reasons that no wait resolves: the container cannot be created until someone fixes the
# image, the registry credentials or a missing Secret/ConfigMap (the kubelet keeps retrying).
BLOCKED_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError",
})


# How long a pod that served stays not Ready before it counts as Unready: three readiness probe
# periods (10 s each, `rendering.py`), the kubelet's own failureThreshold.
UNREADY_GRACE_SECONDS = 30.0


def restart_generation(annotations: Mapping[str, str]) -> int:
    """The restart generation a pod was rendered for (0 when its annotation is absent or unreadable)."""
    try:
        return int(annotations.get(ANNOTATION_RESTART_GENERATION, "0"))
    except ValueError:
        return 0


def format_time(seconds: float) -> str:
    """RFC 3339 in UTC, to the second, as the API writes times."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as the API writes it, or None."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def describe_termination(terminated: Mapping[str, Any]) -> str:
    """A container's last exit as people read it: exit code, reason, and the termination message."""
    text = f"exit code {terminated.get('exitCode')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    message = (terminated.get("message") or "").strip()
    if message:
        text += f": {message.splitlines()[-1][:300]}"
    return text


def _in_crash_loop(container: Mapping[str, Any], now: float | None) -> bool:
    """Waiting out its back-off, or restarted recently enough that the kubelet still counts the loop.

    The waiting reason alone flickers: between two exits the container runs (the engine loads)
    and reads like any starting one.
    """
    if ((container.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
        return True
    if now is None or not int(container.get("restartCount") or 0):
        return False
    finished = parse_time(((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
    return finished is not None and now - finished < CRASH_LOOP_MEMORY_SECONDS


def _blocked(status: Mapping[str, Any]) -> str | None:
    """The first container (init containers included) the kubelet cannot create, and why."""
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in BLOCKED_WAITING_REASONS:
            message = (waiting.get("message") or "").strip().splitlines()
            return f"container {cs.get('name')}: {waiting['reason']}" + (f": {message[-1][:300]}" if message else "")
    return None


def _was_ready(ready_condition: Mapping[str, Any], containers: list[Mapping[str, Any]]) -> bool:
    """Not ready, and the Ready condition turned so after its containers last started: the engine
    was ready in between (it is False from the pod's start until the first success)."""
    if ready_condition.get("status") != "False":
        return False
    turned = parse_time(ready_condition.get("lastTransitionTime"))
    started = [parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt")) for cs in containers]
    if turned is None or not started or any(t is None for t in started):
        return False
    return turned > max(t for t in started if t is not None)


def _lost_readiness(ready_condition: Mapping[str, Any], containers: list[Mapping[str, Any]], now: float | None) -> bool:
    """`_was_ready` for `UNREADY_GRACE_SECONDS`. The grace lets a pause (the launcher's `/readyz`
    answers 503 while an in-place role switch drains and rebuilds the engine) pass before the next
    probe without being reported."""
    if now is None or not _was_ready(ready_condition, containers):
        return False
    turned = parse_time(ready_condition.get("lastTransitionTime"))
    return turned is not None and now - turned >= UNREADY_GRACE_SECONDS


def _not_created(status: Mapping[str, Any]) -> tuple[tuple[str, ...], float | None]:
    """The containers waiting in ContainerCreating, and since when the kubelet could create them:
    the latest of the pod's start on its node, the init containers' exits or starts and these
    containers' own last exits (a waiting state carries no time of its own)."""
    containers = status.get("containerStatuses") or []
    waiting = tuple(str(cs.get("name")) for cs in containers
                    if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "ContainerCreating")
    if not waiting:
        return (), None
    times = [parse_time(status.get("startTime"))]
    for cs in status.get("initContainerStatuses") or []:
        state = cs.get("state") or {}
        times += [parse_time((state.get("terminated") or {}).get("finishedAt")),
                  parse_time((state.get("running") or {}).get("startedAt"))]
    times += [parse_time(((cs.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
              for cs in containers if cs.get("name") in waiting]
    known = [t for t in times if t is not None]
    return waiting, max(known) if known else None


@dataclass(frozen=True)
class ObservedPod:
    """What the planner reads of a pod."""

    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    phase: str = "Pending"
    ready: bool = False
    node_name: str | None = None
    deleting: bool = False
    restarts: int = 0
    crash_looping: bool = False
    blocked: str | None = None  # a container the kubelet cannot create (image, Secret), and why
    was_ready: bool = False  # not ready now, but was since its containers last started
    lost_readiness: bool = False  # running, and `was_ready` for longer than a pause
    last_exit: str | None = None
    unschedulable: str | None = None
    host_ports: tuple[int, ...] = ()
    owner_uids: tuple[str, ...] = ()
    weights_fill: tuple[str, str] | None = None  # the node-cache fill step: (state, detail)
    weights_copy: str | None = None  # the node-cache copy that step fills
    weights_progress_at: tuple[str, int] | None = None  # (IP, port) where its running fill serves progress
    ready_since: float | None = None  # when it last turned Ready (the condition's lastTransitionTime), if ready
    created_at: float | None = None
    scheduling_gates: tuple[str, ...] = ()  # spec.schedulingGates: the scheduler leaves it alone until they go
    scheduler_name: str = "default-scheduler"  # spec.schedulerName: the one scheduler that will try it
    scheduling_tried: bool = False  # a PodScheduled condition: its scheduler has tried it (or it is gated)
    not_created: tuple[str, ...] = ()  # containers waiting in ContainerCreating
    creatable_since: float | None = None  # since when the kubelet could create them

    @property
    def instance(self) -> str:
        return self.labels.get(LABEL_INSTANCE, "")

    @property
    def rank(self) -> int:
        try:
            return int(self.labels.get(LABEL_NODE_RANK, "-1"))
        except ValueError:
            return -1

    @property
    def restart_generation(self) -> int:
        return restart_generation(self.annotations)

    @property
    def started(self) -> bool:
        """Whether the engine ran: from then on a lost peer breaks the gang's collectives."""
        return self.phase in ("Running", "Succeeded", "Failed")

    @classmethod
    def from_manifest(cls, obj: Mapping[str, Any], now: float | None = None) -> ObservedPod:
        """`now` (when the pod was read) lets a restarted pod count as crash-looping between exits."""
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ready = (conditions.get("Ready") or {}).get("status") == "True"
        ready_since = parse_time((conditions.get("Ready") or {}).get("lastTransitionTime")) if ready else None
        scheduled = conditions.get("PodScheduled") or {}
        unschedulable = None
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            unschedulable = scheduled.get("message") or "unschedulable"
        containers = status.get("containerStatuses") or []
        restarts = sum(int(cs.get("restartCount") or 0) for cs in containers)
        inits = status.get("initContainerStatuses") or []
        # An init container (the weights fill, a user's) that keeps failing holds the pod before
        # its engine ever starts: as much a crash loop as the engine's own.
        crash_looping = not ready and any(_in_crash_loop(cs, now) for cs in [*inits, *containers])
        was_ready = _was_ready(conditions.get("Ready") or {}, containers)
        lost_readiness = (status.get("phase") == "Running" and not crash_looping
                          and _lost_readiness(conditions.get("Ready") or {}, containers, now))
        last_exit = next((describe_termination(t) for cs in containers
                          if (t := (cs.get("lastState") or {}).get("terminated"))), None) or next(
            (f"init container {cs.get('name')}: {describe_termination(t)}" for cs in inits
             if (t := (cs.get("lastState") or {}).get("terminated"))), None)
        host_ports = tuple(
            int(p["hostPort"])
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("hostPort")
        )
        if spec.get("hostNetwork"):
            host_ports = tuple(
                int(p["containerPort"]) for c in spec.get("containers") or [] for p in c.get("ports") or []
            )
        not_created, creatable_since = _not_created(status)
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            phase=status.get("phase") or "Pending",
            ready=ready,
            ready_since=ready_since,
            node_name=spec.get("nodeName"),
            deleting=bool(meta.get("deletionTimestamp")),
            restarts=restarts,
            crash_looping=crash_looping,
            blocked=_blocked(status),
            was_ready=was_ready,
            lost_readiness=lost_readiness,
            last_exit=last_exit,
            unschedulable=unschedulable,
            host_ports=host_ports,
            owner_uids=tuple(ref.get("uid", "") for ref in meta.get("ownerReferences") or []),
            weights_fill=weights.fill_outcome(obj),
            weights_copy=weights.fill_copy(obj),
            weights_progress_at=weights.progress_address(obj),
            created_at=parse_time(meta.get("creationTimestamp")),
            scheduling_gates=tuple(str(g.get("name")) for g in spec.get("schedulingGates") or []),
            scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
            scheduling_tried="PodScheduled" in conditions,
            not_created=not_created,
            creatable_since=creatable_since,
        )


@dataclass(frozen=True)
class ObservedInstance:
    """What the planner reads of a HybridServingInstance."""

    name: str
    uid: str
    resource_version: str
    spec: HybridServingInstanceSpec
    phase: str | None = None
    deleting: bool = False
    owner_uids: tuple[str, ...] = ()
    generation: int | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def surge(self) -> bool:
        """Started above its role's replicas while the role rolls (`rollout.maxSurge`)."""
        return LABEL_SURGE in self.labels

    @classmethod
    def from_manifest(cls, obj: Mapping[str, Any]) -> ObservedInstance:
        meta = obj.get("metadata") or {}
        return cls(
            annotations=dict(meta.get("annotations") or {}),
            labels=dict(meta.get("labels") or {}),
            generation=meta.get("generation"),
            status=dict(obj.get("status") or {}),
            name=meta["name"],
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            spec=HybridServingInstanceSpec.model_validate(obj.get("spec") or {}, context=FROM_CLUSTER),
            phase=(obj.get("status") or {}).get("phase"),
            deleting=bool(meta.get("deletionTimestamp")),
            owner_uids=tuple(ref.get("uid", "") for ref in meta.get("ownerReferences") or []),
        )


@dataclass
class Observed:
    """Everything of one HybridServing the operator found in the cluster."""

    instances: dict[str, ObservedInstance] = field(default_factory=dict)
    pods: dict[str, ObservedPod] = field(default_factory=dict)
    # Every other owned object as read, keyed by (kind, name).
    objects: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    now: float | None = None  # when it was read (seconds since the epoch); None: times are not compared

    @classmethod
    def from_manifests(
        cls,
        instances: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
        objects: Iterable[Mapping[str, Any]] = (),
        now: float | None = None,
    ) -> Observed:
        obs = cls(now=now)
        for obj in instances:
            inst = ObservedInstance.from_manifest(obj)
            obs.instances[inst.name] = inst
        for obj in pods:
            pod = ObservedPod.from_manifest(obj, now)
            obs.pods[pod.name] = pod
        for obj in objects:
            obs.objects[(obj["kind"], obj["metadata"]["name"])] = dict(obj)
        return obs

    def pods_of(self, instance: str) -> list[ObservedPod]:
        return sorted((p for p in self.pods.values() if p.instance == instance), key=lambda p: p.rank)
