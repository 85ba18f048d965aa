"""SGLang 0.5.23 `launch_server` flags as the simulator reads them, plus its own environment knobs.

The operator renders one argv per role for SGLang; the simulator must accept exactly what SGLang
accepts. It parses the flags that change what it serves with SGLang's names, aliases and
defaults, and accepts every other flag of the 0.5.23 parser with its arity from
the flag table the operator resolves `engine.extraArgs` against (`hybridserving.contract.sglang_flags`), so an
unknown or ambiguous flag exits with status 2 as `sglang serve` does. A few of SGLang's own
start-up rejections are repeated here, so that a layout SGLang would refuse does not start as a
simulator either.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import cast

from hybridserving.api.v1alpha1 import DEFAULT_GPU_TYPE, GPU_TYPES, GpuTypeName, HardwareSpec, LayoutSpec, Role
from hybridserving.contract import sglang_flag_values, sglang_flags
from hybridserving.core import capacity, resolution
from hybridserving.api.profiles import ModelArchitecture, resolve_profile
from hybridserving.core.resolution import ResolvedArgs

log = logging.getLogger("hybridserving.simulator")

DEFAULT_PROFILE = "glm-5.2"
DEFAULT_CONTEXT_LENGTH = 131072
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")


def build_parser() -> argparse.ArgumentParser:
    """The subset of SGLang's parser whose flags change what the simulator serves."""
    p = argparse.ArgumentParser(prog="hybridserving_engine.simulator", description=__doc__)
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", default="simulated-model")
    a("--served-model-name", dest="served_model_name", default=None)
    a("--tokenizer-path", dest="tokenizer_path", default=None)
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int, default=1)
    a("--enable-dp-attention", action="store_true")
    a("--attn-cp-size", "--attention-context-parallel-size", dest="attn_cp_size", type=int, default=1)
    a("--enable-prefill-cp", action="store_true")
    a("--cp-strategy", choices=["zigzag", "interleave"], default=None)
    a("--dcp-size", "--decode-context-parallel-size", dest="dcp_size", type=int, default=1)
    a("--dcp-comm-backend", choices=["ag_rs", "a2a", "fi_a2a"], default=None)
    a("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    a("--moe-a2a-backend", default="none")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    a("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    a("--disaggregation-bootstrap-port", type=int, default=8998)
    a("--disaggregation-transfer-backend", choices=TRANSFER_BACKENDS, default="mooncake")
    a("--disaggregation-ib-device", default=None)
    a("--disaggregation-decode-allocation-policy", choices=["early", "prefill_complete"], default="early")
    a("--enable-pd-role-switch", action="store_true")
    a("--num-reserved-decode-tokens", type=int, default=512)
    a("--load-balance-method", default="auto")
    a("--enable-metrics", action="store_true")
    a("--max-running-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--chunked-prefill-size", type=int, default=None)
    a("--context-length", type=int, default=None)
    a("--mem-fraction-static", type=float, default=None)
    a("--page-size", type=int, default=None)
    a("--kv-cache-dtype", default="auto")
    a("--speculative-algorithm", default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-ngram-max-bfs-breadth", type=int, default=resolution.NGRAM_DEFAULT_BFS_BREADTH)
    a("--disable-radix-cache", action="store_true")
    a("--trust-remote-code", action="store_true")
    a("--api-key", default=None)
    a("--tokenizer-worker-num", type=int, default=1)
    a("--admin-api-key", default=None)
    a("--log-level", default="info")
    a("--watchdog-timeout", type=float, default=300)
    a("--soft-watchdog-timeout", type=float, default=None)
    known = set(p._option_string_actions)
    values = sglang_flag_values()
    for option, action in p._option_string_actions.items():
        # A value SGLang's parser refuses (exit 2) is refused here too, modelled flag or not.
        if action.choices is None and "choices" in values.get(option, {}):
            action.choices = values[option]["choices"]
    for option, nargs in sglang_flags().items():
        if option not in known:
            # Accepted as SGLang accepts it, with no effect on a simulation.
            dest = f"unmodelled_{option.lstrip('-').replace('-', '_')}"
            if nargs == 0:
                p.add_argument(option, action="store_const", const=True, dest=dest, default=None,
                               help=argparse.SUPPRESS)
            else:
                accepts = values.get(option, {})
                checked = {"choices": accepts["choices"]} if "choices" in accepts else (
                    {"type": {"int": int, "float": float}[accepts["type"]]} if "type" in accepts else {})
                p.add_argument(option, nargs=nargs, dest=dest, default=None, help=argparse.SUPPRESS, **checked)
    return p


@dataclass(frozen=True)
class SimulatorOptions:
    """What only a simulator has: the model profile, the speed-up and the start-up delay."""

    profile: str
    time_scale: float
    startup_seconds: float | None
    faults: str
    gpu_type: str = DEFAULT_GPU_TYPE
    """The device SGLang would query (its memory and compute capability), by `spec.hardware.gpuType` name."""
    gpu_memory_gib: float | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SimulatorOptions:
        env = dict(os.environ if env is None else env)
        startup = env.get("HYBRIDSERVING_SIM_STARTUP_SECONDS")
        return cls(
            profile=env.get("HYBRIDSERVING_SIM_PROFILE", DEFAULT_PROFILE),
            time_scale=float(env.get("HYBRIDSERVING_SIM_TIME_SCALE", "1.0")),
            startup_seconds=float(startup) if startup else None,
            faults=",".join(filter(None, (env.get("HYBRIDSERVING_SIM_FAULTS", ""),
                                          _read_faults_file(env.get("HYBRIDSERVING_SIM_FAULTS_FILE"))))),
            gpu_type=env.get("HYBRIDSERVING_SIM_GPU_TYPE", DEFAULT_GPU_TYPE),
            gpu_memory_gib=float(env["HYBRIDSERVING_SIM_GPU_MEMORY_GIB"]) if env.get("HYBRIDSERVING_SIM_GPU_MEMORY_GIB")
            else None,
        )


def _read_faults_file(path: str | None) -> str:
    """Faults that outlive a process: every start reads them, so a test can hold an engine in a
    crash loop across the launcher's and the kubelet's restarts, then let it recover."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


class FlagError(ValueError):
    """A flag combination SGLang 0.5.23 refuses at start-up."""


def parse_server_args(argv: list[str]) -> argparse.Namespace:
    """Parse SGLang flags; log each flag the simulator does not model, and refuse what SGLang refuses."""
    args = build_parser().parse_args(argv)  # exits 2 on a flag SGLang would not parse
    unmodelled = sorted("--" + k[len("unmodelled_"):].replace("_", "-")
                        for k, v in vars(args).items() if k.startswith("unmodelled_") and v is not None)
    if unmodelled:
        log.info("simulator ignores SGLang flags it does not model: %s", " ".join(unmodelled))
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.enable_dp_attention and args.dp_size > 1:
        # 0.5.23 turns the deprecated form into attention DP.
        args.attn_dp_size, args.dp_size = args.dp_size, 1
    check_server_args(args)
    return args


def check_server_args(args: argparse.Namespace) -> None:
    """The start-up rejections of SGLang 0.5.23 that decide whether a layout serves at all."""
    mode = args.disaggregation_mode
    if mode == "prefill" and args.disaggregation_transfer_backend == "fake":
        raise FlagError("the fake transfer backend cannot be used on a prefill server")
    if args.dcp_size > 1 and args.enable_prefill_cp:
        raise FlagError("--dcp-size > 1 does not support --enable-prefill-cp.")
    if args.tp_size % args.dcp_size:
        raise FlagError(f"--dcp-size {args.dcp_size} must divide --tp-size {args.tp_size}")
    if (args.tp_size * args.pp_size) % args.nnodes:
        raise FlagError("tp_size * pp_size must be divisible by nnodes")
    if args.tokenizer_worker_num > 1 and args.api_key is not None:
        # Each tokenizer worker asserts it as it starts (entrypoints/http_server.py:258-261).
        raise FlagError("API key is not supported in multi-tokenizer mode")
    if args.enable_pd_role_switch:
        if mode == "null":
            raise FlagError("--enable-pd-role-switch requires --disaggregation-mode prefill or decode")
        blockers = {
            "--ep-size > 1": args.ep_size > 1,
            "--moe-a2a-backend": args.moe_a2a_backend not in (None, "none"),
            "--pp-size > 1": args.pp_size > 1,
            "--dcp-size > 1": args.dcp_size > 1,
            "--speculative-algorithm": args.speculative_algorithm is not None,
        }
        bad = [name for name, hit in blockers.items() if hit]
        if bad:
            raise FlagError(f"--enable-pd-role-switch is not supported with {', '.join(bad)}")


def speculative_draft(args: argparse.Namespace) -> resolution.Draft | None:
    """The speculative flags, as `core.resolution` reads them for the operator's fleets too."""
    if args.speculative_algorithm is None:
        return None
    return resolution.Draft(args.speculative_algorithm, args.speculative_num_steps, args.speculative_eagle_topk,
                            args.speculative_num_draft_tokens, args.speculative_ngram_max_bfs_breadth)


def reserved_tokens(args: argparse.Namespace, arch: ModelArchitecture) -> int:
    """The output slots an EAGLE request holds on top of its input, which the tokenizer manager
    adds to the prompt's length before checking it against the context
    (`managers/tokenizer_manager.py:1333-1335`, `managers/utils.py:484-500`): EAGLE stores its draft
    tokens there. NEXTN is EAGLE under another name (`arg_groups/speculative_hook.py:109-115`);
    without `--speculative-num-steps` the draft shape is chosen for the model (lines 1159-1173),
    and a single branch verifies one token past its steps (lines 1255-1266)."""
    if args.speculative_algorithm not in ("EAGLE", "EAGLE3", "NEXTN"):
        return 0
    steps, topk, draft = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    if steps is None:
        steps, topk, draft = resolution.auto_draft_shape(arch, args.speculative_algorithm)
    if topk == 1:
        draft = steps + 1
    return int(max(topk * steps, draft))


def simulated_gpu(options: SimulatorOptions) -> GpuTypeName:
    """The GPU model the simulator stands in for: it decides SGLang's resolution and the timings."""
    if options.gpu_type not in GPU_TYPES:
        raise FlagError(f"unknown simulated GPU type {options.gpu_type!r}; use one of {', '.join(GPU_TYPES)}")
    return cast(GpuTypeName, options.gpu_type)


def resolve_server_args(args: argparse.Namespace, options: SimulatorOptions) -> ResolvedArgs:
    """SGLang's start-up resolution of `args` on the declared device (`core.resolution`, each
    rewrite with the source line it mirrors); refuses what SGLang refuses on that device."""
    gpu = GPU_TYPES[simulated_gpu(options)]
    memory_gib = options.gpu_memory_gib or gpu.memory_gib
    arch = resolve_profile(options.profile)
    resolved = resolution.resolve_values(
        arch, role=args.disaggregation_mode, gpu_mem_mib=memory_gib * 1024,
        tp=args.tp_size, pp=args.pp_size, attn_dp=args.attn_dp_size, attn_cp=args.attn_cp_size, dcp=args.dcp_size,
        compute_capability_major=gpu.compute_capability_major,
        max_running_requests=args.max_running_requests, page_size_flag=args.page_size,
        kv_cache_dtype=args.kv_cache_dtype, mem_fraction_static=args.mem_fraction_static,
        speculative_algorithm=args.speculative_algorithm, num_draft_tokens=args.speculative_num_draft_tokens,
        moe_a2a_backend=args.moe_a2a_backend, chunked_prefill_size=args.chunked_prefill_size,
    )
    if resolved.page_size < 1:  # SGLang divides by it (arg_groups/validation_hook.py:244)
        raise FlagError(f"--page-size must be at least 1, got {args.page_size}")
    needed = resolution.required_compute_capability(resolved)
    if needed is not None and gpu.compute_capability_major != needed:
        backends = sorted({b for b in (resolved.prefill_attention_backend, resolved.decode_attention_backend) if b})
        raise FlagError(f"{' and '.join(backends)} attention is only supported on Blackwell GPUs (SM100); "
                        f"the simulated GPU is {options.gpu_type} (arg_groups/overrides.py:1210-1213, 1243-1246)")
    refusal = resolution.kv_dtype_refusal(arch, resolved)
    if refusal is not None:
        raise FlagError(f"{refusal} (arg_groups/overrides.py:541-544, 1203-1217, 1247-1255)")
    chosen = any(getattr(args, "unmodelled_" + flag.lstrip("-").replace("-", "_")) is not None
                 for flag in resolution.ATTENTION_BACKEND_FLAGS)
    refusals = resolution.draft_refusals(arch, speculative_draft(args), resolved, backend_chosen=chosen)
    if refusals:
        raise FlagError(f"{refusals[0].error} ({refusals[0].source})")
    return resolved


def keeps_radix_cache(args: argparse.Namespace) -> bool:
    """Whether the server keeps a prefix cache: never on decode, where the disaggregation hook turns it
    off (`arg_groups/pd_disaggregation_hook.py:97-127`), else unless `--disable-radix-cache`."""
    return args.disaggregation_mode != "decode" and not args.disable_radix_cache


# SGLang's refusal of a pool with no tokens (`model_executor/pool_configurator.py:94-99`).
NOT_ENOUGH_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."


def sized_capacity(args: argparse.Namespace, options: SimulatorOptions,
                   resolved: ResolvedArgs) -> capacity.InstanceCapacity:
    """The KV pages and linear-attention states one data-parallel replica sizes at start-up from the
    simulated GPU's memory (`model_executor/pool_configurator.py`, `mem_cache/kv_cache_configurator.py`),
    by the computation the operator plans the fleet with (`core.capacity.engine_capacity`). A layout
    that leaves no pool stops the server at start, as SGLang's pool configurator stops it
    (`model_executor/pool_configurator.py:94-99`)."""
    arch = resolve_profile(options.profile)
    hardware = HardwareSpec(gpu_type=simulated_gpu(options), gpu_memory_gib=options.gpu_memory_gib)
    layout = LayoutSpec(tp=args.tp_size, pp=args.pp_size, attn_dp=args.attn_dp_size, attn_cp=args.attn_cp_size,
                        dcp=args.dcp_size)
    # A server that is not disaggregated verifies drafts as a decode does; its DSA kernels are one pair.
    role: Role = "prefill" if args.disaggregation_mode == "prefill" else "decode"
    try:
        return capacity.engine_capacity(arch, layout, hardware, resolved, draft=speculative_draft(args),
                                        radix_cache=keeps_radix_cache(args), role_name=role)
    except capacity.CapacityError as err:
        raise FlagError(f"{NOT_ENOUGH_MEMORY} Current value: mem_fraction_static={resolved.mem_fraction_static} "
                        f"({err.message}; model_executor/pool_configurator.py:94-99)") from None


def rank_pool_tokens(args: argparse.Namespace, sized: capacity.InstanceCapacity) -> int:
    """One DP rank's KV pool: what its memory holds, lowered by `--max-total-tokens` (each rank's
    scheduler applies it, `mem_cache/kv_cache_configurator.py:3096-3106`) and aligned down to whole
    pages again (3212-3226). A cap below one page leaves no pool, which stops SGLang at start
    (`model_executor/pool_configurator.py:94-99`)."""
    tokens = sized.group_tokens  # at least one page: `sized_capacity` refuses less
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens) // sized.page_size * sized.page_size
        if tokens <= 0:
            raise FlagError(f"{NOT_ENOUGH_MEMORY} (--max-total-tokens {args.max_total_tokens} is less than one "
                            f"page of {sized.page_size} tokens; model_executor/pool_configurator.py:94-99)")
    return tokens
