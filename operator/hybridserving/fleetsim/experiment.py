"""Workloads, policies by name, and the goodput comparison the benchmark and the CLI share.

Every policy runs on the same trace, fleet and performance model, and every policy's goodput is
found by the same search (`goodput.search_goodput`, scan-then-bisect on one geometric lattice
anchored at the reference rate — where the best static split just reaches 90 % — so that probes
of different policies land on the same rates). At every probed rate a dynamic policy starts
from the split that is best statically at that rate. Tunable policies are swept (the grid is
part of the report) and the setting with the best mean SLO attainment at the reference rate and
one grid step above it goes on to the goodput search.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.core.policy import PolicyConfig, RoleSwitchPolicy
from hybridserving.core.profiles import PROFILES
from hybridserving.fleetsim import traces
from hybridserving.fleetsim.baselines import (
    PolicyController,
    RestartRebalancer,
    SplitwiseMixedPool,
    zero_cost_relabel,
)
from hybridserving.fleetsim.goodput import GoodputReport, Slo, oracle_attainment, report, search_goodput
from hybridserving.fleetsim.simulator import FleetConfig, FleetSimulator, SimResult
from hybridserving.fleetsim.traces import Trace

DEFAULT_SLO = Slo(ttft_s=2.0, tpot_s=0.050)
# A 100K-token first turn alone takes ~7 s to prefill on one 8-GPU instance: an interactive 2 s
# TTFT cannot be met by any split, so the agentic workload uses a long-context limit.
LONG_CONTEXT_SLO = Slo(ttft_s=10.0, tpot_s=0.050)

POLICIES = ("static", "ours", "ours-relaunch", "restart-based", "splitwise", "zero-cost", "oracle")


def traces_dir() -> Path:
    """`HYBRIDSERVING_TRACES`, or `../shared/traces` next to the repository."""
    env = os.environ.get("HYBRIDSERVING_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared" / "traces"


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    trace: Trace
    slo: Slo


def load_workload(key: str, directory: Path | None = None) -> Workload:
    """(a) mix-shift, (b) diurnal, (c) agentic, (d) mooncake; the real ones read from `directory`."""
    d = directory or traces_dir()
    if key in ("mix-shift", "diurnal"):
        code = traces.read_azure_csv(d / "AzureLLMInferenceTrace_code.csv")
        conv = traces.read_azure_csv(d / "AzureLLMInferenceTrace_conv.csv")
        if key == "mix-shift":
            return Workload(key, "(a) Azure code ⇄ conversation mix shift", traces.mix_shift(code, conv), DEFAULT_SLO)
        return Workload(key, "(b) diurnal swing (Azure lengths)", traces.diurnal(code, conv, peak_rate=30.0), DEFAULT_SLO)
    if key == "agentic":
        return Workload(key, "(c) agentic sessions, 48 × 100K", traces.agentic_sessions(), LONG_CONTEXT_SLO)
    if key == "mooncake":
        trace = traces.read_mooncake_jsonl(d / "conversation_trace.jsonl")
        return Workload(key, "(d) Mooncake conversation (steady)", trace, DEFAULT_SLO)
    raise KeyError(f"unknown workload {key!r}; known: mix-shift, diurnal, agentic, mooncake")


def fleet_model(profile: str = "glm-5.2", tp: int = 8) -> PerformanceModel:
    return PerformanceModel.for_role(PROFILES[profile], tp=tp)


@dataclass
class Sweep:
    """Settings tried for one tunable policy, and the switch costs its fleet pays."""

    grid: list[dict]
    make: Callable[..., object]
    in_place: bool = True
    """Switches are in place (the engine's role switch, seconds) or relaunches (the model's
    restart time, as planners that scale roles up and down pay today)."""
    free_switches: bool = False
    """The fleet pays no switch time at all (the zero-cost relabel: an upper reference on cost)."""


def policy_sweeps(model: PerformanceModel, slo: Slo, quick: bool) -> dict[str, Sweep]:
    """Each tunable policy's grid. The same grids in quick and full runs (a sweep is cheap next
    to the goodput search; quick runs bisect less)."""
    base = PolicyConfig(ttft_slo_s=slo.ttft_s, tpot_slo_s=slo.tpot_s)

    def ours(cooldown_s: float, sustain_s: float, max_concurrent: int = 1):
        cfg = replace(base, cooldown_s=cooldown_s, sustain_s=sustain_s, max_concurrent=max_concurrent)
        return PolicyController(RoleSwitchPolicy(cfg, model))

    ours_grid = [
        {"cooldown_s": c, "sustain_s": s, "max_concurrent": m}
        for c, s, m in ((300, 20, 1), (120, 10, 2), (300, 10, 2), (120, 20, 1), (60, 10, 3), (600, 30, 1))
    ]
    # A planner sizing each role from its load (Dynamo's throughput mode): adjustment interval
    # (Dynamo's default is 180 s) × the projected pressure each role is sized to.
    restart_grid = [{"interval_s": i, "headroom": h} for i in (60, 180, 300, 900, 1800) for h in (1.0, 0.8)]
    # Splitwise: the per-instance queue threshold (8,192 in the paper) × how long the trigger must
    # stay clear before a borrowed instance goes home (0: the paper's rule).
    splitwise_grid = [
        {"queue_threshold_tokens": q, "return_hold_s": h} for q in (8192, 32768, 131072) for h in (0.0, 300.0)
    ]
    # Zero-cost relabel: Arrow's immediate reaction (no sustain, several at once), and, so that it
    # is an upper reference on cost for ours, every setting ours is swept over.
    zero_grid = [
        {"cooldown_s": c, "sustain_s": 0.0, "max_concurrent": m} for c, m in ((60, 4), (300, 4), (60, 1))
    ] + ours_grid
    return {
        "ours": Sweep(ours_grid, ours),
        "ours-relaunch": Sweep(
            [{"cooldown_s": 1800, "sustain_s": 60}, {"cooldown_s": 3600, "sustain_s": 120}], ours, in_place=False
        ),
        "restart-based": Sweep(
            restart_grid,
            lambda interval_s, headroom: RestartRebalancer(base, model, interval_s=interval_s, headroom=headroom),
            in_place=False,
        ),
        "splitwise": Sweep(
            splitwise_grid,
            lambda queue_threshold_tokens, return_hold_s: SplitwiseMixedPool(
                base, queue_threshold_tokens=queue_threshold_tokens, return_hold_s=return_hold_s
            ),
        ),
        "zero-cost": Sweep(
            zero_grid,
            lambda cooldown_s, sustain_s, max_concurrent: zero_cost_relabel(
                model, replace(base, cooldown_s=cooldown_s, sustain_s=sustain_s, max_concurrent=max_concurrent)
            ),
            free_switches=True,
        ),
    }


@dataclass
class Comparison:
    workload: Workload
    instances: int
    gpus: int
    reports: dict[str, GoodputReport] = field(default_factory=dict)
    reference_scale: float = 0.0
    best_static_split: int = 0
    plotted: list[SimResult] = field(default_factory=list)
    at_reference: dict[str, SimResult] = field(default_factory=dict)
    """Each policy's run at the reference rate (the best static split's goodput), where the
    dynamic policies switch; at the trace's own rate most of them have nothing to do."""


