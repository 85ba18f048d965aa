"""Leader election on a coordination.k8s.io Lease: several operator replicas, one acting.

The semantics are client-go's `leaderelection`: the leader renews `spec.renewTime` every
`retry_seconds`; a standby takes the Lease over only when its record has not changed for
`lease_seconds` as measured on the standby's own clock (so clock skew between nodes does not
matter), and only with the resourceVersion it read (a 409 means another replica won). A leader
that could not renew for `renew_deadline_seconds` (< `lease_seconds`) stops at once: acting after
a standby may have taken over is the one thing it must not do, and the restarted process comes
back as a standby. The deadline is watched on its own thread, so a renewal call that hangs does
not postpone it, and the Lease's calls time out well within it (`request_timeout_seconds`), so
the renewals that follow a stuck one still get their chance. A renewal that finds another
replica holding the Lease stops the leader at once: it was frozen past its deadline.

Stopping is not enough for a process that was frozen (a stopped container, a stalled node): on
waking, its workers could send a write before the deadline thread next looks. So every other write
of this replica first passes `fence`, which applies the same deadline at the moment of sending and
refuses the write (and stops the replica) once it has passed. The clock is monotonic, which a
paused VM's may not advance: there the next renewal, finding another holder, stops the replica.
What is left (that, and a write that passes the fence and freezes before it is sent, the window
client-go leaves too) meets the preconditions of the writes that act (kube.py), so a stale
decision is still not applied twice.

A graceful stop releases the Lease (empty holder), so a rolling update hands over at once
(handlers.stop first waits for the work under way).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridserving.controller.kube import Fenced, Kube, KubeError

log = logging.getLogger("hybridserving.controller.leadership")

LEASE_KIND = "Lease"


@dataclass(frozen=True)
class Election:
    """Which Lease decides, who this replica is, and the timing (client-go's defaults: a leader rides
    out an apiserver that does not answer for up to 8 s, as a control-plane upgrade's restart)."""

    namespace: str
    identity: str
    name: str = "hybridserving-operator"
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError("leader election needs retry < renew deadline < lease duration")

    @property
    def request_timeout_seconds(self) -> float:
        """Each Lease call's timeout: a renewal (a GET and a PATCH) that starts on its retry tick
        ends, answered or not, before the renew deadline."""
        return (self.renew_deadline_seconds - self.retry_seconds) / 2

    @property
    def watch_seconds(self) -> float:
        """How often the leader compares its last renewal with the renew deadline."""
        return min(self.retry_seconds, self.lease_seconds - self.renew_deadline_seconds) / 4


def micro_time(at: float) -> str:
    """A MicroTime, as Lease times are written."""
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def exit_now() -> None:
    """Straight to stderr, then out: a log handler that blocks must not keep a replica that lost the
    Lease acting."""
    os.write(2, b"CRITICAL hybridserving.controller.leadership: lost the leader lease; exiting so that no "
                b"decision is made without it\n")
    os._exit(1)


class Leadership:
    """Acquire, hold and release one Lease for one replica."""

    def __init__(self, kube: Kube, election: Election, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, on_lost: Callable[[], None] = exit_now) -> None:
        self.kube = kube
        self.election = election
        self.clock = clock
        self.wall = wall
        self.on_lost = on_lost
        self.leading = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self.stopped = threading.Event()
        self._deciding = threading.Lock()

    # ---- one attempt

    def try_acquire_or_renew(self) -> bool:
        """One read and at most one write; True when this replica holds the Lease afterwards."""
        e = self.election
        now = self.wall()
        try:
            lease = self.kube.get(LEASE_KIND, e.namespace, e.name)
        except KubeError as exc:
            if exc.status != 404:
                raise
            return self._create(now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or e.lease_seconds)
        if holder and holder != e.identity and self.clock() < self._observed_at + duration:
            return False  # another replica holds a lease that has not run out
        taking_over = holder != e.identity
        new = {
            "holderIdentity": e.identity,
            "leaseDurationSeconds": math.ceil(e.lease_seconds),
            "renewTime": micro_time(now),
            "acquireTime": micro_time(now) if taking_over else spec.get("acquireTime") or micro_time(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (1 if taking_over and holder else 0),
        }
        try:
            self.kube.patch(LEASE_KIND, e.namespace, e.name, {"spec": new},
                            resource_version=lease["metadata"]["resourceVersion"])
        except KubeError as exc:
            if exc.conflict:
                return False  # another replica wrote first
            raise
        if taking_over:
            log.info("%s took the lease %s/%s from %r", e.identity, e.namespace, e.name, holder or "nobody")
        return True

    def _create(self, now: float) -> bool:
        e = self.election
        body = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": e.name, "namespace": e.namespace},
            "spec": {"holderIdentity": e.identity, "leaseDurationSeconds": math.ceil(e.lease_seconds),
                     "acquireTime": micro_time(now), "renewTime": micro_time(now), "leaseTransitions": 0},
        }
        try:
            self.kube.create(LEASE_KIND, e.namespace, body)
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        log.info("%s created the lease %s/%s", e.identity, e.namespace, e.name)
        return True

    def _attempt(self) -> bool:
        """One attempt; any failure counts as not holding the Lease, so that a surprise (a malformed
        Lease, say) neither leaves a standby waiting for good nor ends a leader's renewals: both
        retry, and a leader still stops at its renew deadline."""
        try:
            return self.try_acquire_or_renew()
        except KubeError as exc:
            log.warning("lease %s/%s: %s", self.election.namespace, self.election.name, exc)
            return False
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("lease %s/%s", self.election.namespace, self.election.name)
            return False

    # ---- the loops

    def acquire(self) -> None:
        """Block until this replica leads (standby until then) or is stopped (`leading` tells which)."""
        waiting_logged = False
        while not self.stopped.is_set():
            with self._deciding:  # release() waits for an attempt under way, so it sees what it won
                if self.stopped.is_set():
                    return
                started = self.clock()
                if self._attempt():
                    self.leading = True
                    self._renewed_at = started
                    return
            if not waiting_logged:
                log.info("standing by: the lease %s/%s is held by %s", self.election.namespace,
                         self.election.name, (self._observed or ("?",))[0])
                waiting_logged = True
            self.stopped.wait(self.election.retry_seconds)

    def hold(self) -> None:
        """Renew until stopped; once the last renewal is older than the renew deadline, give up
        leadership (on_lost), even while a renewal call still hangs."""
        threading.Thread(target=self._renew, name="lease-renew", daemon=True).start()
        while not self.stopped.wait(self.election.watch_seconds):
            if self.clock() - self._renewed_at > self.election.renew_deadline_seconds:
                self._lose()
                return

    def _renew(self) -> None:
        """Renew every retry period; a renewal counts from when it started, as its renewTime does.
        Renewals take turns with release(), so one under way cannot take back a Lease just handed
        over; a Lease another replica holds means this one was frozen past its deadline (a paused
        VM, say) and must stop before its next write."""
        while not self.stopped.wait(self.election.retry_seconds):
            with self._deciding:
                if self.stopped.is_set():
                    return
                started = self.clock()
                renewed = self._attempt()
                if renewed:
                    self._renewed_at = started
            if not renewed and self._observed and self._observed[0] not in ("", self.election.identity):
                self._lose()
                return

    def fence(self) -> None:
        """Let a write through only while this replica leads within its renew deadline, on the
        clock the deadline thread reads; past it, stop as that thread would and refuse the write."""
        if self.leading and self.clock() - self._renewed_at <= self.election.renew_deadline_seconds:
            return
        if self.leading:
            self._lose()
        raise Fenced(f"{self.election.identity} does not hold the lease {self.election.namespace}/"
                     f"{self.election.name} within its renew deadline; the write was not sent")

    def _lose(self) -> None:
        self.leading = False
        self.stopped.set()
        self.on_lost()

    def release(self) -> None:
        """Hand the Lease back on a graceful stop, so that a standby takes it at once."""
        self.stopped.set()
        with self._deciding:
            if not self.leading:
                return
            e = self.election
            try:
                lease = self.kube.get(LEASE_KIND, e.namespace, e.name)
                if (lease.get("spec") or {}).get("holderIdentity") == e.identity:
                    self.kube.patch(LEASE_KIND, e.namespace, e.name,
                                    {"spec": {"holderIdentity": "", "leaseDurationSeconds": 1}},
                                    resource_version=lease["metadata"]["resourceVersion"])
                    log.info("%s released the lease %s/%s", e.identity, e.namespace, e.name)
            except KubeError as exc:
                log.warning("lease not released: %s", exc)
            self.leading = False
