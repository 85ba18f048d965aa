"""The pod surface: partial pod templates, env from Secrets and ConfigMaps, gang admission.

Field names are Kubernetes' own, so a user copies a toleration or a volume from any pod
manifest. The pod spec patch is kept open (unknown fields preserved) because clusters differ
in what they need (tolerations, runtime classes, device plugins' volumes); the fields the
operator owns are refused by CEL at admission where the rule is static, and by
`core.podtemplate.check` (operator, `hybridserving validate`, webhook) for the rest.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.config import JsonDict

from hybridserving.api.base import ApiModel, cel

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


_POD_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A partial PodSpec (Kubernetes field names) merged onto the operator's pod: scalars "
    "replace, nodeSelector merges by key, lists (tolerations, imagePullSecrets, volumes, initContainers, "
    "topologySpreadConstraints, affinity terms) are appended; a container named `engine` merges into the "
    "engine container (resources, env, envFrom, volumeMounts), any other container is added as a sidecar.",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "hostNetwork": {"type": "boolean"},
        "nodeName": {"type": "string", "maxLength": 253},
        "restartPolicy": {"type": "string", "maxLength": 16},
        "terminationGracePeriodSeconds": {"type": "integer"},
        "workloadRef": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
    "x-kubernetes-validations": _owned_spec_rules(),
}


class PodTemplateMetadata(ApiModel):
    labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, description="Extra pod labels (keys under hybridserving.io/ are the operator's)."
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, description="Extra pod annotations (keys under hybridserving.io/ are the operator's)."
    )


class PodTemplate(ApiModel):
    """`metadata` + `spec` of a pod, both partial, merged onto what the operator renders."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata)
    spec: Annotated[dict[str, Any], WithJsonSchema(_POD_SPEC_SCHEMA)] = Field(default_factory=dict)


class KeySelector(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="Key inside it.")
    optional: bool | None = None


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

    secret_key_ref: KeySelector | None = None
    config_map_key_ref: KeySelector | None = None
    field_ref: FieldSelector | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if sum(x is not None for x in (self.secret_key_ref, self.config_map_key_ref, self.field_ref)) != 1:
            raise ValueError("valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef")
        return self


class LocalRef(ApiModel):
    name: str = Field(min_length=1, max_length=253)
    optional: bool | None = None


class EnvFromSource(ApiModel):
    """All keys of a Secret or ConfigMap as environment variables (Kubernetes' envFrom)."""

    prefix: str | None = Field(default=None, max_length=64)
    secret_ref: LocalRef | None = None
    config_map_ref: LocalRef | None = None

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
