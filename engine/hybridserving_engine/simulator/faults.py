"""Faults a test can inject into a simulator: crash, slowness, a hung scheduler, a refused or failed role switch.

The launcher and the role-switch controller must survive each of these on real engines; the
simulator produces them on demand, from `HYBRIDSERVING_SIM_FAULTS` at start-up or from
`POST /sim/faults` at run time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Faults:
    crash_on_start: bool = False
    """Exit with status 1 before serving: a crash loop for the launcher's supervision."""
    crash_after_s: float | None = None
    """Exit with status 1 this many seconds after start-up."""
    slow_factor: float = 1.0
    """Multiply every forward pass and transfer: a degraded GPU or link."""
    stall_scheduler: bool = False
    """The scheduler makes no more progress (a collective that never returns, a wedged GPU) while
    the HTTP server still answers: passes in flight and new requests wait until it is cleared, or
    until SGLang's scheduler watchdog kills a server stalled mid-batch (`--watchdog-timeout`)."""
    refuse_switch: bool = False
    """Refuse `/pd_role_switch` with safe_to_restore=true, as a busy or unprepared engine does."""
    fail_rebuild: bool = False
    """Let `/pd_role_switch` fail during the rebuild: the instance turns unhealthy for good."""

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """Read `crash_on_start,crash_after=5,slow=2,stall_scheduler,refuse_switch,fail_rebuild` (any subset)."""
        faults = cls()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, value = item.partition("=")
            faults.update({name: value or True})
        return faults

    def update(self, changes: dict[str, Any]) -> None:
        aliases = {"slow": "slow_factor", "crash_after": "crash_after_s"}
        for name, value in changes.items():
            field = aliases.get(name, name)
            if field in ("slow_factor", "crash_after_s"):
                setattr(self, field, None if value is None else float(value))
            elif field in ("crash_on_start", "stall_scheduler", "refuse_switch", "fail_rebuild"):
                setattr(self, field, value in (True, "1", "true", "True"))
            elif field != "crash":
                raise ValueError(f"unknown fault {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
