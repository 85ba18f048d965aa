"""The object plan: what a HybridServing should own, and the next safe step towards it.

Two pure functions carry the operator's decisions, so that a whole rollout can be simulated
and checked step by step without a cluster (LWS's planner does the same):

* `plan(hs, observed)` computes the full desired object set: per-role engine ConfigMaps, one
  HybridServingInstance per engine instance, per instance a headless Service and its pods,
  the router with its RBAC, a PodDisruptionBudget per role.
* `diff(desired, observed)` turns the difference into the actions of *this* step: create,
  patch or delete, each with its reason, holding voluntary disruption to
  `rollout.maxUnavailable` instances per role and to one role at a time.

The controller is stateless: every fact it needs to resume after a restart is written on
the objects themselves. An instance's `spec.configHash` says what its pods should run; the
planner moves it to the new hash only when it decides to roll that instance, so the set of
instances already rolled is observable. The hash has two halves, the pod template (which
never contains the role) and the role's engine flags, so a role switch changes the flags
half in place and pods are relabelled, never recreated.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridserving.contract import (
    ANNOTATION_ROLE,
    CONFIG_DIR,
    ENGINE_COMMAND,
    ENV_CONFIG_DIR,
    ENV_DRAIN_TIMEOUT_S,
    ENV_LAUNCHER_PORT,
    ENV_NODE_RANK,
    ENV_ROLE_FILE,
    LABEL_ROLE,
    PODINFO_DIR,
    ROLE_FILE,
    placeholder_env,
)
from hybridserving.api.instance import HybridServingInstanceSpec, InstancePorts
from hybridserving.api.v1alpha1 import (
    GROUP,
    INSTANCE_KIND,
    KIND,
    ROLES,
    VERSION,
    HybridServing,
    HybridServingSpec,
    Role,
)
from hybridserving.core import flags, gang, podtemplate, ports, privileges, resolution, router, weights
from hybridserving.core.switching import ANNOTATION_SWITCH, SwitchState

API_VERSION = f"{GROUP}/{VERSION}"

# Labels: `name`, `instance`, `node-rank`, `leader` and `component` never change for an
# object's life. `role` sits on leaders only, because the router adds every pod matching its
# selector as a worker and only the leader serves HTTP; it is dropped while the instance
# drains for a switch so the router stops sending it work. `instance-role` is on every pod of
# an instance (PodDisruptionBudgets count whole gangs).
LABEL_NAME = "hybridserving.io/name"
LABEL_INSTANCE = "hybridserving.io/instance"
LABEL_NODE_RANK = "hybridserving.io/node-rank"
LABEL_LEADER = "hybridserving.io/leader"
LABEL_INSTANCE_ROLE = "hybridserving.io/instance-role"
LABEL_COMPONENT = "hybridserving.io/component"
# app.kubernetes.io/name of what each component runs.
APP_NAMES = {"engine": "sglang", "router": "smg"}

# The role annotation is what the engine launcher reads (downward API file); the hashes and
# the restart generation say which configuration and which gang a pod belongs to.
ANNOTATION_TEMPLATE_HASH = "hybridserving.io/template-hash"
ANNOTATION_CONFIG_HASH = "hybridserving.io/config-hash"
ANNOTATION_RESTART_GENERATION = "hybridserving.io/restart-generation"
ANNOTATION_SPEC_HASH = "hybridserving.io/spec-hash"
# Read by the router (hard-coded key in smg) for prefill workers' bootstrap servers, and
# the per-pod serving port when instances on the host network use distinct ports.
ANNOTATION_BOOTSTRAP_PORT = "sglang.ai/bootstrap-port"
ANNOTATION_WORKER_PORTS = "smg.ai/worker-ports"

ENGINE_CONTAINER = "engine"
ROUTER_METRICS_PORT = 29000
# Phases the role-switch controller writes while it moves an instance: the router must not
# send the instance new work meanwhile.
SWITCH_PHASES = frozenset({"Draining", "Switching", "Relaunching"})
# Extra grace after the drain timeout, for the engine to exit once drained.
EXIT_GRACE_SECONDS = 30

HALF_HASH = 10

Verb = Literal["create", "patch", "delete"]
ObjectKey = tuple[str, str]  # (kind, name)


# --------------------------------------------------------------------------- observed state


def describe_termination(terminated: Mapping[str, Any]) -> str:
    """A container's last exit as people read it: exit code, reason, and the termination message."""
    text = f"exit code {terminated.get('exitCode')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    message = (terminated.get("message") or "").strip()
    if message:
        text += f": {message.splitlines()[-1][:300]}"
    return text


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
    last_exit: str | None = None
    unschedulable: str | None = None
    host_ports: tuple[int, ...] = ()
    owner_uids: tuple[str, ...] = ()
    weights_fill: tuple[str, str] | None = None  # the node-cache fill step: (state, detail)

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
        try:
            return int(self.annotations.get(ANNOTATION_RESTART_GENERATION, "0"))
        except ValueError:
            return 0

    @property
    def started(self) -> bool:
        """Whether the engine ran: from then on a lost peer breaks the gang's collectives."""
        return self.phase in ("Running", "Succeeded", "Failed")

    @classmethod
    def from_manifest(cls, obj: Mapping[str, Any]) -> ObservedPod:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ready = (conditions.get("Ready") or {}).get("status") == "True"
        scheduled = conditions.get("PodScheduled") or {}
        unschedulable = None
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            unschedulable = scheduled.get("message") or "unschedulable"
        containers = status.get("containerStatuses") or []
        restarts = sum(int(cs.get("restartCount") or 0) for cs in containers)
        crash_looping = any(((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
                            for cs in containers)
        last_exit = next((describe_termination(t) for cs in containers
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
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            phase=status.get("phase") or "Pending",
            ready=ready,
            node_name=spec.get("nodeName"),
            deleting=bool(meta.get("deletionTimestamp")),
            restarts=restarts,
            crash_looping=crash_looping,
            last_exit=last_exit,
            unschedulable=unschedulable,
            host_ports=host_ports,
            owner_uids=tuple(ref.get("uid", "") for ref in meta.get("ownerReferences") or []),
            weights_fill=weights.fill_outcome(obj),
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

    @classmethod
    def from_manifest(cls, obj: Mapping[str, Any]) -> ObservedInstance:
        meta = obj.get("metadata") or {}
        return cls(
            annotations=dict(meta.get("annotations") or {}),
            generation=meta.get("generation"),
            status=dict(obj.get("status") or {}),
            name=meta["name"],
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            spec=HybridServingInstanceSpec.model_validate(obj.get("spec") or {}),
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

    @classmethod
    def from_manifests(
        cls,
        instances: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
        objects: Iterable[Mapping[str, Any]] = (),
    ) -> Observed:
        obs = cls()
        for obj in instances:
            inst = ObservedInstance.from_manifest(obj)
            obs.instances[inst.name] = inst
        for obj in pods:
            pod = ObservedPod.from_manifest(obj)
            obs.pods[pod.name] = pod
        for obj in objects:
            obs.objects[(obj["kind"], obj["metadata"]["name"])] = dict(obj)
        return obs

    def pods_of(self, instance: str) -> list[ObservedPod]:
        return sorted((p for p in self.pods.values() if p.instance == instance), key=lambda p: p.rank)


# --------------------------------------------------------------------------- desired state


@dataclass
class InstancePlan:
    """One engine instance as it should be, and the objects it should own."""

    name: str
    index: int
    role: Role
    nodes: int
    ports: InstancePorts
    template_hash: str
    config_hash: str  # the target: template half + role-flags half
    manifest: dict[str, Any]
    pods: list[dict[str, Any]]  # empty until the instance exists (pods need its uid as owner)
    service: dict[str, Any] | None
    workload: dict[str, Any] | None = None  # gang admission (core.gang), owned by the instance


@dataclass
class DesiredState:
    """The full object set of one HybridServing."""

    name: str
    namespace: str
    uid: str
    spec: HybridServingSpec
    spec_hash: str
    role_config_hashes: dict[Role, str]
    instances: dict[str, InstancePlan]
    objects: dict[ObjectKey, dict[str, Any]]

    @property
    def max_unavailable(self) -> int:
        return self.spec.rollout.max_unavailable

    @property
    def paused(self) -> bool:
        return self.spec.rollout.paused


@dataclass(frozen=True)
class Action:
    """One API write and why."""

    verb: Verb
    kind: str
    name: str
    reason: str
    body: dict[str, Any] | None = None
    # Preconditions: the delete applies to this uid only; a patch to this resourceVersion only.
    uid: str | None = None
    resource_version: str | None = None

    def __str__(self) -> str:
        return f"{self.verb} {self.kind}/{self.name}: {self.reason}"


# --------------------------------------------------------------------------- names and hashes


def instance_name(hs: str, index: int) -> str:
    """`<hs>-<index>`: no role in it, so the name survives switches."""
    return f"{hs}-{index}"


def pod_name(instance: str, rank: int) -> str:
    return f"{instance}-{rank}"


def config_map_name(hs: str, role: Role) -> str:
    return f"{hs}-{role}-config"


def applied_spec_name(hs: str) -> str:
    return f"{hs}-applied"


def router_name(hs: str) -> str:
    return f"{hs}-router"


def pdb_name(hs: str, role: Role) -> str:
    return f"{hs}-{role}"


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def selectable(name: str) -> bool:
    """Whether a fleet's children can be found by its name: a label value (at most 63 characters).

    The apiserver accepts object names of up to 253 characters; the API model refuses such a
    HybridServing (`metadata.name`), but only once read, and listing its children by a label
    selector the apiserver refuses must not come first.
    """
    return len(name) <= 63 and bool(_LABEL_VALUE.match(name))


def digest(value: Any, length: int = HALF_HASH) -> str:
    """A short, stable hex digest of a JSON-able value (lowercase, valid as a label value)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def split_config_hash(value: str) -> tuple[str, str]:
    """(template half, role-flags half) of an instance's configHash."""
    return value[:HALF_HASH], value[HALF_HASH:]


def role_config(spec: HybridServingSpec, role: Role) -> dict[str, Any]:
    """The document the engine launcher reads for `role`: `{"nnodes": N, "argv": [...]}`.

    The argv is `flags.render_template`: SGLang's flags with whole-token placeholders
    (`flags.PLACEHOLDERS`) for what differs per instance and per pod, which the launcher
    fills from the pod's environment (`HYBRIDSERVING_<PLACEHOLDER>`). One document per role
    means a layout change of one role changes that role's hash only, so only its instances
    roll; the role itself stays out of the pod template.
    """
    config: dict[str, Any] = {"nnodes": spec.role(role).nodes_per_instance, "argv": flags.render_template(spec, role)}
    if role == "decode" and flags.in_place_role_switch(spec):
        # A prefill-born engine has no decode CUDA graphs; SGLang switches it to decode only when
        # told how much memory to capture them in (disaggregation/role_switch.py:79-89).
        resolved = resolution.resolve(spec, "decode")
        config["decode_cuda_graph_memory_gb"] = resolution.decode_cuda_graph_memory_gb(
            resolved.decode_cuda_graph_max_bs, spec.decode.layout.attn_dp)
    return config


# --------------------------------------------------------------------------- roles and indexes


def assign_instances(hs_name: str, spec: HybridServingSpec, observed: Observed) -> dict[str, tuple[int, Role]]:
    """Which instances should exist, by name, with their index and role.

    Existing instances keep their role: after a switch the instance's `spec.role` is the
    truth (an edit made outside a switch is not, until it becomes one: `held_role`). With role switching on, the controller owns the mix and the spec only sizes the
    fleet: a new instance joins the role furthest below its replicas, a removed one leaves
    the role furthest above. With role switching off, each role has exactly its replicas.
    Surplus instances go highest index first; new ones take the lowest free index (an
    instance still being deleted keeps its index until it is gone).
    """
    live = sorted((i for i in observed.instances.values() if not i.deleting), key=lambda i: i.spec.index)
    target = {role: spec.role(role).replicas for role in ROLES}
    keep = [(i.spec.index, held_role(i, observed) or i.spec.role, i.name) for i in live]
    if spec.role_switch.enabled:
        while len(keep) > sum(target.values()):
            counts = {r: sum(1 for k in keep if k[1] == r) for r in ROLES}
            role = max(ROLES, key=lambda r: (counts[r] - target[r], r == "decode"))
            keep.remove(max((k for k in keep if k[1] == role), key=lambda k: k[0]))
    else:
        keep = sorted(k for role in ROLES for k in [k for k in keep if k[1] == role][: target[role]])
    result = {name: (index, role) for index, role, name in keep}
    counts = {r: sum(1 for k in keep if k[1] == r) for r in ROLES}
    taken = {i.spec.index for i in observed.instances.values()}
    free = (index for index in range(1 << 20) if index not in taken)

    def add(role: Role) -> None:
        index = next(free)
        result[instance_name(hs_name, index)] = (index, role)
        counts[role] += 1

    if spec.role_switch.enabled:
        for _ in range(sum(target.values()) - len(keep)):
            add(max(ROLES, key=lambda r: (target[r] - counts[r], r == "prefill")))
    else:
        for role in ROLES:
            while counts[role] < target[role]:
                add(role)
    return result


# --------------------------------------------------------------------------- plan


def plan(hs: HybridServing, observed: Observed, access: EngineAccess | None = None) -> DesiredState:
    """The full desired object set of `hs`, given what exists (roles, ports, uids).

    `access` says who besides the fleet may reach its engines (the operator's namespace).
    """
    access = access or EngineAccess()
    spec = hs.spec
    name, namespace = hs.metadata.name, hs.metadata.namespace
    uid = hs.metadata.uid or ""
    owner = owner_reference(API_VERSION, KIND, name, uid)
    configs = {role: role_config(spec, role) for role in ROLES}
    role_hashes = {role: digest(configs[role]) for role in ROLES}
    spec_hash = digest(spec.to_wire())

    assigned = assign_instances(name, spec, observed)
    order = sorted(assigned, key=lambda n: assigned[n][0])
    held = {n: observed.instances[n].spec.ports for n in order if n in observed.instances}
    leaving = [i.spec.ports for n, i in observed.instances.items() if n not in assigned]
    allocated = ports.allocate(
        order, held, host_network=spec.network.host_network, bootstrap_base=spec.transfer.bootstrap_port,
        reserved=leaving,
    )

    instances: dict[str, InstancePlan] = {}
    for inst_name in order:
        index, role = assigned[inst_name]
        existing = observed.instances.get(inst_name)
        instances[inst_name] = _plan_instance(
            hs, inst_name, index, role, allocated[inst_name], role_hashes, existing, owner
        )

    objects: dict[ObjectKey, dict[str, Any]] = {}

    def add(obj: dict[str, Any]) -> None:
        objects[(obj["kind"], obj["metadata"]["name"])] = obj

    for role in ROLES:
        add(_config_map(hs, role, configs[role], role_hashes[role], owner))
        add(_pdb(hs, role, sum(1 for i in instances.values() if i.role == role), owner))
    add(_applied_spec(hs, spec_hash, owner))
    add(_network_policy(hs, access, owner))
    if spec.router.enabled:
        for obj in _router_objects(hs, instances, owner):
            add(obj)
    return DesiredState(
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        spec_hash=spec_hash,
        role_config_hashes=role_hashes,
        instances=instances,
        objects=objects,
    )


def held_role(existing: ObservedInstance | None, observed: Observed) -> Role | None:
    """The role an instance's pods keep while its `spec.role` changed outside a switch, or None.

    Only the role-switch controller moves an instance between roles, recording each switch
    on the instance (`core.switching.ANNOTATION_SWITCH`) so that it unroutes and drains the engine
    before the pods follow. A `spec.role` edited by hand carries no such record: following it
    at once would relabel a serving engine under live traffic. The pods keep their role
    until the controller has turned the edit into a switch (controller/switching.py).
    """
    if existing is None or SwitchState.from_annotation(existing.annotations.get(ANNOTATION_SWITCH)) is not None:
        return None
    roles = {p.annotations.get(ANNOTATION_ROLE) for p in observed.pods_of(existing.name) if not p.deleting}
    if len(roles) != 1:
        return None
    role = roles.pop()
    if role in ROLES and role != existing.spec.role:
        return role  # type: ignore[return-value]
    return None


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def standard_labels(hs: str, component: str) -> dict[str, str]:
    """Kubernetes' recommended labels (app.kubernetes.io/*), so that generic tools (dashboards,
    cost reports, `kubectl get -l`) group a fleet's objects; the selectors keep using ours."""
    return {
        "app.kubernetes.io/name": APP_NAMES.get(component, "hybridserving"),
        "app.kubernetes.io/instance": hs,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "hybridserving",
        "app.kubernetes.io/managed-by": "hybridserving-operator",
    }


def _meta(hs: HybridServing, name: str, owner: dict[str, Any], component: str, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": hs.metadata.namespace,
        "labels": {**standard_labels(hs.metadata.name, component), LABEL_NAME: hs.metadata.name,
                   LABEL_COMPONENT: component, **labels},
        "ownerReferences": [owner],
    }


def _plan_instance(
    hs: HybridServing,
    name: str,
    index: int,
    role: Role,
    inst_ports: InstancePorts,
    role_hashes: Mapping[Role, str],
    existing: ObservedInstance | None,
    owner: dict[str, Any],
) -> InstancePlan:
    spec = hs.spec
    nodes = spec.role(role).nodes_per_instance
    restart_generation = existing.spec.restart_generation if existing else 0
    # The template is rendered once without hashes to hash it, then stamped.
    bare = [_pod_spec(hs, name, rank, role, inst_ports) for rank in range(nodes)]
    extra_labels, extra_annotations = _pod_extra_metadata(spec, name, role, nodes)
    template_hash = digest([bare, extra_labels, extra_annotations] if extra_labels or extra_annotations else bare)
    config_hash = template_hash + role_hashes[role]
    manifest = {
        "apiVersion": API_VERSION,
        "kind": INSTANCE_KIND,
        "metadata": _meta(hs, name, owner, "engine", **{LABEL_INSTANCE: name}),
        "spec": HybridServingInstanceSpec(
            role=role,
            index=index,
            nodes=nodes,
            config_hash=config_hash,
            ports=inst_ports,
            restart_generation=restart_generation,
        ).to_wire(),
    }
    pods: list[dict[str, Any]] = []
    service = None
    workload = None
    if existing is not None and existing.uid:
        inst_owner = owner_reference(API_VERSION, INSTANCE_KIND, name, existing.uid)
        routable = existing.phase not in SWITCH_PHASES
        for rank in range(nodes):
            labels = {**extra_labels, **pod_labels(hs.metadata.name, name, rank, role, routable)}
            annotations = {
                **extra_annotations,
                ANNOTATION_ROLE: role,
                ANNOTATION_TEMPLATE_HASH: template_hash,
                ANNOTATION_CONFIG_HASH: config_hash,
                ANNOTATION_RESTART_GENERATION: str(restart_generation),
            }
            if rank == 0:
                annotations[ANNOTATION_BOOTSTRAP_PORT] = str(inst_ports.bootstrap)
                if spec.network.host_network:
                    annotations[ANNOTATION_WORKER_PORTS] = str(inst_ports.http)
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name(name, rank),
                        "namespace": hs.metadata.namespace,
                        "labels": labels,
                        "annotations": annotations,
                        "ownerReferences": [inst_owner],
                    },
                    "spec": bare[rank],
                }
            )
        service = _instance_service(hs, name, inst_ports, inst_owner)
        if gang.uses_workload(spec):
            workload = gang.workload(name, hs.metadata.namespace, nodes,
                                     _meta(hs, name, inst_owner, "engine", **{LABEL_INSTANCE: name}))
    return InstancePlan(
        name=name,
        index=index,
        role=role,
        nodes=nodes,
        ports=inst_ports,
        template_hash=template_hash,
        config_hash=config_hash,
        manifest=manifest,
        pods=pods,
        service=service,
        workload=workload,
    )


def _pod_extra_metadata(spec: HybridServingSpec, instance: str, role: Role, nodes: int) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations from the pod templates and the gang, under the operator's own."""
    labels, annotations = podtemplate.metadata(spec, role)
    gang_labels, gang_annotations = gang.pod_metadata(spec, instance, nodes)
    return {**labels, **gang_labels}, {**annotations, **gang_annotations}


def pod_labels(hs: str, instance: str, rank: int, role: Role, routable: bool) -> dict[str, str]:
    """Labels of one pod; the router's `role` label only on a leader that may take work."""
    labels = {
        **standard_labels(hs, "engine"),
        LABEL_NAME: hs,
        LABEL_COMPONENT: "engine",
        LABEL_INSTANCE: instance,
        LABEL_NODE_RANK: str(rank),
        LABEL_LEADER: "true" if rank == 0 else "false",
        LABEL_INSTANCE_ROLE: role,
    }
    if rank == 0 and routable:
        labels[LABEL_ROLE] = role
    return labels


def _pod_spec(hs: HybridServing, instance: str, rank: int, role: Role, p: InstancePorts) -> dict[str, Any]:
    """The pod spec of one rank. It never contains the role: a switch must not recreate pods."""
    spec = hs.spec
    ns = hs.metadata.namespace
    host_network = spec.network.host_network
    leader = rank == 0
    gpu = spec.role(role).gpus_per_pod
    limits: dict[str, str] = {spec.hardware.gpu_resource_name: str(gpu)}
    if spec.transfer.rdma_resource_count > 0 and spec.transfer.rdma_resource_name:
        limits[spec.transfer.rdma_resource_name] = str(spec.transfer.rdma_resource_count)
    env = [
        {"name": ENV_CONFIG_DIR, "value": CONFIG_DIR},
        {"name": ENV_ROLE_FILE, "value": ROLE_FILE},
        {"name": ENV_NODE_RANK, "value": str(rank)},
        {"name": ENV_DRAIN_TIMEOUT_S, "value": str(spec.role_switch.drain_timeout_seconds)},
        {"name": placeholder_env("port"), "value": str(p.http)},
        {"name": placeholder_env("bootstrap_port"), "value": str(p.bootstrap)},
        {"name": placeholder_env("engine_info_bootstrap_port"), "value": str(p.engine_info_bootstrap)},
        {"name": ENV_LAUNCHER_PORT, "value": str(p.launcher)},
        {"name": placeholder_env("dist_init_addr"), "value": f"{instance}.{ns}.svc:{p.dist_init}"},
        # Forward-pass timing, which the role-switch policy reads, is off by default
        # (environ.py:479; managers/scheduler_components/metrics_reporter.py:325-341).
        {"name": "SGLANG_ENABLE_METRICS_DEVICE_TIMER", "value": "1"},
        *(e.to_pod() for e in spec.engine.env),
    ]
    pod_weights = weights.render(spec)
    env += pod_weights.env
    container_ports = []
    for port_name, number in (
        ("http", p.http),
        ("bootstrap", p.bootstrap),
        ("dist-init", p.dist_init),
        ("engine-info", p.engine_info_bootstrap),
        ("launcher", p.launcher),
    ):
        entry: dict[str, Any] = {"name": port_name, "containerPort": number, "protocol": "TCP"}
        if host_network:
            entry["hostPort"] = number
        container_ports.append(entry)
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        # The launcher's last log line (a crash loop's last exit) becomes the termination message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "image": spec.engine.image,
        "command": list(ENGINE_COMMAND),
        "env": env,
        "ports": container_ports,
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            *pod_weights.mounts,
        ],
    }
    if spec.engine.env_from:
        container["envFrom"] = [source.to_wire() for source in spec.engine.env_from]
    ipc_lock = privileges.needs_ipc_lock(spec)
    container["securityContext"] = _container_security(("IPC_LOCK",) if ipc_lock else ())
    if not ipc_lock and not any(e.name == "HOME" for e in spec.engine.env):
        env.append({"name": "HOME", "value": "/tmp"})  # the non-root user has no home of its own
    if leader:
        # /ready reads the engine's status (managers/tokenizer_manager.py:728-734); /health would run
        # a generation answered after a second at the earliest (entrypoints/http_server.py:720-797).
        container["readinessProbe"] = {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        }
    # Liveness is the launcher's, which supervises the engine (restarts it when it exits) and
    # answers whatever the engine is busy with; an engine probe would restart busy engines.
    container["livenessProbe"] = {
        "httpGet": {"path": "/healthz", "port": "launcher"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            {
                "name": "config",
                "projected": {
                    "sources": [
                        {"configMap": {"name": config_map_name(hs.metadata.name, r)}} for r in ROLES
                    ]
                },
            },
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {"path": "role", "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_ROLE}']"}}
                    ]
                },
            },
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            *pod_weights.volumes,
        ],
        "affinity": _affinity(hs, instance, leader),
        "terminationGracePeriodSeconds": spec.role_switch.drain_timeout_seconds + EXIT_GRACE_SECONDS,
        "enableServiceLinks": False,
        # Engines never call the API: no token to steal from an engine pod.
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(run_as_root=ipc_lock),
        "restartPolicy": "Always",
    }
    if host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if leader and spec.network.spread_across_racks:
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": spec.network.rack_key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {LABEL_NAME: hs.metadata.name, LABEL_LEADER: "true"}},
            }
        ]
    if pod_weights.init_containers:
        pod["initContainers"] = pod_weights.init_containers
    pod.update(gang.pod_spec_fields(spec, instance, spec.role(role).nodes_per_instance))
    return podtemplate.apply_spec(pod, spec, role)


