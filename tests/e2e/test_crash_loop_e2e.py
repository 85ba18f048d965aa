"""A crashing engine on the local control plane: the pod counts restarts with the kubelet's
semantics, the instance says CrashLoop with the last exit, an Event says so, and the crash-loop
alert's expression fires on the series the operator exported during the run.

Two fleets share the namespace: `crashy`, whose engines exit at start (the simulator's
`crash_on_start` fault), and `steady`, which must stay out of every finding. The operator's
/metrics is scraped once a second throughout; the recorded samples become the input of a
`promtool test rules` case that evaluates the alert's expression (as the chart renders it) at
the end of the recording. The alert's `for: 2m` is longer than the recording and is covered by
the rule tests in tests/tooling/alerts.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import urllib.request

import yaml
from prometheus_client.parser import text_string_to_metric_families

from hybridserving.devcluster import bin_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "crash-e2e"
SERIES = ("hybridserving_instance_crash_looping", "hybridserving_instance_restarts")
ALERT = "HybridServingInstanceCrashLooping"


def manifest(name: str, faults: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["roleSwitch"]["enabled"] = False
    doc["spec"]["engine"] = {"env": [
        {"name": "HYBRIDSERVING_SIM_PROFILE", "value": doc["spec"]["model"]["profile"]},
        {"name": "HYBRIDSERVING_SIM_STARTUP_SECONDS", "value": "0.5"},
        {"name": "HYBRIDSERVING_SIM_FAULTS", "value": faults},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0.2"},
        {"name": "HYBRIDSERVING_RESTART_BACKOFF_S", "value": "0.2"},
        {"name": "HYBRIDSERVING_CRASH_LOOP_RESTARTS", "value": "2"},
    ]}
    return doc


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in SERIES and s.labels.get("namespace") == NAMESPACE:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def kubectl_json(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("-n", NAMESPACE, "get", *args, "-o", "json").stdout)


def alert_expr() -> str:
    proc = subprocess.run([str(bin_dir() / "helm"), "template", "hs", str(ROOT / "charts" / "hybridserving"),
                           "--show-only", "templates/prometheusrule.yaml",
                           "--set", "monitoring.prometheusRule.enabled=true",
                           "--set", "metrics.serviceMonitor.enabled=true",
                           "--set", "monitoring.podMonitors.enabled=true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rules = [r for g in yaml.safe_load(proc.stdout)["spec"]["groups"] for r in g["rules"]]
    return next(r["expr"] for r in rules if r.get("alert") == ALERT)


def test_a_crashing_engine_shows_crash_loop_and_fires_the_alert_expression(
        local_cluster, fleet_operator, pod_runner, tmp_path: pathlib.Path) -> None:
    cluster = local_cluster
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        for name, faults in (("crashy", "crash_on_start"), ("steady", "")):
            cluster.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(manifest(name, faults)))

        recording: list[dict] = []
        seen_phases: dict[str, set[str]] = {}
        seen_degraded: set[str] = set()
        crashy_trail: list[tuple[str | None, str | None, str | None]] = []  # (crashy-0, crashy-1, Degraded)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            recording.append(scrape(fleet_operator.metrics_url))
            phases = {inst["metadata"]["name"]: (inst.get("status") or {}).get("phase")
                      for inst in kubectl_json(cluster, "hybridservinginstances")["items"]}
            for name, phase in phases.items():
                seen_phases.setdefault(name, set()).add(phase)
            crashy = kubectl_json(cluster, "hybridserving", "crashy")
            degraded = next((c for c in crashy.get("status", {}).get("conditions", [])
                             if c["type"] == "Degraded"), {})
            if degraded.get("status") == "True":
                seen_degraded.add(degraded["reason"])
            crashy_trail.append((phases.get("crashy-0"), phases.get("crashy-1"), degraded.get("status")))
            restarts = {dict(k[1])["hybridserving_instance"]: v for k, v in recording[-1].items()
                        if k[0] == "hybridserving_instance_restarts" and dict(k[1])["hybridserving"] == "crashy"}
            steady = kubectl_json(cluster, "hybridserving", "steady").get("status", {}).get("ready")
            if len(restarts) == 2 and min(restarts.values()) >= 3 and steady == "True" \
                    and all("CrashLoop" in seen_phases.get(f"crashy-{i}", ()) for i in (0, 1)):
                break
            time.sleep(1)
        print(f"recorded {len(recording)} scrapes; phases seen {seen_phases}")

        # Kubelet semantics on the pods: restarts counted, the last exit with the launcher's last line.
        for i in (0, 1):
            pod = kubectl_json(cluster, "pod", f"crashy-{i}-0")
            (status,) = pod["status"]["containerStatuses"]
            assert status["restartCount"] >= 3, status
            last = status["lastState"]["terminated"]
            assert last["exitCode"] == 1 and last["reason"] == "Error", last
            assert last["message"].splitlines()[-1].endswith(
                "engine crash loop: 2 consecutive engine failures, last exit status 1; exiting so that the container "
                "restarts"), last["message"]
            # Instance status: CrashLoop was reported, the last exit is kept.
            assert "CrashLoop" in seen_phases[f"crashy-{i}"], seen_phases
            inst = kubectl_json(cluster, "hybridservinginstance", f"crashy-{i}")["status"]
            assert inst["restarts"] >= 3 and "engine crash loop: 2 consecutive engine failures" in inst["lastExit"]
        assert "CrashLoop" in seen_degraded
        # No flicker: once reported, the loop stays reported while the engines keep exiting, also
        # while a restarted container runs between two exits (the pod runner's back-off is 1 s).
        for column, label in ((0, "crashy-0"), (1, "crashy-1"), (2, "Degraded")):
            values = [row[column] for row in crashy_trail]
            first = values.index("True" if column == 2 else "CrashLoop")
            assert set(values[first:]) == {values[first]}, (label, values)
        events = kubectl_json(cluster, "events")["items"]
        crash_events = sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"])
                              for e in events if e["reason"] == "CrashLoop")
        assert crash_events == [("HybridServing", "crashy"), ("HybridServingInstance", "crashy-0"),
                                ("HybridServingInstance", "crashy-1")], "one on each instance, one on the fleet"
        for i in (0, 1):
            assert "CrashLoop" not in seen_phases[f"steady-{i}"]
            assert kubectl_json(cluster, "pod", f"steady-{i}-0")["status"]["containerStatuses"][0]["restartCount"] == 0

        # The alert's expression on what the operator exported, evaluated by promtool.
        keys = sorted({k for scrape_ in recording for k in scrape_})
        input_series = []
        for name, labels in keys:
            selector = ",".join(['job="hybridserving-operator"'] + [f'{k}="{v}"' for k, v in labels])
            values = " ".join(str(s[(name, labels)]) if (name, labels) in s else "_" for s in recording)
            input_series.append({"series": f"{name}{{{selector}}}", "values": values})
        expected = [
            {
                "labels": f'{{namespace="{NAMESPACE}", hybridserving="crashy", hybridserving_instance="crashy-{i}"}}',
                "value": 1,
            }
            for i in (0, 1)
        ]
        case = {
            "rule_files": [],
            "evaluation_interval": "1s",
            "tests": [
                {
                    "interval": "1s",
                    "input_series": input_series,
                    "promql_expr_test": [
                        {
                            "expr": f"count by (namespace, hybridserving, hybridserving_instance) ({alert_expr()})",
                            "eval_time": f"{len(recording) - 1}s",
                            "exp_samples": expected,
                        }
                    ],
                }
            ],
        }
        (tmp_path / "recorded.test.yaml").write_text(yaml.safe_dump(case, sort_keys=False))
        proc = subprocess.run(
            [str(bin_dir() / "promtool"), "test", "rules", "recorded.test.yaml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
