"""The HybridServing API, v1alpha1: the one source of truth for the CRD.

`crds/` and the chart's copy are generated from these models (see `api.crd`); CEL rules sit
next to the fields they guard (`x-kubernetes-validations` in `json_schema_extra`), so the
apiserver rejects at admission what CEL can express and `core.layout` reports the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from hybridserving.api.base import ApiModel, FieldInvalid, Format, cel
from hybridserving.api.pods import (
    ANNOTATION_KEY,
    LABEL_VALUE,
    QUANTITY,
    EnvFromSource,
    EnvVarSource,
    ExtendedResource,
    ExtendedResourceOrEmpty,
    GangSpec,
    LabelKey,
    PodTemplate,
    check_key,
    is_quantity,
    quantity_error,
    resource_name_error,
    requests_vs_limits,
)
from hybridserving.api.weights import URI_MAX_LENGTH, WeightsCache, WeightsSpec
from hybridserving.api.profiles import ModelArchitecture, resolve_profile

GROUP = "hybridserving.io"
VERSION = "v1alpha1"
KIND = "HybridServing"
PLURAL = "hybridservings"
INSTANCE_KIND = "HybridServingInstance"
INSTANCE_PLURAL = "hybridservinginstances"

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


# --------------------------------------------------------------------------- model / engine


class ModelSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.profile) != has(self.architecture)",
                    "set exactly one of model.profile (a built-in profile) or model.architecture "
                    "(a custom architecture)",
                )
            ]
        }
    )

    path: str = Field(
        min_length=1,
        max_length=512,
        description="Model path or hub id passed to the engine as --model-path.",
    )
    profile: str | None = Field(
        default=None,
        max_length=64,
        description="Built-in profile: kimi-k3, glm-5.2, glm-5.3, deepseek-v3, deepseek-v3.2.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None, description="A custom architecture, when no built-in profile fits."
    )
    served_model_name: str | None = Field(default=None, max_length=256, description="--served-model-name.")
    weights: WeightsSpec | None = Field(
        default=None,
        description="Where the weights come from (hub, PVC, node-local cache, OCI image); unset: the engine "
        "reads model.path itself.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        # Mirrors the CEL rule so that the CLI refuses what admission refuses.
        if (self.profile is None) == (self.architecture is None):
            raise ValueError(
                "set exactly one of model.profile (a built-in profile) or model.architecture (a custom architecture)"
            )
        return self


ENV_VAR_NAME = Format("^[A-Za-z_][A-Za-z0-9_]*$", "an environment variable name",
                      "letters, digits and '_', not a digit first, e.g. HF_HOME")
EnvVarName = Annotated[str, Field(min_length=1, max_length=256), ENV_VAR_NAME]


class EnvVar(ApiModel):
    """One environment variable of the engine container, as in a Pod: a value, or valueFrom a
    Secret key, a ConfigMap key or a pod field."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", "valueFrom")
            ]
        }
    )

    name: EnvVarName = Field(description="Variable name (letters, digits, '_'; not a digit first).")
    value: str | None = Field(default=None, max_length=4096,
                              description="The value as written; neither value nor valueFrom set: empty.")
    value_from: EnvVarSource | None = Field(
        default=None, description="From a Secret key, a ConfigMap key or a pod field (Kubernetes' valueFrom)."
    )

    @model_validator(mode="after")
    def _one_value(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        return self

    @property
    def plain_value(self) -> str | None:
        """What the container sees, where the spec alone says it (empty when neither is set, as in
        Kubernetes); None for valueFrom, which only the kubelet resolves."""
        return None if self.value_from is not None else self.value or ""

    def to_pod(self) -> dict[str, Any]:
        """The container env entry."""
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": self.value_from.to_wire()}
        return {"name": self.name, "value": self.plain_value}


DEFAULT_ENGINE_IMAGE = "hybridserving/engine:0.1.0-sglang0.5.23"
"""The engine image built from images/engine/Dockerfile for this release; the chart's
`engineImage` value overrides it for every fleet that names none."""


DEFAULT_ROUTER_IMAGE = "lightseekorg/smg:1.13.0"
"""The smg release this operator's router flags and service discovery are written for; the
chart's `routerImage` value overrides it for every fleet that names none (a registry mirror)."""


SGLANG_VERSION = Format("^[0-9]+[.][0-9]+[.][0-9]+([.-][0-9A-Za-z.]+)?$", "an SGLang release",
                        "major.minor.patch, then optionally '.' or '-' and a suffix, e.g. 0.5.23 or 0.5.23.post1")
SglangVersion = Annotated[str, Field(max_length=64), SGLANG_VERSION]


# An image reference has no whitespace (the apiserver refuses one with spaces around it, and a pod
# the apiserver refuses is found only once a rollout has deleted the pod it replaces); nor is it empty.
ENGINE_IMAGE = Format(r"^[^\t\n\f\r ]+$", "an image reference", "a name without spaces, tagged or by digest, e.g. "
                      "registry.example/hybridserving/engine:0.1.1-sglang0.5.23 (leave engine.image out for the "
                      "operator's default)")


class EngineSpec(ApiModel):
    image: Annotated[str, Field(max_length=512), ENGINE_IMAGE] | None = Field(
        default=None,
        description="Engine image: SGLang plus the hybridserving-engine launcher (images/engine/Dockerfile); "
        "pin it by tag or digest. Unset: the operator's default engine image (chart value engineImage), so "
        "the platform team pins one image for every fleet that names none.",
    )
    sglang_version: SglangVersion = Field(
        default="0.5.23",
        description="SGLang version inside the image; layout rules that depend on the engine "
        "build key on it.",
    )
    capabilities: list[Literal["prefill-cp-dcp-reshard", "dsa-dcp-pd"]] = Field(
        default_factory=list,
        max_length=8,
        description="Extra capabilities of a custom engine build: prefill-cp-dcp-reshard (prefill "
        "CP layer-split feeding DCP decode through the 2D reshard), dsa-dcp-pd (DSA models with "
        "dcp > 1 in PD mode).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("capabilities")
    @classmethod
    def _a_set(cls, values: list[str]) -> list[str]:
        """A list-type set, as the apiserver checks one: an item given twice is refused, not merged."""
        for index, value in enumerate(values):
            if value in values[:index]:
                raise FieldInvalid(index, f'Duplicate value: "{value}"')
        return values
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra SGLang flags appended to both roles' argv (validated by the engine's parser).",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment for the engine.")
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=16, description="All keys of Secrets or ConfigMaps as engine environment."
    )


