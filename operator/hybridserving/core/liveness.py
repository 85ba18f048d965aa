"""When the operator is alive but no longer works: a reconcile pass or role-switch tick that never
ends, or one that keeps failing.

Both run on threads, and nothing can stop a thread from outside: a pass blocked in a deadlock or a
call without a timeout holds its fleet's key for good (the work queue never runs two passes of one
fleet), and as many of them as there are workers stop every fleet, while the event loop, and with
it the liveness endpoint, goes on as if nothing were wrong. Only a restart frees them, so the
liveness endpoint fails once the oldest of them has run longer than any pass should.

Passes and ticks that end by raising are retried on a back-off, and a restart would not help
them; what they leave undone is said on the fleet instead, once they have failed for a while.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

STUCK_PASS_SECONDS = 600.0
"""Every API call of a pass or tick times out after 30 s and every engine read after 2 s; ten minutes is no pass."""

Work = Literal["reconcile pass", "role-switch tick"]


@dataclass(frozen=True)
class Running:
    """One pass or tick under way: over which fleet, and since when (seconds on a monotonic clock)."""

    namespace: str
    name: str
    work: Work
    started: float


@dataclass(frozen=True)
class StuckPass:
    """The oldest pass or tick, run longer than the limit: what the liveness endpoint answers with."""

    running: Running
    seconds: float
    limit: float

    def describe(self) -> str:
        r = self.running
        return (f"the {r.work} of {r.namespace}/{r.name} has run for {self.seconds:.0f}s "
                f"(a pass running longer than {self.limit:g}s is stuck)")


@dataclass(frozen=True)
class NotRunning:
    """The operator has not started yet (its startup handlers have not finished) or has stopped."""

    def describe(self) -> str:
        return "the operator is not running: starting up or stopped"


Unhealthy = StuckPass | NotRunning


def oldest(running: Iterable[Running]) -> Running | None:
    return min(running, key=lambda r: r.started, default=None)


def oldest_seconds(running: Iterable[Running], now: float) -> float:
    """How long the oldest pass or tick has run; 0 when none runs."""
    first = oldest(running)
    return 0.0 if first is None else max(0.0, now - first.started)


def stuck_pass(running: Iterable[Running], now: float, limit: float) -> StuckPass | None:
    """The oldest pass or tick when it has run longer than `limit` seconds; None when none has, or
    when `limit` is 0 (the check is off)."""
    first = oldest(running)
    if limit <= 0 or first is None or now - first.started <= limit:
        return None
    return StuckPass(first, now - first.started, limit)


FAILING_REPORTED_AFTER_SECONDS = 60.0
"""A pass that raises leaves what status last said in place. One failed pass is an apiserver blip;
passes failing for a minute (five retries on the back-off) mean status no longer describes what
runs, and the fleet says so."""


# What a streak of failures of each kind of work leaves undone.
_CONSEQUENCE: dict[Work, str] = {
    "reconcile pass": "what this status last said is no longer observed",
    "role-switch tick": "no role switch starts, advances or finishes",
}
_PLURAL: dict[Work, str] = {"reconcile pass": "reconcile passes", "role-switch tick": "role-switch ticks"}


@dataclass(frozen=True)
class FailingPasses:
    """The passes (or ticks) over one fleet that have raised in a row: since when (monotonic
    seconds), how many, and the last error."""

    since: float
    passes: int
    error: str
    work: Work = "reconcile pass"

    def reported(self, now: float) -> bool:
        return now - self.since >= FAILING_REPORTED_AFTER_SECONDS

    def describe(self, now: float) -> str:
        noun = self.work if self.passes == 1 else _PLURAL[self.work]
        return (f"{self.passes} {noun} in a row failed over {now - self.since:.0f}s, so "
                f"{_CONSEQUENCE[self.work]}: {self.error}; retried with a growing back-off")


def failed_again(streak: FailingPasses | None, error: str, now: float,
                 work: Work = "reconcile pass") -> FailingPasses:
    """The streak after one more failed pass or tick (a new one when none was running)."""
    if streak is None:
        return FailingPasses(now, 1, error, work)
    return FailingPasses(streak.since, streak.passes + 1, error, work)
