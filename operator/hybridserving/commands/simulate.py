"""`hybridserving simulate`: replay a trace through the fleet simulator under one policy.

    hybridserving simulate --trace mix-shift --policy ours [--instances 8] [--gpu B300]
                           [--rate-scale 1.5] [--goodput] [-o json] [--plot out.png]

`--trace` is a workload name (mix-shift, diurnal, agentic, mooncake) or a trace file (Azure CSV
or Mooncake JSONL). Dynamic policies start from the best static split at the chosen rate and use
the first setting of their benchmark sweep. `--gpu` names the GPU type of the instances (a
`hardware.gpuType`); the default is B300, the GPU the performance model is calibrated on and the
named workloads' SLOs were set for.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TextIO

from hybridserving.api.v1alpha1 import GPU_TYPES
from hybridserving.commands.output import positive_number, whole_number, write_error, write_json
from hybridserving.core.perfmodel import CALIBRATION_GPU
from hybridserving.fleetsim import traces
from hybridserving.fleetsim.experiment import (
    DEFAULT_SLO,
    POLICIES,
    Runner,
    Workload,
    fleet_model,
    load_workload,
    policy_sweeps,
    traces_dir,
)

WORKLOADS = ("mix-shift", "diurnal", "agentic", "mooncake")
# What one run replays at most: the simulator holds every request's record in memory and ticks
# every few seconds of trace time, so past these a run takes many minutes and gigabytes (the
# workloads above replay about 100 K requests over one to two hours at their reference rates).
MAX_REQUESTS = 2_000_000
MAX_SPAN_S = 7 * 86400.0
MAX_TOKENS = 10_000_000
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
MOONCAKE_KEYS = "timestamp (ms), input_length, output_length and optionally hash_ids"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "simulate", help="replay a trace through the fleet simulator under one role-switch policy"
    )
    p.add_argument("--trace", required=True, help="mix-shift | diurnal | agentic | mooncake | path to .csv/.jsonl")
    p.add_argument("--policy", required=True, choices=POLICIES)
    # At least one instance per role; at most spec.scaling.maxReplicas allows.
    p.add_argument("--instances", type=whole_number(2, 1024), default=8, help="instances of 8 GPUs (default 8)")
    p.add_argument("--gpu", type=str.upper, choices=tuple(GPU_TYPES), default=CALIBRATION_GPU,
                   help=f"GPU type of the instances (default {CALIBRATION_GPU}, the calibration GPU)")
    p.add_argument("--rate-scale", type=positive_number, default=1.0, help="multiply the trace's request rate")
    p.add_argument("--goodput", action="store_true", help="also search the highest rate with ≥90%% SLO attainment")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--plot", type=png_path, help="write a PNG of load, split and SLO attainment over time")
    p.set_defaults(func=run)


def png_path(text: str) -> Path:
    """An argparse type: where to write the PNG, named as such. Another suffix failed in the
    plotting library after the whole run, and a path without one was written with `.png` added."""
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text!r} does not end in .png: name the file the PNG is written to")
    return path


class TraceError(Exception):
    """A trace that cannot be replayed: what is wrong with it and what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


def _workload(spec: str) -> Workload:
    """The workload `--trace` names, or TraceError: a file that is not there or not in the format its
    suffix says would otherwise surface as whichever exception the reader happened to hit first."""
    path = Path(spec)
    if path.suffix in (".csv", ".jsonl"):
        csv = path.suffix == ".csv"
        fix = (f"give a CSV whose header is {AZURE_HEADER}, with wall-clock times" if csv
               else f"give one JSON object per line with {MOONCAKE_KEYS}")
        try:
            trace = traces.read_azure_csv(path) if csv else traces.read_mooncake_jsonl(path)
        except OSError as exc:
            raise TraceError(f"{spec}: {exc.strerror or exc}", "check the path") from None
        except KeyError as exc:
            raise TraceError(f"{spec}: a record has no {exc.args[0]!r}", fix) from None
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:  # bad numbers, times, JSON
            raise TraceError(f"{spec}: not {'an Azure CSV' if csv else 'a Mooncake JSONL'} trace: {exc}", fix) from None
        workload = Workload(path.stem, path.name, trace, DEFAULT_SLO)
    elif spec in WORKLOADS:
        try:
            workload = load_workload(spec)
        except OSError as exc:
            raise TraceError(
                f"{spec} reads {exc.filename}, which is missing ({exc.strerror})",
                f"set HYBRIDSERVING_TRACES to the directory that holds the traces (now {traces_dir()})",
            ) from None
    else:
        raise TraceError(
            f"{spec!r} is neither a workload nor a .csv or .jsonl file",
            f"use one of {', '.join(WORKLOADS)}, or the path of an Azure .csv or a Mooncake .jsonl trace",
        )
    trace = workload.trace
    if trace.rate <= 0:
        # No rate to scale and no span to simulate: every figure would be zero, reported as a success.
        raise TraceError(f"{spec}: {len(trace)} request(s) over 0 s, no request rate",
                         "give a trace with at least two requests at different times")
    span = float(trace.arrival_s[-1])
    if span > MAX_SPAN_S:
        raise TraceError(f"{spec}: the requests span {span / 86400:,.1f} days; one run replays at most "
                         f"{MAX_SPAN_S / 86400:.0f}", "give a shorter part of the trace")
    longest = int(max(trace.prompt_tokens.max(), trace.output_tokens.max()))
    if longest > MAX_TOKENS:
        raise TraceError(f"{spec}: a request of {longest:,} tokens, beyond any model's context",
                         f"give requests of at most {MAX_TOKENS:,} prompt and output tokens")
    return workload


