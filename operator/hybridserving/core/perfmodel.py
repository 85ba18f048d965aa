"""How long an engine instance takes to prefill, decode, hand over KV and change role.

One model serves both the HTTP engine simulator and the discrete-event fleet simulator, so
the role-switch controller is tuned on the same timings the end-to-end tests run against.
Every constant is fitted to a published figure; `docs/performance-model.md` lists each figure,
the formula that reproduces it, the unit test that checks it, and (Sources) the public source
the short names in the comments below stand for.

Durations are seconds. `time_scale` multiplies every duration, so a simulator can run a
13-minute relaunch in well under a second of wall time without changing any ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Literal

from hybridserving.api.v1alpha1 import (
    GPU_TYPES,
    GpuType,
    GpuTypeName,
    HardwareSpec,
    LayoutSpec,
    RoleSpec,
    SpeculativeSpec,
)
from hybridserving.core import resolution
from hybridserving.core.capacity import instance_capacity, rank_footprint
from hybridserving.api.profiles import ModelArchitecture

SwitchMode = Literal["in-place", "relaunch"]

# Prefill (Mind Lab 2026, §5.3: TTFT on B300 0.38 s at 1K input, 1.7 s at 32K, dominated by
# prefill compute). The anchors are for one 8-GPU instance; prefill is compute-bound, so the
# compute terms scale with 8 / tp.
_PREFILL_ANCHOR_TP = 8
_TTFT_SHORT = (1024, 0.38)
_TTFT_LONG = (32768, 1.70)
# Part of TTFT that does not occupy the prefill GPUs: routing, the bootstrap handshake with
# the decode instance, KV slot pre-allocation, detokenising the first token.
_REQUEST_LATENCY_S = 0.30
# Fixed cost of one prefill forward pass (scheduling, launch); paid once per batch.
_PREFILL_STEP_OVERHEAD_S = 0.05

# Decode (Long Context 2026, §3.6: one request at 32K context on 4 GPUs, TP: 6.78 ms per step;
# DCP2 7.61 ms, DCP4 8.08 ms. Mind Lab 2026, Table 1: ~30 ms per step without speculation
# (TPOT 30.8 ms); its batch is not published, taken as 128 requests of 4K).
_DECODE_SINGLE = (32768, 6.78e-3)
_DECODE_LARGE = (128, 4096, 30.0e-3)
# Reading one token of latent KV on every TP rank: 44,928 B at ~7.4 TB/s of HBM bandwidth.
_DECODE_PER_CONTEXT_TOKEN_S = 6.1e-9
# DCP adds a collective per layer (all-gather of queries, LSE merge); from the 32K anchors.
_DCP_COMM_S = {2: 7.61e-3, 4: 8.08e-3}

# KV transfer (Mind Lab 2026, §5.3: Mooncake RDMA ~0.5 ms at 4K tokens to ~2 ms at 32K).
_TRANSFER_LATENCY_S = 0.3e-3
_LINK_BYTES_PER_S = 1.0e12

# Role switch (SGLang 0.5.23, `disaggregation/role_switch.py`): in place keeps weights and the KV
# pool; the rebuild and CUDA-graph capture take seconds. A relaunch pays the model's restart time
# (~13 min for a large hybrid: Kimi K3 commentary 2026).
_IN_PLACE_SWITCH_S = 12.0

# KV tokens one decode rank holds when the capacity model is not consulted: GLM-5.2 FP8 on B300,
# TP8, page 64, with the EAGLE draft pool (Mind Lab 2026, Table 1: 1.17 M; DCP4 4.67 M, DCP8
# 9.34 M ≈ ×dcp).
_DEFAULT_KV_TOKENS_PER_DCP_RANK = 1_170_000
_DEFAULT_MAX_RUNNING_REQUESTS = 256

# A new instance: the pod is scheduled and its containers start (image already on the node),
# then the engine loads the weights and captures graphs (the model's restart time).
_POD_START_S = 60.0


# The constants above are fitted on B300 (Mind Lab 2026; Long Context 2026). Prefill is
# compute-bound, so its compute terms scale with dense FP8 throughput; decode reads KV and expert
# weights, so its per-token and per-request terms scale with HBM bandwidth (the fixed
# launch/collective latency does not); the KV pool comes from memory (`core.capacity`, SGLang's
# computation). Each GPU's figures are the API's (`api.v1alpha1.GPU_TYPES`, vendor datasheets).
CALIBRATION_GPU: GpuTypeName = "B300"


def dsa_kv_scaled(gpu: GpuType, arch: ModelArchitecture, dcp: int = 1) -> bool:
    """Whether `arch`'s FP8 cache takes DSA's scaled layout on `gpu`: the kernels decide it, and the
    GPU's architecture decides the kernels (`resolution.dsa_kv_scaled`)."""
    backends = resolution.dsa_backends("fp8_e4m3", dcp, gpu.compute_capability_major)
    return arch.is_dsa and resolution.dsa_kv_scaled("fp8_e4m3", backends, "decode")


