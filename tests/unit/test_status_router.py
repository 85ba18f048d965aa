"""A fleet whose router has no available replica cannot serve, and its status says so.

`core.router.health` decides from the router Deployments' own status; the reconcile over the
in-memory apiserver shows what the HybridServing then reports.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from hybridserving.controller import reconcile as rec
from hybridserving.core import router
from hybridserving.core.naming import LABEL_PAIRING
from hybridserving.core.router import RouterDeployment
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle

NOW = 1_000_000.0


def deployment(available: int, *, name: str = "fleet-router-k1", key: str = "k1", replicas: int = 1,
               down_since: float | None = NOW - 600, failure: str | None = None) -> RouterDeployment:
    return RouterDeployment(name=name, pairing_key=key, replicas=replicas, available=available,
                            unavailable_since=None if available else down_since, replica_failure=failure)


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def test_an_available_router_replica_serves_the_fleet() -> None:
    health = router.health([deployment(0, name="fleet-router-k0", key="k0"), deployment(1)], {"k1": 0.0}, NOW)
    assert health.available and health.trouble is None
    assert "fleet-router-k1 1/1" in health.message


def test_no_available_router_is_not_ready_at_once_and_degraded_past_the_grace() -> None:
    fresh = router.health([deployment(0, down_since=NOW - 60)], {"k1": 0.0}, NOW)
    assert not fresh.available and fresh.trouble is None
    assert "no router replica is available (fleet-router-k1 0/1)" in fresh.message
    lasting = router.health([deployment(0, down_since=NOW - 181)], {"k1": 0.0}, NOW)
    assert not lasting.available and lasting.trouble is not None
    assert "no available replica for 181s" in lasting.trouble


def test_the_grace_counts_from_when_a_pair_could_make_the_router_ready() -> None:
    # smg is unready until a prefill and a decode of its key serve: the engines loading for
    # twenty minutes is a start, and the router gets its grace once they serve.
    loading = router.health([deployment(0, down_since=NOW - 1200)], {}, NOW)
    assert not loading.available and loading.trouble is None
    just_paired = router.health([deployment(0, down_since=NOW - 1200)], {"k1": NOW - 20}, NOW)
    assert just_paired.trouble is None
    other_key = router.health([deployment(0, down_since=NOW - 1200)], {"k0": 0.0}, NOW)
    assert other_key.trouble is None, "a pair of another key is no worker of this router"
    assert router.health([deployment(0, down_since=NOW - 1200)], {"k1": NOW - 200}, NOW).trouble is not None


def test_the_fleet_is_down_from_when_its_last_router_went() -> None:
    routers = [deployment(0, name="fleet-router-k0", key="k0", down_since=NOW - 900),
               deployment(0, down_since=NOW - 30)]
    assert router.health(routers, {"k0": 0.0, "k1": 0.0}, NOW).trouble is None
    unknown = [deployment(0, down_since=None)]
    assert router.health(unknown, {"k1": 0.0}, NOW).trouble is None, "no time known: no outage claimed"


def test_a_deployment_that_cannot_create_its_pods_is_degraded_at_once() -> None:
    failing = deployment(0, down_since=NOW - 5, failure="FailedCreate: exceeded quota: compute")
    health = router.health([failing], {"k1": 0.0}, NOW)
    assert not health.available and health.trouble is not None
    assert "fleet-router-k1 cannot create pods (FailedCreate: exceeded quota: compute)" in health.trouble
    short = router.health([deployment(1, replicas=2, failure="FailedCreate: quota")], {"k1": 0.0}, NOW)
    assert short.available and short.trouble is not None


def test_a_router_deployment_is_read_from_its_own_status() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "fleet-router-k1", "labels": {LABEL_PAIRING: "k1"},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
             "lastTransitionTime": "2026-01-01T00:05:00Z"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "forbidden: quota"},
        ]},
    }
    read = RouterDeployment.from_manifest(obj)
    assert (read.pairing_key, read.replicas, read.available) == ("k1", 2, 0)
    assert read.unavailable_since == 1767225900.0 and read.replica_failure == "FailedCreate: forbidden: quota"
    new = RouterDeployment.from_manifest({**obj, "status": {}})
    assert new.unavailable_since == 1767225600.0 and new.replica_failure is None, "never available since created"
    up = {**obj, "status": {"availableReplicas": 2, "conditions": [
        {"type": "Available", "status": "True", "lastTransitionTime": "2026-01-01T00:05:00Z"}]}}
    assert RouterDeployment.from_manifest(up).unavailable_since is None


def routers(api: MemoryApi) -> list[dict[str, Any]]:
    return [o for (k, _), o in api.store.items() if k == "Deployment"]


def router_down(api: MemoryApi, since: float) -> None:
    """What the Deployment controller writes once no router pod is available."""
    for d in routers(api):
        d["status"] = {"replicas": 1, "readyReplicas": 0, "availableReplicas": 0, "unavailableReplicas": 1,
                       "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                                       "lastTransitionTime": stamp(since)}]}


def test_a_fleet_whose_router_has_no_available_replica_is_not_ready_then_degraded(api: MemoryApi) -> None:
    settle(api)
    assert api.condition("Ready")["status"] == "True"
    router_down(api, time.time())
    rec.reconcile(api, NS, "fleet")
    ready = api.condition("Ready")
    assert ready["status"] == "False" and ready["reason"] == "RouterNotReady"
    assert "no router replica is available" in ready["message"] and "decode 2/2 instances ready" in ready["message"]
    assert api.status()["ready"] == "False"
    assert api.condition("Degraded")["status"] == "False", "a router restarting has its grace"
    router_down(api, time.time() - 600)
    outcome = rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RouterUnavailable"
    assert "the router has had no available replica for" in degraded["message"]
    warnings = [o for (k, _), o in api.store.items() if k == "Event" and o["type"] == "Warning"]
    assert [w["reason"] for w in warnings] == ["RouterUnavailable"]
    assert outcome.requeue_after == 10.0, "a fleet that does not serve is looked at again"
    api.run_pods()  # the router's pods come back
    settle(api)
    assert api.condition("Ready")["reason"] == "AllInstancesReady"
    assert api.condition("Degraded")["status"] == "False"


def test_a_router_deployment_that_cannot_create_pods_makes_the_fleet_degraded(api: MemoryApi) -> None:
    settle(api)
    router_down(api, time.time())
    for d in routers(api):
        d["status"]["conditions"].append({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                          "message": 'pods "fleet-router-x" is forbidden: exceeded quota'})
    rec.reconcile(api, NS, "fleet")
    degraded = api.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RouterUnavailable"
    assert "exceeded quota" in degraded["message"]


def test_a_fleet_without_router_is_ready_on_its_instances() -> None:
    for router_spec in ({"enabled": False}, {"replicas": 0}):
        api = MemoryApi()
        spec = copy.deepcopy(SPEC)
        spec["router"] = router_spec
        api.user_apply(spec)
        settle(api)
        router_down(api, time.time() - 3600)
        rec.reconcile(api, NS, "fleet")
        ready = api.condition("Ready")
        assert ready["status"] == "True" and ready["reason"] == "AllInstancesReady", router_spec
        assert api.condition("Degraded")["status"] == "False"
