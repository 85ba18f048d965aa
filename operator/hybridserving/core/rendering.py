"""Every manifest a fleet owns, rendered from its spec: engine configuration, instances and
their pods and Services, disruption budgets, the engine network policy and the router.

Rendering is a pure function of the spec and of what must survive (an instance's index,
ports, uid and restart generation); deciding which of these objects to write, and when,
is the rollout's job (`core.rollout`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridserving.api.instance import HybridServingInstanceSpec, InstancePorts
from hybridserving.api.v1alpha1 import (
    INSTANCE_KIND,
    ROLES,
    ROUTER_METRICS_PORT,
    HybridServing,
    HybridServingSpec,
    Role,
)
from hybridserving.contract import (
    ANNOTATION_ROLE,
    CONFIG_DIR,
    CONFIG_HASH_FILE_NAME,
    ENGINE_COMMAND,
    ENV_CONFIG_DIR,
    ENV_DRAIN_TIMEOUT_S,
    ENV_ENGINE_API_KEY,
    ENV_LAUNCHER_PORT,
    ENV_NODE_RANK,
    ENV_ROLE_FILE,
    ENV_SETTINGS,
    LABEL_ROLE,
    PODINFO_DIR,
    ROLE_FILE,
    placeholder_env,
    role_document_name,
)
from hybridserving.core import enginekey, flags, gang, podtemplate, ports, privileges, resolution, router, weights
from hybridserving.core.desired import InstancePlan
from hybridserving.core.naming import (
    ANNOTATION_BOOTSTRAP_PORT,
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_RESTART_GENERATION,
    ANNOTATION_SPEC_HASH,
    ANNOTATION_TEMPLATE_HASH,
    ANNOTATION_WORKER_PORTS,
    API_VERSION,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_INSTANCE_ROLE,
    LABEL_LEADER,
    LABEL_NAME,
    LABEL_NODE_RANK,
    LABEL_PAIRING,
    applied_spec_name,
    config_map_name,
    digest,
    network_policy_name,
    owner_reference,
    pdb_name,
    pod_name,
    router_deployment_name,
    router_name,
    split_config_hash,
    standard_labels,
)
from hybridserving.core.observed import Observed, ObservedInstance
from hybridserving.core.switching import SWITCH_PHASES

ENGINE_CONTAINER = "engine"
STOP_GRACE = ENV_SETTINGS["HYBRIDSERVING_STOP_GRACE_S"]


def stop_grace_seconds(spec: HybridServingSpec) -> int:
    """The launcher's SIGTERM-to-SIGKILL grace for the engine, as `spec.engine.env` sets it (the last
    entry wins, as in a Pod; one from a Secret or ConfigMap is unknown here: the default). The pod's
    termination grace covers it after the drain, or the kubelet would kill SGLang mid-exit."""
    last = next((var for var in reversed(spec.engine.env) if var.name == STOP_GRACE.name), None)
    try:
        return math.ceil(float(STOP_GRACE.read(last.plain_value if last else None)))
    except ValueError:
        return math.ceil(float(STOP_GRACE.default))  # refused at admission (engine-env-setting)


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


def _meta(hs: HybridServing, name: str, owner: dict[str, Any], component: str, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": hs.metadata.namespace,
        "labels": {**standard_labels(hs.metadata.name, component), LABEL_NAME: hs.metadata.name,
                   LABEL_COMPONENT: component, **labels},
        "ownerReferences": [owner],
    }


def render_instance(
    hs: HybridServing,
    name: str,
    index: int,
    role: Role,
    inst_ports: InstancePorts,
    role_hashes: Mapping[Role, str],
    existing: ObservedInstance | None,
    owner: dict[str, Any],
    pairing_key: str,
) -> InstancePlan:
    spec = hs.spec
    nodes = spec.role(role).nodes_per_instance
    restart_generation = existing.spec.restart_generation if existing else 0
    # The template is rendered once without hashes to hash it, then stamped.
    bare = [pod_spec(hs, name, rank, role, inst_ports) for rank in range(nodes)]
    extra_labels, extra_annotations = pod_extra_metadata(spec, name, role, nodes)
    template_hash = digest([bare, extra_labels, extra_annotations] if extra_labels or extra_annotations else bare)
    config_hash = template_hash + role_hashes[role]
    manifest = {
        "apiVersion": API_VERSION,
        "kind": INSTANCE_KIND,
        "metadata": _meta(hs, name, owner, "engine", **{LABEL_INSTANCE: name, LABEL_PAIRING: pairing_key}),
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
            labels = {**extra_labels, **pod_labels(hs.metadata.name, name, rank, role, routable),
                      LABEL_PAIRING: pairing_key}
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


def pod_extra_metadata(
    spec: HybridServingSpec, instance: str, role: Role, nodes: int
) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations from the pod templates and the gang, under the operator's own: the
    pod metadata the template hash covers (the operator's own labels are patched in place)."""
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


