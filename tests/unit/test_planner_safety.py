"""What the plan grants and guards: disruption budgets that let nodes drain, the engines'
network policy, pod security, and drift the plan does not set (extra selector keys, added
privileges) repaired rather than tolerated."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hybridserving.api.v1alpha1 import HybridServing
from hybridserving.core import planner, rendering, revisions
from hybridserving.core.actions import Action
from hybridserving.core.naming import LABEL_COMPONENT, LABEL_NAME
from hybridserving.core.observed import Observed
from hybridserving.core.rendering import EngineAccess
from support.fleets import router_deployment
from support.patches import apply_merge_patch


def fleet(**spec: Any) -> HybridServing:
    body: dict[str, Any] = {
        "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
        "prefill": {"replicas": 3, "layout": {"tp": 8}},
        "decode": {"replicas": 2, "layout": {"tp": 16}, "nodesPerInstance": 2},
    }
    body.update(spec)
    return HybridServing.model_validate(
        {"metadata": {"name": "hs", "namespace": "ns", "uid": "hs-uid"}, "spec": body})


ROUTER = router_deployment(fleet())


def objects(hs: HybridServing, access: EngineAccess | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    return planner.plan(hs, Observed(), access).objects


def test_budgets_use_an_integer_min_available_the_disruption_controller_can_evaluate() -> None:
    """maxUnavailable needs the pods' controller's scale; instances have none (0 evictions allowed)."""
    found = objects(fleet(rollout={"maxUnavailable": 1}))
    prefill = found[("PodDisruptionBudget", "hs-prefill")]["spec"]
    decode = found[("PodDisruptionBudget", "hs-decode")]["spec"]
    assert "maxUnavailable" not in prefill and "maxUnavailable" not in decode
    assert prefill["minAvailable"] == 2  # 3 instances, one may go
    assert decode["minAvailable"] == 2  # 2 instances of 2 pods, one instance may go
    assert prefill["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_a_single_instance_role_may_be_evicted_for_maintenance() -> None:
    found = objects(fleet(prefill={"replicas": 1, "layout": {"tp": 8}}))
    assert found[("PodDisruptionBudget", "hs-prefill")]["spec"]["minAvailable"] == 0


def test_a_rollout_that_keeps_every_instance_up_still_lets_a_node_drain() -> None:
    found = objects(fleet(rollout={"maxUnavailable": 0, "maxSurge": 1}))
    assert found[("PodDisruptionBudget", "hs-prefill")]["spec"]["minAvailable"] == 2  # 3 instances, one may go


def test_the_engine_policy_admits_only_the_fleet_its_router_and_the_operator() -> None:
    policy = objects(fleet(), EngineAccess(operator_namespace="hybridserving-system"))[
        ("NetworkPolicy", "hs-engines")]["spec"]
    assert policy["podSelector"] == {"matchLabels": {LABEL_NAME: "hs", LABEL_COMPONENT: "engine"}}
    assert policy["policyTypes"] == ["Ingress"]
    rules = policy["ingress"]
    peers = [(rule["from"], [p["port"] for p in rule.get("ports", [])]) for rule in rules]
    assert peers == [
        ([{"podSelector": {"matchLabels": {LABEL_NAME: "hs", LABEL_COMPONENT: "engine"}}}], []),
        ([{"podSelector": {"matchLabels": {LABEL_NAME: "hs", LABEL_COMPONENT: "router"}}}], ["http", "bootstrap"]),
        ([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "hybridserving-system"}},
           "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "hybridserving",
                                           "app.kubernetes.io/component": "operator"}}}], ["http", "launcher"]),
    ]
    # Every peer is selected by pod labels within a namespace: nothing admits "any pod anywhere".
    for peer_list, _ in peers:
        for peer in peer_list:
            assert peer.get("podSelector", {}).get("matchLabels")
            assert "ipBlock" not in peer


def test_named_ports_of_the_policy_exist_on_every_engine_pod() -> None:
    hs = fleet(network={"hostNetwork": True})
    desired = planner.plan(hs, Observed())
    policy = desired.objects[("NetworkPolicy", "hs-engines")]["spec"]
    names = {p["port"] for rule in policy["ingress"] for p in rule.get("ports", [])}
    inst = next(iter(desired.instances.values()))
    pod_spec = rendering.pod_spec(hs, inst.name, 0, inst.role, inst.ports)
    assert names <= {p["name"] for p in pod_spec["containers"][0]["ports"]}


def test_engine_pods_are_restricted_unless_a_privilege_was_granted() -> None:
    hs = fleet()
    inst = next(iter(planner.plan(hs, Observed()).instances.values()))
    pod = rendering.pod_spec(hs, inst.name, 0, inst.role, inst.ports)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]["securityContext"]
    assert container == {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}
    rdma = fleet(transfer={"rdmaResourceCount": 1, "rdmaResourceName": "rdma/hca"})
    pod = rendering.pod_spec(rdma, inst.name, 0, inst.role, inst.ports)
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert "runAsNonRoot" not in pod["securityContext"], "a capability is not effective for a non-root user"


def test_the_router_is_restricted_and_its_token_only_lists_and_watches_pods() -> None:
    found = objects(fleet())
    template = found[("Deployment", ROUTER)]["spec"]["template"]["spec"]
    assert template["securityContext"]["runAsNonRoot"] is True
    assert template["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert found[("Role", "hs-router")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]


# --------------------------------------------------------------------------- drift


def converged(hs: HybridServing) -> Observed:
    """The fleet's non-pod objects, and its revision, as the apiserver would hold them after creation."""
    desired = planner.plan(hs, Observed())
    obs = Observed()
    revision = revisions.manifest(desired, 1)
    for key, obj in [*desired.objects.items(), ((revision["kind"], revision["metadata"]["name"]), revision)]:
        live = copy.deepcopy(obj)
        live["metadata"].update(uid=f"uid-{key[1]}", resourceVersion="7")
        obs.objects[key] = live
    return obs


