"""The operator against a real control plane: apiserver, etcd, controller-manager, scheduler, kwok.

The operator runs as its own process (`python -m hybridserving.controller`), exactly as in a
pod, so the kill tests can SIGKILL it anywhere. kwok plays the kubelets of 8 fake nodes with
8 GPUs each (NVLink domains of 2 nodes); the real scheduler places the pods, the real garbage
collector removes what a deleted HybridServing owned.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys
import time
from typing import Any, Callable

import pytest
import yaml

from hybridserving.api.crd import expected_digests
from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE
from hybridserving.devcluster import stack
from hybridserving.devcluster.cluster import bin_dir
from support.cluster_fleet import GROUP, VERSION, Fleet, Operator
from support.crds import apply_crds

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILL_ROUNDS = int(os.environ.get("HYBRIDSERVING_KILL_ROUNDS", "8"))


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())


@pytest.fixture(scope="module")
def crds(cluster) -> None:
    apply_crds(cluster)


@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory) -> Operator:
    with Operator(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


@pytest.fixture
def fleet(cluster, api_client, namespace, wait_for, operator) -> Fleet:
    return Fleet(cluster, api_client, namespace, wait_for, operator)


def node_labels(fleet: Fleet) -> dict[str, dict[str, str]]:
    return {n.metadata.name: n.metadata.labels for n in fleet.core.list_node().items}


# --------------------------------------------------------------------------- placement


def test_an_example_fleet_lands_on_the_right_gpu_nodes(fleet: Fleet) -> None:
    fleet.apply(example("glm-5.3"))
    fleet.wait_settled()
    pods = fleet.pods()
    instances = fleet.instances()
    assert sorted(i["spec"]["role"] for i in instances.values()) == ["decode", "decode", "prefill"]
    assert len(pods) == 3 and len({p.spec.node_name for p in pods.values()}) == 3, "8 GPUs each: a node apiece"
    for p in pods.values():
        limits = p.spec.containers[0].resources.limits
        assert limits["nvidia.com/gpu"] == "8" and limits["rdma/ib"] == "8"
        role = instances[p.metadata.labels["hybridserving.io/instance"]]["spec"]["role"]
        assert p.metadata.labels["hybridserving.io/role"] == role
        assert p.metadata.annotations["hybridserving.io/role"] == role
    status = fleet.get()["status"]
    assert status["prefill"]["summary"] == "1/1" and status["decode"]["summary"] == "2/2"
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Progressing", "Degraded", "LayoutValid",
                                                         "RoleSwitching"}
    assert status["capacity"]["decodeTokensPerInstance"] > 0
    for name in ("glm-53-prefill-config", "glm-53-decode-config"):
        assert fleet.core.read_namespaced_config_map(name, fleet.ns).data
    [router] = stack.router_deployments(fleet.cluster, fleet.ns, "glm-53")
    deployment = fleet.cluster.kubectl("get", "deployment", router, "-n", fleet.ns, "-o", "json").stdout
    args = json.loads(deployment)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-discovery" in args and "hybridserving.io/role=prefill" in args
    assert "--service-discovery-namespace" in args and fleet.ns in args


def test_multi_node_instances_stay_in_one_nvlink_domain_on_the_host_network(fleet: Fleet) -> None:
    fleet.apply(example("deepseek-v3"))
    fleet.wait_settled()
    labels = node_labels(fleet)
    pods = fleet.pods()
    assert len(pods) == 4
    for inst in fleet.instances():
        gang = [p for p in pods.values() if p.metadata.labels["hybridserving.io/instance"] == inst]
        nodes = {p.spec.node_name for p in gang}
        assert len(nodes) == 2
        assert len({labels[n]["hybridserving.io/nvlink-domain"] for n in nodes}) == 1
        assert all(p.spec.host_network for p in gang)
    fabrics = {labels[p.spec.node_name]["hybridserving.io/rdma-fabric"] for p in pods.values()}
    assert len(fabrics) == 1
    ports = [i["spec"]["ports"]["http"] for i in fleet.instances().values()]
    assert len(set(ports)) == len(ports)


def test_leaders_spread_across_racks_when_asked(fleet: Fleet) -> None:
    manifest = example("role-switch")
    manifest["spec"]["network"] = {"spreadAcrossRacks": True}
    fleet.apply(manifest)
    fleet.wait_settled()
    labels = node_labels(fleet)
    racks = [labels[p.spec.node_name]["hybridserving.io/rack"] for p in fleet.pods().values()]
    assert sorted(racks.count(r) for r in set(racks)) == [2, 2], racks


# --------------------------------------------------------------------------- changes


def test_scaling_up_and_down_keeps_names_and_other_pods(fleet: Fleet) -> None:
    fleet.apply(example("role-switch"))
    fleet.wait_settled()
    before = fleet.uids()
    fleet.edit(lambda s: s["decode"].update(replicas=3))
    fleet.wait_settled()
    assert sorted(fleet.instances()) == [f"dsv3-flex-{i}" for i in range(5)]
    assert {n: u for n, u in fleet.uids().items() if n in before} == before
    fleet.edit(lambda s: s["decode"].update(replicas=1))
    fleet.wait_settled()
    roles = [i["spec"]["role"] for i in fleet.instances().values()]
    assert roles.count("decode") == 1 and roles.count("prefill") == 2


def test_kubectl_scale_resizes_a_switching_fleet_through_the_scale_subresource(fleet: Fleet) -> None:
    """What HPA and KEDA drive: `/scale` reads and writes the fleet's total, and reports the
    selector of one engine pod per instance (its rank 0)."""
    fleet.apply(example("role-switch"))
    fleet.wait_settled()
    kubectl = fleet.cluster.kubectl
    raw = f"/apis/{GROUP}/{VERSION}/namespaces/{fleet.ns}/hybridservings/{fleet.name}/scale"
    kubectl("scale", f"hybridserving/{fleet.name}", "-n", fleet.ns, "--replicas=6")
    fleet.wait_settled()
    assert len(fleet.instances()) == 6
    scale = json.loads(kubectl("get", "--raw", raw).stdout)
    assert (scale["kind"], scale["spec"]["replicas"], scale["status"]["replicas"]) == ("Scale", 6, 6)
    selected = fleet.core.list_namespaced_pod(fleet.ns, label_selector=scale["status"]["selector"]).items
    assert sorted(p.metadata.name for p in selected) == sorted(f"{name}-0" for name in fleet.instances())

    kubectl("scale", f"hybridserving/{fleet.name}", "-n", fleet.ns, "--replicas=2")
    fleet.wait_settled()
    roles = sorted(i["spec"]["role"] for i in fleet.instances().values())
    assert roles == ["decode", "prefill"], "the total shrinks to each role's floor, no further"

    refused = kubectl("scale", f"hybridserving/{fleet.name}", "-n", fleet.ns, "--replicas=1", check=False)
    assert refused.returncode != 0 and "minPrefill + roleSwitch.minDecode" in refused.stderr
    assert json.loads(kubectl("get", "--raw", raw).stdout)["spec"]["replicas"] == 2


def test_a_fixed_split_fleet_refuses_a_total_naming_the_fix(fleet: Fleet) -> None:
    fleet.apply(fixed_split())
    fleet.wait_settled()
    refused = fleet.cluster.kubectl("scale", f"hybridserving/{fleet.name}", "-n", fleet.ns, "--replicas=6",
                                    check=False)
    assert refused.returncode != 0
    assert "needs roleSwitch.enabled: true" in refused.stderr and "prefill.replicas" in refused.stderr
    assert len(fleet.instances()) == 4 and "replicas" not in fleet.get()["spec"]


def test_a_layout_change_rolls_one_role_within_its_budget(fleet: Fleet) -> None:
    manifest = example("role-switch")
    manifest["spec"]["roleSwitch"]["enabled"] = False
    fleet.apply(manifest)
    fleet.wait_settled()
    before = fleet.uids()
    roles = {n: i["spec"]["role"] for n, i in fleet.instances().items()}
    fleet.edit(lambda s: s["decode"].update(maxRunningRequests=64))
    worst = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = fleet.pods()
        down = [n for n, p in pods.items() if p.metadata.deletion_timestamp or not _ready(p)]
        missing = [n for n in before if n not in pods]
        worst = max(worst, len(set(down) | set(missing)))
        assert not any(roles[n.rsplit("-", 1)[0]] == "prefill" for n in set(down) | set(missing))
        if fleet.settled():
            break
        time.sleep(0.2)
    fleet.wait_settled()
    assert worst <= 1, f"{worst} decode pods down at once with maxUnavailable 1"
    after = fleet.uids()
    for name, uid in before.items():
        assert (after[name] == uid) == (roles[name.rsplit("-", 1)[0]] == "prefill")


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@pytest.mark.parametrize("change", ["env", "image"])
def test_a_roll_takes_prefill_before_decode_unless_the_pairing_key_changes(fleet: Fleet, change: str) -> None:
    """An engine env change both sides can mix rolls prefill, then decode; a new engine image
    (another pairing key) alternates the roles so that a compatible pair always serves."""
    manifest = example("role-switch")
    manifest["spec"]["roleSwitch"]["enabled"] = False
    fleet.apply(manifest)
    fleet.wait_settled()
    if change == "env":
        fleet.edit(lambda s: s["engine"].setdefault("env", []).append({"name": "NCCL_DEBUG", "value": "WARN"}))
    else:
        fleet.edit(lambda s: s["engine"].update(image="lmsysorg/sglang:v0.5.23-post1"))
    fleet.wait_settled()
    pods = fleet.pods()
    if change == "env":
        assert all(("NCCL_DEBUG", "WARN") in {(e.name, e.value) for e in p.spec.containers[0].env or []}
                   for p in pods.values())
    else:
        assert {p.spec.containers[0].image for p in pods.values()} == {"lmsysorg/sglang:v0.5.23-post1"}
    roles = {n: i["spec"]["role"] for n, i in fleet.instances().items()}
    created = sorted(pods.items(), key=lambda kv: kv[1].metadata.creation_timestamp)
    order = [roles[n.rsplit("-", 1)[0]] for n, _ in created]
    if change == "env":
        assert order == ["prefill", "prefill", "decode", "decode"], order
    else:
        assert order == ["prefill", "decode", "prefill", "decode"], order


def test_a_deleted_worker_restarts_its_whole_gang(fleet: Fleet) -> None:
    fleet.apply(example("deepseek-v3"))
    fleet.wait_settled()
    before = fleet.uids()
    victim = sorted(n for n in before if n.endswith("-1"))[0]
    instance = victim.rsplit("-", 1)[0]
    fleet.core.delete_namespaced_pod(victim, fleet.ns)
    fleet.wait_for(lambda: fleet.instances()[instance]["spec"].get("restartGeneration") == 1, timeout=60,
                   what="gang restart recorded")
    fleet.wait_settled()
    after = fleet.uids()
    assert after[f"{instance}-0"] != before[f"{instance}-0"], "the leader restarted with its worker"
    assert all(after[n] == before[n] for n in before if not n.startswith(instance + "-"))
    events = fleet.core.list_namespaced_event(fleet.ns).items
    assert any(e.reason == "GangRestart" for e in events)


def test_a_hand_edit_of_an_instance_role_does_not_relabel_a_serving_engine(fleet: Fleet) -> None:
    """`kubectl patch hsi` on spec.role becomes an on-call switch (unroute first), never a bare relabel."""
    fleet.apply(example("role-switch"))
    fleet.wait_settled()
    before = fleet.uids()
    name = next(n for n, i in sorted(fleet.instances().items()) if i["spec"]["role"] == "decode")
    fleet.custom.patch_namespaced_custom_object(GROUP, VERSION, fleet.ns, "hybridservinginstances", name,
                                                {"spec": {"role": "prefill"}})
    adopted_at = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        leader = fleet.pods()[f"{name}-0"].metadata
        assert leader.annotations.get("hybridserving.io/role") == "decode", "the engine was told to switch undrained"
        assert leader.labels.get("hybridserving.io/role") in (None, "decode")
        switches = (fleet.get().get("status") or {}).get("switches") or []
        if any(s["instance"] == name and s["toRole"] == "prefill" and s["reason"].startswith("on-call")
               for s in switches):
            adopted_at = adopted_at or time.monotonic()
            # The switch's first step takes the leader out of the router before anything else.
            if leader.labels.get("hybridserving.io/role") is None and time.monotonic() - adopted_at > 3:
                break
        time.sleep(0.3)
    assert adopted_at is not None, f"no switch started; operator log:\n{fleet.op.tail()}"
    events = fleet.core.list_namespaced_event(fleet.ns).items
    assert any(e.reason == "RoleEditAdopted" for e in events)
    assert fleet.instances()[name]["spec"]["role"] == "decode", "the edit is undone until the switch gets there"
    assert fleet.uids() == before, "no pod recreated"


def test_an_invalid_update_is_reported_and_the_fleet_keeps_running(fleet: Fleet) -> None:
    fleet.apply(example("role-switch"))
    fleet.wait_settled()
    before = fleet.uids()
    # CEL cannot know the built-in profiles; the layout rules can.
    fleet.edit(lambda s: s["model"].update(profile="llama-9"))
    fleet.wait_for(lambda: fleet.condition("LayoutValid").get("status") == "False", timeout=60,
                   what="LayoutValid=False")
    cond = fleet.condition("LayoutValid")
    assert "spec.model.profile" in cond["message"]
    assert cond["observedGeneration"] == fleet.get()["metadata"]["generation"]
    time.sleep(3)
    assert fleet.uids() == before
    events = fleet.core.list_namespaced_event(fleet.ns).items
    assert any(e.reason == "LayoutInvalid" and e.type == "Warning" for e in events)
    fleet.edit(lambda s: s["model"].update(profile="deepseek-v3"))
    fleet.wait_for(lambda: fleet.condition("LayoutValid").get("status") == "True", timeout=60, what="valid again")
    fleet.wait_settled()
    assert fleet.uids() == before, "back to the same spec: nothing to roll"


def test_a_roll_to_pods_the_apiserver_refuses_is_held_and_every_instance_keeps_serving(fleet: Fleet) -> None:
    """Pod content the CRD and the layout rules let through and the apiserver refuses in a pod (a
    toleration operator it does not know): the rollout deletes a gang before it creates the next,
    so the operator creates the first new pod as a dry run and holds the roll."""
    manifest = example("role-switch")
    manifest["spec"]["roleSwitch"]["enabled"] = False
    fleet.apply(manifest)
    fleet.wait_settled()
    before = fleet.uids()
    toleration = {"key": "example.com/pool", "operator": "Equals", "value": "a", "effect": "NoSchedule"}
    fleet.edit(lambda s: s.update(podTemplate={"spec": {"tolerations": [toleration]}}))
    fleet.wait_for(lambda: fleet.condition("Degraded").get("reason") == "RolloutPodInvalid", timeout=60,
                   what="Degraded=RolloutPodInvalid")
    degraded = fleet.condition("Degraded")
    assert "not rolled: the apiserver refuses its new pods" in degraded["message"]
    assert "tolerations[0].operator" in degraded["message"], degraded["message"]
    time.sleep(3)
    assert fleet.uids() == before, "no gang was deleted"
    assert fleet.condition("Ready").get("status") == "True"
    fleet.edit(lambda s: s.update(podTemplate=None))  # a merge patch: null removes it
    fleet.wait_settled()
    assert fleet.uids() == before, "back to the running configuration: nothing to roll"
    assert fleet.condition("Degraded").get("status") == "False"


def test_deleting_a_fleet_removes_what_it_owns_and_nothing_else(fleet: Fleet) -> None:
    fleet.apply(example("role-switch"))
    fleet.wait_settled()
    stranger = {"metadata": {"name": "not-ours", "labels": {"hybridserving.io/name": fleet.name}}, "data": {"a": "b"}}
    fleet.core.create_namespaced_config_map(fleet.ns, stranger)
    fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, fleet.ns, "hybridservings", fleet.name)

    def gone() -> bool:
        left = [kind for kind in ("pods", "hybridservinginstances", "services", "configmaps", "deployments",
                                  "poddisruptionbudgets", "networkpolicies", "serviceaccounts", "roles", "rolebindings")
                if fleet.cluster.kubectl("get", kind, "-n", fleet.ns, "-l", f"hybridserving.io/name={fleet.name}",
                                         "-o", "name").stdout.strip() not in ("", "configmap/not-ours")]
        return not left

    fleet.wait_for(gone, timeout=90, what="children garbage-collected")
    assert fleet.core.read_namespaced_config_map("not-ours", fleet.ns).data == {"a": "b"}


# --------------------------------------------------------------------------- crashes


def test_an_operator_killed_at_random_points_converges_without_duplicates_or_orphans(fleet: Fleet) -> None:
    """Each round changes the spec, kills the operator after a random delay, restarts it."""
    rng = random.Random(int(os.environ.get("HYBRIDSERVING_KILL_SEED", "7")))
    manifest = example("deepseek-v3")
    manifest["spec"]["rollout"] = {"maxUnavailable": 1}
    fleet.apply(manifest)
    fleet.wait_settled()
    changes: list[Callable[[dict[str, Any]], None]] = [
        lambda s: s["decode"].update(replicas=s["decode"]["replicas"] % 2 + 1),
        lambda s: s["engine"].update(image=f"sglang:{rng.randint(0, 10**6)}"),
        lambda s: s["prefill"].update(maxRunningRequests=rng.randint(1, 512)),
    ]
    kills = []
    for _ in range(KILL_ROUNDS):
        fleet.edit(rng.choice(changes))
        delay = rng.uniform(0.0, 2.0)
        time.sleep(delay)
        fleet.op.kill()
        kills.append(round(delay, 2))
        if rng.random() < 0.5:  # sometimes a pod dies while the operator is down
            pods = sorted(fleet.pods())
            if pods:
                fleet.core.delete_namespaced_pod(rng.choice(pods), fleet.ns)
        fleet.op.start()
        fleet.wait_settled(timeout=180)
        instances = fleet.instances()
        pods = fleet.pods()
        uids = {i["metadata"]["uid"] for i in instances.values()}
        assert len(pods) == sum(i["spec"]["nodes"] for i in instances.values()), "no duplicate or missing pod"
        for p in pods.values():
            assert {r.uid for r in p.metadata.owner_references} <= uids, f"orphan pod {p.metadata.name}"
        indexes = [i["spec"]["index"] for i in instances.values()]
        assert len(indexes) == len(set(indexes))
        assert all(n == f"{fleet.name}-{i['spec']['index']}" for n, i in instances.items())
    print(f"\noperator killed {len(kills)} times (after {kills} s); converged every time")


# --------------------------------------------------------------------------- GitOps


def test_gitops_reapplying_changes_nothing_and_the_operator_never_owns_spec(fleet: Fleet, tmp_path) -> None:
    """What Argo CD and Flux rely on: a second apply is a no-op, `kubectl diff` is clean after the
    reconcile, the operator's field manager owns no spec field, and health reads standard conditions."""
    manifest = example("role-switch")
    manifest["metadata"]["namespace"] = fleet.ns
    fleet.name = manifest["metadata"]["name"]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(manifest))
    apply = ("apply", "--server-side", "--field-manager=gitops", "-f", str(path))
    fleet.cluster.kubectl(*apply)
    fleet.wait_settled()
    before = fleet.get()

    out = fleet.cluster.kubectl(*apply).stdout
    after = fleet.get()
    assert "serverside-applied" in out
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]

    diff = fleet.cluster.kubectl("diff", "--server-side", "--field-manager=gitops", "-f", str(path), check=False)
    assert diff.returncode == 0, f"kubectl diff is not clean:\n{diff.stdout}{diff.stderr}"

    managers = {m["manager"]: m for m in after["metadata"]["managedFields"]}
    assert "gitops" in managers
    for entry in after["metadata"]["managedFields"]:
        if entry["manager"] == "hybridserving-operator":
            assert "f:spec" not in (entry.get("fieldsV1") or {}), entry
    conditions = {c["type"]: c for c in after["status"]["conditions"]}
    assert {"Ready", "Progressing", "Degraded", "LayoutValid", "RoleSwitching"} <= set(conditions)
    for c in conditions.values():
        assert c["observedGeneration"] == after["metadata"]["generation"] and c["lastTransitionTime"]


