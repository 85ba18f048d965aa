"""The writes a planning step asks for, each with a typed cause and a message for people.

Metrics, Events and alerts key on `Cause`; the human-readable `reason` says the same in
words (which object, which role, which failure) and may change wording at any time.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

Verb = Literal["create", "patch", "delete"]


class Cause(str, Enum):
    """Why a write is planned. Values are metric label values: stable, lowercase, hyphenated."""

    MISSING = "missing"
    """An object of the plan does not exist (a ConfigMap, a Service, a rank of a running gang)."""
    DRIFT = "drift"
    """An object differs from the plan (edited by someone, or the plan changed in place)."""
    SCALE_UP = "scale-up"
    """A new instance joins the fleet."""
    SCALE_DOWN = "scale-down"
    """An instance the fleet no longer wants goes."""
    ROLLOUT = "rollout"
    """An instance, and then its pods, moves to a new configuration."""
    ROLE_SWITCH = "role-switch"
    """The pods of a switched instance follow its new role in place (relabelled, not recreated)."""
    GANG_RESTART = "gang-restart"
    """A broken gang (a failed, restarted or lost rank) is recreated whole."""
    BACK_OFF_RESET = "back-off-reset"
    """A gang that has served for 10 minutes forgets its restarts in a row (`core.backoff`)."""
    PRUNE = "prune"
    """An object the fleet owns that is no longer part of the plan."""


# Which cause names an action with several (an instance patch that rolls or adopts a switch
# and restarts a broken gang at once): the most disruptive first.
_PRECEDENCE = (Cause.GANG_RESTART, Cause.ROLLOUT, Cause.ROLE_SWITCH, Cause.SCALE_UP, Cause.SCALE_DOWN,
               Cause.MISSING, Cause.DRIFT, Cause.BACK_OFF_RESET, Cause.PRUNE)


@dataclass(frozen=True)
class Action:
    """One API write, why (typed, `causes`) and why in words (`reason`)."""

    verb: Verb
    kind: str
    name: str
    causes: tuple[Cause, ...]
    reason: str
    body: dict[str, Any] | None = None
    # Preconditions: the delete applies to this uid only; a patch to this resourceVersion only.
    uid: str | None = None
    resource_version: str | None = None

    def __post_init__(self) -> None:
        if not self.causes:
            raise ValueError(f"{self.verb} {self.kind}/{self.name}: an action needs a cause")

    @property
    def cause(self) -> Cause:
        """The cause that names the action (Events, metrics): the most disruptive of its causes."""
        return min(self.causes, key=_PRECEDENCE.index)

    def __str__(self) -> str:
        return f"{self.verb} {self.kind}/{self.name}: {self.reason}"
