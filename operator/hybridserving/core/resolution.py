"""SGLang 0.5.23's start-up rewrites of the flags the operator renders, mirrored by hand.

The engine does not run what its command line says: before serving, its resolution pipeline
(`arg_groups/pipeline.py` and the `*_hook.py` handlers, then the model overrides) fills what
was left unset from the GPU's memory and rewrites several values for the model and backend.
A pool size, a running-request cap or a page size read off the argv is therefore wrong, and
two roles whose argv agree can still disagree once resolved (decode then refuses the prefill
at bootstrap). Each function below mirrors one such rewrite and cites the line it mirrors
(paths relative to `sglang/srt/` in the 0.5.23 wheel); `docs/engine-contract.md` lists them.

Only what the operator's fleets render is mirrored: CUDA GPUs, MLA models (DeepSeek V3,
DSA models, Kimi K3), no hierarchical cache or memory saver, no `engine.extraArgs`.
`tests/tooling/test_sglang_resolution.py` runs the wheel's own resolution on CPU over the example
fleets and a matrix of layouts and GPUs and holds this mirror to it field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridserving.api.v1alpha1 import HardwareSpec, HybridServingSpec, Role, RoleSpec, SpeculativeSpec
from hybridserving.api.profiles import ModelArchitecture
from hybridserving.core import sglang_options

MIB_PER_GIB = 1024
# Speculative decoding without --max-running-requests: speculative_hook.py:1086-1094 (EAGLE
# family), 1294-1302 (NGRAM).
SPECULATIVE_DEFAULT_MAX_RUNNING_REQUESTS = 48
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")  # speculative/spec_info.py:262-264
# _auto_choose_speculative_params (speculative_hook.py:1430-1465): (steps, topk, draft tokens) is
# (5, 4, 8) for these architectures and (3, 1, 4) for every other one and for STANDALONE.
_TREE_DRAFTING_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
NGRAM_BFS_BREADTH_FLAG = "--speculative-ngram-max-bfs-breadth"
NGRAM_DEFAULT_BFS_BREADTH = 10  # arg_groups/fields/spec.py:256-259
NGRAM_DEFAULT_DRAFT_TOKENS = 12  # arg_groups/speculative_hook.py:1314-1319
# Attention backends that page a draft tree: speculative_hook.py:1271 (EAGLE family), 1355-1358 (NGRAM).
TREE_PAGING_BACKENDS = ("flashinfer", "fa3", "triton")
NGRAM_TREE_PAGING_BACKENDS = ("flashinfer",)
# Flags that choose the attention backends outright (not mirrored: `resolve` gives the engine's own choice).
ATTENTION_BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")
KIMI_K3 = "KimiK3ForConditionalGeneration"
DEEPSEEK_V3 = "DeepseekV3ForCausalLM"
SM100_MAJOR = 10
# moe_a2a backends the breakable prefill CUDA graph is validated with (cuda_graph_hook.py:222-229).
PREFILL_GRAPH_A2A_BACKENDS = ("none", "deepep", "megamoe", "flashinfer")
# The vision tower SGLang sizes the VLM memory cut from (memory_hook.py:440-441 defaults; Kimi K3:
# configs/kimi_k3.py:15-17, aliased to num_hidden_layers/hidden_size at 73-76).
DEFAULT_VIT = (24, 1024)
VIT_SHAPES = {KIMI_K3: (27, 1024)}


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
    attention_backend: str
    """The backend of both phases unless one of the two above overrides it."""

    attn_dp: int = 1
    dsa_prefill_backend: str | None = None
    dsa_decode_backend: str | None = None
    """The sparse-attention kernels of a DSA model (None for other models): they decide the layout of
    its KV cache (`dsa_kv_scaled`)."""

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
            "attention_backend": self.attention_backend,
            "dsa_prefill_backend": self.dsa_prefill_backend,
            "dsa_decode_backend": self.dsa_decode_backend,
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


def prefill_graph_enabled(arch: ModelArchitecture, *, pp: int, attn_cp: int, dcp: int,
                          moe_a2a_backend: str | None) -> bool:
    """Whether a prefill server's breakable prefill CUDA graph is still on when the memory hook
    sizes its reserve (`arg_groups/cuda_graph_hook.py:136-256`, run at `pipeline.py:191`, before the
    memory hook at 218): off with pp > 1 (150-163), KDA layers (184-191), prefill context
    parallelism (206-212: BCG support needs the resolved prefill attention backend, unset until
    `pipeline.py:242`, so `layers/cp/bcg/__init__.py:53-61` says no), dcp > 1 (214-217), an a2a
    backend it is not validated with (222-229) and multimodal models (230-239)."""
    return not (
        pp > 1
        or arch.kda_layers > 0
        or attn_cp > 1
        or dcp > 1
        or (moe_a2a_backend or "none") not in PREFILL_GRAPH_A2A_BACKENDS
        or arch.vision_encoder_heads > 0
    )


def vlm_memory_factor(arch: ModelArchitecture) -> float:
    """What SGLang scales a multimodal prefill server's fraction by for its vision tower
    (`arg_groups/memory_hook.py:331-337, 432-462`)."""
    layers, hidden = VIT_SHAPES.get(arch.hf_architecture, DEFAULT_VIT)
    complexity = layers * hidden**2 / (DEFAULT_VIT[0] * DEFAULT_VIT[1] ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))


def _mem_fraction_static(arch: ModelArchitecture, *, role: str, gpu_mem_mib: float, tp: int, pp: int,
                         attn_dp: int, attn_cp: int, dcp: int, chunked_prefill_size: int, decode_max_bs: int,
                         max_running_requests: int | None, num_draft_tokens: int | None,
                         moe_a2a_backend: str | None) -> float:
    """`arg_groups/memory_hook.py:281-343` for an MLA model on CUDA (post-capture KV sizing is
    off for MLA, `arg_groups/overrides.py:1809-1810`). The graph reserve (lines 357-401): decode
    graphs on decode; on prefill 1.5 GiB for MLA prefill graphs, plus 1 GiB with DeepEP, only
    while the prefill graph is on (`prefill_graph_enabled`)."""
    deepep = moe_a2a_backend == "deepep"
    if role == "decode":
        running = max_running_requests or decode_max_bs or 1
        activation_tokens = max(running * (num_draft_tokens or 1), 2048)
    else:
        activation_tokens = max(chunked_prefill_size, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp * pp / 8 * 1024
    if role == "decode":
        reserved += decode_graph_reserve_mb(decode_max_bs, attn_dp)
    elif prefill_graph_enabled(arch, pp=pp, attn_cp=attn_cp, dcp=dcp, moe_a2a_backend=moe_a2a_backend):
        reserved += 1.5 * 1024 + (1024 if deepep else 0)
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if deepep and role == "decode":
        reserved += 2 * 1024  # reserve_for_deepep_a2a_mb, lines 404-414
    fraction = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    if role != "decode" and arch.vision_encoder_heads > 0:
        fraction *= vlm_memory_factor(arch)  # not rounded again (line 462)
    return fraction


def attention_backends(arch: ModelArchitecture, dcp: int,
                       compute_capability_major: int | None = None) -> tuple[str | None, str | None]:
    """(prefill, decode) attention backends a model override forces; None: the default backend.

    Kimi K3 with DCP keeps cutedsl_mla for decode and trtllm_mla for prefill
    (`arg_groups/model_overrides/kimi_k3.py:52-110`); without DCP on SM100 it takes trtllm_mla for
    both (lines 122-133)."""
    if arch.hf_architecture == KIMI_K3 and dcp > 1:
        return "trtllm_mla", "cutedsl_mla"
    if arch.hf_architecture == KIMI_K3 and compute_capability_major == SM100_MAJOR:
        return "trtllm_mla", "trtllm_mla"
    return None, None


def attention_backend(arch: ModelArchitecture, backends: tuple[str | None, str | None],
                      compute_capability_major: int | None) -> str:
    """The resolved `attention_backend`: the per-phase one when both phases agree
    (`arg_groups/overrides.py:1127-1131`); DSA models take `dsa` (`model_overrides/deepseek_v2.py:
    102-103`), DeepSeek V3 on SM100 `trtllm_mla` (179-187); else the MLA default, fa3 on Hopper and
    flashinfer on SM100 (`arg_groups/model_override_base.py:336-340`). An undeclared GPU counts as
    the operator's default H200."""
    prefill, decode = backends
    if prefill is not None and prefill == decode:
        return prefill
    blackwell = compute_capability_major == SM100_MAJOR
    if arch.is_dsa:
        return "dsa"
    if arch.hf_architecture == DEEPSEEK_V3 and blackwell and backends == (None, None):
        return "trtllm_mla"
    return "flashinfer" if blackwell else "fa3"


