"""The read cache (controller/cache.py): a pass observes from memory, reads its own writes, and
never acts twice on what it holds stale.

`Cached` is the operator's `CachedKube` with the API replaced by the in-memory one of
test_reconcile.py; watch events are fed by hand, as kopf would deliver them.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND
from hybridserving.controller import reconcile as rec
from hybridserving.controller.cache import CachedKube, ObjectCache
from hybridserving.controller.handlers import CACHED_KINDS
from hybridserving.controller.kube import Kube, KubeError
from hybridserving.controller.switching import SwitchController
from hybridserving.core.naming import LABEL_NAME
from test_reconcile import NS, SPEC, MemoryApi

SELECTOR = {LABEL_NAME: "fleet"}


class MemoryKube(Kube):
    """`Kube` over `MemoryApi`, counting what reaches it."""

    api: MemoryApi

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        self.reads[("get", kind)] += 1
        return self.api.get(kind, namespace, name)

    def list_versioned(self, kind: str, namespace: str,
                       labels: dict[str, str]) -> tuple[list[dict[str, Any]], str | None]:
        self.reads[("list", kind)] += 1
        return self.api.list(kind, namespace, labels), str(next(self.api.counter))

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.create(kind, namespace, body)

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *,
              resource_version: str | None = None, uid: str | None = None,
              subresource: str | None = None) -> dict[str, Any]:
        return self.api.patch(kind, namespace, name, body, resource_version=resource_version, uid=uid,
                              subresource=subresource)

    def server_side_apply(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        self.api.server_side_apply(kind, namespace, body)

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> None:
        self.api.delete(kind, namespace, name, uid=uid, resource_version=resource_version)


class Cached(CachedKube, MemoryKube):
    pass


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t



@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def kube(api: MemoryApi, clock: Clock) -> Cached:
    return Cached(api, ObjectCache(CACHED_KINDS, max_age=600.0, clock=clock))


def kubelet(api: MemoryApi, cache: ObjectCache) -> None:
    """Pods start running and routers turn ready; the watch reports each change."""
    api.run_pods()
    for (kind, _), obj in api.store.items():
        if kind in ("Pod", "Deployment"):
            obj["metadata"]["resourceVersion"] = str(next(api.counter))
            cache.apply_event(kind, "MODIFIED", copy.deepcopy(obj))


def settle(api: MemoryApi, kube: Kube) -> None:
    """Reconcile until two passes in a row ask for nothing: a router turns ready a pass after its pair."""
    quiet = 0
    for _ in range(10):
        outcome = rec.reconcile(kube, NS, "fleet")
        if isinstance(kube, CachedKube):
            kubelet(api, kube.cache)
        else:
            api.run_pods()
        quiet = 0 if outcome.actions else quiet + 1
        if quiet == 2:
            return
    raise AssertionError("not settled")


def reads_of_a_pass(kube: MemoryKube) -> tuple[Counter[tuple[str, str]], rec.Outcome]:
    kube.reads.clear()
    outcome = rec.reconcile(kube, NS, "fleet")
    return Counter(kube.reads), outcome


def test_a_settled_fleet_is_reconciled_from_the_cache_without_one_read(api: MemoryApi, kube: Cached) -> None:
    settle(api, kube)
    assert api.condition("Ready")["status"] == "True"
    writes = sum(api.writes.values())
    reads, outcome = reads_of_a_pass(kube)
    assert not outcome.actions and sum(api.writes.values()) == writes
    assert sum(reads.values()) == 0, reads
    # Without the cache the same pass reads the fleet and lists every kind it owns.
    plain = MemoryKube(api)
    reads, _ = reads_of_a_pass(plain)
    assert reads[("get", KIND)] == 1 and reads[("list", "Pod")] == 1 and sum(reads.values()) >= 10


def test_a_pass_that_acts_observes_once_and_reads_its_own_writes(api: MemoryApi, kube: Cached) -> None:
    reads, first = reads_of_a_pass(kube)
    assert len(first.applied) > 10 and not first.conflict
    # One observe: each kind listed once, although the pass wrote and then reported on what it wrote.
    assert max(reads.values()) == 1, reads
    statuses = [o.get("status", {}).get("phase") for (k, _), o in api.store.items() if k == INSTANCE_KIND]
    assert statuses and all(statuses), "instance status written from the post-write state"
    # No watch event came: the next passes still see every object they created and create none again
    # (the instances' pods and Services follow once the instances exist).
    for _ in range(3):
        existing = set(api.store)
        reads, later = reads_of_a_pass(kube)
        assert sum(reads.values()) == 0 and not later.conflict and not later.errors
        assert not [a for a in later.actions if a.verb == "create" and (a.kind, a.name) in existing]
    assert {k for k, _ in api.children()} >= {INSTANCE_KIND, "Pod", "Service", "ConfigMap"}


def test_a_tick_of_the_switch_controller_reads_the_cache(api: MemoryApi, kube: Cached) -> None:
    spec = copy.deepcopy(SPEC)
    spec["roleSwitch"] = {"enabled": True}
    api.user_apply(spec)
    settle(api, kube)

    class NoEngines:
        def sample_many(self, targets: Any, api_key: str | None = None) -> dict[str, Any]:
            return {}

    switcher = SwitchController(kube.sibling("switch"), NoEngines())
    switcher.tick(NS, "fleet")
    switch_kube = switcher.kube
    assert isinstance(switch_kube, MemoryKube) and sum(switch_kube.reads.values()) == 0


def test_a_deletion_the_watch_missed_is_believed_at_most_max_age(api: MemoryApi, kube: Cached, clock: Clock) -> None:
    settle(api, kube)
    del api.store[("Pod", "fleet-0-0")]  # gone, and the watch was reconnecting
    assert not [a for a in rec.reconcile(kube, NS, "fleet").actions if a.name == "fleet-0-0"]
    clock.t += 601
    outcome = rec.reconcile(kube, NS, "fleet")
    assert ("create", "Pod", "fleet-0-0") in {(a.verb, a.kind, a.name) for a in outcome.actions}


def test_a_deletion_during_an_outage_is_seen_once_the_watch_lists_again(api: MemoryApi, kube: Cached) -> None:
    """kopf lists again when its watch restarts (after an apiserver restart) and reports no
    deletion that fell into the gap: its listing events make the next read LIST."""
    settle(api, kube)
    del api.store[("Pod", "fleet-0-0")]  # deleted while the watch was reconnecting
    for (kind, _), held in list(api.store.items()):
        if kind == "Pod":
            kube.cache.apply_event("Pod", None, copy.deepcopy(held))  # kopf's listing
    outcome = rec.reconcile(kube, NS, "fleet")
    assert ("create", "Pod", "fleet-0-0") in {(a.verb, a.kind, a.name) for a in outcome.actions}


def test_a_kind_the_outage_emptied_is_seen_once_any_watch_lists_again(api: MemoryApi, kube: Cached) -> None:
    """A fleet's one NetworkPolicy deleted while the apiserver was away: its kind lists nothing when
    its watch restarts, so no event tells of the gap; the fleets' own listing does."""
    settle(api, kube)
    assert [key for key in api.store if key[0] == "NetworkPolicy"] == [("NetworkPolicy", "fleet-engines")]
    del api.store[("NetworkPolicy", "fleet-engines")]  # deleted while the watches were reconnecting
    kube.cache.apply_event(KIND, None, copy.deepcopy(api.store[(KIND, "fleet")]))  # kopf's listing
    outcome = rec.reconcile(kube, NS, "fleet")
    assert ("create", "NetworkPolicy", "fleet-engines") in {(a.verb, a.kind, a.name) for a in outcome.actions}


