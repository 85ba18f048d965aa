"""The controllers compared in the fleet simulator: ours and the peers' policies, as published.

Each sees the same per-instance metrics and pays the same switch costs (unless its point is not
to: the zero-cost relabel is an upper reference). Their tuning knobs are swept by the benchmark.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Sequence

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.api.v1alpha1 import Role
from hybridserving.core.policy import (
    Decision,
    FleetScaler,
    ScaleAction,
    ScalerMemory,
    InstanceMetrics,
    InstanceState,
    PolicyConfig,
    PolicyMemory,
    RoleDemand,
    RoleSwitchPolicy,
    measure_demand,
    other_role,
    projected_decode_pressure,
    projected_prefill_pressure,
)


@dataclass
class PolicyController:
    """Ours: `core.policy` ticking with its memory, starting up to `max_concurrent` switches a tick."""

    policy: RoleSwitchPolicy
    name: str = "ours"
    memory: PolicyMemory = field(default_factory=PolicyMemory)

    def tick(self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]) -> list[Decision]:
        if self.memory.smoothed_at is None:
            self.policy = declare_first_split(self.policy, fleet)
        decisions, self.memory = self.policy.decide_all(now, fleet, metrics, self.memory)
        return decisions


def declare_first_split(policy: RoleSwitchPolicy, fleet: Sequence[InstanceState]) -> RoleSwitchPolicy:
    """The split a simulated fleet starts at is its declared one (in the operator, the spec's
    replicas), unless the policy was given one."""
    up = [s for s in fleet if s.phase != "down"]
    if policy.config.declared_prefill_share is not None or not up:
        return policy
    share = sum(1 for s in up if s.role == "prefill") / len(up)
    return replace(policy, config=replace(policy.config, declared_prefill_share=share))


def zero_cost_relabel(model: PerformanceModel, config: PolicyConfig) -> PolicyController:
    """Arrow-style: relabel for free whenever a role is over target (upper reference on cost).

    Arrow flips instances between roles with no switch cost and no hold-down. Here the policy is
    ours, deciding as if a switch took no time, and the fleet it runs (`Runner.dynamic(free=True)`)
    pays none either; Arrow's immediate reaction is `sustain_s=0` with several moves at once,
    and the benchmark sweeps those settings together with every setting ours is swept over.
    Draining is still needed: one engine cannot hold both roles' work in this simulator (Arrow's
    instances keep their running requests across a flip), so this is not a bound on Arrow itself.
    """
    free = replace(model, in_place_switch_s=0.0, relaunch_switch_s=0.0)
    return PolicyController(RoleSwitchPolicy(config, free), name="zero-cost relabel")


@dataclass
class RestartRebalancer:
    """Dynamo-Planner-like: size each role from its load and the per-instance capacity at the SLO.

    Every `interval_s` (Dynamo's throughput adjustment interval) the planner averages each
    role's demand over the last interval (Dynamo's constant predictor: the next interval looks
    like the last one), measured as `core.policy.measure_demand` measures it (prefill: instances'
    worth of busy compute plus backlog; decode: output tokens per second and KV per request), and
    turns it into the instances each role needs with the performance model: the fewest whose
    projected pressure stays at or below `headroom` (1.0 = the per-instance capacity at the SLO
    targets; lower leaves more spare). On a fixed fleet the plan is a split:

    - both needs fit: move an instance only if a role is below its need (never below the other
      role's need, so at low load nothing moves — no role is thinned towards a proportion);
    - they do not fit: move towards the split that minimises the worse role's projected pressure.

    One instance changes per interval, by draining it and relaunching it with the other role's
    flags (the model's restart time); while a change is in flight the planner waits, as
    Dynamo's does, and decides at the first tick after it lands once an interval has passed.
    """

    config: PolicyConfig
    model: PerformanceModel
    interval_s: float = 180.0
    headroom: float = 1.0
    name: str = "restart-based"
    _next_at: float | None = None
    _samples: deque[tuple[float, RoleDemand]] = field(default_factory=deque)

    def tick(self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]) -> list[Decision]:
        self._samples.append((now, measure_demand(fleet, metrics, self.config, self.model)))
        while self._samples and self._samples[0][0] <= now - self.interval_s:
            self._samples.popleft()
        if self._next_at is None:
            self._next_at = now + self.interval_s
        if now < self._next_at or any(s.phase != "serving" for s in fleet):
            return []
        self._next_at = now + self.interval_s
        demand = self.predicted_demand()
        n = sum(1 for s in fleet if s.phase == "serving")
        have = _count(fleet, "prefill")
        want = self.target_prefill(demand, n, have)
        if want == have:
            return []
        receiver: Role = "prefill" if want > have else "decode"
        donor = _least_loaded(fleet, metrics, other_role(receiver), floor=self._floor(other_role(receiver)))
        if donor is None:
            return []
        need_p, need_d = self.needs(demand, n)
        return [
            Decision(
                donor.name,
                donor.role,
                receiver,
                "relaunch",
                f"planned split {want}:{n - want} (needs prefill {need_p}, decode {need_d}) from {have}:{n - have}",
                0.0,
            )
        ]

    def predicted_demand(self) -> RoleDemand:
        """Each role's demand averaged over the last interval (the next interval's prediction)."""
        samples = [d for _, d in self._samples]
        if not samples:
            return RoleDemand(0.0, 0.0, 0.0)
        per_request = [d.decode_tokens_per_request for d in samples if d.decode_tokens_per_request > 0]
        return RoleDemand(
            prefill_load=sum(d.prefill_load for d in samples) / len(samples),
            decode_tokens_per_s=sum(d.decode_tokens_per_s for d in samples) / len(samples),
            decode_tokens_per_request=sum(per_request) / len(per_request) if per_request else 0.0,
        )

    def pressure(self, role: Role, demand: RoleDemand, instances: int) -> float:
        if role == "prefill":
            return projected_prefill_pressure(demand, instances, self.config)
        return projected_decode_pressure(demand, instances, self.config, self.model)

    def need(self, role: Role, demand: RoleDemand, n: int) -> int | None:
        """The fewest instances (at least the role's floor) that carry its demand within the
        headroom; None when even `n` do not."""
        for k in range(max(1, self._floor(role)), n + 1):
            if self.pressure(role, demand, k) <= self.headroom:
                return k
        return None

    def needs(self, demand: RoleDemand, n: int) -> tuple[int | None, int | None]:
        return self.need("prefill", demand, n), self.need("decode", demand, n)

    def target_prefill(self, demand: RoleDemand, n: int, have: int) -> int:
        """The planned prefill count: within both needs if they fit, else the minimax split."""
        lo, hi = self._floor("prefill"), n - self._floor("decode")
        if hi < lo:
            return have
        need_p, need_d = self.needs(demand, n)
        if need_p is not None and need_d is not None and need_p + need_d <= n:
            return min(max(have, need_p), n - need_d)
        worst = {
            k: max(self.pressure("prefill", demand, k), self.pressure("decode", demand, n - k))
            for k in range(lo, hi + 1)
        }
        return min(worst, key=lambda k: (round(worst[k], 9), abs(k - have)))

    def _floor(self, role: Role) -> int:
        return self.config.min_prefill if role == "prefill" else self.config.min_decode


@dataclass
class SplitwiseMixedPool:
    """Splitwise's mixed pool: borrow an instance when even the least-loaded prefill instance has
    more than a threshold of prompt tokens queued (8,192 in the paper), or when decode memory is
    full (a request finds no decode instance with room), and hand it back once the trigger has
    cleared and it is idle.

    As in Splitwise's scheduler (`MixedPoolScheduler`), the trigger is per instance — the best
    prefill instance's queue, not the sum over the pool — and one instance is borrowed per need:
    in Splitwise the borrowed machine takes the next request at once (mixed batching); here it
    must drain and switch first, so no second instance is borrowed for a role while one is on its
    way to it (it would be borrowed for the same queue). A borrowed decode instance is taken only
    if the decode instances left can hold the KV in use (in Splitwise it keeps its own decode
    work, so borrowing never frees decode memory). Returning is not free here as it is in
    Splitwise (a drain and a switch each time), so a borrowed instance goes home only after the
    trigger has stayed clear for `return_hold_s` (0: the paper's rule, return as soon as idle).

    Borrowing uses the same in-place switch as ours; the rule, not the mechanism, is compared.
    """

    config: PolicyConfig
    queue_threshold_tokens: int = 8192
    kv_full: float = 0.98
    return_hold_s: float = 0.0
    name: str = "splitwise mixed pool"
    home: dict[str, Role] = field(default_factory=dict)
    _clear_since: float | None = None

    def tick(self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]) -> list[Decision]:
        for s in fleet:
            self.home.setdefault(s.name, s.role)
        serving = [s for s in fleet if s.phase == "serving"]
        prefill = [metrics[s.name] for s in serving if s.role == "prefill"]
        decode = [metrics[s.name] for s in serving if s.role == "decode"]
        prefill_hot = bool(prefill) and min(m.prefill_queue_tokens for m in prefill) > self.queue_threshold_tokens
        kv_full = bool(decode) and (
            min(m.kv_usage for m in decode) >= self.kv_full or any(m.prealloc_queue_reqs for m in decode)
        )
        if prefill_hot or kv_full:
            self._clear_since = None
        if prefill_hot != kv_full:
            wants: Role = "prefill" if prefill_hot else "decode"
            if any(s.phase != "serving" and s.target_role == wants for s in fleet):
                return []  # the instance borrowed for this need has not landed yet
            if (
                wants == "prefill"
                and len(decode) > 1
                and sum(m.kv_usage for m in decode) / (len(decode) - 1) >= self.kv_full
            ):
                return []  # the decode instances left could not hold the KV in use
            donor = _least_loaded(fleet, metrics, other_role(wants), floor=self._floor(other_role(wants)))
            return [Decision(donor.name, donor.role, wants, "in-place", "mixed pool borrow", 0.0)] if donor else []
        if prefill_hot or kv_full:
            return []
        # Trigger clear: once it has stayed clear for the hold, return one idle borrowed instance home.
        if self._clear_since is None:
            self._clear_since = now
        if now - self._clear_since < self.return_hold_s:
            return []
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


@dataclass
class ScalingPlanner:
    """Ours with scaling on: the role-switch policy moves instances between roles (seconds) and
    `core.policy.FleetScaler`, on the same smoothed demand, launches or removes instances when
    the total is short or in surplus. An instance the policy moves this tick is not removed."""

    policy: RoleSwitchPolicy
    scaler: FleetScaler
    name: str = "ours+scaling"
    memory: PolicyMemory = field(default_factory=PolicyMemory)
    scaler_memory: ScalerMemory = field(default_factory=ScalerMemory)

    def tick(
        self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]
    ) -> list[Decision | ScaleAction]:
        if self.memory.smoothed_at is None:
            self.policy = declare_first_split(self.policy, fleet)
        decisions, self.memory = self.policy.decide_all(now, fleet, metrics, self.memory)
        moving = {d.instance for d in decisions}
        rest = [s for s in fleet if s.name not in moving]
        actions, self.scaler_memory = self.scaler.decide(
            now, rest, metrics, self.policy.demand_of(self.memory), self.scaler_memory
        )
        return [*decisions, *actions]


@dataclass
class PlannerStyleScaler:
    """Dynamo-Planner-style scaling: every `interval_s`, each role's demand over the last interval
    (the constant predictor) gives the instances it needs at `headroom`; each role moves by at
    most ±1 instance per interval towards its need (a launch pays the pod start and weight load,
    a removal drains first), and the planner blocks while a change is in flight."""

    config: PolicyConfig
    model: PerformanceModel
    max_instances: int
    interval_s: float = 180.0
    headroom: float = 0.85
    name: str = "planner-style scaler"
    _rebalancer: RestartRebalancer | None = None
    _next_at: float | None = None

    def tick(
        self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]
    ) -> list[ScaleAction]:
        if self._rebalancer is None:
            self._rebalancer = RestartRebalancer(
                self.config, self.model, interval_s=self.interval_s, headroom=self.headroom
            )
        rb = self._rebalancer
        rb._samples.append((now, measure_demand(fleet, metrics, self.config, self.model)))
        while rb._samples and rb._samples[0][0] <= now - self.interval_s:
            rb._samples.popleft()
        if self._next_at is None:
            self._next_at = now + self.interval_s
        if now < self._next_at or any(s.phase not in ("serving", "down") for s in fleet):
            return []
        self._next_at = now + self.interval_s
        demand = rb.predicted_demand()
        down = sorted((s for s in fleet if s.phase == "down"), key=lambda s: s.name)
        actions = []
        for role in ("prefill", "decode"):
            have = _count(fleet, role)
            need = rb.need(role, demand, self.max_instances) or self.max_instances
            if need > have and down:
                slot = down.pop(0)
                actions.append(ScaleAction("add", slot.name, role, f"{role} needs {need}, has {have}"))
            elif need < have:
                victim = _least_loaded(fleet, metrics, role, floor=rb._floor(role))
                if victim is not None:
                    actions.append(ScaleAction("remove", victim.name, role, f"{role} needs {need}, has {have}"))
        return actions
