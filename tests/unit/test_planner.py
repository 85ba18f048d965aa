"""The object planner, exercised as LWS tests its planner: whole rollouts, step by step.

`FakeCluster` (tests/support/apiserver.py) applies the planner's actions the way the apiserver would (uids, merge
patches, resourceVersion preconditions, graceful pod deletion, garbage collection of owned
objects) and plays scheduler and kubelet (GPU capacity, host ports, NVLink-domain affinity,
pods turning Running then Ready). Every scenario checks the fleet's invariants after every
single step, not just at the end.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from hybridserving.api.v1alpha1 import INSTANCE_KIND, ROLES, HybridServing
from hybridserving.controller.kube import KubeError
from hybridserving.contract import ANNOTATION_ROLE, LABEL_ROLE, role_document_name
from hybridserving.core import health, pairing, planner, ports, rendering
from hybridserving.core.fleet import assess
from hybridserving.core.naming import (
    config_map_name,
    ANNOTATION_CONFIG_HASH,
    LABEL_INSTANCE,
    LABEL_LEADER,
    LABEL_NAME,
    LABEL_PAIRING,
    LABEL_REVISION,
    LABEL_SURGE,
    digest,
    split_config_hash,
)
from hybridserving.core.observed import Observed, format_time
from hybridserving.core.podtemplate import OWNED_ENGINE_FIELDS
from hybridserving.core.switching import ANNOTATION_PINNED, ANNOTATION_SWITCH, SwitchState
from hybridserving_engine.launcher import fill_pod_values
from support.apiserver import FakeCluster
from support.fleets import check_invariants, converge, fleet, router_deployment, uids

# A switch in flight at its Switch step, as the role-switch controller records it.
SWITCH_RECORD = SwitchState.start("decode", "prefill", "in-place", "test", 0.0).advance("Switch", 1.0).to_annotation()


def rollout_invariants(hs: HybridServing):
    """During a pure rollout (nothing else failing): budgets per role, one role at a time."""
    budget = hs.spec.rollout.max_unavailable

    def check(cluster: FakeCluster) -> None:
        down = cluster.unavailable(hs)
        for role in ROLES:
            assert down[role] <= budget, f"{down[role]} {role} instances down, budget {budget}"
        assert not (down["prefill"] and down["decode"]), f"both roles rolling at once: {down}"

    return check


# --------------------------------------------------------------------------- creation


def test_a_new_fleet_gets_every_object_with_stable_names() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    assert sorted(cluster.instances()) == [f"hs-{i}" for i in range(6)]
    roles = {n: i["spec"]["role"] for n, i in cluster.instances().items()}
    assert sorted(roles.values()) == ["decode"] * 3 + ["prefill"] * 3
    kinds = {k for k, _ in cluster.store}
    assert {"ConfigMap", "Service", "Pod", "PodDisruptionBudget", "Deployment", "ServiceAccount", "Role",
            "RoleBinding", INSTANCE_KIND} <= kinds
    leader = cluster.pods()["hs-0-0"]
    assert leader["metadata"]["labels"][LABEL_ROLE] == roles["hs-0"]
    assert leader["metadata"]["annotations"][ANNOTATION_ROLE] == roles["hs-0"]
    # Steady state: a further pass writes nothing.
    assert cluster.reconcile(hs) == []


def test_every_object_is_owned_the_garbage_collector_can_follow() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    inst_uids = {i["metadata"]["uid"] for i in cluster.instances().values()}
    for (kind, name), obj in cluster.store.items():
        owners = {r["uid"] for r in obj["metadata"]["ownerReferences"]}
        expected = inst_uids if kind == "Pod" or (kind == "Service" and name != "hs-router") else {"hs-uid"}
        assert owners <= expected and owners, f"{kind}/{name} owned by {owners}"


def test_multi_node_instances_keep_their_gang_in_one_nvlink_domain() -> None:
    hs = fleet(prefill={"replicas": 2, "nodesPerInstance": 2, "layout": {"tp": 16}},
               decode={"replicas": 2, "layout": {"tp": 8}})
    cluster = FakeCluster()
    converge(cluster, hs)
    pods = cluster.pods()
    assert len(pods) == 6
    for inst in ("hs-0", "hs-1"):
        nodes = [pods[f"{inst}-{r}"]["spec"]["nodeName"] for r in range(2)]
        assert len(set(nodes)) == 2
        assert len({cluster.nodes[n]["domain"] for n in nodes}) == 1
    worker = pods["hs-0-1"]
    assert worker["metadata"]["labels"][LABEL_LEADER] == "false"
    assert LABEL_ROLE not in worker["metadata"]["labels"]
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    leader = pods["hs-0-0"]["spec"]["containers"][0]
    # Readiness on /ready: SGLang's /health runs a generation and answers after >= 1 s
    # (entrypoints/http_server.py:720-797), past the probe's timeout.
    assert leader["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert leader["readinessProbe"]["timeoutSeconds"] >= 1
    # Liveness asks the launcher, never the (possibly busy) engine; every rank has it.
    for container in (leader, worker["spec"]["containers"][0]):
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "launcher"}
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
    # A pod template that sets a probe is refused naming the probe the operator renders in its place.
    for probe in ("readinessProbe", "livenessProbe"):
        path = leader[probe]["httpGet"]["path"]
        assert f"{path} on the {leader[probe]['httpGet']['port']} port" in OWNED_ENGINE_FIELDS[probe]
    assert "startupProbe" not in leader and "none" in OWNED_ENGINE_FIELDS["startupProbe"]


def test_switching_fleets_tell_the_launcher_the_decode_graph_memory_and_keep_a_decode_radix_cache() -> None:
    hs = fleet(roleSwitch={"enabled": True})
    decode = rendering.role_config(hs.spec, "decode")
    # SGLang's own decode-graph reserve (arg_groups/memory_hook.py:357-377): 512 x 2 MiB at tp 8 on 141 GiB.
    assert decode["decode_cuda_graph_memory_gb"] == 1.0
    assert "--disaggregation-decode-enable-radix-cache" in decode["argv"]
    assert "decode_cuda_graph_memory_gb" not in rendering.role_config(hs.spec, "prefill")
    static = fleet()
    assert "decode_cuda_graph_memory_gb" not in rendering.role_config(static.spec, "decode")
    assert "--disaggregation-decode-enable-radix-cache" not in rendering.role_config(static.spec, "decode")["argv"]


def test_host_network_fleets_get_distinct_port_blocks_and_node_level_isolation() -> None:
    hs = fleet(prefill={"replicas": 4, "layout": {"tp": 4}}, decode={"replicas": 4, "layout": {"tp": 4}},
               network={"hostNetwork": True})
    cluster = FakeCluster(nodes=4)  # 8 instances of 4 GPUs on 4 nodes: two per node
    converge(cluster, hs)
    http = sorted(i["spec"]["ports"]["http"] for i in cluster.instances().values())
    assert http == [ports.HTTP_BASE + ports.STRIDE * b for b in range(8)]
    pod = cluster.pods()["hs-0-0"]
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_the_argv_plan_prints_is_the_one_each_pod_runs() -> None:
    """`hybridserving plan` (fleet.assess) and the launcher, filling the role's ConfigMap from the
    pod's environment, give one command line per rank: a port the plan names is the port the
    pod listens on, dist-init included."""
    hs = fleet(prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}},
               decode={"replicas": 1, "layout": {"tp": 8}})
    cluster = FakeCluster()
    converge(cluster, hs)
    for inst, spec in cluster.instances().items():
        role = spec["spec"]["role"]
        config = json.loads(cluster.get("ConfigMap", "ns", config_map_name("hs", role))["data"][f"{role}.json"])
        planned = assess(hs.spec, leader_host=f"{inst}.ns.svc").roles[role].argv_by_rank
        for rank, argv in enumerate(planned):
            container = cluster.pods()[f"{inst}-{rank}"]["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
            assert fill_pod_values(config["argv"], env, rank) == argv, f"{inst} rank {rank}"
            if len(planned) > 1:
                served = {p["name"]: p["containerPort"] for p in container["ports"]}
                assert argv[argv.index("--dist-init-addr") + 1] == f"{inst}.ns.svc:{served['dist-init']}"


# --------------------------------------------------------------------------- rollouts


@pytest.mark.parametrize("max_unavailable", [1, 2])
def pairing_invariants(hs: HybridServing):
    """While what prefill and decode must agree on rolls: every pod says the key of what it runs,
    some routed key keeps an available prefill and decode, some router is ready (the Service
    always has somewhere to send requests), and the router of an older key goes before its last
    pair does (a router without a pair answers 503 until the Service drops it)."""
    key = pairing.pairing_key(hs.spec)

    def check(c: FakeCluster) -> None:
        observed = c.observed()
        desired = planner.plan(hs, observed)
        serving: dict[str, set[str]] = {}
        for v in health.view(desired, observed).values():
            keys = {p.labels[LABEL_PAIRING] for p in v.pods}
            assert len(keys) <= 1, f"{v.plan.name} mixes pairing keys {keys}"
            for pod in v.pods:
                runs_spec = pod.annotations[ANNOTATION_CONFIG_HASH] == v.plan.config_hash
                assert (pod.labels[LABEL_PAIRING] == key) == runs_spec, f"{pod.name} says the wrong key"
            if v.available:
                serving.setdefault(keys.pop(), set()).add(v.plan.role)
        routed = {o["metadata"]["labels"][LABEL_PAIRING] for (kind, _), o in c.store.items()
                  if kind == "Deployment" and not o["metadata"].get("deletionTimestamp")}
        assert key in routed
        assert any(serving.get(k) == set(ROLES) for k in routed), f"no routed pair serving: {serving}, {routed}"
        for k in routed - {key}:
            assert serving.get(k) == set(ROLES), f"the router of key {k} outlived its last pair: {serving}"
        ready = [o for (kind, _), o in c.store.items()
                 if kind == "Deployment" and (o.get("status") or {}).get("readyReplicas")]
        assert ready, "no ready router: the Service has nowhere to send requests"

    return check


@pytest.mark.parametrize("max_unavailable", [1, 2])
def test_an_image_change_rolls_alternating_roles_so_a_compatible_pair_always_serves(max_unavailable: int) -> None:
    """A new engine build may not exchange KV with the old one: the roll keeps an old prefill and
    decode serving until a new pair does, within each role's budget, one role at a time."""
    hs = fleet(rollout={"maxUnavailable": max_unavailable})
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    old_key = pairing.pairing_key(hs.spec)
    new = fleet(rollout={"maxUnavailable": max_unavailable}, engine={"image": "sglang:v2"})
    assert pairing.pairing_key(new.spec) != old_key
    order: list[str] = []
    routers: set[str] = set()

    def check(c: FakeCluster) -> None:
        rollout_invariants(new)(c)
        pairing_invariants(new)(c)
        routers.update(n for k, n in c.store if k == "Deployment")
        for role, n in c.unavailable(new).items():
            if n and (not order or order[-1] != role):
                order.append(role)

    converge(cluster, new, check=check)
    assert order[:3] == ["prefill", "decode", "prefill"], f"the roles alternate while no new pair serves: {order}"
    assert routers == {f"hs-router-{old_key}", f"hs-router-{pairing.pairing_key(new.spec)}"}
    assert [n for k, n in cluster.store if k == "Deployment"] == [f"hs-router-{pairing.pairing_key(new.spec)}"]
    after = uids(cluster)
    assert set(after) == set(before) and all(after[n] != before[n] for n in before), "every pod replaced once"
    assert all(p["spec"]["containers"][0]["image"] == "sglang:v2" for p in cluster.pods().values())
    assert all(len(seen) == 2 for seen in cluster.pod_uids_seen.values())