def pod_spec(hs: HybridServing, instance: str, rank: int, role: Role, p: InstancePorts) -> dict[str, Any]:
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
        # The launcher hands it to SGLang as --api-key (core/enginekey.py); a user's variable of the
        # same name comes later and wins, as the fleet owner may pick the key.
        enginekey.env_var(hs.metadata.name),
        *(e.to_pod() for e in spec.engine.env),
    ]
    pod_weights = weights.render(spec, p.launcher)
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
        "image": spec.engine_image(),
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
                        {"path": "role", "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_ROLE}']"}},
                        {"path": CONFIG_HASH_FILE_NAME,
                         "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_CONFIG_HASH}']"}},
                    ]
                },
            },
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            *pod_weights.volumes,
        ],
        "affinity": _affinity(hs, instance, leader),
        "terminationGracePeriodSeconds": spec.role_switch.drain_timeout_seconds + stop_grace_seconds(spec),
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
        # The fill step writes a host directory: it gets no capability, IPC_LOCK included (it only downloads).
        pod["initContainers"] = [{**c, "securityContext": _container_security()} for c in pod_weights.init_containers]
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


def _config_map(
    hs: HybridServing, role: Role, config: dict[str, Any], config_hash: str, running: Mapping[str, str],
    owner: dict[str, Any],
) -> dict[str, Any]:
    """`<role>.json` is the spec's document; `<role>-<hash>.json` the same under its hash, beside the
    documents in `running` (those the fleet's pods still run, `running_documents`)."""
    meta = _meta(hs, config_map_name(hs.metadata.name, role), owner, "config")
    meta["annotations"] = {ANNOTATION_CONFIG_HASH: config_hash}
    document = json.dumps(config, indent=1, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {**running, f"{role}.json": document, role_document_name(role, config_hash): document},
    }


