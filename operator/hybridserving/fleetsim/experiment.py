"""Workloads, policies by name, and the goodput comparison the benchmark and the CLI share.

Every policy runs on the same trace, fleet and performance model, and every policy's goodput is
found by the same search (`goodput.search_goodput`, scan-then-bisect on one geometric lattice
anchored at the reference rate — where the best static split just reaches 90 % — so that probes
of different policies land on the same rates). Load is varied by replicating requests on the
trace's own clock (`Trace.at_load`), so phases keep their length relative to switch costs; a
rate passes only if the total and every workload phase reach 90 %. At every probed rate a
dynamic policy starts from the split that is best statically at that rate. "ours" is the
shipped configuration (the CRD defaults), one for every workload; baselines are swept (the
grid is part of the report) and the setting with the best mean score at the reference rate and
one grid step above it goes on to the goodput search. The hindsight oracle searches schedules
of splits with free, instant switches and bounds every policy.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from hybridserving.api.v1alpha1 import GpuTypeName, RoleSwitchSpec, SloSpec
from hybridserving.core.perfmodel import CALIBRATION_GPU, PerformanceModel
from hybridserving.core.policy import FleetScaler, PolicyConfig, RoleSwitchPolicy, ScalingConfig
from hybridserving.api.profiles import PROFILES
from hybridserving.fleetsim import traces
from hybridserving.fleetsim.baselines import (
    PlannerStyleScaler,
    PolicyController,
    RestartRebalancer,
    ScalingPlanner,
    SplitwiseMixedPool,
    zero_cost_relabel,
)
from hybridserving.fleetsim.goodput import (
    GoodputReport,
    Slo,
    oracle_phase_score,
    phase_attainments,
    phase_score,
    report,
    search_goodput,
)
from hybridserving.fleetsim.simulator import Controller, FleetConfig, FleetSimulator, SimResult
from hybridserving.fleetsim.traces import Trace

DEFAULT_SLO = Slo(ttft_s=2.0, tpot_s=0.050)
# A 100K-token first turn alone takes ~7 s to prefill on one 8-GPU instance: an interactive 2 s
# TTFT cannot be met by any split, so the agentic workload uses a long-context limit.
LONG_CONTEXT_SLO = Slo(ttft_s=10.0, tpot_s=0.050)

POLICIES = (
    "static", "hindsight", "per-window", "ours", "ours-relaunch", "restart-based", "splitwise", "splitwise-one",
    "zero-cost",
)  # fmt: skip
SPLITWISE_ONE_SETTING: Mapping[str, float] = {"queue_threshold_tokens": 32768, "return_hold_s": 300.0}
"""Splitwise held at one setting for every workload, as ours is: its best on the mix shift."""
HINDSIGHT_SEGMENT_S = 75.0
"""Length of the hindsight oracle's first segments: an eighth of the shortest workload phase. The
search halves it while that raises the score, down to `HINDSIGHT_FINEST_S`."""
HINDSIGHT_FINEST_S = 18.75


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
    phases: tuple[float, ...] = ()
    """Phase boundaries in seconds (each phase must meet the SLO target on its own); default: quarters."""

    @property
    def bounds(self) -> tuple[float, ...]:
        if self.phases:
            return self.phases
        end = float(self.trace.arrival_s[-1]) + 1.0 if len(self.trace) else 1.0
        return tuple(end * i / 4 for i in range(5))


def load_workload(key: str, directory: Path | None = None) -> Workload:
    """(a) mix-shift, (b) diurnal, (c) agentic, (d) mooncake; the real ones read from `directory`."""
    d = directory or traces_dir()
    if key in ("mix-shift", "diurnal"):
        code = traces.read_azure_csv(d / "AzureLLMInferenceTrace_code.csv")
        conv = traces.read_azure_csv(d / "AzureLLMInferenceTrace_conv.csv")
        if key == "mix-shift":
            phases = tuple(600.0 * i for i in range(7))
            return Workload(key, "(a) Azure code ⇄ conversation mix shift", traces.mix_shift(code, conv), DEFAULT_SLO,
                            phases)
        return Workload(key, "(b) diurnal swing (Azure lengths)", traces.diurnal(code, conv, peak_rate=30.0),
                        DEFAULT_SLO)
    if key == "agentic":
        waves = tuple(1200.0 * i for i in range(4))
        return Workload(key, "(c) agentic sessions, 48 × 100K", traces.agentic_sessions(), LONG_CONTEXT_SLO, waves)
    if key == "mooncake":
        trace = traces.read_mooncake_jsonl(d / "conversation_trace.jsonl")
        return Workload(key, "(d) Mooncake conversation (steady)", trace, DEFAULT_SLO)
    raise KeyError(f"unknown workload {key!r}; known: mix-shift, diurnal, agentic, mooncake")


def fleet_model(profile: str = "glm-5.2", tp: int = 8, gpu: GpuTypeName = CALIBRATION_GPU) -> PerformanceModel:
    """One 8-GPU instance; B300 by default, the GPU the model is calibrated on and the workloads'
    SLOs were set for (on H200 prefill is 2.27× slower: a 2 s TTFT excludes Mooncake's longest
    prompts at any load, so goodput there is 0)."""
    return PerformanceModel.for_role(PROFILES[profile], tp=tp, gpu=gpu)


def shipped_config(slo: Slo) -> PolicyConfig:
    """What a user gets without tuning: the CRD's RoleSwitchSpec defaults (with the workload's SLO)."""
    spec = RoleSwitchSpec(enabled=True, slo=SloSpec(ttft_ms=slo.ttft_s * 1000.0, tpot_ms=slo.tpot_s * 1000.0))
    return PolicyConfig.from_spec(spec)


@dataclass
class Sweep:
    """Settings tried for one tunable policy, and the switch costs its fleet pays."""

    grid: Sequence[Mapping[str, float]]
    make: Callable[..., Controller]
    note: str = ""
    """What a single setting is (shown beside it in the table)."""
    in_place: bool = True
    """Switches are in place (the engine's role switch, seconds) or relaunches (the model's
    restart time, as planners that scale roles up and down pay today)."""
    free_switches: bool = False
    """The fleet pays no switch time at all (the zero-cost relabel: an upper reference on cost)."""


def policy_sweeps(model: PerformanceModel, slo: Slo, quick: bool) -> dict[str, Sweep]:
    """Each tunable policy's grid. The same grids in quick and full runs (a sweep is cheap next
    to the goodput search; quick runs bisect less)."""
    base = shipped_config(slo)

    def ours(cooldown_s: float, sustain_s: float, max_concurrent: int = 1) -> PolicyController:
        cfg = replace(base, cooldown_s=cooldown_s, sustain_s=sustain_s, max_concurrent=max_concurrent)
        return PolicyController(RoleSwitchPolicy(cfg, model))

    ours_grid = [
        {"cooldown_s": c, "sustain_s": s, "max_concurrent": m}
        for c, s, m in ((300, 20, 1), (120, 10, 2), (300, 10, 2), (120, 20, 1), (60, 10, 3), (600, 30, 1))
    ]
    # A planner sizing each role from its load (Dynamo's throughput mode): adjustment interval
    # (Dynamo's default is 180 s) × the projected pressure each role is sized to.
    # Lower headrooms size a role for its bursts: at 1.0 and 0.8 it never moved on the mix shift.
    restart_grid = [{"interval_s": i, "headroom": h} for i in (60, 180, 300, 900, 1800) for h in (1.0, 0.8, 0.6)]
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
    shipped = shipped_config(slo)

    def splitwise(queue_threshold_tokens: int, return_hold_s: float) -> SplitwiseMixedPool:
        return SplitwiseMixedPool(base, queue_threshold_tokens=queue_threshold_tokens, return_hold_s=return_hold_s)

    return {
        "ours": Sweep([{}], lambda: PolicyController(RoleSwitchPolicy(shipped, model)), note="shipped defaults"),
        "ours-tuned": Sweep(ours_grid, ours),
        "ours-relaunch": Sweep(
            [{"cooldown_s": 1800, "sustain_s": 60}, {"cooldown_s": 3600, "sustain_s": 120}], ours, in_place=False
        ),
        "restart-based": Sweep(
            restart_grid,
            lambda interval_s, headroom: RestartRebalancer(base, model, interval_s=interval_s, headroom=headroom),
            in_place=False,
        ),
        "splitwise": Sweep(splitwise_grid, splitwise),
        # The same rule held at one setting, as ours is: what a user of it gets without a sweep per workload.
        "splitwise-one": Sweep([SPLITWISE_ONE_SETTING], splitwise, note="one setting for every workload"),
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
    overload: list[tuple[float, float, float]] = field(default_factory=list)
    """(load / reference, static score, ours score) from 0.8× to 1.2× of the reference load, both
    from the best static split at the reference load."""
    load_mode: str = "replicate"


SEARCH_STEP = 1.08
"""Grid step of the goodput scan around the reference rate (bisection then halves it)."""


class Runner:
    """Runs (and caches) simulations of one workload on one fleet.

    `load_mode`: "replicate" varies load on the trace's own clock (`Trace.at_load`: phases keep
    their length relative to switch costs); "compress" divides timestamps, as the literature
    does, which also shrinks phases and think times.
    """

    def __init__(
        self, workload: Workload, instances: int, model: PerformanceModel, iterations: int, load_mode: str = "replicate"
    ) -> None:
        if load_mode not in ("replicate", "compress"):
            raise ValueError(f"load_mode must be 'replicate' or 'compress', got {load_mode!r}")
        self.w = workload
        self.n = instances
        self.model = model
        self.iterations = iterations
        self.load_mode = load_mode
        self.declared: int | None = None
        self._static: dict[float, list[SimResult]] = {}
        self._traces: dict[float, Trace] = {}

    def trace_at(self, scale: float) -> Trace:
        key = round(scale, 9)
        if key not in self._traces:
            self._traces.clear()
            self._traces[key] = (
                self.w.trace.at_load(scale) if self.load_mode == "replicate" else self.w.trace.scaled(scale)
            )
        return self._traces[key]

    def bounds_at(self, scale: float) -> tuple[float, ...]:
        b = self.w.bounds
        return b if self.load_mode == "replicate" else tuple(x / scale for x in b)

    def score(self, result: SimResult, scale: float) -> float:
        """Total attainment, or the worst phase's if lower: what a rate must reach to pass."""
        return phase_score(result, self.w.slo, self.bounds_at(scale))

    def phases(self, result: SimResult, scale: float) -> list[float]:
        return phase_attainments(result, self.w.slo, self.bounds_at(scale))

    def simulate(
        self, scale: float, initial_prefill: int, controller: Controller | None = None, in_place: bool = True,
        name: str = "static", free: bool = False,
    ) -> SimResult:
        """One run; `free`: the fleet's switches take no time (drains still happen)."""
        model = replace(self.model, in_place_switch_s=0.0, relaunch_switch_s=0.0) if free else self.model
        cfg = FleetConfig(self.n, initial_prefill, model, in_place=in_place)
        return FleetSimulator(cfg, controller).run(self.trace_at(scale), name)

    def statics(self, scale: float) -> list[SimResult]:
        key = round(scale, 9)
        if key not in self._static:
            self._static[key] = [self.simulate(scale, k, name=f"static {k}:{self.n - k}") for k in range(1, self.n)]
        return self._static[key]

    def best_static(self, scale: float) -> tuple[int, float]:
        att = [self.score(r, scale) for r in self.statics(scale)]
        k = max(range(len(att)), key=lambda i: (att[i], -abs(i + 1 - self.n / 2)))
        return k + 1, att[k]

    def per_window(self, scale: float) -> float:
        """The per-window projection (a named baseline, not a bound), judged on the total and every phase.

        It is not a runnable schedule: each window is scored as if its split had built up its
        own state, so it can exceed what any schedule reaches (the hindsight oracle)."""
        window = 300.0 if self.load_mode == "replicate" else 300.0 / scale
        return oracle_phase_score(self.statics(scale), self.w.slo, window, self.bounds_at(scale))

    def hindsight(self, scale: float) -> tuple[float, SimResult | None]:
        """The hindsight oracle's score at `scale` and its run (None when a static split is best):
        the best of its searches at `HINDSIGHT_SEGMENT_S` and at each half of it that still
        scores higher (a coarser grid cannot follow a shift that falls inside a segment), down
        to `HINDSIGHT_FINEST_S`."""
        best = self.hindsight_at(scale, HINDSIGHT_SEGMENT_S)
        segment = HINDSIGHT_SEGMENT_S / 2
        while segment >= HINDSIGHT_FINEST_S:
            finer = self.hindsight_at(scale, segment)
            if finer[0] <= best[0]:
                break
            best, segment = finer, segment / 2
        return best

    def hindsight_at(self, scale: float, segment_s: float) -> tuple[float, SimResult | None]:
        """The hindsight search with segments of `segment_s` (at the trace's own rate).

        Segment by segment, from the state the schedule so far has
        built, try splits around the current one (hill-climbing: keep going while a neighbour
        serves the segment and the next one better, the next one keeping the split, moving one
        instance either way or going back to the split before), relabel instantly and for free
        (`FleetSimulator.relabel`: no drain, no rebuild, old work finishes alongside), and
        keep the best. No policy switches faster, cheaper or with more foresight, so none
        should beat it; the benchmark checks that. The best static split is a candidate too.
        """
        trace = self.trace_at(scale)
        seg = segment_s if self.load_mode == "replicate" else segment_s / scale
        k, static_score = self.best_static(scale)
        sim = FleetSimulator(FleetConfig(self.n, k, self.model))
        sim.start(trace)
        meets_slo = self.w.slo
        end = float(trace.arrival_s[-1]) if len(trace) else 0.0

        def served(split: int, start: float, before: int, window: np.ndarray) -> int:
            """Requests of the window not yet lost with `split` for this segment and, for the
            next, the best of keeping it, moving one instance either way, or restoring the split
            before: a split that serves one segment well need not be kept for the next to be
            chosen. A request still running at the horizon counts as served unless it has
            already missed (its first token later than the TTFT limit): work cut off by the
            horizon does not favour the split that started less of it."""
            twin = sim.fork()
            twin.relabel(start, split)
            twin.advance(start + seg)
            horizon = start + 2 * seg
            best = 0
            for then in dict.fromkeys(j for j in (split, split - 1, split + 1, before) if 1 <= j < self.n):
                run = twin.fork()
                run.relabel(start + seg, then)
                run.advance(horizon)
                waiting = np.isinf(run.ttft) & (horizon - trace.arrival_s > meets_slo.ttft_s)
                lost = waiting | (np.isfinite(run.ttft) & (run.ttft > meets_slo.ttft_s))
                lost |= np.isfinite(run.tpot) & (run.tpot > meets_slo.tpot_s)
                best = max(best, int(window.sum() - lost[window].sum()))
            return best

        t = 0.0
        while t <= end:
            window = (trace.arrival_s >= t) & (trace.arrival_s < t + 2 * seg)
            before = k
            tried = {k: served(k, t, before, window)}
            for step in (-1, 1):
                j = k + step
                while 1 <= j < self.n:
                    tried[j] = served(j, t, before, window)
                    if tried[j] <= tried[j - step]:
                        break
                    j += step
            k = max(tried, key=lambda j: (tried[j], -abs(j - k)))
            sim.relabel(t, k)
            t += seg
            sim.advance(t)
        sim.advance(math.inf)
        result = sim.result("hindsight")
        score = self.score(result, scale)
        return (score, result) if score >= static_score else (static_score, None)

    def dynamic(self, scale: float, make: Callable[[], Controller], in_place: bool, name: str,
                free: bool = False) -> SimResult:
        """A dynamic policy at `scale`, starting from (and declared at) `declared`: the split a user
        sets once, the best static split at the reference load, at every load probed (the best
        split at each probed load is hindsight no operator has). Before it is known, the best
        static split at `scale`."""
        k = self.declared or self.best_static(scale)[0]
        return self.simulate(scale, k, make(), in_place=in_place, name=name, free=free)

    def dynamic_score(self, scale: float, make: Callable[[], Controller], in_place: bool, name: str,
                      free: bool = False) -> float:
        """The score of a dynamic policy at `scale`: what the goodput search probes."""
        return self.score(self.dynamic(scale, make, in_place, name, free=free), scale)

    def locate(self) -> float:
        """Coarse goodput of the best static split: the anchor of every policy's search."""
        return search_goodput(lambda s: self.best_static(s)[1], low=0.1, high=10.0, iterations=2, start=1.0, step=1.25)

    def goodput(self, attainment_at: Callable[[float], float], reference: float | None = None) -> float:
        """The one search every policy gets: scan-then-bisect on the lattice around `reference`
        (default: the best static split's coarse goodput, located first)."""
        if reference is None:
            reference = self.locate() or 1.0
        return search_goodput(
            attainment_at, low=0.05, high=20.0, iterations=self.iterations, start=reference, step=SEARCH_STEP,
            lookahead=1,
        )