@pytest.mark.parametrize("max_unavailable", [1, 2])
def test_a_change_both_sides_can_mix_rolls_prefill_then_decode_under_one_router(max_unavailable: int) -> None:
    """Pod resources do not change what prefill and decode exchange: the roll stays as fast as
    before (one role completely, then the other) and the router is never replaced."""
    hs = fleet(rollout={"maxUnavailable": max_unavailable})
    cluster = FakeCluster()
    converge(cluster, hs)
    router_uid = cluster.store[("Deployment", f"hs-router-{pairing.pairing_key(hs.spec)}")]["metadata"]["uid"]
    new = fleet(rollout={"maxUnavailable": max_unavailable}, podTemplate={"spec": {"priorityClassName": "serving"}})
    assert pairing.pairing_key(new.spec) == pairing.pairing_key(hs.spec)
    order: list[str] = []

    def check(c: FakeCluster) -> None:
        rollout_invariants(new)(c)
        for role, n in c.unavailable(new).items():
            if n and (not order or order[-1] != role):
                order.append(role)

    converge(cluster, new, check=check)
    assert order == ["prefill", "decode"], "prefill rolls completely before decode starts"
    assert [o["metadata"]["uid"] for (k, _), o in cluster.store.items() if k == "Deployment"] == [router_uid]
    assert all(p["spec"]["priorityClassName"] == "serving" for p in cluster.pods().values())