def drift_actions(hs: HybridServing, obs: Observed) -> list[Action]:
    return [a for a in planner.diff(planner.plan(hs, obs), obs) if a.kind not in ("HybridServingInstance",)]


def test_a_converged_fleet_has_no_drift() -> None:
    hs = fleet()
    assert drift_actions(hs, converged(hs)) == []


@pytest.mark.parametrize("kind, name, path, value", [
    ("PodDisruptionBudget", "hs-prefill", ("spec", "selector", "matchLabels", "extra"), "x"),
    ("PodDisruptionBudget", "hs-prefill", ("spec", "selector", "matchExpressions"),
     [{"key": "a", "operator": "Exists"}]),
    ("Service", "hs-router", ("spec", "selector", "extra"), "x"),
    ("NetworkPolicy", "hs-engines", ("spec", "ingress", 0, "from", 0, "namespaceSelector"), {}),
    ("Deployment", ROUTER, ("spec", "template", "spec", "hostNetwork"), True),
    ("Deployment", ROUTER, ("spec", "template", "spec", "hostPID"), True),
    ("Deployment", ROUTER, ("spec", "template", "spec", "securityContext", "runAsUser"), 0),
    ("Deployment", ROUTER, ("spec", "template", "spec", "containers", 0, "securityContext", "privileged"),
     True),
    ("Deployment", ROUTER, ("spec", "template", "spec", "containers", 0, "securityContext", "capabilities",
                                 "add"), ["NET_ADMIN"]),
    ("Deployment", ROUTER, ("spec", "template", "spec", "volumes"), [{"name": "h", "hostPath": {"path": "/"}}]),
])
def test_additions_the_plan_does_not_set_are_drift_and_the_patch_removes_them(
    kind: str, name: str, path: tuple, value: Any,
) -> None:
    hs = fleet()
    obs = converged(hs)
    live = obs.objects[(kind, name)]
    node: Any = live
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    actions = drift_actions(hs, obs)
    assert [(a.verb, a.kind, a.name) for a in actions] == [("patch", kind, name)]
    repaired = copy.deepcopy(live)
    apply_merge_patch(repaired, actions[0].body)
    fresh = Observed(objects={**obs.objects, (kind, name): repaired})
    assert drift_actions(hs, fresh) == [], "one patch repairs the drift"