def dsa_kv_cache_dtype(kv_cache_dtype: str, compute_capability_major: int | None) -> str:
    """A DSA model's KV cache dtype: `auto` is FP8 on Blackwell and bf16 on Hopper
    (`arg_groups/overrides.py:532-538`; no profile has learnable attention sinks), `bf16` is spelled
    `bfloat16` (539-540)."""
    if kv_cache_dtype == "auto":
        blackwell = compute_capability_major is not None and compute_capability_major >= SM100_MAJOR
        return "fp8_e4m3" if blackwell else "bfloat16"
    return "bfloat16" if kv_cache_dtype == "bf16" else kv_cache_dtype


def dsa_backends(kv_cache_dtype: str, dcp: int, compute_capability_major: int | None) -> tuple[str, str]:
    """(prefill, decode) sparse-attention kernels of a DSA model on CUDA: DCP forces TensorRT-LLM
    (`arg_groups/model_overrides/deepseek_v2.py:26-31`); else FP8 takes trtllm on Blackwell and
    flashmla_kv on Hopper, bf16 flashmla_sparse for prefill and trtllm or fa3 for decode
    (`arg_groups/overrides.py:706-726`)."""
    blackwell = compute_capability_major is not None and compute_capability_major >= SM100_MAJOR
    if dcp > 1:
        return "trtllm", "trtllm"
    if kv_cache_dtype == "fp8_e4m3":
        default = "trtllm" if blackwell else "flashmla_kv"
        return default, default
    return "flashmla_sparse", "trtllm" if blackwell else "fa3"


