"""The simulator's Prometheus families are SGLang 0.5.23's, read from the wheel's own source
(`observability/metrics_collector.py` in the tool cache): the same type, label names and buckets,
so dashboards, alert thresholds (`le` bounds), `rate()` over counters and quantiles computed from
the simulator are the engine's."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import Histogram
from prometheus_client.parser import text_string_to_metric_families

from hybridserving_engine.simulator import metrics
from hybridserving_engine.simulator.metrics import EngineMetrics
from support.series import metrics_in
from support.sglang_parser import SGLangParserUnavailable, cache_dir, sglang_python


def collector_source() -> ast.Module:
    try:
        sglang_python()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    [path] = Path(cache_dir(), "venv").glob("lib/python*/site-packages/sglang/srt/observability/metrics_collector.py")
    return ast.parse(path.read_text())


def default_buckets(tree: ast.Module) -> dict[str, list[float]]:
    """The module's `bucket_*` lists, the tokenizer histograms' defaults (lines 1965-2041)."""
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.startswith("bucket_") and isinstance(node.value, ast.List)}


@dataclass(frozen=True)
class Family:
    """One metric as SGLang constructs it, with the label names a scrape of it shows."""

    type: str
    labels: frozenset[str]
    buckets: ast.expr | None
    """As written: a literal, a module-level default, or (for families the simulator lacks) computed."""


def label_keys(tree: ast.Module, function: str) -> list[str]:
    """The keys of the first `labels = {...}` in `function`: the labels every metric of a collector carries."""
    [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    literal = next(n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                   and n.targets[0].id == "labels" and isinstance(n.value, ast.Dict))
    return [ast.literal_eval(k) for k in literal.keys if k is not None]


def sglang_families(tree: ast.Module) -> dict[str, Family]:
    """The scheduler's and the tokenizer's metrics by exposed name (a counter's without `_total`, as
    prometheus_client names it). SGLang serves `/metrics` from prometheus_client's multiprocess files
    (`utils/common.py:2843-2849`), where a gauge left in the default mode "all" gets one series per
    process, told apart by a `pid` label; its other modes merge the processes and add none."""
    # Scheduler labels: `init_new` (lines 1382-1388); tokenizer labels: `tokenizer_metric_labels`
    # (lines 1807-1812); the optional ones (dp_rank, priority, custom) are not in these literals.
    base = {"SchedulerMetricsCollector": label_keys(tree, "init_new"),
            "TokenizerMetricsCollector": label_keys(tree, "tokenizer_metric_labels")}
    out: dict[str, Family] = {}
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name in base):
            continue
        for call in ast.walk(cls):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id in ("Gauge", "Counter", "Histogram", "Summary")):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            if not isinstance(named := kw.get("name"), ast.Constant):
                continue
            extra = {str(n.value) for n in ast.walk(kw["labelnames"]) if isinstance(n, ast.Constant)}
            mode = ast.literal_eval(kw["multiprocess_mode"]) if "multiprocess_mode" in kw else "all"
            if call.func.id == "Gauge" and mode in ("all", "liveall"):
                extra.add("pid")
            name = str(named.value)
            if call.func.id == "Counter":
                name = name.removesuffix("_total")
            assert name not in out, f"{name} is defined twice"
            out[name] = Family(call.func.id.lower(), frozenset(base[cls.name]) | extra, kw.get("buckets"))
    return out


def bounds(expr: ast.expr, defaults: dict[str, list[float]]) -> tuple[float, ...]:
    values = defaults[expr.id] if isinstance(expr, ast.Name) else ast.literal_eval(expr)
    return tuple(float(b) for b in values)


def test_the_latency_histograms_have_sglangs_buckets() -> None:
    tree = collector_source()
    defaults = default_buckets(tree)
    assert tuple(defaults["bucket_time_to_first_token"]) == metrics.TTFT_BUCKETS
    assert tuple(defaults["bucket_inter_token_latency"]) == metrics.ITL_BUCKETS
    assert tuple(defaults["bucket_e2e_request_latency"]) == metrics.E2E_BUCKETS
    queue = [call for call in ast.walk(tree) if isinstance(call, ast.Call)
             and any(isinstance(k.value, ast.Constant) and k.value.value == "sglang:queue_time_seconds"
                     for k in call.keywords if k.arg == "name")]
    [buckets] = [ast.literal_eval(k.value) for k in queue[0].keywords if k.arg == "buckets"]
    assert tuple(buckets) == metrics.QUEUE_BUCKETS


def test_every_simulated_family_has_sglangs_type_labels_and_buckets() -> None:
    """A gauge where SGLang has a histogram (`kv_transfer_latency_ms`, lines 637-648) leaves a query
    of its `_bucket`, `_count` or `_sum` with nothing to read, and a gauge SGLang scrapes with a
    `pid` label (`num_paused_reqs`, lines 573-577) matches label selectors and joins differently."""
    tree = collector_source()
    wheel, defaults = sglang_families(tree), default_buckets(tree)
    simulated = metrics_in(EngineMetrics("m", "prefill", role_switch=False))
    assert simulated
    wrong = []
    for metric in simulated:
        name = metric._name
        assert name in wheel, f"{name} is not a metric of SGLang 0.5.23's scheduler or tokenizer"
        family = wheel[name]
        got = (metric._type, sorted(metric._labelnames), getattr(metric, "_upper_bounds", None))
        wanted = (family.type, sorted(family.labels), None if family.type != "histogram" else list(
            Histogram.DEFAULT_BUCKETS if family.buckets is None else (*bounds(family.buckets, defaults), math.inf)))
        if got != wanted:
            wrong.append(f"{name}: simulated {got}, SGLang {wanted}")
    assert not wrong, "\n".join(wrong)


def test_the_prefills_kv_transfer_histograms_are_all_there() -> None:
    """`observe_kv_transfer_metrics` fills three histograms at once (lines 1457-1465)."""
    wheel = sglang_families(collector_source())
    simulated = {m._name for m in metrics_in(EngineMetrics("m", "prefill", role_switch=False))}
    observed = {"sglang:kv_transfer_latency_ms", "sglang:kv_transfer_total_mb", "sglang:kv_transfer_speed_gb_s"}
    assert observed <= wheel.keys()
    assert observed <= simulated


def test_token_counters_have_no_series_before_their_first_tokens() -> None:
    """`increment_realtime_tokens` skips a mode with no tokens (lines 1558-1572), so a prefill never
    shows a `decode` series, nor a decode a `prefill_compute` one, not even at 0."""
    m = EngineMetrics("m", "decode", role_switch=False)
    assert b"sglang:realtime_tokens_total{" not in m.exposition()
    m.inc(m.realtime_tokens_total, 0, mode="decode")
    assert b'mode="decode"' in m.exposition()
    assert b'mode="prefill_compute"' not in m.exposition()


def test_kv_transfers_are_observed_on_every_scheduler_that_sent_kv() -> None:
    """Every scheduler, not only the stats-logging one, hands its collector to the request's time
    stats when metrics are on (`managers/scheduler.py:3086-3087`), and every attention-CP rank but 0
    skips the observation by default (`disaggregation/prefill.py:1251-1253`)."""
    def observing_ranks(dp_rank: int, **layout: int) -> dict[str, list[str]]:
        m = EngineMetrics("m", "prefill", role_switch=False, schedulers=metrics.local_schedulers(**layout))
        m.observe_kv_transfer(dp_rank, latency_ms=3.0, total_mb=40.0, speed_gb_s=13.0)
        return {family.name: sorted(s.labels["tp_rank"] for s in family.samples if s.name.endswith("_count"))
                for family in text_string_to_metric_families(m.exposition().decode())
                if family.name.startswith("sglang:kv_transfer_")}

    every = ["sglang:kv_transfer_latency_ms", "sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_total_mb"]
    assert observing_ranks(1, tp=4, attn_dp=2) == dict.fromkeys(every, ["2", "3"])
    assert observing_ranks(0, tp=4, attn_cp=2) == dict.fromkeys(every, ["0", "1"])
