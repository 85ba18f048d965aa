"""The operator's validating webhook against the real apiserver, behind the chart's own
ValidatingWebhookConfiguration: refusals at `kubectl apply`, warnings, what an outage does
(creates refused, updates and deletes go through), and that the operator writes no webhook
configuration itself.

The apiserver here cannot reach a Service, so the test calls the operator at 127.0.0.1 with a
certificate made for that address; everything else in the configuration is the chart's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from hybridserving.devcluster import FleetSpec
from hybridserving.devcluster.stack import operator_key
from support.chart import render, the
from support.cluster_fleet import ROOT
from support.crds import apply_crds
from support.polling import wait_for
from support.webhook_cert import self_signed
from hybridserving_engine.simulator.process import free_ports


def doc(path: str, namespace: str, name: str | None = None) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / path).read_text())
    body["metadata"]["namespace"] = namespace
    if name:
        body["metadata"]["name"] = name
    return body


class WebhookOperator:
    def __init__(self, cluster, log, cert_dir) -> None:
        self.cluster, self.log, self.cert_dir = cluster, log, cert_dir
        (self.port,) = free_ports(1)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridserving.controller", "--kubeconfig", str(self.cluster.kubeconfig),
             "--metrics-port", "0", "--webhook-port", str(self.port), "--webhook-addr", "127.0.0.1",
             "--webhook-cert-dir", str(self.cert_dir)],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            env=dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), PYTHONUNBUFFERED="1",
                     HYBRIDSERVING_OPERATOR_KEY=operator_key(self.cluster)))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def dry_run(cluster, body: dict[str, Any]) -> subprocess.CompletedProcess:
    """Admission (and the webhook) without storing the object."""
    return cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False)


def chart_configuration(port: int, ca: bytes) -> dict[str, Any]:
    """The chart's configuration for a release reconciling `fleets` with a certificate of its
    own (`webhook.certificate`, the chart's caBundle kept), calling 127.0.0.1:port."""
    config = the(render("webhook.enabled=true", "watchNamespaces={fleets}",
                        "webhook.certificate.existingSecret=webhook-cert",
                        f"webhook.certificate.caBundle={base64.b64encode(ca).decode()}"),
                 "ValidatingWebhookConfiguration")
    for hook in config["webhooks"]:
        path = hook["clientConfig"].pop("service")["path"]
        hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{path}"
    return config


@pytest.fixture(scope="module")
def guarded(make_cluster, tmp_path_factory):
    c = make_cluster(FleetSpec(nodes=2), prefix="itx")
    c.up(timeout=120)
    apply_crds(c)
    c.kubectl("create", "namespace", "fleets")
    c.kubectl("create", "namespace", "elsewhere")
    cert_dir = tmp_path_factory.mktemp("webhook-cert")
    certfile, _ = self_signed("127.0.0.1", cert_dir)
    op = WebhookOperator(c, tmp_path_factory.mktemp("operator") / "operator.log", cert_dir)
    config = chart_configuration(op.port, certfile.read_bytes())
    c.kubectl("apply", "-f", "-", input=json.dumps(config))
    op.start()

    def serving() -> bool:
        return "denied the request" in dry_run(c, doc("invalid/kda-zigzag.yaml", "fleets")).stderr

    try:
        try:
            wait_for(serving, timeout=60, what="the operator answering the chart's webhook")
        except AssertionError as exc:
            log = "\n".join(op.log.read_text(errors="replace").splitlines()[-40:])
            raise AssertionError(f"{exc}\noperator log:\n{log}") from None
        yield c, op, config["metadata"]["name"]
    finally:
        op.stop()


def apply(cluster, body: dict[str, Any]) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)


def test_the_operator_writes_no_webhook_configuration_of_its_own(guarded) -> None:
    """kopf's managed mode would add its own validating and mutating configurations (and need
    permissions the chart does not grant); the chart's configuration is the only one."""
    c, _, name = guarded
    out = c.kubectl("get", "validatingwebhookconfigurations,mutatingwebhookconfigurations", "-o", "name")
    assert out.stdout.split() == [f"validatingwebhookconfiguration.admissionregistration.k8s.io/{name}"]


def test_namespaces_the_release_does_not_reconcile_are_not_guarded(guarded) -> None:
    c, _, _ = guarded
    out = dry_run(c, doc("invalid/kda-zigzag.yaml", "elsewhere"))
    assert out.returncode == 0, out.stderr


def test_a_bad_layout_is_refused_at_apply_with_the_field_and_fix(guarded) -> None:
    c, _, _ = guarded
    # A layout rule CEL cannot express (it depends on the model's layers).
    out = apply(c, doc("invalid/kda-zigzag.yaml", "fleets"))
    assert out.returncode != 0
    assert "denied the request" in out.stderr
    assert "spec.prefill.layout.cpStrategy" in out.stderr and "Fix: remove attnCp and cpStrategy" in out.stderr
    capacity = apply(c, doc("invalid/weights-do-not-fit.yaml", "fleets"))
    assert capacity.returncode != 0 and "denied the request" in capacity.stderr
    assert c.kubectl("-n", "fleets", "get", "hybridservings", "-o", "name").stdout.strip() == ""
    owned = apply(c, doc("invalid/pod-template-owned-gpus.yaml", "fleets"))
    assert owned.returncode != 0
    assert "spec.decode.podTemplate.spec.containers[engine].resources.limits[nvidia.com/gpu]" in owned.stderr


def test_warnings_come_back_to_kubectl_and_a_bad_update_is_refused(guarded) -> None:
    c, _, _ = guarded
    body = doc("role-switch.yaml", "fleets", "warned")
    body["spec"]["prefill"]["podTemplate"] = {"spec": {"tolerations": [{"operator": "Exists"}]}}
    out = apply(c, body)
    assert out.returncode == 0, out.stderr
    assert "Warning: spec.prefill.podTemplate: prefill and decode pod templates differ" in out.stderr
    body["spec"]["decode"]["podTemplate"] = {"spec": {"containers": [
        {"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    out = apply(c, body)
    assert out.returncode != 0 and "denied the request" in out.stderr
    assert "spec.decode.podTemplate.spec.containers[engine].resources.limits[nvidia.com/gpu]" in out.stderr
    # An update is also judged as a step from the stored spec (the apiserver's oldObject).
    del body["spec"]["decode"]["podTemplate"]
    body["spec"]["roleSwitch"]["drainTimeoutSeconds"] = 900
    out = apply(c, body)
    assert out.returncode == 0, out.stderr
    assert "Warning: spec.roleSwitch.drainTimeoutSeconds: 300 → 900 rolls every instance" in out.stderr, out.stderr


def test_an_outage_refuses_creates_but_lets_updates_and_deletes_through(guarded) -> None:
    c, op, _ = guarded
    assert apply(c, doc("role-switch.yaml", "fleets", "running")).returncode == 0
    op.stop()
    try:
        out = apply(c, doc("role-switch.yaml", "fleets", "new-during-outage"))
        assert out.returncode != 0 and "failed calling webhook" in out.stderr
        scaled = c.kubectl("-n", "fleets", "patch", "hybridserving", "running", "--type=merge",
                           "-p", '{"spec": {"decode": {"replicas": 1}}}', check=False)
        assert scaled.returncode == 0, scaled.stderr
        deleted = c.kubectl("-n", "fleets", "delete", "hybridserving", "running", "--wait=true", check=False)
        assert deleted.returncode == 0, deleted.stderr
    finally:
        op.start()
