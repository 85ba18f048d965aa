"""The shape of the pod spec keys the operator merges or reads, as Kubernetes' PodSpec has them.

A template's pod spec stays open (clusters need fields the operator never heard of), but a key
the operator merges onto its own pod, or reads to check what a template overrides, must hold
what Kubernetes says it holds: a list where a list goes, an object where an object goes. Of
another type, the checks could not read it and the pods rendered from it would be refused by the
apiserver, so an instance deleted for a rollout could not come back. One table states the shape;
the model checks it for every reader (`hybridserving validate`, the webhook, the reconcile) and
the CRD carries it, so the apiserver refuses a wrong type with the webhook off.

A null where the template merges onto the pod is refused too. A template is a patch, and a patch's
null means "remove" (a JSON merge patch, `kubectl apply`): merged, it would replace the operator's
containers with nothing the apiserver takes, or its affinity, security context and volumes with
nothing, and a role's template would drop spec.podTemplate's tolerations or node selector. Read as
"not set", it would mean something other than it says. Either way the user learns nothing, so it
is refused with the fix (leave the key out). Elsewhere (a key the table does not name, a key of an
item a list appends) nothing is replaced: the null is kept as written and a pod reads it as absent.
The CRD admits a null at every key that may be left out, so an object stored with one stays
readable and updatable; the model refuses it, so the webhook refuses it at apply and the reconcile
reports it, keeping the fleet on its last valid spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, TypeAlias


@dataclasses.dataclass(frozen=True)
class Text:
    """A string of `min_length` to `max_length` characters."""

    max_length: int
    min_length: int = 0

    @property
    def expected(self) -> str:
        if self.min_length:
            return f"a name of {self.min_length} to {self.max_length} characters"
        return f"a string of at most {self.max_length} characters"


@dataclasses.dataclass(frozen=True)
class Flag:
    expected = "true or false"


@dataclasses.dataclass(frozen=True)
class Obj:
    """An object: the listed keys have their shapes, any other key is Kubernetes' to judge."""

    expected: str
    fields: Mapping[str, Shape] = dataclasses.field(default_factory=dict)
    required: tuple[str, ...] = ()
    values: Text | None = None
    """The shape of every value, for a map such as nodeSelector."""


@dataclasses.dataclass(frozen=True)
class Items:
    """A list of at most `max_items` objects."""

    noun: str
    """What each item is, in the plural: `containers (objects with a name)`."""
    item: Obj
    max_items: int
    by_name: bool = False
    """A template's item merges into the pod's item of the same name (containers); otherwise it is appended."""

    @property
    def expected(self) -> str:
        return f"a list of {self.noun}"


Shape: TypeAlias = Text | Flag | Obj | Items

# Kubernetes' limits where it has them (a DNS label's 63 characters, PATH_MAX); the list bounds
# are far above what a pod needs, and keep the apiserver's cost estimates of rules finite.
_NAME = Text(max_length=63, min_length=1)
_RESOURCES = Obj("an object of requests and limits",
                 {"requests": Obj("a map of resource names to quantities"),
                  "limits": Obj("a map of resource names to quantities")})
_CONTAINER = Obj(
    "a container (an object with a name)",
    {
        "name": _NAME,
        "resources": _RESOURCES,
        "env": Items("environment variables (objects)", Obj("an environment variable"), 1024),
        "envFrom": Items("sources of environment variables (objects)", Obj("a source of environment variables"),
                         256),
        "volumeMounts": Items("volume mounts (objects)", Obj(
            "a volume mount", {"name": Text(max_length=63), "mountPath": Text(max_length=4096)}), 256),
        "ports": Items("container ports (objects)", Obj("a container port"), 256),
        "securityContext": Obj("an object (a SecurityContext)"),
    },
    required=("name",),
)
_TERMS = Items("affinity terms (objects)", Obj("an affinity term"), 64)


def _affinity(kind: str, required: Shape) -> Obj:
    return Obj(f"an object (a {kind})", {
        "requiredDuringSchedulingIgnoredDuringExecution": required,
        "preferredDuringSchedulingIgnoredDuringExecution": _TERMS,
    })


POD_SPEC = Obj(
    "a partial pod spec",
    {
        "containers": Items("containers (objects with a name)", _CONTAINER, 64, by_name=True),
        "initContainers": Items("init containers (objects with a name)", _CONTAINER, 64, by_name=True),
        "volumes": Items("volumes (objects with a name)", Obj("a volume (an object with a name)", {"name": _NAME},
                                                              required=("name",)), 256),
        "tolerations": Items("tolerations (objects)", Obj("a toleration"), 256),
        "imagePullSecrets": Items("references to Secrets (objects)", Obj("a reference to a Secret"), 64),
        "topologySpreadConstraints": Items("topology spread constraints (objects)",
                                           Obj("a topology spread constraint"), 64),
        "nodeSelector": Obj("a map of node label keys to values", values=Text(max_length=63)),
        "affinity": Obj("an object (an Affinity)", {
            "nodeAffinity": _affinity("NodeAffinity", Obj("an object (a NodeSelector)", {
                "nodeSelectorTerms": Items("node selector terms (objects)", Obj("a node selector term"), 64)})),
            "podAffinity": _affinity("PodAffinity", _TERMS),
            "podAntiAffinity": _affinity("PodAntiAffinity", _TERMS),
        }),
        "resources": _RESOURCES,
        "securityContext": Obj("an object (a PodSecurityContext)"),
        "enableServiceLinks": Flag(),
        "automountServiceAccountToken": Flag(),
    },
)


