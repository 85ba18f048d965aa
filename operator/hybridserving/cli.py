"""`hybridserving`: the pure core from a terminal, before anything is applied to a cluster.

Exit codes: 0 success, 1 the input is invalid (every error printed with its field and fix),
2 a usage error, 3 `upgrade-check --exit-code` found an instance this version would roll, 4 a
fleet it would stop planning, 141 the reader of the output closed it early. `-o json` output is
stable: keys are camelCase and only ever added to.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TextIO, cast

from hybridserving.api.profiles import PROFILES
from hybridserving.api.v1alpha1 import HardwareSpec
from hybridserving.commands import chartvalues, render, rollback, simulate, status, upgrade
from hybridserving.commands.output import (
    EXIT_INVALID,
    EXIT_OK,
    Printable,
    load_manifests,
    whole_number,
    write_error,
    write_json,
    write_manifest_errors,
    write_table,
)
from hybridserving.core import capacity, transfer
from hybridserving.core.fleet import FleetAssessment, assess, issue_to_dict
from hybridserving.core.privileges import with_default_image
from hybridserving.manifests import ManifestInvalid


def _gib(text: str) -> float:
    """An argparse type for --gpu-memory-gib: HardwareSpec.gpuMemoryGib's range."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 4096:
        raise argparse.ArgumentTypeError(f"{text} is out of range: use the GiB of one GPU, above 0 and at most 4096")
    return value


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _human_tokens(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} K"
    return f"{n:.0f}"


def cmd_validate(args: argparse.Namespace, out: TextIO) -> int:
    try:
        if args.file == "-" and "-" in args.values:
            raise ManifestInvalid("<stdin>", [chartvalues.ONE_STDIN])
        policy = chartvalues.read(args.values).policy() if args.values else None
    except ManifestInvalid as err:
        write_manifest_errors(err, out, args.output == "json")
        return EXIT_INVALID
    docs = load_manifests(args.file, out, args.output == "json")
    if docs is None:
        return EXIT_INVALID
    # With the installation's values, the image judged is the one that would run (its default
    # where the spec names none), as the reconcile judges it.
    results = [(hs, assess((with_default_image(hs, policy) if policy else hs).spec, policy=policy)) for hs in docs]
    if args.output == "json":
        write_json(
            [{"name": hs.metadata.name, "valid": a.valid, "issues": [issue_to_dict(i) for i in a.issues]}
             for hs, a in results],
            out,
        )
    else:
        for hs, a in results:
            out.write(f"{hs.metadata.name}: {'valid' if a.valid else 'invalid'}\n")
            for issue in a.issues:
                out.write(f"  {issue.severity}: {issue.path}: {issue.message} [{issue.rule}]\n")
                out.write(f"  {' ' * len(issue.severity)}  fix: {issue.fix}\n")
    return EXIT_OK if all(a.valid for _, a in results) else EXIT_INVALID


def _print_plan(name: str, a: FleetAssessment, out: TextIO) -> None:
    out.write(f"HybridServing {name}\n")
    rows = [["ROLE", "INSTANCES", "NODES/INST", "PODS", "GPUS/POD", "GPUS", "WORLD", "KV TOKENS/INST", "POOL/RANK"]]
    for role, plan in a.roles.items():
        cap = plan.capacity
        rows.append([
            role, str(plan.instances), str(plan.nodes_per_instance), str(plan.pods), str(plan.gpus_per_pod),
            str(plan.gpus), str(plan.world_size),
            _human_tokens(cap.tokens) if cap else "-", _human_bytes(cap.pool_bytes) if cap else "-",
        ])
    write_table(rows, out)
    out.write(f"decode KV capacity, whole fleet: {_human_tokens(a.decode_tokens_total)} tokens\n")
    if a.in_place_switch:
        out.write("role switch: in place (POST /pd_role_switch)\n")
    else:
        out.write("role switch: by relaunch on the same pods; not in place because:\n")
        for reason in a.switch_reasons:
            out.write(f"  - {reason}\n")
    for role, plan in a.roles.items():
        for rank, argv in enumerate(plan.argv_by_rank):
            out.write(f"\n{role} node rank {rank}:\n  python3 -m sglang.launch_server {shlex.join(argv)}\n")
    for issue in a.issues:
        out.write(f"{issue.severity}: {issue.path}: {issue.message}\n  fix: {issue.fix}\n")


def cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    docs = load_manifests(args.file, out, args.output == "json")
    if docs is None:
        return EXIT_INVALID
    results = [(hs, assess(hs.spec)) for hs in docs]
    if args.output == "json":
        write_json([{"name": hs.metadata.name, **a.to_dict()} for hs, a in results], out)
    else:
        for hs, a in results:
            if a.valid:
                _print_plan(hs.metadata.name, a, out)
            else:
                out.write(f"{hs.metadata.name}: invalid, nothing to plan\n")
                for issue in a.errors:
                    out.write(f"  error: {issue.path}: {issue.message}\n         fix: {issue.fix}\n")
    return EXIT_OK if all(a.valid for _, a in results) else EXIT_INVALID


# The spec field each `capacity` flag stands for, as the core's errors name them.
CAPACITY_FLAGS = {"hardware.gpuMemoryGib": "--gpu-memory-gib", "decode.layout.tp": "--tp",
                  "decode.layout.dcp": "--dcp"}


def cmd_capacity(args: argparse.Namespace, out: TextIO) -> int:
    arch = PROFILES[args.model]
    hardware = HardwareSpec(gpu_memory_gib=args.gpu_memory_gib) if args.gpu_memory_gib else None
    role = None
    if hardware is not None:
        from hybridserving.api.v1alpha1 import LayoutSpec, RoleSpec

        role = RoleSpec(layout=LayoutSpec(tp=args.tp, dcp=args.dcp))
    try:
        report = capacity.capacity_report(
            arch, args.dcp, args.index, hardware=hardware, role=role, context_len=args.context
        )
    except capacity.CapacityError as err:
        # The core names spec fields; here the user gave flags, so name the flag the field came from
        # (without the hardware, the TP is --dcp's).
        flag = "--dcp" if hardware is None and err.field_path == "decode.layout.tp" else CAPACITY_FLAGS.get(
            err.field_path)
        where = f"{flag} ({err.field_path})" if flag else err.field_path
        return write_error(out, args.output == "json", where, err.message, err.fix)
    data = report.to_dict()
    if args.output == "json":
        write_json({"model": args.model, **data}, out)
        return EXIT_OK
    per_rank = data["bytesPerRank"]
    rows = [["MODEL", "DCP", "INDEX", "KV B/TOK", "INDEX B/TOK", "DRAFT B/TOK", "TOTAL B/TOK", "GAIN VS DCP1"]]
    rows.append([
        args.model, str(args.dcp), args.index, f"{per_rank['kv']:,.1f}", f"{per_rank['index']:,.1f}",
        f"{per_rank['draft']:,.1f}", f"{per_rank['perToken']:,.1f}", f"{data['gainOverDcp1']:.2f}x",
    ])
    write_table(rows, out)
    if per_rank["statePerRequest"]:
        out.write(f"recurrent state per request per rank: {_human_bytes(per_rank['statePerRequest'])}\n")
    if data["gainAtContext"] is not None:
        out.write(f"gain at {args.context:,} tokens of context: {data['gainAtContext']:.2f}x\n")
    if data["instance"] is not None:
        inst = data["instance"]
        out.write(
            f"tokens per instance (tp={args.tp}, {args.gpu_memory_gib} GiB/GPU): "
            f"{_human_tokens(inst['tokensPerInstance'])} (pool {_human_bytes(inst['poolBytesPerRank'])} per rank)\n"
        )
        if data["maxRequestsAtContext"] is not None:
            out.write(f"max requests at {args.context:,} tokens: {data['maxRequestsAtContext']}\n")
    return EXIT_OK


# The plan lists every page and filters them once per decode rank; past this many pages a request
# takes seconds per rank and gigabytes. 10 M tokens of 64-token pages is 156,250 pages.
MAX_TRANSFER_PAGES = 200_000