# The unprivileged user engine and router containers run as (the operator image's user too).
NON_ROOT_UID = 65532


def _pod_security(*, run_as_root: bool = False) -> dict[str, Any]:
    """Pod Security "restricted" at pod level; `run_as_root` where a capability must take effect.

    Capabilities added for a non-root user are not effective (no ambient capabilities in
    Kubernetes), so an engine that pins memory for RDMA (IPC_LOCK) keeps its image's user.
    """
    security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if not run_as_root:
        security.update(runAsNonRoot=True, runAsUser=NON_ROOT_UID, runAsGroup=NON_ROOT_UID, fsGroup=NON_ROOT_UID)
    return security


def _container_security(add: tuple[str, ...] = ()) -> dict[str, Any]:
    """No privilege escalation and no capability but those the operator was allowed to grant."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": capabilities}


def _affinity(hs: HybridServing, instance: str, leader: bool) -> dict[str, Any]:
    """Leaders pick the RDMA fabric, workers follow their leader into its NVLink domain.

    The scheduler lets a pod that matches its own required affinity term go anywhere when no
    pod matches yet, but only when *no* term has a match; a pod carrying both terms would
    be stuck as the first pod of its instance once the fleet has pods. So the leader carries
    the fabric term (any pod of the fleet; the first leader matches itself), and the workers
    carry the NVLink term on their leader only (they never match it themselves, so they wait
    for the leader to be placed instead of choosing a domain on their own).
    """
    net = hs.spec.network
    if leader:
        term = {
            "labelSelector": {"matchLabels": {LABEL_NAME: hs.metadata.name, LABEL_COMPONENT: "engine"}},
            "topologyKey": net.rdma_fabric_key,
        }
    else:
        term = {
            "labelSelector": {"matchLabels": {LABEL_INSTANCE: instance, LABEL_LEADER: "true"}},
            "topologyKey": net.nvlink_domain_key,
        }
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _instance_service(hs: HybridServing, instance: str, p: InstancePorts, owner: dict[str, Any]) -> dict[str, Any]:
    """Headless, resolving to the leader before it is ready: ranks rendezvous through it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(hs, instance, owner, "engine", **{LABEL_INSTANCE: instance}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_INSTANCE: instance, LABEL_LEADER: "true"},
            "ports": [
                {"name": "dist-init", "port": p.dist_init, "targetPort": p.dist_init, "protocol": "TCP"},
                {"name": "http", "port": p.http, "targetPort": p.http, "protocol": "TCP"},
            ],
        },
    }