GpuTypeName = Literal["H100", "H200", "H20", "B200", "B300", "GB200", "GB300"]


@dataclass(frozen=True)
class GpuType:
    """What the operator knows of a GPU: its memory, the CUDA compute capability SGLang's backend
    checks read (`utils/common.py:297-313`: Blackwell is major 10-12, SM100 is major 10), and the two
    figures the performance model scales its timings by (`core.perfmodel`): prefill is compute-bound
    (dense FP8 throughput), decode reads KV and expert weights (HBM bandwidth)."""

    memory_gib: float
    compute_capability_major: int
    hbm_tb_per_s: float
    fp8_dense_tflops: float

    @property
    def architecture(self) -> str:
        return {9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell"}.get(
            self.compute_capability_major, "other")


# Vendor datasheets, per GPU (memory as the vendor lists it, the examples' convention; gpuMemoryGib
# overrides it). FP8 dense is half the "with sparsity" figure the sheets lead with. H100 SXM: 80 GB
# HBM3, 3.35 TB/s, FP8 3,958 TFLOPS sparse. H200 SXM: 141 GB HBM3e, 4.8 TB/s, the H100's compute.
# H20: 96 GB HBM3, 4.0 TB/s, FP8 296 TFLOPS dense. HGX B200 and HGX B300: 180 and 288 GB HBM3e,
# 8 TB/s, FP8 72 PFLOPS sparse per 8 GPUs (4.5 PFLOPS dense each). GB200 and GB300 NVL72: 186 and
# 288 GB, 576 TB/s and FP8 720 PFLOPS sparse per 72 GPUs (8 TB/s, 5 PFLOPS dense each).
GPU_TYPES: dict[str, GpuType] = {
    "H100": GpuType(80.0, 9, hbm_tb_per_s=3.35, fp8_dense_tflops=1979.0),
    "H200": GpuType(141.0, 9, hbm_tb_per_s=4.8, fp8_dense_tflops=1979.0),
    "H20": GpuType(96.0, 9, hbm_tb_per_s=4.0, fp8_dense_tflops=296.0),
    "B200": GpuType(180.0, 10, hbm_tb_per_s=8.0, fp8_dense_tflops=4500.0),
    "B300": GpuType(288.0, 10, hbm_tb_per_s=8.0, fp8_dense_tflops=4500.0),
    "GB200": GpuType(186.0, 10, hbm_tb_per_s=8.0, fp8_dense_tflops=5000.0),
    "GB300": GpuType(288.0, 10, hbm_tb_per_s=8.0, fp8_dense_tflops=5000.0),
}
DEFAULT_GPU_TYPE: GpuTypeName = "H200"
"""What a fleet that names no gpuType is sized and timed as."""


class HardwareSpec(ApiModel):
    gpus_per_node: int = Field(default=8, ge=1, le=72, description="GPUs on each node an instance uses.")
    gpu_type: GpuTypeName | None = Field(
        default=None,
        description="The GPU model: gives the memory and the architecture the engine's backend checks need "
        "(Kimi K3 decode context parallelism, for one, runs only on Blackwell), and the compute and memory "
        "bandwidth the role-switch policy times prefill and decode by; unset: timed as an H200.",
    )
    gpu_memory_gib: float | None = Field(
        default=None, gt=0, le=4096,
        description="Memory of one GPU in GiB; default: the gpuType's, else 141 (H200).",
    )
    gpu_resource_name: ExtendedResource = Field(
        default="nvidia.com/gpu",
        description="Extended resource of GPUs, as the device plugin advertises it (nvidia.com/gpu, amd.com/gpu).",
    )

    @property
    def memory_gib(self) -> float:
        """Memory of one GPU: as declared, else the gpuType's, else an H200's. A property, not a
        filled-in field, so the stored object stays what the apiserver's defaulting makes of it."""
        if self.gpu_memory_gib is not None:
            return self.gpu_memory_gib
        return GPU_TYPES[self.assumed_gpu_type].memory_gib

    @property
    def gpu(self) -> GpuType | None:
        """The declared GPU model, None when only its memory is given."""
        return GPU_TYPES[self.gpu_type] if self.gpu_type else None

    @property
    def assumed_gpu_type(self) -> GpuTypeName:
        """The GPU model the fleet is timed as: the declared one, else an H200, whose memory an
        unnamed fleet is sized with; `gpuMemoryGib` alone sets the memory, not the speed."""
        return self.gpu_type or DEFAULT_GPU_TYPE


# --------------------------------------------------------------------------- per-role layout


class LayoutSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.tp % self.dcp == 0",
                    "dcp must divide tp (SGLang builds DCP groups by chunking each TP group); "
                    "choose dcp among the divisors of tp",
                    "dcp",
                ),
                cel(
                    "self.attnCp == 1 || has(self.cpStrategy)",
                    "attnCp > 1 needs cpStrategy: zigzag or interleave",
                    "cpStrategy",
                    "FieldValueRequired",
                ),
                cel(
                    "self.tp % (self.attnDp * self.attnCp) == 0",
                    "attnDp * attnCp must divide tp",
                    "attnCp",
                ),
                cel(
                    "!(self.dcp > 1 && self.attnCp > 1)",
                    "SGLang rejects decode context parallelism (dcp > 1) together with prefill "
                    "context parallelism (attnCp > 1) on one server; use attnCp on prefill and dcp on decode",
                    "dcp",
                ),
                cel(
                    "!self.layerSplit || (self.attnCp > 1 && has(self.cpStrategy) && self.cpStrategy == 'interleave')",
                    "layerSplit needs attnCp > 1 with cpStrategy: interleave",
                    "layerSplit",
                ),
                cel(
                    "!has(self.dcpCommBackend) || self.dcpCommBackend == 'ag_rs' || self.dcp > 1",
                    "dcpCommBackend a2a and fi_a2a need dcp > 1",
                    "dcpCommBackend",
                ),
                cel(
                    "!has(self.replicateQProj) || !self.replicateQProj || self.dcp > 1",
                    "replicateQProj needs dcp > 1",
                    "replicateQProj",
                ),
            ]
        }
    )

    tp: int = Field(default=1, ge=1, le=1024, description="Tensor parallel size (--tp-size).")
    pp: int = Field(default=1, ge=1, le=64, description="Pipeline parallel size (--pp-size).")
    attn_dp: int = Field(default=1, ge=1, le=1024, description="Attention data parallel size (--attn-dp-size).")
    attn_cp: int = Field(default=1, ge=1, le=1024, description="Prefill context parallel size (--attn-cp-size).")
    cp_strategy: Literal["zigzag", "interleave"] | None = Field(
        default=None, description="Prefill CP split: zigzag (regular attention) or interleave (sparse/DSA)."
    )
    layer_split: bool = Field(
        default=False,
        description="After prefill CP, each rank keeps only its layer range's KV "
        "(--enable-dsa-cache-layer-split); feeds the 2D reshard.",
    )
    dcp: int = Field(default=1, ge=1, le=1024, description="Decode context parallel size (--dcp-size).")
    dcp_comm_backend: Literal["a2a", "ag_rs", "fi_a2a"] | None = Field(
        default=None, description="DCP collective backend; unset lets the engine choose."
    )
    replicate_q_proj: bool | None = Field(
        default=None, description="Replicate the query projection under DCP (--dcp-replicate-q-proj)."
    )
    ep: int = Field(default=1, ge=1, le=1024, description="Expert parallel size (--ep-size).")
    moe_a2a_backend: Literal["none", "deepep", "mooncake", "nixl", "mori", "flashinfer"] | None = Field(
        default=None,
        alias="moeA2aBackend",
        description="MoE all-to-all backend (--moe-a2a-backend) when ep > 1.",
    )

    @property
    def world_size(self) -> int:
        """GPUs of one instance: attention DP and CP subdivide TP, EP reuses the same ranks."""
        return self.tp * self.pp


