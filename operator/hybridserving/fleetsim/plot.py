"""One picture of a run: offered load, the prefill/decode split, and SLO attainment over time."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from hybridserving.fleetsim.goodput import Slo, windowed_good
from hybridserving.fleetsim.simulator import SimResult
from hybridserving.fleetsim.traces import Trace


def plot_runs(path: str | Path, trace: Trace, results: Sequence[SimResult], slo: Slo, window_s: float = 60.0) -> Path:
    """Write a PNG with three stacked panels sharing the time axis; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load_ax, split_ax, slo_ax) = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    bins = (trace.arrival_s // window_s).astype(np.int64)
    n = int(bins.max()) + 1 if len(bins) else 0
    t = np.arange(n) * window_s / 60.0
    load_ax.plot(t, np.bincount(bins, minlength=n) / window_s, color="black", label="requests/s")
    tokens = np.bincount(bins, weights=trace.prompt_tokens - trace.cached_tokens, minlength=n) / window_s
    out = np.bincount(bins, weights=trace.output_tokens, minlength=n) / window_s
    twin = load_ax.twinx()
    twin.plot(t, tokens / np.maximum(out, 1), color="tab:orange", alpha=0.7, label="prefill:decode tokens")
    load_ax.set_ylabel("requests/s")
    twin.set_ylabel("new prompt / output tokens")
    load_ax.set_title(
        f"{trace.name}: load, split and SLO attainment (TTFT ≤ {slo.ttft_s:g} s, TPOT ≤ {slo.tpot_s * 1e3:g} ms)"
    )
    for r in results:
        split_ax.step(r.timeline_t / 60.0, r.timeline_prefill, where="post", label=r.policy)
        good, total = windowed_good(r, slo, window_s)
        with np.errstate(invalid="ignore", divide="ignore"):
            slo_ax.plot(np.arange(len(good)) * window_s / 60.0, good / total, label=r.policy)
    split_ax.set_ylabel("prefill instances serving")
    slo_ax.set_ylabel("SLO attainment")
    slo_ax.set_xlabel("minutes")
    slo_ax.axhline(0.9, color="grey", linestyle=":")
    slo_ax.set_ylim(0, 1.02)
    split_ax.legend(fontsize=7, ncol=3)
    slo_ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
