"""What engine pods may ask of a node, as the platform team allowed it when installing.

Host networking and IPC_LOCK are node-level privileges: the chart makes them explicit
values and the operator refuses a fleet that needs one it was not granted, naming the field,
instead of creating pods that a Pod Security admission would reject one by one.

The fleet's pod templates, weights and Secret references reach the same pods, so they are held
to the same grants: whoever may create a HybridServing gets no more of a node, of the Kubernetes
API or of the operator's own Secrets through a template than through the fields that render them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hybridserving.api.pods import PodTemplate
from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE, DEFAULT_ROUTER_IMAGE, HybridServing, HybridServingSpec
from hybridserving.core import podtemplate, weights
from hybridserving.core.layout import LayoutIssue

# Where the weights' default `nodeCachePath` lies: a node cache the chart grants stays there unless
# the platform team names other directories.
DEFAULT_NODE_CACHE_PATHS = ("/var/lib/hybridserving",)
# The capability Pod Security "restricted" lets a container add; IPC_LOCK only where it is granted.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# The SELinux types Pod Security "baseline" admits: another (spc_t) runs the container unconfined.
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


@dataclass(frozen=True)
class EnginePolicy:
    """What the platform team granted engine pods; nothing unless granted.

    `allowed_images` are prefixes an engine, router or sidecar image must start with (empty: any);
    `operator_namespace` is where the operator's pods run, the one namespace outside the
    fleet's whose operator pods may reach the engines; `default_image` and `default_router_image`
    are the engine and router images of a fleet that names none. `allow_node_cache` lets a fleet
    fill a host directory under one of `allowed_node_cache_paths` (`weights.cache: Node`);
    `allow_service_account` lets a pod template pick a service account or mount its token;
    `operator_secrets` are the Secrets of the operator's own (its key, its webhook's certificate),
    which no fleet may reference.
    """

    allow_host_network: bool = False
    allow_ipc_lock: bool = False
    allowed_images: tuple[str, ...] = ()
    operator_namespace: str | None = None
    default_image: str = DEFAULT_ENGINE_IMAGE
    default_router_image: str = DEFAULT_ROUTER_IMAGE
    allow_node_cache: bool = False
    allowed_node_cache_paths: tuple[str, ...] = DEFAULT_NODE_CACHE_PATHS
    allow_service_account: bool = False
    operator_secrets: tuple[str, ...] = ()


def with_default_image(hs: HybridServing, policy: EnginePolicy) -> HybridServing:
    """The fleet with the operator's default engine and router images where it names none, so that
    what is planned, hashed and checked against `allowed_images` is the image that will run."""
    update: dict[str, object] = {}
    if hs.spec.engine.image is None:
        update["engine"] = hs.spec.engine.model_copy(update={"image": policy.default_image})
    if hs.spec.router.image is None:
        update["router"] = hs.spec.router.model_copy(update={"image": policy.default_router_image})
    return hs.model_copy(update={"spec": hs.spec.model_copy(update=update)}) if update else hs


def needs_ipc_lock(spec: HybridServingSpec) -> bool:
    """RDMA registers (pins) GPU and host memory, which takes IPC_LOCK."""
    return spec.network.host_network or spec.transfer.rdma_resource_count > 0


def _error(path: str, message: str, fix: str, rule: str) -> LayoutIssue:
    return LayoutIssue(path=path, message=message, fix=fix, rule=rule, severity="error")


def _image_issue(path: str, image: str, policy: EnginePolicy) -> LayoutIssue | None:
    if not policy.allowed_images or any(image.startswith(prefix) for prefix in policy.allowed_images):
        return None
    return _error(path, f"image {image!r} is not from a registry or repository this operator may run "
                  f"(chart value enginePolicy.allowedImages: {', '.join(policy.allowed_images)})",
                  "use an image under one of the allowed prefixes, or have the platform team add its "
                  "prefix to enginePolicy.allowedImages", "image-allowed")


def check(spec: HybridServingSpec, policy: EnginePolicy) -> list[LayoutIssue]:
    issues = []
    if spec.network.host_network and not policy.allow_host_network:
        issues.append(_error(
            "spec.network.hostNetwork",
            "this operator is installed without host networking for engine pods "
            "(chart value enginePolicy.allowHostNetwork: false)",
            "set spec.network.hostNetwork: false, or have the platform team set "
            "enginePolicy.allowHostNetwork: true in the operator's Helm values",
            "engine-host-network-allowed",
        ))
    if needs_ipc_lock(spec) and not policy.allow_ipc_lock:
        issues.append(_error(
            "spec.transfer.rdmaResourceCount",
            "RDMA needs the IPC_LOCK capability, which this operator may not grant "
            "(chart value enginePolicy.allowIpcLock: false)",
            "set spec.transfer.rdmaResourceCount: 0 and spec.network.hostNetwork: false (TCP transfer), "
            "or have the platform team set enginePolicy.allowIpcLock: true",
            "engine-ipc-lock-allowed",
        ))
    for path, image in (("spec.engine.image", spec.engine_image()), ("spec.router.image", spec.router_image())):
        if (issue := _image_issue(path, image, policy)) is not None:
            issues.append(issue)
    issues.extend(_node_cache(spec, policy))
    for at, template in podtemplate.located(spec):
        issues.extend(_template(spec, template, at, policy))
    issues.extend(_operator_secrets(spec, policy))
    return issues


# --------------------------------------------------------------------------- weights


def _node_cache(spec: HybridServingSpec, policy: EnginePolicy) -> Iterator[LayoutIssue]:
    """The node cache is a host directory the fill step writes as the pod's user, shared by every
    fleet on the node: a grant of the platform team's, in directories it chose."""
    w = spec.model.weights
    if w is None or w.cache != "Node":
        return
    if not policy.allow_node_cache:
        yield _error(
            "spec.model.weights.cache",
            f"cache: Node mounts the host directory {w.node_cache_path} into engine pods, which this operator may "
            "not grant (chart value enginePolicy.allowNodeCache: false)",
            "set cache: None (each engine downloads at start) or serve the weights from pvc:// or oci://, or have "
            "the platform team set enginePolicy.allowNodeCache: true in the operator's Helm values",
            "weights-node-cache-allowed",
        )
    elif not any(_under(w.node_cache_path, directory) for directory in policy.allowed_node_cache_paths):
        yield _error(
            "spec.model.weights.nodeCachePath",
            f"{w.node_cache_path} is not in a host directory this operator may give engine pods (chart value "
            f"enginePolicy.allowedNodeCachePaths: {', '.join(policy.allowed_node_cache_paths) or 'none'})",
            "put it under one of those directories, or have the platform team add its directory to "
            "enginePolicy.allowedNodeCachePaths",
            "weights-node-cache-allowed",
        )