def test_a_fleet_of_one_instance_per_role_still_rolls_a_pairing_change() -> None:
    """No compatible pair can outlive the roll of a lone instance: the roll goes on (it never
    waits forever), one instance at a time."""
    hs = fleet(prefill={"replicas": 1}, decode={"replicas": 1})
    cluster = FakeCluster()
    converge(cluster, hs)
    new = fleet(prefill={"replicas": 1}, decode={"replicas": 1}, engine={"image": "sglang:v2"})
    converge(cluster, new, check=rollout_invariants(new))
    assert all(p["spec"]["containers"][0]["image"] == "sglang:v2" for p in cluster.pods().values())
    assert [n for k, n in cluster.store if k == "Deployment"] == [f"hs-router-{pairing.pairing_key(new.spec)}"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(prefill=st.integers(2, 4), decode=st.integers(2, 4), max_unavailable=st.integers(0, 3),
       max_surge=st.integers(0, 2), ready_after=st.integers(1, 3), interrupt=st.integers(0, 12),
       canary=st.sampled_from([None, 1, 2]), timed=st.booleans())
def test_pairing_changes_on_top_of_each_other_keep_a_routed_pair_and_converge(
    prefill: int, decode: int, max_unavailable: int, max_surge: int, ready_after: int, interrupt: int,
    canary: int | None, timed: bool
) -> None:
    """A second incompatible change lands mid-roll (or while a canary holds): three keys live at
    once, and still every step keeps a routed pair, no older router outlives its last pair, no
    role serves below its budget nor surges above it, and the fleet ends on one key with one
    router at its declared size. `timed`: each step is 2 s, so minReadySeconds (10) holds the
    roll after each instance comes back."""
    assume(max_unavailable + max_surge >= 1)
    seen: dict[str, set[str]] = {role: set() for role in ROLES}

    def spec(image: str | None, held: int | None) -> HybridServing:
        extra: dict[str, Any] = {"engine": {"image": image}} if image else {}
        return fleet(prefill={"replicas": prefill}, decode={"replicas": decode},
                     rollout={"maxUnavailable": max_unavailable, "maxSurge": max_surge, "canary": held}, **extra)

    def check(hs: HybridServing):
        return lambda c: (pairing_invariants(hs)(c), surge_invariants(hs, seen)(c))

    cluster = FakeCluster(ready_after=ready_after, step_seconds=2.0 if timed else None)
    converge(cluster, spec(None, None))
    v2 = spec("sglang:v2", canary)
    for _ in range(interrupt):
        cluster.reconcile(v2)
        check(v2)(cluster)
        cluster.advance()
        check(v2)(cluster)
    v3 = spec("sglang:v3", None)
    converge(cluster, v3, steps=320, check=check(v3))
    assert all(p["spec"]["containers"][0]["image"] == "sglang:v3" for p in cluster.pods().values())
    assert [n for k, n in cluster.store if k == "Deployment"] == [router_deployment(v3)]
    assert len(cluster.instances()) == prefill + decode


def test_a_layout_change_of_one_role_rolls_only_that_role() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    new = fleet(decode={"layout": {"tp": 8}, "maxRunningRequests": 64})
    converge(cluster, new, check=rollout_invariants(new))
    after = uids(cluster)
    roles = {n: i["spec"]["role"] for n, i in cluster.instances().items()}
    for name in before:
        inst = name.rsplit("-", 1)[0]
        assert (after[name] == before[name]) == (roles[inst] == "prefill"), name
    cm = cluster.store[("ConfigMap", "hs-decode-config")]
    assert "--max-running-requests" in cm["data"]["decode.json"]


def test_paused_rollout_holds_serving_instances_and_resumes() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    paused = fleet(engine={"image": "sglang:v2"}, rollout={"paused": True})
    for _ in range(5):
        cluster.reconcile(paused)
        cluster.advance()
    assert uids(cluster) == before, "a paused rollout disrupts nothing"
    resumed = fleet(engine={"image": "sglang:v2"})
    converge(cluster, resumed, check=rollout_invariants(resumed))
    assert all(uids(cluster)[n] != before[n] for n in before)


def test_a_spec_change_mid_rollout_never_rolls_both_roles() -> None:
    hs = fleet()
    cluster = FakeCluster(ready_after=3)
    converge(cluster, hs)
    v2 = fleet(engine={"image": "v2"})
    # Let prefill finish and decode start rolling, then change the image again.
    for _ in range(40):
        cluster.reconcile(v2)
        rollout_invariants(v2)(cluster)
        cluster.advance()
        if cluster.unavailable(v2)["decode"]:
            break
    assert cluster.unavailable(v2)["decode"]
    v3 = fleet(engine={"image": "v3"})
    converge(cluster, v3, check=rollout_invariants(v3))
    assert all(p["spec"]["containers"][0]["image"] == "v3" for p in cluster.pods().values())


def images(cluster: FakeCluster) -> dict[str, set[str]]:
    """The images each instance's pods run."""
    out: dict[str, set[str]] = {}
    for pod in cluster.pods().values():
        inst = pod["metadata"]["labels"]["hybridserving.io/instance"]
        out.setdefault(inst, set()).add(pod["spec"]["containers"][0]["image"])
    return out


def updated(cluster: FakeCluster, hs: HybridServing) -> dict[str, int]:
    """Instances per role whose spec carries `hs`'s configuration."""
    desired = planner.plan(hs, cluster.observed())
    out = {role: 0 for role in ROLES}
    for name, inst in cluster.instances().items():
        if inst["spec"]["configHash"] == desired.instances[name].config_hash:
            out[inst["spec"]["role"]] += 1
    return out


def canary_invariants(hs: HybridServing):
    """The rollout's invariants, plus: both roles always serve, no role rolls past its canary."""
    budget = rollout_invariants(hs)
    canary = hs.spec.rollout.canary

    def check(cluster: FakeCluster) -> None:
        budget(cluster)
        down = cluster.unavailable(hs)
        for role in ROLES:
            assert hs.spec.role(role).replicas - down[role] >= 1, f"no {role} instance serving"
            if canary is not None:
                assert updated(cluster, hs)[role] <= canary, f"{role} rolled past its canary of {canary}"

    return check


@pytest.mark.parametrize("max_unavailable", [1, 2])
def test_a_canary_rolls_that_many_instances_of_each_role_holds_and_completes_when_raised_then_removed(
    max_unavailable: int,
) -> None:
    hs = fleet(rollout={"maxUnavailable": max_unavailable})
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    for canary in (0, 1, 2, None):
        rollout: dict[str, Any] = {"maxUnavailable": max_unavailable}
        if canary is not None:
            rollout["canary"] = canary
        new = fleet(engine={"image": "v2"}, rollout=rollout)
        converge(cluster, new, check=canary_invariants(new))
        want = 3 if canary is None else canary
        assert updated(cluster, new) == {"prefill": want, "decode": want}, f"canary {canary}"
        for _ in range(3):  # held: further passes write nothing and the old instances keep serving
            assert cluster.reconcile(new) == []
            cluster.advance()
        on_v2 = sorted(n for n, seen in images(cluster).items() if seen == {"v2"})
        roles = {n: i["spec"]["role"] for n, i in cluster.instances().items()}
        for role in ROLES:
            mine = sorted((n for n in roles if roles[n] == role), key=lambda n: int(n.split("-")[1]))
            assert [n for n in mine if n in on_v2] == mine[len(mine) - want:], "highest indexes first"
        kept = [n for n in before if n.rsplit("-", 1)[0] not in on_v2]
        assert all(uids(cluster)[n] == before[n] for n in kept), "the rest are untouched"


def test_a_newer_change_while_held_moves_the_canary_and_leaves_the_rest_on_the_first_configuration() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    v2 = fleet(engine={"image": "v2"}, rollout={"canary": 1})
    converge(cluster, v2, check=canary_invariants(v2))
    v3 = fleet(engine={"image": "v3"}, rollout={"canary": 1})
    converge(cluster, v3, check=canary_invariants(v3))
    seen = images(cluster)
    assert sorted(n for n, i in seen.items() if i == {"v3"}) == ["hs-2", "hs-5"]
    assert not any(i == {"v2"} for i in seen.values()), "the canaries moved on to v3"
    assert updated(cluster, v3) == {"prefill": 1, "decode": 1}


def test_an_instance_that_fails_while_held_comes_back_on_the_new_configuration() -> None:
    """The plan renders the spec's pods only: an instance down anyway is rolled, canary or not."""
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    v2 = fleet(engine={"image": "v2"}, rollout={"canary": 1})
    converge(cluster, v2, check=canary_invariants(v2))
    assert images(cluster)["hs-0"] != {"v2"}, "hs-0 is not the prefill canary"
    cluster.store[("Pod", "hs-0-0")]["status"]["phase"] = "Failed"
    converge(cluster, v2)
    assert images(cluster)["hs-0"] == {"v2"}
    assert updated(cluster, v2) == {"prefill": 2, "decode": 1}
    assert cluster.reconcile(v2) == [], "held again, one past the canary"


def test_pausing_mid_rollout_holds_it_where_it_is_and_resuming_completes_it() -> None:
    hs = fleet()
    cluster = FakeCluster(ready_after=2)
    converge(cluster, hs)
    v2 = fleet(engine={"image": "v2"})
    for _ in range(40):  # roll until the second prefill instance is on its way
        cluster.reconcile(v2)
        rollout_invariants(v2)(cluster)
        cluster.advance()
        if updated(cluster, v2)["prefill"] == 2:
            break
    assert updated(cluster, v2) == {"prefill": 2, "decode": 0}
    paused = fleet(engine={"image": "v2"}, rollout={"paused": True})
    converge(cluster, paused, check=rollout_invariants(paused))  # the instance already rolling comes back
    held = images(cluster)
    for _ in range(5):
        assert cluster.reconcile(paused) == []
        cluster.advance()
    assert images(cluster) == held and not any(cluster.unavailable(paused).values())
    assert updated(cluster, paused) == {"prefill": 2, "decode": 0}, "held mid-way, serving"
    resumed = fleet(engine={"image": "v2"})
    converge(cluster, resumed, check=rollout_invariants(resumed))
    assert updated(cluster, resumed) == {"prefill": 3, "decode": 3}
    assert all(i == {"v2"} for i in images(cluster).values())


def documents_invariant(*specs: HybridServing):
    """Every live pod finds in its role's ConfigMap the very document its configHash was made from,
    so an engine restarting on a pod not yet rolled keeps that pod's flags."""
    made = {(role, digest(rendering.role_config(hs.spec, role))): rendering.role_config(hs.spec, role)
            for hs in specs for role in ROLES}

    def check(cluster: FakeCluster) -> None:
        for pod in cluster.pods().values():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            annotations = pod["metadata"]["annotations"]
            role, flags_half = annotations[ANNOTATION_ROLE], split_config_hash(annotations[ANNOTATION_CONFIG_HASH])[1]
            data = cluster.store[("ConfigMap", config_map_name("hs", role))]["data"]
            key = role_document_name(role, flags_half)
            assert key in data, f"{pod['metadata']['name']} runs {key}, which its ConfigMap lost"
            assert json.loads(data[key]) == made[(role, flags_half)]

    return check


def test_pods_not_yet_rolled_keep_their_flags_document_until_the_last_of_them_is_gone() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs, check=documents_invariant(hs))
    v2 = fleet(decode={"layout": {"tp": 8}, "maxRunningRequests": 64}, rollout={"canary": 1})
    converge(cluster, v2, check=documents_invariant(hs, v2))
    data = cluster.store[("ConfigMap", "hs-decode-config")]["data"]
    old, new = (role_document_name("decode", digest(rendering.role_config(s.spec, "decode"))) for s in (hs, v2))
    assert old != new and {old, new} <= set(data), "held at the canary: both configurations run"
    assert json.loads(data["decode.json"]) == json.loads(data[new]), "<role>.json is the spec's"
    done = fleet(decode={"layout": {"tp": 8}, "maxRunningRequests": 64})
    converge(cluster, done, check=documents_invariant(hs, done))
    assert set(cluster.store[("ConfigMap", "hs-decode-config")]["data"]) == {"decode.json", new}, \
        "the old document goes with the last pod that ran it"
    assert set(cluster.store[("ConfigMap", "hs-prefill-config")]["data"]) == {
        "prefill.json", role_document_name("prefill", digest(rendering.role_config(hs.spec, "prefill")))}