@dataclasses.dataclass(frozen=True)
class ShapeError:
    """A value of another shape than Kubernetes' at a key the operator merges or reads."""

    path: str
    """From the pod spec, as the apiserver writes it: `containers`, `containers[0].env`."""
    field: str
    """The field `kubectl explain pod.spec.<field>` describes: `containers.env`."""
    expected: str
    got: str

    @property
    def message(self) -> str:
        return f"must be {self.expected}, got {self.got}; write it as `kubectl explain pod.spec.{self.field}` describes"


@dataclasses.dataclass(frozen=True)
class NullOverride:
    """A null at a key a template merges onto the pod, where it would replace what the pod has there."""

    path: str
    """From the pod spec, as the apiserver writes it: `tolerations`, `containers[0].env`."""
    what: str
    """The key, as `kubectl explain pod.spec.<what>` names it: `containers.env`, `nodeSelector.pool`."""
    merge: str
    """How a value there merges, and so what to do instead."""

    @property
    def message(self) -> str:
        return (f"remove the key: null would replace any {self.what} the pod has from the operator or "
                f"spec.podTemplate; {self.merge}")


PodSpecError: TypeAlias = ShapeError | NullOverride


def shape_errors(pod: Mapping[str, Any]) -> list[PodSpecError]:
    """Each key of `pod` (a partial pod spec) that has another shape than `POD_SPEC` gives it, or that is null
    where the template merges onto the pod."""
    return list(_walk(POD_SPEC, pod, "", "", merged=True))


def _merge(shape: Shape) -> str:
    """How a template's value of `shape` merges onto the pod's, ending in what to do instead of a null."""
    keep = "so leave the key out to keep the pod's"
    if isinstance(shape, Items) and shape.by_name:
        return f"the template's {shape.noun.split(' (')[0]} merge into the pod's by name, {keep}"
    if isinstance(shape, Items):
        return f"the template's lists are appended, {keep}"
    if isinstance(shape, Obj):
        return f"the template's objects merge key by key, {keep}"
    return f"write {shape.expected} to change it, or leave the key out to keep the pod's"


def _walk(shape: Shape, value: Any, path: str, field: str, *, merged: bool) -> Iterator[PodSpecError]:
    """`path` is where `value` is, `field` the key of the table it is checked against; `merged`, whether
    `value` merges onto the pod's value at `path` rather than being added beside it."""
    if isinstance(shape, Text):
        if not isinstance(value, str):
            yield ShapeError(path, field, shape.expected, _kind(value))
        elif not shape.min_length <= len(value) <= shape.max_length:
            yield ShapeError(path, field, shape.expected, f"{len(value)} characters")
    elif isinstance(shape, Flag):
        if not isinstance(value, bool):
            yield ShapeError(path, field, shape.expected, _kind(value))
    elif isinstance(shape, Items):
        if not isinstance(value, list):
            yield ShapeError(path, field, shape.expected, _kind(value))
        elif len(value) > shape.max_items:
            yield ShapeError(path, field, f"a list of at most {shape.max_items} {shape.noun}", str(len(value)))
        else:
            for index, item in enumerate(value):
                yield from _walk(shape.item, item, f"{path}[{index}]", field, merged=merged and shape.by_name)
    elif not isinstance(value, Mapping):
        yield ShapeError(path, field, shape.expected, _kind(value))
    else:
        for key in shape.required:
            if value.get(key) is None:
                yield ShapeError(_join(path, key), _join(field, key), shape.fields[key].expected, "nothing")
        for key, sub in shape.fields.items():
            if value.get(key) is not None:
                yield from _walk(sub, value[key], _join(path, key), _join(field, key), merged=merged)
            elif merged and key in value and key not in shape.required:
                yield NullOverride(_join(path, key), _join(field, key), _merge(sub))
        if shape.values is not None:
            for key, item in value.items():
                if item is not None:
                    yield from _walk(shape.values, item, _join(path, key), field, merged=merged)
                elif merged:
                    yield NullOverride(_join(path, key), _join(field, key), _merge(shape.values))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return "an object"


def schema(shape: Shape, description: str) -> dict[str, Any]:
    """`shape` as a structural OpenAPI node; objects keep the keys the table does not name."""
    node: dict[str, Any] = {"description": description}
    if isinstance(shape, Text):
        node.update(type="string", maxLength=shape.max_length)
        if shape.min_length:
            node["minLength"] = shape.min_length
    elif isinstance(shape, Flag):
        node["type"] = "boolean"
    elif isinstance(shape, Items):
        node.update(type="array", maxItems=shape.max_items, items=schema(shape.item, _sentence(shape.item.expected)))
    else:
        node["type"] = "object"
        if shape.fields:
            node["properties"] = properties(shape)
        if shape.required:
            node["required"] = list(shape.required)
        if shape.values is not None:
            node["additionalProperties"] = {**schema(shape.values, _sentence(shape.values.expected)), "nullable": True}
        else:
            node["x-kubernetes-preserve-unknown-fields"] = True
    return node


def properties(shape: Obj) -> dict[str, Any]:
    """The structural nodes of `shape`'s keys; a key that may be left out may also be null, so that the
    apiserver keeps a null as written (the model refuses one where it would replace the pod's value)."""
    out = {key: schema(sub, _sentence(sub.expected)) for key, sub in shape.fields.items()}
    for key in shape.fields.keys() - set(shape.required):
        out[key]["nullable"] = True
    return out


def _sentence(expected: str) -> str:
    return f"{expected[0].upper()}{expected[1:]}."
