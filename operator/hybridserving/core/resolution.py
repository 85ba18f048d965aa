"""SGLang 0.5.23's start-up rewrites of the flags the operator renders, mirrored by hand.

The engine does not run what its command line says: before serving, its resolution pipeline
(`arg_groups/pipeline.py` and the `*_hook.py` handlers, then the model overrides) fills what
was left unset from the GPU's memory and rewrites several values for the model and backend.
A pool size, a running-request cap or a page size read off the argv is therefore wrong, and
two roles whose argv agree can still disagree once resolved (decode then refuses the prefill
at bootstrap). Each function below mirrors one such rewrite and cites the line it mirrors
(paths relative to `sglang/srt/` in the 0.5.23 wheel); `docs/engine-contract.md` lists them.

Only what the operator's fleets render is mirrored: CUDA GPUs, MLA models (DeepSeek V3,
DSA models, Kimi K3), no hierarchical cache or memory saver.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserving.api.v1alpha1 import HardwareSpec, HybridServingSpec, Role, RoleSpec
from hybridserving.api.profiles import ModelArchitecture

MIB_PER_GIB = 1024
# speculative_hook.py:1086-1094: EAGLE-family decoding without --max-running-requests.
EAGLE_DEFAULT_MAX_RUNNING_REQUESTS = 48
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")  # speculative/spec_info.py:262-264
KIMI_K3 = "KimiK3ForConditionalGeneration"


@dataclass(frozen=True)
class ResolvedArgs:
    """The values one role's engine serves with after its start-up resolution."""

    chunked_prefill_size: int
    """Per attention-DP rank (parallel_hook.py:331 divides the resolved size by attnDp)."""
    decode_cuda_graph_max_bs: int
    mem_fraction_static: float
    max_running_requests: int | None
    """The instance's cap when resolution sets one (None: sized from the KV pool)."""
    page_size: int
    kv_cache_dtype: str
    prefill_attention_backend: str | None
    decode_attention_backend: str | None

    attn_dp: int = 1

    def to_dict(self) -> dict[str, object]:
        return {
            "chunked_prefill_size": self.chunked_prefill_size,
            "decode_cuda_graph_max_bs": self.decode_cuda_graph_max_bs,
            "mem_fraction_static": self.mem_fraction_static,
            "max_running_requests": self.max_running_requests,
            "page_size": self.page_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "prefill_attention_backend": self.prefill_attention_backend,
            "decode_attention_backend": self.decode_attention_backend,
        }


def gpu_memory_defaults(gpu_mem_mib: float, tp: int) -> tuple[int, int]:
    """(chunked prefill size, decode CUDA graph max batch) SGLang picks from the GPU's memory
    when they are unset (`arg_groups/memory_hook.py:90-170`)."""
    gib = MIB_PER_GIB
    if gpu_mem_mib < 20 * gib:
        return 2048, 8
    if gpu_mem_mib < 35 * gib:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_mib < 60 * gib:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * gib:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def decode_graph_reserve_mb(decode_max_bs: int, attn_dp: int) -> float:
    """MiB SGLang sets aside for decode CUDA graphs (`arg_groups/memory_hook.py:357-377`)."""
    reserved = decode_max_bs * 2.0
    if attn_dp > 1:
        reserved += decode_max_bs * attn_dp * 3
        if decode_max_bs > 300:
            reserved += decode_max_bs * attn_dp * 1.5
    return reserved


def decode_cuda_graph_memory_gb(decode_max_bs: int, attn_dp: int) -> float:
    """What `POST /pd_role_switch` must carry for an engine that has never captured decode graphs
    (`disaggregation/role_switch.py:79-89`): the engine's own decode-graph reserve, in GB."""
    return round(decode_graph_reserve_mb(decode_max_bs, attn_dp) / MIB_PER_GIB, 3)


