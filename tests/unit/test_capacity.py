"""The capacity model against the published figures (docs/capacity.md) and its invariants."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hybridserving.api.v1alpha1 import HardwareSpec, LayoutSpec, RoleSpec, SpeculativeSpec
from hybridserving.core.capacity import (
    DEFAULT_MEM_FRACTION_STATIC,
    DEFAULT_RESERVE_BYTES,
    GIB,
    CapacityError,
    capacity_ceiling,
    capacity_gain,
    capacity_report,
    frontier,
    instance_capacity,
    max_requests,
    pool_bytes,
    rank_footprint,
)
from hybridserving.api.profiles import PROFILES, ModelArchitecture

GLM53 = PROFILES["glm-5.3"]
GLM52 = PROFILES["glm-5.2"]
K3 = PROFILES["kimi-k3"]
B300 = HardwareSpec(gpu_memory_gib=288)


# --------------------------------------------------------------------------- published figures


def test_glm53_latent_is_44928_bytes_and_128k_tokens_take_5_4_gib_on_every_tp_rank():
    tp8 = rank_footprint(GLM53, LayoutSpec(tp=8))
    assert tp8.kv == 44_928 == GLM53.kv_bytes_per_token
    assert tp8.index == 2_772
    context = 128_000 * tp8.kv
    assert context == pytest.approx(5.75e9, rel=1e-3)
    assert round(context / GIB, 1) == 5.4
    # TP does not split the latent: the same 5.4 GiB sits on each of the 8 ranks.
    assert rank_footprint(GLM53, LayoutSpec(tp=1)).kv == tp8.kv


@pytest.mark.parametrize("dcp, gain", [(2, 1.89), (4, 3.41), (8, 5.69), (72, 14.0)])
def test_copied_index_gain(dcp, gain):
    assert round(capacity_gain(GLM53, dcp), 2 if dcp < 72 else 1) == gain


def test_copied_index_ceiling_and_crossover():
    assert round(capacity_ceiling(GLM53), 1) == 17.2
    assert round(GLM53.kv_bytes_per_token / GLM53.index_bytes_per_token, 1) == 16.2
    below, above = (rank_footprint(GLM53, LayoutSpec(tp=c, dcp=c)) for c in (16, 17))
    assert below.kv > below.index and above.kv < above.index
    assert capacity_ceiling(GLM53, index="split") == math.inf


def test_split_index_at_dcp8_is_5963_bytes_against_8388_copied():
    layout = LayoutSpec(tp=8, dcp=8)
    split = rank_footprint(GLM53, layout, index="split").per_token
    assert split == (44_928 + 2_772) / 8 == 5_962.5 and math.ceil(split) == 5_963
    assert rank_footprint(GLM53, layout, index="copied").per_token == 8_388
    assert capacity_gain(GLM53, 8, index="split") == pytest.approx(8.0)


def test_k3_dcp8_gain_is_7_9_at_1_5m_tokens_and_falls_as_contexts_shorten():
    assert round(capacity_gain(K3, 8, context_len=1_500_000), 1) == 7.9
    lengths = [2_000, 32_768, 131_072, 1_500_000]
    gains = [capacity_gain(K3, 8, context_len=length) for length in lengths]
    assert gains == sorted(gains) and gains[0] < 2
    assert capacity_gain(K3, 8) == 8.0


def test_recurrent_state_shards_by_tp_not_dcp():
    tp8 = rank_footprint(K3, LayoutSpec(tp=8))
    assert tp8.state == K3.recurrent_state_bytes_per_request / 8
    assert rank_footprint(K3, LayoutSpec(tp=8, dcp=8)).state == tp8.state


def test_draft_pool_is_not_sharded_by_dcp():
    plain = rank_footprint(GLM52, LayoutSpec(tp=8, dcp=4))
    eagle = rank_footprint(GLM52, LayoutSpec(tp=8, dcp=4), speculative=True)
    assert eagle.draft == GLM52.draft_kv_bytes_per_token
    assert eagle.kv == plain.kv == GLM52.kv_bytes_per_token / 4
    assert capacity_gain(GLM52, 4, speculative=True) < capacity_gain(GLM52, 4)


def test_bf16_doubles_latent_and_draft_but_not_the_index():
    fp8 = rank_footprint(GLM53, LayoutSpec(tp=8), speculative=True)
    bf16 = rank_footprint(GLM53, LayoutSpec(tp=8), speculative=True, kv_cache_dtype="bf16")
    assert (bf16.kv, bf16.draft, bf16.index) == (2 * fp8.kv, 2 * fp8.draft, fp8.index)


def test_pipeline_stages_split_kv_and_state():
    pp2 = rank_footprint(K3, LayoutSpec(tp=8, pp=2))
    tp8 = rank_footprint(K3, LayoutSpec(tp=8))
    assert (pp2.kv, pp2.state) == (tp8.kv / 2, tp8.state / 2)


# --------------------------------------------------------------------------- the pool


def test_pool_is_static_fraction_less_weight_slice_less_reserve():
    layout = LayoutSpec(tp=8, dcp=8)
    pool = pool_bytes(GLM53, layout, B300)
    expected = 288 * GIB * DEFAULT_MEM_FRACTION_STATIC - GLM53.weight_bytes / 8 - DEFAULT_RESERVE_BYTES
    assert pool == pytest.approx(expected)
    # Unset, the fraction is SGLang's own (arg_groups/memory_hook.py:281-343): a TP8 decode rank on a
    # 288 GiB GPU reserves max(512 + 2048 x 1.5 + 1024 + 512 x 2, 10240) MiB -> (294912 - 10240) / 294912.
    cap = instance_capacity(GLM53, RoleSpec(layout=layout), B300)
    assert cap.mem_fraction_static == 0.965
    sglang = 288 * GIB * 0.965 - GLM53.weight_bytes / 8 - DEFAULT_RESERVE_BYTES
    # Whole pages of 64 tokens, as SGLang aligns the count (model_executor/pool_configurator.py:640-653).
    assert cap.page_size == 64
    assert cap.tokens == math.floor(sglang / 8_388) // 64 * 64
    assert 0 < math.floor(sglang / 8_388) - cap.tokens < 64
    fixed = instance_capacity(GLM53, RoleSpec(layout=layout, mem_fraction_static=DEFAULT_MEM_FRACTION_STATIC), B300)
    assert fixed.tokens == math.floor(expected / 8_388) // 64 * 64


def test_a_pool_under_one_page_is_no_pool():
    """SGLang aligns the pool down to whole pages and stops at start when none is left
    (`model_executor/pool_configurator.py:94-99, 640-653`): a pool of a few hundred KB, more than
    nothing but less than 64 tokens of 8,388 bytes, holds no page."""
    layout = LayoutSpec(tp=8, dcp=8)
    over_the_weights = GLM53.weight_bytes / 8 + DEFAULT_RESERVE_BYTES + 300_000
    role = RoleSpec(layout=layout, mem_fraction_static=over_the_weights / (288 * GIB))
    assert 0 < pool_bytes(GLM53, layout, B300, mem_fraction_static=role.mem_fraction_static) < 64 * 8_388
    with pytest.raises(CapacityError) as err:
        instance_capacity(GLM53, role, B300)
    assert err.value.field_path == "decode.layout.tp"
    assert "holds less than one page of 64 tokens (8388 bytes each)" in err.value.message
    assert "raise decode.layout.tp" in err.value.fix


def test_speculative_roles_pay_the_draft_and_ngram_does_not():
    layout = LayoutSpec(tp=8, dcp=4)
    eagle = RoleSpec(layout=layout, speculative=SpeculativeSpec(algorithm="EAGLE"))
    ngram = RoleSpec(layout=layout, speculative=SpeculativeSpec(algorithm="NGRAM"))
    plain = RoleSpec(layout=layout)
    tokens = [instance_capacity(GLM52, role, B300).tokens for role in (eagle, ngram, plain)]
    assert tokens[0] < tokens[1] == tokens[2]


def test_dp_attention_groups_add_their_tokens():
    dp = instance_capacity(GLM53, RoleSpec(layout=LayoutSpec(tp=8, attn_dp=8), mem_fraction_static=0.9), B300)
    tp = instance_capacity(GLM53, RoleSpec(layout=LayoutSpec(tp=8), mem_fraction_static=0.9), B300)
    assert dp.tokens == pytest.approx(8 * tp.tokens, abs=8)
    # Left to SGLang, DP attention's larger decode-graph reserve lowers the fraction
    # (arg_groups/memory_hook.py:371-377: 512 x 8 x 4.5 MiB more at attnDp 8, 24064 MiB reserved in all).
    assert instance_capacity(GLM53, RoleSpec(layout=LayoutSpec(tp=8, attn_dp=8)), B300).mem_fraction_static == 0.918


def test_weights_that_do_not_fit_name_the_field_and_a_tp_that_fits():
    role = RoleSpec(layout=LayoutSpec(tp=2))
    hardware = HardwareSpec(gpus_per_node=2, gpu_memory_gib=80)
    with pytest.raises(CapacityError) as error:
        instance_capacity(K3, role, hardware)
    assert error.value.field_path == "decode.layout.tp"
    assert "weights" in str(error.value)
    suggested = int(error.value.fix.split("decode.layout.tp to ")[1].split()[0])
    fits = RoleSpec(layout=LayoutSpec(tp=suggested))
    assert instance_capacity(K3, fits, hardware).tokens > 0


def test_a_static_fraction_below_the_reserve_names_mem_fraction():
    role = RoleSpec(layout=LayoutSpec(tp=8), mem_fraction_static=0.01)
    with pytest.raises(CapacityError) as error:
        instance_capacity(GLM53, role, HardwareSpec(), role_name="prefill")
    assert error.value.field_path == "prefill.memFractionStatic"


def test_a_gpu_too_small_for_the_fraction_sglang_computes_names_the_gpu_memory_and_the_least_that_works():
    role = RoleSpec(layout=LayoutSpec(tp=8))
    with pytest.raises(CapacityError) as error:
        instance_capacity(GLM53, role, HardwareSpec(gpu_memory_gib=5), role_name="prefill")
    assert error.value.field_path == "hardware.gpuMemoryGib"
    assert "5.0 GiB per GPU is too little for prefill: SGLang's memFractionStatic" in error.value.message
    least = int(error.value.fix.split("at least ")[1].split()[0])
    assert instance_capacity(GLM53, role, HardwareSpec(gpu_memory_gib=least), role_name="prefill").tokens > 0
    with pytest.raises(CapacityError):
        instance_capacity(GLM53, role, HardwareSpec(gpu_memory_gib=least - 1), role_name="prefill")


def test_dcp_must_divide_the_attention_group():
    with pytest.raises(CapacityError) as error:
        rank_footprint(GLM53, LayoutSpec(tp=8, attn_dp=4, dcp=4))
    assert error.value.field_path == "decode.layout.dcp"


def test_a_model_that_keeps_no_bytes_per_token_is_a_capacity_error_not_a_division_by_zero():
    # Built past validation, as the API refuses mlaLayers 0: callers catch CapacityError, not ZeroDivisionError.
    weightless = PROFILES["deepseek-v3"].model_construct(**{**dict(PROFILES["deepseek-v3"]), "mla_layers": 0})
    with pytest.raises(CapacityError) as error:
        instance_capacity(weightless, RoleSpec(layout=LayoutSpec(tp=8)), HardwareSpec())
    assert error.value.field_path == "model.architecture.mlaLayers"
    with pytest.raises(CapacityError):
        capacity_gain(weightless, 8)


@pytest.mark.parametrize(
    "attention, changes",
    [
        ("mla", {"mlaLayers": 0}),
        ("hybrid-kda-mla", {"mlaLayers": 0}),
        ("mla", {"mlaLayers": 62}),
        ("mla", {"indexerLayers": 62}),
        ("mla-dsa", {"indexerLayers": 0}),
        ("mla-dsa", {"indexBytesPerTokenLayer": 0}),
    ],
)
def test_custom_architectures_keep_their_layer_counts_within_the_model(attention, changes):
    """A layer count the model cannot have plans a pool of zero bytes per token or more layers than exist."""
    figures = {**PROFILES["deepseek-v3.2"].model_dump(by_alias=True), "attention": attention}
    assert ModelArchitecture.model_validate(figures).layers == 61
    with pytest.raises(ValidationError) as error:
        ModelArchitecture.model_validate({**figures, **changes})
    (field,) = changes
    assert field in str(error.value)


# --------------------------------------------------------------------------- frontier and report


def test_decode_sizes_its_state_pool_by_the_ratio_and_pages_take_the_rest():
    """Decode runs without a radix cache and, uncapped, SGLang gives the states 0.9 / 1.9 of the pool
    (kv_cache_configurator.py:3345-3390): the pages keep the rest, whatever the contexts are."""
    cap = instance_capacity(K3, RoleSpec(layout=LayoutSpec(tp=16, dcp=8)), HardwareSpec())
    state = cap.footprint.state
    assert cap.state_slots == math.floor((cap.pool_bytes * 0.9 / 1.9 - state) / state)
    assert cap.state_bytes == (cap.state_slots + 1) * state
    page = cap.page_size
    assert cap.tokens == math.floor((cap.pool_bytes - cap.state_bytes) / cap.footprint.per_token) // page * page
    # The pages are 1/1.9 of the pool, give or take one state and one page.
    assert cap.pool_bytes / 1.9 - page * cap.footprint.per_token < cap.tokens * cap.footprint.per_token
    assert cap.tokens * cap.footprint.per_token < cap.pool_bytes / 1.9 + state
    assert cap.running_cap == cap.state_slots  # no radix cache: one state per request
    for length in (1, 2_000, 131_072, 1_000_000):
        n = max_requests(cap, length)
        assert n <= cap.state_slots
        assert n == cap.state_slots or n * length <= cap.tokens < (n + 1) * length
    assert max_requests(cap, 1) == cap.state_slots
    assert max_requests(cap, 1_000_000) < cap.state_slots
    with pytest.raises(ValueError):
        max_requests(cap, 0)


def test_a_request_cap_without_a_radix_cache_sizes_one_state_per_request():
    """--max-running-requests on a server without a radix cache (decode) reserves exactly its states
    (kv_cache_configurator.py:3325-3344); a prefill keeping its prefix cache still takes the ratio."""
    capped = RoleSpec(layout=LayoutSpec(tp=8, attn_dp=2), max_running_requests=64)
    decode = instance_capacity(K3, capped, B300)
    assert decode.state_slots == 32  # per DP attention group
    pages = decode.pool_bytes - 33 * decode.footprint.state
    assert decode.tokens == 2 * math.floor(pages / decode.footprint.per_token)
    assert max_requests(decode, 1) == 64
    prefill = instance_capacity(K3, capped, B300, role_name="prefill")
    assert prefill.state_slots > 100
    # With the radix cache Kimi K3 keeps 5 states per running request (3 + the extra buffer's 2), and
    # the request cap still holds (kv_cache_configurator.py:3062-3088, 3119-3150).
    assert prefill.running_cap == min(32, prefill.state_slots // 5) == 32
    uncapped = instance_capacity(K3, RoleSpec(layout=LayoutSpec(tp=8)), B300, role_name="prefill")
    assert uncapped.running_cap == uncapped.state_slots // 5
    assert max_requests(uncapped, 1) == uncapped.state_slots // 5
    unshared = instance_capacity(K3, capped.model_copy(update={"prefix_caching": False}), B300, role_name="prefill")
    assert unshared.state_slots == 32
    cached = instance_capacity(K3, capped, B300, radix_cache=True)  # a decode of an in-place switching fleet
    assert cached.state_slots == math.floor((cached.pool_bytes * 0.9 / 1.9 - cached.footprint.state)
                                            / cached.footprint.state)
    glm = instance_capacity(GLM52, capped, B300)
    assert glm.state_slots == 0 and glm.state_bytes == 0  # no linear attention, no state pool
    assert max_requests(glm, 1) == 64
    assert instance_capacity(GLM52, RoleSpec(layout=LayoutSpec(tp=8)), B300).running_cap is None


def test_a_speculative_decode_reserves_a_state_per_draft_token_and_prefill_does_not():
    """EAGLE on decode caps requests at 48 and keeps, for every slot, a state per verified draft token
    (kv_cache_configurator.py:3336-3344); the auto shape drafts 4 tokens (3 steps + 1)."""
    eagle = RoleSpec(layout=LayoutSpec(tp=8), speculative=SpeculativeSpec(algorithm="EAGLE"))
    decode = instance_capacity(K3, eagle, B300)
    assert (decode.state_slots, decode.draft_states) == (48, 4)
    assert decode.state_bytes == 49 * decode.footprint.state * 5
    plain = instance_capacity(K3, eagle.model_copy(update={"speculative": None, "max_running_requests": 48}), B300)
    assert plain.draft_states == 0 and plain.tokens > decode.tokens
    assert instance_capacity(K3, eagle, B300, role_name="prefill").draft_states == 0


def test_more_states_than_the_pool_holds_name_the_request_cap():
    with pytest.raises(CapacityError) as err:
        instance_capacity(K3, RoleSpec(layout=LayoutSpec(tp=8), max_running_requests=100_000), B300)
    assert err.value.field_path == "decode.maxRunningRequests"
    assert "lower decode.maxRunningRequests" in err.value.fix


def test_state_shards_over_the_attention_tp_group_without_context_parallel_ranks():
    """The KDA state splits over tp / (attnDp x attnCp) ranks (configs/kimi_linear.py:173-182)."""
    plain = rank_footprint(K3, LayoutSpec(tp=8))
    cp = rank_footprint(K3, LayoutSpec(tp=8, attn_cp=2, cp_strategy="interleave"))
    assert cp.state == 2 * plain.state == 2 * K3.recurrent_state_bytes_per_request / 8


@pytest.mark.parametrize(("gpu", "latent"), [("H200", 656), ("B300", 576)])
def test_dsa_fp8_latent_follows_the_kernel_the_gpu_resolves(gpu, latent):
    """Hopper's FP8 DSA kernel (flashmla_kv) keeps the latent with a scale per 128 values and the rope
    part in bf16, 512 + 16 + 128 = 656 bytes a layer; Blackwell's TensorRT-LLM kernel keeps the raw
    576 (overrides.py:706-726, kv_cache_configurator.py:3417-3470). The draft layer is built alike."""
    hardware = HardwareSpec(gpu_type=gpu)
    role = RoleSpec(layout=LayoutSpec(tp=8), speculative=SpeculativeSpec(algorithm="EAGLE"))
    cap = instance_capacity(GLM52, role, hardware)
    assert cap.footprint.kv == 78 * latent
    assert cap.footprint.draft == latent
    assert cap.footprint.index == 21 * 132
    report = capacity_report(GLM52, 1, hardware=hardware, role=role).to_dict()
    assert report["bytesPerRank"]["kv"] == 78 * latent and report["kvCacheDtype"] == "fp8_e4m3"
    # Decode context parallelism takes the TensorRT-LLM kernels (model_overrides/deepseek_v2.py:26-31).
    dcp = instance_capacity(GLM52, role.model_copy(update={"layout": LayoutSpec(tp=8, dcp=8)}), hardware)
    assert dcp.footprint.kv == 78 * 576 / 8


@pytest.mark.parametrize(("gpu", "dtype", "latent"), [("H200", "bfloat16", 1152), ("B300", "fp8_e4m3", 576)])
def test_dsa_auto_cache_dtype_is_fp8_on_blackwell_and_bf16_on_hopper(gpu, dtype, latent):
    """overrides.py:532-538: a DSA model's `auto` cache is not bf16 everywhere."""
    role = RoleSpec(layout=LayoutSpec(tp=8), kv_cache_dtype="auto")
    cap = instance_capacity(GLM52, role, HardwareSpec(gpu_type=gpu))
    assert cap.footprint.kv == 78 * latent
    assert capacity_report(GLM52, 1, hardware=HardwareSpec(gpu_type=gpu), role=role).kv_cache_dtype == dtype
    assert instance_capacity(K3, role, HardwareSpec(gpu_type=gpu)).footprint.kv == 24 * 576 * 2  # not DSA: bf16


