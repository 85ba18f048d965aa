"""The controllers compared in the fleet simulator: ours and the peers' policies, as published.

Each sees the same per-instance metrics and pays the same switch costs (unless its point is not
to: the zero-cost relabel is an upper reference). Their tuning knobs are swept by the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.core.policy import (
    Decision,
    InstanceMetrics,
    InstanceState,
    PolicyConfig,
    PolicyMemory,
    Role,
    RoleSwitchPolicy,
    other_role,
    role_pressures,
)


@dataclass
class PolicyController:
    """Ours: `core.policy` ticking with its memory, starting up to `max_concurrent` switches a tick."""

    policy: RoleSwitchPolicy
    name: str = "ours"
    memory: PolicyMemory = field(default_factory=PolicyMemory)

    def tick(self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]) -> list[Decision]:
        decisions, self.memory = self.policy.decide_all(now, fleet, metrics, self.memory)
        return decisions


def zero_cost_relabel(model: PerformanceModel, config: PolicyConfig) -> PolicyController:
    """Arrow-style: relabel at once, for free, whenever a role is over target (upper reference).

    Arrow flips instances between roles with no switch cost and no hold-down; here the switch
    takes zero seconds, pressure need not be sustained, and the horizon is only the tick-level
    cooldown, so the controller reacts to every imbalance. Draining is still needed: one engine
    cannot hold both roles' work in this simulator.
    """
    free = replace(model, in_place_switch_s=0.0, relaunch_switch_s=0.0)
    cfg = replace(config, sustain_s=0.0, max_concurrent=max(config.max_concurrent, 4))
    return PolicyController(RoleSwitchPolicy(cfg, free), name="zero-cost relabel")


@dataclass
class RestartRebalancer:
    """Dynamo-Planner-like: every `interval_s`, move one instance towards the load-proportional split.

    The move drains the instance and relaunches it with the other role's flags (the model's
    restart time); while a move is in flight the planner waits, as Dynamo's does.
    """

    config: PolicyConfig
    model: PerformanceModel
    interval_s: float = 300.0
    name: str = "restart-based"
    _next_at: float = 0.0

    def tick(self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]) -> list[Decision]:
        if now < self._next_at:
            return []
        self._next_at = now + self.interval_s
        if any(s.phase != "serving" for s in fleet):
            return []
        receiver = _load_proportional_receiver(fleet, metrics, self.config, self.model)
        if receiver is None:
            return []
        donor = _least_loaded(fleet, metrics, other_role(receiver))
        if donor is None:
            return []
        return [Decision(donor.name, donor.role, receiver, "relaunch", "load-proportional split", 0.0)]


@dataclass
class SplitwiseMixedPool:
    """Splitwise's mixed pool: borrow an instance when the prefill queue passes a token threshold
    (8,192 in the paper) or decode memory is full, and hand it back once the trigger has cleared.

    Borrowing uses the same in-place switch as ours; the rule, not the mechanism, is compared.
    """

    config: PolicyConfig
    queue_threshold_tokens: int = 8192
    kv_full: float = 0.98
    name: str = "splitwise mixed pool"
    home: dict[str, Role] = field(default_factory=dict)

    def tick(self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]) -> list[Decision]:
        for s in fleet:
            self.home.setdefault(s.name, s.role)
        serving = [s for s in fleet if s.phase == "serving"]
        queued = sum(metrics[s.name].prefill_queue_tokens for s in serving if s.role == "prefill")
        decode = [metrics[s.name] for s in serving if s.role == "decode"]
        kv_full = bool(decode) and (
            min(m.kv_usage for m in decode) >= self.kv_full or any(m.prealloc_queue_reqs for m in decode)
        )
        prefill_hot = queued > self.queue_threshold_tokens
        wants: Role | None = "prefill" if prefill_hot and not kv_full else "decode" if kv_full and not prefill_hot else None
        if wants is not None:
            donor = _least_loaded(fleet, metrics, other_role(wants), floor=self._floor(other_role(wants)))
            return [Decision(donor.name, donor.role, wants, "in-place", "mixed pool borrow", 0.0)] if donor else []
        # Trigger clear: return one borrowed instance home.
        for s in serving:
            home = self.home[s.name]
            if home != s.role and _count(fleet, s.role) - 1 >= self._floor(s.role):
                m = metrics[s.name]
                idle = m.prefill_queue_tokens == 0 if s.role == "prefill" else m.kv_usage < self.kv_full / 2
                if idle:
                    return [Decision(s.name, s.role, home, "in-place", "mixed pool return", 0.0)]
        return []

    def _floor(self, role: Role) -> int:
        return self.config.min_prefill if role == "prefill" else self.config.min_decode


def _count(fleet: Sequence[InstanceState], role: Role) -> int:
    return sum(1 for s in fleet if s.role == role and s.phase == "serving")


def _least_loaded(
    fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics], role: Role, floor: int = 1
) -> InstanceState | None:
    serving = [s for s in fleet if s.role == role and s.phase == "serving" and not s.pinned]
    if _count(fleet, role) - 1 < floor or not serving:
        return None

    def load(s: InstanceState) -> tuple[float, str]:
        m = metrics[s.name]
        return (m.prefill_queue_tokens if role == "prefill" else m.kv_usage + m.running_reqs * 1e-6, s.name)

    return min(serving, key=load)


def _load_proportional_receiver(
    fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics], config: PolicyConfig, model: PerformanceModel
) -> Role | None:
    """The role that is short of instances against a split proportional to each role's load."""
    pressures = role_pressures(fleet, metrics, config, model)
    load = {r: p.pressure * p.serving for r, p in pressures.items()}
    total = load["prefill"] + load["decode"]
    n = pressures["prefill"].serving + pressures["decode"].serving
    if total <= 0:
        return None
    want_prefill = min(n - config.min_decode, max(config.min_prefill, round(n * load["prefill"] / total)))
    have = pressures["prefill"].serving
    if want_prefill > have:
        return "prefill"
    if want_prefill < have:
        return "decode"
    return None
