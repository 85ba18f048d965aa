"""Gang restart back-off: a gang that keeps failing is restarted less and less often.

A broken gang is recreated whole (`health.InstanceView.failure`). One whose pod fails again
right after each start would otherwise be recreated every few seconds, churning pods, the
scheduler and the nodes' GPUs, while status only ever read "restarting". The operator backs
off as the kubelet does for a container (CrashLoopBackOff, pkg/kubelet/kuberuntime): the first
restart comes at once, each further one in a row waits twice as long as the one before, from
10 s up to 5 minutes, counted from the previous restart. A gang that has served (every pod
Ready) for 10 minutes forgets its restarts.

The count and the time of the last restart live on the instance, in the annotation
`hybridserving.io/gang-restarts`, written by the patch that restarts the gang, so an operator
that restarts (or a new leader) goes on backing off where the last one was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hybridserving.core.observed import format_time, parse_time

ANNOTATION_GANG_RESTARTS = "hybridserving.io/gang-restarts"

INITIAL_DELAY_SECONDS = 10.0
MAX_DELAY_SECONDS = 300.0
# Ready this long, the gang's restarts are forgotten (the kubelet forgets a container's after
# twice its cap without an exit).
FORGET_AFTER_READY_SECONDS = 600.0


@dataclass(frozen=True)
class GangRestarts:
    """The restarts of a gang in a row, and when the last of them was made (seconds since the epoch)."""

    count: int
    last: float

    def to_annotation(self) -> str:
        return json.dumps({"count": self.count, "lastRestart": format_time(self.last)}, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, value: str | None) -> GangRestarts | None:
        """The record an annotation holds; None when there is none or it cannot be read (edited by
        hand): the next restart then comes at once and writes a fresh one."""
        if not value:
            return None
        try:
            raw = json.loads(value)
            count, last = int(raw["count"]), parse_time(raw["lastRestart"])
        except (ValueError, TypeError, KeyError):
            return None
        if count < 1 or last is None:
            return None
        return cls(count, last)


def restarted(restarts: GangRestarts | None, now: float) -> GangRestarts:
    """The record once the gang restarts at `now`: one more in a row."""
    return GangRestarts((restarts.count if restarts else 0) + 1, now)


def looping(restarts: GangRestarts | None) -> bool:
    """Whether a gang is in a restart loop: restarted again after its first restart in a row, so
    each restart since came when a back-off had run out (the kubelet's CrashLoopBackOff after a
    container's second exit). A gang in its loop is reported so until it is Ready again, also
    while a restarted gang starts: status does not flip at every restart."""
    return restarts is not None and restarts.count > 1


def delay(count: int) -> float:
    """How long after the last of `count` restarts in a row the next one waits: none after none,
    then 10 s, 20 s, 40 s, … up to 5 minutes."""
    if count < 1:
        return 0.0
    return min(MAX_DELAY_SECONDS, INITIAL_DELAY_SECONDS * 2.0 ** min(count - 1, 16))


def retry_at(restarts: GangRestarts | None) -> float | None:
    """When the gang may restart next; None: at once."""
    if restarts is None:
        return None
    return restarts.last + delay(restarts.count)


def wait(restarts: GangRestarts | None, now: float) -> float:
    """Seconds a broken gang waits before its next restart (0: it restarts now)."""
    at = retry_at(restarts)
    return 0.0 if at is None else max(0.0, at - now)


def forget_in(ready_since: float, now: float) -> float:
    """Seconds until a gang Ready since `ready_since` has served long enough to forget its
    restarts (0: it has)."""
    return max(0.0, ready_since + FORGET_AFTER_READY_SECONDS - now)