def test_report_is_json_and_carries_breakdown_gain_and_tokens():
    role = RoleSpec(layout=LayoutSpec(tp=8), speculative=SpeculativeSpec(algorithm="EAGLE"))
    report = capacity_report(GLM52, 4, "copied", hardware=B300, role=role, context_len=32_768)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["layout"]["dcp"] == 4 and data["speculative"] is True
    assert data["bytesPerRank"]["draft"] == GLM52.draft_kv_bytes_per_token
    assert data["gainOverDcp1"] == pytest.approx(capacity_gain(GLM52, 4, tp=8, speculative=True))
    assert data["instance"]["tokensPerInstance"] > 0 and data["maxRequestsAtContext"] > 0
    bare = capacity_report(GLM53, 8).to_dict()
    assert bare["instance"] is None and bare["gainOverDcp1"] == pytest.approx(capacity_gain(GLM53, 8))


# --------------------------------------------------------------------------- properties

profiles = st.sampled_from(sorted(PROFILES))
dcps = st.sampled_from([1, 2, 4, 8, 16])
indexes = st.sampled_from(["copied", "split"])


@settings(max_examples=60, deadline=None)
@given(profiles, dcps, indexes, st.booleans(), st.one_of(st.none(), st.integers(1, 10**8)))
def test_gain_never_exceeds_dcp_and_never_falls_below_one(name, dcp, index, speculative, context_len):
    gain = capacity_gain(PROFILES[name], dcp, index=index, speculative=speculative, context_len=context_len)
    assert 1.0 - 1e-12 <= gain <= dcp * (1 + 1e-12)
    assert gain <= capacity_ceiling(PROFILES[name], index=index, speculative=speculative) * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(dcps)