def _mem_fraction_static(*, role: str, gpu_mem_mib: float, tp: int, pp: int, attn_dp: int,
                         chunked_prefill_size: int, decode_max_bs: int, max_running_requests: int | None,
                         num_draft_tokens: int | None, deepep: bool) -> float:
    """`arg_groups/memory_hook.py:281-343` for an MLA model on CUDA (post-capture KV sizing is
    off for MLA, `arg_groups/overrides.py:1809-1810`; prefill graphs add 1.5 GiB with MLA,
    lines 383-389)."""
    if role == "decode":
        running = max_running_requests or decode_max_bs or 1
        activation_tokens = max(running * (num_draft_tokens or 1), 2048)
    else:
        activation_tokens = max(chunked_prefill_size, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp * pp / 8 * 1024
    if role == "decode":
        reserved += decode_graph_reserve_mb(decode_max_bs, attn_dp)
    else:
        reserved += 1.5 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if deepep and role == "decode":
        reserved += 2 * 1024  # reserve_for_deepep_a2a_mb, lines 398-410
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def attention_backends(arch: ModelArchitecture, dcp: int) -> tuple[str | None, str | None]:
    """(prefill, decode) attention backends a model override forces; None: SGLang's default.

    Kimi K3 with DCP keeps cutedsl_mla for decode and trtllm_mla for prefill
    (`arg_groups/model_overrides/kimi_k3.py:52-94`)."""
    if arch.hf_architecture == KIMI_K3 and dcp > 1:
        return "trtllm_mla", "cutedsl_mla"
    return None, None


def page_size(arch: ModelArchitecture, requested: int | None, backends: tuple[str | None, str | None]) -> int:
    """The page size the engine runs: DSA forces 64 x index_kpool whatever --page-size says
    (`arg_groups/model_overrides/deepseek_v2.py:162-173`; profiles carry no index_kpool, which
    defaults to 1 in `configs/model_config.py:530-531`); TensorRT-LLM and CuteDSL MLA accept only
    32 or 64 and turn anything else into 64 (`arg_groups/overrides.py:1155-1172`)."""
    if arch.is_dsa:
        return 64
    size = requested or 1
    if any(b in ("trtllm_mla", "cutedsl_mla") for b in backends) and size not in (32, 64):
        return 64
    return size


def resolve(spec: HybridServingSpec, role: Role) -> ResolvedArgs:
    """The resolved values of one role's engine on the fleet's hardware."""
    return resolve_role(spec.architecture(), spec.role(role), spec.hardware, role)


def resolve_role(arch: ModelArchitecture, rs: RoleSpec, hardware: HardwareSpec, role: Role) -> ResolvedArgs:
    """`resolve` for one role's spec, model and hardware."""
    layout = rs.layout
    speculative = rs.speculative
    return resolve_values(
        arch, role=role, gpu_mem_mib=hardware_memory_mib(hardware), tp=layout.tp, pp=layout.pp,
        attn_dp=layout.attn_dp, dcp=layout.dcp, max_running_requests=rs.max_running_requests,
        page_size_flag=rs.page_size, kv_cache_dtype=rs.kv_cache_dtype,
        mem_fraction_static=rs.mem_fraction_static,
        speculative_algorithm=speculative.algorithm if speculative else None,
        num_draft_tokens=speculative.num_draft_tokens if speculative else None,
        moe_a2a_backend=layout.moe_a2a_backend,
    )


def resolve_values(arch: ModelArchitecture, *, role: str, gpu_mem_mib: float, tp: int, pp: int, attn_dp: int,
                   dcp: int, max_running_requests: int | None, page_size_flag: int | None, kv_cache_dtype: str,
                   mem_fraction_static: float | None, speculative_algorithm: str | None,
                   num_draft_tokens: int | None, moe_a2a_backend: str | None,
                   chunked_prefill_size: int | None = None) -> ResolvedArgs:
    """The resolution from the flag values themselves (what the SGLang simulator starts from)."""
    chunked, decode_max_bs = gpu_memory_defaults(gpu_mem_mib, tp)
    if chunked_prefill_size is not None:
        chunked = chunked_prefill_size
    if max_running_requests is not None and decode_max_bs > max_running_requests:
        decode_max_bs = max_running_requests  # memory_hook.py:182-188
    cap = max_running_requests
    if cap is None and speculative_algorithm in EAGLE_FAMILY:
        cap = EAGLE_DEFAULT_MAX_RUNNING_REQUESTS
    backends = attention_backends(arch, dcp)
    fraction = mem_fraction_static
    if fraction is None:
        # The memory hook runs before the attention-DP split of chunked prefill and before the
        # EAGLE cap (arg_groups/pipeline.py:218, 274, 306), so it sees neither.
        fraction = _mem_fraction_static(
            role=role, gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, attn_dp=attn_dp,
            chunked_prefill_size=chunked, decode_max_bs=decode_max_bs,
            max_running_requests=max_running_requests, num_draft_tokens=num_draft_tokens,
            deepep=moe_a2a_backend == "deepep",
        )
    return ResolvedArgs(
        chunked_prefill_size=chunked // attn_dp,
        decode_cuda_graph_max_bs=decode_max_bs,
        mem_fraction_static=fraction,
        max_running_requests=cap,
        page_size=page_size(arch, page_size_flag, backends),
        kv_cache_dtype=kv_cache_dtype,
        prefill_attention_backend=backends[0],
        decode_attention_backend=backends[1],
        attn_dp=attn_dp,
    )


def required_compute_capability(resolved: ResolvedArgs) -> int | None:
    """The CUDA compute capability major the resolved attention backends need: trtllm_mla and
    cutedsl_mla raise off SM100 (`arg_groups/overrides.py:1210-1213, 1243-1246`)."""
    if {resolved.prefill_attention_backend, resolved.decode_attention_backend} & {"trtllm_mla", "cutedsl_mla"}:
        return 10
    return None


def hardware_memory_mib(hardware: HardwareSpec) -> float:
    return float(hardware.memory_gib) * MIB_PER_GIB
