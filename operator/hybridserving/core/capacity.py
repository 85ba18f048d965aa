"""How much context one engine instance can hold, from the model's profile and the role's layout.

Decode capacity decides how many requests a decode instance can keep resident, so the
operator reports it in status, the role-switch policy budgets with it and the simulators
size their KV pools from it. The arithmetic follows what SGLang allocates on each GPU:

* the MLA latent (E bytes/token) is replicated on every TP rank (heads split, the latent
  does not) and sharded 1/C by decode context parallelism (DCP over C ranks);
* the DSA index key (I bytes/token) is either copied to every DCP rank (SGLang today) or
  split with the cache (I/C), at the price of one more collective per indexer layer;
* the EAGLE/MTP draft pool is sized max_total_num_tokens x dcp_size, so for every logical
  token each DCP rank still holds the draft's full bytes: DCP does not shrink it;
* a linear-attention (KDA) state is one fixed block per request, sharded by the attention
  TP width (feature dimension, tp / (attnDp x attnCp)) and never by DCP: it has no token axis
  to split.

KDA states have a pool of their own, sized at start-up before the MLA pages get the rest
(`state_slots`), so capacity is a frontier over (requests, context length): a number of
requests the state pool caps, and tokens the pages cap. `docs/capacity.md` lists the
published figures these formulas reproduce; `docs/performance-model.md` (Sources) the public
sources the short names in comments stand for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from numpy.typing import ArrayLike

from hybridserving.api.v1alpha1 import HardwareSpec, LayoutSpec, Role, RoleSpec
from hybridserving.core import resolution
from hybridserving.api.profiles import ModelArchitecture

IndexPlacement = Literal["copied", "split"]
KvCacheDtype = Literal["auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16"]

GIB = 1 << 30

# The static fraction of `pool_bytes` when a caller gives none (capacity-gain figures, which have
# no role). An instance's capacity uses SGLang's own per-role computation instead
# (`core.resolution`, mirroring arg_groups/memory_hook.py:281-343) unless the role sets
# memFractionStatic.
DEFAULT_MEM_FRACTION_STATIC = 0.88

# SGLang sizes the pool as `static fraction x GPU memory - memory in use after loading the
# weights`. Besides the weights, that includes the CUDA context, NCCL/communication buffers
# and the request-to-token map, about 2 GiB on a TP8 rank. Activations and CUDA graphs live
# in the (1 - static fraction) the engine keeps outside, so they are not subtracted here.
DEFAULT_RESERVE_BYTES = 2 * GIB

# Bytes per element of the KV cache relative to the profiles, which are written for FP8.
_KV_DTYPE_FACTOR: dict[str, int] = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "bfloat16": 2, "auto": 2}

# DSA's scaled FP8 latent (`mem_cache/kv_cache_configurator.py:3456-3470`): the no-position part in
# FP8 with a 4-byte scale per 128 values (`DSATokenToKVPool.quant_block_size`, memory_pool.py:5280)
# and the rope part (qk_rope_head_dim, 64 in every DSA model) kept in bf16: 512 + 16 + 128 = 656
# bytes where the raw layout keeps 576.
DSA_ROPE_DIM = 64
DSA_QUANT_BLOCK = 128


class CapacityError(ValueError):
    """A layout whose capacity cannot exist (weights do not fit, DCP does not divide the group).

    Carries the spec field to change (a path relative to `spec`, in wire names) and the fix,
    so admission and the LayoutValid condition can point at the exact field.
    """

    def __init__(self, field_path: str, message: str, fix: str) -> None:
        super().__init__(f"{field_path}: {message}; {fix}")
        self.field_path = field_path
        self.message = message
        self.fix = fix


def kv_dtype_factor(kv_cache_dtype: KvCacheDtype) -> int:
    """Multiplier on the profiled (FP8) KV bytes: bf16, and `auto` on a bf16 model, take 2 bytes."""
    return _KV_DTYPE_FACTOR[kv_cache_dtype]


def dsa_scaled_bytes(fp8_bytes: int) -> int:
    """Bytes of one token's latent in one layer on DSA's scaled FP8 layout, from its raw FP8 bytes."""
    latent = fp8_bytes - DSA_ROPE_DIM
    return latent + -(-latent // DSA_QUANT_BLOCK) * 4 + DSA_ROPE_DIM * 2


def keeps_draft_pool(draft: resolution.Draft | None) -> bool:
    """Whether speculative decoding keeps a draft KV pool (NGRAM drafts from text, no KV)."""
    return draft is not None and draft.algorithm != "NGRAM"


@dataclass(frozen=True)
class RankFootprint:
    """What one GPU of an instance stores: bytes per logical token by kind, and per request.

    A "logical token" is a token of context as the user sees it; under DCP it occupies a
    fraction of its KV on each rank, which is what these per-rank figures express.
    """

    kv: float
    index: float
    draft: float
    state: float

    @property
    def per_token(self) -> float:
        """b_rank: bytes one logical token costs this GPU."""
        return self.kv + self.index + self.draft

    def request_bytes(self, context_len: float) -> float:
        """Bytes one request of `context_len` tokens costs this GPU: S_rank + L x b_rank."""
        return self.state + context_len * self.per_token

    def to_dict(self) -> dict[str, float]:
        return {
            "kv": self.kv,
            "index": self.index,
            "draft": self.draft,
            "perToken": self.per_token,
            "statePerRequest": self.state,
        }


def _attention_tp(layout: LayoutSpec, role_name: Role) -> int:
    """The TP width of one attention group; DCP shards the cache inside it (Long Context 2026, §7)."""
    group = layout.attn_dp * layout.attn_cp
    if layout.tp % group:
        raise CapacityError(
            f"{role_name}.layout.attnDp",
            f"attnDp x attnCp = {group} does not divide tp = {layout.tp}",
            f"choose attnDp x attnCp among the divisors of {layout.tp}",
        )
    width = layout.tp // layout.attn_dp
    if width % layout.dcp:
        divisors = [d for d in range(1, width + 1) if width % d == 0]
        raise CapacityError(
            f"{role_name}.layout.dcp",
            f"dcp = {layout.dcp} does not divide the attention TP group of tp / attnDp = {width} ranks",
            f"choose dcp among {divisors}",
        )
    return width


def rank_footprint(
    arch: ModelArchitecture,
    layout: LayoutSpec,
    *,
    index: IndexPlacement = "copied",
    speculative: bool = False,
    kv_cache_dtype: KvCacheDtype = "fp8_e4m3",
    dsa_scaled: bool = False,
    role_name: Role = "decode",
) -> RankFootprint:
    """Per-GPU bytes of one logical token (latent, index, draft) and of one request's KDA state.

    Pipeline stages hold disjoint layer groups, so per-token KV and state divide by pp (an
    even split); the MTP draft layer sits on the last stage whole, so the draft does not.
    The index key and the recurrent state keep their own dtypes (FP8 index, fp32 state),
    so only the latent and the draft scale with the KV cache dtype. `dsa_scaled`: the DSA
    kernels the role resolves to keep the FP8 latent with scales (`resolution.dsa_kv_scaled`),
    the draft layer's too (it is built the same way).
    """
    width = _attention_tp(layout, role_name)
    dtype = kv_dtype_factor(kv_cache_dtype)
    dcp, pp = layout.dcp, layout.pp
    index_shards = dcp if index == "split" else 1
    kv_layer = dsa_scaled_bytes(arch.kv_bytes_per_token_layer) if dsa_scaled else arch.kv_bytes_per_token_layer * dtype
    draft = arch.draft_kv_bytes_per_token * dtype
    if dsa_scaled and arch.draft_kv_bytes_per_token:
        draft = dsa_scaled_bytes(arch.draft_kv_bytes_per_token)
    footprint = RankFootprint(
        kv=arch.mla_layers * kv_layer / (dcp * pp),
        index=arch.index_bytes_per_token / (index_shards * pp),
        draft=draft if speculative else 0.0,
        state=arch.recurrent_state_bytes_per_request / (width // layout.attn_cp * pp),
    )
    if footprint.per_token <= 0:
        # Token counts and gains divide by it: an error the callers report, not a ZeroDivisionError that
        # escapes them (the API refuses such an architecture; this covers one built without it).
        raise CapacityError(
            "model.architecture.mlaLayers",
            "the model keeps no bytes per token of context (mlaLayers x kvBytesPerTokenLayer, the index key "
            "and the draft add up to 0), so no KV capacity can be planned",
            "set model.architecture.mlaLayers and kvBytesPerTokenLayer to the model's figures (each at least 1)",
        )
    return footprint


def _weights_fix(arch: ModelArchitecture, layout: LayoutSpec, room: float, role_name: Role) -> str:
    """The smallest legal TP (same pp, heads divisible by the attention group) whose weight slice fits."""
    gpus = math.floor(arch.weight_bytes / room) + 1
    step = math.lcm(layout.attn_dp * layout.dcp, layout.attn_dp * layout.attn_cp)
    fitting = (
        tp
        for tp in range(step, 1025, step)
        if tp * layout.pp >= gpus and arch.attention_heads % (tp // layout.attn_dp) == 0
    )
    tp = next(fitting, None)
    change = (
        f"set {role_name}.layout.tp to {tp} (with pp = {layout.pp})"
        if tp is not None
        else f"raise {role_name}.layout.pp (no tp that divides {arch.attention_heads} heads is enough)"
    )
    return (
        f"the weights need at least {gpus} GPUs per instance: {change}, use GPUs with more memory, "
        f"or raise {role_name}.memFractionStatic"
    )


def pool_bytes(
    arch: ModelArchitecture,
    layout: LayoutSpec,
    hardware: HardwareSpec,
    *,
    mem_fraction_static: float | None = None,
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
    role_name: Role = "decode",
) -> float:
    """Bytes of the unified KV/state pool on one GPU: static fraction - weight slice - reserve.

    Weights divide over tp x pp GPUs. EP places experts on those same GPUs, so it moves
    bytes between them without changing the per-GPU total this even split assumes.
    """
    fraction = DEFAULT_MEM_FRACTION_STATIC if mem_fraction_static is None else mem_fraction_static
    static = hardware.memory_gib * GIB * fraction
    room = static - reserve_bytes
    if room <= 0:
        raise CapacityError(
            f"{role_name}.memFractionStatic",
            f"{fraction} of {hardware.memory_gib} GiB leaves nothing after the "
            f"{reserve_bytes / GIB:.1f} GiB the engine reserves",
            f"raise {role_name}.memFractionStatic or check hardware.gpuMemoryGib",
        )
    weights = arch.weight_bytes / (layout.tp * layout.pp)
    pool = room - weights
    if pool <= 0:
        raise CapacityError(
            f"{role_name}.layout.tp",
            f"the weights take {weights / GIB:.1f} GiB per GPU at tp x pp = {layout.world_size}, "
            f"but {fraction} of {hardware.memory_gib} GiB less the {reserve_bytes / GIB:.1f} GiB "
            f"reserve leaves {room / GIB:.1f} GiB",
            _weights_fix(arch, layout, room, role_name),
        )
    return pool


@dataclass(frozen=True)
class InstanceCapacity:
    """The per-GPU pool and footprint of one instance: everything the frontier needs."""

    footprint: RankFootprint
    pool_bytes: float
    weight_bytes: float
    mem_fraction_static: float
    reserve_bytes: float
    attn_dp: int
    state_slots: int = 0
    """KDA states one DP attention group holds at once (0: the model keeps none)."""
    draft_states: int = 0
    """States a speculative decode keeps per slot besides its own, one per draft token it verifies."""
    running_cap: int | None = None
    """Most requests one DP attention group runs, when the engine caps them (None: only KV bounds it)."""
    page_size: int = 1
    """Tokens per KV page: each group's pool is a whole number of pages."""

    @property
    def state_bytes(self) -> float:
        """Bytes of the state pool on one GPU: its slots and the padding slot SGLang adds, each with its
        draft-step states (`mem_cache/kv_cache_configurator.py:3336-3344, 3404-3409`)."""
        return (self.state_slots + 1) * self.footprint.state * (1 + self.draft_states) if self.state_slots else 0.0

    @property
    def group_tokens(self) -> int:
        """Logical context tokens one DP attention group's pages hold, after the state pool: whole
        pages, as SGLang aligns the count down to its page size (`model_executor/pool_configurator.py:
        640-653`)."""
        fitting = math.floor((self.pool_bytes - self.state_bytes) / self.footprint.per_token)
        return fitting // self.page_size * self.page_size

    @property
    def tokens(self) -> int:
        """Logical context tokens the instance's pages hold. Each DP attention group keeps its own
        requests, so the groups add up."""
        return self.attn_dp * self.group_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "poolBytesPerRank": self.pool_bytes,
            "weightBytesPerRank": self.weight_bytes,
            "memFractionStatic": self.mem_fraction_static,
            "reserveBytes": self.reserve_bytes,
            "attnDp": self.attn_dp,
            "stateSlotsPerGroup": self.state_slots,
            "draftStatesPerSlot": self.draft_states,
            "runningCapPerGroup": self.running_cap,
            "pageSize": self.page_size,
            "stateBytesPerRank": self.state_bytes,
            "tokensPerInstance": self.tokens,
        }


