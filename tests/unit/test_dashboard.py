"""The Grafana dashboard in deploy/grafana: well-formed, and querying only series that exist.

A dashboard whose query names a metric nobody exports shows "No data" forever and nobody
notices; so every series and label it uses is looked up in the code that exports it: SGLang's
series in the engine simulator (which serves them under SGLang's names and labels), the
operator's in hybridserving.controller.metrics, the launcher's in its registry, and the router's
in an exposition recorded from the real smg 1.13.0 (tests/support/data/smg-1.13.0.metrics). Grafana
itself publishes no JSON Schema for dashboards on the registries reachable here (the
grafana-foundation-sdk models decode leniently and validate nothing), so the structure Grafana
needs is checked directly.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

from support.series import SMG_EXPOSITION, engine_series, launcher_series, operator_series

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "hybridserving-dashboard.json"


# Labels Prometheus attaches to every scraped series (target labels) or histogram buckets carry;
# the chart's PodMonitors add the fleet and instance from the pod's labels.
SCRAPE_LABELS = {"namespace", "pod", "instance", "job", "le", "hybridserving", "hybridserving_instance"}
METRIC = re.compile(r"\b(sglang:[a-z_]+|hybridserving_[a-z_]+|smg_[a-z_]+)\b")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}


def metric_names(expr: str) -> list[str]:
    """Series names in a query (label names that look like series, such as hybridserving_instance, aside)."""
    return [n for n in METRIC.findall(expr) if n not in SCRAPE_LABELS]


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict) -> Iterator[tuple[str, dict]]:
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target


def router_series() -> dict[str, set[str]]:
    """Sample name -> label names, as smg 1.13.0 served them."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(SMG_EXPOSITION.read_text()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def labels_used(expr: str, legend: str) -> set[str]:
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        used |= {w.strip() for w in group.split(",") if w.strip()}
    for selector in re.findall(r"\{([^{}]*)\}", expr):
        used |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return used - PROMQL_WORDS


# ------------------------------------------------------------------------------------ structure


def test_dashboard_has_what_grafana_requires() -> None:
    d = load()
    assert isinstance(d["title"], str) and d["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"])
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36  # Grafana 9+
    assert d["time"].keys() >= {"from", "to"}
    assert isinstance(d["templating"]["list"], list)
    assert d["panels"]


def test_panel_ids_are_unique() -> None:
    ids = [p["id"] for p in all_panels(load())]
    assert len(ids) == len(set(ids))
    assert all(isinstance(i, int) for i in ids)


def test_panels_fit_the_grid_without_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in all_panels(load()):
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("x", "y", "w", "h")), p["title"]
        assert 0 <= g["x"] and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_every_data_panel_queries_the_chosen_prometheus() -> None:
    d = load()
    data_panels = [p for p in all_panels(d) if p["type"] != "row"]
    assert data_panels
    for p in data_panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            assert t.get("datasource", p["datasource"]) == p["datasource"]


def test_expressions_are_balanced() -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    for title, t in queries(load()):
        stack: list[str] = []
        text = re.sub(r'"[^"]*"', '""', t["expr"])  # brackets inside label values do not count
        for ch in text:
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                assert stack and stack.pop() == pairs[ch], f"{title}: unbalanced {t['expr']}"
        assert not stack, f"{title}: unbalanced {t['expr']}"


def test_template_variables_are_defined_and_used() -> None:
    d = load()
    text = json.dumps(d["panels"]) + json.dumps(d["templating"])
    defined = {v["name"] for v in d["templating"]["list"]}
    used = set(re.findall(r"\$\{?(\w+)", text)) - {"__rate_interval", "__interval", "__range"}
    assert used <= defined, f"undefined variables: {used - defined}"
    assert defined <= used, f"unused variables: {defined - used}"
    (ds,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert ds["query"] == "prometheus"


def test_dashboard_covers_the_fleet() -> None:
    exprs = " ".join(t["expr"] for _, t in queries(load()))
    for needed in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "hybridserving_role_switches_total",
        "hybridserving_reconciles_total",
        "smg_worker_pool_size",
        "smg_pd_ttft_seconds_bucket",
        "smg_http_responses_total",
        "hybridserving_instance_crash_looping",
        "hybridserving_launcher_engine_restarts_total",
    ):
        assert needed in exprs
    assert "by (le, engine_type)" in exprs  # quantiles are per role


# ------------------------------------------------------------------- series exist where exported


def test_every_engine_series_is_exported_by_the_engine() -> None:
    exported = engine_series()
    for title, t in queries(load()):
        names = [n for n in metric_names(t["expr"]) if n.startswith("sglang:")]
        for name in names:
            assert name in exported, f"{title}: {name} is not an SGLang series the engine exports"
        if names and not any(n.startswith("hybridserving_") for n in metric_names(t["expr"])):
            labels = set().union(*(exported[n] for n in names)) | SCRAPE_LABELS
            assert labels_used(t["expr"], t.get("legendFormat", "")) <= labels, title


def test_every_operator_series_is_exported_by_the_operator_or_the_launcher() -> None:
    exported = operator_series() | launcher_series()
    for title, t in queries(load()):
        names = [n for n in metric_names(t["expr"]) if n.startswith("hybridserving_")]
        for name in names:
            assert name in exported, f"{title}: {name} is exported by neither the operator nor the launcher"
        if names:
            labels = set().union(*(exported[n] for n in names)) | SCRAPE_LABELS
            used = labels_used(t["expr"], t.get("legendFormat", ""))
            assert used <= labels, f"{title}: labels {used - labels} are not on {names}"


def test_every_router_series_is_exported_by_the_router() -> None:
    exported = router_series()
    for title, t in queries(load()):
        names = [n for n in metric_names(t["expr"]) if n.startswith("smg_")]
        for name in names:
            assert name in exported, f"{title}: {name} is not in smg 1.13.0's exposition"
        if names:
            labels = set().union(*(exported[n] for n in names)) | SCRAPE_LABELS
            used = labels_used(t["expr"], t.get("legendFormat", ""))
            assert used <= labels, f"{title}: labels {used - labels} are not on {names}"


def test_the_lookup_would_catch_a_typo() -> None:
    """The checks above are only as good as the exported set: it must be specific."""
    exported = engine_series()
    assert "sglang:num_running_reqs" in exported
    assert "sglang:time_to_first_token_seconds_bucket" in exported
    assert "sglang:num_running_req" not in exported
    assert exported["sglang:num_queue_reqs"] >= {"engine_type", "model_name"}
    router = router_series()
    assert router["smg_worker_pool_size"] >= {"worker_type", "model"}
    assert "smg_worker_pool_sizes" not in router