OVERLOAD_LOADS = (0.8, 0.9, 1.0, 1.05, 1.1, 1.15, 1.2)


def compare(
    workload: Workload,
    instances: int = 8,
    quick: bool = False,
    policies: Sequence[str] = POLICIES,
    log: Callable[[str], None] = print,
    model: PerformanceModel | None = None,
    load_mode: str = "replicate",
    overload: bool = False,
) -> Comparison:
    model = model or fleet_model()
    gpus = instances * 8
    runner = Runner(workload, instances, model, iterations=2 if quick else 3, load_mode=load_mode)
    slo = workload.slo
    out = Comparison(workload, instances, gpus, load_mode=load_mode)

    anchor = runner.locate() or 1.0
    static_scale = runner.goodput(lambda s: runner.best_static(s)[1], anchor)
    ref = static_scale if static_scale > 0 else anchor
    k_ref, _ = runner.best_static(ref)
    out.reference_scale, out.best_static_split = ref, k_ref
    runner.declared = k_ref
    k1, _ = runner.best_static(1.0)
    at_rate = runner.statics(1.0)[k1 - 1]
    out.reports["static"] = report(f"best static {k_ref}:{instances - k_ref}", workload.trace, gpus, static_scale,
                                   at_rate, slo, f"split {k1}:{instances - k1} at trace rate")
    out.at_reference["static"] = runner.statics(ref)[k_ref - 1]
    log(f"  static: goodput ×{static_scale:.3f}, split {k_ref}:{instances - k_ref}")
    if "hindsight" in policies:
        scale = runner.goodput(lambda s: runner.hindsight(s)[0], anchor)
        out.reports["hindsight"] = report("hindsight oracle (free, instant)", workload.trace, gpus, scale, None, slo,
                                          f"segments {HINDSIGHT_SEGMENT_S:g} s, halved while it gains, "
                                          f"to {HINDSIGHT_FINEST_S:g} s")
        _, run_ref = runner.hindsight(ref)
        if run_ref is not None:
            out.at_reference["hindsight"] = run_ref
        log(f"  hindsight: goodput ×{scale:.3f}")
    if "per-window" in policies:
        scale = runner.goodput(runner.per_window, anchor)
        out.reports["per-window"] = report("per-window projection (5-min best split)", workload.trace, gpus, scale,
                                           None, slo)
        out.reports["per-window"] = replace(out.reports["per-window"], attainment_at_trace_rate=runner.per_window(1.0))
        log(f"  per-window: goodput ×{scale:.3f}")

    sweeps = policy_sweeps(model, slo, quick)
    for name in policies:
        if name not in sweeps:
            continue
        sweep = sweeps[name]
        # Restart-based rebalancing relaunches the engine (the model's restart time), as planners do
        # today; the zero-cost relabel pays no switch time at all.
        in_place, free = sweep.in_place, sweep.free_switches
        run = functools.partial(runner.dynamic, in_place=in_place, name=name, free=free)
        tried = []
        if len(sweep.grid) > 1:
            for setting in sweep.grid:
                make = functools.partial(sweep.make, **setting)
                a = [runner.score(run(s, make), s) for s in (ref, ref * SEARCH_STEP)]
                tried.append((sum(a) / len(a), setting))
            best = max(tried, key=lambda x: x[0])[1]
        else:
            best = sweep.grid[0]
        make = functools.partial(sweep.make, **best)
        scale = runner.goodput(functools.partial(runner.dynamic_score, make=make, in_place=in_place, name=name,
                                                 free=free), anchor)
        at_rate = run(1.0, make)
        settings = ", ".join(f"{k}={v}" for k, v in best.items())
        if tried:
            detail = f"{settings} (swept {len(tried)}: " + ", ".join(f"{a:.3f}" for a, _ in tried) + ")"
        else:
            detail = f"{settings} ({sweep.note})" if settings else sweep.note
        out.reports[name] = report(name, workload.trace, gpus, scale, at_rate, slo, detail)
        log(f"  {name}: goodput ×{scale:.3f} [{detail}]")
        out.at_reference[name] = run(ref, make)
        if name in ("ours", "ours-relaunch", "restart-based", "splitwise"):
            out.plotted.append(out.at_reference[name])
        if name == "ours" and overload:
            # The best static split at the reference load, held fixed, against ours started from it.
            for f in OVERLOAD_LOADS:
                s = ref * f
                static_run = runner.simulate(s, k_ref, name=f"static {k_ref}:{instances - k_ref}")
                ours_run = runner.simulate(s, k_ref, make(), in_place=in_place, name=name)
                out.overload.append((f, runner.score(static_run, s), runner.score(ours_run, s)))
    out.plotted.insert(0, out.at_reference["static"])
    return out