def switch_ends_once_followed(name: str, also: Any = None) -> Any:
    """The role-switch controller's part in a converge: once the instance's pods follow its new
    role, its Route step routes it again and its record goes (until then the rollout counts it out
    for the switch)."""
    def check(c: FakeCluster) -> None:
        inst = c.instances()[name]
        pods = [p for n, p in c.pods().items() if n.startswith(f"{name}-")]
        if pods and all(p["metadata"]["annotations"].get(ANNOTATION_ROLE) == inst["spec"]["role"] for p in pods):
            (inst["metadata"].get("annotations") or {}).pop(ANNOTATION_SWITCH, None)
        if also is not None:
            also(c)
    return check


def test_a_switched_pod_runs_the_spec_document_of_its_new_role() -> None:
    """The relabel gives the pod the hash of its new role's current document, which the map holds."""
    hs = fleet(roleSwitch={"enabled": True})
    cluster = FakeCluster()
    converge(cluster, hs)
    cluster.store[(INSTANCE_KIND, "hs-5")]["spec"]["role"] = "prefill"
    cluster.store[(INSTANCE_KIND, "hs-5")]["metadata"].setdefault("annotations", {})[
        "hybridserving.io/switch"] = SWITCH_RECORD
    converge(cluster, hs, check=switch_ends_once_followed("hs-5", documents_invariant(hs)))
    assert cluster.pods()["hs-5-0"]["metadata"]["annotations"][ANNOTATION_ROLE] == "prefill"


# --------------------------------------------------------------------------- role switches


def test_a_role_switch_relabels_pods_without_recreating_them() -> None:
    hs = fleet(roleSwitch={"enabled": True})
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    old_hash = cluster.instances()["hs-5"]["spec"]["configHash"]
    # The role-switch controller moves hs-5 (decode) to prefill: it writes spec.role only.
    cluster.store[(INSTANCE_KIND, "hs-5")]["spec"]["role"] = "prefill"
    # ...with its record on the instance, as the switch controller writes spec.role at its Switch step.
    cluster.store[(INSTANCE_KIND, "hs-5")]["metadata"].setdefault("annotations", {})[
        "hybridserving.io/switch"
    ] = SWITCH_RECORD
    first = cluster.reconcile(hs)
    assert [str(a) for a in first if a.kind != "PodDisruptionBudget"] == [
        "patch HybridServingInstance/hs-5: role switched to prefill: the pods follow in place with the prefill flags",
        "patch Pod/hs-5-0: role switched to prefill (relabel, no restart)",
    ], "a switch takes no rollout budget and restarts nothing"
    budgets = {a.name: a.body["spec"]["minAvailable"] for a in first if a.kind == "PodDisruptionBudget"}
    assert budgets == {"hs-prefill": 3, "hs-decode": 1}, "each role's budget follows its new size"
    converge(cluster, hs, check=switch_ends_once_followed("hs-5"))
    assert uids(cluster) == before, "no pod recreated for a role change"
    leader = cluster.pods()["hs-5-0"]["metadata"]
    assert leader["labels"][LABEL_ROLE] == "prefill"
    assert leader["annotations"][ANNOTATION_ROLE] == "prefill"
    inst = cluster.instances()["hs-5"]["spec"]
    assert inst["configHash"][:10] == old_hash[:10] and inst["configHash"] != old_hash
    assert leader["annotations"][ANNOTATION_CONFIG_HASH] == inst["configHash"]
    assert sorted(i["spec"]["role"] for i in cluster.instances().values()).count("prefill") == 4
    assert cluster.reconcile(hs) == []


def test_the_router_loses_an_instance_while_it_drains_for_a_switch() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    cluster.store[(INSTANCE_KIND, "hs-5")]["status"] = {"phase": "Draining"}
    cluster.reconcile(hs)
    assert LABEL_ROLE not in cluster.pods()["hs-5-0"]["metadata"]["labels"]
    cluster.store[(INSTANCE_KIND, "hs-5")]["status"] = {"phase": "Ready"}
    cluster.reconcile(hs)
    assert cluster.pods()["hs-5-0"]["metadata"]["labels"][LABEL_ROLE] == "decode"