# --------------------------------------------------------------------------- faults and drift
# Ordinary operations and small faults: node drains through the disruption budgets, names another
# object holds, drift the plan does not set, names too long for the fleet's children. Each
# reports itself in status and none stalls the fleet.


def fixed_split(switching: bool = False) -> dict:
    m = example("role-switch")
    m["spec"]["roleSwitch"]["enabled"] = switching
    return m


def test_a_node_holding_engines_drains_through_the_budgets(fleet: Fleet) -> None:
    fleet.apply(fixed_split())
    fleet.wait_settled()
    def allowed() -> int | None:
        pdb = fleet.cluster.kubectl("get", "pdb", f"{fleet.name}-decode", "-n", fleet.ns, "-o", "json").stdout
        return (json.loads(pdb).get("status") or {}).get("disruptionsAllowed")

    # The disruption controller can evaluate the budget (with maxUnavailable it allowed 0).
    fleet.wait_for(lambda: allowed() == 1, timeout=60, what="one decode instance may be evicted")
    node = sorted(p.spec.node_name for p in fleet.pods().values())[0]
    victims = {n for n, p in fleet.pods().items() if p.spec.node_name == node}
    try:
        drained = fleet.cluster.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
                                        "--timeout=120s", check=False, timeout=150)
        assert drained.returncode == 0, drained.stderr[-2000:]
        fleet.wait_settled(timeout=120)
        pods = fleet.pods()
        assert not any(p.spec.node_name == node for p in pods.values())
        assert victims <= set(pods), "the evicted pods were replaced under the same names"
    finally:
        fleet.cluster.kubectl("uncordon", node, check=False)


