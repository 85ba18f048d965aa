"""Model architectures and the built-in profiles: the per-token and per-request state each model keeps.

They are part of the API: `spec.model.architecture` has this shape and `spec.model.profile` names one
of the built-in profiles, so the core (capacity, layout, performance model) imports them from here.
The operator's capacity model, layout rules and performance model read these figures,
so each one carries its source (the short names stand for the public sources listed in
`docs/performance-model.md`, Sources). Byte figures are for an FP8 KV cache, the layout the
production recipes use; `kvDtype: bf16` doubles the per-token bytes (see capacity).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from hybridserving.api.base import FieldInvalid, cel

AttentionKind = Literal["mla", "mla-dsa", "hybrid-kda-mla"]


class ModelArchitecture(BaseModel):
    """What the engine keeps per token and per request for one model.

    Custom architectures use the same shape as the built-in profiles, so a user serving a
    model the operator does not know can still get exact capacity and layout checks.
    """

    # The layer counts divide the per-token bytes the capacity model plans with: a count the model
    # cannot have would give a pool of zero bytes per token, or more layers than the model has.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.mlaLayers <= self.layers",
                    "mlaLayers counts some of the model's layers: set it to at most layers", "mlaLayers"),
                cel("self.indexerLayers <= self.layers",
                    "indexerLayers counts some of the model's layers: set it to at most layers", "indexerLayers"),
                cel("self.attention != 'mla-dsa' || self.indexerLayers >= 1",
                    "attention mla-dsa keeps a sparse-attention index key: set indexerLayers to the layers that "
                    "run the DSA indexer (at least 1), or use attention: mla", "indexerLayers"),
                cel("self.attention != 'mla-dsa' || self.indexBytesPerTokenLayer >= 1",
                    "attention mla-dsa keeps a sparse-attention index key: set indexBytesPerTokenLayer to its bytes "
                    "per token per indexer layer (at least 1), or use attention: mla", "indexBytesPerTokenLayer"),
            ]
        },
    )

    hf_architecture: str = Field(
        description="The architecture class name of the model's config.json "
        "(e.g. DeepseekV32ForCausalLM); SGLang's model-specific rules key on it.",
        min_length=1,
        max_length=128,
    )
    attention: AttentionKind = Field(
        description="mla: latent KV per token; mla-dsa: latent KV plus a sparse-attention "
        "index key; hybrid-kda-mla: MLA layers plus linear-attention (KDA) layers that keep "
        "a fixed recurrent state per request."
    )
    layers: int = Field(ge=1, le=1024, description="Transformer layers.")
    mla_layers: int = Field(
        ge=1, le=1024, description="Layers that keep a per-token MLA latent (every attention kind has some)."
    )
    kv_bytes_per_token_layer: int = Field(
        ge=1, le=1 << 20, description="Bytes of KV one token keeps in one MLA layer (FP8 cache)."
    )
    indexer_layers: int = Field(default=0, ge=0, le=1024, description="Layers that run the DSA indexer.")
    index_bytes_per_token_layer: int = Field(
        default=0, ge=0, le=1 << 20, description="Bytes of index key one token keeps in one indexer layer."
    )
    recurrent_state_bytes_per_request: int = Field(
        default=0,
        ge=0,
        description="Bytes of linear-attention state one request keeps across all KDA layers "
        "(unsharded); TP shards it, DCP does not.",
    )
    draft_kv_bytes_per_token: int = Field(
        default=0,
        ge=0,
        description="Bytes per token of the EAGLE/MTP draft KV pool (the built-in MTP layer); "
        "the draft pool is not sharded by DCP.",
    )
    weight_bytes: int = Field(ge=1, description="Bytes of weights for the whole model as served.")
    attention_heads: int = Field(ge=1, le=4096, description="Query heads of the attention layers.")
    vision_encoder_heads: int = Field(
        default=0, ge=0, le=4096, description="Heads of the vision encoder; 0 when the model has none."
    )
    experts: int = Field(default=0, ge=0, le=65536, description="Routed experts per MoE layer; 0 for dense.")
    has_mtp: bool = Field(default=False, description="Ships a multi-token-prediction layer usable as EAGLE draft.")
    restart_seconds: float = Field(
        default=780.0,
        ge=0,
        description="Time to relaunch the engine (weights load, graph capture); a relaunch "
        "role switch pays it.",
    )

    @model_validator(mode="after")
    def _layers_fit(self) -> ModelArchitecture:
        # Mirrors the CEL rules so that the CLI refuses what admission refuses.
        if self.mla_layers > self.layers:
            raise FieldInvalid("mlaLayers", f"mlaLayers ({self.mla_layers}) counts some of the model's layers: "
                               f"set it to at most layers ({self.layers})")
        if self.indexer_layers > self.layers:
            raise FieldInvalid("indexerLayers", f"indexerLayers ({self.indexer_layers}) counts some of the model's "
                               f"layers: set it to at most layers ({self.layers})")
        if self.is_dsa and self.indexer_layers < 1:
            raise FieldInvalid("indexerLayers", "attention mla-dsa keeps a sparse-attention index key: set "
                               "indexerLayers to the layers that run the DSA indexer (at least 1), or use "
                               "attention: mla")
        if self.is_dsa and self.index_bytes_per_token_layer < 1:
            raise FieldInvalid("indexBytesPerTokenLayer", "attention mla-dsa keeps a sparse-attention index key: "
                               "set indexBytesPerTokenLayer to its bytes per token per indexer layer (at least 1), "
                               "or use attention: mla")
        return self

    @property
    def kda_layers(self) -> int:
        return self.layers - self.mla_layers if self.attention == "hybrid-kda-mla" else 0

    @property
    def is_dsa(self) -> bool:
        return self.attention == "mla-dsa"

    @property
    def kv_bytes_per_token(self) -> int:
        """E: the latent KV of one token over all MLA layers."""
        return self.mla_layers * self.kv_bytes_per_token_layer

    @property
    def index_bytes_per_token(self) -> int:
        """I: the DSA index key of one token over all indexer layers."""
        return self.indexer_layers * self.index_bytes_per_token_layer


GB = 1_000_000_000

# GLM-5.x and DeepSeek-V3.x: 512 + 64 = 576 B of FP8 latent per token per layer
# (kv_lora_rank + qk_rope_head_dim; Mind Lab 2026, Table 3; Long Context 2026, §1.2).
_LATENT_FP8 = 576

PROFILES: dict[str, ModelArchitecture] = {
    # Long Context 2026, §1.2-1.3, §4.2: 78 layers, 21 run the indexer at 132 B; E = 44,928 B,
    # I = 2,772 B per token.
    # Heads and weights: the public GLM-5 config (64 query heads); NVFP4 weights ~ 420 GB.
    "glm-5.3": ModelArchitecture(
        hf_architecture="GlmMoeDsaForCausalLM",
        attention="mla-dsa",
        layers=78,
        mla_layers=78,
        kv_bytes_per_token_layer=_LATENT_FP8,
        indexer_layers=21,
        index_bytes_per_token_layer=132,
        draft_kv_bytes_per_token=_LATENT_FP8,
        weight_bytes=420 * GB,
        attention_heads=64,
        experts=256,
        has_mtp=True,
    ),
    # Mind Lab 2026: 78 layers of 576 B DSA latent; built-in MTP layer used as EAGLE draft; FP8
    # weights (~750 GB for the 744 B-parameter public checkpoint). Indexer as GLM-5.3 (same
    # family).
    "glm-5.2": ModelArchitecture(
        hf_architecture="GlmMoeDsaForCausalLM",
        attention="mla-dsa",
        layers=78,
        mla_layers=78,
        kv_bytes_per_token_layer=_LATENT_FP8,
        indexer_layers=21,
        index_bytes_per_token_layer=132,
        draft_kv_bytes_per_token=_LATENT_FP8,
        weight_bytes=750 * GB,
        attention_heads=64,
        experts=256,
        has_mtp=True,
    ),
    # DeepSeek-V3 public config: 61 layers, 128 heads, 256 experts, MTP layer, 671 B params in FP8.
    "deepseek-v3": ModelArchitecture(
        hf_architecture="DeepseekV3ForCausalLM",
        attention="mla",
        layers=61,
        mla_layers=61,
        kv_bytes_per_token_layer=_LATENT_FP8,
        draft_kv_bytes_per_token=_LATENT_FP8,
        weight_bytes=671 * GB,
        attention_heads=128,
        experts=256,
        has_mtp=True,
    ),
    # DeepSeek-V3.2 public config: V3 shape plus DSA; index_head_dim 128 in FP8 + 4 B scale = 132 B,
    # every layer runs its indexer.
    "deepseek-v3.2": ModelArchitecture(
        hf_architecture="DeepseekV32ForCausalLM",
        attention="mla-dsa",
        layers=61,
        mla_layers=61,
        kv_bytes_per_token_layer=_LATENT_FP8,
        indexer_layers=61,
        index_bytes_per_token_layer=132,
        draft_kv_bytes_per_token=_LATENT_FP8,
        weight_bytes=671 * GB,
        attention_heads=128,
        experts=256,
        has_mtp=True,
    ),
    # Long Context 2026, §8.3: 93 layers, 24 MLA + 69 KDA. KDA state: 64 heads x 128 x 128 fp32 =
    # 4 MiB per layer per request (512 KB per layer per rank at TP8, the "512 KB per draft step"
    # of Kimi K3 commentary 2026), x 69 layers. With it, DCP8 gains ~7.9x at 1.5 M-token contexts
    # (Kimi K3 commentary 2026). A 12-head vision encoder (the same); INT4 routed experts as in
    # the K2 public checkpoint, ~620 GB of weights.
    "kimi-k3": ModelArchitecture(
        hf_architecture="KimiK3ForConditionalGeneration",
        attention="hybrid-kda-mla",
        layers=93,
        mla_layers=24,
        kv_bytes_per_token_layer=_LATENT_FP8,
        recurrent_state_bytes_per_request=69 * 4 * 1024 * 1024,
        weight_bytes=620 * GB,
        attention_heads=64,
        vision_encoder_heads=12,
        experts=384,
    ),
}


def resolve_profile(name: str) -> ModelArchitecture:
    """Look a profile up by name, with an error that lists what exists."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown model profile {name!r}; known profiles: {known}") from None
