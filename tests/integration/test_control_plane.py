"""The local control plane behaves like a real cluster for what the operator needs."""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import pathlib
import signal
import threading
import time
import uuid

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from hybridserving.devcluster import Cluster, FleetSpec, read_versions, stack
from hybridserving.devcluster.supervise import SETTLE_SECONDS
from hybridserving.devcluster.nodes import (
    GPU_RESOURCE,
    KWOK_SELECTOR,
    LABEL_GPU_CLIQUE,
    LABEL_NVLINK_DOMAIN,
    LABEL_RACK,
    LABEL_RDMA_FABRIC,
    LABEL_ZONE,
    RDMA_RESOURCE,
)
from support.crds import apply_crds
from support.polling import wait_for

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
FAKE_IMAGE = "registry.invalid/hybridserving/fake:0"
REPO = pathlib.Path(__file__).resolve().parents[2]


def gpu_container(name: str, gpus: int) -> dict:
    resources = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {}}
    if gpus:
        resources["limits"][GPU_RESOURCE] = str(gpus)
    return {"name": name, "image": FAKE_IMAGE, "resources": resources}


def pods_ready(core_v1, namespace: str, selector: str, count: int):
    pods = core_v1.list_namespaced_pod(namespace, label_selector=selector).items
    ready = [
        p for p in pods
        if p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        and p.status.pod_ip
    ]
    return ready if len(ready) == count and len(pods) == count else None


def test_server_version_matches_pin(api_client):
    info = client.VersionApi(api_client).get_code()
    assert info.git_version == read_versions()["K8S_VERSION"]


def test_gpu_nodes_have_capacity_and_topology(core_v1, cluster: Cluster):
    nodes = core_v1.list_node(label_selector=KWOK_SELECTOR).items
    fleet = cluster.fleet
    assert len(nodes) == fleet.nodes
    domains: dict[str, list[str]] = collections.defaultdict(list)
    racks: dict[str, list[str]] = collections.defaultdict(list)
    for node in nodes:
        labels = node.metadata.labels
        for key in (LABEL_ZONE, LABEL_RACK, LABEL_NVLINK_DOMAIN, LABEL_GPU_CLIQUE, LABEL_RDMA_FABRIC):
            assert labels.get(key), f"{node.metadata.name} lacks {key}"
        assert node.status.allocatable[GPU_RESOURCE] == str(fleet.gpus_per_node)
        assert node.status.capacity[GPU_RESOURCE] == str(fleet.gpus_per_node)
        assert node.status.allocatable[RDMA_RESOURCE] == str(fleet.rdma_per_node)
        assert node.status.allocatable["cpu"] == fleet.cpu
        assert node.status.allocatable["pods"] == str(fleet.pods)
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        assert not node.spec.taints, f"{node.metadata.name} still tainted: {node.spec.taints}"
        domains[labels[LABEL_NVLINK_DOMAIN]].append(node.metadata.name)
        racks[labels[LABEL_RACK]].append(node.metadata.name)
    assert all(len(v) == fleet.nodes_per_nvlink_domain for v in domains.values()), domains
    assert all(len(v) == fleet.nodes_per_rack for v in racks.values()), racks
    assert len({n.metadata.labels[LABEL_RDMA_FABRIC] for n in nodes}) == 1


