"""Users' partial pod templates, merged onto the operator's pods by one predictable rule.

The rule, in the order templates apply (operator's pod, then `spec.podTemplate`, then
`spec.<role>.podTemplate`): maps merge key by key, lists are appended, scalars replace; the
`containers` and `initContainers` lists merge by container name (a container named `engine`
merges into the engine container, any other name is added). So a user adds tolerations,
node selectors, affinity terms, volumes, mounts, CPU/memory, labels and sidecars without
restating anything the operator renders.

What the operator owns (GPU count, ports, the engine's command and image, the role
metadata, hostNetwork, ...) cannot be overridden: `check` names each such field with the
spec field that controls it, so the fleet is refused instead of silently rendered otherwise.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from typing import Any

from hybridserving.api.pods import OWNED_POD_SPEC_FIELDS, PodTemplate, pod_resources, requests_vs_limits
from hybridserving.api.podshape import POD_SPEC, Items
from hybridserving.api.v1alpha1 import DNS_LABEL_PATTERN, DNS_LABEL_RULE, ROLES, HybridServingSpec, Role
from hybridserving.core.layout import LayoutIssue

ENGINE_CONTAINER = "engine"
OPERATOR_PREFIX = "hybridserving.io/"
# Keys outside our prefix that the router reads from engine pods.
ROUTER_KEYS = frozenset({"sglang.ai/bootstrap-port", "smg.ai/worker-ports"})
_NAMED_LISTS = frozenset(key for key, shape in POD_SPEC.fields.items() if isinstance(shape, Items) and shape.by_name)

# Engine container fields the operator renders, with the spec field that sets each.
OWNED_ENGINE_FIELDS: dict[str, str] = {
    "image": "spec.engine.image",
    "command": "the operator (the engine launcher)",
    "args": "spec.<role>.layout and spec.engine.extraArgs (the launcher builds SGLang's argv)",
    "ports": "the operator (allocated per instance)",
    "readinessProbe": "the operator (the leader's engine /ready on the http port)",
    "livenessProbe": "the operator (the launcher's /healthz on the launcher port)",
    "startupProbe": "the operator (none: the launcher's /healthz answers while the engine loads)",
    "securityContext": "spec.network.hostNetwork / spec.transfer.rdmaResourceCount and the chart's enginePolicy",
}


def located(spec: HybridServingSpec) -> Iterator[tuple[str, PodTemplate]]:
    """Every template of the spec, with the path its fields are reported under."""
    if spec.pod_template is not None:
        yield "spec.podTemplate", spec.pod_template
    for role in ROLES:
        template = spec.role(role).pod_template
        if template is not None:
            yield f"spec.{role}.podTemplate", template


def templates(spec: HybridServingSpec, role: Role) -> list[PodTemplate]:
    """The templates that apply to a role's pods, in the order they apply."""
    return [t for t in (spec.pod_template, spec.role(role).pod_template) if t is not None]


def merge(base: Any, patch: Any) -> Any:
    """`patch` over `base` by the module's rule; neither argument is changed.

    A null in `patch` replaces what `base` has, as a patch's null does. The model refuses one at
    every key of `api.podshape`'s table that merges onto the pod, so a template's null only reaches
    keys the table leaves open and the items a list appends, and the pod reads it as absent.
    """
    if isinstance(base, Mapping) and isinstance(patch, Mapping):
        out = dict(base)
        for key, value in patch.items():
            if key in _NAMED_LISTS and isinstance(value, list):
                out[key] = _merge_named(out.get(key) or [], value)
            else:
                out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        return [*base, *copy.deepcopy(patch)]
    return copy.deepcopy(patch)


def _merge_named(base: list[Any], patch: list[Any]) -> list[Any]:
    out = list(base)
    for item in patch:
        name = item.get("name") if isinstance(item, Mapping) else None
        index = next((i for i, b in enumerate(out) if isinstance(b, Mapping) and b.get("name") == name), None)
        if index is None:
            out.append(copy.deepcopy(item))
        else:
            out[index] = merge(out[index], item)
    return out


def apply_spec(pod_spec: dict[str, Any], spec: HybridServingSpec, role: Role) -> dict[str, Any]:
    """The operator's pod spec with the role's templates merged on."""
    for template in templates(spec, role):
        pod_spec = merge(pod_spec, template.spec)
    return pod_spec


def metadata(spec: HybridServingSpec, role: Role) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) the templates add to a role's pods."""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for template in templates(spec, role):
        labels.update(template.metadata.labels)
        annotations.update(template.metadata.annotations)
    return labels, annotations


# --------------------------------------------------------------------------- validation


def _issue(path: str, message: str, fix: str, rule: str = "pod-template-owned-field",
           severity: str = "error") -> LayoutIssue:
    return LayoutIssue(path=path, message=message, fix=fix, rule=rule, severity=severity)  # type: ignore[arg-type]


def _limit_breaches(spec: HybridServingSpec, pod: Mapping[str, Any], at: str) -> Iterator[LayoutIssue]:
    """Requests the apiserver would refuse against their limits: the pod would never be created. The
    engine's GPU and RDMA requests are the operator's, refused in `_check_template` as such."""
    for where, list_name, name, resources in pod_resources(pod):
        owned = _owned_resources(spec) if list_name == "containers" and name == ENGINE_CONTAINER else {}
        for breach in requests_vs_limits(resources):
            if breach.resource not in owned:
                yield _issue(f"{at}.{where}.requests[{breach.resource}]", breach.message, breach.fix,
                             rule="pod-template-resources")