SEARCH_STEP = 1.08
"""Grid step of the goodput scan around the reference rate (bisection then halves it)."""


class Runner:
    """Runs (and caches) simulations of one workload on one fleet."""

    def __init__(self, workload: Workload, instances: int, model: PerformanceModel, iterations: int) -> None:
        self.w = workload
        self.n = instances
        self.model = model
        self.iterations = iterations
        self._static: dict[float, list[SimResult]] = {}

    def simulate(
        self, scale: float, initial_prefill: int, controller=None, in_place: bool = True, name: str = "static", free: bool = False
    ) -> SimResult:
        """One run; `free`: the fleet's switches take no time (drains still happen)."""
        model = replace(self.model, in_place_switch_s=0.0, relaunch_switch_s=0.0) if free else self.model
        cfg = FleetConfig(self.n, initial_prefill, model, in_place=in_place)
        return FleetSimulator(cfg, controller).run(self.w.trace.scaled(scale), name)

    def statics(self, scale: float) -> list[SimResult]:
        key = round(scale, 9)
        if key not in self._static:
            self._static[key] = [self.simulate(scale, k, name=f"static {k}:{self.n - k}") for k in range(1, self.n)]
        return self._static[key]

    def best_static(self, scale: float) -> tuple[int, float]:
        att = [r.attainment(self.w.slo.ttft_s, self.w.slo.tpot_s) for r in self.statics(scale)]
        k = max(range(len(att)), key=lambda i: (att[i], -abs(i + 1 - self.n / 2)))
        return k + 1, att[k]

    def oracle(self, scale: float) -> float:
        return oracle_attainment(self.statics(scale), self.w.slo, 300.0 / scale)

    def dynamic(self, scale: float, make, in_place: bool, name: str, free: bool = False) -> SimResult:
        """A dynamic policy at `scale`, starting from the best static split at that rate."""
        k, _ = self.best_static(scale)
        return self.simulate(scale, k, make(), in_place=in_place, name=name, free=free)

    def locate(self) -> float:
        """Coarse goodput of the best static split: the anchor of every policy's search."""
        return search_goodput(lambda s: self.best_static(s)[1], low=0.1, high=10.0, iterations=2, start=1.0, step=1.25)

    def goodput(self, attainment_at: Callable[[float], float], reference: float | None = None) -> float:
        """The one search every policy gets: scan-then-bisect on the lattice around `reference`
        (default: the best static split's coarse goodput, located first)."""
        if reference is None:
            reference = self.locate() or 1.0
        return search_goodput(
            attainment_at, low=0.05, high=20.0, iterations=self.iterations, start=reference, step=SEARCH_STEP, lookahead=1
        )


