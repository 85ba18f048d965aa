"""The performance model reproduces each published figure it is calibrated on (docs/performance-model.md)."""

from __future__ import annotations

import pytest

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.api.profiles import PROFILES

GLM = PROFILES["glm-5.2"]


def test_ttft_at_1k_input_is_0_38_s_on_one_b300_node():
    model = PerformanceModel.for_role(GLM, tp=8)
    assert model.prefill_seconds(1024) == pytest.approx(0.38, abs=1e-9)


def test_ttft_at_32k_input_is_1_7_s_on_one_b300_node():
    model = PerformanceModel.for_role(GLM, tp=8)
    assert model.prefill_seconds(32768) == pytest.approx(1.70, abs=1e-9)


def test_prefill_is_superlinear_in_prompt_length():
    model = PerformanceModel.for_role(GLM, tp=8)
    compute = model.prefill_chunk_compute_seconds
    assert compute(65536) > 2 * compute(32768)


def test_cached_prefix_skips_linear_work_but_not_attention():
    model = PerformanceModel.for_role(GLM, tp=8)
    full = model.prefill_seconds(32768)
    half_cached = model.prefill_seconds(32768, cached_tokens=16384)
    fresh_half = model.prefill_seconds(16384)
    assert fresh_half < half_cached < full


def test_fewer_prefill_gpus_take_longer():
    assert PerformanceModel.for_role(GLM, tp=4).prefill_seconds(32768) > PerformanceModel.for_role(
        GLM, tp=8
    ).prefill_seconds(32768)


def test_decode_step_at_32k_single_request_tp4_is_6_78_ms():
    model = PerformanceModel.for_role(GLM, tp=4)
    assert model.decode_step_seconds(1, 32768) == pytest.approx(6.78e-3, abs=1e-9)


@pytest.mark.parametrize(("dcp", "ms"), [(2, 7.61), (4, 8.08)])
def test_decode_step_at_32k_under_dcp_matches_measurement(dcp, ms):
    model = PerformanceModel.for_role(GLM, tp=4, dcp=dcp)
    assert model.decode_step_seconds(1, 32768) == pytest.approx(ms * 1e-3, abs=1e-9)


def test_dcp8_step_cost_keeps_growing_with_dcp():
    steps = [PerformanceModel.for_role(GLM, tp=8, dcp=d).decode_step_seconds(1, 32768) for d in (1, 2, 4, 8)]
    assert steps == sorted(steps)


def test_decode_step_at_large_batch_is_about_30_ms():
    model = PerformanceModel.for_role(GLM, tp=4)
    assert model.decode_step_seconds(128, 128 * 4096) == pytest.approx(30e-3, abs=1e-9)


def test_decode_step_grows_with_batch_and_with_resident_context():
    model = PerformanceModel.for_role(GLM, tp=4)
    assert model.decode_step_seconds(64, 64 * 4096) > model.decode_step_seconds(32, 32 * 4096)
    assert model.decode_step_seconds(32, 32 * 65536) > model.decode_step_seconds(32, 32 * 4096)
    assert model.decode_step_seconds(0, 0) == 0.0


@pytest.mark.parametrize(("tokens", "low_ms", "high_ms"), [(4096, 0.4, 0.6), (32768, 1.6, 2.0)])
def test_kv_transfer_of_4k_to_32k_tokens_takes_0_5_to_2_ms(tokens, low_ms, high_ms):
    model = PerformanceModel.for_role(GLM, tp=8)
    assert low_ms * 1e-3 <= model.transfer_seconds(tokens) <= high_ms * 1e-3


def test_in_place_switch_takes_seconds_and_relaunch_the_restart_time():
    model = PerformanceModel.for_role(GLM, tp=8)
    assert 5.0 <= model.switch_seconds("in-place") <= 20.0
    assert model.switch_seconds("relaunch") == GLM.restart_seconds == 780.0
    with pytest.raises(ValueError, match="unknown switch mode"):
        model.switch_seconds("teleport")  # type: ignore[arg-type]


def test_default_kv_capacity_is_the_measured_glm52_b300_figure_per_dcp_rank():
    assert PerformanceModel.for_role(GLM, tp=8).kv_capacity_tokens == 1_170_000
    assert PerformanceModel.for_role(GLM, tp=8, dcp=4).kv_capacity_tokens == pytest.approx(4_670_000, rel=0.01)
    assert PerformanceModel.for_role(GLM, tp=8, kv_tokens=500_000).kv_capacity_tokens == 500_000


def test_hybrid_model_requests_carry_their_recurrent_state_in_the_pool():
    kimi = PerformanceModel.for_role(PROFILES["kimi-k3"], tp=8)
    assert kimi.state_tokens_per_request > 0
    assert kimi.request_kv_tokens(1000) == 1000 + kimi.state_tokens_per_request
    assert PerformanceModel.for_role(GLM, tp=8).request_kv_tokens(1000) == 1000


