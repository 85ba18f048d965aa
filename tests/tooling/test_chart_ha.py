"""The chart's operator replicas: leader election at any count on a Lease Role; rolling updates, a
disruption budget and spreading over nodes with 2 or more."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from support.chart import RELEASE_NS, helm, of_kind, operator_container, render, template_args, the


def test_two_replicas_elect_a_leader_on_a_lease_of_their_own() -> None:
    docs = render("replicaCount=2")
    deployment = the(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    container = operator_container(docs)
    # A standby answers its liveness probe (the operator's /healthz, healthy once the startup handler returns).
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--leader-elect" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "hs-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["hybridserving-operator"],
         "verbs": ["get", "patch"]},
    ]


@pytest.mark.parametrize("webhook", ["true", "false"])
def test_a_rolling_update_waits_for_each_new_replica_to_start(webhook: str) -> None:
    """maxUnavailable 0 holds an old replica only until the new one is Ready: without a readiness
    probe a new image that never starts would count as Ready at once and replace every replica."""
    container = operator_container(render("replicaCount=2", f"webhook.enabled={webhook}"))
    probe = container["readinessProbe"]
    assert probe.get("httpGet") == {"path": "/healthz", "port": "health"} or probe.get("tcpSocket") == {
        "port": "webhook"}, probe


def test_one_replica_elects_too_so_scaling_to_two_never_has_two_acting() -> None:
    """From 1 to 2 the pods roll (surge first): an old replica without election would act beside
    the new leader until it stops."""
    docs = render()
    assert the(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    args = operator_container(docs)["args"]
    assert "--leader-elect" in args and "--leader-elect-lease=hybridserving-operator" in args
    assert [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]


def render_with_affinity(replicas: int, affinity: dict[str, Any]) -> list[dict[str, Any]]:
    proc = helm(*template_args([f"replicaCount={replicas}"]), "--set-json", f"affinity={json.dumps(affinity)}")
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def spreading(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The preferred anti-affinity terms on the operator pod."""
    affinity = the(docs, "Deployment")["spec"]["template"]["spec"].get("affinity") or {}
    terms: list[dict[str, Any]] = (affinity.get("podAntiAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution") or []
    return terms


def test_two_replicas_are_evicted_one_at_a_time() -> None:
    """`kubectl drain` must never take every replica at once: no leader, and with the webhook on no
    endpoint, so every create would fail closed."""
    docs = render("replicaCount=2")
    pdb = the(docs, "PodDisruptionBudget")
    deployment = the(docs, "Deployment")
    assert pdb["metadata"]["namespace"] == RELEASE_NS
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    # A replica that is not Ready must not hold the drain of its node.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_two_replicas_prefer_different_nodes_but_do_not_require_them() -> None:
    docs = render("replicaCount=2")
    pod = the(docs, "Deployment")["spec"]["template"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spreading(docs)
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == {
        "matchLabels": the(docs, "Deployment")["spec"]["selector"]["matchLabels"]}
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


@pytest.mark.parametrize("replicas", [0, 1])
def test_one_replica_gets_no_budget_and_no_spreading(replicas: int) -> None:
    """A budget on one replica would only block the drain of its node."""
    docs = render(f"replicaCount={replicas}")
    assert of_kind(docs, "PodDisruptionBudget") == []
    assert "affinity" not in the(docs, "Deployment")["spec"]["template"]["spec"]


def test_an_affinity_of_the_users_keeps_the_spreading_unless_it_says_pod_anti_affinity() -> None:
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node-role.example/system", "operator": "Exists"}]}]}}
    docs = render_with_affinity(2, {"nodeAffinity": node_affinity})
    assert the(docs, "Deployment")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"] == node_affinity
    assert len(spreading(docs)) == 1
    # The user's own podAntiAffinity wins whole, `{}` turning the spreading off.
    assert spreading(render_with_affinity(2, {"podAntiAffinity": {}})) == []
    assert the(render_with_affinity(2, {"podAntiAffinity": {}}), "Deployment")["spec"]["template"]["spec"][
        "affinity"] == {"podAntiAffinity": {}}
    # One replica: the user's affinity as given, nothing added.
    assert the(render_with_affinity(1, {"nodeAffinity": node_affinity}), "Deployment")["spec"]["template"][
        "spec"]["affinity"] == {"nodeAffinity": node_affinity}
