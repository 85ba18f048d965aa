"""Gang restart back-off: the schedule, its record on the instance, and the planner holding a
gang that keeps failing (`core.backoff`)."""

from __future__ import annotations

import json

import pytest

from hybridserving.api.v1alpha1 import INSTANCE_KIND
from hybridserving.core import backoff
from hybridserving.core.actions import Action, Cause
from hybridserving.core.backoff import ANNOTATION_GANG_RESTARTS, GangRestarts
from support.apiserver import FakeCluster
from support.fleets import converge, fleet

HS = fleet(prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}})


def test_restarts_in_a_row_wait_10s_doubling_up_to_5_minutes() -> None:
    assert [backoff.delay(n) for n in range(9)] == [0, 10, 20, 40, 80, 160, 300, 300, 300]
    assert backoff.delay(10_000) == 300, "no overflow however long it loops"


def test_the_wait_counts_from_the_last_restart() -> None:
    assert backoff.wait(None, 1000.0) == 0, "a gang never restarted restarts at once"
    three = GangRestarts(3, 1000.0)
    assert backoff.retry_at(three) == 1040.0
    assert backoff.wait(three, 1010.0) == 30.0
    assert backoff.wait(three, 1040.0) == backoff.wait(three, 5000.0) == 0
    assert backoff.restarted(None, 7.0) == GangRestarts(1, 7.0)
    assert backoff.restarted(three, 1050.0) == GangRestarts(4, 1050.0)


def test_a_gang_is_in_its_restart_loop_from_its_second_restart_in_a_row() -> None:
    assert not backoff.looping(None) and not backoff.looping(GangRestarts(1, 1000.0)), \
        "one failure restarted at once is no loop"
    assert backoff.looping(GangRestarts(2, 1000.0)) and backoff.looping(GangRestarts(9, 1000.0))


def test_a_gang_forgets_its_restarts_after_serving_10_minutes() -> None:
    assert backoff.forget_in(1000.0, 1000.0) == 600.0
    assert backoff.forget_in(1000.0, 1599.0) == 1.0
    assert backoff.forget_in(1000.0, 1600.0) == backoff.forget_in(1000.0, 9000.0) == 0


def test_the_record_reads_back_as_written_and_an_unreadable_one_as_none() -> None:
    record = GangRestarts(4, 1_764_842_450.0)
    text = record.to_annotation()
    assert json.loads(text) == {"count": 4, "lastRestart": "2025-12-04T10:00:50Z"}
    assert GangRestarts.from_annotation(text) == record
    for bad in (None, "", "4", "{}", '{"count": "x", "lastRestart": "2025-12-04T10:00:50Z"}',
                '{"count": 0, "lastRestart": "2025-12-04T10:00:50Z"}', '{"count": 2, "lastRestart": "soon"}'):
        assert GangRestarts.from_annotation(bad) is None, bad


# --------------------------------------------------------------------------- the planner


def record(cluster: FakeCluster) -> GangRestarts | None:
    annotations = cluster.instances()["hs-0"]["metadata"].get("annotations") or {}
    return GangRestarts.from_annotation(annotations.get(ANNOTATION_GANG_RESTARTS))


def restarts(actions: list[Action]) -> list[Action]:
    return [a for a in actions if Cause.GANG_RESTART in a.causes]


def fail(cluster: FakeCluster, pod: str = "hs-0-1") -> None:
    cluster.store[("Pod", pod)]["status"]["phase"] = "Failed"


@pytest.fixture
def cluster() -> FakeCluster:
    """A 2-node prefill instance (a gang) that has served, restarted once after a failed rank."""
    cluster = FakeCluster(step_seconds=1.0)
    converge(cluster, HS)
    fail(cluster)
    actions = cluster.reconcile(HS)
    patch = next(a for a in actions if a.kind == INSTANCE_KIND)
    assert patch.causes == (Cause.GANG_RESTART,) and "gang restart 1 in a row" in patch.reason
    assert record(cluster) == GangRestarts(1, cluster.clock), "written with the restart, in the same patch"
    converge(cluster, HS)
    # The new gang came up within its first 10 s (the fake kubelet takes its time over it).
    cluster.instances()["hs-0"]["metadata"]["annotations"][ANNOTATION_GANG_RESTARTS] = GangRestarts(
        1, cluster.clock - 3).to_annotation()
    return cluster


def test_a_gang_that_fails_again_waits_out_its_back_off_then_restarts(cluster: FakeCluster) -> None:
    last = record(cluster)
    assert last is not None and cluster.clock - last.last < 10
    generation = cluster.instances()["hs-0"]["spec"]["restartGeneration"]
    fail(cluster)
    held = cluster.reconcile(HS)
    assert not restarts(held) and not [a for a in held if a.kind == "Pod"], "the broken gang is left as it is"
    assert cluster.instances()["hs-0"]["spec"]["restartGeneration"] == generation

    cluster.clock = last.last + 10
    again = restarts(cluster.reconcile(HS))
    assert [a.name for a in again if a.kind == INSTANCE_KIND] == ["hs-0"]
    assert "gang restart 2 in a row" in again[0].reason and "next restart waits 20s" in again[0].reason
    assert record(cluster) == GangRestarts(2, last.last + 10)
    assert cluster.instances()["hs-0"]["spec"]["restartGeneration"] == generation + 1


def test_a_lost_rank_is_not_recreated_into_a_gang_backing_off(cluster: FakeCluster) -> None:
    del cluster.store[("Pod", "hs-0-1")]
    actions = cluster.reconcile(HS)
    assert not [str(a) for a in actions if a.kind in ("Pod", INSTANCE_KIND)], \
        "rank 1 alone would join peers whose collectives broke"


def test_a_gang_that_served_10_minutes_forgets_its_restarts(cluster: FakeCluster) -> None:
    ready = max(p["status"]["conditions"][-1]["lastTransitionTime"] for p in cluster.pods().values())
    assert cluster.reconcile(HS) == [], "served too briefly: nothing to forget yet"
    cluster.clock += 600
    actions = cluster.reconcile(HS)
    assert [(a.name, a.causes) for a in actions] == [("hs-0", (Cause.BACK_OFF_RESET,))], ready
    assert record(cluster) is None
    fail(cluster)
    assert "gang restart 1 in a row" in restarts(cluster.reconcile(HS))[0].reason, "restarts at once again"


def test_a_new_configuration_starts_its_back_off_afresh(cluster: FakeCluster) -> None:
    fail(cluster)
    assert not restarts(cluster.reconcile(HS)), "held"
    newer = fleet(prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}},
                  engine={"image": "registry.example/sglang:v2"})
    actions = cluster.reconcile(newer)
    roll = next(a for a in actions if a.kind == INSTANCE_KIND and a.name == "hs-0")
    assert Cause.ROLLOUT in roll.causes, "a rollout is never held by the back-off"
    assert record(cluster) is None
