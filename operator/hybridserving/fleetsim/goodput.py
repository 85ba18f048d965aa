"""Goodput as DistServe defines it, and the hindsight references (best static split, oracle).

Goodput is the highest request rate at which at least 90 % of requests meet both their TTFT and
TPOT limits. The rate is varied by scaling the trace's timestamps. Attainment falls as the rate
rises, but not strictly monotonically (a dynamic policy's moves, a burst landing differently),
so plain bisection can stop at a dip: `search_goodput` scans a geometric grid first (looking one
step past the first failure), then bisects the gap above the highest passing grid point, and
reports the highest rate that passed among everything it probed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hybridserving.fleetsim.simulator import SimResult
from hybridserving.fleetsim.traces import Trace

TARGET_ATTAINMENT = 0.90


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float


def search_goodput(
    attainment_at: Callable[[float], float],
    low: float = 0.05,
    high: float = 8.0,
    iterations: int = 9,
    target: float = TARGET_ATTAINMENT,
    start: float | None = None,
    step: float = 1.25,
    lookahead: int = 1,
) -> float:
    """Largest rate scale in [low, high] whose attainment meets `target` (0 if even `low` fails).

    Scan-then-bisect: from `start` (default: the geometric middle of the range) probe up by
    `step` until a failure, then `lookahead` more steps (a pass there restarts the climb), or
    down until a pass; then `iterations` geometric bisections between the highest passing grid
    point and the failure just above it. Returns the highest passing scale probed, so a dip in
    attainment below the goodput cannot hide a higher passing rate found by the scan.
    """
    memo: dict[float, bool] = {}

    def ok(s: float) -> bool:
        if s not in memo:
            memo[s] = attainment_at(s) >= target
        return memo[s]

    s = min(high, max(low, start if start is not None else (low * high) ** 0.5))
    if ok(s):
        best = s
        fail = None
        while fail is None and s < high:
            s = min(high, s * step)
            if ok(s):
                best = s
                continue
            fail = s
            probe = s
            for _ in range(lookahead):
                if probe >= high:
                    break
                probe = min(high, probe * step)
                if ok(probe):
                    best, s, fail = probe, probe, None
                    break
        if fail is None:
            return best
    else:
        fail = s
        while True:
            if s <= low:
                return 0.0
            s = max(low, s / step)
            if ok(s):
                best = s
                break
            fail = s
    lo, hi = best, fail
    for _ in range(iterations):
        mid = (lo * hi) ** 0.5
        if ok(mid):
            lo = best = max(best, mid)
        else:
            hi = mid
    return max(s for s, passed in memo.items() if passed)


def phase_attainments(result: SimResult, slo: Slo, bounds: Sequence[float]) -> list[float]:
    """Attainment of the requests arriving in each phase [bounds[i], bounds[i+1]) (1.0 when empty)."""
    meets = result.meets(slo.ttft_s, slo.tpot_s)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        mask = (result.arrival_s >= lo) & (result.arrival_s < hi)
        out.append(float(meets[mask].mean()) if mask.any() else 1.0)
    return out


def phase_score(result: SimResult, slo: Slo, bounds: Sequence[float]) -> float:
    """The attainment goodput is judged on: the request-weighted total and every phase on its
    own (a minority phase failing whole cannot hide inside the total's 10 % budget)."""
    return min([result.attainment(slo.ttft_s, slo.tpot_s), *phase_attainments(result, slo, bounds)])


def windowed_good(result: SimResult, slo: Slo, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per window of arrival time: requests that met both limits, and requests."""
    bins = (result.arrival_s // window_s).astype(np.int64)
    n = int(bins.max()) + 1 if len(bins) else 0
    good = np.bincount(bins, weights=result.meets(slo.ttft_s, slo.tpot_s), minlength=n)
    total = np.bincount(bins, minlength=n).astype(float)
    return good, total


def oracle_phase_score(static_results: list[SimResult], slo: Slo, window_s: float, bounds: Sequence[float]) -> float:
    """The per-window projection: each window's requests scored by the static split that served
    them best, as if every split had built up its own state (a named baseline, not a bound: a
    split chosen per window would inherit another's queues). Judged like every policy: the
    total and each phase (windows assigned to the phase their start falls in)."""
    best, total = _per_window_best(static_results, slo, window_s)
    scores = [best.sum() / total.sum() if total.sum() else 1.0]
    starts = np.arange(len(best)) * window_s
    for lo, hi in itertools.pairwise(bounds):
        mask = (starts >= lo) & (starts < hi)
        if total[mask].sum():
            scores.append(best[mask].sum() / total[mask].sum())
    return float(min(scores))


def _per_window_best(static_results: list[SimResult], slo: Slo, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    per_split = [windowed_good(r, slo, window_s) for r in static_results]
    n = max(len(g) for g, _ in per_split)
    best = np.zeros(n)
    total = np.zeros(n)
    for good, count in per_split:
        best[: len(good)] = np.maximum(best[: len(good)], good)
        total[: len(count)] = count
    return best, total


@dataclass(frozen=True)
class GoodputReport:
    policy: str
    goodput_scale: float
    goodput_rps: float
    goodput_rps_per_gpu: float
    attainment_at_trace_rate: float
    switches: int
    drain_s: float
    switch_s: float
    detail: str = ""


def report(
    policy: str, trace: Trace, gpus: int, scale: float, at_rate: SimResult | None, slo: Slo, detail: str = ""
) -> GoodputReport:
    """Goodput figures for one policy: the rate scale found, as requests per second and per GPU."""
    rps = trace.rate * scale
    return GoodputReport(
        policy=policy,
        goodput_scale=scale,
        goodput_rps=rps,
        goodput_rps_per_gpu=rps / gpus,
        attainment_at_trace_rate=at_rate.attainment(slo.ttft_s, slo.tpot_s) if at_rate else float("nan"),
        switches=at_rate.switches if at_rate else 0,
        drain_s=at_rate.drain_s if at_rate else 0.0,
        switch_s=at_rate.switch_s if at_rate else 0.0,
        detail=detail,
    )
