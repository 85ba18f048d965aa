"""The 2D reshard plan against Mind Lab 2026, §4-6 (docs/performance-model.md), and its partition properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridserving.api.profiles import PROFILES
from hybridserving.core.transfer import filter_pages, layer_bounds, plan_transfer

GLM52 = PROFILES["glm-5.2"]


def test_78_layers_on_8_ranks():
    plan = plan_transfer(GLM52, 8, 4, 32_768)
    assert plan.layer_counts.tolist() == [10, 10, 10, 10, 10, 10, 9, 9]
    assert plan.layer_ranges()[6] == (60, 69) and plan.layer_ranges()[7] == (69, 78)


def test_32k_tokens_move_1_47_gb_368_mb_per_rank_against_5_88_gb_naive():
    plan = plan_transfer(GLM52, 8, 4, 32_768)
    assert plan.total_bytes == 78 * 576 * 32_768
    assert round(plan.total_bytes / 1e9, 2) == 1.47
    per_rank = plan.path_bytes.sum(axis=0)
    assert per_rank.tolist() == [plan.total_bytes // 4] * 4
    assert round(per_rank[0] / 1e6) == 368
    assert round(plan.naive_bytes / 1e9, 2) == 5.89  # 4 x 1.472 GB; the article rounds first: 4 x 1.47 = 5.88
    assert plan.naive_bytes == 4 * plan.total_bytes
    assert plan.discarded_fraction == pytest.approx(0.75)
    assert plan.path_bytes.shape == (8, 4)


def test_500k_tokens_are_7813_pages_and_23_gb():
    plan = plan_transfer(GLM52, 8, 4, 500_000)
    assert plan.total_pages == 7_813
    assert round(plan.total_bytes / 1e9) == 22  # 22.46 GB: the article's "23 GB"
    # The last page holds 500,000 - 7,812 x 64 = 32 tokens, on rank 7812 mod 4 = 0.
    assert plan.rank_tokens.tolist() == [1_953 * 64 + 32, 1_953 * 64, 1_953 * 64, 1_953 * 64]
    assert plan.total_bytes == 78 * 576 * 500_000


def test_filter_keeps_rank_pages_at_compressed_slots():
    owned, slots = filter_pages([0, 5, 6, 9, 12, 13], 4, 1)
    assert owned.tolist() == [5, 9, 13] and slots.tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        filter_pages([0], 4, 4)


def test_summary_is_small_json():
    plan = plan_transfer(GLM52, 8, 4, 500_000)
    text = json.dumps(plan.summary())
    assert len(text) < 4_000
    rank0 = plan.summary()["decodeRanks"][0]
    assert (rank0["pages"], rank0["firstPage"], rank0["lastPage"], rank0["lastSlot"]) == (1_954, 0, 7_812, 1_953)


def test_hybrid_models_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="per-request state"):
        plan_transfer(PROFILES["kimi-k3"], 8, 4, 1_000)
    with pytest.raises(ValueError):
        plan_transfer(GLM52, 0, 4, 1_000)
    with pytest.raises(ValueError):
        plan_transfer(GLM52, 8, 4, 0)


def test_bf16_doubles_every_path():
    fp8 = plan_transfer(GLM52, 8, 4, 4_096)
    bf16 = plan_transfer(GLM52, 8, 4, 4_096, kv_cache_dtype="bf16")
    assert np.array_equal(bf16.path_bytes, 2 * fp8.path_bytes)


# --------------------------------------------------------------------------- properties

shapes = st.tuples(
    st.integers(1, 128),  # layers
    st.integers(1, 16),  # prefill CP
    st.integers(1, 16),  # decode DCP
    st.integers(1, 20_000),  # tokens
    st.sampled_from([1, 16, 64]),  # page size
)


def plan_for(layers, cp, dcp, tokens, page):
    arch = GLM52.model_copy(update={"layers": layers, "mla_layers": layers})
    return plan_transfer(arch, cp, dcp, tokens, page)


@settings(max_examples=80, deadline=None)
@given(shapes)
def test_every_layer_page_pair_is_sent_exactly_once(shape):
    layers, cp, dcp, tokens, page = shape
    plan = plan_for(*shape)
    pages = -(-tokens // page)
    sent = np.zeros((layers, pages), dtype=np.int64)
    for start, end in plan.layer_ranges():
        for owned in plan.pages:
            sent[start:end, owned] += 1
    assert np.all(sent == 1)


@settings(max_examples=80, deadline=None)
@given(shapes)
def test_layers_and_pages_partition_and_bytes_add_up(shape):
    layers, cp, dcp, tokens, page = shape
    plan = plan_for(*shape)
    bounds = plan.layer_bounds
    assert bounds[0] == 0 and bounds[-1] == layers and np.all(np.diff(bounds) >= 0)
    counts = plan.layer_counts
    assert counts.max() - counts.min() <= 1 and np.all(np.diff(counts) <= 0)
    everything = np.sort(np.concatenate(plan.pages))
    assert np.array_equal(everything, np.arange(-(-tokens // page)))
    for rank, (owned, slots) in enumerate(zip(plan.pages, plan.slots, strict=True)):
        assert np.all(owned % dcp == rank) and np.array_equal(slots, np.arange(len(owned)))
    assert plan.rank_tokens.sum() == tokens
    assert plan.total_bytes == layers * tokens * plan.bytes_per_token_layer
    assert plan.naive_bytes == dcp * plan.total_bytes


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 5_000))
def test_bytes_grow_with_tokens_on_every_path(shape, more):
    layers, cp, dcp, tokens, page = shape
    smaller = plan_for(*shape)
    larger = plan_for(layers, cp, dcp, tokens + more, page)
    assert np.all(smaller.path_bytes <= larger.path_bytes)
    assert smaller.total_bytes < larger.total_bytes


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 256), st.integers(1, 64))
def test_layer_bounds_match_the_per_rank_formula(layers, cp):
    base, extra = divmod(layers, cp)
    expected = [r * base + min(r, extra) for r in range(cp)] + [layers]
    assert layer_bounds(layers, cp).tolist() == expected