@dataclass
class ScalingRow:
    name: str
    attainment: float
    worst_phase: float
    misses: int
    gpu_hours: float
    scale_ups: int
    scale_downs: int
    switches: int
    detail: str = ""


def scaling_comparison(
    code: Trace, conv: Trace, model: PerformanceModel | None = None, duration_s: float = 7200.0,
    peak_rate: float = 40.0, log: Callable[[str], None] = print,
) -> tuple[Workload, int, list[ScalingRow]]:
    """A diurnal day (`duration_s`, the rate swinging 0.3× → 1× → 0.3× of `peak_rate`): a fixed fleet
    sized for the peak (the fewest instances whose best split passes, every phase), ours with
    scaling on (ceiling: that fleet), and a Dynamo-Planner-style scaler (±1 per role per
    interval, swept), each paying 60 s pod start + the weight load for every launch."""
    model = model or fleet_model()
    trace = traces.diurnal(code, conv, duration_s=duration_s, peak_rate=peak_rate)
    w = Workload("diurnal-scaling", f"diurnal day over {duration_s / 3600:g} h, peak {peak_rate:g} req/s", trace,
                 DEFAULT_SLO)
    bounds = w.bounds
    rows: list[ScalingRow] = []

    def row(name: str, r: SimResult, detail: str = "") -> ScalingRow:
        meets = r.meets(w.slo.ttft_s, w.slo.tpot_s)
        return ScalingRow(
            name, float(meets.mean()), min(phase_attainments(r, w.slo, bounds)), int((~meets).sum()),
            r.gpu_hours, r.scale_ups, r.scale_downs, r.switches, detail,
        )  # fmt: skip

    fixed: dict[int, list[SimResult]] = {}

    def best_fixed(n: int) -> SimResult:
        """The best split of `n` instances over the whole day; every split is kept for the
        hindsight sizing, which may choose another in each window."""
        runs = fixed[n] = [FleetSimulator(FleetConfig(n, k, model)).run(trace, f"fixed {k}:{n - k}")
                           for k in range(1, n)]
        best = max(runs, key=lambda r: phase_score(r, w.slo, bounds))
        log(f"  fixed {n}: best {best.policy} score {phase_score(best, w.slo, bounds):.3f}")
        return best

    # The fewest instances whose best split passes: down from a guess while it passes, else up.
    n, fleet = 8, best_fixed(8)
    passes = phase_score(fleet, w.slo, bounds) >= 0.9
    step = -1 if passes else 1
    while 2 < n + step <= 32:
        candidate = best_fixed(n + step)
        ok = phase_score(candidate, w.slo, bounds) >= 0.9
        if step < 0 and not ok:
            break
        n, fleet = n + step, candidate
        if step > 0 and ok:
            break
    if phase_score(fleet, w.slo, bounds) < 0.9:
        raise ValueError("no fleet up to 32 instances meets the SLO on this trace")
    peak = n
    rows.append(row(f"fixed fleet sized for peak ({fleet.policy})", fleet))
    for small in range(2, peak):
        if small not in fixed:
            best_fixed(small)
    rows.append(hindsight_sizing(fixed, w.slo, peak, float(trace.arrival_s[-1]) + 1.0))
    log(f"  hindsight sizing: {rows[-1]}")
    start = max(2, math.ceil(peak * 0.4))
    start_p = max(1, round(start * 0.6))
    base = shipped_config(w.slo)

    def scaled_run(controller: Controller | None, name: str) -> SimResult:
        cfg = FleetConfig(peak, start_p, model, initial_decode=start - start_p)
        return FleetSimulator(cfg, controller).run(trace, name)

    policy = RoleSwitchPolicy(base, model)
    ours = scaled_run(ScalingPlanner(policy, FleetScaler(ScalingConfig(max_instances=peak), policy)), "ours+scaling")
    rows.append(row("ours + scaling (shipped defaults)", ours, f"ceiling {peak}, start {start_p}:{start - start_p}"))
    log(f"  ours+scaling: {rows[-1]}")
    for interval in (60.0, 180.0, 300.0):
        for headroom in (0.85, 0.7):
            r = scaled_run(PlannerStyleScaler(base, model, peak, interval_s=interval, headroom=headroom), "planner")
            rows.append(row("planner-style scaler (±1/interval)", r, f"interval {interval:g} s, headroom {headroom}"))
            log(f"  planner {interval:g}/{headroom}: {rows[-1]}")
    return w, peak, rows