class SpeculativeSpec(ApiModel):
    # The EAGLE family's draft shape is given whole or left to the engine (core.layout
    # speculative-params-together cites the engine lines); NGRAM reads none of it.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.algorithm == 'NGRAM' || has(self.numSteps) || "
                    "(!has(self.eagleTopk) && !has(self.numDraftTokens))",
                    "eagleTopk and numDraftTokens need numSteps: without it the engine picks all three and fails "
                    "at startup when only some are set; set numSteps as well, or remove eagleTopk and "
                    "numDraftTokens",
                    "numSteps",
                ),
                cel(
                    "self.algorithm == 'NGRAM' || !has(self.numSteps) || has(self.eagleTopk)",
                    "numSteps needs eagleTopk: the engine fails at startup without a draft width; set eagleTopk "
                    "(1 drafts a chain), or remove numSteps",
                    "eagleTopk",
                ),
            ]
        }
    )

    algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] = Field(
        description="--speculative-algorithm; EAGLE/NEXTN reuse the model's MTP layer."
    )
    num_steps: int | None = Field(
        default=None, ge=1, le=64,
        description="Draft steps before each verification (--speculative-num-steps); unset: SGLang picks it for "
        "the model.")
    eagle_topk: int | None = Field(
        default=None, ge=1, le=64,
        description="Candidates kept per draft step, the draft tree's width (--speculative-eagle-topk); unset: "
        "SGLang picks it for the model.")
    num_draft_tokens: int | None = Field(
        default=None, ge=1, le=256,
        description="Draft tokens the model verifies at once (--speculative-num-draft-tokens); unset: SGLang picks "
        "it for the model.")
    draft_model_path: str | None = Field(
        default=None, max_length=512,
        description="Path or hub id of a separate draft model (--speculative-draft-model-path); unset where the "
        "model drafts with its own MTP layer (NEXTN) or the algorithm needs no model (NGRAM).")


class RoleSpec(ApiModel):
    replicas: int = Field(
        default=1, ge=0, le=1024,
        description="Engine instances of this role. With roleSwitch.enabled it is the role's declared share of the "
        "fleet: the controller moves instances away from it under pressure and back to it once no role has been "
        "under pressure for a cooldown.",
    )  # fmt: skip
    nodes_per_instance: int = Field(default=1, ge=1, le=64, description="Nodes (pods) one instance spans.")
    layout: LayoutSpec = Field(default_factory=LayoutSpec,
                               description="How one instance splits the model over its GPUs: tp, pp, attention "
                               "dp and cp, dcp, ep.")
    speculative: SpeculativeSpec | None = Field(default=None, description="Speculative decoding.")
    mem_fraction_static: float | None = Field(
        default=None, gt=0, lt=1, description="Fraction of GPU memory for weights and KV pool (--mem-fraction-static)."
    )
    max_running_requests: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="Most requests one instance runs at once (--max-running-requests); unset: SGLang sizes it from "
        "the KV pool and the speculative settings.")
    page_size: int | None = Field(default=None, ge=1, le=4096, description="KV page size in tokens.")
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "fp8_e5m2", "bf16"] = Field(
        default="fp8_e4m3",
        description="KV cache dtype; capacity counts 1 byte for fp8, 2 for bf16 and for auto (a DSA model's auto "
        "is FP8 on Blackwell).",
    )
    prefix_caching: bool = Field(
        default=True,
        description="Keep the radix prefix cache on (prefill); off silently loses shared-prefix hits.",
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Partial pod template for this role's pods, merged after spec.podTemplate. A pod spec that "
        "differs between roles makes a switched instance roll onto new pods.",
    )

    @property
    def gpus_per_pod(self) -> int:
        """GPUs one pod requests: an instance's GPUs spread evenly over its nodes, one pod each."""
        return max(1, self.layout.world_size // self.nodes_per_instance)


# --------------------------------------------------------------------------- fleet-wide


class TransferSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.rdmaResourceCount == 0 || size(self.rdmaResourceName) > 0",
                    "rdmaResourceName is required when rdmaResourceCount > 0",
                    "rdmaResourceName",
                ),
                cel(
                    "!has(self.ibDevicesPerGpu) || size(self.ibDevices) % self.ibDevicesPerGpu == 0",
                    "ibDevicesPerGpu splits ibDevices into equal per-GPU groups: list ibDevicesPerGpu "
                    "devices for every GPU, in GPU order",
                    "ibDevices",
                ),
            ]
        }
    )

    backend: Literal["mooncake", "nixl"] = Field(
        default="mooncake", description="KV transfer engine; in-place role switch needs mooncake."
    )
    ib_devices: list[Annotated[str, Field(max_length=64, description="An RDMA device, e.g. mlx5_0.")]] = Field(
        default_factory=list,
        max_length=64,
        description="RDMA devices in GPU order (--disaggregation-ib-device); empty lets the engine detect them.",
    )
    ib_devices_per_gpu: int | None = Field(
        default=None,
        ge=1,
        le=8,
        description="Give each GPU its own RDMA devices: GPU g of a pod uses ibDevices[g*n .. g*n+n-1] "
        "(rendered as SGLang's per-GPU map). Unset: every GPU may use every listed device; "
        "ignored while ibDevices is empty (the engine detects devices).",
    )
    rdma_resource_name: ExtendedResourceOrEmpty = Field(
        default="rdma/ib",
        description="Extended resource for RDMA devices, as the device plugin advertises it; empty for none.",
    )
    rdma_resource_count: int = Field(default=0, ge=0, le=64, description="RDMA resources requested per pod.")
    bootstrap_port: int = Field(default=8998, ge=1024, le=65535, description="Prefill bootstrap port.")