def dsa_kv_scaled(kv_cache_dtype: str, backends: tuple[str | None, str | None], role: str) -> bool:
    """Whether a DSA role stores its FP8 latent with per-block scales and a bf16 rope part (656 bytes a
    layer for the 512 + 64 latent, not 576): every CUDA FP8 kernel but TensorRT-LLM's and an all-TileLang
    pair, judged by the local role's kernel of (prefill, decode) `backends`
    (`mem_cache/kv_cache_configurator.py:3417-3470`)."""
    prefill, decode = backends
    if kv_cache_dtype != "fp8_e4m3" or decode is None:
        return False
    local = decode if role == "decode" else prefill
    return local != "trtllm" and not prefill == decode == "tilelang"


def resolved_dsa_kv_scaled(resolved: ResolvedArgs, role: str) -> bool:
    """`dsa_kv_scaled` for a role's resolved values."""
    return dsa_kv_scaled(resolved.kv_cache_dtype, (resolved.dsa_prefill_backend, resolved.dsa_decode_backend), role)


def page_size(arch: ModelArchitecture, requested: int | None, backends: tuple[str | None, str | None],
              backend: str | None = None) -> int:
    """The page size the engine runs: DSA forces 64 x index_kpool whatever --page-size says
    (`arg_groups/model_overrides/deepseek_v2.py:162-173`; profiles carry no index_kpool, which
    defaults to 1 in `configs/model_config.py:530-531`); TensorRT-LLM MLA as the attention or the
    decode backend and CuteDSL MLA in any phase accept only 32 or 64 and turn anything else into
    64 (`arg_groups/overrides.py:1143-1172`; a prefill-only trtllm_mla is not checked there)."""
    if arch.is_dsa:
        return 64
    size = requested or 1
    prefill, decode = backends
    constrained = (backend == "trtllm_mla" or decode == "trtllm_mla"
                   or "cutedsl_mla" in (backend, prefill, decode))
    if constrained and size not in (32, 64):
        return 64
    return size