def running_documents(hs: str, observed: Observed) -> dict[Role, dict[str, str]]:
    """The role documents the fleet's pods and instances still run, by ConfigMap key, from the
    ConfigMaps that hold them.

    A rollout replaces pods a budget at a time and may be paused for hours; until the last pod of a
    configuration is gone its document stays, so an engine restarting meanwhile (a crash, a relaunch)
    starts on the flags its pod was made with, not on the new ones its pod has not rolled to.
    """
    running = {(pod.annotations.get(ANNOTATION_ROLE), pod.annotations.get(ANNOTATION_CONFIG_HASH, ""))
               for pod in observed.pods.values() if not pod.deleting}
    running |= {(i.spec.role, i.spec.config_hash) for i in observed.instances.values() if not i.deleting}
    held = {role: (observed.objects.get(("ConfigMap", config_map_name(hs, role))) or {}).get("data") or {}
            for role in ROLES}
    out: dict[Role, dict[str, str]] = {role: {} for role in ROLES}
    for role, config_hash in running:
        flags_half = split_config_hash(config_hash)[1]
        if role not in out or not flags_half:
            continue
        key = role_document_name(role, flags_half)
        if key in held[role]:
            out[role][key] = held[role][key]
    return out


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
    """Evictions (node drains) take down at most the rollout budget of a role, counted in pods,
    and at least one instance (`maxUnavailable: 0` keeps rollouts whole, it must not block drains).

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
            "minAvailable": max(0, instances - max(1, hs.spec.rollout.max_unavailable)) * nodes,
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
        default_factory=lambda: {
            "app.kubernetes.io/part-of": "hybridserving", "app.kubernetes.io/component": "operator",
        }
    )


def _network_policy(hs: HybridServing, access: EngineAccess, owner: dict[str, Any]) -> dict[str, Any]:
    """Only the fleet's own ranks, its router and the operator may reach engine ports.

    Engines serve control endpoints (`/pd_role_switch`, `/pause_generation`, `/abort_request`)
    that the fleet's API key guards (`core.enginekey`); reachability is the layer before it:
    ranks of the fleet talk to each other on any port (collectives pick their own), the router
    on the HTTP and bootstrap ports (smg connects to each prefill's bootstrap port when it
    registers it, and counts a refused one as a bootstrap failure), the operator on the HTTP and
    launcher ports. Ports are named, so the policy
    follows per-instance ports on the host network. Enforcement needs a CNI that implements
    NetworkPolicy, and host-network pods are outside any policy (docs/security.md).
    """
    name = hs.metadata.name
    peers: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": {LABEL_NAME: name, LABEL_COMPONENT: "engine"}}}]},
        {
            "from": [{"podSelector": {"matchLabels": {LABEL_NAME: name, LABEL_COMPONENT: "router"}}}],
            "ports": [{"protocol": "TCP", "port": "http"}, {"protocol": "TCP", "port": "bootstrap"}],
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


def router_argv(hs: HybridServing, instances: Mapping[str, InstancePlan], pairing_key: str) -> list[str]:
    """`smg launch` in PD mode, discovering the leaders of one pairing key by their role label."""
    spec = hs.spec
    name = hs.metadata.name
    http_port = min((i.ports.http for i in instances.values()), default=ports.HTTP_BASE)
    paired = f"{LABEL_PAIRING}={pairing_key}"
    return [
        "launch",
        "--host", "0.0.0.0",
        "--port", str(spec.router.port),
        "--pd-disaggregation",
        "--service-discovery",
        "--prefill-selector", f"{LABEL_NAME}={name}", f"{LABEL_ROLE}=prefill", paired,
        "--decode-selector", f"{LABEL_NAME}={name}", f"{LABEL_ROLE}=decode", paired,
        "--service-discovery-port", str(http_port),
        "--service-discovery-namespace", hs.metadata.namespace,
        "--prefill-policy", spec.router.prefill_policy,
        "--decode-policy", spec.router.decode_policy,
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(ROUTER_METRICS_PORT),
        "--shutdown-grace-period-secs", str(router.DRAIN_SECONDS),
        *router.WORKER_FLAGS,
        # smg sends it to every discovered worker and asks it of its own clients
        # (model_gateway/src/service_discovery.rs, server.rs: one key for both). Kubernetes expands
        # $(VAR) from the container's env, which references the Secret: the key is in no object.
        "--api-key", f"$({ENV_ENGINE_API_KEY})",
    ]


def _router_objects(
    hs: HybridServing, instances: Mapping[str, InstancePlan], pairing_keys: Sequence[str], owner: dict[str, Any]
) -> list[dict[str, Any]]:
    """The router's Service, RBAC and budget, and one router Deployment per pairing key.

    Each Deployment's routers discover only the pods of their key, so no request pairs a prefill
    and a decode that cannot exchange KV; the Service spans them all, and smg's readiness keeps
    a router without both roles of its key out of it (`core.router`).
    """
    spec = hs.spec
    name = router_name(hs.metadata.name)
    selector = {LABEL_NAME: hs.metadata.name, LABEL_COMPONENT: "router"}

    def meta(object_name: str = name, **labels: str) -> dict[str, Any]:
        return _meta(hs, object_name, owner, "router", **labels)

    def deployment(key: str) -> dict[str, Any]:
        keyed = {**selector, LABEL_PAIRING: key}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(router_deployment_name(hs.metadata.name, key), **{LABEL_PAIRING: key}),
            "spec": {
                "replicas": spec.router.replicas,
                "selector": {"matchLabels": keyed},
                "template": {
                    "metadata": {"labels": {**standard_labels(hs.metadata.name, "router"), **keyed}},
                    "spec": {
                        "serviceAccountName": name,
                        "securityContext": _pod_security(),
                        "containers": [
                            {
                                "name": "router",
                                "image": spec.router_image(),
                                "command": ["smg"],
                                "args": router_argv(hs, instances, key),
                                "env": [enginekey.env_var(hs.metadata.name)],
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
        }

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
        *(deployment(key) for key in pairing_keys),
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


def fleet_objects(
    hs: HybridServing,
    configs: Mapping[Role, dict[str, Any]],
    role_hashes: Mapping[Role, str],
    spec_hash: str,
    instances: Mapping[str, InstancePlan],
    access: EngineAccess,
    owner: dict[str, Any],
    pairing_keys: Sequence[str],
    running: Mapping[Role, Mapping[str, str]],
) -> list[dict[str, Any]]:
    """The fleet's objects besides its instances: engine configuration, the applied spec, the
    disruption budgets, the engine network policy and, when enabled, the router (one per key in
    `pairing_keys`: the spec's and those of the engine pods still running an older one)."""
    objects: list[dict[str, Any]] = []
    for role in ROLES:
        objects.append(_config_map(hs, role, configs[role], role_hashes[role], running[role], owner))
        objects.append(_pdb(hs, role, sum(1 for i in instances.values() if i.role == role), owner))
    objects.append(_applied_spec(hs, spec_hash, owner))
    objects.append(_network_policy(hs, access, owner))
    if hs.spec.router.enabled:
        objects.extend(_router_objects(hs, instances, pairing_keys, owner))
    return objects