class NetworkSpec(ApiModel):
    host_network: bool = Field(
        default=False,
        description="Run engine pods on the host network (RDMA in most clusters); the operator "
        "then gives co-located instances distinct ports.",
    )
    # Each is a pod's topologyKey: the apiserver refuses a pod whose key is no label key.
    nvlink_domain_key: LabelKey = Field(
        default="hybridserving.io/nvlink-domain",
        description="Node label whose value names an NVLink domain; all pods of an instance share one value.",
    )
    rdma_fabric_key: LabelKey = Field(
        default="hybridserving.io/rdma-fabric",
        description="Node label whose value names an RDMA fabric; prefill and decode share one value.",
    )
    rack_key: LabelKey = Field(default="hybridserving.io/rack", description="Node label of the rack.")
    spread_across_racks: bool = Field(default=False, description="Spread instances of a role across racks.")


def _int_or_string(value: object) -> int | str:
    """What the apiserver admits where a Pod takes a quantity: a whole number or a string; one
    error naming the field, where a plain `int | str` would give one per member of the union."""
    if isinstance(value, str) and len(value) <= 64 or isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{value!r} is not a whole number or a string of at most 64 characters; "
                     'write a fraction as a string, e.g. "500m" or "0.5"')


# A whole number or a string, as in a Pod's resources (`cpu: 4` or `cpu: "500m"`).
Quantity = Annotated[
    int | str,
    PlainValidator(_int_or_string),
    # CEL sees an int-or-string as either type: the rule reads a string only.
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "minimum": 0, "maxLength": 64,
                    "pattern": QUANTITY.pattern,
                    "x-kubernetes-validations": [
                        cel(f"type(self) == int || {QUANTITY.condition()}", QUANTITY.message)]}),
]


class Resources(ApiModel):
    # The apiserver refuses a Deployment whose requests exceed its limits; refused here, the fleet's
    # spec is, rather than its router, which would otherwise never be created.
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra={
            "x-kubernetes-validations": [
                # A quantity is written as an integer or a string; string() reads either.
                cel("self.requests.all(k, !(k in self.limits) || !isQuantity(string(self.requests[k])) || "
                    "!isQuantity(string(self.limits[k])) || "
                    "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
                    "a request is more than its limit: lower requests or raise limits", "requests"),
            ]
        },
    )

    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16,
        description="What the scheduler reserves per replica, e.g. cpu: 1, memory: 1Gi; at most the limit.")
    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="The most a replica may use, e.g. memory: 4Gi (a replica "
        "over its memory limit is OOM-killed).")

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, values: dict[str, int | str]) -> dict[str, int | str]:
        for resource, value in values.items():
            if (wrong := resource_name_error(resource)) is not None:
                raise FieldInvalid(resource, wrong)
            if not is_quantity(value):
                raise FieldInvalid(resource, quantity_error(value))
        return values

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        if breaches := requests_vs_limits(self.to_wire()):
            raise FieldInvalid("requests", "; ".join(f"requests[{b.resource}]: {b.message}; {b.fix}" for b in breaches))
        return self


RouterPolicy = Literal["random", "round_robin", "cache_aware", "power_of_two", "least_load"]

# An image reference has no whitespace; the apiserver refuses a container with an empty image.
ROUTER_IMAGE = Format(r"^[^\t\n\f\r ]+$", "an image reference", "a name without spaces, tagged or by digest, e.g. "
                      "lightseekorg/smg:1.13.0 (leave router.image out for the operator's default)")


# smg's --prometheus-port, which the operator renders for every router (`core.rendering`).
ROUTER_METRICS_PORT = 29000
_ROUTER_PORT_TAKEN = (f"router.port {ROUTER_METRICS_PORT} is the router's metrics port: choose another port "
                      "(the default is 8000)")


class RouterSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [cel(f"self.port != {ROUTER_METRICS_PORT}", _ROUTER_PORT_TAKEN, "port")]
        }
    )

    enabled: bool = Field(default=True, description="Deploy an smg router with Kubernetes service discovery.")
    image: Annotated[str, Field(max_length=512), ROUTER_IMAGE] | None = Field(
        default=None,
        description="smg router image; pin it by tag or digest. Unset: the operator's default router image "
        f"(chart value routerImage, else {DEFAULT_ROUTER_IMAGE}), which moves with the operator's version "
        "and the router flags it renders, and which a platform team points at its registry once for every "
        "fleet that names none.")
    replicas: int = Field(default=1, ge=0, le=64, description="Router replicas; two or more get a PodDisruptionBudget "
                          "and are spread over nodes.")
    resources: Resources = Field(
        default_factory=lambda: Resources(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "4Gi"}),
        description="CPU/memory of each router replica (Kubernetes quantities).",
    )
    port: int = Field(default=8000, ge=1, le=65535,
                      description=f"Router HTTP port (not {ROUTER_METRICS_PORT}, its metrics port).")
    prefill_policy: RouterPolicy = Field(
        default="cache_aware",
        description="How smg picks the prefill worker of a request (--prefill-policy): cache_aware (the worker "
        "holding the longest cached prefix, the least loaded once loads drift apart), power_of_two (the less "
        "loaded of two at random), least_load (the least loaded), round_robin (in turn) or random.")
    decode_policy: RouterPolicy = Field(
        default="power_of_two",
        description="How smg picks the decode worker of a request (--decode-policy), with prefillPolicy's values; "
        "the default, power_of_two, balances load.")

    @model_validator(mode="after")
    def _port_free(self) -> RouterSpec:
        if self.port == ROUTER_METRICS_PORT:
            raise FieldInvalid("port", _ROUTER_PORT_TAKEN)
        return self


