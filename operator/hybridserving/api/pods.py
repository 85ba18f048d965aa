"""The pod surface: partial pod templates, env from Secrets and ConfigMaps, gang admission.

Field names are Kubernetes' own, so a user copies a toleration or a volume from any pod
manifest. The pod spec patch is kept open (unknown fields preserved) because clusters differ
in what they need (tolerations, runtime classes, device plugins' volumes); the keys the
operator merges or reads must have Kubernetes' shape (`api.podshape`, in the model and the
CRD), and the fields the operator owns are refused by CEL at admission where the rule is
static, and by `core.podtemplate.check` (operator, `hybridserving validate`, webhook) for the rest.
"""

from __future__ import annotations

import dataclasses
import math
import re
from decimal import ROUND_CEILING, Decimal
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.config import JsonDict

from hybridserving.api.base import ApiModel, FieldInvalid, Format, cel
from hybridserving.api.podshape import POD_SPEC, properties, shape_errors

# Pod spec fields the operator renders from other parts of the spec: a template setting one
# would silently fight the planner. Each maps to the field that owns it, for the error.
OWNED_POD_SPEC_FIELDS: dict[str, str] = {
    "hostNetwork": "spec.network.hostNetwork",
    "nodeName": "the scheduler (use nodeSelector or affinity)",
    "restartPolicy": "the operator (Always: the launcher supervises the engine)",
    "terminationGracePeriodSeconds": "spec.roleSwitch.drainTimeoutSeconds (plus 30 s to exit)",
    "workloadRef": "spec.gang.mode",
}


def _owned_spec_rules() -> list[JsonDict]:
    return [
        cel(f"!has(self.{field})", f"{field} is set by the operator from {owner}; remove it from the pod template",
            field, "FieldValueForbidden")
        for field, owner in OWNED_POD_SPEC_FIELDS.items()
    ]


# The owned fields' types, so that `kubectl explain` lists them with who sets each.
_OWNED_SPEC_SCHEMAS: dict[str, dict[str, Any]] = {
    "hostNetwork": {"type": "boolean"},
    "nodeName": {"type": "string", "maxLength": 253},
    "restartPolicy": {"type": "string", "maxLength": 16},
    "terminationGracePeriodSeconds": {"type": "integer"},
    "workloadRef": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
}

_POD_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A partial PodSpec (Kubernetes field names) merged onto the operator's pod: scalars "
    "replace, nodeSelector merges by key, lists (tolerations, imagePullSecrets, volumes, initContainers, "
    "topologySpreadConstraints, affinity terms) are appended; a container named `engine` merges into the "
    "engine container (resources, env, envFrom, volumeMounts), any other container is added as a sidecar.",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        **{field: {"description": f"Refused at admission: {OWNED_POD_SPEC_FIELDS[field]} sets it.", **schema}
           for field, schema in _OWNED_SPEC_SCHEMAS.items()},
        **properties(POD_SPEC),
    },
    "x-kubernetes-validations": _owned_spec_rules(),
}


# Kubernetes' own grammars (apimachinery's IsQualifiedName, IsValidLabelValue, resource.Quantity): the
# operator copies these into every pod it creates, so one the apiserver refuses would leave an instance
# that was deleted for a rollout unable to come back. Written without backslashes, so that the same
# text is a Python, an OpenAPI and a CEL regular expression.
_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_SUBDOMAIN = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME_SHAPE = "a name of at most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit"
_LONG_PREFIX = "^[^/]{254,}/"  # a prefix (before a key's one '/') longer than the 253 characters it may have
LABEL_KEY = Format(
    f"^({_SUBDOMAIN}/)?{_NAME}$", "a label key",
    f"an optional DNS subdomain prefix (at most 253 characters) and '/', then {_NAME_SHAPE}, e.g. example.com/team",
    forbids=(_LONG_PREFIX,))
# The apiserver checks annotation keys lowercased, so their prefix may also use capitals.
ANNOTATION_KEY = Format(
    f"^({_SUBDOMAIN.replace('a-z0-9', 'A-Za-z0-9')}/)?{_NAME}$", "an annotation key", LABEL_KEY.shape,
    forbids=(_LONG_PREFIX,))
