"""Goodput as DistServe defines it, and the hindsight references (best static split, oracle).

Goodput is the highest request rate at which at least 90 % of requests meet both their TTFT and
TPOT limits. The rate is varied by scaling the trace's timestamps and found by bisection, since
attainment falls (close to monotonically) as the rate rises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
) -> float:
    """Largest rate scale in [low, high] whose attainment meets `target` (0 if even `low` fails)."""
    if attainment_at(low) < target:
        return 0.0
    if attainment_at(high) >= target:
        return high
    for _ in range(iterations):
        mid = (low * high) ** 0.5
        if attainment_at(mid) >= target:
            low = mid
        else:
            high = mid
    return low


def windowed_good(result: SimResult, slo: Slo, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per window of arrival time: requests that met both limits, and requests."""
    bins = (result.arrival_s // window_s).astype(np.int64)
    n = int(bins.max()) + 1 if len(bins) else 0
    good = np.bincount(bins, weights=result.meets(slo.ttft_s, slo.tpot_s), minlength=n)
    total = np.bincount(bins, minlength=n).astype(float)
    return good, total


def oracle_attainment(static_results: list[SimResult], slo: Slo, window_s: float) -> float:
    """The best split per window in hindsight, switching instantly and for free between windows.

    Each window takes the static split that served that window's requests best; the per-split
    state at a window's start is the one that split itself built up, which is the most the oracle
    could ask for.
    """
    per_split = [windowed_good(r, slo, window_s) for r in static_results]
    n = max(len(g) for g, _ in per_split)
    best = np.zeros(n)
    total = np.zeros(n)
    for good, count in per_split:
        best[: len(good)] = np.maximum(best[: len(good)], good)
        total[: len(count)] = count
    return float(best.sum() / total.sum()) if total.sum() else 1.0


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


def report(policy: str, trace: Trace, gpus: int, scale: float, at_rate: SimResult | None, slo: Slo, detail: str = "") -> GoodputReport:
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