class SloSpec(ApiModel):
    ttft_ms: float = Field(default=2000.0, gt=0,
                           description="Time-to-first-token target of prefill, in milliseconds (p90).")
    tpot_ms: float = Field(default=50.0, gt=0,
                           description="Time-per-output-token target of decode, in milliseconds (p90).")


class RoleSwitchSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.maxConcurrent >= 1", "maxConcurrent must be at least 1", "maxConcurrent"),
            ]
        }
    )

    enabled: bool = Field(default=False, description="Move instances between roles as the mix shifts.")
    min_prefill: int = Field(default=1, ge=0, le=1024, description="Never fewer prefill instances than this.")
    min_decode: int = Field(default=1, ge=0, le=1024, description="Never fewer decode instances than this.")
    cooldown_seconds: int = Field(
        default=300, ge=0, le=86400,
        description="Quiet time after a switch: the instance is not moved again within it, and the fleet goes back "
        "to the roles' declared replicas only once no role has been under pressure and nothing has switched for it.",
    )  # fmt: skip
    drain_timeout_seconds: int = Field(default=600, ge=1, le=86400, description="Give up draining after this.")
    max_concurrent: int = Field(default=1, ge=1, le=64, description="Instances switching at once.")
    slo: SloSpec = Field(
        default_factory=SloSpec,
        description="Latency targets the role-switch policy and the built-in scaler measure each role's pressure "
        "against: p90 TTFT for prefill, p90 TPOT for decode.")