def test_switched_mix_survives_when_switching_is_on_and_is_restored_when_off() -> None:
    on = fleet(roleSwitch={"enabled": True})
    cluster = FakeCluster()
    converge(cluster, on)
    cluster.store[(INSTANCE_KIND, "hs-5")]["spec"]["role"] = "prefill"
    # ...with its record on the instance, as the switch controller writes spec.role at its Switch step.
    cluster.store[(INSTANCE_KIND, "hs-5")]["metadata"].setdefault("annotations", {})[
        "hybridserving.io/switch"
    ] = SWITCH_RECORD
    converge(cluster, on, check=switch_ends_once_followed("hs-5"))
    roles = [i["spec"]["role"] for i in cluster.instances().values()]
    assert roles.count("prefill") == 4, "the controller's mix is kept"
    off = fleet()
    converge(cluster, off)
    roles = [i["spec"]["role"] for i in cluster.instances().values()]
    assert roles.count("prefill") == 3 and roles.count("decode") == 3


def test_turning_switching_off_mid_switch_keeps_the_instance_that_serves() -> None:
    on = fleet(prefill={"replicas": 2}, decode={"replicas": 1}, roleSwitch={"enabled": True})
    cluster = FakeCluster()
    converge(cluster, on)
    assert {n: i["spec"]["role"] for n, i in cluster.instances().items()} == {
        "hs-0": "prefill", "hs-1": "prefill", "hs-2": "decode"}
    # hs-1 is at the Switch step of prefill -> decode: out of the router, its spec already decode.
    moving = cluster.store[(INSTANCE_KIND, "hs-1")]
    moving["spec"]["role"] = "decode"
    moving["metadata"].setdefault("annotations", {})[ANNOTATION_SWITCH] = SwitchState.start(
        "prefill", "decode", "in-place", "test", 0.0).advance("Switch", 1.0).to_annotation()
    actions = cluster.reconcile(fleet(prefill={"replicas": 2}, decode={"replicas": 1}))
    deleted = {a.name for a in actions if a.verb == "delete" and a.kind == INSTANCE_KIND}
    assert deleted == {"hs-1"}, "decode keeps hs-2, the one that serves, not the instance mid-switch"
    converge(cluster, fleet(prefill={"replicas": 2}, decode={"replicas": 1}))
    roles = {n: i["spec"]["role"] for n, i in cluster.instances().items()}
    assert roles["hs-2"] == "decode" and sorted(roles.values()) == ["decode", "prefill", "prefill"], roles


# --------------------------------------------------------------------------- gangs and scale


def test_a_lost_pod_restarts_its_whole_gang() -> None:
    hs = fleet(prefill={"replicas": 2, "nodesPerInstance": 2, "layout": {"tp": 16}})
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    cluster.store[("Pod", "hs-0-1")]["metadata"]["deletionTimestamp"] = "now"  # someone deleted it
    actions = cluster.reconcile(hs)
    assert any(a.kind == INSTANCE_KIND and "gang restart" in a.reason for a in actions)
    assert any(a.verb == "delete" and a.name == "hs-0-0" for a in actions)
    converge(cluster, hs)
    after = uids(cluster)
    assert after["hs-0-0"] != before["hs-0-0"] and after["hs-0-1"] != before["hs-0-1"]
    assert all(after[n] == before[n] for n in before if not n.startswith("hs-0-"))
    assert cluster.instances()["hs-0"]["spec"]["restartGeneration"] == 1


def test_a_failed_or_restarted_rank_restarts_the_gang() -> None:
    hs = fleet(prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}})
    cluster = FakeCluster()
    converge(cluster, hs)
    cluster.store[("Pod", "hs-0-1")]["status"]["containerStatuses"] = [{"restartCount": 1}]
    actions = cluster.reconcile(hs)
    assert any("restarted its engine" in a.reason for a in actions)
    converge(cluster, hs)
    cluster.store[("Pod", "hs-0-0")]["status"]["phase"] = "Failed"
    actions = cluster.reconcile(hs)
    assert any("failed" in a.reason for a in actions)
    converge(cluster, hs)
    assert cluster.instances()["hs-0"]["spec"]["restartGeneration"] == 2


def test_a_half_created_gang_is_completed_not_restarted() -> None:
    hs = fleet(prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}})
    cluster = FakeCluster()
    for _ in range(3):  # configs + instances, then pods
        cluster.reconcile(hs)
    del cluster.store[("Pod", "hs-0-1")]
    actions = cluster.reconcile(hs)
    assert [str(a) for a in actions if a.kind == "Pod"] == [
        "create Pod/hs-0-1: rank 1 of prefill instance hs-0"
    ]


def test_scaling_keeps_names_and_reuses_the_lowest_free_index_and_port_block() -> None:
    hs = fleet(network={"hostNetwork": True})
    cluster = FakeCluster()
    converge(cluster, hs)
    smaller = fleet(network={"hostNetwork": True}, prefill={"replicas": 1})
    converge(cluster, smaller)
    assert sorted(cluster.instances()) == ["hs-0", "hs-3", "hs-4", "hs-5"]
    before = uids(cluster)
    converge(cluster, hs)
    assert sorted(cluster.instances()) == [f"hs-{i}" for i in range(6)]
    assert {n: u for n, u in uids(cluster).items() if n in before} == before, "scale-up leaves others alone"
    http = {n: i["spec"]["ports"]["http"] for n, i in cluster.instances().items()}
    assert http["hs-1"] == ports.HTTP_BASE + ports.STRIDE and http["hs-2"] == ports.HTTP_BASE + 2 * ports.STRIDE


def test_scale_down_deletes_surplus_instances_highest_index_first() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    actions = cluster.reconcile(fleet(decode={"replicas": 1}))
    deleted = sorted(a.name for a in actions if a.verb == "delete")
    assert deleted == ["hs-4", "hs-5"]


def test_turning_the_router_off_deletes_only_its_objects() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    off = fleet(router={"enabled": False})
    actions = cluster.reconcile(off)
    revision = planner.plan(off, cluster.observed()).revision_hash
    assert [str(a) for a in actions if a.verb != "delete" and a.kind != INSTANCE_KIND] == [
        "patch ConfigMap/hs-applied: applied spec drifted from the plan",
        f"create ControllerRevision/hs-{revision}: revision 2: the fleet's configuration",
    ]
    # A new revision of the fleet, which every instance runs already: relabelled, nothing rolled.
    assert {a.name: a.body for a in actions if a.kind == INSTANCE_KIND} == {
        f"hs-{i}": {"metadata": {"labels": {LABEL_REVISION: revision}}} for i in range(6)}
    assert sorted((a.verb, a.kind, a.name) for a in actions if a.verb == "delete") == sorted(
        [("delete", kind, "hs-router") for kind in ("ServiceAccount", "Role", "RoleBinding", "Service")]
        + [("delete", "Deployment", router_deployment(hs))]
    )


def test_objects_of_others_are_never_touched() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    stranger = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "someone-else", "namespace": "ns", "uid": "x",
                             "labels": {LABEL_NAME: "hs"}, "ownerReferences": [{"uid": "other"}]}}
    cluster.store[("ConfigMap", "someone-else")] = stranger
    assert cluster.reconcile(hs) == []


def test_unschedulable_instances_are_reported_and_block_nothing_else() -> None:
    hs = fleet(prefill={"replicas": 2}, decode={"replicas": 3})
    cluster = FakeCluster(nodes=4)  # room for 4 of 5 instances
    for _ in range(8):
        cluster.reconcile(hs)
        cluster.advance()
    views = health.view(planner.plan(hs, cluster.observed()), cluster.observed())
    states = sorted(v.state for v in views.values())
    assert states == ["Pending", "Ready", "Ready", "Ready", "Ready"]
    pending = next(v for v in views.values() if v.state == "Pending")
    assert "nodes are available" in (pending.pods[0].unschedulable or "")