def test_a_refused_write_makes_the_next_read_fresh(api: MemoryApi, kube: Cached) -> None:
    settle(api, kube)
    assert kube.cache.list(INSTANCE_KIND, NS, SELECTOR) is not None
    stale = api.get(INSTANCE_KIND, NS, "fleet-0")
    api.store[(INSTANCE_KIND, "fleet-0")]["metadata"]["resourceVersion"] = str(next(api.counter))  # no event
    with pytest.raises(KubeError):
        kube.patch(INSTANCE_KIND, NS, "fleet-0", {"metadata": {"annotations": {"a": "b"}}},
                   resource_version=stale["metadata"]["resourceVersion"])
    assert kube.cache.list(INSTANCE_KIND, NS, SELECTOR) is None
    kube.reads.clear()
    assert {i["metadata"]["resourceVersion"] for i in kube.list(INSTANCE_KIND, NS, SELECTOR)} >= \
        {api.store[(INSTANCE_KIND, "fleet-0")]["metadata"]["resourceVersion"]}
    assert kube.reads[("list", INSTANCE_KIND)] == 1


def test_a_conflict_ends_the_pass_and_the_retry_plans_from_a_fresh_list(api: MemoryApi, kube: Cached) -> None:
    settle(api, kube)
    spec = copy.deepcopy(SPEC)
    spec["decode"]["replicas"] = 3
    api.user_apply(spec)
    kube.cache.apply_event(KIND, "MODIFIED", api.get(KIND, NS, "fleet") | {
        "metadata": api.get(KIND, NS, "fleet")["metadata"] | {"resourceVersion": str(next(api.counter))}})
    api.fail = lambda verb, kind, name: 409 if verb == "create" and kind == INSTANCE_KIND else None
    reads, outcome = reads_of_a_pass(kube)
    assert outcome.conflict and outcome.requeue_after == 1.0
    api.fail = lambda *a: None
    relisted, outcome = reads_of_a_pass(kube)
    # The 409 dropped the instances from the cache: they are listed again (by the conflicting pass's
    # own report, if it had written anything, else by the retry), and the retry creates the instance.
    assert reads[("list", INSTANCE_KIND)] + relisted[("list", INSTANCE_KIND)] == 1
    assert ("create", INSTANCE_KIND, "fleet-4") in {(a.verb, a.kind, a.name) for a in outcome.actions}


def obj(name: str, rv: int, **labels: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": NS, "resourceVersion": str(rv),
                                        "labels": {LABEL_NAME: "fleet", **labels}}}