def test_deployment_and_statefulset_run_with_gpus(core_v1, apps_v1, namespace, wait_for):
    apps_v1.create_namespaced_deployment(namespace, {
        "metadata": {"name": "dep"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "dep"}},
            "template": {
                "metadata": {"labels": {"app": "dep"}},
                "spec": {"containers": [gpu_container("main", 4)]},
            },
        },
    })
    core_v1.create_namespaced_service(namespace, {
        "metadata": {"name": "sts"},
        "spec": {"clusterIP": "None", "selector": {"app": "sts"}, "ports": [{"port": 80}]},
    })
    apps_v1.create_namespaced_stateful_set(namespace, {
        "metadata": {"name": "sts"},
        "spec": {
            "replicas": 2,
            "serviceName": "sts",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "sts"}},
            "template": {
                "metadata": {"labels": {"app": "sts"}},
                "spec": {"containers": [gpu_container("main", 8)]},
            },
        },
    })
    dep_pods = wait_for(lambda: pods_ready(core_v1, namespace, "app=dep", 2), 90, what="deployment pods Ready")
    sts_pods = wait_for(lambda: pods_ready(core_v1, namespace, "app=sts", 2), 90, what="statefulset pods Ready")
    wait_for(lambda: apps_v1.read_namespaced_deployment(namespace=namespace, name="dep").status.ready_replicas == 2,
             60, what="deployment status")
    wait_for(lambda: apps_v1.read_namespaced_stateful_set(namespace=namespace, name="sts").status.ready_replicas == 2,
             60, what="statefulset status")

    assert sorted(p.metadata.name for p in sts_pods) == ["sts-0", "sts-1"]
    gpus_per_node: dict[str, int] = collections.Counter()
    for pod in dep_pods + sts_pods:
        assert pod.spec.node_name, pod.metadata.name
        assert ipaddress.ip_address(pod.status.pod_ip) in LOOPBACK, pod.status.pod_ip
        gpus_per_node[pod.spec.node_name] += int(pod.spec.containers[0].resources.limits[GPU_RESOURCE])
    # a full-node (8 GPU) pod never shares its node with another GPU pod
    assert all(v <= 8 for v in gpus_per_node.values()), gpus_per_node
    sts_nodes = {p.spec.node_name for p in sts_pods}
    assert len(sts_nodes) == 2
    assert not sts_nodes & {p.spec.node_name for p in dep_pods}


def test_pod_asking_16_gpus_stays_pending(core_v1, namespace, wait_for):
    core_v1.create_namespaced_pod(namespace, {
        "metadata": {"name": "too-big"},
        "spec": {"containers": [gpu_container("main", 16)]},
    })

    def unschedulable():
        pod = core_v1.read_namespaced_pod("too-big", namespace)
        conds = [c for c in (pod.status.conditions or []) if c.type == "PodScheduled"]
        return bool(conds) and conds[0].status == "False" and conds[0].reason == "Unschedulable" and pod

    pod = wait_for(unschedulable, 60, what="PodScheduled=False/Unschedulable")
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name
    assert "nvidia.com/gpu" in pod.status.conditions[0].message or "Insufficient" in pod.status.conditions[0].message


def test_garbage_collection_of_children(core_v1, apps_v1, namespace, wait_for):
    owner = core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core_v1.create_namespaced_config_map(namespace, {
        "metadata": {
            "name": "child",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid,
            }],
        },
    })
    apps_v1.create_namespaced_deployment(namespace, {
        "metadata": {"name": "gc"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "gc"}},
            "template": {"metadata": {"labels": {"app": "gc"}},
                         "spec": {"containers": [gpu_container("main", 0)]}},
        },
    })
    wait_for(lambda: pods_ready(core_v1, namespace, "app=gc", 1), 60, what="gc pod Ready")

    core_v1.delete_namespaced_config_map("owner", namespace)
    apps_v1.delete_namespaced_deployment("gc", namespace, propagation_policy="Background")

    def gone(read):
        try:
            read()
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(lambda: gone(lambda: core_v1.read_namespaced_config_map("child", namespace)), 60,
             what="child ConfigMap garbage-collected")
    wait_for(lambda: not apps_v1.list_namespaced_replica_set(namespace, label_selector="app=gc").items, 60,
             what="ReplicaSet garbage-collected")
    wait_for(lambda: not core_v1.list_namespaced_pod(namespace, label_selector="app=gc").items, 60,
             what="pod garbage-collected")