class ScalingSpec(ApiModel):
    """The built-in SLO-driven scaler of the fleet's total size (`spec.replicas`).

    HPA and KEDA drive `spec.replicas` through the scale subresource; clusters without them turn
    this on and the operator's own scaler (the role-switch policy's projections, `core.policy.
    FleetScaler`) writes it the same way, within these bounds.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.minReplicas <= self.maxReplicas", "scaling.minReplicas must not exceed scaling.maxReplicas",
                    "minReplicas"),
            ]
        }
    )

    enabled: bool = Field(default=False, description="Let the operator size the fleet from its SLO projections.")
    min_replicas: int = Field(default=2, ge=2, le=1024, description="Never fewer instances in all (both roles).")
    max_replicas: int = Field(default=16, ge=2, le=1024, description="Never more instances in all (both roles).")
    scale_down_delay_seconds: int = Field(
        default=600, ge=0, le=86400, description="A surplus must last this long, and the last scale-up be this old, "
        "before an instance is drained and removed.")
    max_launching: int = Field(default=2, ge=1, le=64, description="Instances starting at once.")


class RolloutSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.maxUnavailable + self.maxSurge >= 1",
                    "maxUnavailable and maxSurge are both 0, so no instance could ever roll: set maxUnavailable: 1 "
                    "(roll one instance of a role at a time) or maxSurge: 1 (start one extra first)",
                    "maxUnavailable"),
            ]
        }
    )

    max_unavailable: int = Field(
        default=1, ge=0, le=1024,
        description="Instances of a role that may be down at once while it rolls, surge instances that serve "
        "already counting as up. 0 (with maxSurge) keeps every role's serving capacity whole. The role's "
        "PodDisruptionBudget allows at least one instance's pods to be evicted, so node drains never block.")
    min_ready_seconds: int = Field(
        default=10, ge=0, le=3600,
        description="How long an instance's pods must have been Ready before the rollout counts it as serving "
        "(a Deployment's minReadySeconds): the next instance rolls, and a surge instance goes, only then. The "
        "router (smg) registers a worker a few seconds after its pod turns Ready; going on at once can leave "
        "it without a worker of a role meanwhile.")
    max_surge: int = Field(
        default=0, ge=0, le=1024,
        description="Extra instances of a role started on the new configuration while that role rolls, on "
        "top of its replicas (they need free GPU nodes). They go once every instance of the role has rolled "
        "and is ready again, and while the rollout is paused or held at its canary.")
    paused: bool = Field(default=False, description="Stop rolling out spec changes (and role switches).")
    canary: int | None = Field(
        default=None, ge=0, le=1024,
        description="Canary: of each role, roll at most this many instances to a new configuration and hold "
        "there (the rest keep serving the previous one) until it is raised or removed. Unset: roll every "
        "instance. Unlike a StatefulSet's partition it counts the instances updated, not those kept.",
    )
    revision_history_limit: int = Field(
        default=10, ge=0, le=1000,
        description="Old configurations kept as ControllerRevisions for `hybridserving rollback`, besides "
        "the ones instances run and the last one that became fully ready.",
    )

    @model_validator(mode="after")
    def _can_roll(self) -> RolloutSpec:
        if self.max_unavailable + self.max_surge < 1:
            raise FieldInvalid(
                "maxUnavailable", "rollout.maxUnavailable and rollout.maxSurge are both 0, so no instance could "
                "ever roll: set maxUnavailable: 1 (roll one instance of a role at a time) or maxSurge: 1 (start one "
                "extra first)")
        return self


class HybridServingSpec(ApiModel):
    """The fleet as it should be: model, engine, hardware, each role's instances and layout, KV
    transfer, network, router, role switching, scaling, rollout and pod templates."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.prefill.layout) || self.prefill.layout.dcp == 1",
                    "prefill.layout.dcp must be 1: decode context parallelism is a decode layout",
                    "prefill.layout.dcp",
                ),
                cel(
                    "!has(self.decode.layout) || self.decode.layout.attnCp == 1",
                    "decode.layout.attnCp must be 1: prefill context parallelism runs on prefill only",
                    "decode.layout.attnCp",
                ),
                # The fleet's instances are spec.replicas when set (what kubectl scale and the scaler
                # drive; the roles' replicas are then only the initial shares), else the roles' sum.
                cel(
                    "!has(self.roleSwitch) || !self.roleSwitch.enabled || "
                    "self.roleSwitch.minPrefill + self.roleSwitch.minDecode <= "
                    "(has(self.replicas) ? self.replicas : self.prefill.replicas + self.decode.replicas)",
                    "roleSwitch.minPrefill + roleSwitch.minDecode exceeds the instances of the fleet",
                    "roleSwitch.minPrefill",
                ),
                cel(
                    "!has(self.replicas) || (has(self.roleSwitch) && self.roleSwitch.enabled)",
                    "replicas (the fleet's total) needs roleSwitch.enabled: true, so that the controller can split "
                    "it between roles; without role switching set prefill.replicas and decode.replicas instead "
                    "and remove replicas (kubectl apply leaves a value the scaler or kubectl scale wrote: "
                    "kubectl patch with --type=json -p '[{\"op\":\"remove\",\"path\":\"/spec/replicas\"}]')",
                    "replicas",
                ),
                cel(
                    "!has(self.replicas) || !has(self.roleSwitch) || "
                    "self.replicas >= self.roleSwitch.minPrefill + self.roleSwitch.minDecode",
                    "replicas is below roleSwitch.minPrefill + roleSwitch.minDecode; raise replicas or lower "
                    "the floors",
                    "replicas",
                ),
                cel(
                    "!has(self.scaling) || !self.scaling.enabled || "
                    "(has(self.roleSwitch) && self.roleSwitch.enabled)",
                    "scaling.enabled needs roleSwitch.enabled: true (the scaler sizes the total, the role-switch "
                    "controller splits it)",
                    "scaling.enabled",
                ),
            ]
        }
    )

    model: ModelSpec = Field(
        description="The model to serve: its path, its architecture (a built-in profile or a custom one) and where "
        "its weights come from.")
    engine: EngineSpec = Field(
        default_factory=EngineSpec,
        description="The engine container: image, SGLang version, extra SGLang flags and environment of both roles.")
    hardware: HardwareSpec = Field(
        default_factory=HardwareSpec,
        description="The GPUs of the nodes instances run on: how many per node, their model and memory.")
    prefill: RoleSpec = Field(
        description="The prefill instances (they compute prompts' KV and hand it to decode): count, size, layout "
        "and engine settings.")
    decode: RoleSpec = Field(
        description="The decode instances (they generate the tokens from prefill's KV): count, size, layout and "
        "engine settings.")
    transfer: TransferSpec = Field(
        default_factory=TransferSpec,
        description="How KV moves from prefill to decode: transfer engine, RDMA devices and resources, bootstrap "
        "port.")
    network: NetworkSpec = Field(
        default_factory=NetworkSpec,
        description="Host networking, and the node labels that place instances (NVLink domain, RDMA fabric, rack).")
    router: RouterSpec = Field(
        default_factory=RouterSpec,
        description="The smg router in front of the fleet: one Deployment per pairing key behind one Service, "
        "finding the engines by their role label.")
    role_switch: RoleSwitchSpec = Field(
        default_factory=RoleSwitchSpec,
        description="Moving instances between prefill and decode as the load shifts: floors, pace, cooldown and "
        "latency targets.")
    replicas: int | None = Field(
        default=None, ge=2, le=1024,
        description="Total instances of the fleet, both roles (the scale subresource: `kubectl scale`, HPA, KEDA). "
        "Needs roleSwitch.enabled: the role-switch controller then owns the split, and prefill.replicas / "
        "decode.replicas give the initial shares. Unset: the fleet has exactly prefill.replicas + decode.replicas.",
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec,
        description="How a spec change reaches the instances: how many of a role at once, surge, canary, pause, and "
        "the revisions kept for rollback.")
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Partial pod template (Kubernetes field names) merged onto every engine pod: tolerations, "
        "nodeSelector, affinity, priorityClassName, schedulerName, imagePullSecrets, resources, labels, "
        "annotations, serviceAccountName, volumes and mounts, runtimeClassName. Fields the operator owns are "
        "refused naming the field.",
    )
    gang: GangSpec = Field(default_factory=GangSpec, description="All-or-nothing admission of an instance's pods.")

    def role(self, role: Role) -> RoleSpec:
        return self.prefill if role == "prefill" else self.decode

    def engine_image(self) -> str:
        """The image engine pods run: the fleet's own, else this release's (a fleet the operator
        reads already carries the operator's default: `core.privileges.with_default_image`)."""
        return self.engine.image or DEFAULT_ENGINE_IMAGE

    def router_image(self) -> str:
        """The image router pods run: the fleet's own, else this release's (a fleet the operator
        reads already carries the operator's default: `core.privileges.with_default_image`)."""
        return self.router.image or DEFAULT_ROUTER_IMAGE

    def total_instances(self) -> int:
        """The fleet's size: `replicas` when something scales it, else the two roles' replicas."""
        return self.replicas if self.replicas is not None else self.prefill.replicas + self.decode.replicas

    def architecture(self) -> ModelArchitecture:
        """The model's figures, from the built-in profile or the custom architecture."""
        if self.model.architecture is not None:
            return self.model.architecture
        assert self.model.profile is not None
        return resolve_profile(self.model.profile)


# --------------------------------------------------------------------------- status

# Bounds of what the operator writes into status, so that the apiserver holds every writer to them.
OBJECT_NAME_MAX_LENGTH = 253
"""An object's name (a DNS subdomain): instances, pods, nodes."""
TIME_MAX_LENGTH = 35
"""An RFC 3339 time: the operator writes `2006-01-02T15:04:05Z` (`core.observed.format_time`); the
bound also holds the longest form Kubernetes writes, to the nanosecond with an offset."""
WEIGHTS_ERRORS_KEPT = 5
"""Download errors `status.weights.errors` keeps, the first nodes' by name."""
WEIGHTS_ERROR_DETAIL = 200
"""Characters of a node's download error kept after `<node>: `."""


# metav1.Condition's grammars: a qualified name as type, a CamelCase word as reason.
CONDITION_TYPE = Format(
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    "a condition type", "an optional DNS subdomain prefix and '/', then letters, digits, '-', '_' or '.' that "
    "start and end with a letter or digit (CamelCase by convention), e.g. Ready")
CONDITION_REASON = Format(
    "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", "a condition reason",
    "a CamelCase word: a letter first, then letters, digits, '_', ',' or ':', not ending in ',' or ':', "
    "e.g. InstancesNotReady")