def _config_map(hs: HybridServing, role: Role, config: dict[str, Any], config_hash: str, owner: dict[str, Any]) -> dict[str, Any]:
    meta = _meta(hs, config_map_name(hs.metadata.name, role), owner, "config")
    meta["annotations"] = {ANNOTATION_CONFIG_HASH: config_hash}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {f"{role}.json": json.dumps(config, indent=1, sort_keys=True)},
    }


def _applied_spec(hs: HybridServing, spec_hash: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The last valid spec, so an invalid edit leaves the fleet on what it already runs."""
    meta = _meta(hs, applied_spec_name(hs.metadata.name), owner, "config")
    meta["annotations"] = {ANNOTATION_SPEC_HASH: spec_hash}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"spec.json": json.dumps(hs.spec.to_wire(), sort_keys=True)},
    }


def _pdb(hs: HybridServing, role: Role, instances: int, owner: dict[str, Any]) -> dict[str, Any]:
    """Evictions (node drains) take down at most the rollout budget of a role, counted in pods.

    An integer `minAvailable` is the one PDB shape the disruption controller can evaluate
    for pods whose controller (the instance) has no scale subresource: `maxUnavailable` and
    percentages make it look the controller's scale up, fail, and allow no disruption at
    all, which blocks every node drain. Pods that are not ready may always be evicted
    (`AlwaysAllow`): they serve nothing, and a broken gang must not pin a node.
    """
    nodes = hs.spec.role(role).nodes_per_instance
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(hs, pdb_name(hs.metadata.name, role), owner, "engine"),
        "spec": {
            "minAvailable": max(0, instances - hs.spec.rollout.max_unavailable) * nodes,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {
                "matchLabels": {
                    LABEL_NAME: hs.metadata.name,
                    LABEL_COMPONENT: "engine",
                    LABEL_INSTANCE_ROLE: role,
                }
            },
        },
    }


@dataclass(frozen=True)
class EngineAccess:
    """Who outside the fleet may reach its engines: the operator's pods, in their namespace.

    The operator calls engines and launchers during role switches. Without a namespace (an
    operator running outside the cluster) no operator peer is rendered: it is no pod.
    """

    operator_namespace: str | None = None
    operator_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/part-of": "hybridserving", "app.kubernetes.io/component": "operator"}
    )


def network_policy_name(hs: str) -> str:
    return f"{hs}-engines"


def _network_policy(hs: HybridServing, access: EngineAccess, owner: dict[str, Any]) -> dict[str, Any]:
    """Only the fleet's own ranks, its router and the operator may reach engine ports.

    Engines serve control endpoints without authentication (`/pd_role_switch`,
    `/pause_generation`, `/abort_request`), so reachability is the access control: ranks of
    the fleet talk to each other on any port (collectives pick their own), the router on the
    HTTP port, the operator on the HTTP and launcher ports. Ports are named, so the policy
    follows per-instance ports on the host network. Enforcement needs a CNI that implements
    NetworkPolicy, and host-network pods are outside any policy (docs/security.md).
    """
    name = hs.metadata.name
    peers: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": {LABEL_NAME: name, LABEL_COMPONENT: "engine"}}}]},
        {
            "from": [{"podSelector": {"matchLabels": {LABEL_NAME: name, LABEL_COMPONENT: "router"}}}],
            "ports": [{"protocol": "TCP", "port": "http"}],
        },
    ]
    if access.operator_namespace:
        peers.append({
            "from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": access.operator_namespace}},
                "podSelector": {"matchLabels": dict(access.operator_labels)},
            }],
            "ports": [{"protocol": "TCP", "port": "http"}, {"protocol": "TCP", "port": "launcher"}],
        })
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(hs, network_policy_name(name), owner, "engine"),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_NAME: name, LABEL_COMPONENT: "engine"}},
            "policyTypes": ["Ingress"],
            "ingress": peers,
        },
    }


def router_argv(hs: HybridServing, instances: Mapping[str, InstancePlan]) -> list[str]:
    """`smg launch` in PD mode, discovering leaders by the role label in the fleet's namespace."""
    spec = hs.spec
    name = hs.metadata.name
    http_port = min((i.ports.http for i in instances.values()), default=ports.HTTP_BASE)
    return [
        "launch",
        "--host", "0.0.0.0",
        "--port", str(spec.router.port),
        "--pd-disaggregation",
        "--service-discovery",
        "--prefill-selector", f"{LABEL_NAME}={name}", f"{LABEL_ROLE}=prefill",
        "--decode-selector", f"{LABEL_NAME}={name}", f"{LABEL_ROLE}=decode",
        "--service-discovery-port", str(http_port),
        "--service-discovery-namespace", hs.metadata.namespace,
        "--prefill-policy", spec.router.prefill_policy,
        "--decode-policy", spec.router.decode_policy,
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(ROUTER_METRICS_PORT),
    ]


def _router_objects(hs: HybridServing, instances: Mapping[str, InstancePlan], owner: dict[str, Any]) -> list[dict[str, Any]]:
    spec = hs.spec
    name = router_name(hs.metadata.name)
    selector = {LABEL_NAME: hs.metadata.name, LABEL_COMPONENT: "router"}
    meta = lambda: _meta(hs, name, owner, "router")  # noqa: E731
    budget = router.disruption_budget(spec.router, meta(), selector)
    return [*([budget] if budget else []),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(),
            # Service discovery lists and watches the fleet's pods; nothing else (no get by name,
            # no writes, no other kind).
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": hs.metadata.namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(),
            "spec": {
                "replicas": spec.router.replicas,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": {**standard_labels(hs.metadata.name, "router"), **selector}},
                    "spec": {
                        "serviceAccountName": name,
                        "securityContext": _pod_security(),
                        "containers": [
                            {
                                "name": "router",
                                "image": spec.router.image,
                                "command": ["smg"],
                                "args": router_argv(hs, instances),
                                "ports": [
                                    {"name": "http", "containerPort": spec.router.port, "protocol": "TCP"},
                                    {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
                                ],
                                "securityContext": _container_security(),
                                **router.container_fields(spec.router),
                            }
                        ],
                        **router.pod_fields(spec.router, selector),
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(),
            "spec": {
                "selector": selector,
                "ports": [
                    {"name": "http", "port": spec.router.port, "targetPort": spec.router.port, "protocol": "TCP"},
                    {"name": router.METRICS_PORT_NAME, "port": ROUTER_METRICS_PORT, "targetPort": ROUTER_METRICS_PORT,
                     "protocol": "TCP"},
                ],
            },
        },
    ]


# --------------------------------------------------------------------------- instance health


InstanceState = Literal["Ready", "Starting", "Pending", "Failed", "Missing"]


@dataclass(frozen=True)
class InstanceView:
    """An existing instance read against its plan: is it serving, current, broken?"""

    plan: InstancePlan
    observed: ObservedInstance
    pods: list[ObservedPod]

    @property
    def by_rank(self) -> dict[int, ObservedPod]:
        return {p.rank: p for p in self.pods}

    def pod_outdated(self, pod: ObservedPod) -> bool:
        """Whether a pod runs another configuration or gang than its instance's spec says.

        A pod whose role differs from the instance's is being switched, not outdated: only
        its template half must match (the role-flags half follows the switch).
        """
        inst = self.observed.spec
        if pod.restart_generation < inst.restart_generation:
            return True
        pod_hash = pod.annotations.get(ANNOTATION_CONFIG_HASH, "")
        if pod.annotations.get(ANNOTATION_ROLE) != inst.role:
            return split_config_hash(pod_hash)[0] != split_config_hash(inst.config_hash)[0]
        return pod_hash != inst.config_hash

    @property
    def available(self) -> bool:
        pods = self.by_rank
        return all(
            (p := pods.get(rank)) is not None
            and not p.deleting
            and not self.pod_outdated(p)
            and p.phase == "Running"
            and p.ready
            for rank in range(self.observed.spec.nodes)
        )

    @property
    def switching(self) -> bool:
        """Whether the instance's role changed and its pods have not followed yet."""
        return any(p.annotations.get(ANNOTATION_ROLE) != self.observed.spec.role for p in self.pods)

    @property
    def current(self) -> bool:
        """Whether the instance's spec says what the plan says (pods may still be catching up).

        While a switch is being adopted only the template half counts: the flags half follows
        the role in place, it is no reason to roll.
        """
        inst = self.observed.spec
        if self.switching:
            same = split_config_hash(inst.config_hash)[0] == self.plan.template_hash
        else:
            same = inst.config_hash == self.plan.config_hash
        return same and inst.ports == self.plan.ports and inst.nodes == self.plan.nodes

    def failure(self) -> str | None:
        """Why the gang must restart whole, or None: a pod failed, exited, restarted, or went missing after start.

        Pods of an older configuration or gang are ignored: they are being replaced anyway.
        A multi-node gang whose pods have not started yet is completed, not restarted (the
        operator may have stopped half-way through creating it).
        """
        nodes = self.observed.spec.nodes
        pods = [p for p in self.pods if not self.pod_outdated(p)]
        for p in pods:
            if p.phase in ("Failed", "Succeeded") and not p.deleting:
                return f"pod {p.name} {p.phase.lower()}"
        if nodes > 1:
            for p in pods:
                if p.restarts > 0 and not p.deleting:
                    return f"pod {p.name} restarted its engine ({p.restarts}x): the gang's collectives broke"
        present = {p.rank for p in pods if not p.deleting}
        lost = sorted(set(range(nodes)) - present)
        if lost and any(p.started for p in pods if not p.deleting):
            return f"rank(s) {', '.join(map(str, lost))} lost while the rest of the gang ran"
        return None

    @property
    def state(self) -> InstanceState:
        if self.available:
            return "Ready"
        if self.failure():
            return "Failed"
        if any(p.unschedulable for p in self.pods):
            return "Pending"
        if not self.pods:
            return "Missing"
        return "Starting"

    @property
    def recovering(self) -> bool:
        """Down because its pods are being replaced or are starting (not stuck unschedulable)."""
        return not self.available and self.state in ("Starting", "Missing", "Failed")


def view(desired: DesiredState, observed: Observed) -> dict[str, InstanceView]:
    """Existing, planned instances read against their plans."""
    return {
        name: InstanceView(p, observed.instances[name], observed.pods_of(name))
        for name, p in desired.instances.items()
        if name in observed.instances and not observed.instances[name].deleting
    }


# --------------------------------------------------------------------------- diff


def diff(desired: DesiredState, observed: Observed) -> list[Action]:
    """The writes of this step, in the order to make them.

    Config first (new pods mount it), then instances (their spec gates their pods), then
    pods, then the rest. Involuntary trouble (a broken gang, an instance already down) is
    repaired at once; voluntary disruption (rolling a serving instance to a new config) is
    held to `maxUnavailable` per role, one role at a time, and stops while paused.
    """
    actions: list[Action] = []
    owned_uids = {desired.uid} | {i.uid for i in observed.instances.values()}

    def sync(obj: dict[str, Any], why: str) -> None:
        key = (obj["kind"], obj["metadata"]["name"])
        current = observed.objects.get(key)
        if current is None:
            actions.append(Action("create", key[0], key[1], f"{why} is missing", obj))
            return
        removals = extra_fields(current, obj)
        if not contains(current, obj) or removals:
            body = overlay_removals(obj, removals)
            actions.append(
                Action("patch", key[0], key[1], f"{why} drifted from the plan", body,
                       resource_version=current.get("metadata", {}).get("resourceVersion"))
            )

    for (kind, name), obj in desired.objects.items():
        if kind == "ConfigMap":
            sync(obj, "engine configuration" if name != applied_spec_name(desired.name) else "applied spec")

    views = view(desired, observed)
    selected = select_rollout(desired, views)

    # Instances: create, adopt role switches, roll, restart broken gangs. `next_hash` is the
    # configHash each instance carries once this step's patch lands; its pods follow it.
    next_hash: dict[str, str] = {}
    gang_restarts: set[str] = set()
    for name, p in desired.instances.items():
        existing = observed.instances.get(name)
        if existing is None:
            actions.append(Action("create", INSTANCE_KIND, name, f"new {p.role} instance", p.manifest))
            continue
        if existing.deleting:
            continue
        v = views[name]
        patch: dict[str, Any] = {}
        reasons: list[str] = []
        next_hash[name] = existing.spec.config_hash
        if name in selected:
            patch.update(configHash=p.config_hash, ports=p.ports.to_wire(), nodes=p.nodes)
            reasons.append(selected[name])
            next_hash[name] = p.config_hash
        else:
            template_half, flags_half = split_config_hash(existing.spec.config_hash)
            role_hash = desired.role_config_hashes[p.role]
            if flags_half != role_hash and v.switching:
                next_hash[name] = patch["configHash"] = template_half + role_hash
                reasons.append(f"role switched to {p.role}: the pods follow in place with the {p.role} flags")
        failure = v.failure()
        if failure:
            patch["restartGeneration"] = existing.spec.restart_generation + 1
            reasons.append(f"gang restart: {failure}")
            gang_restarts.add(name)
        if patch:
            actions.append(
                Action("patch", INSTANCE_KIND, name, "; ".join(reasons), {"spec": patch},
                       resource_version=existing.resource_version)
            )

    for name, inst in observed.instances.items():
        if name not in desired.instances and not inst.deleting and desired.uid in inst.owner_uids:
            actions.append(Action("delete", INSTANCE_KIND, name,
                                  f"scaled down: {inst.spec.role} instance no longer wanted", uid=inst.uid))

    # Per-instance Services and pods, for instances whose spec is what the pods should run.
    for name, p in desired.instances.items():
        v = views.get(name)
        if v is None:
            continue
        if p.service is not None:
            sync(p.service, f"rendezvous Service of {name}")
        if p.workload is not None:
            sync(p.workload, f"gang Workload of {name}")
        actions.extend(_pod_actions(v, next_hash[name], name in gang_restarts))

    for (kind, name), obj in desired.objects.items():
        if kind != "ConfigMap":
            sync(obj, {"PodDisruptionBudget": "disruption budget", "NetworkPolicy": "engine network policy"}.get(
                kind, f"router {kind}"))

    # Anything of ours the plan no longer has (router turned off, a role's objects renamed).
    wanted = set(desired.objects) | {
        ("Service", n) for n, p in desired.instances.items() if p.service is not None
    } | {("Workload", p.workload["metadata"]["name"]) for p in desired.instances.values() if p.workload is not None}
    for key, obj in observed.objects.items():
        meta = obj.get("metadata") or {}
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if key not in wanted and owners & owned_uids and not meta.get("deletionTimestamp"):
            instance = (meta.get("labels") or {}).get(LABEL_INSTANCE)
            if key[0] in ("Service", "Workload") and instance and instance not in desired.instances:
                continue  # goes with its instance (garbage collection)
            actions.append(Action("delete", key[0], key[1], "no longer part of the plan", uid=meta.get("uid")))
    return actions


def _pod_actions(v: InstanceView, config_hash: str, restarting: bool) -> list[Action]:
    """Delete stale gangs whole, relabel switched pods, create missing ones once the gang is gone.

    `config_hash` is what the instance's spec says after this step; pods that run another
    configuration or an older gang go together (one rank alone cannot rejoin a running
    collective), and their replacements are created only when all of them are gone.
    """
    actions: list[Action] = []
    p = v.plan
    generation = v.observed.spec.restart_generation + (1 if restarting else 0)
    template_half, flags_half = split_config_hash(config_hash)

    def stale(pod: ObservedPod) -> bool:
        if pod.restart_generation < generation or pod.rank >= p.nodes:
            return True
        pod_hash = pod.annotations.get(ANNOTATION_CONFIG_HASH, "")
        if pod.annotations.get(ANNOTATION_ROLE) != p.role:
            return split_config_hash(pod_hash)[0] != template_half
        return pod_hash != config_hash

    live = [pod for pod in v.pods if not pod.deleting]
    if any(stale(pod) for pod in live):
        why = "gang restart" if restarting else "rolling to the new configuration"
        for pod in live:
            actions.append(Action("delete", "Pod", pod.name, f"{why} of {p.name} (whole gang)", uid=pod.uid))
        return actions
    desired_pods = {pod["metadata"]["name"]: pod for pod in p.pods}
    for pod in live:
        want = desired_pods.get(pod.name)
        body = {} if want is None else _metadata_patch(pod, want, flags_half, p.role)
        if body:
            why = (
                f"role switched to {p.role} (relabel, no restart)"
                if pod.annotations.get(ANNOTATION_ROLE) != p.role
                else "pod metadata drifted from the plan"
            )
            actions.append(Action("patch", "Pod", pod.name, why, body, uid=pod.uid))
    if any(pod.deleting for pod in v.pods):
        return actions  # the old gang is still going; its names are not free yet
    if config_hash != p.config_hash:
        # An instance not yet rolled that lost pods is down anyway, so select_rollout rolls
        # it in this very step; creating old-configuration pods would only roll them again.
        return actions
    present = {pod.rank for pod in live}
    for rank, want in enumerate(p.pods):
        if rank not in present:
            actions.append(Action("create", "Pod", want["metadata"]["name"],
                                  f"rank {rank} of {p.role} instance {p.name}", _stamp(want, generation)))
    return actions


def _stamp(pod: dict[str, Any], generation: int) -> dict[str, Any]:
    out = json.loads(json.dumps(pod))
    out["metadata"]["annotations"][ANNOTATION_RESTART_GENERATION] = str(generation)
    return out


def _metadata_patch(pod: ObservedPod, want: Mapping[str, Any], flags_half: str, role: Role) -> dict[str, Any]:
    """A merge patch bringing a live pod's labels and role annotations to the plan (or {})."""
    labels: dict[str, str | None] = {}
    want_labels = want["metadata"]["labels"]
    for key, value in want_labels.items():
        if pod.labels.get(key) != value:
            labels[key] = value
    if LABEL_ROLE not in want_labels and LABEL_ROLE in pod.labels:
        labels[LABEL_ROLE] = None
    annotations: dict[str, str] = {}
    if pod.annotations.get(ANNOTATION_ROLE) != role:
        annotations[ANNOTATION_ROLE] = role
        pod_template_half = split_config_hash(pod.annotations.get(ANNOTATION_CONFIG_HASH, ""))[0]
        annotations[ANNOTATION_CONFIG_HASH] = pod_template_half + flags_half
    for key in (ANNOTATION_BOOTSTRAP_PORT, ANNOTATION_WORKER_PORTS):
        value = want["metadata"]["annotations"].get(key)
        if value is not None and pod.annotations.get(key) != value:
            annotations[key] = value
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta} if meta else {}


def select_rollout(desired: DesiredState, views: Mapping[str, InstanceView]) -> dict[str, str]:
    """Instances whose spec moves to the planned configuration now, with the reason.

    An instance that is down anyway is rolled at once: it costs no availability. A serving
    one is rolled only within its role's budget (maxUnavailable minus instances already
    down), only in the first role (prefill, then decode) that still has instances to roll,
    and only while the other role has no instance coming back from its own roll.
    """
    selected: dict[str, str] = {}
    pending = {role: [v for v in views.values() if v.plan.role == role and not v.current] for role in ROLES}
    for role in ROLES:
        for v in pending[role]:
            if not v.available:
                selected[v.plan.name] = f"rolling {role} instance (down already: costs no availability)"
    if desired.paused:
        return selected
    for role in ROLES:
        serving = [v for v in pending[role] if v.available]
        if not serving:
            continue
        other = [v for v in views.values() if v.plan.role != role]
        if any(v.recovering for v in other):
            break  # the other role is mid-rollout: one role at a time
        down = sum(1 for v in views.values() if v.plan.role == role and not v.available)
        budget = desired.max_unavailable - down
        for v in sorted(serving, key=lambda v: -v.plan.index)[: max(0, budget)]:
            selected[v.plan.name] = (
                f"rolling {role} instance to the new configuration "
                f"({down + 1}/{desired.max_unavailable} of the role's budget)"
            )
            down += 1
        break
    return selected


# --------------------------------------------------------------------------- comparison

# Fields where anything beyond what the plan sets is drift, not someone else's addition: a
# selector key widens or narrows what a Service, budget or policy applies to, and a pod-level
# privilege on the router (host namespaces, volumes, security context, its token) grants
# what the plan never did. Everything else tolerates fields the apiserver or others add.
_EXACT_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Service": (("spec", "selector"),),
    "PodDisruptionBudget": (("spec", "selector"),),
    "NetworkPolicy": (("spec",),),
    "Deployment": (
        ("spec", "selector"),
        ("spec", "template", "metadata", "labels"),
        *(("spec", "template", "spec", key) for key in (
            "hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "hostUsers", "securityContext",
            "volumes", "serviceAccountName", "automountServiceAccountToken", "initContainers",
            "ephemeralContainers", "nodeName",
        )),
    ),
}
# Container fields of the router where an addition is drift (the list itself is matched by
# position, so the containers must still be the planned ones).
_EXACT_CONTAINER_FIELDS = ("securityContext", "volumeMounts", "command", "args", "env", "envFrom")


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _same(observed: Any, desired: Any) -> bool:
    """Equality where absent, null and false are the same "nothing".

    Empty selectors are not nothing: `namespaceSelector: {}` selects every namespace.
    """
    if (observed is None or observed is False) and (desired is None or desired is False):
        return True
    if isinstance(desired, Mapping) and isinstance(observed, Mapping):
        keys = set(observed) | set(desired)
        return all(_same(observed.get(k), desired.get(k)) for k in keys)
    if isinstance(desired, list) and isinstance(observed, list):
        return len(observed) == len(desired) and all(_same(o, d) for o, d in zip(observed, desired))
    return observed == desired


def extra_fields(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Paths under the exact fields of `desired`'s kind whose observed value the plan does not set.

    Each path is either a key to remove (present on the object, absent from the plan) or an
    exact field whose value differs; `overlay_removals` turns them into a merge patch.
    """
    kind = desired.get("kind", "")
    found: list[tuple[str, ...]] = []
    for path in _EXACT_PATHS.get(kind, ()):
        have, want = _at(observed, path), _at(desired, path)
        if _same(have, want):
            continue
        if isinstance(have, Mapping) and isinstance(want, Mapping):
            found.extend(_mapping_extras(have, want, path) or [path])
        else:
            found.append(path)
    if kind == "Deployment":
        have_c = _at(observed, ("spec", "template", "spec", "containers")) or []
        want_c = _at(desired, ("spec", "template", "spec", "containers")) or []
        for have, want in zip(have_c, want_c):
            if any(not _same(have.get(f), want.get(f)) for f in _EXACT_CONTAINER_FIELDS):
                found.append(("spec", "template", "spec", "containers"))
                break
    return found


def _mapping_extras(have: Mapping[str, Any], want: Mapping[str, Any], path: tuple[str, ...]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, value in have.items():
        if key not in want:
            if value is not None and value is not False:
                out.append((*path, key))
        elif isinstance(value, Mapping) and isinstance(want[key], Mapping):
            out.extend(_mapping_extras(value, want[key], (*path, key)))
        elif not _same(value, want[key]):
            out.append((*path, key))
    return out


def overlay_removals(desired: dict[str, Any], paths: list[tuple[str, ...]]) -> dict[str, Any]:
    """`desired` as a merge patch that also removes the drifted paths the plan does not set.

    A path the plan sets keeps the plan's value (lists are replaced whole by a merge patch);
    a path it leaves out becomes null, which deletes the key.
    """
    if not paths:
        return desired
    body = json.loads(json.dumps(desired))
    for path in paths:
        if _at(desired, path) is not None:
            continue
        node = body
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = None
    return body



def contains(observed: Any, desired: Any) -> bool:
    """Whether every field the plan sets has the planned value in the observed object.

    Fields the apiserver defaults or other controllers add are ignored; lists must match
    element by element, so a removed port or container is drift.
    """
    if isinstance(desired, Mapping):
        if not isinstance(observed, Mapping):
            return False
        return all(k in observed and contains(observed[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(observed, list) or len(observed) != len(desired):
            return False
        return all(contains(o, d) for o, d in zip(observed, desired))
    return observed == desired