# --------------------------------------------------------------------------- crashes


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), host_network=st.booleans(), multi_node=st.booleans())
def test_an_operator_killed_at_any_write_converges_without_duplicates(
    seed: int, host_network: bool, multi_node: bool
) -> None:
    """Every pass stops after a random number of writes; the next one starts from scratch."""
    rng = random.Random(seed)
    prefill: dict[str, Any] = {"replicas": 2}
    if multi_node:
        prefill.update(nodesPerInstance=2, layout={"tp": 16})
    specs = [
        fleet(prefill=prefill, network={"hostNetwork": host_network}),
        fleet(prefill=prefill, network={"hostNetwork": host_network}, engine={"image": "v2"}),
        fleet(prefill={**prefill, "replicas": 3}, decode={"replicas": 2},
              network={"hostNetwork": host_network}, engine={"image": "v2"}),
    ]
    cluster = FakeCluster()
    for hs in specs:
        for _ in range(40):
            actions = planner.diff(planner.plan(hs, cluster.observed()), cluster.observed())
            for action in actions[: rng.randint(0, len(actions))]:
                try:
                    cluster.apply(action)
                except KubeError:
                    break  # a 409: the pass ends, the next one re-reads
            check_invariants(cluster, hs)
            cluster.advance()
            check_invariants(cluster, hs)
        try:
            converge(cluster, hs)
        except AssertionError:
            # Without gang admission (`spec.gang`), a gang completed after an interrupted pass can
            # find its leader's NVLink domain taken meanwhile: the worker waits, reported
            # Unschedulable (docs/operator.md). That is placement, not a duplicate or a lost write.
            stuck = {p.labels.get(LABEL_INSTANCE) for p in cluster.observed().pods.values() if p.unschedulable}
            assert multi_node and stuck, "only a split gang may keep a fleet from converging"
            assert all(any(p.node_name for p in cluster.observed().pods_of(name)) for name in stuck)
            return
        assert cluster.reconcile(hs) == []
    roles = sorted(i["spec"]["role"] for i in cluster.instances().values())
    assert roles == ["decode"] * 2 + ["prefill"] * 3
    assert len(cluster.pods()) == sum(i["spec"]["nodes"] for i in cluster.instances().values())


def test_the_planner_is_deterministic() -> None:
    hs = fleet(network={"hostNetwork": True})
    cluster = FakeCluster()
    converge(cluster, hs)
    a = planner.plan(hs, cluster.observed())
    b = planner.plan(hs, cluster.observed())
    assert a.instances.keys() == b.instances.keys()
    assert all(a.instances[n].config_hash == b.instances[n].config_hash for n in a.instances)
    assert a.objects == b.objects


def test_the_router_discovers_leaders_of_its_pairing_key_by_role_in_the_fleet_namespace() -> None:
    hs = fleet()
    argv = rendering.router_argv(hs, planner.plan(hs, Observed()).instances, "k1")
    joined = " ".join(argv)
    assert "--prefill-selector hybridserving.io/name=hs hybridserving.io/role=prefill hybridserving.io/pairing-key=k1" \
        in joined
    assert "--decode-selector hybridserving.io/name=hs hybridserving.io/role=decode hybridserving.io/pairing-key=k1" \
        in joined
    assert "--service-discovery-namespace ns" in joined
    assert "--service-discovery-port 30000" in joined


@pytest.mark.parametrize("multi_node", [False, True])
def test_attention_dp_derived_ports_never_land_on_another_blocks_ports(multi_node: bool) -> None:
    """SGLang's attention DP binds 6 ports above the dist-init port (or --port + 233 on one node:
    server_args.py:818-874); with blocks one port apart two instances on a node collided."""
    blocks = [ports.block_ports(b, 8998) for b in range(ports.MAX_BLOCKS)]
    declared = {}
    for b, p in enumerate(blocks):
        for number in (p.http, p.bootstrap, p.dist_init, p.engine_info_bootstrap, p.launcher):
            declared[number] = b
    for b, p in enumerate(blocks):
        derived = ports.attention_dp_ports(p, multi_node=multi_node)
        clashes = {n: declared[n] for n in derived if n in declared and declared[n] != b}
        assert not clashes, f"block {b} derives ports of blocks {clashes}"
        others = [ports.attention_dp_ports(q, multi_node=multi_node) for q in blocks[b + 1:b + 40]]
        assert all(not derived & o for o in others)


def test_the_fleets_total_is_split_by_the_roles_shares_and_never_below_a_floor() -> None:
    """`spec.replicas` (the scale subresource) sizes a switching fleet; the roles' replicas are shares."""
    switching = {"roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1},
                 "prefill": {"replicas": 1}, "decode": {"replicas": 3}}
    cluster = FakeCluster(nodes=16)

    def roles() -> dict[str, int]:
        counts = {role: 0 for role in ROLES}
        for inst in cluster.instances().values():
            counts[inst["spec"]["role"]] += 1
        return counts

    converge(cluster, fleet(**switching))
    assert roles() == {"prefill": 1, "decode": 3}
    converge(cluster, fleet(**switching, replicas=8))
    assert roles() == {"prefill": 2, "decode": 6}, "new instances join the role furthest below its share"
    before = {n: i["spec"]["role"] for n, i in cluster.instances().items()}
    converge(cluster, fleet(**switching, replicas=2))
    assert roles() == {"prefill": 1, "decode": 1}, "the total shrinks, each role keeps its floor"
    lowest = {role: min((n for n, r in before.items() if r == role), key=lambda n: int(n.split("-")[1]))
              for role in ROLES}
    assert sorted(cluster.instances()) == sorted(lowest.values()), "each role's highest indexes leave first"




def test_a_smaller_total_never_takes_a_roles_last_settled_instance_nor_one_mid_switch_or_pinned() -> None:
    """HPA or `kubectl scale` name no instance: the assignment picks it. The lower decode is on
    its way to prefill, so the higher one (which a tie between the roles would remove) is decode's
    only settled instance and its floor; of prefill, the pinned higher one stays."""
    switching = {"roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1},
                 "prefill": {"replicas": 2}, "decode": {"replicas": 2}}
    cluster = FakeCluster(nodes=16)
    converge(cluster, fleet(**switching, replicas=4))
    by_role = {role: sorted((n for n, i in cluster.instances().items() if i["spec"]["role"] == role),
                            key=lambda n: int(n.split("-")[1])) for role in ROLES}
    assert [len(v) for v in by_role.values()] == [2, 2]
    record = SwitchState.start("decode", "prefill", "in-place", "policy: test", 1000.0).to_annotation()
    cluster.instances()[by_role["decode"][0]]["metadata"].setdefault("annotations", {})[ANNOTATION_SWITCH] = record
    cluster.instances()[by_role["prefill"][1]]["metadata"].setdefault("annotations", {})[ANNOTATION_PINNED] = "true"
    desired = planner.plan(fleet(**switching, replicas=3), cluster.observed())
    assert sorted(desired.instances) == sorted([*by_role["decode"], by_role["prefill"][1]])


def test_where_every_serving_role_is_at_its_floor_a_smaller_total_takes_the_instance_mid_switch() -> None:
    """Each role serves on one instance and the third is on its way from prefill to decode: it is
    the only one whose removal leaves both roles served."""
    switching = {"roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1},
                 "prefill": {"replicas": 2}, "decode": {"replicas": 1}}
    cluster = FakeCluster(nodes=16)
    converge(cluster, fleet(**switching, replicas=3))
    prefill = sorted((n for n, i in cluster.instances().items() if i["spec"]["role"] == "prefill"),
                     key=lambda n: int(n.split("-")[1]))
    assert len(prefill) == 2
    record = SwitchState.start("prefill", "decode", "in-place", "policy: test", 1000.0).to_annotation()
    cluster.instances()[prefill[0]]["metadata"].setdefault("annotations", {})[ANNOTATION_SWITCH] = record
    desired = planner.plan(fleet(**switching, replicas=2), cluster.observed())
    assert sorted(desired.instances) == sorted(set(cluster.instances()) - {prefill[0]})