def test_namespace_deletion_completes(core_v1, wait_for):
    name = f"del-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name}})
    core_v1.create_namespaced_config_map(name, {"metadata": {"name": "cm"}})
    core_v1.create_namespaced_pod(name, {"metadata": {"name": "p"}, "spec": {"containers": [gpu_container("m", 1)]}})
    wait_for(lambda: core_v1.read_namespaced_pod("p", name).status.phase == "Running", 60, what="pod Running")
    core_v1.delete_namespace(name)

    def deleted():
        try:
            core_v1.read_namespace(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(deleted, 90, what=f"namespace {name} removed")


HOLD_SECONDS = 10.0  # how long the pod runner keeps a deleted engine pod: SIGTERM, drain, exit


def hold_until_stopped(core_v1, namespace: str, pod: str, finalizer: str) -> None:
    """The pod runner's part: the deleted pod's finalizer goes once its process has stopped."""
    while not core_v1.read_namespaced_pod(pod, namespace).metadata.deletion_timestamp:
        time.sleep(0.2)
    time.sleep(HOLD_SECONDS)
    core_v1.patch_namespaced_pod(pod, namespace, {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}})


def test_a_namespace_deleted_with_its_fleet_goes_soon_after_the_fleets_pods(cluster: Cluster, core_v1):
    # The namespace controller deletes pods first and, while one is left, looks again only after
    # half the longest grace period among them: 301 s for this pod, whose grace is an engine's
    # under the default drain (600 s + 30 s). Its look 5 s after its first (its own status write)
    # finds the pod still held. Deleting the fleet first leaves it no pod to wait for.
    apply_crds(cluster)
    name = f"fleetdel-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name}})
    fleet = yaml.safe_load((REPO / "examples" / "role-switch.yaml").read_text())
    fleet["metadata"] = {"name": "fleet", "namespace": name}
    owner = json.loads(cluster.kubectl("apply", "-o", "json", "-f", "-", input=json.dumps(fleet)).stdout)
    core_v1.create_namespaced_config_map(name, {"metadata": {"name": "cm"}})
    finalizer = "hybridserving.io/pod-runner"
    core_v1.create_namespaced_pod(name, {
        "metadata": {"name": "engine", "finalizers": [finalizer], "ownerReferences": [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": "fleet",
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"terminationGracePeriodSeconds": 630, "containers": [gpu_container("m", 1)]},
    })
    wait_for(lambda: core_v1.read_namespaced_pod("engine", name).status.phase == "Running", 60, what="pod Running")
    runner = threading.Thread(target=hold_until_stopped, args=(core_v1, name, "engine", finalizer), daemon=True)
    runner.start()

    started = time.monotonic()
    stack.delete_namespace(cluster, name, timeout=120)
    assert name not in {ns.metadata.name for ns in core_v1.list_namespace().items}
    print(f"\n[namespace] {name} and its fleet gone {time.monotonic() - started:.0f} s after the delete")
    runner.join(5)


def test_kubectl_server_side_apply(kubectl, core_v1, namespace):
    def manifest(value: str) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ssa", "namespace": namespace},
            "data": {"key": value},
        })

    kubectl("apply", "--server-side", "--field-manager=hybridserving-test", "-f", "-", input=manifest("one"))
    kubectl("apply", "--server-side", "--field-manager=hybridserving-test", "-f", "-", input=manifest("two"))
    cm = core_v1.read_namespaced_config_map("ssa", namespace)
    assert cm.data == {"key": "two"}
    managers = {m.manager: m.operation for m in cm.metadata.managed_fields}
    assert managers.get("hybridserving-test") == "Apply"
    # a different manager touching the same field conflicts unless forced
    other = kubectl("apply", "--server-side", "--field-manager=other", "-f", "-",
                    input=manifest("three"), check=False)
    assert other.returncode != 0 and "conflict" in other.stderr.lower()
    kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-",
            input=manifest("three"))
    assert core_v1.read_namespaced_config_map("ssa", namespace).data == {"key": "three"}