class Condition(ApiModel):
    """A Kubernetes API convention condition, with metav1.Condition's validation."""

    type: Annotated[str, Field(max_length=316), CONDITION_TYPE] = Field(
        description="type of the condition, in CamelCase (Ready, Progressing, Degraded, ...).",
    )
    status: Literal["True", "False", "Unknown"] = Field(
        description="status: True, False, or Unknown (the operator cannot tell yet, e.g. no valid spec applied).")
    reason: Annotated[str, Field(min_length=1, max_length=1024), CONDITION_REASON] = Field(
        description="reason: a CamelCase word for the last transition, for machines and alerts.",
    )
    message: str = Field(default="", max_length=32768, description="message: the transition in words, for people.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="observedGeneration: the metadata.generation the condition was set for."
    )
    last_transition_time: str = Field(
        max_length=TIME_MAX_LENGTH,
        json_schema_extra={"format": "date-time"},
        description="lastTransitionTime: RFC 3339 time the status last changed.",
    )


class RoleStatus(ApiModel):
    desired: int = Field(default=0, description="Instances the plan has of the role, surge instances included.")
    ready: int = Field(
        default=0, description="Instances of the role whose every pod runs the instance's configuration and is "
        "Ready.")
    updated: int = Field(
        default=0, description="Instances of the role on the update revision whose pods all run it (surge "
        "instances not counted).")
    summary: str = Field(default="0/0", max_length=32, description="ready/desired, for printer columns.")


class InstanceStatus(ApiModel):
    """One instance as the reconcile saw it; its HybridServingInstance's status says more."""

    name: str = Field(max_length=OBJECT_NAME_MAX_LENGTH, description="Name of the HybridServingInstance.")
    role: Role = Field(description="Role the fleet's plan gives the instance (its spec.role).")
    phase: str = Field(max_length=64,
                       description="The instance's phase: Pending, Starting, Stalled, Ready, Unready, Blocked, "
                       "CrashLoop, Draining, Switching, Relaunching or Failed (see the instance's "
                       "status.phase).")
    nodes: list[Annotated[str, Field(max_length=OBJECT_NAME_MAX_LENGTH)]] = Field(
        default_factory=list, max_length=64,
        description="Nodes of the instance's pods, leader first; empty for a pod not scheduled yet.")
    generation: str = Field(
        default="", max_length=63,
        description="configHash of the instance's spec: the configuration its pods should run.")


class CapacityStatus(ApiModel):
    decode_tokens_per_instance: int = Field(
        default=0, description="Tokens of context one decode instance's KV pool holds, computed from the layout, "
        "model and GPU memory (not measured).")
    decode_tokens_total: int = Field(
        default=0, description="decodeTokensPerInstance times the decode instances the plan has.")
    prefill_tokens_per_instance: int = Field(
        default=0, description="Tokens of context one prefill instance's KV pool holds, computed as for decode.")
    bytes_per_token_per_rank: int = Field(
        default=0, description="Bytes one token of context costs each GPU of a decode instance (KV, index and "
        "draft KV).")
    summary: str = Field(default="", description="Human-readable decode KV capacity, or why there is none.")


class SwitchRecord(ApiModel):
    """One role switch, written by the role-switch controller while it runs and once it ended."""

    instance: str = Field(max_length=OBJECT_NAME_MAX_LENGTH, description="The HybridServingInstance that switched.")
    from_role: Role = Field(description="Role it left.")
    to_role: Role = Field(description="Role it switched to.")
    mode: Literal["in-place", "relaunch"] = Field(
        description="in-place: the engine changed role without restarting; relaunch: it restarted with the other "
        "role's flags.")
    reason: str = Field(max_length=512, description="Why: the policy's pressure reading, or an on-call request.")
    outcome: Literal["Succeeded", "Aborted", "Refused", "Failed", "InProgress"] = Field(
        description="Refused: the engine declined the switch (safe to restore) and the instance kept its role."
    )
    started: str = Field(max_length=TIME_MAX_LENGTH, description="When the switch started (RFC 3339).")
    finished: str | None = Field(default=None, max_length=TIME_MAX_LENGTH,
                                 description="When it ended (RFC 3339); unset while in progress.")
    phase: str | None = Field(
        default=None,
        description="The step in progress (Unroute, Drain, Switch, Verify, Route, Restore, Restart); once ended, "
        "the outcome, its message and the seconds each step took.")


class WeightsStatus(ApiModel):
    source: str = Field(default="", max_length=URI_MAX_LENGTH,
                        description="spec.model.weights.uri these figures are for.")
    cache: WeightsCache = Field(
        default="None",
        description="spec.model.weights.cache: None (each engine downloads) or Node (node-local copies, which the "
        "node counts describe).")
    nodes_ready: int = Field(default=0, description="Nodes whose node-local copy is complete.")
    nodes_filling: int = Field(default=0, description="Nodes downloading now.")
    nodes_failed: int = Field(default=0, description="Nodes whose last download failed (pods retry).")
    commits: int = Field(
        default=0, ge=0,
        description="Hub commits the ready nodes' copies hold (0 where the hub named none). More than one: a branch "
        "moved between the nodes' fills and engines run different weights; pin spec.model.weights.revision to a "
        "commit.")
    bytes: int = Field(default=0, description="Size of one complete copy.")
    bytes_done: int | None = Field(
        default=None, ge=0,
        description="Bytes on the nodes so far: a copy per node with the weights plus what each filling node's "
        "download reported. Nodes whose progress is unknown are left out of bytesDone and bytesTotal alike; "
        "unset while no figure is known.")
    bytes_total: int | None = Field(
        default=None, ge=0,
        description="What those nodes hold once complete (one copy each): bytesDone / bytesTotal is the fleet's "
        "download progress.")
    errors: list[Annotated[str, Field(max_length=OBJECT_NAME_MAX_LENGTH + 2 + WEIGHTS_ERROR_DETAIL)]] = Field(
        default_factory=list, max_length=WEIGHTS_ERRORS_KEPT,
        description=f"Last download errors as `<node>: <error>`, of the first {WEIGHTS_ERRORS_KEPT} failed nodes by "
        "name (nodesFailed counts them all).")


class RoleCounts(ApiModel):
    prefill: int = Field(default=0, description="Prefill instances on the update revision (status.prefill.updated).")
    decode: int = Field(default=0, description="Decode instances on the update revision (status.decode.updated).")