def test_a_smaller_total_takes_an_unpinned_instance_of_the_other_role_before_a_pinned_one() -> None:
    """Every prefill instance is pinned; prefill is the role furthest above its share, but decode
    has one to spare."""
    switching = {"roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1},
                 "prefill": {"replicas": 3}, "decode": {"replicas": 2}}
    cluster = FakeCluster(nodes=16)
    converge(cluster, fleet(**switching, replicas=5))
    for inst in cluster.instances().values():
        if inst["spec"]["role"] == "prefill":
            inst["metadata"].setdefault("annotations", {})[ANNOTATION_PINNED] = "true"
    desired = planner.plan(fleet(**switching, replicas=4), cluster.observed())
    [gone] = set(cluster.instances()) - set(desired.instances)
    assert cluster.instances()[gone]["spec"]["role"] == "decode"


def test_a_switch_started_after_the_pass_read_the_fleet_stops_that_instances_removal() -> None:
    """The role-switch controller and the reconcile act on one fleet side by side: the delete goes
    only to the instance as read, so one a switch started on since is a 409, and the retry's
    assignment sees the switch and takes another."""
    switching = {"roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1},
                 "prefill": {"replicas": 2}, "decode": {"replicas": 2}}
    cluster = FakeCluster(nodes=16)
    converge(cluster, fleet(**switching, replicas=4))
    smaller = fleet(**switching, replicas=3)
    actions = planner.diff(planner.plan(smaller, cluster.observed()), cluster.observed())
    [removal] = [a for a in actions if a.verb == "delete" and a.kind == INSTANCE_KIND]
    role = cluster.instances()[removal.name]["spec"]["role"]
    other = "decode" if role == "prefill" else "prefill"
    record = SwitchState.start(role, other, "in-place", "policy: test", 1000.0).to_annotation()
    cluster.patch(INSTANCE_KIND, "ns", removal.name, {"metadata": {"annotations": {ANNOTATION_SWITCH: record}}})
    with pytest.raises(KubeError) as conflict:
        cluster.apply(removal)
    assert conflict.value.status == 409 and removal.name in cluster.instances()
    retry = [a.name for a in cluster.reconcile(smaller) if a.verb == "delete" and a.kind == INSTANCE_KIND]
    assert len(retry) == 1 and retry[0] != removal.name