def check_rate(workload: Workload, rate_scale: float) -> TraceError | None:
    """Why `--rate-scale` asks more than one run replays, or None: at load L every request is
    copied up to ceil(L) times (`Trace.at_load`)."""
    copies = len(workload.trace) * math.ceil(rate_scale)
    if copies <= MAX_REQUESTS:
        return None
    return TraceError(f"{rate_scale:g}x the trace's {len(workload.trace):,} requests is up to {copies:,} requests; "
                      f"one run replays at most {MAX_REQUESTS:,}",
                      f"lower --rate-scale to at most {MAX_REQUESTS // len(workload.trace)}, or give a shorter trace")


def run(args: argparse.Namespace, out: TextIO) -> int:
    as_json = args.output == "json"
    try:
        w = _workload(args.trace)
    except TraceError as err:
        return write_error(out, as_json, "--trace", err.message, err.fix)
    if args.plot and args.policy == "per-window":
        return write_error(out, as_json, "--plot", "per-window scores each window as its own split; there is no "
                           "one run to plot", "plot another policy (hindsight plots the oracle's schedule)")
    if (too_many := check_rate(w, args.rate_scale)) is not None:
        return write_error(out, as_json, "--rate-scale", too_many.message, too_many.fix)
    model = fleet_model(gpu=args.gpu)
    runner = Runner(w, args.instances, model, iterations=7)
    slo = w.slo
    split, static_att = runner.best_static(args.rate_scale)
    result = None
    if args.policy == "static":
        result = runner.statics(args.rate_scale)[split - 1]
        attainment = static_att

        def at(s: float) -> float:
            return runner.best_static(s)[1]

    elif args.policy == "hindsight":
        attainment, schedule = runner.hindsight(args.rate_scale)
        # None: no schedule beats the best static split, which is then the oracle's run.
        result = schedule or runner.statics(args.rate_scale)[split - 1]

        def at(s: float) -> float:
            return runner.hindsight(s)[0]

    elif args.policy == "per-window":
        attainment = runner.per_window(args.rate_scale)

        def at(s: float) -> float:
            return runner.per_window(s)

    else:
        sweep = policy_sweeps(model, slo, quick=True)[args.policy]
        setting = sweep.grid[0]
        costs = {"in_place": sweep.in_place, "free": sweep.free_switches}
        result = runner.simulate(args.rate_scale, split, sweep.make(**setting), name=args.policy, **costs)
        attainment = runner.score(result, args.rate_scale)

        def at(s: float) -> float:
            k, _ = runner.best_static(s)
            return runner.score(runner.simulate(s, k, sweep.make(**setting), name=args.policy, **costs), s)

    summary = {
        "trace": w.key,
        "policy": args.policy,
        "instances": args.instances,
        "gpus": args.instances * 8,
        "gpuType": args.gpu,
        "rateScale": args.rate_scale,
        "rateRps": w.trace.rate * args.rate_scale,
        "initialSplit": {"prefill": split, "decode": args.instances - split},
        "slo": {"ttftSeconds": slo.ttft_s, "tpotSeconds": slo.tpot_s},
        "attainment": attainment,
        "switches": result.switches if result else 0,
        "drainSeconds": result.drain_s if result else 0.0,
        "switchSeconds": result.switch_s if result else 0.0,
    }
    if args.goodput:
        scale = runner.goodput(at)
        summary["goodputRps"] = w.trace.rate * scale
        summary["goodputRpsPerGpu"] = w.trace.rate * scale / (args.instances * 8)
    if args.plot and result is not None:
        from hybridserving.fleetsim.plot import plot_runs

        plot_runs(args.plot, runner.trace_at(args.rate_scale), [result], slo)
        summary["plot"] = str(args.plot)
    if args.output == "json":
        write_json(summary, out)
    else:
        for key, value in summary.items():
            out.write(f"{key}: {value}\n")
    return 0
