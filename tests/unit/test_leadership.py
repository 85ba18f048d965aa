"""Leader election on a Lease, against the in-memory apiserver (tests/support) with resourceVersion preconditions
and fake clocks: one leader at a time, takeover only after the lease ran out on the standby's own
clock, a lost race is a 409 and no leadership, a leader that cannot renew gives up in time, and a
leader frozen past its deadline sends no write when it wakes. The real apiserver and a killed
leader are in tests/e2e/test_operator_ha_e2e.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from hybridserving.controller.cache import CachedKube, ObjectCache
from hybridserving.controller.kube import Fenced, Kube
from hybridserving.controller.leadership import Election, Leadership
from support.apiserver import MemoryApi

LEASE = ("Lease", "hybridserving-operator")
TIMING = {"lease_seconds": 8.0, "renew_deadline_seconds": 6.0, "retry_seconds": 1.0}


def holder(api: MemoryApi) -> str:
    return api.store[LEASE]["spec"]["holderIdentity"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(api: MemoryApi, name: str, clock: Clock, **kw) -> Leadership:
    return Leadership(api, Election(namespace="ops", identity=name, **TIMING), clock=clock, wall=clock, **kw)


def test_one_leader_and_a_standby_that_waits_while_it_renews() -> None:
    api, clock = MemoryApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    assert a.try_acquire_or_renew() and holder(api) == "a"
    for _ in range(30):  # 30 s of renewals every second: b never takes over
        assert not b.try_acquire_or_renew()
        clock.now += 1
        assert a.try_acquire_or_renew()
    assert holder(api) == "a" and api.store[LEASE]["spec"]["leaseTransitions"] == 0


def test_a_standby_takes_over_once_the_lease_ran_out_on_its_own_clock() -> None:
    api, clock = MemoryApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b starts observing the record now
    clock.now += 7.9
    assert not b.try_acquire_or_renew()
    clock.now += 0.2  # 8.1 s without a renewal seen by b
    assert b.try_acquire_or_renew()
    spec = api.store[LEASE]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew() and holder(api) == "b"  # the old leader sees b's fresh record


def test_two_standbys_racing_for_an_expired_lease_make_one_leader() -> None:
    api, clock = MemoryApi(), Clock()
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
    assert holder(api) == "c"


def test_a_leader_that_cannot_renew_gives_up_before_a_standby_could_take_over() -> None:
    api, clock = MemoryApi(), Clock()
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
    api, clock = MemoryApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.acquire()
    assert not b.try_acquire_or_renew()
    a.release()
    assert holder(api) == ""
    assert b.try_acquire_or_renew() and holder(api) == "b"


def test_the_timing_must_leave_room_to_renew() -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < lease duration"):
        Election(namespace="ops", identity="a", lease_seconds=5, renew_deadline_seconds=6)


def test_a_leader_whose_renewal_hangs_gives_up_before_a_standby_could_take_over() -> None:
    """A renewal call that never answers (no timeout reached yet) must not postpone the deadline."""
    api = MemoryApi()
    timing = dict(lease_seconds=0.8, renew_deadline_seconds=0.6, retry_seconds=0.05)
    lost = threading.Event()
    a = Leadership(api, Election(namespace="ops", identity="a", **timing), on_lost=lost.set)
    b = Leadership(api, Election(namespace="ops", identity="b", **timing))
    a.acquire()
    hang, real_get = threading.Event(), api.get

    def get(kind: str, namespace: str, name: str) -> dict:
        if threading.current_thread().name == "lease-renew":
            hang.wait(30)
        return real_get(kind, namespace, name)

    api.get = get  # type: ignore[method-assign]
    threading.Thread(target=a.hold, daemon=True).start()
    standby = threading.Thread(target=b.acquire, daemon=True)
    standby.start()
    try:
        assert lost.wait(5), "the leader kept acting while its renewal hung"
        assert not a.leading and not b.leading  # a stopped first: b takes the Lease only after it ran out
        standby.join(5)
        assert b.leading
    finally:
        hang.set()
        b.stopped.set()


def test_a_malformed_lease_keeps_a_standby_trying_rather_than_ending_its_election() -> None:
    api, clock = MemoryApi(), Clock()
    b = replica(api, "b", clock)
    b.election = Election(namespace="ops", identity="b", retry_seconds=0.001)
    api.create("Lease", "ops", {"metadata": {"name": LEASE[1]}, "spec": {"holderIdentity": "a"}})
    version = api.store[LEASE]["metadata"].pop("resourceVersion")  # nothing to precondition a takeover on
    standby = threading.Thread(target=b.acquire, daemon=True)
    standby.start()
    clock.now += 10  # a's Lease ran out on b's clock
    standby.join(0.2)
    assert standby.is_alive() and not b.leading
    api.store[LEASE]["metadata"]["resourceVersion"] = version
    clock.now += 10  # ran out however late b first read it
    standby.join(5)
    assert b.leading and holder(api) == "b"


def test_a_leader_that_finds_another_holder_stops_at_once_not_at_its_deadline() -> None:
    """A replica frozen past its deadline (a paused VM) wakes up to a Lease a standby took: its
    renewal sees it, and it stops before the deadline check would."""
    api = MemoryApi()
    lost = threading.Event()
    a = Leadership(api, Election(namespace="ops", identity="a", lease_seconds=60, renew_deadline_seconds=40,
                                 retry_seconds=0.05), on_lost=lost.set)
    a.acquire()
    api.store[LEASE]["spec"].update(holderIdentity="b", renewTime="2026-01-01T00:00:01.000000Z")
    threading.Thread(target=a.hold, daemon=True).start()
    assert lost.wait(10), "it kept acting on a Lease another replica holds"
    assert not a.leading and holder(api) == "b"


def test_a_renewal_under_way_when_the_lease_is_released_does_not_take_it_back() -> None:
    api = MemoryApi()
    a = Leadership(api, Election(namespace="ops", identity="a", lease_seconds=60, renew_deadline_seconds=40,
                                 retry_seconds=0.01), on_lost=lambda: None)
    a.acquire()
    reading, may_read, real_get = threading.Event(), threading.Event(), api.get

    def get(kind: str, namespace: str, name: str) -> dict:
        if threading.current_thread().name == "lease-renew" and not reading.is_set():
            reading.set()
            may_read.wait(10)
        return real_get(kind, namespace, name)

    api.get = get  # type: ignore[method-assign]
    threading.Thread(target=a.hold, daemon=True).start()
    assert reading.wait(10)
    releasing = threading.Thread(target=a.release)
    releasing.start()
    releasing.join(0.2)  # the release waits for the renewal, or (unordered) runs ahead of its read
    may_read.set()
    releasing.join(10)
    time.sleep(0.1)  # any renewal still to come
    assert holder(api) == ""


class Recorder(BaseHTTPRequestHandler):
    """An HTTP endpoint on loopback that answers every call with an empty object and records it:
    what the Kube sent, and so what it did not."""

    seen: list[str]

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(f"{self.command} {self.path.split('?')[0]}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_PATCH = do_POST = do_DELETE = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def apiserver() -> Iterator[tuple[client.ApiClient, list[str]]]:
    seen: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (Recorder,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")), seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_leader_frozen_past_its_deadline_sends_no_write_when_it_wakes(apiserver) -> None:
    """The deadline thread looks every half second; a process that wakes from a pause has workers
    that may write before it does. The fence applies the deadline at the moment of sending."""
    api_client, seen = apiserver
    api, clock = MemoryApi(), Clock()
    lost: list[str] = []
    a = replica(api, "a", clock, on_lost=lambda: lost.append("lost"))
    a.acquire()
    kube = CachedKube(api_client, ObjectCache({"Pod"}, max_age=60), fence=a.fence)
    switch = kube.sibling("switch")
    clock.now += 5.9  # within the 6 s renew deadline: writes go out
    switch.patch("Pod", "ns", "p", {"metadata": {"labels": {"role": "decode"}}}, uid="u")
    kube.delete("Pod", "ns", "q")
    assert seen == ["PATCH /api/v1/namespaces/ns/pods/p", "DELETE /api/v1/namespaces/ns/pods/q"]
    assert lost == [] and a.leading

    clock.now += 0.2  # frozen: no renewal, and the deadline thread has not run since
    with pytest.raises(Fenced, match="renew deadline; the write was not sent"):
        switch.patch("Pod", "ns", "p", {"metadata": {"labels": {"role": "prefill"}}}, uid="u")
    for write in (lambda: kube.create("Pod", "ns", {"metadata": {"name": "r"}}),
                  lambda: kube.patch("HybridServing", "ns", "f", {"status": {}}, subresource="status"),
                  lambda: kube.server_side_apply("ConfigMap", "ns", {"metadata": {"name": "c"}}),
                  lambda: kube.delete("Pod", "ns", "q")):
        with pytest.raises(Fenced):
            write()
    assert len(seen) == 2, f"a write went out past the deadline: {seen[2:]}"
    assert lost == ["lost"] and not a.leading and a.stopped.is_set()  # stopped once, as the deadline thread would
    kube.get("Pod", "ns", "p")  # reads are not decisions: they still go
    assert seen[-1] == "GET /api/v1/namespaces/ns/pods/p"


def test_a_standby_and_a_replica_that_released_the_lease_write_nothing(apiserver) -> None:
    api_client, seen = apiserver
    api, clock = MemoryApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.acquire()
    assert not b.try_acquire_or_renew()
    with pytest.raises(Fenced):  # b stands by
        Kube(api_client, fence=b.fence).patch("Pod", "ns", "p", {"metadata": {"labels": {}}})
    a.release()
    with pytest.raises(Fenced):  # a handed the Lease over
        Kube(api_client, fence=a.fence).patch("Pod", "ns", "p", {"metadata": {"labels": {}}})
    assert seen == []
    lease = Kube(api_client).unretried("lease", request_timeout=1)
    assert lease.fence is None  # the Lease's own calls are how a replica comes to lead


def test_a_delete_in_flight_when_the_replica_froze_is_not_resent_past_the_deadline() -> None:
    """urllib3 resends a DELETE whose reply timed out, below `Kube._call`: the resend asks the
    fence too. The endpoint holds the first DELETE past the client's timeout while the replica's
    clock runs past its renew deadline, as a pause in mid-call would."""
    api, clock = MemoryApi(), Clock()
    lost: list[str] = []
    a = replica(api, "a", clock, on_lost=lambda: lost.append("lost"))
    a.acquire()
    seen: list[str] = []

    class Stalling(Recorder):
        def do_DELETE(self) -> None:
            if not seen:
                seen.append(f"{self.command} {self.path}")
                clock.now += 6.1
                time.sleep(1.0)  # past the client's 0.3 s read timeout: it gives up on this reply
                return
            self._answer()

    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (Stalling,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}"))
        kube = Kube(api_client, request_timeout=0.3, fence=a.fence)
        with pytest.raises(Fenced):
            kube.delete("Pod", "ns", "q")
        time.sleep(0.2)  # a resend would have arrived by now
        assert seen == ["DELETE /api/v1/namespaces/ns/pods/q"], f"resent past the deadline: {seen[1:]}"
        assert lost == ["lost"] and not a.leading
        assert kube.sibling("switch").api is kube.api  # siblings keep the one fenced pool
        assert kube.unretried("lease", request_timeout=1).api.configuration.retries is False
    finally:
        server.shutdown()
        server.server_close()
