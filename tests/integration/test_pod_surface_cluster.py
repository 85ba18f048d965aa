"""The pod surface and gang admission against the real apiserver and kube-scheduler.

A control plane of its own: four fake GPU nodes (two NVLink domains of two), all behind the
taint GPU node pools carry, so nothing lands there without the pod template's toleration.
The scheduler runs with the Workload API's gang scheduling (feature gates GenericWorkload
and GangScheduling), as the local control plane always does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from hybridserving.devcluster import FleetSpec
from support.cluster_fleet import GROUP, VERSION, Fleet, Operator
from support.crds import apply_crds

TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PROFILE = {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"}


@pytest.fixture(scope="module")
def gpu_pool(make_cluster, tmp_path_factory):
    """The cluster, its operator, and every node tainted like a GPU pool."""
    c = make_cluster(FleetSpec(nodes=4), prefix="itx")
    c.up(timeout=120)
    apply_crds(c)
    api = c.api_client()
    core = client.CoreV1Api(api)
    for node in core.list_node().items:
        core.patch_node(node.metadata.name, {"spec": {"taints": [TAINT]}})
    client.SchedulingV1Api(api).create_priority_class(
        {"metadata": {"name": "llm-serving"}, "value": 100000, "description": "serving fleets"})
    try:
        with Operator(c.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log") as op:
            yield c, api, op
    finally:
        api.close()


@pytest.fixture
def pool_fleet(gpu_pool, wait_for) -> Fleet:
    c, api, op = gpu_pool
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    fleet = Fleet(c, api, ns, wait_for, op)
    try:
        yield fleet
    finally:
        if fleet.name:
            c.kubectl("-n", ns, "delete", "hybridserving", fleet.name, "--wait=true", "--timeout=60s", check=False)
        core.delete_namespace(ns)
        wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout=60, what=f"pods of {ns} gone")


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    # Every node carries the GPU taint, so a router (which does not tolerate it) could never run
    # and the fleet would rightly stay RouterNotReady; these tests are about the engine pods.
    body: dict[str, Any] = {"model": PROFILE, "prefill": {"replicas": 1, "layout": {"tp": 8}},
                            "decode": {"replicas": 1, "layout": {"tp": 8}}, "router": {"enabled": False}, **spec}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HybridServing", "metadata": {"name": name}, "spec": body}


def scheduled(fleet: Fleet) -> dict[str, str | None]:
    return {n: p.spec.node_name for n, p in fleet.pods().items()}


def test_pods_reach_tainted_gpu_nodes_through_the_pod_template(pool_fleet: Fleet) -> None:
    fleet = pool_fleet
    fleet.apply(manifest("tainted"))
    fleet.wait_for(lambda: len(fleet.pods()) == 2, timeout=60, what="pods created")
    fleet.wait_for(lambda: all(p.status.conditions and any(
        c.type == "PodScheduled" and c.status == "False" and "untolerated taint" in (c.message or "")
        for c in p.status.conditions) for p in fleet.pods().values()), timeout=60, what="pods refused by the taint")
    assert set(scheduled(fleet).values()) == {None}
    fleet.wait_for(lambda: "untolerated taint" in fleet.condition("Degraded").get("message", ""), timeout=30,
                   what="the taint named in Degraded")

    def add_template(spec: dict[str, Any]) -> None:
        spec["podTemplate"] = {
            "metadata": {"labels": {"team": "inference"}},
            "spec": {"tolerations": [TOLERATION], "priorityClassName": "llm-serving",
                     "containers": [{"name": "engine", "resources": {"requests": {"cpu": "8", "memory": "64Gi"}}}]},
        }

    fleet.edit(add_template)
    fleet.wait_settled()
    pods = fleet.pods()
    assert len(pods) == 2 and all(p.spec.node_name for p in pods.values())
    for pod in pods.values():
        assert pod.metadata.labels["team"] == "inference"
        assert pod.spec.priority_class_name == "llm-serving" and pod.spec.priority > 0
        engine = pod.spec.containers[0]
        assert engine.resources.requests == {"nvidia.com/gpu": "8", "cpu": "8", "memory": "64Gi"}


def test_an_operator_owned_field_is_refused_naming_it_and_the_fleet_keeps_running(pool_fleet: Fleet) -> None:
    fleet = pool_fleet
    fleet.apply(manifest("owned", podTemplate={"spec": {"tolerations": [TOLERATION]}}))
    fleet.wait_settled()
    before = fleet.uids()
    # CEL refuses what it can see alone, at kubectl apply.
    bad = manifest("owned", podTemplate={"spec": {"tolerations": [TOLERATION], "hostNetwork": True}})
    bad["metadata"]["namespace"] = fleet.ns
    out = fleet.cluster.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert out.returncode != 0
    assert "spec.podTemplate.spec.hostNetwork" in out.stderr and "spec.network.hostNetwork" in out.stderr
    # The GPU count depends on another field (the GPU resource name): the operator refuses it.
    fleet.edit(lambda spec: spec["decode"].update(podTemplate={"spec": {"containers": [
        {"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}))
    fleet.wait_for(lambda: fleet.condition("LayoutValid").get("status") == "False", timeout=30, what="LayoutValid")
    message = fleet.condition("LayoutValid")["message"]
    assert "spec.decode.podTemplate.spec.containers[engine].resources.limits[nvidia.com/gpu]" in message
    assert "change the layout" in message
    assert fleet.uids() == before, "nothing running was touched"
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8" for p in fleet.pods().values())


def test_a_gang_that_does_not_fit_is_held_whole_until_it_fits(pool_fleet: Fleet) -> None:
    fleet = pool_fleet
    core = fleet.core
    # Three of the four nodes are busy; a 2-node instance fits only once a second node in the
    # free node's NVLink domain frees up.
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    free, partner = nodes[0], nodes[1]
    for node in nodes[1:]:
        core.create_namespaced_pod(fleet.ns, {
            "metadata": {"name": f"busy-{node}"},
            "spec": {"nodeName": node, "tolerations": [TOLERATION],
                     "containers": [{"name": "c", "image": "busy", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        })
    fleet.apply(manifest("gang", gang={"mode": "Workload"}, podTemplate={"spec": {"tolerations": [TOLERATION]}},
                         prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}},
                         decode={"replicas": 0, "layout": {"tp": 8}}))
    fleet.wait_for(lambda: len(fleet.pods()) == 2, timeout=60, what="gang pods created")
    workload = fleet.custom.get_namespaced_custom_object("scheduling.k8s.io", "v1alpha1", fleet.ns, "workloads",
                                                         "gang-0-n2")
    assert workload["spec"]["podGroups"] == [{"name": "engine", "policy": {"gang": {"minCount": 2}}}]
    # Held whole: for a while no pod of the gang is bound, although the leader alone would fit on `free`.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert set(scheduled(fleet).values()) == {None}, f"a gang pod was bound alone: {scheduled(fleet)}"
        time.sleep(1)
    assert (fleet.get().get("status") or {}).get("ready") != "True"
    core.delete_namespaced_pod(f"busy-{partner}", fleet.ns, grace_period_seconds=0)
    fleet.wait_for(lambda: sorted(filter(None, scheduled(fleet).values())) == [free, partner], timeout=90,
                   what="the whole gang bound once it fits")
    fleet.wait_settled()


def test_without_gang_admission_the_leader_binds_alone(pool_fleet: Fleet) -> None:
    """The control case: the same instance without a gang holds a node while its worker waits."""
    fleet = pool_fleet
    core = fleet.core
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    for node in nodes[1:]:
        core.create_namespaced_pod(fleet.ns, {
            "metadata": {"name": f"busy-{node}"},
            "spec": {"nodeName": node, "tolerations": [TOLERATION],
                     "containers": [{"name": "c", "image": "busy", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        })
    fleet.apply(manifest("nogang", podTemplate={"spec": {"tolerations": [TOLERATION]}},
                         prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}},
                         decode={"replicas": 0, "layout": {"tp": 8}}))
    fleet.wait_for(lambda: scheduled(fleet).get("nogang-0-0") == nodes[0], timeout=60,
                   what="the leader bound alone, holding its GPUs")
    assert scheduled(fleet).get("nogang-0-1") is None


def test_weights_from_a_read_only_many_claim_are_shared_by_every_pod(pool_fleet: Fleet) -> None:
    fleet = pool_fleet
    core = fleet.core
    pv = f"models-{fleet.ns}"
    core.create_persistent_volume({
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "2Ti"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/srv/models"},
                 "claimRef": {"namespace": fleet.ns, "name": "models"}},
    })
    try:
        core.create_namespaced_persistent_volume_claim(fleet.ns, {
            "metadata": {"name": "models"},
            "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "2Ti"}}},
        })
        fleet.wait_for(lambda: core.read_namespaced_persistent_volume_claim("models", fleet.ns).status.phase == "Bound",
                       timeout=60, what="claim bound by the controller-manager")
        fleet.apply(manifest("pvc", model={**PROFILE, "weights": {"uri": "pvc://models/deepseek-v3"}},
                             podTemplate={"spec": {"tolerations": [TOLERATION]}}))
        fleet.wait_settled()
        pods = fleet.pods()
        assert len(pods) == 2
        for pod in pods.values():
            (volume,) = [v for v in pod.spec.volumes if v.name == "weights"]
            assert volume.persistent_volume_claim.claim_name == "models" and volume.persistent_volume_claim.read_only
            (mount,) = [m for m in pod.spec.containers[0].volume_mounts if m.name == "weights"]
            assert (mount.mount_path, mount.sub_path, mount.read_only) == ("/models/weights", "deepseek-v3", True)
        config = core.read_namespaced_config_map("pvc-decode-config", fleet.ns).data["decode.json"]
        argv = json.loads(config)["argv"]
        assert argv[argv.index("--model-path") + 1] == "/models/weights"
        assert argv[argv.index("--served-model-name") + 1] == "deepseek-ai/DeepSeek-V3"
        # A claim that does not exist holds the pods, and the fleet says why.
        fleet.edit(lambda spec: spec["model"]["weights"].update(uri="pvc://missing/deepseek-v3"))
        fleet.wait_for(lambda: '"missing" not found' in fleet.condition("Degraded").get("message", ""),
                       timeout=60, what="the missing claim reported in Degraded")
    finally:
        core.delete_persistent_volume(pv)