def resolve(spec: HybridServingSpec, role: Role) -> ResolvedArgs:
    """The resolved values of one role's engine on the fleet's hardware."""
    return resolve_role(spec.architecture(), spec.role(role), spec.hardware, role)


@dataclass(frozen=True)
class Draft:
    """A role's speculative settings as the engine reads them (flag values; None: not given)."""

    algorithm: str
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    ngram_bfs_breadth: int = NGRAM_DEFAULT_BFS_BREADTH


DraftRefusalKind = Literal["shape-without-steps", "steps-without-width", "tree-on-unpaged-backend", "attn-dp"]


@dataclass(frozen=True)
class DraftRefusal:
    """A speculative setting SGLang refuses at startup, with the error the engine raises there."""

    kind: DraftRefusalKind
    error: str
    """The engine's exception as `Type: message`."""
    source: str


def role_draft(spec: HybridServingSpec, role: Role) -> Draft | None:
    """What the engine reads of the role's speculative settings; `engine.extraArgs` can widen NGRAM."""
    breadth = sglang_options.int_value(spec.engine.extra_args, NGRAM_BFS_BREADTH_FLAG)
    return speculative_draft(spec.role(role).speculative, NGRAM_DEFAULT_BFS_BREADTH if breadth is None else breadth)


def speculative_draft(speculative: SpeculativeSpec | None,
                      ngram_bfs_breadth: int = NGRAM_DEFAULT_BFS_BREADTH) -> Draft | None:
    """What the engine reads of a role's speculative settings."""
    if speculative is None:
        return None
    return Draft(speculative.algorithm, speculative.num_steps, speculative.eagle_topk, speculative.num_draft_tokens,
                 ngram_bfs_breadth)


def auto_draft_shape(arch: ModelArchitecture, algorithm: str) -> tuple[int, int, int]:
    """(steps, topk, draft tokens) the engine picks when --speculative-num-steps is unset."""
    if algorithm != "STANDALONE" and arch.hf_architecture in _TREE_DRAFTING_ARCHITECTURES:
        return 5, 4, 8
    return 3, 1, 4


def draft_width(arch: ModelArchitecture, draft: Draft | None) -> int | None:
    """The resolved `speculative_eagle_topk`: candidates kept per draft step, so above 1 the draft
    is a tree, which SGLang pages only on some attention backends. None without speculative
    decoding, and where the engine refuses the settings (numSteps without eagleTopk)."""
    if draft is None:
        return None
    if draft.algorithm == "NGRAM":
        return draft.ngram_bfs_breadth  # _handle_ngram drafts its BFS breadth wide (speculative_hook.py:1309-1313)
    if draft.num_steps is not None:
        return draft.eagle_topk
    return auto_draft_shape(arch, draft.algorithm)[1]


def draft_tokens(arch: ModelArchitecture, draft: Draft | None) -> int | None:
    """The resolved `speculative_num_draft_tokens`: tokens each verify step checks. NGRAM defaults
    to 12 (`speculative_hook.py:1314-1319`); a chain (eagleTopk 1) checks its steps + 1 (1255-1265);
    unset steps take the engine's own shape (1159-1173). None without speculative decoding, and where
    the engine refuses the settings."""
    if draft is None:
        return None
    if draft.algorithm == "NGRAM":
        return draft.num_draft_tokens or NGRAM_DEFAULT_DRAFT_TOKENS
    if draft.num_steps is None:
        return auto_draft_shape(arch, draft.algorithm)[2]
    if draft.eagle_topk == 1:
        return draft.num_steps + 1
    return draft.num_draft_tokens