def test_crd_with_cel_validation(api_client, namespace, wait_for):
    ext = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    group, plural = f"t{uuid.uuid4().hex[:6]}.test.hybridserving.io", "widgets"
    crd_name = f"{plural}.{group}"
    ext.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["minReplicas", "maxReplicas"],
                        "properties": {
                            "minReplicas": {"type": "integer", "minimum": 0},
                            "maxReplicas": {"type": "integer", "minimum": 0},
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.minReplicas <= self.maxReplicas",
                            "message": "minReplicas must not exceed maxReplicas",
                        }],
                    }},
                }},
            }],
        },
    })
    try:
        def established():
            crd = ext.read_custom_resource_definition(crd_name)
            return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

        wait_for(established, 30, what="CRD Established")

        def widget(name, lo, hi):
            return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name},
                    "spec": {"minReplicas": lo, "maxReplicas": hi}}

        # discovery may lag Established for a moment
        wait_for(lambda: custom.create_namespaced_custom_object(group, "v1", namespace, plural, widget("good", 1, 3)),
                 30, what="good Widget accepted")
        with pytest.raises(ApiException) as err:
            custom.create_namespaced_custom_object(group, "v1", namespace, plural, widget("bad", 5, 2))
        assert err.value.status == 422
        assert "minReplicas must not exceed maxReplicas" in err.value.body
    finally:
        ext.delete_custom_resource_definition(crd_name)


@pytest.mark.multicluster
def test_two_clusters_side_by_side(cluster: Cluster, core_v1, make_cluster):
    second = make_cluster(FleetSpec(nodes=1, gpus_per_node=2, nodes_per_rack=1, nodes_per_nvlink_domain=1))
    try:
        second.up()
        assert second.server != cluster.server
        assert second.state()["ports"]["etcd_client"] != cluster.state()["ports"]["etcd_client"]
        api2 = second.api_client()
        try:
            core2 = client.CoreV1Api(api2)
            nodes2 = core2.list_node(label_selector=KWOK_SELECTOR).items
            assert [n.status.allocatable[GPU_RESOURCE] for n in nodes2] == ["2"]
            marker = f"only-in-second-{uuid.uuid4().hex[:6]}"
            core2.create_namespaced_config_map("default", {"metadata": {"name": marker}})
            with pytest.raises(ApiException) as err:
                core_v1.read_namespaced_config_map(marker, "default")
            assert err.value.status == 404
        finally:
            api2.close()
    finally:
        second.down()
    assert not second.dir.exists()
    assert cluster.is_running(), cluster.crash_report()
    assert len(core_v1.list_node(label_selector=KWOK_SELECTOR).items) == cluster.fleet.nodes


def test_a_cluster_for_the_pod_runner_leaves_a_probed_pod_unready_until_its_probe_says_so(make_cluster):
    # As a kubelet does: a pod with a readiness probe is not Ready before the probe ran (the pod
    # runner's, in the e2e tests and the demo); one without is Ready once it runs.
    probed = make_cluster(FleetSpec(nodes=1, gpus_per_node=2), prefix="probed", probed_readiness=True)
    try:
        probed.up()
        api = probed.api_client()
        try:
            core = client.CoreV1Api(api)
            probe = {"httpGet": {"path": "/ready", "port": 8080}}
            for name, container in (("plain", gpu_container("c", 0)),
                                     ("probed", {**gpu_container("c", 0), "readinessProbe": probe})):
                core.create_namespaced_pod("default", {"metadata": {"name": name, "labels": {"t": "probed"}},
                                                       "spec": {"containers": [container]}})

            def running() -> dict[str, client.V1Pod] | None:
                pods = {p.metadata.name: p
                        for p in core.list_namespaced_pod("default", label_selector="t=probed").items}
                return pods if len(pods) == 2 and all(p.status.phase == "Running" and p.status.pod_ip
                                                      for p in pods.values()) else None

            pods = wait_for(running, 60, "both pods running with an IP")
            ready = {n: {c.type: c.status for c in p.status.conditions} for n, p in pods.items()}
            assert ready["plain"]["Ready"] == "True" and ready["plain"]["ContainersReady"] == "True"
            assert ready["probed"]["Ready"] == "False" and ready["probed"]["ContainersReady"] == "False"
            assert [c.ready for c in pods["probed"].status.container_statuses] == [False]
        finally:
            api.close()
    finally:
        probed.down()



