"""The chart's monitoring objects against the Prometheus Operator's own CRDs on the real apiserver.

The PodMonitors, the ServiceMonitor and the PrometheusRule are rendered by helm and sent as a
server-side dry run with strict field validation, so a misspelt field or a wrong type in any of
them is refused as a Prometheus Operator installation would refuse it. The CRDs come from the
prometheus-operator Go module (tools/build-tools.sh).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from hybridserving.devcluster import Cluster, bin_dir, cache_dir, read_versions

from support.chart import CHART

KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")


def crd_dir():
    path = cache_dir() / "tools" / f"prometheus-operator-crds-{read_versions()['PROMETHEUS_OPERATOR_VERSION']}"
    if not path.is_dir():
        pytest.fail(f"{path} is missing: run `bash tools/build-tools.sh`", pytrace=False)
    return path


def rendered(*sets: str) -> list[dict]:
    args = [str(bin_dir() / "helm"), "template", "hs", str(CHART), "-n", "hs-system"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] in KINDS]


@pytest.fixture(scope="module")
def prometheus_operator_crds(cluster: Cluster):
    cluster.kubectl("apply", "--server-side", "-f", str(crd_dir()))
    for plural in ("podmonitors", "servicemonitors", "prometheusrules"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", "--timeout=60s")


def test_monitoring_objects_pass_the_prometheus_operator_schemas(cluster: Cluster, prometheus_operator_crds,
                                                                 namespace) -> None:
    docs = rendered("metrics.serviceMonitor.enabled=true", "monitoring.podMonitors.enabled=true",
                    "monitoring.prometheusRule.enabled=true", f"watchNamespaces={{{namespace}}}")
    assert sorted(d["kind"] for d in docs) == ["PodMonitor", "PodMonitor", "PrometheusRule", "ServiceMonitor"]
    for d in docs:
        d["metadata"]["namespace"] = namespace
    proc = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                           input="\n---\n".join(json.dumps(d) for d in docs), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == 4, proc.stdout
    assert "unknown field" not in proc.stderr, proc.stderr


def test_the_schemas_would_refuse_a_misspelt_field(cluster: Cluster, prometheus_operator_crds, namespace) -> None:
    (monitor, *_) = rendered("monitoring.podMonitors.enabled=true")
    monitor["metadata"]["namespace"] = namespace
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    proc = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(monitor),
                           check=False)
    assert proc.returncode != 0 and "intervall" in proc.stderr, proc.stderr