def _name_breaches(pod: Mapping[str, Any], at: str) -> Iterator[LayoutIssue]:
    """Names the apiserver refuses in a pod (`validation.go`: a container's or volume's name is a
    DNS-1123 label, unique in its list). The template's items merge into the pod's by name, so a
    name given twice would not reach the apiserver: the second copy would silently replace the first."""
    for field, noun in (("containers", "container"), ("initContainers", "init container"), ("volumes", "volume")):
        seen: set[str] = set()
        for item in pod.get(field) or []:
            name = item["name"]
            if not re.fullmatch(DNS_LABEL_PATTERN, name):
                yield _issue(f"{at}.{field}[{name}].name", f"{noun} name {name!r} is not a DNS-1123 label",
                             f"rename it: {DNS_LABEL_RULE}", rule="pod-template-shape")
            elif name in seen:
                yield _issue(f"{at}.{field}[{name}]", f"{noun} name {name!r} is given twice; the second would "
                             "replace the first", f"give each {noun} its own name", rule="pod-template-shape")
            seen.add(name)


def _owned_resources(spec: HybridServingSpec) -> dict[str, str]:
    owned = {spec.hardware.gpu_resource_name: "spec.<role>.layout (tp x pp / nodesPerInstance GPUs per pod)"}
    if spec.transfer.rdma_resource_name:
        owned[spec.transfer.rdma_resource_name] = "spec.transfer.rdmaResourceCount"
    return owned


def _check_template(spec: HybridServingSpec, template: PodTemplate, at: str,
                    reserved_volumes: set[str], reserved_mounts: set[str]) -> Iterator[LayoutIssue]:
    for kind, values in (("labels", template.metadata.labels), ("annotations", template.metadata.annotations)):
        for key in values:
            if key.startswith(OPERATOR_PREFIX) or key in ROUTER_KEYS:
                yield _issue(f"{at}.metadata.{kind}[{key}]",
                             f"{key} is set by the operator (role, instance and routing metadata)",
                             f"remove it, or use a key outside {OPERATOR_PREFIX}")
    pod = template.spec  # of Kubernetes' shape where read here: the model checks it (api.podshape)
    for field, owner in OWNED_POD_SPEC_FIELDS.items():
        if field in pod:
            yield _issue(f"{at}.spec.{field}", f"{field} is set by the operator from {owner}",
                         f"remove {field} from the pod template")
    yield from _name_breaches(pod, f"{at}.spec")
    for volume in pod.get("volumes") or []:
        if volume["name"] in reserved_volumes:
            yield _issue(f"{at}.spec.volumes[{volume['name']}]",
                         f"volume name {volume['name']!r} is used by the operator",
                         "rename the volume (and its mounts)")
    for container in pod.get("initContainers") or []:
        if container["name"] == "weights":
            yield _issue(f"{at}.spec.initContainers[{container['name']}]",
                         "the init container 'weights' is the operator's (node cache fill)",
                         "rename the init container")
    yield from _limit_breaches(spec, pod, f"{at}.spec")
    for container in pod.get("containers") or []:
        name = container["name"]
        cpath = f"{at}.spec.containers[{name}]"
        if name != ENGINE_CONTAINER:
            if not container.get("image"):
                yield _issue(f"{cpath}.image", f"sidecar {name!r} has no image",
                             f"set an image, or name the container {ENGINE_CONTAINER!r} to change the engine "
                             "container", rule="pod-template-shape")
            continue
        for field, owner in OWNED_ENGINE_FIELDS.items():
            if field in container:
                yield _issue(f"{cpath}.{field}", f"the engine container's {field} is set from {owner}",
                             f"remove {field} from the engine container in the pod template")
        resources = container.get("resources") or {}
        owned = _owned_resources(spec)
        for section in ("requests", "limits"):
            for resource in resources.get(section) or {}:
                if resource in owned:
                    yield _issue(f"{cpath}.resources.{section}[{resource}]",
                                 f"{resource} is set by the operator from {owned[resource]}",
                                 "remove it; change the layout or spec.hardware instead")
        for env in container.get("env") or []:
            if str(env.get("name", "")).startswith("HYBRIDSERVING_"):
                yield _issue(f"{cpath}.env[{env['name']}]", "HYBRIDSERVING_* variables are the launcher's",
                             "rename the variable")
        for mount in container.get("volumeMounts") or []:
            if mount.get("mountPath") in reserved_mounts:
                yield _issue(f"{cpath}.volumeMounts[{mount.get('name')}]",
                             f"{mount['mountPath']} is mounted by the operator", "mount it elsewhere")


def check(spec: HybridServingSpec, reserved_volumes: set[str], reserved_mounts: set[str]) -> list[LayoutIssue]:
    """Every owned field a template overrides, and templates that make switches roll pods."""
    issues: list[LayoutIssue] = []
    for at, template in located(spec):
        issues.extend(_check_template(spec, template, at, reserved_volumes, reserved_mounts))
    if spec.role_switch.enabled:
        shapes = [spec.role(r).pod_template for r in ROLES]
        if any(shapes) and shapes[0] != shapes[1]:
            issues.append(_issue(
                "spec.prefill.podTemplate",
                "prefill and decode pod templates differ: an instance switching role rolls onto new pods "
                "instead of switching in place",
                "move what both roles need to spec.podTemplate and keep the per-role templates equal (or unset)",
                rule="pod-template-role-switch", severity="warning",
            ))
    return issues
