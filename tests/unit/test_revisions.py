"""Fleet revisions: each configuration applied is a ControllerRevision, bounded, and status says which
revision runs where, what holds the rollout, and the last revision the whole fleet was ready on."""

from __future__ import annotations

import copy
from typing import Any

from hybridserving.api.v1alpha1 import INSTANCE_KIND, HybridServingSpec
from hybridserving.controller import reconcile as rec
from hybridserving.core import planner, revisions
from hybridserving.core.actions import Cause
from hybridserving.core.naming import LABEL_NAME, LABEL_REVISION
from hybridserving.core.switching import ANNOTATION_SWITCH, SwitchState
from support.apiserver import NS, FakeCluster, MemoryApi
from support.fleets import SPEC, converge, fleet, settle


def kept(cluster: MemoryApi) -> dict[str, int]:
    """The fleet's ControllerRevisions: name -> revision number."""
    return {name: o["revision"] for (kind, name), o in cluster.store.items() if kind == "ControllerRevision"}


def revision_of(hs: Any) -> str:
    return f"hs-{revisions.revision_hash(hs.spec)}"


def test_a_fleet_records_its_configuration_as_a_revision_it_owns_and_labels_its_instances() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    name = revision_of(hs)
    assert kept(cluster) == {name: 1}
    rev = cluster.store[("ControllerRevision", name)]
    assert rev["metadata"]["ownerReferences"][0]["uid"] == "hs-uid"
    assert rev["metadata"]["labels"][LABEL_NAME] == "hs"
    assert rev["data"]["spec"] == revisions.revision_spec(hs.spec.to_wire())
    assert "rollout" not in rev["data"]["spec"] and "replicas" not in rev["data"]["spec"]["prefill"]
    assert {i["metadata"]["labels"][LABEL_REVISION] for i in cluster.instances().values()} == {
        revisions.revision_hash(hs.spec)}


def test_scaling_and_rollout_settings_are_no_new_revision_and_going_back_renumbers_the_old_one() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    converge(cluster, fleet(prefill={"replicas": 2}, rollout={"maxUnavailable": 2, "canary": 3}))
    assert kept(cluster) == {revision_of(hs): 1}
    switching = {"enabled": True, "minPrefill": 1, "minDecode": 1}
    assert revision_of(fleet(roleSwitch=switching)) == revision_of(
        fleet(roleSwitch=switching, replicas=8, scaling={"enabled": True, "maxReplicas": 9})
    ), "the fleet's total and its scaler are sizing, not configuration"
    v2 = fleet(engine={"image": "v2"})
    converge(cluster, v2)
    assert kept(cluster) == {revision_of(hs): 1, revision_of(v2): 2}
    converge(cluster, hs)
    assert kept(cluster) == {revision_of(hs): 3, revision_of(v2): 2}, "recorded again as the newest"


def test_history_is_bounded_but_keeps_what_instances_run_and_the_last_good_revision() -> None:
    cluster = FakeCluster()
    limit = {"revisionHistoryLimit": 2}
    specs = [fleet(engine={"image": f"v{n}"}, rollout=limit) for n in range(5)]
    for hs in specs:
        converge(cluster, hs)
    assert kept(cluster) == {revision_of(specs[4]): 5, revision_of(specs[3]): 4, revision_of(specs[2]): 3}
    # Held at a canary, the instances not rolled run revision 5: kept however far the history moves.
    canary = {**limit, "revisionHistoryLimit": 0, "canary": 1}
    held = fleet(engine={"image": "v5"}, rollout=canary)
    converge(cluster, held)
    assert kept(cluster) == {revision_of(held): 6, revision_of(specs[4]): 5}
    # The last good revision is never pruned either.
    desired = planner.plan(fleet(engine={"image": "v6"}, rollout=canary), cluster.observed(),
                           last_good_revision=revision_of(specs[2]))
    _, prune = revisions.actions(desired, cluster.observed())
    assert prune == [], "revision 3 is gone already; 5 runs, 6 is the newest other"


def test_a_rollback_restores_the_configuration_and_keeps_the_live_rollout_and_replicas() -> None:
    old = fleet(engine={"image": "v1"}).spec.to_wire()
    live = fleet(engine={"image": "v2"}, prefill={"replicas": 5}, rollout={"canary": 1}).spec.to_wire()
    restored = revisions.restore(live, revisions.revision_spec(old))
    assert restored["engine"]["image"] == "v1"
    assert restored["prefill"]["replicas"] == 5 and restored["rollout"]["canary"] == 1
    assert revisions.revision_spec(restored) == revisions.revision_spec(old)


# --------------------------------------------------------------------------- status


def rollout(api: MemoryApi) -> dict[str, Any]:
    result: dict[str, Any] = copy.deepcopy(api.status()["rollout"])
    return result