LABEL_VALUE = Format(
    f"^({_NAME})?$", "a label value",
    "at most 63 letters, digits, '-', '_' or '.' that start and end with a letter or digit (or empty), e.g. ml-infra")
QUANTITY = Format(
    "^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$", "a Kubernetes quantity",
    "a non-negative number with an optional suffix, e.g. 500m, 2, 1.5, 512Mi or 8Gi")
# An extended resource (apimachinery's IsExtendedResourceName, which device plugins must pass to
# register one): a qualified name with a domain, outside kubernetes.io (the native resources' domain),
# and still a qualified name as the quota name "requests.<name>": a domain of at most 244 characters
# that does not itself start with "requests.". A pod that asks for any other resource either is
# refused or waits for a node that can never offer it.
_EXTENDED_RESOURCE_SHAPE = (
    "a DNS subdomain of at most 244 characters, not ending in kubernetes.io nor starting with 'requests.', then "
    f"'/' and {_NAME_SHAPE}, e.g. nvidia.com/gpu or rdma/ib"
)
_NOT_EXTENDED = ("^requests[.]", "kubernetes[.]io/", "^[^/]{245,}/")
EXTENDED_RESOURCE = Format(f"^{_SUBDOMAIN}/{_NAME}$", "a device plugin's resource", _EXTENDED_RESOURCE_SHAPE,
                           forbids=_NOT_EXTENDED)
EXTENDED_RESOURCE_OR_EMPTY = Format(f"^({_SUBDOMAIN}/{_NAME})?$", "empty or a device plugin's resource",
                                    _EXTENDED_RESOURCE_SHAPE, forbids=_NOT_EXTENDED)

LabelKey = Annotated[str, Field(max_length=253), LABEL_KEY]
LabelValue = Annotated[str, Field(max_length=63), LABEL_VALUE]
ExtendedResource = Annotated[str, Field(max_length=253), EXTENDED_RESOURCE]
ExtendedResourceOrEmpty = Annotated[str, Field(max_length=253), EXTENDED_RESOURCE_OR_EMPTY]

# A pod spec is about ten levels deep (affinity terms, projected volumes); far deeper ones cannot be
# serialised for the fleet's revision hash.
MAX_POD_SPEC_DEPTH = 32


def _key_rule(kind: str, key: Format) -> JsonDict:
    return cel(f"self.all(k, {key.condition('k')})", f"every {kind} key must be {key.shape}")


def check_key(key: str, kind: str, grammar: Format = LABEL_KEY) -> None:
    """Raises ValueError, saying how to write one, unless `key` is a `kind` key the apiserver takes."""
    if not grammar.admits(key):
        raise ValueError(f"{kind} key {key!r} must be {grammar.shape}")


def is_quantity(value: object) -> bool:
    """Whether the apiserver reads `value` as a non-negative resource quantity (a string or a plain number)."""
    if isinstance(value, str):
        return QUANTITY.admits(value)
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIX_OF_EXPONENT = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def canonical_quantity(value: int | str) -> str:
    """A quantity as the apiserver stores it in a built-in object (apimachinery's
    `Quantity.String`): `0.5` as `500m`, `1000` as `1k`, `1024Mi` as `1Gi`.

    A Deployment's resources come back in this form, whatever was written; rendering them
    as the user wrote them would read as drift on every pass. Precision below a milli rounds
    up, as the apiserver's defaulting of every resource list does (`SetDefaults_ResourceList`).
    Only quantities `is_quantity` admits are expected.
    """
    text = str(value)
    match = re.fullmatch(QUANTITY.pattern, text)
    if match is None:
        raise ValueError(quantity_error(value))
    suffix = match.group(3) or ""
    if _kept_as_written(match.group(1), suffix):
        return text
    amount, base = _amount(match)
    if amount == 0:
        return "0"
    if base == "binary" and (amount < 1024 or amount != amount.to_integral_value()):
        base = "decimal"  # small or fractional binary amounts read better (and exactly) in decimal
    if base == "binary":
        whole, power = int(amount), 0
        while whole % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            whole, power = whole // 1024, power + 1
        return f"{whole}{_BINARY_SUFFIXES[power]}"
    # An integer mantissa and the exponent, lowered to a multiple of 3 (int64Amount.AsCanonicalBytes).
    sign, digits, exponent = amount.normalize().as_tuple()
    assert isinstance(exponent, int)
    mantissa = int("".join(map(str, digits)))
    shift = exponent % 3
    mantissa, exponent = mantissa * 10 ** shift, exponent - shift
    if base == "decimal" and exponent in _SUFFIX_OF_EXPONENT:
        return f"{mantissa}{_SUFFIX_OF_EXPONENT[exponent]}"
    return f"{mantissa}e{exponent}" if exponent else str(mantissa)