def role_draft_tokens(spec: HybridServingSpec, role: Role) -> int | None:
    """`draft_tokens` of one role of a fleet."""
    return draft_tokens(spec.architecture(), role_draft(spec, role))


def draft_tree_width(spec: HybridServingSpec, role: Role) -> int | None:
    """`draft_width` of one role of a fleet."""
    return draft_width(spec.architecture(), role_draft(spec, role))


def chooses_attention_backend(args: list[str] | tuple[str, ...]) -> bool:
    """Whether `args` (an argv, or `engine.extraArgs`) name an attention backend themselves,
    however abbreviated."""
    reads = (sglang_options.resolve(arg) for arg in args)
    return any(read is not None and read.flag in ATTENTION_BACKEND_FLAGS for read in reads)


def draft_refusals(arch: ModelArchitecture, draft: Draft | None, resolved: ResolvedArgs, *,
                   backend_chosen: bool = False) -> list[DraftRefusal]:
    """What SGLang refuses of these speculative settings at startup, in the order its hooks check:
    the first is what a start fails with. `backend_chosen`: an attention backend flag overrides
    `resolved`'s backend and page size, so no paging refusal is claimed."""
    if draft is None:
        return []
    refusals: list[DraftRefusal] = []
    width = draft_width(arch, draft)
    tree = width is not None and width > 1 and resolved.page_size > 1 and not backend_chosen
    if draft.algorithm == "NGRAM":
        if tree and resolved.attention_backend not in NGRAM_TREE_PAGING_BACKENDS:
            refusals.append(DraftRefusal(
                "tree-on-unpaged-backend",
                f"ValueError: speculative_eagle_topk({width}) > 1 with page_size({resolved.page_size}) > 1 is "
                "unstable and produces incorrect results for paged attention backends. This combination is only "
                "supported for the 'flashinfer' backend.", "arg_groups/speculative_hook.py:1355-1365"))
        if resolved.attn_dp > 1:
            refusals.append(DraftRefusal(
                "attn-dp", "ValueError: Currently ngram speculative decoding does not support dp attention.",
                "arg_groups/speculative_hook.py:1366-1370"))
        return refusals
    if draft.algorithm == "STANDALONE" and resolved.attn_dp > 1:
        refusals.append(DraftRefusal(
            "attn-dp", "ValueError: Currently standalone speculative decoding does not support dp attention.",
            "arg_groups/speculative_hook.py:1078-1084"))
    if draft.num_steps is None and (draft.eagle_topk is not None or draft.num_draft_tokens is not None):
        refusals.append(DraftRefusal("shape-without-steps", "AssertionError: ",
                                     "arg_groups/speculative_hook.py:1159-1163"))
    elif draft.num_steps is not None and draft.eagle_topk is None:
        refusals.append(DraftRefusal(
            "steps-without-width", "TypeError: '>' not supported between instances of 'NoneType' and 'int'",
            "arg_groups/speculative_hook.py:1273-1277"))
    elif tree and resolved.attention_backend not in TREE_PAGING_BACKENDS:
        refusals.append(DraftRefusal(
            "tree-on-unpaged-backend",
            f"ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on {TREE_PAGING_BACKENDS}; "
            f"got attention_backend={resolved.attention_backend!r}. Use page_size == 1 or one of those backends.",
            "arg_groups/speculative_hook.py:1268-1283"))
    return refusals


