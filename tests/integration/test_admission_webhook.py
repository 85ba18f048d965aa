"""The operator's validating webhook against the real apiserver: refusals at `kubectl apply`,
warnings, and what an outage does (creates refused, updates and deletes go through)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from hybridserving.devcluster import FleetSpec
from hybridserving.devcluster.stack import operator_key
from support.cluster_fleet import ROOT
from support.crds import apply_crds
from support.polling import wait_for
from hybridserving_engine.simulator.process import free_ports


def doc(path: str, namespace: str, name: str | None = None) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / path).read_text())
    body["metadata"]["namespace"] = namespace
    if name:
        body["metadata"]["name"] = name
    return body


class WebhookOperator:
    def __init__(self, cluster, log) -> None:
        self.cluster, self.log = cluster, log
        (self.port,) = free_ports(1)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridserving.controller", "--kubeconfig", str(self.cluster.kubeconfig),
             "--metrics-port", "0", "--webhook-port", str(self.port), "--webhook-addr", "127.0.0.1"],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            env=dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), PYTHONUNBUFFERED="1",
                     HYBRIDSERVING_OPERATOR_KEY=operator_key(self.cluster)))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


@pytest.fixture(scope="module")
def guarded(make_cluster, tmp_path_factory):
    c = make_cluster(FleetSpec(nodes=2), prefix="itx")
    c.up(timeout=120)
    apply_crds(c)
    c.kubectl("create", "namespace", "fleets")
    op = WebhookOperator(c, tmp_path_factory.mktemp("operator") / "operator.log")
    op.start()

    def configured() -> bool:
        out = c.kubectl("get", "validatingwebhookconfiguration", "hybridserving.io", "-o", "json", check=False)
        return out.returncode == 0 and len(json.loads(out.stdout)["webhooks"]) == 2

    try:
        try:
            wait_for(configured, timeout=60, what="webhook configuration written by the operator")
        except AssertionError as exc:
            log = "\n".join(op.log.read_text(errors="replace").splitlines()[-40:])
            raise AssertionError(f"{exc}\noperator log:\n{log}") from None
        yield c, op
    finally:
        op.stop()


def apply(cluster, body: dict[str, Any]) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)


def test_the_configuration_fails_closed_for_creates_only_and_never_sees_deletes(guarded) -> None:
    c, _ = guarded
    config = json.loads(c.kubectl("get", "validatingwebhookconfiguration", "hybridserving.io", "-o", "json").stdout)
    policies = {tuple(h["rules"][0]["operations"]): h["failurePolicy"] for h in config["webhooks"]}
    assert policies == {("CREATE",): "Fail", ("UPDATE",): "Ignore"}
    for hook in config["webhooks"]:
        assert hook["rules"][0]["resources"] == ["hybridservings"], "status writes never reach the webhook"
        assert hook["clientConfig"]["caBundle"]


def test_a_bad_layout_is_refused_at_apply_with_the_field_and_fix(guarded) -> None:
    c, _ = guarded
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
    c, _ = guarded
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


def test_an_outage_refuses_creates_but_lets_updates_and_deletes_through(guarded) -> None:
    c, op = guarded
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