def _prefill_compute_terms() -> tuple[float, float]:
    """Solve the linear and attention coefficients so both TTFT anchors are met exactly."""
    fixed = _REQUEST_LATENCY_S + _PREFILL_STEP_OVERHEAD_S
    (n1, t1), (n2, t2) = _TTFT_SHORT, _TTFT_LONG
    # t = fixed + a·n + b·n²/2
    q1, q2 = n1 * n1 / 2, n2 * n2 / 2
    det = n1 * q2 - n2 * q1
    a = ((t1 - fixed) * q2 - (t2 - fixed) * q1) / det
    b = (n1 * (t2 - fixed) - n2 * (t1 - fixed)) / det
    return a, b


def _decode_terms() -> tuple[float, float]:
    """Solve the fixed and per-request step costs from the single-request and large-batch anchors."""
    ctx1, t1 = _DECODE_SINGLE
    batch, ctx_each, t2 = _DECODE_LARGE
    c = _DECODE_PER_CONTEXT_TOKEN_S
    # t = base + r·batch + c·resident
    r = ((t2 - c * batch * ctx_each) - (t1 - c * ctx1)) / (batch - 1)
    base = t1 - c * ctx1 - r
    return base, r


def _dcp_comm_seconds(dcp: int, base: float, per_request: float) -> float:
    """Extra step time of DCP; log-linear in dcp through the measured DCP2 and DCP4 points."""
    if dcp <= 1:
        return 0.0
    ctx = _DECODE_SINGLE[0]
    at = {
        c: total - (base + per_request + _DECODE_PER_CONTEXT_TOKEN_S * ctx / c)
        for c, total in _DCP_COMM_S.items()
    }
    per_doubling = at[4] - at[2]
    return at[2] + per_doubling * (math.log2(dcp) - 1)