def _under(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or inside it, as the kubelet resolves them (`//`, `.`, `..`)."""
    path, directory = ("/" + posixpath.normpath(p).lstrip("/") for p in (path, directory))
    return path == directory or path.startswith(directory.rstrip("/") + "/")


# --------------------------------------------------------------------------- pod templates


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` where the template holds an object, else nothing: keys outside `api.podshape`'s table may
    hold anything, and the apiserver refuses the pod of a wrong type on its own."""
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _template(spec: HybridServingSpec, template: PodTemplate, at: str, policy: EnginePolicy) -> Iterator[LayoutIssue]:
    pod = template.spec
    at_spec = f"{at}.spec"
    for key, value in template.metadata.annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and value.strip().lower() == "unconfined":
            yield _error(f"{at}.metadata.annotations[{key}]", "an unconfined AppArmor profile lifts the node's "
                         "confinement of the container", "remove the annotation (the runtime's default applies)",
                         "pod-template-security-context")
    for field in ("hostPID", "hostIPC"):
        if pod.get(field) not in (None, False):
            yield _error(f"{at_spec}.{field}", f"{field} would share the node's "
                         f"{'processes' if field == 'hostPID' else 'IPC namespace'} with the pod; no chart value "
                         "grants it to engine pods", f"remove {field} from the pod template",
                         "pod-template-host-namespace")
    yield from _service_account(pod, at_spec, policy)
    yield from _context(_mapping(pod.get("securityContext")), f"{at_spec}.securityContext", policy, pod_level=True)
    cache_volume = spec.model.weights is not None and spec.model.weights.cache == "Node"
    for volume in _items(pod.get("volumes")):
        vpath = f"{at_spec}.volumes[{volume.get('name')}]"
        if volume.get("hostPath") is not None:
            yield _error(f"{vpath}.hostPath", "a hostPath volume gives the pod a directory of the node; no chart "
                         "value grants one to engine pods",
                         "use a persistentVolumeClaim (a local PersistentVolume for a node's disk), or "
                         "spec.model.weights.cache: Node for the weights (chart value enginePolicy.allowNodeCache)",
                         "pod-template-host-path")
        for index, source in enumerate(_items(_mapping(volume.get("projected")).get("sources"))):
            if source.get("serviceAccountToken") is not None and not policy.allow_service_account:
                yield _error(f"{vpath}.projected.sources[{index}].serviceAccountToken",
                             "a service account token would give engine pods access to the Kubernetes API, which "
                             "this operator may not grant (chart value enginePolicy.allowServiceAccount: false)",
                             "remove the token source, or have the platform team set "
                             "enginePolicy.allowServiceAccount: true", "pod-template-service-account")
    for list_name in ("initContainers", "containers"):
        for container in _items(pod.get(list_name)):
            yield from _container(spec, container, f"{at_spec}.{list_name}[{container.get('name')}]", policy,
                                  engine=list_name == "containers" and container.get("name") == "engine",
                                  cache_volume=cache_volume)


def _service_account(pod: Mapping[str, Any], at: str, policy: EnginePolicy) -> Iterator[LayoutIssue]:
    """Engine pods never call the API: a service account's token is a grant beyond the pod's work."""
    if policy.allow_service_account:
        return
    fix = ("remove it (engine pods run with no Kubernetes API access), or have the platform team set "
           "enginePolicy.allowServiceAccount: true in the operator's Helm values")
    for field in ("serviceAccountName", "serviceAccount"):
        if pod.get(field) not in (None, ""):
            yield _error(f"{at}.{field}", f"{field} would run engine pods as service account {pod[field]!r}, which "
                         "this operator may not choose (chart value enginePolicy.allowServiceAccount: false)", fix,
                         "pod-template-service-account")
    if pod.get("automountServiceAccountToken") is True:
        yield _error(f"{at}.automountServiceAccountToken", "a mounted token would give engine pods access to the "
                     "Kubernetes API, which this operator may not grant (chart value "
                     "enginePolicy.allowServiceAccount: false)", fix, "pod-template-service-account")


def _container(spec: HybridServingSpec, container: Mapping[str, Any], at: str, policy: EnginePolicy, *,
               engine: bool, cache_volume: bool) -> Iterator[LayoutIssue]:
    """The engine container's image and security context are the operator's (`core.podtemplate` refuses
    them); every other container is the fleet owner's, held to what the engine is held to."""
    if not engine:
        image = container.get("image")
        if isinstance(image, str) and (issue := _image_issue(f"{at}.image", image, policy)) is not None:
            yield issue
        yield from _context(_mapping(container.get("securityContext")), f"{at}.securityContext", policy,
                            pod_level=False)
        host_network = spec.network.host_network and policy.allow_host_network
        for index, port in enumerate(_items(container.get("ports"))):
            if port.get("hostPort") not in (None, 0) and not host_network:
                yield _error(f"{at}.ports[{index}].hostPort", "a hostPort binds a port of the node; only "
                             "host-network fleets do (chart value enginePolicy.allowHostNetwork)",
                             "remove hostPort, or use spec.network.hostNetwork where the platform team granted "
                             "enginePolicy.allowHostNetwork", "pod-template-host-port")
    if cache_volume:
        for mount in _items(container.get("volumeMounts")):
            if mount.get("name") == weights.VOLUME:
                yield _error(f"{at}.volumeMounts[{weights.VOLUME}]", "the node cache holds the weights of every "
                             "fleet on the node: mounted by a template, a container could read or change them",
                             f"remove the mount; the engine container reads its weights at {weights.MOUNT_PATH}",
                             "weights-node-cache-mounted")


def _context(context: Mapping[str, Any], at: str, policy: EnginePolicy, *, pod_level: bool) -> Iterator[LayoutIssue]:
    """What a (pod or container) security context may not lift: the Pod Security "restricted" settings the
    operator renders, but for IPC_LOCK where the chart grants it."""
    rule = "pod-template-security-context"
    root_fix = ("leave it out: engine pods run as UID 65532, or as the image's user where RDMA takes IPC_LOCK "
                "(chart value enginePolicy.allowIpcLock)")
    run_as_user = context.get("runAsUser")
    if isinstance(run_as_user, int | float) and not isinstance(run_as_user, bool) and run_as_user == 0:
        yield _error(f"{at}.runAsUser", "UID 0 runs the containers as root; no chart value grants it", root_fix, rule)
    if context.get("runAsNonRoot") not in (None, True):
        yield _error(f"{at}.runAsNonRoot", "runAsNonRoot: false lets the containers run as root; no chart value "
                     "grants it", root_fix, rule)
    for field in ("seccompProfile", "appArmorProfile"):
        if _mapping(context.get(field)).get("type") == "Unconfined":
            yield _error(f"{at}.{field}.type", f"an Unconfined {field} lifts the node's confinement of the "
                         "containers; no chart value grants it", "use RuntimeDefault or Localhost, or leave it out",
                         rule)
    selinux = _mapping(context.get("seLinuxOptions"))
    kind = selinux.get("type") or ""
    if not isinstance(kind, str) or kind not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        yield _error(f"{at}.seLinuxOptions", "these SELinux options lift the node's confinement of the containers; "
                     "no chart value grants them", f"set only level, and type to one of "
                     f"{', '.join(sorted(t for t in SELINUX_TYPES if t))} or leave it out", rule)
    if _mapping(context.get("windowsOptions")).get("hostProcess") not in (None, False):
        yield _error(f"{at}.windowsOptions.hostProcess", "a host process container runs on the node itself; no "
                     "chart value grants it", "remove hostProcess", rule)
    if pod_level:
        return
    if context.get("privileged") not in (None, False):
        yield _error(f"{at}.privileged", "a privileged container has every device and capability of the node; no "
                     "chart value grants it", "remove privileged (or set it to false)", rule)
    if context.get("allowPrivilegeEscalation") not in (None, False):
        yield _error(f"{at}.allowPrivilegeEscalation", "allowPrivilegeEscalation: true lets a process gain more "
                     "privileges than its parent (setuid binaries); no chart value grants it",
                     "set allowPrivilegeEscalation: false, as the operator does for its containers", rule)
    if context.get("procMount") not in (None, "Default"):
        yield _error(f"{at}.procMount", "an unmasked /proc exposes the node's kernel settings; no chart value "
                     "grants it", "remove procMount (or set it to Default)", rule)
    granted = RESTRICTED_CAPABILITIES | ({"IPC_LOCK"} if policy.allow_ipc_lock else set())
    added = _mapping(context.get("capabilities")).get("add")
    # The runtime reads a capability with or without `CAP_`, in any case.
    beyond = {str(c).upper().removeprefix("CAP_") for c in added} - granted if isinstance(added, list) else set()
    if beyond:
        yield _error(f"{at}.capabilities.add", f"{', '.join(sorted(beyond))}: this operator may add only "
                     f"{', '.join(sorted(granted))} to a container (chart value enginePolicy.allowIpcLock: "
                     f"{str(policy.allow_ipc_lock).lower()})",
                     "remove them" + (", or have the platform team set enginePolicy.allowIpcLock: true for IPC_LOCK"
                                      if "IPC_LOCK" in beyond else ""), rule)


# --------------------------------------------------------------------------- the operator's Secrets


def _secret_references(spec: HybridServingSpec) -> Iterator[tuple[str, str]]:
    """(field path, Secret name) of every Secret whose content the spec hands to a container."""
    w = spec.model.weights
    if w is not None and w.token_secret_ref is not None:
        yield "spec.model.weights.tokenSecretRef.name", w.token_secret_ref.name
    for var in spec.engine.env:
        if var.value_from is not None and var.value_from.secret_key_ref is not None:
            yield f"spec.engine.env[{var.name}].valueFrom.secretKeyRef.name", var.value_from.secret_key_ref.name
    for index, source in enumerate(spec.engine.env_from):
        if source.secret_ref is not None:
            yield f"spec.engine.envFrom[{index}].secretRef.name", source.secret_ref.name
    for at, template in podtemplate.located(spec):
        yield from _template_secret_references(template.spec, f"{at}.spec")


def _template_secret_references(pod: Mapping[str, Any], at: str) -> Iterator[tuple[str, str]]:
    for list_name in ("initContainers", "containers"):
        for container in _items(pod.get(list_name)):
            cpath = f"{at}.{list_name}[{container.get('name')}]"
            for entry in _items(container.get("env")):
                ref = _mapping(_mapping(entry.get("valueFrom")).get("secretKeyRef"))
                if "name" in ref:
                    yield f"{cpath}.env[{entry.get('name')}].valueFrom.secretKeyRef.name", str(ref["name"])
            for index, each in enumerate(_items(container.get("envFrom"))):
                ref = _mapping(each.get("secretRef"))
                if "name" in ref:
                    yield f"{cpath}.envFrom[{index}].secretRef.name", str(ref["name"])
    for volume in _items(pod.get("volumes")):
        vpath = f"{at}.volumes[{volume.get('name')}]"
        secret = _mapping(volume.get("secret"))
        if "secretName" in secret:
            yield f"{vpath}.secret.secretName", str(secret["secretName"])
        for index, each in enumerate(_items(_mapping(volume.get("projected")).get("sources"))):
            ref = _mapping(each.get("secret"))
            if "name" in ref:
                yield f"{vpath}.projected.sources[{index}].secret.name", str(ref["name"])


def _operator_secrets(spec: HybridServingSpec, policy: EnginePolicy) -> Iterator[LayoutIssue]:
    """The operator key derives every fleet's engine key, and the webhook's key is the operator's
    identity: a fleet in the operator's namespace could otherwise hand either to a container of its
    own, or, as a hub token, to an endpoint of its choosing. The names are refused in any namespace,
    as a spec does not say which one it lands in."""
    for path, name in _secret_references(spec):
        if name in policy.operator_secrets:
            yield _error(path, f"Secret {name!r} is the operator's own (its key, or its webhook's certificate); "
                         "no fleet may read it", "name a Secret of your own (and keep fleets out of the "
                         "operator's namespace)", "operator-secret-reference")