def compare(workload: Workload, instances: int = 8, quick: bool = False, policies=POLICIES, log=print) -> Comparison:
    model = fleet_model()
    gpus = instances * 8
    runner = Runner(workload, instances, model, iterations=2 if quick else 3)
    slo = workload.slo
    out = Comparison(workload, instances, gpus)
    att = lambda r: r.attainment(slo.ttft_s, slo.tpot_s)  # noqa: E731

    anchor = runner.locate() or 1.0
    static_scale = runner.goodput(lambda s: runner.best_static(s)[1], anchor)
    ref = static_scale if static_scale > 0 else anchor
    k_ref, _ = runner.best_static(ref)
    out.reference_scale, out.best_static_split = ref, k_ref
    k1, _ = runner.best_static(1.0)
    at_rate = runner.statics(1.0)[k1 - 1]
    out.reports["static"] = report(f"best static {k_ref}:{instances - k_ref}", workload.trace, gpus, static_scale, at_rate, slo, f"split {k1}:{instances - k1} at trace rate")
    log(f"  static: goodput ×{static_scale:.3f}, split {k_ref}:{instances - k_ref}")
    if "oracle" in policies:
        scale = runner.goodput(runner.oracle, anchor)
        out.reports["oracle"] = report("oracle (per-window best split, free)", workload.trace, gpus, scale, None, slo)
        out.reports["oracle"] = replace(out.reports["oracle"], attainment_at_trace_rate=runner.oracle(1.0))
        log(f"  oracle: goodput ×{scale:.3f}")

    sweeps = policy_sweeps(model, slo, quick)
    for name in policies:
        if name not in sweeps:
            continue
        sweep = sweeps[name]
        # Restart-based rebalancing relaunches the engine (the model's restart time), as planners do
        # today; the zero-cost relabel pays no switch time at all.
        in_place, free = sweep.in_place, sweep.free_switches
        run = lambda s, make: runner.dynamic(s, make, in_place, name, free=free)  # noqa: E731
        tried = []
        for setting in sweep.grid:
            make = lambda setting=setting: sweep.make(**setting)  # noqa: E731
            a = [att(run(s, make)) for s in (ref, ref * SEARCH_STEP)]
            tried.append((sum(a) / len(a), setting))
        best_att, best = max(tried, key=lambda x: x[0])
        make = lambda: sweep.make(**best)  # noqa: E731
        scale = runner.goodput(lambda s: att(run(s, make)), anchor)
        at_rate = run(1.0, make)
        detail = ", ".join(f"{k}={v}" for k, v in best.items()) + f" (swept {len(tried)}: " + ", ".join(f"{a:.3f}" for a, _ in tried) + ")"
        out.reports[name] = report(name, workload.trace, gpus, scale, at_rate, slo, detail)
        log(f"  {name}: goodput ×{scale:.3f} [{detail}]")
        out.at_reference[name] = run(ref, make)
        if name in ("ours", "ours-relaunch", "restart-based", "splitwise"):
            out.plotted.append(out.at_reference[name])
    out.at_reference["static"] = runner.statics(ref)[k_ref - 1]
    out.plotted.insert(0, out.at_reference["static"])
    return out