class RolloutStatus(ApiModel):
    """Which configurations the fleet runs, as a StatefulSet's currentRevision/updateRevision say it."""

    current_revision: str = Field(
        default="", max_length=253,
        description="ControllerRevision the instances not yet updated run (the update revision once all are).")
    update_revision: str = Field(default="", max_length=253,
                                 description="ControllerRevision of the spec: what the rollout moves to.")
    last_good_revision: str = Field(
        default="", max_length=253,
        description="The last ControllerRevision every instance ran and was ready on: what "
        "`hybridserving rollback` goes back to by default.")
    updated: RoleCounts = Field(default_factory=RoleCounts,
                                description="Instances per role whose spec is the update revision's.")
    held: Literal["", "Canary", "Paused"] = Field(
        default="", description="What holds the rollout short of the update revision; empty when nothing does.")
    message: str = Field(default="", max_length=1024, description="The rollout in words.")
    pairing_keys: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list, max_length=16,
        description="Pairing keys with a router (what prefill and decode must agree on): the spec's first, "
        "then older ones still serving while a change of it rolls.")


class HybridServingStatus(ApiModel):
    """What the operator observed of the fleet, written by its reconcile (status.switches by the
    role-switch controller)."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation of the spec this status was computed for.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="One of each type: LayoutValid, Ready, Progressing, Degraded, RoleSwitching "
        "(`kubectl wait --for=condition=Ready`).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus = Field(default_factory=RoleStatus, description="Prefill instances: desired, ready, updated.")
    decode: RoleStatus = Field(default_factory=RoleStatus, description="Decode instances: desired, ready, updated.")
    instances: list[InstanceStatus] = Field(default_factory=list, max_length=2048,
                                            description="instances: one entry per instance (both roles' replicas).")
    capacity: CapacityStatus = Field(default_factory=CapacityStatus,
                                     description="KV cache capacity the layout gives, per instance and in all.")
    switches: list[SwitchRecord] = Field(default_factory=list, max_length=20,
                                         description="Recent role switches, newest last (the last 20).")
    ready: Literal["True", "False", "Unknown"] = Field(
        default="False", description="Ready condition status, for printer columns.")
    last_progress_time: str | None = Field(
        default=None, max_length=TIME_MAX_LENGTH,
        description="When the fleet last made progress (more instances ready or updated, a rollout "
        "hold lifted, a spec change): the progress deadline counts from here.",
    )
    replicas: int = Field(default=0, description="Instances that exist, both roles (the scale subresource's status).")
    # `hybridserving.io/name=<fleet>,hybridserving.io/component=engine,hybridserving.io/leader=true`: room for
    # any object name.
    selector: str = Field(
        default="", max_length=512,
        description="Label selector of one engine pod per instance, its rank 0 (the scale subresource's, for "
        "HPA's pod metrics).")
    weights: WeightsStatus | None = Field(default=None, description="Where the model weights are, per node.")
    rollout: RolloutStatus | None = Field(default=None, description="Revisions and how far the rollout got.")


class ObjectMeta(ApiModel):
    """The subset of metadata the core reads; the apiserver owns the rest."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str
    namespace: str = "default"
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# A fleet's name is the stem of its children's: Services need a DNS-1035 label (a letter first), and
# "<name>-<index>-<rank>" and "<name>-prefill-config" must stay within 63 characters.
FLEET_NAME_PATTERN = r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?"
_FLEET_NAME_RULE = (
    "must start with a lowercase letter and have at most 40 characters (lowercase letters, digits and '-', "
    "a letter or digit last)"
)
_FLEET_NAME_REASON = (
    "the fleet's Services are named after it and need a DNS-1035 label, and child object names "
    "(<name>-<index>-<rank>, <name>-prefill-config) must stay within 63 characters"
)


# A DNS-1123 label: what the apiserver takes as a namespace's name on every object, and as a
# container's name in a pod.
DNS_LABEL_PATTERN = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_LABEL_RULE = "at most 63 lowercase letters, digits and '-', a letter or digit first and last"
# apimachinery's TotalAnnotationSizeLimitB: an object's annotations, keys and values together.
ANNOTATIONS_MAX_BYTES = 256 * 1024


class FleetMeta(ObjectMeta):
    """A fleet's metadata: its name is checked where it is read, so errors point at metadata.name."""

    @field_validator("namespace")
    @classmethod
    def _namespace_is_dns_1123_label(cls, namespace: str) -> str:
        """The apiserver refuses any other namespace; empty is kubectl's "none given"."""
        if namespace and not re.fullmatch(DNS_LABEL_PATTERN, namespace):
            raise ValueError(f"must have {DNS_LABEL_RULE}, as the apiserver requires; name a namespace such as "
                             "'team-a'")
        return namespace

    @field_validator("labels")
    @classmethod
    def _labels_are_kubernetes_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        """The apiserver checks these itself; checked here too, `validate` fails a manifest the apply would."""
        for key, value in labels.items():
            check_key(key, "label")
            if not LABEL_VALUE.admits(value):
                raise ValueError(f"the value of label {key!r}: {LABEL_VALUE.refusal(value)}")
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotations_are_kubernetes_annotations(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            check_key(key, "annotation", ANNOTATION_KEY)
        size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
        if size > ANNOTATIONS_MAX_BYTES:
            raise ValueError(f"take {size} bytes, keys and values together; the apiserver takes at most "
                             f"{ANNOTATIONS_MAX_BYTES} (256 KiB): move large data to a ConfigMap")
        return annotations

    @field_validator("name")
    @classmethod
    def _name_is_dns_1035_label(cls, name: str) -> str:
        if not re.fullmatch(FLEET_NAME_PATTERN, name):
            raise ValueError(f"{_FLEET_NAME_RULE}: {_FLEET_NAME_REASON}; rename the fleet, e.g. 'fleet-a' "
                             "rather than '1a' or 'fleet.a'")
        return name


class HybridServing(ApiModel):
    """A disaggregated SGLang serving fleet: prefill and decode engine instances, the router in
    front of them, and how they roll out and move between roles."""

    # The name rule, at admission: the apiserver refuses a name the operator could not serve.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.metadata.name.matches('^{FLEET_NAME_PATTERN}$')",
            f"metadata.name {_FLEET_NAME_RULE}: {_FLEET_NAME_REASON}", "metadata.name", "FieldValueInvalid"),
    ]})

    api_version: Literal["hybridserving.io/v1alpha1"] = "hybridserving.io/v1alpha1"
    kind: Literal["HybridServing"] = "HybridServing"
    metadata: FleetMeta
    spec: HybridServingSpec
    status: HybridServingStatus | None = None
