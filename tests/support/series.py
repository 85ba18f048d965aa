"""What the project's processes export to Prometheus, read from their prometheus_client metric objects,
and what the real smg 1.13.0 router served (an exposition recorded from it): the dashboard and the
alert rules may only read series that exist."""

from __future__ import annotations

import pathlib
from collections.abc import Iterable

from prometheus_client.metrics import MetricWrapperBase

SMG_EXPOSITION = pathlib.Path(__file__).parent / "data" / "smg-1.13.0.metrics"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
            "summary": ("_sum", "_count", "")}


def series_of(metrics: Iterable[MetricWrapperBase]) -> dict[str, set[str]]:
    """Sample name -> label names, for prometheus_client metric objects."""
    out: dict[str, set[str]] = {}
    for m in metrics:
        for suffix in SUFFIXES[str(m._type)]:
            out[m._name + suffix] = set(m._labelnames)
    return out


def metrics_in(obj: object) -> list[MetricWrapperBase]:
    """The metric objects a module or an object holds as attributes."""
    return [v for v in vars(obj).values() if isinstance(v, MetricWrapperBase)]


def engine_series() -> dict[str, set[str]]:
    from hybridserving_engine.simulator.metrics import EngineMetrics

    return series_of(metrics_in(EngineMetrics("m", "prefill", role_switch=True)))


def operator_series() -> dict[str, set[str]]:
    from hybridserving.controller import metrics

    return series_of(metrics_in(metrics))


def launcher_series() -> dict[str, set[str]]:
    from hybridserving_engine.launcher import LauncherMetrics

    return series_of(metrics_in(LauncherMetrics()))