def test_a_late_watch_event_never_undoes_a_write(clock: Clock) -> None:
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    cache.prime("Pod", NS, SELECTOR, [], "1")
    cache.store("Pod", obj("p", 10, step="written"))
    cache.apply_event("Pod", "MODIFIED", obj("p", 9, step="older"))
    assert [o["metadata"]["labels"]["step"] for o in cache.list("Pod", NS, SELECTOR) or []] == ["written"]


def test_an_event_from_before_a_deletion_does_not_bring_the_object_back(clock: Clock) -> None:
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    cache.prime("Pod", NS, SELECTOR, [obj("p", 5)], "5")
    cache.apply_event("Pod", "DELETED", obj("p", 12))
    cache.apply_event("Pod", "MODIFIED", obj("p", 11))
    cache.prime("Pod", NS, SELECTOR, [obj("p", 11)], "11")  # a LIST that raced the deletion
    assert cache.list("Pod", NS, SELECTOR) == []
    cache.store("Pod", obj("p", 13))  # created again
    assert [o["metadata"]["resourceVersion"] for o in cache.list("Pod", NS, SELECTOR) or []] == ["13"]


def test_a_list_keeps_what_was_written_after_it_and_drops_what_it_no_longer_shows(clock: Clock) -> None:
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    cache.prime("Pod", NS, SELECTOR, [obj("old", 3), obj("kept", 4)], "4")
    cache.store("Pod", obj("new", 20))
    cache.prime("Pod", NS, SELECTOR, [obj("kept", 4)], "15")
    assert sorted(o["metadata"]["name"] for o in cache.list("Pod", NS, SELECTOR) or []) == ["kept", "new"]


def test_a_slice_is_served_only_once_listed_and_while_young(clock: Clock) -> None:
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    cache.apply_event("Pod", None, obj("p", 1))
    assert cache.list("Pod", NS, SELECTOR) is None, "a watch alone does not say what is absent"
    cache.prime("Pod", NS, SELECTOR, [obj("p", 1)], "1")
    assert cache.list("Pod", NS, {LABEL_NAME: "other"}) is None
    assert len(cache.list("Pod", NS, SELECTOR) or []) == 1
    clock.t += 61
    assert cache.list("Pod", NS, SELECTOR) is None


def test_what_the_cache_remembers_of_fleets_long_gone_is_bounded(clock: Clock) -> None:
    """A cluster that keeps creating and deleting fleets (CI) must not grow the operator for good."""
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    for i in range(1000):
        cache.prime("Pod", NS, {LABEL_NAME: f"fleet-{i}"}, [], "1")
        cache.prime_object("Pod", obj(f"fleet-{i}-0", 1))
        clock.t += 1
    assert len(cache._primed) + len(cache._named) <= 2 * (2 * 60 + 1)
    assert cache.list("Pod", NS, {LABEL_NAME: "fleet-999"}) == []  # what is young is still served


def test_a_deleted_object_is_held_as_deleting_until_the_watch_says_it_is_gone(clock: Clock) -> None:
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    cache.prime("Pod", NS, SELECTOR, [obj("p", 1)], "1")
    cache.mark_deleting("Pod", NS, "p")
    [held] = cache.list("Pod", NS, SELECTOR) or []
    assert held["metadata"]["deletionTimestamp"]
    cache.apply_event("Pod", "DELETED", obj("p", 2))
    assert cache.list("Pod", NS, SELECTOR) == []


def test_what_the_cache_returns_is_a_copy(clock: Clock) -> None:
    cache = ObjectCache(["Pod"], max_age=60, clock=clock)
    cache.prime("Pod", NS, SELECTOR, [obj("p", 1)], "1")
    (cache.list("Pod", NS, SELECTOR) or [])[0]["metadata"]["labels"]["x"] = "y"
    assert "x" not in (cache.list("Pod", NS, SELECTOR) or [])[0]["metadata"]["labels"]


def test_a_write_to_the_scale_subresource_leaves_the_cached_fleet_a_fleet(api: MemoryApi, clock: Clock) -> None:
    """The apiserver answers a /scale write with an autoscaling/v1 Scale of the same name and a newer
    resourceVersion; stored as the fleet, the next read would validate a Scale."""

    class ScaleApi(MemoryKube):
        def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
            written = super().patch(kind, namespace, name, body, **kw)
            if kw.get("subresource") != "scale":
                return written
            return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                    "metadata": {"name": name, "namespace": namespace,
                                 "resourceVersion": written["metadata"]["resourceVersion"]},
                    "spec": {"replicas": body["spec"]["replicas"]}}

    class ScaleAnswering(CachedKube, ScaleApi):
        pass

    kube = ScaleAnswering(api, ObjectCache(CACHED_KINDS, max_age=600.0, clock=clock))
    fleet = kube.get(KIND, NS, "fleet")
    kube.cache.apply_event(KIND, "ADDED", fleet)
    kube.patch(KIND, NS, "fleet", {"spec": {"replicas": 5}}, subresource="scale")
    assert kube.get(KIND, NS, "fleet")["kind"] == KIND