def _amount(match: re.Match[str]) -> tuple[Decimal, str]:
    """The value a matched quantity stands for, rounded up to a milli as the apiserver's defaulting
    does, and the base its suffix counts in (binary, exponent or decimal)."""
    number = Decimal(match.group(1))
    suffix = match.group(3) or ""
    if suffix.endswith("i"):
        amount, base = number * 1024 ** _BINARY_SUFFIXES.index(suffix), "binary"
    elif len(suffix) > 1:  # e3, E-2 (a lone E is exa)
        amount, base = number.scaleb(int(suffix[1:])), "exponent"
    else:
        amount, base = number.scaleb(_DECIMAL_SUFFIXES[suffix]), "decimal"
    exponent = amount.as_tuple().exponent
    assert isinstance(exponent, int), "a matched quantity is finite"
    return (amount.quantize(Decimal("1e-3"), rounding=ROUND_CEILING) if exponent < -3 else amount), base


def quantity_amount(value: int | str) -> Decimal:
    """What a quantity `is_quantity` admits is worth, as the apiserver compares it (`Quantity.Cmp`)."""
    match = re.fullmatch(QUANTITY.pattern, str(value))
    if match is None:
        raise ValueError(quantity_error(value))
    return _amount(match)[0]


def overcommittable(resource: str) -> bool:
    """Whether a request may be below its limit: native resources (no domain, or kubernetes.io's) other
    than huge pages (apimachinery's `IsOvercommitAllowed`). Extended resources such as GPUs are not."""
    return ("/" not in resource or "kubernetes.io/" in resource) and not resource.startswith("hugepages-")


@dataclasses.dataclass(frozen=True)
class LimitBreach:
    """A request the apiserver would refuse against its limit."""

    resource: str
    message: str
    fix: str


def requests_vs_limits(resources: Mapping[str, Any]) -> list[LimitBreach]:
    """Each request the apiserver would refuse against its limit (`ValidateResourceRequirements`): above
    it, or, for a resource that cannot be overcommitted, unequal to it or without one. Values that are
    no quantity are left to the quantity check."""
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    breaches = []
    for resource, request in requests.items():
        limit = limits.get(resource)
        if not is_quantity(request) or limit is not None and not is_quantity(limit):
            continue
        native = overcommittable(resource)
        if limit is None:
            if not native:
                breaches.append(LimitBreach(resource, f"{resource} cannot be overcommitted, so it needs a limit",
                                            f"set its limit to {request}"))
            continue
        asked, most = quantity_amount(request), quantity_amount(limit)
        if not native and asked != most:
            breaches.append(LimitBreach(resource, f"{request} must equal the limit {limit}: {resource} cannot be "
                                        "overcommitted", "set both to the same amount"))
        elif asked > most:
            breaches.append(LimitBreach(resource, f"{request} is more than the limit {limit}",
                                        "lower the request or raise the limit"))
    return breaches