# SGLang's share of the pool for linear-attention states when it sizes them itself: state : pages =
# 0.9 : 1 (`--mamba-full-memory-ratio`, arg_groups/fields/schedule.py:220-226; no profile overrides it).
MAMBA_FULL_MEMORY_RATIO = 0.9


# Hybrid architectures whose radix cache keeps two more states per request to track prefixes with
# (`arg_groups/overrides.py:403-429, 477-483`, the extra_buffer strategy with the overlap schedule,
# `mem_cache/allocation_sizing.py:11-19`): the KDA ones of SGLang's list.
EXTRA_BUFFER_ARCHITECTURES = frozenset({"KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"})


def states_per_request(arch: ModelArchitecture, radix_cache: bool) -> int:
    """State slots SGLang counts per running request when it caps requests by its state pool
    (`mem_cache/kv_cache_configurator.py:3062-3088`): one without a radix cache, three with it, two
    more with the extra buffer."""
    if not radix_cache:
        return 1
    return 3 + (2 if arch.hf_architecture in EXTRA_BUFFER_ARCHITECTURES else 0)


def running_cap(arch: ModelArchitecture, slots: int, *, radix_cache: bool, max_running_requests: int | None,
                attn_dp: int) -> int | None:
    """Most requests one DP attention group runs: the request cap split over the groups, and for a
    hybrid model what its state pool holds (`kv_cache_configurator.py:3119-3150`)."""
    caps = []
    if max_running_requests is not None:
        caps.append(max(1, max_running_requests // attn_dp))
    if slots:
        caps.append(slots // states_per_request(arch, radix_cache))
    return min(caps) if caps else None


def state_slots(footprint: RankFootprint, pool: float, *, radix_cache: bool, max_running_requests: int | None,
                attn_dp: int) -> int:
    """How many KDA states one DP attention group keeps, as SGLang sizes its state pool at start-up
    (`mem_cache/kv_cache_configurator.py:3303-3390`): without the radix cache (always on decode,
    `arg_groups/pd_disaggregation_hook.py:97-127`; on prefill when prefix caching is off) and with a
    request cap, one per request the group runs; otherwise what 0.9 / 1.9 of the pool holds, less the
    padding slot. The pages get what is left, so a request cap well above what long contexts fill
    still takes its states' memory from them."""
    if not footprint.state:
        return 0
    if not radix_cache and max_running_requests is not None:
        return max(1, max_running_requests // attn_dp)
    budget = pool * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
    return math.floor((budget - footprint.state) / footprint.state)


def instance_capacity(
    arch: ModelArchitecture,
    role: RoleSpec,
    hardware: HardwareSpec,
    *,
    index: IndexPlacement = "copied",
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
    role_name: Role = "decode",
    radix_cache: bool | None = None,
) -> InstanceCapacity:
    """The capacity of one instance of `role` on `hardware`; raises CapacityError when none exists.

    `radix_cache`: whether the engines keep a prefix cache (`flags.keeps_radix_cache`; unset: prefill
    as its prefixCaching says, decode never), which decides how a hybrid model's state pool is sized.
    """
    # The engine's own resolution decides the cache's dtype and layout (a DSA model's `auto`, its kernels)
    # and, unset, the static fraction per role from the GPU's memory (arg_groups/memory_hook.py:281-343).
    resolved = resolution.resolve_role(arch, role, hardware, role_name)
    if radix_cache is None:
        radix_cache = role_name == "prefill" and role.prefix_caching
    try:
        return engine_capacity(arch, role.layout, hardware, resolved,
                               draft=resolution.speculative_draft(role.speculative), index=index,
                               reserve_bytes=reserve_bytes, role_name=role_name, radix_cache=radix_cache)
    except CapacityError as err:
        if role.mem_fraction_static is not None or not err.field_path.endswith("memFractionStatic"):
            raise
        # The fraction is SGLang's, from a GPU too small for its fixed reserves: the field to change
        # is the one the user wrote, the GPU's memory, not one the engine computes.
        least = _least_gpu_memory_gib(arch, role, hardware, reserve_bytes, role_name)
        raise CapacityError(
            "hardware.gpuMemoryGib",
            f"{hardware.memory_gib} GiB per GPU is too little for {role_name}: SGLang's memFractionStatic for it "
            f"comes to {resolved.mem_fraction_static}, which leaves nothing after the {reserve_bytes / GIB:.1f} GiB "
            "the engine reserves",
            f"use GPUs with at least {least} GiB for this layout" if least is not None
            else "use GPUs with more memory and more of them per instance (layout.tp)",
        ) from None


def engine_capacity(
    arch: ModelArchitecture,
    layout: LayoutSpec,
    hardware: HardwareSpec,
    resolved: resolution.ResolvedArgs,
    *,
    draft: resolution.Draft | None,
    radix_cache: bool,
    index: IndexPlacement = "copied",
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
    role_name: Role = "decode",
) -> InstanceCapacity:
    """The capacity an engine sizes at start-up from its resolved arguments: the operator's figure
    for a role (`instance_capacity`) and the engine simulator's own pool are this one computation."""
    footprint = rank_footprint(
        arch,
        layout,
        index=index,
        speculative=keeps_draft_pool(draft),
        kv_cache_dtype=_cache_dtype(resolved),
        dsa_scaled=resolution.resolved_dsa_kv_scaled(resolved, role_name),
        role_name=role_name,
    )
    pool = pool_bytes(arch, layout, hardware, mem_fraction_static=resolved.mem_fraction_static,
                      reserve_bytes=reserve_bytes, role_name=role_name)
    slots = state_slots(footprint, pool, radix_cache=radix_cache, max_running_requests=resolved.max_running_requests,
                        attn_dp=layout.attn_dp)
    # A speculative decode snapshots every slot's state once per draft token it verifies; prefill never
    # verifies and skips them (kv_cache_configurator.py:172-181, 3294-3298). Without a radix cache a
    # speculative server always has a request cap (48 unless set), so its slots are that cap.
    draft_states = 0
    if slots and role_name == "decode" and not radix_cache and draft is not None:
        draft_states = resolution.draft_tokens(arch, draft) or 0
    capacity = InstanceCapacity(
        footprint=footprint,
        pool_bytes=pool,
        weight_bytes=arch.weight_bytes / layout.world_size,
        mem_fraction_static=resolved.mem_fraction_static,
        reserve_bytes=reserve_bytes,
        attn_dp=layout.attn_dp,
        state_slots=slots,
        draft_states=draft_states,
        running_cap=running_cap(arch, slots, radix_cache=radix_cache,
                                max_running_requests=resolved.max_running_requests, attn_dp=layout.attn_dp),
        page_size=resolved.page_size,
    )
    if footprint.state and (slots < 1 or capacity.group_tokens < 1 or capacity.running_cap == 0):
        # SGLang stops at start-up here (kv_cache_configurator.py:3392-3403, 3152-3160); the request
        # cap, where there is one (set, or a speculative server's 48), is what sized the states.
        capped = resolved.max_running_requests is not None
        raise CapacityError(
            f"{role_name}.maxRunningRequests" if capped else "hardware.gpuMemoryGib",
            f"the linear-attention states of {max(slots, 1)} requests ({footprint.state / GIB:.2f} GiB each per GPU) "
            f"leave no room for KV pages in the {pool / GIB:.1f} GiB pool",
            f"lower {role_name}.maxRunningRequests, raise {role_name}.layout.tp, or use GPUs with more memory",
        )
    if capacity.group_tokens < 1:
        # Aligned down, a pool under one page is none: SGLang stops at start-up (pool_configurator.py:94-99).
        raise CapacityError(
            f"{role_name}.layout.tp",
            f"the {pool / GIB:.3f} GiB pool per GPU holds less than one page of {resolved.page_size} tokens "
            f"({footprint.per_token:.0f} bytes each)",
            f"raise {role_name}.layout.tp or use GPUs with more memory",
        )
    return capacity


def _cache_dtype(resolved: resolution.ResolvedArgs) -> KvCacheDtype:
    """The resolved KV cache dtype as capacity names it."""
    dtype = resolved.kv_cache_dtype
    if dtype not in _KV_DTYPE_FACTOR:
        raise ValueError(f"unknown KV cache dtype {dtype!r}")
    return cast(KvCacheDtype, dtype)


def _least_gpu_memory_gib(arch: ModelArchitecture, role: RoleSpec, hardware: HardwareSpec, reserve_bytes: float,
                          role_name: Role) -> int | None:
    """The fewest whole GiB per GPU (within the API's 4096) on which `role` has a KV pool, with the
    fraction SGLang computes for that memory; None if even 4096 GiB is not enough."""
    for gib in range(math.floor(hardware.memory_gib) + 1, 4097):
        bigger = hardware.model_copy(update={"gpu_memory_gib": float(gib)})
        fraction = resolution.resolve_role(arch, role, bigger, role_name).mem_fraction_static
        try:
            pool_bytes(arch, role.layout, bigger, mem_fraction_static=fraction, reserve_bytes=reserve_bytes,
                       role_name=role_name)
        except CapacityError:
            continue
        return gib
    return None


def frontier(cap: InstanceCapacity, context_lens: ArrayLike) -> np.ndarray:
    """Most requests the instance holds at each context length: n*L within each DP attention group's
    whole pages, n within the engine's running cap (the request cap, the states).

    Vectorised over context lengths so a caller can draw the whole frontier at once.
    """
    lengths = np.asarray(context_lens, dtype=np.float64)
    if np.any(lengths < 1):
        raise ValueError("context lengths must be >= 1 token")
    pages = np.floor(cap.group_tokens / lengths).astype(np.int64)
    if cap.running_cap is not None:
        pages = np.minimum(pages, cap.running_cap)
    return pages * cap.attn_dp


def max_requests(cap: InstanceCapacity, context_len: int) -> int:
    """Most requests of `context_len` tokens the instance holds at once (one point of the frontier)."""
    return int(frontier(cap, [context_len])[0])


def _gain(base: RankFootprint, sharded: RankFootprint, context_len: float | None) -> float:
    """Ratio of what one pool holds under two footprints: per request at L, per token without L."""
    if context_len is None:
        return base.per_token / sharded.per_token
    return base.request_bytes(context_len) / sharded.request_bytes(context_len)


def _footprints(
    arch: ModelArchitecture,
    layout: LayoutSpec,
    index: IndexPlacement,
    speculative: bool,
    kv_cache_dtype: KvCacheDtype,
    role_name: Role,
    dsa_scaled: bool = False,
) -> tuple[RankFootprint, RankFootprint]:
    """The footprint of `layout` with DCP 1 and as declared, on one cache layout: the two sides of every gain."""
    without_dcp, declared = (
        rank_footprint(
            arch, candidate, index=index, speculative=speculative, kv_cache_dtype=kv_cache_dtype,
            dsa_scaled=dsa_scaled, role_name=role_name,
        )
        for candidate in (layout.model_copy(update={"dcp": 1}), layout)
    )
    return without_dcp, declared


def capacity_gain(
    arch: ModelArchitecture,
    dcp: int,
    *,
    index: IndexPlacement = "copied",
    context_len: float | None = None,
    tp: int | None = None,
    speculative: bool = False,
    kv_cache_dtype: KvCacheDtype = "fp8_e4m3",
) -> float:
    """How many times more context (or requests of one length) DCP over `dcp` ranks holds than DCP 1.

    Same GPUs, same pool: the ratio of per-request bytes, (S + L*b1) / (S + L*bC). Without a
    context length it is the long-context limit b1 / bC, e.g. (E+I)/(E/C+I) with a copied
    index. `tp` defaults to `dcp`, the smallest TP group that can carry that DCP size.
    """
    if dcp < 1:
        raise ValueError("dcp must be >= 1")
    layout = LayoutSpec(tp=dcp if tp is None else tp, dcp=dcp)
    return _gain(*_footprints(arch, layout, index, speculative, kv_cache_dtype, "decode"), context_len)


def capacity_ceiling(
    arch: ModelArchitecture,
    *,
    index: IndexPlacement = "copied",
    speculative: bool = False,
    kv_cache_dtype: KvCacheDtype = "fp8_e4m3",
) -> float:
    """The gain no DCP size can exceed: per-token bytes over the part DCP never shards.

    With a copied index that part is I (+ the draft), so the ceiling is (E+I)/I; when
    everything per token shards (split index, no draft) there is no ceiling (inf).
    """
    base = rank_footprint(
        arch, LayoutSpec(), index=index, speculative=speculative, kv_cache_dtype=kv_cache_dtype
    )
    unsharded = base.draft + (base.index if index == "copied" else 0.0)
    return base.per_token / unsharded if unsharded else math.inf


@dataclass(frozen=True)
class CapacityReport:
    """The capacity figures of one layout, JSON-ready for the CLI and status."""

    layout: LayoutSpec
    index: IndexPlacement
    kv_cache_dtype: KvCacheDtype
    speculative: bool
    footprint: RankFootprint
    gain_over_dcp1: float
    context_len: int | None
    gain_at_context: float | None
    instance: InstanceCapacity | None
    max_requests_at_context: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.to_wire(),
            "index": self.index,
            "kvCacheDtype": self.kv_cache_dtype,
            "speculative": self.speculative,
            "bytesPerRank": self.footprint.to_dict(),
            "gainOverDcp1": self.gain_over_dcp1,
            "contextLen": self.context_len,
            "gainAtContext": self.gain_at_context,
            "instance": None if self.instance is None else self.instance.to_dict(),
            "maxRequestsAtContext": self.max_requests_at_context,
        }


def capacity_report(
    arch: ModelArchitecture,
    dcp: int,
    index: IndexPlacement = "copied",
    hardware: HardwareSpec | None = None,
    role: RoleSpec | None = None,
    *,
    context_len: int | None = None,
    role_name: Role = "decode",
) -> CapacityReport:
    """Capacity of `role` (default: TP = DCP = `dcp`, FP8, no speculation) with its DCP set to `dcp`.

    `dcp` overrides the role's own so one call answers "what would DCP C give this layout";
    with `hardware` the report adds the pool and tokens per instance (and the frontier point
    at `context_len`), raising CapacityError when the weights leave no pool.
    """
    base_role = role if role is not None else RoleSpec(layout=LayoutSpec(tp=dcp))
    layout = base_role.layout.model_copy(update={"dcp": dcp})
    sized_role = base_role.model_copy(update={"layout": layout})
    heads_per_group = layout.tp // (layout.attn_dp * layout.attn_cp)
    if heads_per_group and arch.attention_heads % heads_per_group:
        # A layout the engine cannot run (layout rule attention-heads-divisible): no capacity to report.
        splits = [d for d in range(1, arch.attention_heads + 1) if arch.attention_heads % d == 0]
        raise CapacityError(f"{role_name}.layout.tp",
                            f"{arch.attention_heads} attention heads do not split over {heads_per_group} attention "
                            "TP ranks (tp / (attnDp x attnCp))", f"choose a TP among {splits}")
    speculative = keeps_draft_pool(resolution.speculative_draft(sized_role.speculative))
    kv_cache_dtype: KvCacheDtype = sized_role.kv_cache_dtype
    dsa_scaled = False
    if hardware is not None:
        # On a known GPU the cache is the one the engine resolves (a DSA model's `auto` and kernels).
        resolved = resolution.resolve_role(arch, sized_role, hardware, role_name)
        kv_cache_dtype, dsa_scaled = _cache_dtype(resolved), resolution.resolved_dsa_kv_scaled(resolved, role_name)
    base, footprint = _footprints(arch, layout, index, speculative, kv_cache_dtype, role_name, dsa_scaled)
    instance = None
    if hardware is not None:
        instance = instance_capacity(arch, sized_role, hardware, index=index, role_name=role_name)
    return CapacityReport(
        layout=layout,
        index=index,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
        footprint=footprint,
        gain_over_dcp1=_gain(base, footprint, None),
        context_len=context_len,
        gain_at_context=None if context_len is None else _gain(base, footprint, context_len),
        instance=instance,
        max_requests_at_context=(
            None if instance is None or context_len is None else max_requests(instance, context_len)
        ),
    )