def resolve_role(arch: ModelArchitecture, rs: RoleSpec, hardware: HardwareSpec, role: Role) -> ResolvedArgs:
    """`resolve` for one role's spec, model and hardware."""
    layout = rs.layout
    speculative = rs.speculative
    gpu = hardware.gpu
    return resolve_values(
        arch, role=role, gpu_mem_mib=hardware_memory_mib(hardware), tp=layout.tp, pp=layout.pp,
        attn_dp=layout.attn_dp, attn_cp=layout.attn_cp, dcp=layout.dcp,
        compute_capability_major=gpu.compute_capability_major if gpu else None,
        max_running_requests=rs.max_running_requests,
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
                   chunked_prefill_size: int | None = None, attn_cp: int = 1,
                   compute_capability_major: int | None = None) -> ResolvedArgs:
    """The resolution from the flag values themselves (what the SGLang simulator starts from);
    `compute_capability_major` None is an undeclared GPU, taken as the default H200."""
    chunked, decode_max_bs = gpu_memory_defaults(gpu_mem_mib, tp)
    if chunked_prefill_size is not None:
        chunked = chunked_prefill_size
    if max_running_requests is not None and decode_max_bs > max_running_requests:
        decode_max_bs = max_running_requests  # memory_hook.py:182-188
    cap = max_running_requests
    if cap is None and speculative_algorithm is not None:
        cap = SPECULATIVE_DEFAULT_MAX_RUNNING_REQUESTS
    backends = attention_backends(arch, dcp, compute_capability_major)
    backend = attention_backend(arch, backends, compute_capability_major)
    if backend == "fa3" and kv_cache_dtype == "fp8_e5m2":
        backend = "triton"  # FlashAttention 3 reads FP8 as e4m3 only (arg_groups/overrides.py:1262-1270)
    dsa: tuple[str | None, str | None] = (None, None)
    if arch.is_dsa:
        kv_cache_dtype = dsa_kv_cache_dtype(kv_cache_dtype, compute_capability_major)
        dsa = dsa_backends(kv_cache_dtype, dcp, compute_capability_major)
    fraction = mem_fraction_static
    if fraction is None:
        # The memory hook runs before the attention-DP split of chunked prefill and before the
        # EAGLE cap (arg_groups/pipeline.py:218, 274, 306), so it sees neither.
        fraction = _mem_fraction_static(
            arch, role=role, gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, attn_dp=attn_dp, attn_cp=attn_cp, dcp=dcp,
            chunked_prefill_size=chunked, decode_max_bs=decode_max_bs,
            max_running_requests=max_running_requests, num_draft_tokens=num_draft_tokens,
            moe_a2a_backend=moe_a2a_backend,
        )
    return ResolvedArgs(
        chunked_prefill_size=chunked // attn_dp,
        decode_cuda_graph_max_bs=decode_max_bs,
        mem_fraction_static=fraction,
        max_running_requests=cap,
        page_size=page_size(arch, page_size_flag, backends, backend),
        kv_cache_dtype=kv_cache_dtype,
        prefill_attention_backend=backends[0],
        decode_attention_backend=backends[1],
        attention_backend=backend,
        attn_dp=attn_dp,
        dsa_prefill_backend=dsa[0],
        dsa_decode_backend=dsa[1],
    )


def kv_dtype_refusal(arch: ModelArchitecture, resolved: ResolvedArgs) -> str | None:
    """The engine's start-up error for a KV cache dtype its attention backends cannot read, or None:
    DeepSeek DSA models take bf16 or fp8_e4m3 (`arg_groups/overrides.py:541-544`), as do the
    TensorRT-LLM and CuteDSL MLA backends (1203-1217, 1247-1255)."""
    if resolved.kv_cache_dtype in ("auto", "bf16", "bfloat16", "fp8_e4m3"):
        return None
    if arch.is_dsa:
        return "AssertionError: DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"
    backends = {resolved.prefill_attention_backend, resolved.decode_attention_backend, resolved.attention_backend}
    if "trtllm_mla" in backends:
        return "ValueError: TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."
    if "cutedsl_mla" in backends:
        return "ValueError: CuteDSL MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto."
    return None


def required_compute_capability(resolved: ResolvedArgs) -> int | None:
    """The CUDA compute capability major the resolved attention backends need: trtllm_mla and
    cutedsl_mla raise off SM100 (`arg_groups/overrides.py:1204-1213, 1233-1246`)."""
    backends = {resolved.prefill_attention_backend, resolved.decode_attention_backend, resolved.attention_backend}
    if backends & {"trtllm_mla", "cutedsl_mla"}:
        return SM100_MAJOR
    return None


def hardware_memory_mib(hardware: HardwareSpec) -> float:
    return float(hardware.memory_gib) * MIB_PER_GIB