@dataclass(frozen=True)
class PerformanceModel:
    """Timings of one engine instance of a given layout; see the module docstring."""

    kv_capacity_tokens: int
    """Tokens of KV a decode instance can keep resident (per rank; TP replicates the latent)."""
    state_tokens_per_request: int
    """Per-request recurrent (KDA) state, in tokens of KV it displaces from the same pool."""
    kv_wire_bytes_per_token: int
    """Bytes of KV (latent + index) one token moves from prefill to decode."""
    max_running_requests: int
    request_latency_s: float
    prefill_step_overhead_s: float
    prefill_per_token_s: float
    prefill_per_pair_s: float
    decode_base_s: float
    decode_per_request_s: float
    decode_per_context_token_s: float
    decode_dcp_comm_s: float
    transfer_latency_s: float
    link_bytes_per_second: float
    in_place_switch_s: float
    relaunch_switch_s: float
    time_scale: float = 1.0
    pod_start_s: float = _POD_START_S
    gpu: GpuTypeName = CALIBRATION_GPU

    @classmethod
    def for_role(
        cls,
        arch: ModelArchitecture,
        tp: int,
        dcp: int = 1,
        kv_tokens: int | None = None,
        *,
        max_running_requests: int = _DEFAULT_MAX_RUNNING_REQUESTS,
        in_place_switch_seconds: float = _IN_PLACE_SWITCH_S,
        link_bytes_per_second: float = _LINK_BYTES_PER_S,
        time_scale: float = 1.0,
        gpu: GpuTypeName = CALIBRATION_GPU,
    ) -> PerformanceModel:
        """Build the model of one instance of `arch` laid out as TP `tp` with DCP `dcp`.

        `kv_tokens` is the KV capacity from the capacity model or an engine's report; without it the
        measured GLM-5.2 figure (1.17 M tokens per DCP rank) stands in on B300, and SGLang's memory
        computation (`computed_kv_tokens`) on any other GPU.
        """
        if tp < 1 or dcp < 1 or tp % dcp:
            raise ValueError(f"need tp >= 1 and dcp dividing tp, got tp={tp} dcp={dcp}")
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        if gpu not in GPU_TYPES:
            raise ValueError(f"unknown gpu {gpu!r}; known: {', '.join(sorted(GPU_TYPES))}")
        kind, calibration = GPU_TYPES[gpu], GPU_TYPES[CALIBRATION_GPU]
        per_token, per_pair = _prefill_compute_terms()
        compute_scale = _PREFILL_ANCHOR_TP / tp * calibration.fp8_dense_tflops / kind.fp8_dense_tflops
        bandwidth_scale = calibration.hbm_tb_per_s / kind.hbm_tb_per_s
        base, per_request = _decode_terms()
        if kv_tokens is None and gpu != CALIBRATION_GPU:
            kv_tokens = computed_kv_tokens(arch, tp, gpu, dcp)
        latent = rank_footprint(arch, LayoutSpec(), dsa_scaled=dsa_kv_scaled(kind, arch, dcp)).kv
        kv_per_rank = latent / dcp + arch.index_bytes_per_token
        state_per_rank = arch.recurrent_state_bytes_per_request / tp
        return cls(
            kv_capacity_tokens=kv_tokens if kv_tokens is not None else calibrated_kv_tokens(dcp),
            state_tokens_per_request=math.ceil(state_per_rank / kv_per_rank) if kv_per_rank else 0,
            kv_wire_bytes_per_token=round(latent) + arch.index_bytes_per_token,
            max_running_requests=max_running_requests,
            request_latency_s=_REQUEST_LATENCY_S,
            prefill_step_overhead_s=_PREFILL_STEP_OVERHEAD_S,
            prefill_per_token_s=per_token * compute_scale,
            prefill_per_pair_s=per_pair * compute_scale,
            decode_base_s=base,
            decode_per_request_s=per_request * bandwidth_scale,
            decode_per_context_token_s=_DECODE_PER_CONTEXT_TOKEN_S * bandwidth_scale / dcp,
            decode_dcp_comm_s=_dcp_comm_seconds(dcp, base, per_request),
            transfer_latency_s=_TRANSFER_LATENCY_S,
            link_bytes_per_second=link_bytes_per_second,
            in_place_switch_s=in_place_switch_seconds,
            relaunch_switch_s=arch.restart_seconds,
            time_scale=time_scale,
            gpu=gpu,
        )

    def launch_seconds(self) -> float:
        """A new instance from nothing to serving: pod start plus weight load (the restart time)."""
        return self.pod_start_s + self.relaunch_switch_s

    def scaled(self, time_scale: float) -> PerformanceModel:
        """The same instance, with every duration multiplied by `time_scale`."""
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        return replace(self, time_scale=time_scale)

    def prefill_chunk_compute_seconds(self, new_tokens: int, prior_tokens: int = 0) -> float:
        """GPU time of `new_tokens` that attend to themselves and to `prior_tokens` already in KV.

        Cached prefix tokens and earlier chunks of a chunked prefill cost attention pairs but no
        linear work, which is why prefix caching pays most on long prompts.
        """
        pairs = new_tokens * prior_tokens + new_tokens * new_tokens / 2
        return (self.prefill_per_token_s * new_tokens + self.prefill_per_pair_s * pairs) * self.time_scale

    def prefill_batch_seconds(self, chunks: Iterable[tuple[int, int]]) -> float:
        """How long one prefill forward pass over `(new_tokens, prior_tokens)` chunks occupies the instance."""
        compute = sum(self.prefill_chunk_compute_seconds(n, p) for n, p in chunks)
        return self.prefill_step_overhead_s * self.time_scale + compute

    def prefill_seconds(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """TTFT of one prompt on an idle prefill instance (no queueing, transfer excluded)."""
        cached = min(cached_tokens, prompt_tokens)
        return self.request_latency_s * self.time_scale + self.prefill_batch_seconds(
            [(prompt_tokens - cached, cached)]
        )

    def decode_step_seconds(self, batch: int, resident_context_tokens: int) -> float:
        """One decode step for `batch` running requests holding `resident_context_tokens` in total."""
        if batch <= 0:
            return 0.0
        step = (
            self.decode_base_s
            + self.decode_per_request_s * batch
            + self.decode_per_context_token_s * resident_context_tokens
            + self.decode_dcp_comm_s
        )
        return step * self.time_scale

    def transfer_seconds(self, tokens: int) -> float:
        """Prefill → decode KV hand-over of `tokens` over the RDMA link."""
        wire_s = tokens * self.kv_wire_bytes_per_token / self.link_bytes_per_second
        return (self.transfer_latency_s + wire_s) * self.time_scale

    def request_kv_tokens(self, context_tokens: int) -> int:
        """Pool slots one request occupies in the fleet simulator: its context plus its fixed recurrent
        state (the frontier). SGLang, and the engine simulator, keep states in a pool of their own."""
        return context_tokens + self.state_tokens_per_request

    def switch_seconds(self, mode: SwitchMode) -> float:
        """Time from an idle instance to serving in the other role (drain not included)."""
        if mode == "in-place":
            return self.in_place_switch_s * self.time_scale
        if mode == "relaunch":
            return self.relaunch_switch_s * self.time_scale
        raise ValueError(f"unknown switch mode {mode!r}; use 'in-place' or 'relaunch'")


def calibrated_kv_tokens(dcp: int = 1) -> int:
    """The KV tokens measured on the calibration GPU (GLM-5.2, TP8), which scale with DCP."""
    return _DEFAULT_KV_TOKENS_PER_DCP_RANK * dcp


def computed_kv_tokens(arch: ModelArchitecture, tp: int, gpu: GpuTypeName, dcp: int = 1) -> int:
    """KV tokens one decode instance (TP `tp`, DCP `dcp`) holds on `gpu`, by SGLang's memory
    computation as the capacity model implements it, the same figure a fleet's status and the
    policy read before any engine reports its pool.

    The static fraction is SGLang's for the GPU's memory (`arg_groups/memory_hook.py`), less the
    engine's reserve and the rank's weight slice, over the bytes one token costs the rank: latent,
    index and, as in the calibration measurement, the EAGLE draft. On B300 the measured 1.17 M
    (Mind Lab 2026, Table 1) is used instead, which the benchmarks' SLOs were set on. It is 3.6×
    below this figure (4.19 M), more than the LoRA and other buffers the profile does not list
    explain; the publication gives neither its buffers nor its exact layout. `dcp` decides a DSA
    model's kernels, and with them its cache layout.
    """
    draft = SpeculativeSpec(algorithm="EAGLE") if arch.draft_kv_bytes_per_token else None
    role = RoleSpec(layout=LayoutSpec(tp=tp, dcp=dcp), speculative=draft)
    return instance_capacity(arch, role, HardwareSpec(gpu_type=gpu), role_name="decode").tokens