SIZING_WINDOW_S = 600.0
"""Window of the hindsight sizing: about a launch time (pod start + weight load, 840 s)."""


def hindsight_sizing(fixed: Mapping[int, Sequence[SimResult]], slo: Slo, peak: int, end_s: float) -> ScalingRow:
    """What scaling might save, in hindsight: each window served by the fewest instances with some
    split (any, window by window) that meets the SLO target on that window's requests (the peak
    fleet's best when none does), with instant, free launches, removals and switches and each
    fleet's state as if it had run all along. An estimate, not a schedule any scaler can run
    (like the per-window projection) and not a proven bound: a scaler whose fleet is smaller
    than the one that ran all along (less backlog) can do better in a window."""
    sizes = sorted(n for n in fixed if n <= peak)
    meets = {n: [r.meets(slo.ttft_s, slo.tpot_s) for r in fixed[n]] for n in sizes}
    arrival = fixed[peak][0].arrival_s
    chosen = np.zeros(len(arrival), dtype=bool)
    gpu_s = 0.0
    windows = 0
    for lo in np.arange(0.0, end_s, SIZING_WINDOW_S):
        hi = min(lo + SIZING_WINDOW_S, end_s)
        mask = (arrival >= lo) & (arrival < hi)
        found = next(((n, m) for n in sizes for m in meets[n] if not mask.any() or m[mask].mean() >= 0.9), None)
        n, m = found or (peak, max(meets[peak], key=lambda m: m[mask].mean()))
        chosen[mask] = m[mask]
        gpu_s += n * fixed[n][0].gpus_per_instance * (hi - lo)
        windows += 1
    return ScalingRow(
        "hindsight sizing (per window, not a schedule)", float(chosen.mean()), float("nan"), int((~chosen).sum()),
        float(gpu_s / 3600.0), 0, 0, 0, f"{windows} windows of {SIZING_WINDOW_S:g} s, sizes {sizes[0]}..{peak}, "
        "any split per window",
    )  # fmt: skip
