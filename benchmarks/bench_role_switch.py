"""Does switching roles pay, and does scaling? Goodput of every policy against the hindsight
oracle on four workloads, the overload curve, scaling on a diurnal day, and simulator speed.

    python benchmarks/bench_role_switch.py [--quick] [--out out/] [--workloads mix-shift,mooncake]

Reads the public traces from $HYBRIDSERVING_TRACES (default ../shared/traces). Prints one table
per workload, the targets with MET/MISSED, and writes a PNG per workload under --out. Exits 1
if any policy's goodput exceeds the hindsight oracle's (the oracle would not be a bound).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hybridserving.api.v1alpha1 import GPU_TYPES, GpuTypeName
from hybridserving.core.perfmodel import CALIBRATION_GPU
from hybridserving.core.policy import PolicyConfig, RoleSwitchPolicy
from hybridserving.fleetsim import traces
from hybridserving.fleetsim.baselines import PolicyController
from hybridserving.fleetsim.experiment import (
    POLICIES,
    Comparison,
    compare,
    fleet_model,
    load_workload,
    scaling_comparison,
    traces_dir,
)
from hybridserving.fleetsim.goodput import phase_attainments
from hybridserving.fleetsim.plot import plot_runs
from hybridserving.fleetsim.simulator import FleetConfig, FleetSimulator


def table(c: Comparison) -> str:
    """Goodput, attainment at the trace's rate, and at the reference rate (the best static split's
    goodput, where switching matters) attainment, switches, drain and switch seconds."""
    slo = c.workload.slo
    load_how = "replicating requests on the trace clock" if c.load_mode == "replicate" else "dividing timestamps"
    phases = ", ".join(f"{b:g}" for b in c.workload.bounds)
    rows = [
        f"{c.workload.title} — {len(c.workload.trace)} requests, {c.workload.trace.rate:.2f} req/s at scale 1, "
        f"{c.instances} instances × 8 GPUs; SLO TTFT ≤ {slo.ttft_s:g} s, TPOT ≤ {slo.tpot_s * 1e3:g} ms; "
        f"reference rate {c.workload.trace.rate * c.reference_scale:.2f} req/s (×{c.reference_scale:.3f}), "
        f"the goodput of the best static split ({c.best_static_split} prefill / "
        f"{c.instances - c.best_static_split} decode)",
        f"load varied by {load_how}; "
        f"a rate passes when the total and every phase reach 90 % (phases: {phases} s)",
        f"{'policy':<38}{'goodput req/s':>14}{'per GPU':>9}{'×static':>9}{'×oracle':>9}{'SLO@1×':>8}{'switches':>9}"
        f"{'drain s':>9}{'switch s':>9}"
        f"{'SLO@ref':>9}{'worst phase@ref':>16}{'sw@ref':>8}{'drain@ref':>10}{'switch@ref':>11}  tuning",
    ]
    oracle = c.reports["hindsight"].goodput_rps if "hindsight" in c.reports else float("nan")
    bounds = c.workload.bounds
    static = c.reports["static"].goodput_rps or float("nan")
    for key, r in c.reports.items():
        ref = c.at_reference.get(key)
        at_ref = (
            f"{ref.attainment(slo.ttft_s, slo.tpot_s):>9.3f}{min(phase_attainments(ref, slo, bounds)):>16.3f}"
            f"{ref.switches:>8d}{ref.drain_s:>10.0f}{ref.switch_s:>11.0f}"
            if ref is not None
            else f"{'—':>9}{'—':>16}{'—':>8}{'—':>10}{'—':>11}"
        )
        rows.append(
            f"{r.policy:<38}{r.goodput_rps:>14.2f}{r.goodput_rps_per_gpu:>9.3f}"
            f"{r.goodput_rps / static:>9.2f}{r.goodput_rps / oracle:>9.2f}"
            f"{r.attainment_at_trace_rate:>8.3f}{r.switches:>9d}{r.drain_s:>9.0f}{r.switch_s:>9.0f}{at_ref}  {r.detail}"
        )
    return "\n".join(rows)


def ratio(c: Comparison, a: str, b: str) -> float:
    if a not in c.reports or b not in c.reports:
        return float("nan")
    den = c.reports[b].goodput_rps
    return c.reports[a].goodput_rps / den if den else float("inf")


def verdict(label: str, value: float, need: float, ceiling: float | None = None, ceiling_label: str = "") -> str:
    """MET/MISSED; when the target is above what any switching policy reached here, say so."""
    if value != value:
        return f"NOT RUN {label} (target ≥ {need:.2f})"
    line = f"{'MET   ' if value >= need else 'MISSED'} {label}: {value:.2f} (target ≥ {need:.2f})"
    if value < need and ceiling is not None and ceiling < need:
        line += f" — unreachable on this workload: {ceiling_label} = {ceiling:.2f} < {need:.2f}"
    return line


def speed(quick: bool, gpu: GpuTypeName) -> tuple[float, int, float]:
    """Wall seconds to simulate one hour of a 32-instance fleet at ~50 req/s with our policy."""
    d = traces_dir()
    code = traces.read_azure_csv(d / "AzureLLMInferenceTrace_code.csv")
    conv = traces.read_azure_csv(d / "AzureLLMInferenceTrace_conv.csv")
    mix = traces.mix_shift(code, conv)
    trace = mix.scaled(50.0 / mix.rate)
    trace = trace.window(0, 900.0) if quick else trace
    model = fleet_model(gpu=gpu)
    sim = FleetSimulator(FleetConfig(32, 20, model), PolicyController(RoleSwitchPolicy(PolicyConfig(), model)))
    start = time.process_time()
    sim.run(trace, "ours")
    cpu = time.process_time() - start
    simulated = trace.duration_s
    return cpu * 3600.0 / simulated, len(trace), simulated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer bisection steps, no overload curve on diurnal (CI)")
    ap.add_argument("--out", default="out", help="directory for the PNGs (default out/)")
    ap.add_argument("--workloads", default="mix-shift,diurnal,agentic,mooncake")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--gpu", default=CALIBRATION_GPU, type=str.upper, choices=tuple(GPU_TYPES),
                    help="GPU type the fleet runs on (default: the calibration GPU)")
    ap.add_argument("--load", default="replicate", choices=("replicate", "compress"), help="how load is varied")
    ap.add_argument("--tuned", action="store_true", help="also sweep ours per workload ('ours, tuned')")
    ap.add_argument("--no-scaling", action="store_true", help="skip the scaling comparison")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated subset (static and hindsight always run)")
    args = ap.parse_args(argv)
    if not (traces_dir() / "AzureLLMInferenceTrace_code.csv").exists():
        print(f"traces not found in {traces_dir()}; set HYBRIDSERVING_TRACES", file=sys.stderr)
        return 2
    out = Path(args.out)
    started = time.time()
    model = fleet_model(gpu=args.gpu)
    print(f"mode: {'--quick' if args.quick else 'full'}; GPU {args.gpu}; load {args.load}")
    chosen = {"static", "hindsight", *args.policies.split(",")}
    policies = tuple(p for p in POLICIES if p in chosen) + (("ours-tuned",) if args.tuned else ())
    results: dict[str, Comparison] = {}
    for key in args.workloads.split(","):
        w = load_workload(key)
        print(f"\n== {w.title}", flush=True)
        # The shifting mix, and the agentic waves where a move into a wave can cost more than it gives.
        overload = key in ("mix-shift", "agentic") or (key == "diurnal" and not args.quick)
        c = compare(
            w, instances=args.instances, quick=args.quick, policies=policies, model=model, load_mode=args.load,
            overload=overload, log=lambda s: print(s, flush=True),
        )  # fmt: skip
        results[key] = c
        print(table(c), flush=True)
        if c.overload:
            print("overload curve (load / best static goodput load: best static score, ours score, ours − static):")
            for f, st, ours in c.overload:
                print(f"  {f:4.2f}×  static {st:.3f}  ours {ours:.3f}  {ours - st:+.3f}")
        shown = w.trace.at_load(c.reference_scale) if args.load == "replicate" else w.trace.scaled(c.reference_scale)
        png = plot_runs(out / f"role_switch_{key}.png", shown, c.plotted, w.slo)
        print(f"plot: {png}")

    failures = []
    print("\n== hindsight oracle check (no policy may exceed it; the per-window projection is not a policy)")
    for key, c in results.items():
        bound = c.reports["hindsight"].goodput_rps
        for name, r in c.reports.items():
            # The per-window projection is not a schedule (each window scored with the state its
            # own split built), so it is reported beside the bound, not checked against it.
            if name not in ("hindsight", "per-window") and r.goodput_rps > bound * (1 + 1e-9):
                failures.append(f"{key}: {name} {r.goodput_rps:.2f} > hindsight {bound:.2f}")
        passed = not any(f.startswith(key + ":") for f in failures)
        print(f"  {key}: hindsight {bound:.2f} req/s ≥ every policy: {'PASS' if passed else 'FAIL'}")

    print("\n== targets (ours = shipped defaults, one configuration for every workload)")
    for key in ("mix-shift", "diurnal"):
        if key in results:
            label = "(a)" if key == "mix-shift" else "(b)"
            print(verdict(f"{label} ours / hindsight oracle", ratio(results[key], "ours", "hindsight"), 0.92))
    if "mix-shift" in results:
        a = results["mix-shift"]
        gain = ratio(a, "hindsight", "static")
        print(verdict("(a) ours / best static", ratio(a, "ours", "static"), 1.20, gain, "hindsight / best static"))
        for peer in ("restart-based", "splitwise"):
            print(verdict(f"(a) ours / {peer}", ratio(a, "ours", peer), 1.15, ratio(a, "hindsight", peer),
                          f"hindsight / {peer}"))
    for key, c in results.items():
        if c.overload:
            worst = min(ours - st for _, st, ours in c.overload)
            print(f"{'MET   ' if worst >= -0.02 else 'MISSED'} {key} overload 0.8×–1.2×: "
                  f"ours − static ≥ {worst:+.3f} (target ≥ −0.02)")
    for key, label in (("mooncake", "(d)"), ("agentic", "(c)")):
        if key in results:
            print(verdict(f"{label} ours / best static", ratio(results[key], "ours", "static"), 0.98))
    # Ours is one setting for every workload; so is Splitwise's row "splitwise-one". Its worst
    # workload is what a user of either gets without a sweep per workload.
    for name in ("ours", "splitwise-one"):
        worst = min(((ratio(c, name, "static"), key) for key, c in results.items() if name in c.reports), default=None)
        if worst is not None and len(results) > 1:
            print(f"       one setting, worst workload: {name} {worst[0]:.2f}× best static ({worst[1]})")

    if not args.no_scaling:
        d = traces_dir()
        code = traces.read_azure_csv(d / "AzureLLMInferenceTrace_code.csv")
        conv = traces.read_azure_csv(d / "AzureLLMInferenceTrace_conv.csv")
        print("\n== scaling on a diurnal day", flush=True)
        w, peak, rows = scaling_comparison(code, conv, model=model, log=lambda s: print(s, flush=True))
        print(f"{w.title}; SLO TTFT ≤ 2 s, TPOT ≤ 50 ms; "
              f"launch = {model.launch_seconds():.0f} s (pod start + weight load)")
        print(f"{'fleet':<40}{'SLO':>7}{'worst phase':>12}{'misses':>8}{'GPU-h':>8}{'ups':>5}{'downs':>6}"
              f"{'switches':>9}  setting")
        for r in rows:
            print(f"{r.name:<40}{r.attainment:>7.3f}{r.worst_phase:>12.3f}{r.misses:>8d}{r.gpu_hours:>8.1f}"
                  f"{r.scale_ups:>5d}{r.scale_downs:>6d}{r.switches:>9d}  {r.detail}")
        fixed, bound, ours, planners = rows[0], rows[1], rows[2], rows[3:]
        equal = ours.worst_phase >= 0.9 and ours.attainment >= fixed.attainment - 0.01
        best_saving = bound.gpu_hours / fixed.gpu_hours
        print(
            f"{'MET   ' if equal and ours.gpu_hours <= 0.7 * fixed.gpu_hours else 'MISSED'} "
            "scaling vs peak-sized fleet: "
            f"GPU-hours {ours.gpu_hours / fixed.gpu_hours:.2f}× (target ≤ 0.70) "
            f"at SLO {ours.attainment:.3f} vs {fixed.attainment:.3f}, "
            f"worst phase {ours.worst_phase:.3f}"
            + f"; hindsight sizing {best_saving:.2f}× (an estimate with free, instant launches, not a bound)"
        )
        peers = [p for p in planners if p.gpu_hours <= ours.gpu_hours * 1.05] or [
            min(planners, key=lambda p: p.gpu_hours)
        ]
        best = min(peers, key=lambda p: p.misses)
        factor = best.misses / max(1, ours.misses)
        print(
            f"{'MET   ' if factor >= 1.2 else 'MISSED'} scaling vs planner-style at ≤ ours' GPU-hours (+5 %): "
            f"{factor:.2f}× fewer misses (target ≥ 1.2; planner {best.misses} at {best.gpu_hours:.1f} GPU-h "
            f"[{best.detail}], ours {ours.misses} at {ours.gpu_hours:.1f})"
        )

    per_hour, n, simulated = speed(args.quick, args.gpu)
    print(
        f"{'MET   ' if per_hour <= 60 else 'MISSED'} speed: {per_hour:.1f} CPU s per simulated hour of 32 instances "
        f"({n} requests over {simulated:.0f} s simulated; target ≤ 60 s)"
    )
    print(f"\ntotal wall time {time.time() - started:.0f} s")
    if failures:
        print("FAIL hindsight oracle exceeded: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
