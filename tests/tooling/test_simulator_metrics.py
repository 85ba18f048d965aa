"""The simulator's latency histograms have SGLang 0.5.23's buckets, read from the wheel's own
source (`observability/metrics_collector.py` in the tool cache), so dashboards, alert
thresholds (`le` bounds) and quantiles computed from the simulator are the engine's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hybridserving_engine.simulator import metrics
from support.sglang_parser import SGLangParserUnavailable, cache_dir, sglang_python


def collector_source() -> ast.Module:
    try:
        sglang_python()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    [path] = Path(cache_dir(), "venv").glob("lib/python*/site-packages/sglang/srt/observability/metrics_collector.py")
    return ast.parse(path.read_text())


def test_the_latency_histograms_have_sglangs_buckets() -> None:
    tree = collector_source()
    defaults = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("bucket_") and isinstance(node.value, ast.List)}
    assert tuple(defaults["bucket_time_to_first_token"]) == metrics.TTFT_BUCKETS
    assert tuple(defaults["bucket_inter_token_latency"]) == metrics.ITL_BUCKETS
    assert tuple(defaults["bucket_e2e_request_latency"]) == metrics.E2E_BUCKETS
    queue = [call for call in ast.walk(tree) if isinstance(call, ast.Call)
             and any(isinstance(k.value, ast.Constant) and k.value.value == "sglang:queue_time_seconds"
                     for k in call.keywords if k.arg == "name")]
    [buckets] = [ast.literal_eval(k.value) for k in queue[0].keywords if k.arg == "buckets"]
    assert tuple(buckets) == metrics.QUEUE_BUCKETS
