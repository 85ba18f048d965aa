"""Leader election on a Lease, against an in-memory apiserver with resourceVersion preconditions
and fake clocks: one leader at a time, takeover only after the lease ran out on the standby's own
clock, a lost race is a 409 and no leadership, a leader that cannot renew gives up in time.
The real apiserver and a killed leader are in tests/e2e/test_operator_ha_e2e.py."""

from __future__ import annotations

import copy
import itertools
import threading

import pytest

from hybridserving.controller.kube import KubeError
from hybridserving.controller.leadership import Election, Leadership


class LeaseApi:
    """Get/create/patch of Leases with the apiserver's optimistic concurrency."""

    def __init__(self) -> None:
        self.leases: dict[str, dict] = {}
        self.versions = itertools.count(1)
        self.down = False

    def get(self, kind: str, namespace: str, name: str) -> dict:
        if self.down:
            raise KubeError(0, "connection refused")
        if name not in self.leases:
            raise KubeError(404, "not found")
        return copy.deepcopy(self.leases[name])

    def create(self, kind: str, namespace: str, body: dict) -> dict:
        name = body["metadata"]["name"]
        if name in self.leases:
            raise KubeError(409, "already exists")
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        self.leases[name] = obj
        return obj

    def patch(self, kind: str, namespace: str, name: str, body: dict, *, resource_version: str | None = None,
              **_: object) -> dict:
        if self.down:
            raise KubeError(0, "connection refused")
        obj = self.leases[name]
        if resource_version != obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        obj["spec"].update(body["spec"])
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        return copy.deepcopy(obj)

    def holder(self) -> str:
        return self.leases["hybridserving-operator"]["spec"]["holderIdentity"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(api: LeaseApi, name: str, clock: Clock, **kw) -> Leadership:
    return Leadership(api, Election(namespace="ops", identity=name), clock=clock, wall=clock, **kw)


def test_one_leader_and_a_standby_that_waits_while_it_renews() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    assert a.try_acquire_or_renew() and api.holder() == "a"
    for _ in range(30):  # 30 s of renewals every second: b never takes over
        assert not b.try_acquire_or_renew()
        clock.now += 1
        assert a.try_acquire_or_renew()
    assert api.holder() == "a" and api.leases["hybridserving-operator"]["spec"]["leaseTransitions"] == 0


def test_a_standby_takes_over_once_the_lease_ran_out_on_its_own_clock() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b starts observing the record now
    clock.now += 7.9
    assert not b.try_acquire_or_renew()
    clock.now += 0.2  # 8.1 s without a renewal seen by b
    assert b.try_acquire_or_renew()
    spec = api.leases["hybridserving-operator"]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew() and api.holder() == "b"  # the old leader sees b's fresh record


def test_two_standbys_racing_for_an_expired_lease_make_one_leader() -> None:
    api, clock = LeaseApi(), Clock()
    a, b, c = replica(api, "a", clock), replica(api, "b", clock), replica(api, "c", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew(), c.try_acquire_or_renew()
    clock.now += 9
    real_patch = api.patch

    def c_writes_first(kind, namespace, name, body, **kw):  # c's write lands between b's read and write
        api.patch = real_patch
        assert c.try_acquire_or_renew()
        return real_patch(kind, namespace, name, body, **kw)

    api.patch = c_writes_first
    assert not b.try_acquire_or_renew()
    assert api.holder() == "c"


def test_a_leader_that_cannot_renew_gives_up_before_a_standby_could_take_over() -> None:
    api, clock = LeaseApi(), Clock()
    lost = threading.Event()
    a = replica(api, "a", clock, on_lost=lost.set)
    a.acquire()
    assert a.leading
    api.down = True
    a.election = Election(namespace="ops", identity="a", retry_seconds=0.001, renew_deadline_seconds=6.0,
                          lease_seconds=8.0)

    def tick() -> None:
        while not lost.is_set():
            clock.now += 0.5
            lost.wait(0.002)

    threading.Thread(target=tick, daemon=True).start()
    a.hold()
    assert lost.is_set() and not a.leading
    # It gave up within the renew deadline, before the lease (8 s) runs out for anyone else.
    assert a.election.renew_deadline_seconds < a.election.lease_seconds


def test_a_released_lease_is_taken_at_once() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.acquire()
    assert not b.try_acquire_or_renew()
    a.release()
    assert api.holder() == ""
    assert b.try_acquire_or_renew() and api.holder() == "b"


def test_the_timing_must_leave_room_to_renew() -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < lease duration"):
        Election(namespace="ops", identity="a", lease_seconds=5, renew_deadline_seconds=6)