def test_k3_gain_tends_to_dcp_for_long_contexts(dcp):
    assert capacity_gain(K3, dcp, context_len=10**13) == pytest.approx(dcp, rel=1e-4)


@settings(max_examples=40, deadline=None)
@given(profiles, st.sampled_from([8, 16]), st.floats(200, 4096), st.floats(1, 512))
def test_capacity_grows_with_gpu_memory_and_is_never_negative(name, tp, memory, extra):
    role = RoleSpec(layout=LayoutSpec(tp=tp))
    try:
        small = instance_capacity(PROFILES[name], role, HardwareSpec(gpu_memory_gib=memory))
    except CapacityError:
        return
    large = instance_capacity(PROFILES[name], role, HardwareSpec(gpu_memory_gib=min(memory + extra, 4096)))
    assert 0 <= small.tokens <= large.tokens
    assert 0 < small.pool_bytes <= large.pool_bytes


@settings(max_examples=40, deadline=None)
@given(profiles, dcps, st.lists(st.integers(1, 10**7), min_size=2, max_size=20))
def test_frontier_falls_as_contexts_grow(name, dcp, lengths):
    cap = instance_capacity(PROFILES[name], RoleSpec(layout=LayoutSpec(tp=16, dcp=dcp)), HardwareSpec())
    counts = frontier(cap, sorted(lengths))
    assert np.all(counts >= 0) and np.all(np.diff(counts) <= 0)