def test_a_name_held_by_another_object_is_reported_and_the_rest_is_built(fleet: Fleet) -> None:
    m = fixed_split()
    squatter = {"metadata": {"name": f"{m['metadata']['name']}-prefill-config"}, "data": {"a": "b"}}
    fleet.core.create_namespaced_config_map(fleet.ns, squatter)
    fleet.apply(m)
    fleet.wait_for(lambda: fleet.condition("Degraded").get("reason") == "NameTaken", timeout=60,
                   what="Degraded=NameTaken")
    degraded = fleet.condition("Degraded")
    assert degraded["status"] == "True" and f"ConfigMap/{fleet.name}-prefill-config" in degraded["message"]
    assert len(fleet.instances()) == 4, "the rest of the fleet is built"
    assert fleet.core.read_namespaced_config_map(squatter["metadata"]["name"], fleet.ns).data == {"a": "b"}
    fleet.core.delete_namespaced_config_map(squatter["metadata"]["name"], fleet.ns)
    fleet.wait_settled(timeout=400)  # the next pass comes after the backoff
    assert fleet.condition("Degraded")["status"] == "False"


def test_selector_keys_and_router_privileges_the_plan_does_not_set_are_removed(fleet: Fleet) -> None:
    fleet.apply(fixed_split())
    fleet.wait_settled()
    name, ns = fleet.name, fleet.ns
    policy = json.loads(fleet.cluster.kubectl("get", "networkpolicy", f"{name}-engines", "-n", ns, "-o",
                                              "json").stdout)
    assert policy["spec"]["podSelector"]["matchLabels"]["hybridserving.io/component"] == "engine"
    kubectl = fleet.cluster.kubectl
    [router] = stack.router_deployments(fleet.cluster, ns, name)
    kubectl("patch", "service", f"{name}-router", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"selector": {"extra": "x"}}}))
    kubectl("patch", "pdb", f"{name}-prefill", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"selector": {"matchLabels": {"extra": "x"}}}}))
    kubectl("patch", "networkpolicy", f"{name}-engines", "-n", ns, "--type=json", "-p",
            json.dumps([{"op": "add", "path": "/spec/ingress/-", "value": {}}]))
    kubectl("patch", "deployment", router, "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"template": {"spec": {"hostNetwork": True}}}}))

    def repaired() -> bool:
        svc = json.loads(kubectl("get", "service", f"{name}-router", "-n", ns, "-o", "json").stdout)
        pdb = json.loads(kubectl("get", "pdb", f"{name}-prefill", "-n", ns, "-o", "json").stdout)
        pol = json.loads(kubectl("get", "networkpolicy", f"{name}-engines", "-n", ns, "-o", "json").stdout)
        dep = json.loads(kubectl("get", "deployment", router, "-n", ns, "-o", "json").stdout)
        return ("extra" not in svc["spec"]["selector"] and "extra" not in pdb["spec"]["selector"]["matchLabels"]
                and len(pol["spec"]["ingress"]) == len(policy["spec"]["ingress"])
                and not dep["spec"]["template"]["spec"].get("hostNetwork"))

    fleet.wait_for(repaired, timeout=60, what="drift repaired")

    def versions() -> dict[str, str]:
        """Spec writes: generation where the kind has one (status writes by controllers leave it)."""
        out = {}
        for kind, obj in (("service", f"{name}-router"), ("pdb", f"{name}-prefill"),
                          ("networkpolicy", f"{name}-engines"), ("deployment", router)):
            meta = json.loads(kubectl("get", kind, obj, "-n", ns, "-o", "json").stdout)["metadata"]
            out[kind] = str(meta.get("generation") or meta["resourceVersion"])
        return out

    settled = versions()
    time.sleep(20)  # longer than a resync: an exact field the apiserver defaults would be patched again
    assert repaired(), "repaired for good"
    assert versions() == settled, "the repaired objects are not written again and again"


# --------------------------------------------------------------------------- canary, revisions, rollback


def _cli(fleet: Fleet, *args: str, namespaced: bool = True) -> str:
    done = subprocess.run([sys.executable, "-m", "hybridserving.cli", *args, *(["-n", fleet.ns] if namespaced else []),
                           "--kubeconfig", str(fleet.cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _images(fleet: Fleet) -> dict[str, str]:
    """The image each instance runs, read from its leader pod."""
    return {n.rsplit("-", 1)[0]: p.spec.containers[0].image for n, p in fleet.pods().items() if n.endswith("-0")}


def _revisions(fleet: Fleet) -> dict[str, int]:
    items = fleet.custom.list_namespaced_custom_object(
        "apps", "v1", fleet.ns, "controllerrevisions", label_selector=f"hybridserving.io/name={fleet.name}")["items"]
    return {r["metadata"]["name"]: r["revision"] for r in items}


# A newer operator version, played by this one rendering one more env var into every engine pod
# and one more flag into the router's.
NEWER_VERSION = """
import sys
from hybridserving import cli
from hybridserving.core import rendering, router
router.WORKER_FLAGS = (*router.WORKER_FLAGS, "--retry-max-retries", "7")
older = rendering.pod_spec
def newer(*args, **kwargs):
    pod = older(*args, **kwargs)
    pod["containers"][0].setdefault("env", []).append({"name": "HYBRIDSERVING_NEWER", "value": "1"})
    return pod
rendering.pod_spec = newer
older_metadata = rendering.pod_extra_metadata
def newer_metadata(*args):
    labels, annotations = older_metadata(*args)
    return labels, {**annotations, "example.com/newer": "1"}
rendering.pod_extra_metadata = newer_metadata
sys.exit(cli.main(sys.argv[1:]))
"""


# In a pod: the service account's token and CA where the kubelet would mount them; the rest is the
# real client finding the apiserver from the pod's environment.
IN_A_POD = """
import sys
from kubernetes.config import incluster_config
incluster_config.SERVICE_TOKEN_FILENAME, incluster_config.SERVICE_CERT_FILENAME = sys.argv[1:3]
from hybridserving import cli
from hybridserving.commands import cluster
cluster.SERVICE_ACCOUNT_NAMESPACE = sys.argv[3]
sys.exit(cli.main(sys.argv[4:]))
"""


def _upgrade_check(fleet: Fleet, *args: str, newer: bool = False, code: int = 0) -> dict[str, Any]:
    run = ["-c", NEWER_VERSION] if newer else ["-m", "hybridserving.cli"]
    done = subprocess.run([sys.executable, *run, "upgrade-check", fleet.name, "-n", fleet.ns, "-o", "json",
                           "--kubeconfig", str(fleet.cluster.kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == code, done.stdout + done.stderr
    [preview] = json.loads(done.stdout)
    return preview


def test_upgrade_check_names_what_a_newer_operator_would_roll_and_why_and_writes_nothing(
        fleet: Fleet, tmp_path: pathlib.Path) -> None:
    fleet.apply(fixed_split())
    fleet.wait_settled()
    before = fleet.uids()
    assert [i["rolls"] for i in _upgrade_check(fleet, "--exit-code")["instances"]] == [False] * 4

    # The pods as the apiserver holds them (defaulted, quantities rewritten) differ from the newer
    # rendering in the field and the annotation it adds, and in nothing else.
    newer = _upgrade_check(fleet, "--exit-code", newer=True, code=3)
    assert [(i["cause"], i["changes"]) for i in newer["instances"]] == [
        ("rendering", ["pod metadata.annotations[example.com/newer] (new)",
                       "pod spec.containers[engine].env[HYBRIDSERVING_NEWER] (new)"])] * 4
    # The router Deployment as the apiserver holds it differs in the flag, and in nothing else.
    routers = fleet.custom.list_namespaced_custom_object(
        "apps", "v1", fleet.ns, "deployments", label_selector=f"hybridserving.io/name={fleet.name}")["items"]
    [router] = routers
    assert newer["routers"] == [{"name": router["metadata"]["name"],
                                 "changes": ["router flag --retry-max-retries: (unset) → 7"]}], newer
    image = _upgrade_check(fleet, "--default-engine-image", "registry.example/engine:next")["instances"]
    assert {i["cause"] for i in image} == {"configuration"}
    assert all(i["changes"][0].startswith("revision ") and "pod spec.containers[engine].image: "
               f"{DEFAULT_ENGINE_IMAGE} → registry.example/engine:next" in i["changes"] for i in image), image
    # The chart values the upgrade runs with: their default image, and their grants.
    (tmp_path / "next.yaml").write_text("engineImage: {repository: registry.example/engine, tag: next}\n")
    assert {i["cause"] for i in _upgrade_check(fleet, "-f", str(tmp_path / "next.yaml"))["instances"]} == {
        "configuration"}
    (tmp_path / "narrower.yaml").write_text("enginePolicy: {allowHostNetwork: true, allowIpcLock: true, "
                                            "allowedImages: [registry.example/]}\n")
    refused = _upgrade_check(fleet, "--exit-code", "-f", str(tmp_path / "narrower.yaml"), code=4)
    assert (refused["instances"], refused["alreadyInvalid"]) == ([], False), refused
    assert any(i.startswith("spec.engine.image: image ") and "enginePolicy.allowedImages: registry.example/" in i
               for i in refused["invalid"]), refused
    assert fleet.uids() == before, "a check restarts nothing"
    table = _cli(fleet, "upgrade-check", fleet.name)
    assert table == f"CRDs: this version's ({', '.join(expected_digests())})\n" \
                    f"{fleet.ns}/{fleet.name}: nothing rolls (4 instance(s) up to date)\n" \
                    "this version rolls 0 of 4 instance(s) in 1 fleet(s)\n", table

    # From inside the cluster (the new operator image in a pod): no kubeconfig, the pod's account,
    # and without -n the pod's namespace.
    (tmp_path / "token").write_text(fleet.cluster.token)
    (tmp_path / "namespace").write_text(fleet.ns)
    host, port = fleet.cluster.server.removeprefix("https://").split(":")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": host,
           "KUBERNETES_SERVICE_PORT": port}
    done = subprocess.run([sys.executable, "-c", IN_A_POD, str(tmp_path / "token"),
                           str(fleet.cluster.dir / "pki" / "ca.crt"), str(tmp_path / "namespace"), "upgrade-check"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False)
    assert (done.returncode, done.stdout.splitlines()[:2]) == (
        0, [f"CRDs: this version's ({', '.join(expected_digests())})",
            f"{fleet.ns}/{fleet.name}: nothing rolls (4 instance(s) up to date)"]), done.stdout + done.stderr


def test_the_cli_takes_the_namespace_kubectl_would_lists_every_namespace_and_runs_as_a_kubectl_plugin(
        fleet: Fleet, tmp_path: pathlib.Path) -> None:
    fleet.apply(fixed_split())
    # Without -n, the namespace kubectl would use: the kubeconfig context's.
    kubeconfig = yaml.safe_load(fleet.cluster.kubeconfig.read_text())
    for context in kubeconfig["contexts"]:
        context["context"]["namespace"] = fleet.ns
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    done = subprocess.run([sys.executable, "-m", "hybridserving.cli", "status", "--kubeconfig",
                           str(tmp_path / "kubeconfig")], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          check=False)
    assert done.returncode == 0 and done.stdout.startswith(f"{fleet.name}  ready="), done.stdout + done.stderr
    every = _cli(fleet, "status", "-A", namespaced=False)
    assert f"\n{fleet.ns}/{fleet.name}  ready=" in f"\n{every}", every
    # The same, as a kubectl plugin (the package installs `kubectl-hybridserving` beside `hybridserving`).
    done = subprocess.run([str(bin_dir() / "kubectl"), "hybridserving", "status", "--kubeconfig",
                           str(tmp_path / "kubeconfig")], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          check=False, env={**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}:"
                                                                  f"{os.environ['PATH']}"})
    assert done.returncode == 0 and done.stdout.startswith(f"{fleet.name}  ready="), done.stdout + done.stderr


def test_a_canary_holds_one_instance_per_role_until_removed_and_rollback_returns_the_previous_configuration(
    fleet: Fleet,
) -> None:
    fleet.apply(fixed_split())
    fleet.wait_settled()
    first = fleet.get()["status"]["rollout"]
    assert first["updateRevision"] == first["currentRevision"] == first["lastGoodRevision"]
    old_image = next(iter(_images(fleet).values()))
    before = fleet.uids()
    roles = {n: i["spec"]["role"] for n, i in fleet.instances().items()}

    def change(s: dict[str, Any]) -> None:
        s["engine"]["image"] = "lmsysorg/sglang:v0.5.23-canary"
        s.setdefault("rollout", {})["canary"] = 1

    fleet.edit(change)

    def held() -> bool:
        obj = fleet.get()
        status = obj.get("status") or {}
        rollout = status.get("rollout") or {}
        return (status.get("observedGeneration") == obj["metadata"]["generation"] and status.get("ready") == "True"
                and rollout.get("held") == "Canary" and rollout.get("updated") == {"prefill": 1, "decode": 1}
                and all(p.status.phase == "Running" and not p.metadata.deletion_timestamp
                        for p in fleet.pods().values()))

    fleet.wait_for(held, timeout=120, interval=0.5, what="held at the canary")
    time.sleep(5)  # held: nothing more rolls
    images = _images(fleet)
    canaries = sorted(n for n, image in images.items() if image != old_image)
    assert sorted(roles[n] for n in canaries) == ["decode", "prefill"], images
    assert all(uid == before[n] for n, uid in fleet.uids().items() if n.rsplit("-", 1)[0] not in canaries)
    status = fleet.get()["status"]
    assert status["rollout"]["lastGoodRevision"] == first["updateRevision"]
    assert status["rollout"]["currentRevision"] == first["updateRevision"] != status["rollout"]["updateRevision"]
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "RolloutHeldByCanary"
    assert "Rollout [held: Canary]: held by canary 1" in _cli(fleet, "status", fleet.name)
    held_back = _upgrade_check(fleet, "--exit-code")  # a rollout under way is not the upgrade's doing
    assert sorted(i["cause"] for i in held_back["instances"]) == ["current", "current", "rollout", "rollout"]
    assert held_back["pace"].startswith("held at the canary")
    canary_revision = status["rollout"]["updateRevision"]
    # Going back to what the rest run calls the canary off (it would hold the canaries there).
    undo = _cli(fleet, "rollback", fleet.name, "--dry-run")
    assert undo.startswith(f"{fleet.name} would roll back to revision 1 ") and \
        "  spec.rollout.canary removed" in undo.splitlines(), undo

    fleet.edit(lambda s: s["rollout"].update(canary=None))  # null removes it (merge patch)
    fleet.wait_settled()
    assert set(_images(fleet).values()) == {"lmsysorg/sglang:v0.5.23-canary"}
    assert fleet.get()["status"]["rollout"]["lastGoodRevision"] == canary_revision
    assert _revisions(fleet) == {first["updateRevision"]: 1, canary_revision: 2}

    change = f"  spec.engine.image: lmsysorg/sglang:v0.5.23-canary → {old_image}"
    dry = _cli(fleet, "rollback", fleet.name, "--dry-run")
    assert dry.startswith(f"{fleet.name} would roll back to revision 1 ") and change in dry.splitlines(), dry
    assert fleet.get()["spec"]["engine"]["image"] == "lmsysorg/sglang:v0.5.23-canary", "a dry run writes nothing"
    out = _cli(fleet, "rollback", fleet.name)
    assert "rolled back to revision 1" in out and change in out.splitlines(), out
    assert fleet.get()["spec"]["engine"]["image"] == old_image
    fleet.wait_settled()
    assert set(_images(fleet).values()) == {old_image}
    rollout = fleet.get()["status"]["rollout"]
    assert rollout["updateRevision"] == rollout["lastGoodRevision"] == first["updateRevision"]
    assert _revisions(fleet) == {first["updateRevision"]: 3, canary_revision: 2}, "renumbered as the newest"

    fleet.edit(lambda s: s["rollout"].update(revisionHistoryLimit=0))
    fleet.wait_for(lambda: _revisions(fleet) == {first["updateRevision"]: 3}, timeout=60,
                   what="history bounded to the revision in use")
