"""Fleets as the unit tests declare them, and driving the operator over the in-memory apiserver until
it settles: the reconcile over `MemoryApi`, the planner over `FakeCluster` with the fleet's
invariants checked after every single step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from hybridserving.api.v1alpha1 import HybridServing
from hybridserving.controller import reconcile as rec
from hybridserving.controller.kube import Kube
from hybridserving.contract import LABEL_ROLE
from hybridserving.core import naming, pairing
from hybridserving.core.naming import LABEL_INSTANCE, LABEL_LEADER
from support.apiserver import NS, FakeCluster, MemoryApi

# The operator's key in the unit tests (tests/unit/conftest.py makes it the default).
OPERATOR_KEY = b"unit-test-operator-key-0123456789abcdef"

SPEC: dict[str, Any] = {
    "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
    "prefill": {"replicas": 2, "layout": {"tp": 8}},
    "decode": {"replicas": 2, "layout": {"tp": 8}},
}


def settle(api: MemoryApi, passes: int = 10) -> rec.Outcome:
    """Reconcile, letting pods run, until two passes in a row ask for nothing (a router turns
    ready a pass after its pair, and the planner may wait on that without writing)."""
    quiet = 0
    for _ in range(passes):
        outcome = rec.reconcile(cast(Kube, api), NS, "fleet")  # MemoryApi has Kube's methods
        api.run_pods()
        quiet = 0 if outcome.actions else quiet + 1
        if quiet == 2:
            return outcome
    raise AssertionError(f"not settled: {[str(a) for a in outcome.actions]}")


def fleet(**spec: Any) -> HybridServing:
    body: dict[str, Any] = {
        "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
        "prefill": {"replicas": 3, "layout": {"tp": 8}},
        "decode": {"replicas": 3, "layout": {"tp": 8}},
    }
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return HybridServing.model_validate(
        {"metadata": {"name": "hs", "namespace": "ns", "uid": "hs-uid", "generation": 1}, "spec": body}
    )


def check_invariants(cluster: FakeCluster, hs: HybridServing) -> None:
    """What must hold after every step, whatever the scenario."""
    pods = cluster.pods()
    by_node: dict[str, list[int]] = {}
    for pod in pods.values():
        node = pod["spec"].get("nodeName")
        if node:
            for p in pod["spec"]["containers"][0]["ports"]:
                if "hostPort" in p:
                    by_node.setdefault(node, []).append(p["hostPort"])
    for node, host_ports in by_node.items():
        assert len(host_ports) == len(set(host_ports)), f"host ports collide on {node}: {sorted(host_ports)}"
    instances = cluster.instances()
    for name, inst in instances.items():
        assert name == f"hs-{inst['spec']['index']}", "instance names follow their index"
        gang = [p for p in pods.values() if p["metadata"]["labels"][LABEL_INSTANCE] == name]
        assert len(gang) <= inst["spec"]["nodes"] + 0, f"{name} has {len(gang)} pods"
        domains = {cluster.nodes[p["spec"]["nodeName"]]["domain"] for p in gang if p["spec"].get("nodeName")}
        assert len(domains) <= 1, f"{name} spans NVLink domains {domains}"
        for p in gang:
            labels = p["metadata"]["labels"]
            if labels[LABEL_LEADER] == "false":
                assert LABEL_ROLE not in labels, "workers are never router workers"
    blocks = [tuple(sorted(i["spec"]["ports"].values())) for i in instances.values()]
    if hs.spec.network.host_network:
        assert len(blocks) == len(set(blocks)), "each instance of a host-network fleet owns its port block"


def converge(cluster: FakeCluster, hs: HybridServing, steps: int = 60,
             check: Callable[[FakeCluster], None] | None = None) -> int:
    """Reconcile and advance until two passes in a row write nothing and everything is ready (a
    router turns ready a step after its pair, and the planner may wait on that without writing)."""
    quiet = 0
    for step in range(steps):
        settled = not any(cluster.unavailable(hs).values())
        actions = cluster.reconcile(hs)
        check_invariants(cluster, hs)
        if check:
            check(cluster)
        cluster.advance()
        check_invariants(cluster, hs)
        if check:
            check(cluster)
        quiet = quiet + 1 if not actions and settled else 0
        if quiet == 2:
            return step
    raise AssertionError(f"no convergence in {steps} steps; last actions: {[str(a) for a in actions]}")


def uids(cluster: FakeCluster) -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in cluster.pods().items()}


def router_deployment(hs: HybridServing) -> str:
    """The name of the router Deployment of the pairing key `hs`'s spec runs."""
    return naming.router_deployment_name(hs.metadata.name, pairing.pairing_key(hs.spec))