def _kept_as_written(number: str, suffix: str) -> bool:
    """Whether the apiserver keeps the string it parsed (`ParseQuantity`'s fast path: a value
    it deems canonical already, `1E3` and `+1` included), rather than writing it anew; `number`
    and `suffix` are the parts `QUANTITY.pattern` matched, the sign left out."""
    whole, _, denom = number.partition(".")
    num = whole.lstrip("0")
    shifted = num + denom
    if not shifted:
        return False
    if suffix.endswith("i"):
        exponent = 10 * _BINARY_SUFFIXES.index(suffix)
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        return not denom and precision >= 0 and int(num) & 7 != 0
    exponent = int(suffix[1:]) if len(suffix) > 1 else _DECIMAL_SUFFIXES[suffix]
    scale = exponent - len(denom)
    # The resource-list defaulting keeps the string only where rounding to milli changes nothing.
    return (18 - len(shifted) >= 0 and scale >= -3 and scale % 3 == 0
            and not shifted.endswith("000") and shifted[0] != "0")


def quantity_error(value: object, where: str | None = None) -> str:
    return f"{where + ': ' if where else ''}{QUANTITY.refusal(value)}"


class PodTemplateMetadata(ApiModel):
    """Labels and annotations added to the pods, beside the operator's own."""

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra pod labels (keys under hybridserving.io/ are the operator's).",
        json_schema_extra={"x-kubernetes-validations": [_key_rule("label", LABEL_KEY)]},
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra pod annotations (keys under hybridserving.io/ are the operator's).",
        json_schema_extra={"x-kubernetes-validations": [_key_rule("annotation", ANNOTATION_KEY)]},
    )

    @field_validator("labels")
    @classmethod
    def _label_keys_are_qualified_names(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            check_key(key, "label")
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotation_keys_are_qualified_names(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            check_key(key, "annotation", ANNOTATION_KEY)
        return annotations


def _too_deep(value: Any) -> bool:
    """Whether objects and lists nest past MAX_POD_SPEC_DEPTH; iterative, as the input may be hostile."""
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if level > MAX_POD_SPEC_DEPTH:
            return True
        children = node.values() if isinstance(node, Mapping) else node
        stack.extend((child, level + 1) for child in children if isinstance(child, Mapping | list))
    return False


class PodResources(NamedTuple):
    """One `resources` object of a pod spec: the pod's own, or a container's."""

    path: str
    """Where it is, from the pod spec: `resources` or `containers[NAME].resources`."""
    list_name: str | None
    """`containers` or `initContainers`; None for the pod's own."""
    name: str | None
    """The container's name (None for the pod's own)."""
    resources: Mapping[str, Any]


def pod_resources(pod: Mapping[str, Any]) -> Iterator[PodResources]:
    """Every `resources` object of a partial pod spec of `api.podshape`'s shape (`shape_errors` finds
    none: a template's spec once the model admits it), so that quantities and limits are judged per
    object."""
    if (resources := pod.get("resources")) is not None:
        yield PodResources("resources", None, None, resources)
    for list_name in ("initContainers", "containers"):
        for container in pod.get(list_name) or ():
            if (resources := container.get("resources")) is not None:
                name = container["name"]
                yield PodResources(f"{list_name}[{name}].resources", list_name, name, resources)


def resource_name_error(name: str, pod_level: bool = False) -> str | None:
    """Why the apiserver refuses `name` as a resource of a container (or, `pod_level`, of the pod
    itself), or None (`pkg/apis/core/validation/validation.go:7419-7468`,
    `pkg/apis/core/helper/helpers.go:166-201`, `component-helpers/resource/helpers.go:65-69`).
    Caught at admission, as a pod the apiserver refuses would be found only once a rollout has
    deleted the running one it replaces."""
    standard = "cpu, memory or hugepages-<size>" if pod_level else "cpu, memory, ephemeral-storage, hugepages-<size>"
    fix = f"name {standard}" + ("" if pod_level else ", or an extended resource such as nvidia.com/gpu")
    if not LABEL_KEY.admits(name):
        return f"resource name {name!r} must be {LABEL_KEY.shape}: {fix}"
    if pod_level:
        ok = name in ("cpu", "memory") or name.startswith("hugepages-")
        return None if ok else f"resource {name!r} cannot be set for the whole pod: {fix}"
    if "/" not in name:
        ok = name in ("cpu", "memory", "ephemeral-storage") or name.startswith("hugepages-")
        return None if ok else f"resource {name!r} is no standard resource for containers: {fix}"
    if "kubernetes.io/" in name or EXTENDED_RESOURCE.admits(name):
        return None
    return f"resource {name!r} must be {EXTENDED_RESOURCE.shape}"


def _resource_errors(pod: Mapping[str, Any]) -> list[str]:
    """Resource names and quantities of the pod and of its containers that the apiserver would
    refuse; `pod` has `api.podshape`'s shape."""
    errors = []
    for at, list_name, _, resources in pod_resources(pod):
        for section in ("requests", "limits"):
            for resource, value in (resources.get(section) or {}).items():
                if (wrong := resource_name_error(resource, pod_level=list_name is None)) is not None:
                    errors.append(f"{at}.{section}[{resource}]: {wrong}")
                elif not is_quantity(value):
                    errors.append(quantity_error(value, f"{at}.{section}[{resource}]"))
    return errors


class PodTemplate(ApiModel):
    """`metadata` + `spec` of a pod, both partial, merged onto what the operator renders."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata,
                                          description="Labels and annotations added to the pods.")
    spec: Annotated[dict[str, Any], WithJsonSchema(_POD_SPEC_SCHEMA)] = Field(default_factory=dict)

    @field_validator("spec")
    @classmethod
    def _spec_can_be_rendered(cls, spec: dict[str, Any]) -> dict[str, Any]:
        # What a template overrides is `core.podtemplate.check`'s; these would fail later, when the
        # fleet is checked, hashed or its pods are created, rather than at admission.
        if _too_deep(spec):
            raise ValueError(f"the pod spec is nested more than {MAX_POD_SPEC_DEPTH} levels deep; a pod spec needs "
                             "about ten: remove the extra nesting")
        if wrong := shape_errors(spec):
            first, *rest = wrong
            raise FieldInvalid(first.path, "; ".join([first.message, *(f"{e.path}: {e.message}" for e in rest)]))
        if errors := _resource_errors(spec):
            raise ValueError("; ".join(errors))
        return spec


class KeySelector(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="Key inside it.")
    optional: bool | None = Field(
        default=None, description="true: the container starts without the key (the variable is left out); unset "
        "or false: a missing key keeps it from starting (the instance turns Blocked).")


class FieldSelector(ApiModel):
    field_path: str = Field(min_length=1, max_length=256, description="e.g. status.podIP, spec.nodeName.")


class EnvVarSource(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) + "
                    "(has(self.fieldRef) ? 1 : 0) == 1",
                    "valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef"),
            ]
        },
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret in the fleet's namespace.")
    config_map_key_ref: KeySelector | None = Field(
        default=None, description="A key of a ConfigMap in the fleet's namespace.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod (the downward API).")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if sum(x is not None for x in (self.secret_key_ref, self.config_map_key_ref, self.field_ref)) != 1:
            raise ValueError("valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef")
        return self


class LocalRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of the object, in the fleet's namespace.")
    optional: bool | None = Field(
        default=None, description="true: the container starts without it; unset or false: a missing one keeps it "
        "from starting (the instance turns Blocked).")


class EnvFromSource(ApiModel):
    """All keys of a Secret or ConfigMap as environment variables (Kubernetes' envFrom)."""

    prefix: str | None = Field(default=None, max_length=64,
                               description="Put before every key to make the variable's name.")
    secret_ref: LocalRef | None = Field(default=None, description="Secret whose keys become variables.")
    config_map_ref: LocalRef | None = Field(default=None, description="ConfigMap whose keys become variables.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom needs exactly one of secretRef or configMapRef")
        return self


class GangSpec(ApiModel):
    mode: Literal["None", "Workload", "Kueue"] = Field(
        default="None",
        description="How an instance's pods are admitted all-or-nothing. None: one by one (pods of a "
        "multi-node instance may hold GPUs while a peer waits). Workload: a scheduling.k8s.io/v1alpha1 "
        "Workload per instance with a gang policy (kube-scheduler with the GenericWorkload and "
        "GangScheduling feature gates). Kueue: Kueue pod-group labels, admitted as one unit by Kueue.",
    )
    queue_name: str | None = Field(
        default=None, max_length=253, description="Kueue LocalQueue (kueue.x-k8s.io/queue-name); Kueue only."
    )