def cmd_transfer_plan(args: argparse.Namespace, out: TextIO) -> int:
    arch = PROFILES[args.model]
    if args.prefill_cp > arch.layers:
        # Layer-split gives each CP rank a contiguous range of layers: past one layer each, the rest hold none.
        return write_error(out, args.output == "json", "--prefill-cp",
                           f"{args.prefill_cp} ranks split {args.model}'s {arch.layers} layers, leaving ranks "
                           "with none",
                           f"use at most {arch.layers}")
    pages = -(-args.tokens // args.page_size)
    if pages > MAX_TRANSFER_PAGES:
        return write_error(out, args.output == "json", "--tokens",
                           f"{args.tokens:,} tokens are {pages:,} pages of {args.page_size}, more than the "
                           f"{MAX_TRANSFER_PAGES:,} one plan lists",
                           f"raise --page-size to at least {-(-args.tokens // MAX_TRANSFER_PAGES)} or lower --tokens")
    try:
        plan = transfer.plan_transfer(arch, args.prefill_cp, args.decode_dcp, args.tokens, args.page_size)
    except ValueError as err:  # the flags are in range above: what is left is a model it does not apply to
        whole_mla = ", ".join(name for name, a in sorted(PROFILES.items()) if a.mla_layers == a.layers)
        return write_error(out, args.output == "json", "--model", str(err),
                           f"use a model whose every layer is MLA: {whole_mla}")
    summary = plan.summary()
    if args.output == "json":
        write_json({"model": args.model, **summary}, out)
        return EXIT_OK
    out.write(
        f"{args.model}: {args.tokens:,} tokens, {plan.total_pages:,} pages of {args.page_size} tokens, "
        f"prefill CP {args.prefill_cp} x decode DCP {args.decode_dcp} = {args.prefill_cp * args.decode_dcp} paths\n"
    )
    rows = [["PREFILL RANK", "LAYERS", "COUNT"]]
    for r, (start, stop) in enumerate(plan.layer_ranges()):
        rows.append([str(r), f"{start}-{stop - 1}", str(stop - start)])
    write_table(rows, out)
    rows = [["DECODE RANK", "PAGES", "TOKENS", "BYTES IN"]]
    for d in range(args.decode_dcp):
        rows.append([
            str(d), f"{len(plan.pages[d]):,}", f"{int(plan.rank_tokens[d]):,}",
            _human_bytes(float(plan.path_bytes[:, d].sum())),
        ])
    write_table(rows, out)
    least, most = _human_bytes(float(plan.path_bytes.min())), _human_bytes(float(plan.path_bytes.max()))
    out.write(f"bytes per path: {least} .. {most}\n")
    out.write(
        f"total: {_human_bytes(plan.total_bytes)}; naive send-all-then-reshard: {_human_bytes(plan.naive_bytes)} "
        f"({plan.discarded_fraction:.0%} of it discarded)\n"
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridserving", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace, TextIO], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.set_defaults(func=func)
        p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        return p

    p = add("validate", cmd_validate, "check a manifest: every error with its field path and fix")
    p.add_argument("-f", "--file", required=True)
    p.add_argument("--values", action="append", default=[], metavar="FILE",
                   help="the operator's chart values (repeatable, merged as by helm): check what its "
                        "enginePolicy grants too (default: left to the cluster)")
    p = add("plan", cmd_plan, "per role: instances, pods, GPUs, argv per node rank, capacity, role switch mode")
    p.add_argument("-f", "--file", required=True)
    p = add("capacity", cmd_capacity, "per-rank bytes per token and the gain of decode context parallelism")
    p.add_argument("--model", required=True, choices=sorted(PROFILES))
    p.add_argument("--dcp", type=whole_number(1, 1024), default=1)
    p.add_argument("--index", choices=["copied", "split"], default="copied")
    p.add_argument("--tp", type=whole_number(1, 1024), default=8, help="TP of the instance (with --gpu-memory-gib)")
    p.add_argument("--gpu-memory-gib", type=_gib, default=None, help="give the hardware to get tokens per instance")
    p.add_argument("--context", type=whole_number(1), default=None,
                   help="context length for the gain and the request frontier")
    p = add("transfer-plan", cmd_transfer_plan, "the 2D reshard plan from prefill CP layer-split to decode DCP")
    p.add_argument("--model", required=True, choices=sorted(PROFILES))
    # The API's bounds on layout.attnCp, layout.dcp and pageSize; no model reads more than 10 M tokens.
    p.add_argument("--prefill-cp", type=whole_number(1, 1024), required=True)
    p.add_argument("--decode-dcp", type=whole_number(1, 1024), required=True)
    p.add_argument("--tokens", type=whole_number(1, 10_000_000), required=True)
    p.add_argument("--page-size", type=whole_number(1, 4096), default=transfer.DEFAULT_PAGE_SIZE)
    simulate.register(sub)
    status.register(sub)
    rollback.register(sub)
    render.register(sub)
    upgrade.register(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace, TextIO], int] = args.func
    try:
        return command(args, cast(TextIO, Printable(out or sys.stdout)))
    except BrokenPipeError:
        # The reader left (`| head`): no traceback, and the status of a writer the pipe's SIGPIPE
        # ended, as for any Unix tool. Python would report the pipe again when it flushes stdout
        # at exit; point stdout at nothing first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