def apply(api: MemoryApi, **changes: Any) -> str:
    spec = copy.deepcopy(SPEC)
    spec.update(changes)
    api.user_apply(spec)
    # As the operator plans it: with its default router image where the fleet names none.
    planned = HybridServingSpec.model_validate(spec)
    planned = planned.model_copy(update={"router": planned.router.model_copy(update={"image": planned.router_image()})})
    return f"fleet-{revisions.revision_hash(planned)}"


def test_status_names_the_revisions_what_holds_the_rollout_and_the_last_good_one() -> None:
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    first = rollout(api)
    assert first["currentRevision"] == first["updateRevision"] == first["lastGoodRevision"]
    assert first["updated"] == {"prefill": 2, "decode": 2} and first["held"] == ""

    v2 = apply(api, engine={"image": "v2"}, rollout={"canary": 1})
    settle(api)
    held = rollout(api)
    assert held["updateRevision"] == v2 and held["currentRevision"] == first["updateRevision"]
    assert held["held"] == "Canary" and held["updated"] == {"prefill": 1, "decode": 1}
    assert held["lastGoodRevision"] == first["updateRevision"], "not every instance runs v2 yet"
    progressing = api.condition("Progressing")
    assert progressing["reason"] == "RolloutHeldByCanary" and "held by canary 1" in progressing["message"]

    apply(api, engine={"image": "v2"}, rollout={"canary": 1, "paused": True})
    rec.reconcile(api, NS, "fleet")
    assert rollout(api)["held"] == "Paused" and api.condition("Progressing")["reason"] == "RolloutPaused"

    apply(api, engine={"image": "v2"})
    settle(api)
    done = rollout(api)
    assert done["currentRevision"] == done["updateRevision"] == done["lastGoodRevision"] == v2
    assert done["held"] == "" and api.condition("Progressing")["reason"] == "Complete"


def test_a_revision_that_never_becomes_ready_is_not_the_last_good_one() -> None:
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    good = rollout(api)["lastGoodRevision"]
    apply(api, engine={"image": "broken"})
    for _ in range(10):  # the new pods never become ready
        rec.reconcile(api, NS, "fleet")
    status = rollout(api)
    assert status["updateRevision"] != good and status["lastGoodRevision"] == good
    labels = {i["metadata"]["labels"][LABEL_REVISION] for (k, _), i in api.store.items() if k == INSTANCE_KIND}
    assert len(labels) == 2, "instances rolled and not rolled say which revision they run"


def test_a_relabel_for_a_new_revision_does_not_hold_back_a_role_switch() -> None:
    hs = fleet(roleSwitch={"enabled": True})
    cluster = FakeCluster()
    converge(cluster, hs)
    switching = SwitchState.start("decode", "prefill", "in-place", "test", 0.0).advance("Switch", 1.0)
    inst = cluster.store[(INSTANCE_KIND, "hs-5")]
    inst["spec"]["role"] = "prefill"
    inst["metadata"].setdefault("annotations", {})[ANNOTATION_SWITCH] = switching.to_annotation()
    new = fleet(roleSwitch={"enabled": True}, router={"replicas": 2})  # a new revision, no instance rolls
    patch = next(a for a in cluster.reconcile(new) if a.kind == INSTANCE_KIND and a.name == "hs-5")
    assert patch.causes == (Cause.ROLE_SWITCH, Cause.DRIFT)
    assert patch.body is not None and "configHash" in patch.body["spec"]
    assert patch.body["metadata"]["labels"] == {LABEL_REVISION: revisions.revision_hash(new.spec)}


def test_status_names_the_pairing_keys_routed_apart_while_an_incompatible_change_is_held() -> None:
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    assert len(rollout(api)["pairingKeys"]) == 1
    apply(api, engine={"image": "v2"}, rollout={"canary": 1})  # a new engine build: another pairing key
    settle(api)
    held = rollout(api)
    assert held["held"] == "Canary" and len(held["pairingKeys"]) == 2
    assert "pair apart under 2 routers" in held["message"]
    apply(api, engine={"image": "v2"})
    settle(api)
    done = rollout(api)
    assert done["pairingKeys"] == [held["pairingKeys"][0]] and "pair apart" not in done["message"]


def test_status_counts_surge_instances_apart_from_the_rolled_ones() -> None:
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    apply(api, engine={"image": "v2"}, rollout={"maxUnavailable": 0, "maxSurge": 1})
    messages = []
    for _ in range(12):
        rec.reconcile(api, NS, "fleet")
        api.run_pods()
        messages.append(rollout(api)["message"])
    surging = [m for m in messages if "surge" in m]
    assert surging and "(1 surge prefill, 1 surge decode on top)" in surging[0], messages
    assert all(rollout(api)["updated"][role] <= 2 for role in ("prefill", "decode"))
    settle(api, passes=40)
    done = rollout(api)
    assert done["updated"] == {"prefill": 2, "decode": 2} and "surge" not in done["message"]
    assert api.status()["prefill"]["summary"] == "2/2"
