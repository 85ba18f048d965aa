"""Reading an engine's /metrics page the way Prometheus would."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` (e.g. `sglang:prompt_tokens_total`) whose labels include
    `labels`: several series of one counter (by mode, by engine type) add up to what a test checks.
    """
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