# What a kubelet restarts on a real control plane.
RESTARTED = ("kube-scheduler", "kube-controller-manager")


def component_process(c: Cluster, comp: str) -> int | None:
    """The component's own process, in the process group its supervisor leads."""
    group = c.pids()[comp]
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            program = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            if os.path.basename(program) == comp and os.getpgid(pid) == group:
                return pid
        except OSError:
            continue
    return None


def dep_replicas(apps, replicas: int) -> None:
    apps.patch_namespaced_deployment_scale("dep", "default", {"spec": {"replicas": replicas}})


@pytest.mark.multicluster
def test_the_scheduler_and_controller_manager_come_back_after_they_exit_and_after_an_apiserver_outage(
        make_cluster):
    # A real control plane's kubelet starts them again when they exit: on a corrupted cache (the
    # scheduler), on a lease they could not renew while the apiserver was away (both, with leader
    # election). Without that, every pod created afterwards stays Pending.
    # Its own cluster: the outage would stall every other test on the session's.
    c = make_cluster(FleetSpec(nodes=2, gpus_per_node=2), prefix="outage")
    try:
        c.up()
        up = time.monotonic()
        api = c.api_client()
        try:
            core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
            apps.create_namespaced_deployment("default", {
                "metadata": {"name": "dep"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "dep"}},
                    "template": {"metadata": {"labels": {"app": "dep"}},
                                 "spec": {"containers": [gpu_container("main", 1)]}},
                },
            })
            wait_for(lambda: pods_ready(core, "default", "app=dep", 1), 60, "the replica Ready")

            # Both exit on their own once they came up (sooner, the supervisor takes the command
            # line for one that does not start and reports it dead); SIGKILL releases no lease:
            # the next process waits out its duration.
            time.sleep(max(0.0, up + SETTLE_SECONDS - time.monotonic()))
            for comp in RESTARTED:
                pid = component_process(c, comp)
                assert pid is not None, comp
                os.kill(pid, signal.SIGKILL)
            dep_replicas(apps, 2)
            (before, _) = wait_for(lambda: pods_ready(core, "default", "app=dep", 2), 60,
                                   "a replica added after the scheduler and controller manager exited Ready")
            processes = {comp: component_process(c, comp) for comp in RESTARTED}

            # Longer than the leader election's renew deadline (10 s): both lose their leases.
            c.restart("kube-apiserver", down_seconds=25)

            core.delete_namespaced_pod(before.metadata.name, "default")
            dep_replicas(apps, 3)
            # As on a real control plane, the restarted scheduler lists once its informers' back-off
            # (up to 30 s) has passed, and both wait out the lease their predecessors held (15 s).
            after = wait_for(lambda: pods_ready(core, "default", "app=dep", 3), 90,
                             "a replacement and a new replica scheduled onto kwok nodes and Ready")
            assert before.metadata.name not in {p.metadata.name for p in after}
            nodes = {n.metadata.name for n in core.list_node(label_selector=KWOK_SELECTOR).items}
            assert {p.spec.node_name for p in after} <= nodes
            restarted = {comp: component_process(c, comp) for comp in RESTARTED}
            assert all(restarted[comp] not in (None, processes[comp]) for comp in RESTARTED), (processes, restarted)
        finally:
            api.close()
        assert c.is_running() and not c.crashed(), c.crash_report(c.crashed())
    finally:
        c.down()
