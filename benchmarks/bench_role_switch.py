"""Does switching roles pay? Goodput of every policy on four workloads, plus simulator speed.

    python benchmarks/bench_role_switch.py [--quick] [--out out/] [--workloads mix-shift,mooncake]

Reads the public traces from $HYBRIDSERVING_TRACES (default ../shared/traces). Prints one table
per workload, the targets with MET/MISSED, and writes a PNG per workload under --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hybridserving.core.policy import PolicyConfig, RoleSwitchPolicy
from hybridserving.fleetsim import traces
from hybridserving.fleetsim.baselines import PolicyController
from hybridserving.fleetsim.experiment import Comparison, compare, fleet_model, load_workload, traces_dir
from hybridserving.fleetsim.plot import plot_runs
from hybridserving.fleetsim.simulator import FleetConfig, FleetSimulator


def table(c: Comparison) -> str:
    """Goodput, attainment at the trace's rate, and at the reference rate (the best static split's
    goodput, where switching matters) attainment, switches, drain and switch seconds."""
    slo = c.workload.slo
    rows = [
        f"{c.workload.title} — {len(c.workload.trace)} requests, {c.workload.trace.rate:.2f} req/s at scale 1, "
        f"{c.instances} instances × 8 GPUs; SLO TTFT ≤ {slo.ttft_s:g} s, TPOT ≤ {slo.tpot_s * 1e3:g} ms; "
        f"reference rate {c.workload.trace.rate * c.reference_scale:.2f} req/s (×{c.reference_scale:.3f})",
        f"{'policy':<38}{'goodput req/s':>14}{'per GPU':>9}{'×static':>9}{'SLO@1×':>8}{'switches':>9}{'drain s':>9}{'switch s':>9}"
        f"{'SLO@ref':>9}{'sw@ref':>8}{'drain@ref':>10}{'switch@ref':>11}  tuning",
    ]
    static = c.reports["static"].goodput_rps or float("nan")
    for key, r in c.reports.items():
        ref = c.at_reference.get(key)
        at_ref = (
            f"{ref.attainment(slo.ttft_s, slo.tpot_s):>9.3f}{ref.switches:>8d}{ref.drain_s:>10.0f}{ref.switch_s:>11.0f}"
            if ref is not None
            else f"{'—':>9}{'—':>8}{'—':>10}{'—':>11}"
        )
        rows.append(
            f"{r.policy:<38}{r.goodput_rps:>14.2f}{r.goodput_rps_per_gpu:>9.3f}{r.goodput_rps / static:>9.2f}"
            f"{r.attainment_at_trace_rate:>8.3f}{r.switches:>9d}{r.drain_s:>9.0f}{r.switch_s:>9.0f}{at_ref}  {r.detail}"
        )
    return "\n".join(rows)


def ratio(c: Comparison, a: str, b: str) -> float:
    den = c.reports[b].goodput_rps
    return c.reports[a].goodput_rps / den if den else float("inf")


def verdict(label: str, value: float, need: float, ceiling: float | None = None, ceiling_label: str = "") -> str:
    """MET/MISSED; when the target is above what any switching policy reached here, say so."""
    line = f"{'MET   ' if value >= need else 'MISSED'} {label}: {value:.2f} (target ≥ {need:.2f})"
    if value < need and ceiling is not None and ceiling < need:
        line += f" — unreachable on this workload: {ceiling_label} = {ceiling:.2f} < {need:.2f}"
    return line


def speed(quick: bool) -> tuple[float, int, float]:
    """Wall seconds to simulate one hour of a 32-instance fleet at ~50 req/s with our policy."""
    d = traces_dir()
    code = traces.read_azure_csv(d / "AzureLLMInferenceTrace_code.csv")
    conv = traces.read_azure_csv(d / "AzureLLMInferenceTrace_conv.csv")
    mix = traces.mix_shift(code, conv)
    trace = mix.scaled(50.0 / mix.rate)
    trace = trace.window(0, 900.0) if quick else trace
    model = fleet_model()
    sim = FleetSimulator(FleetConfig(32, 20, model), PolicyController(RoleSwitchPolicy(PolicyConfig(), model)))
    start = time.process_time()
    sim.run(trace, "ours")
    cpu = time.process_time() - start
    simulated = trace.duration_s
    return cpu * 3600.0 / simulated, len(trace), simulated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer bisection steps in the goodput search (the sweep grids are the same)")
    ap.add_argument("--out", default="out", help="directory for the PNGs (default out/)")
    ap.add_argument("--workloads", default="mix-shift,diurnal,agentic,mooncake")
    ap.add_argument("--instances", type=int, default=8)
    args = ap.parse_args(argv)
    if not (traces_dir() / "AzureLLMInferenceTrace_code.csv").exists():
        print(f"traces not found in {traces_dir()}; set HYBRIDSERVING_TRACES", file=sys.stderr)
        return 2
    out = Path(args.out)
    started = time.time()
    results: dict[str, Comparison] = {}
    for key in args.workloads.split(","):
        w = load_workload(key)
        print(f"\n== {w.title}", flush=True)
        c = compare(w, instances=args.instances, quick=args.quick, log=lambda s: print(s, flush=True))
        results[key] = c
        print(table(c), flush=True)
        png = plot_runs(out / f"role_switch_{key}.png", w.trace.scaled(c.reference_scale), c.plotted, w.slo)
        print(f"plot: {png}")

    print("\n== targets")
    if "mix-shift" in results:
        a = results["mix-shift"]
        oracle_gain = ratio(a, "oracle", "static")
        print(verdict("(a) ours / oracle", ratio(a, "ours", "oracle"), 0.90))
        print(verdict("(a) ours / best static", ratio(a, "ours", "static"), 1.30, oracle_gain, "oracle / best static"))
        print(
            verdict(
                "(a) ours / restart-based", ratio(a, "ours", "restart-based"), 1.20,
                ratio(a, "oracle", "restart-based"), "oracle / restart-based",
            )
        )
        print(f"       (a) oracle / best static = {oracle_gain:.2f}: the most any switching policy could gain here")
    for key, c in results.items():
        peers = {p: c.reports[p].goodput_rps for p in ("restart-based", "splitwise", "zero-cost") if p in c.reports}
        if peers and "ours" in c.reports:
            best = max(peers, key=peers.get)
            print(
                f"       {c.workload.title.split(' ')[0]} best peer baseline: {best} {peers[best]:.2f} req/s; "
                f"ours / best peer = {ratio(c, 'ours', best):.2f}"
            )
    if "mooncake" in results:
        print(verdict("(d) ours / best static", ratio(results["mooncake"], "ours", "static"), 0.97))
    per_hour, n, simulated = speed(args.quick)
    print(
        f"{'MET   ' if per_hour <= 60 else 'MISSED'} speed: {per_hour:.1f} CPU s per simulated hour of 32 instances "
        f"({n} requests over {simulated:.0f} s simulated; target ≤ 60 s)"
    )
    print(f"\ntotal wall time {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
