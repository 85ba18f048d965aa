"""The chart's alerts: rendered by the real `helm`, checked by the real `promtool test rules`.

Each alert fires on series shaped as their exporters write them and stays quiet where it must
(tests/tooling/alerts/*.test.yaml); every series a rule reads is one that something exports (the
operator, the SGLang simulator under SGLang's names, the launcher, the recorded smg 1.13.0
exposition, or the kube-state-metrics series named below); every alert has its runbook.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hybridserving.devcluster import bin_dir

from support.chart import ROOT, render, render_error
from support.series import SMG_EXPOSITION, engine_series, launcher_series, operator_series

ALERT_TESTS = pathlib.Path(__file__).parent / "alerts"
RUNBOOKS = ROOT / "docs" / "runbooks"
# kube-state-metrics series the weights alert reads (kube-state-metrics docs/metrics/workload/pod-metrics.md).
KUBE_STATE_METRICS = {"kube_pod_init_container_status_waiting_reason", "kube_pod_init_container_status_restarts_total",
                      "kube_pod_owner"}
# The rules and the monitors that scrape their series (the chart refuses the rules alone).
ENABLED = ("monitoring.prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=true",
           "monitoring.podMonitors.enabled=true")
SERIES = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
RECORDED = re.compile(r"^hybridserving:")


def promtool_binary() -> pathlib.Path:
    promtool = bin_dir() / "promtool"
    if not promtool.exists():
        pytest.fail(f"{promtool} is missing: build it with `bash tools/build-tools.sh` (or `make tools`)",
                    pytrace=False)
    return promtool


def rule_groups(*sets: str) -> list[dict]:
    (rule,) = [d for d in render(*ENABLED, *sets) if d["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def router_series() -> set[str]:
    names = set()
    for family in text_string_to_metric_families(SMG_EXPOSITION.read_text()):
        names |= {s.name for s in family.samples}
    return names


def promtool_test(tmp_path: pathlib.Path, groups: list[dict], test_file: pathlib.Path) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(test_file, tmp_path / test_file.name)
    return subprocess.run([str(promtool_binary()), "test", "rules", test_file.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def expressions(groups: list[dict]) -> str:
    return "\n".join(r["expr"] for g in groups for r in g["rules"])


def alerts(groups: list[dict]) -> list[dict]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


# ------------------------------------------------------------------------------------------ promtool


def test_rules_pass_promtool_check(tmp_path: pathlib.Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    proc = subprocess.run([str(promtool_binary()), "check", "rules", "rules.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("test_file", sorted(ALERT_TESTS.glob("*.test.yaml")), ids=lambda p: p.stem)
def test_alerts_fire_on_recorded_series(tmp_path: pathlib.Path, test_file: pathlib.Path) -> None:
    proc = promtool_test(tmp_path, rule_groups(), test_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_catches_a_wrong_expectation(tmp_path: pathlib.Path) -> None:
    """The rule tests can fail: the same case expecting the fleet alert 10 minutes early does."""
    case = (ALERT_TESTS / "hybridserving-alerts.test.yaml").read_text()
    wrong = case.replace("      - eval_time: 20m\n        alertname: HybridServingFleetNotReady",
                         "      - eval_time: 10m\n        alertname: HybridServingFleetNotReady", 1)
    assert wrong != case
    broken = tmp_path / "case" / "wrong.test.yaml"
    broken.parent.mkdir()
    broken.write_text(wrong)
    proc = promtool_test(tmp_path, rule_groups(), broken)
    assert proc.returncode != 0
    assert "HybridServingFleetNotReady" in proc.stdout + proc.stderr


def test_every_alert_is_tested_firing() -> None:
    cases = yaml.safe_load((ALERT_TESTS / "hybridserving-alerts.test.yaml").read_text())["tests"]
    fired = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if not t["exp_alerts"]}
    names = {a["alert"] for a in alerts(rule_groups())}
    assert names == fired, f"alerts without a firing case: {names - fired}"
    # Where an alert fires, some series it reads are there but must not fire it.
    assert names - quiet <= {"HybridServingTTFTBudgetBurn", "HybridServingTPOTBudgetBurn"}, names - quiet


def test_thresholds_follow_the_values(tmp_path: pathlib.Path) -> None:
    """Other thresholds reach the rules, and the same series then fire other alerts: a 4 s TTFT
    bucket and a KV threshold of 100 % make the cases that expect those alerts fail."""
    groups = rule_groups("monitoring.prometheusRule.slo.ttftSeconds=4", "monitoring.prometheusRule.kvCacheUsage=1")
    exprs = expressions(groups)
    assert 'le=~"4(\\\\.0)?"' in exprs and ") > 1\n" in exprs
    proc = promtool_test(tmp_path, groups, ALERT_TESTS / "hybridserving-alerts.test.yaml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "alertname: HybridServingKVCacheNearlyFull" in out and "alertname: HybridServingTTFTBudgetBurn" in out


# ----------------------------------------------------------------------------- series and runbooks


def test_every_series_a_rule_reads_is_exported() -> None:
    exported = set(operator_series()) | set(engine_series()) | set(launcher_series()) | router_series()
    exported |= KUBE_STATE_METRICS | {"up"}
    groups = rule_groups()
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    for group in groups:
        for rule in group["rules"]:
            for name in SERIES.findall(rule["expr"]):
                if name in recorded:
                    continue
                assert not RECORDED.match(name), f"{name} is read but never recorded"
                assert name in exported, f"{rule.get('alert') or rule.get('record')}: {name} is exported by nothing"


def test_every_alert_has_a_runbook_and_the_index_lists_it() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    for rule in alerts(rule_groups("monitoring.prometheusRule.runbookBaseUrl=https://runbooks.example/hs/")):
        name = rule["alert"]
        page = RUNBOOKS / f"{name}.md"
        assert page.exists(), f"{name} has no runbook"
        assert page.read_text().startswith(f"# {name}\n")
        assert f"[{name}]({name}.md)" in index
        assert rule["annotations"]["runbook_url"] == f"https://runbooks.example/hs/{name}.md"
        assert rule["labels"]["severity"] in ("warning", "critical")
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == {r["alert"] for r in alerts(rule_groups())}, "a runbook without an alert"


# --------------------------------------------------------------------------------------- monitors


def test_monitoring_is_off_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ServiceMonitor"}


@pytest.mark.parametrize(("sets", "missing"), [
    ((), ["metrics.serviceMonitor.enabled=true", "monitoring.podMonitors.enabled=true"]),
    (("monitoring.podMonitors.enabled=true",), ["metrics.serviceMonitor.enabled=true"]),
    (("metrics.serviceMonitor.enabled=true",), ["monitoring.podMonitors.enabled=true"]),
])
def test_the_rules_are_refused_without_the_monitors_that_scrape_their_series(sets: tuple[str, ...],
                                                                               missing: list[str]) -> None:
    """Without the ServiceMonitor nothing scrapes the operator, and HybridServingOperatorDown
    (absent `up`) would page from the install on; without the PodMonitors the engine, launcher
    and router alerts would never fire. The chart says which values to set instead."""
    err = render_error("monitoring.prometheusRule.enabled=true", *sets)
    assert "monitoring.prometheusRule.enabled needs" in err
    for value in ("metrics.serviceMonitor.enabled=true", "monitoring.podMonitors.enabled=true"):
        assert (value in err) == (value in missing), err


def test_every_operator_rule_selects_the_job_the_service_monitor_names() -> None:
    """`up` and the operator's series are selected by the job the ServiceMonitor writes; a rule
    on another job would read nothing."""
    (sm,) = [d for d in render(*ENABLED) if d["kind"] == "ServiceMonitor"]
    (job,) = [r["replacement"] for r in sm["spec"]["endpoints"][0]["relabelings"] if r["targetLabel"] == "job"]
    operator = set(operator_series()) | {"up"}
    for rule in alerts(rule_groups()):
        for name, selector in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", rule["expr"]):
            if name in operator and name != "up":
                assert f'job="{job}"' in selector, (rule["alert"], name)


def test_pod_monitors_scrape_engines_launchers_and_routers_with_the_jobs_the_rules_select() -> None:
    docs = render("monitoring.podMonitors.enabled=true", "watchNamespaces={llm,batch}")
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    engines, routers = monitors["hs-hybridserving-engines"], monitors["hs-hybridserving-routers"]
    # Worker ranks too: their dummy health check server serves /metrics (entrypoints/engine.py:1276-1284).
    assert engines["spec"]["selector"]["matchLabels"] == {"hybridserving.io/component": "engine"}
    assert routers["spec"]["selector"]["matchLabels"] == {"hybridserving.io/component": "router"}
    for m in (engines, routers):
        assert m["spec"]["namespaceSelector"] == {"matchNames": ["llm", "batch"]}
    jobs = {}
    for m in (engines, routers):
        for ep in m["spec"]["podMetricsEndpoints"]:
            relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
            jobs[relabel["job"]["replacement"]] = ep["port"]
            assert relabel["hybridserving"]["sourceLabels"] == ["__meta_kubernetes_pod_label_hybridserving_io_name"]
    assert jobs == {
        "hybridserving-engine": "http", "hybridserving-launcher": "launcher", "hybridserving-router": "metrics"
    }
    rules = expressions(rule_groups())
    assert set(re.findall(r'job="(hybridserving-[a-z]+)"', rules)) == set(jobs) | {"hybridserving-operator"}


def test_pod_monitors_cover_every_namespace_when_the_operator_does() -> None:
    docs = render("monitoring.podMonitors.enabled=true", "watchAllNamespaces=true")
    for d in docs:
        if d["kind"] == "PodMonitor":
            assert d["spec"]["namespaceSelector"] == {"any": True}


def test_operator_service_monitor_keeps_the_fleet_namespace_and_names_its_job() -> None:
    (sm,) = [d for d in render("metrics.serviceMonitor.enabled=true") if d["kind"] == "ServiceMonitor"]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["honorLabels"] is True
    assert {"targetLabel": "job", "replacement": "hybridserving-operator"} in ep["relabelings"]



def _degraded_reasons() -> set[str]:
    """Every reason the operator can give `Degraded`: the literals of its condition in
    `controller/status.py`, and the reasons `controller/reconcile.py` fails a pass with (literal,
    named by a module constant, or `_write_reason`'s)."""
    import ast

    operator = ROOT / "operator" / "hybridserving" / "controller"
    status = ast.parse((operator / "status.py").read_text())
    reasons: set[str] = set()
    for node in ast.walk(status):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "condition"
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "Degraded"):
            compared = {id(c) for cmp in ast.walk(node.args[2]) if isinstance(cmp, ast.Compare)
                        for c in ast.walk(cmp)}
            reasons |= {c.value for c in ast.walk(node.args[2])
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and id(c) not in compared}
    reconcile = ast.parse((operator / "reconcile.py").read_text())
    constants = {t.id: n.value.value for n in reconcile.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(reconcile):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "fail" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant):
                reasons.add(first.value)
            elif isinstance(first, ast.Name):
                reasons.add(constants[first.id])
        if isinstance(node, ast.FunctionDef) and node.name == "_write_reason":
            reasons |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        and c.value.isidentifier()}
    return reasons


def test_the_fleet_not_ready_runbook_names_every_degraded_reason() -> None:
    """The alert pages on-call to this runbook whatever made the fleet not Ready; a reason it does
    not name leaves them without a diagnosis or a mitigation."""
    reasons = _degraded_reasons()
    assert {"ProgressDeadlineExceeded", "NameTaken", "WriteForbidden", "CrashLoop"} <= reasons, reasons
    runbook = (RUNBOOKS / "HybridServingFleetNotReady.md").read_text()
    diagnose, mitigate = runbook.split("## Mitigate")
    missing = sorted(r for r in reasons - {"AsExpected"} if f"`{r}`" not in diagnose)
    assert not missing, f"Degraded reasons HybridServingFleetNotReady.md does not name: {missing}"
    unmitigated = sorted(r for r in reasons - {"AsExpected", "WriteForbidden", "WriteInvalid", "ReconcileError"}
                         if not re.search(rf"^- [^\n:]*\b{r}\b[^\n]*:", mitigate, re.M))
    assert not unmitigated, f"Degraded reasons with no Mitigate entry: {unmitigated}"