def test_a_smaller_total_takes_an_instance_that_is_not_ready_before_a_roles_only_ready_one() -> None:
    """Prefill's lower instance crash loops: its higher one is the only prefill instance serving,
    so the lower one goes, with role switching on or off."""
    shares = {"prefill": {"replicas": 2}, "decode": {"replicas": 1}}
    on = {"roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1}, **shares}
    for smaller in (fleet(**on, replicas=2), fleet(prefill={"replicas": 1}, decode={"replicas": 1})):
        cluster = FakeCluster(nodes=16)
        converge(cluster, fleet(**on, replicas=3) if smaller.spec.role_switch.enabled else fleet(**shares))
        prefill = sorted((n for n, i in cluster.instances().items() if i["spec"]["role"] == "prefill"),
                         key=lambda n: int(n.split("-")[1]))
        cluster.store[("Pod", f"{prefill[0]}-0")]["status"] = {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
        desired = planner.plan(smaller, cluster.observed())
        assert sorted(desired.instances) == sorted(set(cluster.instances()) - {prefill[0]})


# --------------------------------------------------------------------------- surge


def serving(cluster: FakeCluster) -> dict[str, int]:
    """Instances per role whose every pod runs and is ready, whatever configuration it runs."""
    observed = cluster.observed()
    out = {role: 0 for role in ROLES}
    for name, inst in observed.instances.items():
        pods = [p for p in observed.pods_of(name) if not p.deleting]
        if len(pods) == inst.spec.nodes and all(p.phase == "Running" and p.ready for p in pods):
            out[inst.spec.role] += 1
    return out


def surge_names(cluster: FakeCluster) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {role: set() for role in ROLES}
    for name, inst in cluster.instances().items():
        if LABEL_SURGE in inst["metadata"]["labels"]:
            out[inst["spec"]["role"]].add(name)
    return out


def surge_invariants(hs: HybridServing, seen: dict[str, set[str]]):
    """While a role rolls with surge: it serves at least its replicas less maxUnavailable, and it
    never has more than maxSurge instances above its replicas."""
    rollout = hs.spec.rollout

    def check(c: FakeCluster) -> None:
        up = serving(c)
        extra = surge_names(c)
        for role in ROLES:
            replicas = hs.spec.role(role).replicas
            assert up[role] >= replicas - rollout.max_unavailable, f"{role}: {up[role]} serving of {replicas}"
            assert len(extra[role]) <= rollout.max_surge, f"{role}: surge {extra[role]}"
            assert sum(1 for i in c.instances().values() if i["spec"]["role"] == role) <= replicas + rollout.max_surge
            seen[role] |= extra[role]

    return check


@pytest.mark.parametrize(("max_unavailable", "max_surge"), [(0, 1), (0, 2), (1, 1)])
@pytest.mark.parametrize("change", ["image", "priority"])
def test_max_surge_starts_new_instances_first_and_retires_them_once_the_role_has_rolled(
        max_unavailable: int, max_surge: int, change: str) -> None:
    """maxUnavailable 0 keeps every role at its replicas throughout; an incompatible change still
    keeps a routed pair serving; at the end the surge instances are gone and the fleet is its
    declared size, every instance it had kept by name and rolled."""
    rollout = {"maxUnavailable": max_unavailable, "maxSurge": max_surge}
    hs = fleet(rollout=rollout)
    cluster = FakeCluster()
    converge(cluster, hs)
    names = set(cluster.instances())
    before = uids(cluster)
    extra: dict[str, Any] = {"engine": {"image": "sglang:v2"}} if change == "image" else {
        "podTemplate": {"spec": {"priorityClassName": "serving"}}}
    new = fleet(rollout=rollout, **extra)
    seen: dict[str, set[str]] = {role: set() for role in ROLES}

    def check(c: FakeCluster) -> None:
        surge_invariants(new, seen)(c)
        if change == "image":
            pairing_invariants(new)(c)

    converge(cluster, new, steps=120, check=check)
    assert all(len(seen[role]) >= max_surge for role in ROLES), f"surge instances seen: {seen}"
    assert set(cluster.instances()) == names and surge_names(cluster) == {role: set() for role in ROLES}
    assert all(uids(cluster)[n] != before[n] for n in before), "every original pod replaced"
    desired = planner.plan(new, cluster.observed())
    assert all(v.current and v.available for v in health.view(desired, cluster.observed()).values())


def test_one_instance_per_role_rolls_a_pairing_change_with_a_pair_serving_throughout_when_surging() -> None:
    """Without surge a lone prefill cannot roll without a gap; with one surge instance per role the
    new key has its pair before the old one goes."""
    rollout = {"maxUnavailable": 0, "maxSurge": 1}
    hs = fleet(prefill={"replicas": 1}, decode={"replicas": 1}, rollout=rollout)
    cluster = FakeCluster()
    converge(cluster, hs)
    new = fleet(prefill={"replicas": 1}, decode={"replicas": 1}, rollout=rollout, engine={"image": "sglang:v2"})
    seen: dict[str, set[str]] = {role: set() for role in ROLES}

    def check(c: FakeCluster) -> None:
        surge_invariants(new, seen)(c)
        pairing_invariants(new)(c)

    converge(cluster, new, steps=120, check=check)
    assert all(p["spec"]["containers"][0]["image"] == "sglang:v2" for p in cluster.pods().values())
    assert len(cluster.instances()) == 2
    assert [n for k, n in cluster.store if k == "Deployment"] == [router_deployment(new)]


def test_a_held_rollout_runs_at_its_declared_size_and_surges_again_when_it_resumes() -> None:
    rollout: dict[str, Any] = {"maxUnavailable": 0, "maxSurge": 1, "canary": 1}
    hs = fleet(rollout=rollout)
    cluster = FakeCluster()
    converge(cluster, hs)
    held = fleet(rollout=rollout, engine={"image": "sglang:v2"})
    seen: dict[str, set[str]] = {role: set() for role in ROLES}
    converge(cluster, held, steps=120, check=surge_invariants(held, seen))
    assert all(seen[role] for role in ROLES), "the canary instances rolled with a surge instance up"
    assert updated(cluster, held) == {"prefill": 1, "decode": 1}, "surge instances are not the canary"
    assert surge_names(cluster) == {role: set() for role in ROLES} and len(cluster.instances()) == 6
    for _ in range(3):
        assert cluster.reconcile(held) == []
        cluster.advance()
    resumed = fleet(rollout={"maxUnavailable": 0, "maxSurge": 1}, engine={"image": "sglang:v2"})
    converge(cluster, resumed, steps=120, check=surge_invariants(resumed, seen))
    assert updated(cluster, resumed) == {"prefill": 3, "decode": 3} and len(cluster.instances()) == 6


def test_the_surge_instances_a_newer_change_makes_stale_are_replaced_without_dropping_capacity() -> None:
    rollout = {"maxUnavailable": 0, "maxSurge": 1}
    hs = fleet(rollout=rollout)
    cluster = FakeCluster(ready_after=2)
    converge(cluster, hs)
    v2 = fleet(rollout=rollout, engine={"image": "v2"})
    seen: dict[str, set[str]] = {role: set() for role in ROLES}
    for _ in range(12):  # surge instances up, a first instance rolled or rolling
        cluster.reconcile(v2)
        surge_invariants(v2, seen)(cluster)
        cluster.advance()
    first = set().union(*surge_names(cluster).values())
    assert first
    v3 = fleet(rollout=rollout, engine={"image": "v3"})
    converge(cluster, v3, steps=160, check=lambda c: (surge_invariants(v3, seen)(c), pairing_invariants(v3)(c)))
    assert all(p["spec"]["containers"][0]["image"] == "v3" for p in cluster.pods().values())
    assert len(cluster.instances()) == 6 and not first & set(cluster.instances())


def test_a_rollout_that_could_never_roll_is_refused_naming_the_fields() -> None:
    with pytest.raises(ValueError, match=r"rollout.maxUnavailable and rollout.maxSurge are both 0"):
        fleet(rollout={"maxUnavailable": 0})
    assert fleet(rollout={"maxUnavailable": 0, "maxSurge": 1}).spec.rollout.max_surge == 1


def not_settled(cluster: FakeCluster, hs: HybridServing, seconds: float) -> dict[str, int]:
    """Instances per role not ready on the spec they carry for `seconds` yet (down ones included)."""
    observed = cluster.observed()
    out = {role: 0 for role in ROLES}
    for v in health.view(planner.plan(hs, observed), observed).values():
        since = [p.ready_since for p in v.pods if p.ready_since is not None]
        if not (v.available and since and cluster.clock - max(since) >= seconds):
            out[v.plan.role] += 1
    return out


def test_an_instance_back_from_a_role_switch_settles_for_min_ready_seconds_before_its_role_rolls() -> None:
    """A switch in place leaves the pods Ready all along: the router registers the instance again
    only as its Route step relabels it. Counted as serving then, it let the role's only other
    instance roll in the same pass, leaving the role no registered worker."""
    kw: dict[str, Any] = dict(roleSwitch={"enabled": True}, prefill={"replicas": 1}, decode={"replicas": 3},
                              rollout={"minReadySeconds": 10})
    cluster = FakeCluster(step_seconds=2.0)
    converge(cluster, fleet(**kw))
    for _ in range(10):
        cluster.advance()
    inst = cluster.store[(INSTANCE_KIND, "hs-3")]
    annotations = inst["metadata"].setdefault("annotations", {})
    state = SwitchState.start("decode", "prefill", "in-place", "policy: test", cluster.clock)
    annotations[ANNOTATION_SWITCH] = state.to_annotation()
    inst["status"] = {"phase": "Draining"}
    cluster.reconcile(fleet(**kw))
    cluster.advance()
    inst["spec"]["role"] = "prefill"
    annotations[ANNOTATION_SWITCH] = state.advance("Switch", cluster.clock).to_annotation()
    inst["status"] = {"phase": "Switching"}
    new = fleet(**{**kw, "decode": {"replicas": 3, "memFractionStatic": 0.8}})
    for _ in range(3):
        cluster.reconcile(new)
        cluster.advance()

    def rolls_prefill() -> bool:
        return any(a.name in ("hs-2", "hs-2-0") and a.verb in ("patch", "delete") and "rolling" in a.reason
                   for a in cluster.reconcile(new))

    annotations[ANNOTATION_SWITCH] = state.advance("Route", cluster.clock).to_annotation()
    inst["status"] = {"phase": "Ready"}
    assert not rolls_prefill(), "hs-3 is being routed again: not yet a prefill that serves"
    cluster.advance()
    del annotations[ANNOTATION_SWITCH]  # labelled: the switch is done
    inst["status"] = {"phase": "Ready", "lastSwitch": format_time(cluster.clock)}
    cluster.advance()
    assert not rolls_prefill(), "back in the router 2 s ago, of minReadySeconds 10"
    for _ in range(5):
        cluster.advance()
    assert rolls_prefill(), "settled: the other prefill rolls"


@pytest.mark.parametrize("min_ready", [0, 10])
def test_the_roll_goes_on_only_once_an_instance_has_been_ready_for_min_ready_seconds(min_ready: int) -> None:
    """The router registers a worker seconds after its pod turns Ready: with minReadySeconds the
    next instance of the role rolls only once the last one has been ready that long. The same
    check fails without it (so it can fail)."""
    hs = fleet(rollout={"minReadySeconds": min_ready})
    cluster = FakeCluster(step_seconds=2.0)
    converge(cluster, hs)
    for _ in range(10):
        cluster.advance()
    new = fleet(engine={"image": "sglang:v2"}, rollout={"minReadySeconds": min_ready})
    worst = {role: 0 for role in ROLES}

    def check(c: FakeCluster) -> None:
        for role, n in not_settled(c, new, 10).items():
            worst[role] = max(worst[role], n)

    steps = converge(cluster, new, steps=200, check=check)
    assert all(p["spec"]["containers"][0]["image"] == "sglang:v2" for p in cluster.pods().values())
    if min_ready:
        assert worst == {"prefill": 1, "decode": 1}, worst
    else:
        assert max(worst.values()) > 1, f"without minReadySeconds the roll goes on at once: {worst}, {steps} steps"