def test_time_scale_multiplies_every_duration():
    real = PerformanceModel.for_role(GLM, tp=4, dcp=2)
    fast = real.scaled(0.01)
    pairs = [
        (fast.prefill_seconds(8192, 1024), real.prefill_seconds(8192, 1024)),
        (fast.decode_step_seconds(16, 100_000), real.decode_step_seconds(16, 100_000)),
        (fast.transfer_seconds(8192), real.transfer_seconds(8192)),
        (fast.switch_seconds("relaunch"), real.switch_seconds("relaunch")),
    ]
    for scaled, unscaled in pairs:
        assert scaled == pytest.approx(unscaled * 0.01)


def test_invalid_layouts_are_rejected():
    with pytest.raises(ValueError):
        PerformanceModel.for_role(GLM, tp=4, dcp=3)
    with pytest.raises(ValueError):
        PerformanceModel.for_role(GLM, tp=8, time_scale=0)


def test_h200_kv_pool_follows_sglangs_memory_computation():
    """SGLang's static fraction for a TP8 decode rank on 141 GiB (0.929, `arg_groups/memory_hook.py`)
    × 141 GiB − 2 GiB reserve − 750 GB / 8 of weights, over 78 × 656 + 2,772 + 656 B a token (on
    Hopper the FP8 DSA kernel is flashmla_kv, whose latent keeps scales and a bf16 rope part:
    512 + 16 + 128 = 656 B a layer, not 576): about 820 K tokens, the pool the capacity model gives
    the same instance (a fleet's status, the policy before any engine answers), not the 1.17 M
    measured on B300, where the TensorRT-LLM kernel keeps the 576-byte raw latent."""
    from hybridserving.api.v1alpha1 import HardwareSpec, LayoutSpec, RoleSpec, SpeculativeSpec
    from hybridserving.core.capacity import instance_capacity
    from hybridserving.core.perfmodel import computed_kv_tokens

    arch = PROFILES["glm-5.2"]
    h200 = PerformanceModel.for_role(arch, tp=8, gpu="H200")
    expected = (0.929 * 141 * 2**30 - 2 * 2**30 - 750e9 / 8) / (78 * 656 + 2_772 + 656)
    assert h200.kv_capacity_tokens == pytest.approx(expected, rel=1e-3)
    assert 810_000 < h200.kv_capacity_tokens < 830_000
    eagle = RoleSpec(layout=LayoutSpec(tp=8), speculative=SpeculativeSpec(algorithm="EAGLE"))
    assert h200.kv_capacity_tokens == instance_capacity(arch, eagle, HardwareSpec(gpu_type="H200")).tokens
    assert PerformanceModel.for_role(arch, tp=8, gpu="B300").kv_capacity_tokens == 1_170_000
    # The hand-over moves the pool's own bytes.
    assert h200.kv_wire_bytes_per_token == 78 * 656 + 2_772
    assert PerformanceModel.for_role(arch, tp=8, gpu="B300").kv_wire_bytes_per_token == 78 * 576 + 2_772
    # Decode context parallelism takes the TensorRT-LLM kernels, whose latent is the raw 576 bytes,
    # split over the DCP ranks; each rank keeps the whole index key.
    raw = (0.929 * 141 * 2**30 - 2 * 2**30 - 750e9 / 8) / (78 * 576 / 4 + 2_772 + 576)
    assert computed_kv_tokens(arch, 8, "H200", dcp=4) == pytest.approx(raw, rel=1e-3)
    assert PerformanceModel.for_role(arch, tp=8, dcp=4, gpu="H200").kv_wire_bytes_per_token == 78 * 576 + 2_772


def test_h200_prefill_scales_with_fp8_compute_and_decode_with_hbm_bandwidth():
    arch = PROFILES["glm-5.2"]
    b300 = PerformanceModel.for_role(arch, tp=8, gpu="B300")
    h200 = PerformanceModel.for_role(arch, tp=8, gpu="H200")
    compute = b300.prefill_chunk_compute_seconds(32768)
    assert h200.prefill_chunk_compute_seconds(32768) == pytest.approx(compute * 4500 / 1979)
    assert h200.decode_per_context_token_s == pytest.approx(b300.decode_per_context_token_s * 8.0 / 4.8)
    assert h200.decode_base_s == b300.decode_base_s  # launch and collective latency do not scale
    with pytest.raises(ValueError, match="unknown gpu"):
        PerformanceModel.for_role(arch, tp=8, gpu="a100")


def test_a_new_instance_pays_pod_start_and_weight_load():
    m = PerformanceModel.for_role(PROFILES["glm-5.2"], tp=8)
    assert m.launch_seconds() == pytest.approx(60.0 + 780.0)
