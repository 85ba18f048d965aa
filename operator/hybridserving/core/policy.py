"""Which instance should change role, and when: the role-switch policy.

A switch is never free: the donor instance drains (it stops taking work and finishes what it
holds), then rebuilds in place (seconds) or relaunches (minutes), and meanwhile serves nothing.
So the policy measures each role's load as a demand that can be projected onto any number of
instances with the performance model (prefill: busy compute plus queued work, a fluid queue;
decode: token throughput and resident KV, solved for the batch each instance would run, which
is where the KV and TPOT cliff shows), smooths it (EWMA), and moves instances only when

- one role has been under sustained pressure (enter high, exit lower, for a window),
- the donor role, projected onto one instance fewer (or several), stays clearly within its SLO,
- the move lowers the worse of the two roles' projected pressure, and
- the overload it removes over the cooldown outweighs the capacity the drain and switch take.

Moves are sized (several instances when the imbalance is large, up to `max_concurrent`), the
cooldown is per instance, and moving back is allowed when the mix clearly reverses (stricter
evidence than the first move, so noise does not flap). Prefill is judged at its recent peak as
well as its mean: TTFT is set by bursts of long prompts, which a mean hides. Once no role has
been under pressure for a cooldown, instances go back one at a time toward the declared split
(the roles' replicas): a move answers the load that caused it, and a fleet left at the split of
the last burst meets the next one with the wrong roles (agentic waves: prefill-heavy as a wave
opens, KV-heavy as it proceeds, idle between). A role below its declared count recalls an
instance sooner, as soon as it nears its target on the instances it kept.

Everything here is a pure, deterministic function of its arguments: the caller keeps the small
`PolicyMemory` between ticks (in status, in the simulator) and passes it back in.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, Mapping, Sequence

from hybridserving.api.v1alpha1 import Role
from hybridserving.core.perfmodel import PerformanceModel, SwitchMode

Phase = Literal["serving", "draining", "switching", "down"]


def other_role(role: Role) -> Role:
    return "decode" if role == "prefill" else "prefill"


@dataclass(frozen=True)
class InstanceMetrics:
    """What one engine reports (SGLang `/metrics` and `/v1/loads`, every DP rank), reduced to what
    the policy reads (`controller/engines.instance_metrics`)."""

    role: Role
    prefill_queue_reqs: int = 0
    """Requests in the waiting queues (`queues.waiting`), the queue whose prompts
    `prefill_queue_tokens` counts: not a prefill's bootstrap queue, whose requests have no tokens there."""
    prefill_queue_tokens: int = 0
    """Uncached prompt tokens waiting for prefill (`num_waiting_uncached_tokens`; 0 on decode)."""
    utilization: float = 0.0
    """Fraction of the recent interval the GPUs spent in forward passes that do work: the rate of
    `sglang:forward_execution_seconds_total` (without its "idle" category) over the interval,
    averaged over the engine's scheduler processes. Not `sglang:utilization`, which 0.5.23 leaves
    at -1 on prefill and 0 elsewhere (`managers/scheduler_components/metrics_reporter.py:1303-1315`)."""
    kv_usage: float = 0.0
    """KV pool in use, 0..1 (`token_usage`, weighted by each DP rank's pool)."""
    prealloc_queue_reqs: int = 0
    """Requests waiting for decode KV slots (`decode_prealloc_queue_reqs`): the latency cliff."""
    running_reqs: int = 0
    """Requests in the running batches (`num_running_reqs`); a prefill's stays empty
    (`managers/scheduler_components/metrics_reporter.py:854-855`)."""
    tpot_p90_s: float | None = None
    """Recent TPOT p90 (`sglang:request_time_per_output_token_seconds`), decode only. No TTFT: a
    PD prefill never observes it, and a decode's mixes prefill queueing with waits for its own KV
    slots (`managers/tokenizer_manager.py:3235-3247`), so it would blame either role for the other."""
    output_tokens_per_request: float | None = None
    """Mean output length of recently finished requests: the rate of SGLang's
    `sglang:generation_tokens_total` over that of `sglang:num_requests_total` (both counters
    real SGLang exports by default, `observability/metrics_collector.py:1860-1943`); None until a
    request finished."""


@dataclass(frozen=True)
class InstanceState:
    """What the controller knows about one instance besides its metrics."""

    name: str
    role: Role
    phase: Phase = "serving"
    target_role: Role | None = None
    """The role a draining or switching instance is moving to."""
    last_switch_at: float | None = None
    pinned: bool = False
    in_place: bool = True
    """The layout allows `/pd_role_switch`; otherwise the switch relaunches the engine."""
    restoring: bool = False
    """Down because a switch that did not succeed is putting it back (Restore, Restart): the switch
    is still in flight, and counts against `max_concurrent`."""


@dataclass(frozen=True)
class PolicyConfig:
    """The user's knobs (RoleSwitchSpec, RolloutSpec.paused) plus tuning with documented defaults."""

    enabled: bool = True
    paused: bool = False
    min_prefill: int = 1
    min_decode: int = 1
    cooldown_s: float = 300.0
    max_concurrent: int = 1
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.050
    # Tuning (swept in benchmarks/bench_role_switch.py; see docs/role-switch-policy.md).
    enter_pressure: float = 1.0
    """A role is under pressure from this normalised load on (1.0 = at its target)."""
    exit_pressure: float = 0.8
    """...until its load falls below this."""
    donor_ceiling: float = 0.85
    """The donor role must stay below this load after giving up one instance."""
    sustain_s: float = 20.0
    """Pressure must hold this long before a switch."""
    target_utilization: float = 0.85
    """Prefill busy fraction that counts as full: above it queues, and TTFT, grow fast."""
    target_kv_usage: float = 0.90
    """Decode KV usage that counts as full: above it new requests start to wait for slots."""
    typical_output_tokens: int = 256
    """Used to estimate how long a decode donor takes to drain."""
    smoothing_s: float = 30.0
    """Time constant of the EWMA over each role's measured demand (0: no smoothing)."""
    target_tpot_fraction: float = 0.90
    """Decode step time that counts as full, as a fraction of the TPOT limit."""
    min_improvement: float = 0.05
    """A move must lower the worse role's projected pressure by at least this much."""
    reversal_sustain_factor: float = 2.0
    """Moving an instance back within the cooldown of a move the other way needs the pressure
    sustained this many times longer..."""
    reversal_margin: float = 0.10
    """...and the donor projected this far below `donor_ceiling` (a clear reversal, not noise)."""
    settle_after_landing: bool = True
    """The receiver's pressure must be sustained anew after an instance lands in it."""
    overload_split_in_reversal: bool = False
    """Whether a reversal may take the donor past its ceiling when both roles are overloaded."""
    acute_sustain_s: float = 10.0
    """A clear, large overload needs to hold only this long (0: no fast path): every prefill
    instance's queue alone takes longer than `acute_queue_factor` × the TTFT limit (new prompts
    go to the least-loaded one, so its queue bounds TTFT), or requests wait for decode KV slots."""
    acute_queue_factor: float = 1.0
    acute_kv_wait_fraction: float = 0.5
    """Requests waiting for decode KV are an acute overload when the newest one's estimated wait
    exceeds this fraction of the TTFT limit (the rest of the budget is prefill's)."""
    burst_memory_s: float = 60.0
    """Prefill's need is its recent peak load, which decays with this time constant (0: the
    smoothed mean alone). TTFT is set by bursts of long prompts, which a mean hides."""
    recall_pressure: float = 0.8
    """A role below its declared count gets an instance back at once when it reaches this
    pressure on the instances it has (it lent one; it does not wait to be overloaded)."""
    declared_prefill_share: float | None = None
    """Prefill's share of the fleet in the spec (its replicas over both roles'): the split the
    fleet returns to once quiet. None: the fleet stays wherever the last move left it."""

    @classmethod
    def from_spec(
        cls, role_switch: Any, paused: bool = False, declared_prefill_share: float | None = None, **tuning: Any
    ) -> PolicyConfig:
        """From the API's RoleSwitchSpec (duck-typed, so the core does not import the API)."""
        return cls(
            enabled=role_switch.enabled,
            paused=paused,
            declared_prefill_share=declared_prefill_share,
            min_prefill=role_switch.min_prefill,
            min_decode=role_switch.min_decode,
            cooldown_s=float(role_switch.cooldown_seconds),
            max_concurrent=role_switch.max_concurrent,
            ttft_slo_s=role_switch.slo.ttft_ms / 1000.0,
            tpot_slo_s=role_switch.slo.tpot_ms / 1000.0,
            **tuning,
        )


@dataclass(frozen=True)
class PolicyMemory:
    """What the policy carries between ticks: since when each role has been under pressure
    (None: not under pressure) and the smoothed demand of each role.

    All fields are plain floats or None; `to_dict` / `from_dict` round-trip them for status.
    """

    prefill_pressure_since: float | None = None
    decode_pressure_since: float | None = None
    smoothed_at: float | None = None
    """When the demand below was last updated (None: never; the next tick starts it)."""
    prefill_load: float = 0.0
    """Prefill demand in instances' worth of busy compute (queued work included)."""
    decode_tokens_per_s: float = 0.0
    """Decode demand: output tokens per second the role must emit."""
    decode_tokens_per_request: float = 0.0
    """KV tokens one running request holds (its reservation), for the KV and step-time projection."""
    decode_slo: float = 0.0
    """Smoothed TPOT p90 / limit."""
    prefill_backlog_factor: float = 1.0
    """Smoothed prefill demand over what prefill delivers."""
    prefill_acute_since: float | None = None
    """Since when the least-loaded prefill queue alone exceeds the TTFT limit (None: it does not)."""
    decode_acute_since: float | None = None
    """Since when requests wait for decode KV slots longer than the TTFT budget allows (None: they do not)."""
    output_tokens_per_request: float = 0.0
    """Smoothed mean output length (0: not known yet; `typical_output_tokens` stands in)."""
    quiet_since: float | None = None
    """Since when no role has been under pressure, acute or sustained (None: one is)."""
    prefill_peak_load: float = 0.0
    """Prefill's recent peak load in instances' worth: the highest tick, decaying with `burst_memory_s`."""

    def since(self, role: Role) -> float | None:
        return self.prefill_pressure_since if role == "prefill" else self.decode_pressure_since

    def with_since(self, role: Role, value: float | None) -> PolicyMemory:
        if role == "prefill":
            return replace(self, prefill_pressure_since=value)
        return replace(self, decode_pressure_since=value)

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> PolicyMemory:
        """Tolerant of missing and unknown keys (an older status keeps working)."""
        if not data:
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: (None if v is None else float(v)) for k, v in data.items() if k in known})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Decision:
    instance: str
    from_role: Role
    to_role: Role
    mode: SwitchMode
    reason: str
    expected_benefit_s: float
    """Instance-seconds of overload removed over the horizon, net of the switch's cost."""


# --------------------------------------------------------------------------------------------
# Demand that projects onto any instance count


_PRESSURE_CAP = 50.0
"""The least pressure of a role with no instance and some demand (prefill's is this or its load on
one instance, if more), and the bound on decode's (its cliff); prefill's on one or more instances
is linear in its load and not bounded (`projected_prefill_pressure`)."""


@dataclass(frozen=True)
class RoleDemand:
    """Both roles' measured demand, in units that project onto any number of instances."""

    prefill_load: float
    """Instances' worth of prefill compute: Σ utilisation plus queued work beyond half a TTFT,
    spread over one TTFT (a fluid queue: the backlog must drain within the limit)."""
    decode_tokens_per_s: float
    """Output tokens per second decode must emit: measured throughput, inflated by the requests
    waiting for KV slots (the prealloc queue is demand the role is not serving) and by prefill's
    backlog (requests still queued for prefill will reach decode)."""
    decode_tokens_per_request: float
    """KV tokens one running request reserves."""
    decode_slo: float = 0.0
    prefill_backlog_factor: float = 1.0
    """Prefill demand over what it delivers (≥ 1): how much more decode will see once prefill catches up."""
    prefill_peak_load: float = 0.0
    """Prefill's recent peak load (instances' worth); 0 where only the mean is known."""

    def with_bursts(self) -> RoleDemand:
        """Prefill at its recent peak: the load its TTFT has to survive, not its mean."""
        return replace(self, prefill_load=max(self.prefill_load, self.prefill_peak_load))

    def burst_ratio(self) -> float:
        """How far prefill's peak stands above its mean (1..3): what serving its bursts in full
        passes on to decode (every prompt prefilled becomes a request decode holds)."""
        if self.prefill_load <= 0:
            return 1.0
        return min(3.0, max(1.0, self.prefill_peak_load / self.prefill_load))

    def as_donor(self, role: Role) -> RoleDemand:
        """The demand to project `role` with when it gives an instance away: decode's once
        prefill's backlog reaches it (conservative), prefill's as measured."""
        if role == "prefill":
            return self
        return replace(self, decode_tokens_per_s=self.decode_tokens_per_s * self.prefill_backlog_factor)


def measure_demand(
    fleet: Sequence[InstanceState],
    metrics: Mapping[str, InstanceMetrics],
    config: PolicyConfig,
    model: PerformanceModel,
) -> RoleDemand:
    """Demand over every instance holding a role's work (serving, or draining it)."""
    holding = {
        role: [
            metrics[s.name]
            for s in fleet
            if s.role == role and s.phase in ("serving", "draining") and s.name in metrics
        ]
        for role in ("prefill", "decode")
    }
    load = busy = 0.0
    for m in holding["prefill"]:
        backlog = queued_prefill_seconds(m, model)
        busy += m.utilization
        load += m.utilization + max(0.0, backlog - 0.5 * config.ttft_slo_s) / config.ttft_slo_s
    cap = model.kv_capacity_tokens
    running = sum(m.running_reqs for m in holding["decode"])
    waiting = sum(m.prealloc_queue_reqs for m in holding["decode"])
    reserved = sum(m.kv_usage for m in holding["decode"]) * cap
    throughput = 0.0
    for m in holding["decode"]:
        if m.running_reqs:
            throughput += m.running_reqs / model.decode_step_seconds(m.running_reqs, int(m.kv_usage * cap))
    per_request = reserved / running if running else 0.0
    # Waiting requests are demand the role is not serving; counted at most once more than what
    # runs (the queue is a backlog, not a rate: past that, more decode instances drain it anyway).
    tokens = throughput * min(1.5, (running + waiting) / running) if running else 0.0
    # Decode only sees what prefill delivers: while prefill has a backlog, the arrivals behind it
    # are decode demand too, and giving prefill an instance releases them onto decode. Used when
    # decode is the donor (conservative), not when it receives (that would overshoot).
    backlog_factor = min(3.0, max(1.0, load / busy)) if busy > 0 else 1.0
    tpot = [m.tpot_p90_s / config.tpot_slo_s for m in holding["decode"] if m.tpot_p90_s is not None]
    return RoleDemand(
        prefill_load=load,
        decode_tokens_per_s=tokens,
        decode_tokens_per_request=per_request,
        decode_slo=sum(tpot) / len(tpot) if tpot else 0.0,
        prefill_backlog_factor=backlog_factor,
    )


def queued_prefill_seconds(m: InstanceMetrics, model: PerformanceModel) -> float:
    """GPU time the queued prompts need, priced with the model's own compute.

    Prompts of mean length L = tokens / requests each cost the linear work and the attention
    pairs (L²/2) of `prefill_chunk_compute_seconds`: on long prompts the pairs dominate, and a
    per-token price underestimates the backlog by as much as the quadratic term.
    """
    if m.prefill_queue_tokens <= 0:
        return 0.0
    reqs = max(1, m.prefill_queue_reqs)
    return reqs * model.prefill_chunk_compute_seconds(m.prefill_queue_tokens // reqs)


def kv_wait_seconds(metrics: Sequence[InstanceMetrics], model: PerformanceModel, output_tokens: float) -> float:
    """How long the newest request waiting for decode KV slots waits: the queue over the rate at
    which running requests finish (Little's law: each runs `output_tokens` steps)."""
    waiting = sum(m.prealloc_queue_reqs for m in metrics)
    if waiting <= 0:
        return 0.0
    rate = 0.0
    for m in metrics:
        if m.running_reqs:
            step = model.decode_step_seconds(m.running_reqs, int(m.kv_usage * model.kv_capacity_tokens))
            rate += m.running_reqs / (max(1.0, output_tokens) * step)
    return waiting / rate if rate > 0 else math.inf


def projected_prefill_pressure(demand: RoleDemand, instances: int, config: PolicyConfig) -> float:
    """Prefill load per instance over the target utilisation (fluid: compute is linear in instances).

    Not capped: a backlog deep enough to read the cap at both the current count and one more
    (hundreds of thousands of queued tokens on an H200) hid the relief one more instance brings,
    and the role that needed an instance most was refused one. No instance at all is the cap, or
    what one instance would carry if that is more, so fewer instances never project less."""
    if demand.prefill_load <= 0:
        return 0.0
    on_one = demand.prefill_load / config.target_utilization
    return max(_PRESSURE_CAP, on_one) if instances <= 0 else on_one / instances


def projected_decode_batch(demand: RoleDemand, instances: int, model: PerformanceModel) -> float:
    """Requests each of `instances` decode instances would run to emit the demand (inf: cannot).

    Little's law with a step time that grows with the batch: an instance emitting `d` tokens per
    second runs `b = d · step(b)` requests, `step(b) = s0 + g·b`, so `b = d·s0 / (1 − d·g)`.
    As `d·g` approaches 1 the batch (and KV, and TPOT) diverge: the cliff a linear projection
    misses when it takes one decode instance away.
    """
    if demand.decode_tokens_per_s <= 0:
        return 0.0
    if instances <= 0:
        return math.inf
    d = demand.decode_tokens_per_s / instances
    scale = model.time_scale
    s0 = (model.decode_base_s + model.decode_dcp_comm_s) * scale
    g = (model.decode_per_request_s + model.decode_per_context_token_s * demand.decode_tokens_per_request) * scale
    room = 1.0 - d * g
    if room <= 0:
        return math.inf
    return d * s0 / room


def projected_decode_pressure(
    demand: RoleDemand, instances: int, config: PolicyConfig, model: PerformanceModel
) -> float:
    """The worst of KV occupancy, step time (TPOT) and running slots at the projected batch.

    Past the cliff (no finite batch keeps up) the pressure is `1/target + d·g`, still falling as
    instances are added, so the split that hurts least can be found even when every split is
    overloaded. Just short of the cliff the batch, and with it the KV it needs, diverges; a batch
    that only just keeps up is as bad as one that cannot, not worse, so the cliff value also caps
    the finite ones. Without the cap one more instance could project *more* pressure than none
    more, and a decode role past its cliff was refused the instance that would relieve it.
    """
    if demand.decode_tokens_per_s <= 0:
        return 0.0
    if instances <= 0:
        return _PRESSURE_CAP
    b = projected_decode_batch(demand, instances, model)
    g = (
        model.decode_per_request_s + model.decode_per_context_token_s * demand.decode_tokens_per_request
    ) * model.time_scale
    d = demand.decode_tokens_per_s / instances
    cliff = min(_PRESSURE_CAP, 1.0 / min(config.target_kv_usage, config.target_tpot_fraction) + d * g)
    if math.isinf(b):
        return cliff
    kv = b * demand.decode_tokens_per_request / model.kv_capacity_tokens / config.target_kv_usage
    step = model.decode_step_seconds(1, 0) + g * (b - 1)
    tpot = step / (config.tpot_slo_s * config.target_tpot_fraction)
    slots = b / model.max_running_requests
    return min(cliff, max(kv, tpot, slots))


def _ewma(old: float, new: float, alpha: float) -> float:
    return old + alpha * (new - old)


_MAX_SHORTFALL = 64
"""Bound on the instances a role can be found short of (the search stops there)."""


@dataclass(frozen=True)
class RoleSwitchPolicy:
    config: PolicyConfig
    model: PerformanceModel

    # ------------------------------------------------------------------ entry points

    def decide(
        self,
        now: float,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        memory: PolicyMemory = PolicyMemory(),
    ) -> tuple[Decision | None, PolicyMemory]:
        """One tick: update the memory and return at most one switch to start now.

        A role that has an instance on its way gets no more until it lands (the metrics must
        show its effect first); `decide_all` sizes a move, several instances in one tick.
        """
        return self._decide(now, fleet, metrics, memory, ())

    def _decide(
        self,
        now: float,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        memory: PolicyMemory,
        started: Sequence[str],
    ) -> tuple[Decision | None, PolicyMemory]:
        cfg = self.config
        memory = self.observe(now, fleet, metrics, memory)
        if not cfg.enabled or cfg.paused:
            return None, memory
        in_flight = sum(1 for s in fleet if s.phase in ("draining", "switching") or s.restoring)
        if in_flight >= cfg.max_concurrent:
            return None, memory
        demand = self.demand_of(memory)
        candidates = [
            d
            for receiver in ("prefill", "decode")
            if (d := self._consider(now, receiver, fleet, metrics, demand, memory, started)) is not None
        ]
        if not candidates:
            # A return is one instance at a time, never part of a sized move.
            if in_flight or started:
                return None, memory
            return self._return(now, fleet, metrics, demand, memory), memory
        return max(candidates, key=lambda d: (d.expected_benefit_s, d.to_role == "prefill")), memory

    def decide_all(
        self,
        now: float,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        memory: PolicyMemory = PolicyMemory(),
    ) -> tuple[list[Decision], PolicyMemory]:
        """Every switch to start this tick (a sized move), at most `max_concurrent` in flight."""
        decisions: list[Decision] = []
        fleet = list(fleet)
        for _ in range(max(1, self.config.max_concurrent)):
            decision, memory = self._decide(now, fleet, metrics, memory, [d.instance for d in decisions])
            if decision is None:
                break
            decisions.append(decision)
            fleet = [
                replace(s, phase="draining", target_role=decision.to_role) if s.name == decision.instance else s
                for s in fleet
            ]
        return decisions, memory

    # ------------------------------------------------------------------ memory

    def observe(
        self, now: float, fleet: Sequence[InstanceState], metrics: Mapping[str, InstanceMetrics], memory: PolicyMemory
    ) -> PolicyMemory:
        """Fold this tick's demand into the EWMA and update since when each role is under pressure."""
        cfg = self.config
        m = measure_demand(fleet, metrics, cfg, self.model)
        if memory.smoothed_at is None:
            alpha = 1.0
        elif now <= memory.smoothed_at:
            alpha = 0.0
        elif cfg.smoothing_s <= 0:
            alpha = 1.0
        else:
            alpha = 1.0 - math.exp(-(now - memory.smoothed_at) / cfg.smoothing_s)
        if alpha > 0:
            peak = _held_peak(memory, m.prefill_load, now, cfg.burst_memory_s)
            per_request = m.decode_tokens_per_request or memory.decode_tokens_per_request
            memory = replace(
                memory,
                smoothed_at=now,
                prefill_load=_ewma(memory.prefill_load, m.prefill_load, alpha),
                decode_tokens_per_s=_ewma(memory.decode_tokens_per_s, m.decode_tokens_per_s, alpha),
                decode_tokens_per_request=(
                    per_request
                    if memory.smoothed_at is None or not memory.decode_tokens_per_request
                    else _ewma(memory.decode_tokens_per_request, per_request, alpha)
                ),
                decode_slo=_ewma(memory.decode_slo, m.decode_slo, alpha),
                prefill_backlog_factor=_ewma(memory.prefill_backlog_factor, m.prefill_backlog_factor, alpha),
                output_tokens_per_request=_smoothed_output_length(memory, fleet, metrics, alpha),
                prefill_peak_load=peak,
            )
            demand = self.demand_of(memory)
            for role in ("prefill", "decode"):
                memory = self._remember(memory, role, now, self.current_pressure(role, demand, fleet))
        if now != memory.smoothed_at:
            return memory
        acute = self.acute(fleet, metrics, memory)
        memory = replace(
            memory,
            prefill_acute_since=_held_since(memory.prefill_acute_since, acute["prefill"], now),
            decode_acute_since=_held_since(memory.decode_acute_since, acute["decode"], now),
        )
        pressed = (
            memory.prefill_pressure_since,
            memory.decode_pressure_since,
            memory.prefill_acute_since,
            memory.decode_acute_since,
        )
        return replace(memory, quiet_since=_held_since(memory.quiet_since, all(p is None for p in pressed), now))

    def acute(
        self,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        memory: PolicyMemory = PolicyMemory(),
    ) -> dict[Role, bool]:
        """Clear, large overload this tick: even the least-loaded prefill instance's queue takes
        longer than the TTFT limit to clear, or requests wait for decode KV slots long enough to
        cost them their TTFT (a wait of a few hundred milliseconds behind a full pool is harmless;
        judging it by its length, not its existence, is what keeps agentic waves from moving a
        prefill instance away)."""
        cfg = self.config
        ms = {
            role: [metrics[s.name] for s in fleet if s.role == role and s.phase == "serving" and s.name in metrics]
            for role in ("prefill", "decode")
        }
        queue = min((queued_prefill_seconds(m, self.model) for m in ms["prefill"]), default=0.0)
        wait = kv_wait_seconds(ms["decode"], self.model, self.output_length(memory))
        return {
            "prefill": bool(ms["prefill"]) and queue > cfg.acute_queue_factor * cfg.ttft_slo_s,
            "decode": wait > cfg.acute_kv_wait_fraction * cfg.ttft_slo_s,
        }

    def output_length(self, memory: PolicyMemory) -> float:
        """Mean output tokens per request: measured (counters) when known, else the configured guess."""
        return memory.output_tokens_per_request or float(self.config.typical_output_tokens)

    @staticmethod
    def demand_of(memory: PolicyMemory) -> RoleDemand:
        return RoleDemand(
            memory.prefill_load,
            memory.decode_tokens_per_s,
            memory.decode_tokens_per_request,
            memory.decode_slo,
            memory.prefill_backlog_factor,
            memory.prefill_peak_load,
        )

    def _remember(self, memory: PolicyMemory, role: Role, now: float, pressure: float) -> PolicyMemory:
        since = memory.since(role)
        if since is None and pressure >= self.config.enter_pressure:
            return memory.with_since(role, now)
        if since is not None and pressure < self.config.exit_pressure:
            return memory.with_since(role, None)
        return memory

    # ------------------------------------------------------------------ projections

    def projected(self, role: Role, demand: RoleDemand, instances: int) -> float:
        """Pressure of `role` if `instances` instances served its current (smoothed) demand."""
        if role == "prefill":
            return projected_prefill_pressure(demand, instances, self.config)
        return projected_decode_pressure(demand, instances, self.config, self.model)

    def current_pressure(self, role: Role, demand: RoleDemand, fleet: Sequence[InstanceState]) -> float:
        """Projected pressure at the role's current capacity (prefill at its recent peak); for
        decode, its TPOT p90 over the limit if that is worse (prefill has no such evidence:
        `InstanceMetrics.tpot_p90_s`)."""
        if role == "prefill":
            return self.projected(role, demand.with_bursts(), _capacity(fleet, role))
        return max(self.projected(role, demand, _capacity(fleet, role)), demand.decode_slo)

    # ------------------------------------------------------------------ the decision

    def _consider(
        self,
        now: float,
        receiver: Role,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        demand: RoleDemand,
        memory: PolicyMemory,
        started: Sequence[str] = (),
    ) -> Decision | None:
        cfg = self.config
        donor = other_role(receiver)
        since = memory.since(receiver)
        acute_since = memory.prefill_acute_since if receiver == "prefill" else memory.decode_acute_since
        if since is None and (acute_since is None or cfg.acute_sustain_s <= 0):
            return None
        # Wait for feedback: instances already on their way to the receiver (other than those
        # started this very tick, as part of one sized move) must land before more follow.
        if any(
            s.phase in ("draining", "switching") and s.target_role == receiver and s.name not in started for s in fleet
        ):
            return None
        # Moving back within the cooldown of a move the other way needs clearer evidence.
        reversal = any(
            s.last_switch_at is not None
            and now - s.last_switch_at < cfg.cooldown_s
            and s.role == donor
            and s.phase == "serving"
            for s in fleet
        ) or any(s.phase in ("draining", "switching") and s.target_role == donor for s in fleet)
        sustain = cfg.sustain_s * (cfg.reversal_sustain_factor if reversal else 1.0)
        ceiling = cfg.donor_ceiling - (cfg.reversal_margin if reversal else 0.0)
        landed = max(
            (
                s.last_switch_at
                for s in fleet
                if s.role == receiver and s.phase == "serving" and s.last_switch_at is not None
            ),
            default=None,
        )
        if cfg.settle_after_landing and landed is not None:
            since = None if since is None else max(since, landed)
            acute_since = None if acute_since is None else max(acute_since, landed)
        fast = (
            cfg.acute_sustain_s > 0
            and acute_since is not None
            and now - acute_since >= cfg.acute_sustain_s * (cfg.reversal_sustain_factor if reversal else 1.0)
        )
        if not fast and (since is None or now - since < sustain):
            return None
        if fast:
            # The smoothed demand lags a sudden overload: project the receiver with this tick's
            # demand as well, whichever is worse.
            now_demand = measure_demand(fleet, metrics, cfg, self.model)
            demand = replace(
                demand,
                prefill_load=max(demand.prefill_load, now_demand.prefill_load)
                if receiver == "prefill"
                else demand.prefill_load,
                decode_tokens_per_s=(
                    max(demand.decode_tokens_per_s, now_demand.decode_tokens_per_s)
                    if receiver == "decode"
                    else demand.decode_tokens_per_s
                ),
            )
        n_recv, n_give = _capacity(fleet, receiver), _capacity(fleet, donor)
        if not self._can_give(fleet, donor, n_give):
            return None
        # The decision rests on the projection alone: the p90s (a minute of completed requests,
        # and TPOT only known when a request ends) lag, and would keep adding instances after
        # the cause is fixed. They only start the sustain clock (`observe`).
        # Prefill is judged at its recent peak (a burst of long prompts sets TTFT, not the mean);
        # a decode donor then with the demand that serving those bursts passes on to it, on top
        # of what prefill's backlog will release (an agentic wave's prompts are decode's KV a
        # minute later: judged by today's decode alone, it would lend the instance it needs).
        recv_demand = demand.with_bursts() if receiver == "prefill" else demand
        recv_now = self.projected(receiver, recv_demand, n_recv)
        if recv_now < cfg.enter_pressure:
            return None
        recv_after = self.projected(receiver, recv_demand, n_recv + 1)
        donor_demand = demand.as_donor(donor)
        if donor == "decode":
            donor_demand = replace(
                donor_demand, decode_tokens_per_s=donor_demand.decode_tokens_per_s * demand.burst_ratio()
            )
        give_now = self.projected(donor, donor_demand, n_give)
        give_after = self.projected(donor, donor_demand, n_give - 1)
        # The donor stays within its ceiling; past it only toward the minimax split: its overload
        # after the move is at most half the receiver's now and no worse than the receiver's after
        # it. A move that leaves the donor the worse of the two overshoots, and for a decode donor
        # the projection hides a cliff: an agentic fleet at 0.9× its goodput load gave decode
        # (projected 0.30 → 1.05) to prefill (1.17 → 1.00), and its attainment fell to 0.59 from 0.97.
        toward_minimax = give_after <= recv_after and (cfg.overload_split_in_reversal or not reversal)
        relief = 1.0 + (recv_now - 1.0) / 2 if toward_minimax else ceiling
        if donor == "decode":
            # Never past decode's own target: there its batch stops keeping up, requests wait for
            # KV slots and TTFT, not only TPOT, fails; past prefill's a queue grows at a fluid rate.
            # An agentic fleet at 1.1× its goodput load gave decode (0.30 → 1.07) to prefill
            # (1.61 → 1.38), took three back within two minutes, and fell to 0.28 from static's 0.34.
            relief = min(relief, 1.0)
        if give_after > max(ceiling, relief):
            return None
        if max(recv_after, give_after) > max(recv_now, give_now) - cfg.min_improvement:
            return None
        instance = self._pick_donor(now, donor, fleet, metrics)
        if instance is None:
            return None
        mode: SwitchMode = "in-place" if instance.in_place else "relaunch"
        if fast and mode == "relaunch" and (since is None or now - since < sustain):
            return None  # the fast path is for switches that land in seconds, not a restart
        busy = self._drain_estimate(
            metrics.get(instance.name), donor, self.output_length(memory)
        ) + self.model.switch_seconds(mode)
        # Past the early returns, either the fast path holds (which needs acute_since) or
        # `since` is set: the overload has held since one of them.
        held_since = acute_since if fast or since is None else since
        assert held_since is not None, "the fast path needs acute_since; the slow one needs since"
        horizon = cfg.cooldown_s
        # The receiver gets its instance only after drain + switch; the donor loses it at once,
        # so its capacity is lost for the whole busy time, in proportion to how loaded it was,
        # and any overload it adds to the donor counts over the whole horizon.
        gain = (
            self.shortfall(receiver, recv_demand, n_recv) - self.shortfall(receiver, recv_demand, n_recv + 1)
        ) * max(0.0, horizon - busy)
        cost = (
            busy * min(1.0, give_now)
            + (self.shortfall(donor, donor_demand, n_give - 1) - self.shortfall(donor, donor_demand, n_give)) * horizon
        )
        if gain <= cost:
            return None
        return Decision(
            instance=instance.name,
            from_role=donor,
            to_role=receiver,
            mode=mode,
            reason=(
                f"{receiver} pressure {recv_now:.2f} for {now - held_since:.0f}s"
                + (" (acute)" if fast else "")
                + f" → {recv_after:.2f} with one more; "
                f"{donor} projected {give_now:.2f} → {give_after:.2f} (≤{ceiling:.2f})"
                + ("; reversal" if reversal else "")
            ),
            expected_benefit_s=gain - cost,
        )

    def _return(
        self,
        now: float,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        demand: RoleDemand,
        memory: PolicyMemory,
    ) -> Decision | None:
        """One instance back toward the declared split, when the role giving it stays within its
        SLO without it (prefill at its recent peak), and either

        - no role has been under pressure and no instance has switched for a cooldown: the split
          the user declared is the bet for the next burst, the split of the last one is not; or
        - the role below its declared count is recalled: it has reached `recall_pressure` on the
          instances it kept (smoothed or this tick, whichever is higher: a filling KV pool rises
          a minute ahead of its smoothed mean). It lent the instance while it could spare it;
          waiting until it is overloaded (the KV queue of a conversation segment met at 6:2)
          costs more than the move back. The giver then only has to stay within the donor
          ceiling, as for any move: held to the stricter reversal ceiling, the instance came back
          a tick or two after a conversation segment began, by which time hundreds of requests
          waited for decode slots on the one instance left.

        A return with no recall keeps the reversal ceiling: nothing presses for it.

        Idle instances drain at once, so a return costs only its switch time."""
        cfg = self.config
        if cfg.declared_prefill_share is None:
            return None
        n_prefill, n_decode = _capacity(fleet, "prefill"), _capacity(fleet, "decode")
        total = n_prefill + n_decode
        # Half an instance goes to prefill, as the assignment breaks a tie for a new instance.
        home = min(max(math.floor(cfg.declared_prefill_share * total + 0.5), cfg.min_prefill), total - cfg.min_decode)
        if home == n_prefill:
            return None
        receiver: Role = "prefill" if home > n_prefill else "decode"
        donor = other_role(receiver)
        now_demand = measure_demand(fleet, metrics, cfg, self.model)
        latest = replace(
            demand.with_bursts(), decode_tokens_per_s=max(demand.decode_tokens_per_s, now_demand.decode_tokens_per_s)
        )
        need = self.projected(receiver, latest, _capacity(fleet, receiver))
        recalled = need >= cfg.recall_pressure
        quiet = memory.quiet_since
        if not recalled:
            if quiet is None or now - quiet < cfg.cooldown_s:
                return None
            # Any switch (the policy's, an on-call request's) holds for a cooldown before a return.
            if any(s.last_switch_at is not None and now - s.last_switch_at < cfg.cooldown_s for s in fleet):
                return None
        n_give = n_decode if donor == "decode" else n_prefill
        if not self._can_give(fleet, donor, n_give):
            return None
        give_after = self.projected(donor, demand.with_bursts().as_donor(donor), n_give - 1)
        ceiling = cfg.donor_ceiling if recalled else cfg.donor_ceiling - cfg.reversal_margin
        if give_after > ceiling:
            return None
        instance = self._pick_donor(now, donor, fleet, metrics)
        if instance is None:
            return None
        return Decision(
            instance=instance.name,
            from_role=donor,
            to_role=receiver,
            mode="in-place" if instance.in_place else "relaunch",
            reason=(
                (
                    f"{receiver} recalled at {need:.2f} (≥{cfg.recall_pressure:.2f})"
                    if recalled
                    else f"no pressure for {now - (quiet or now):.0f}s"
                )
                + f": back toward the declared split {home}:{total - home}; "
                f"{donor} projected {give_after:.2f} with one fewer (≤{ceiling:.2f})"
            ),
            expected_benefit_s=0.0,
        )

    def _can_give(self, fleet: Sequence[InstanceState], donor: Role, capacity: int) -> bool:
        """Whether `donor` keeps its floor after giving one instance, both in capacity (serving
        plus arriving) and in instances serving now."""
        floor = self.config.min_prefill if donor == "prefill" else self.config.min_decode
        serving = sum(1 for s in fleet if s.role == donor and s.phase == "serving")
        return min(capacity, serving) - 1 >= floor

    def shortfall(self, role: Role, demand: RoleDemand, instances: int) -> float:
        """Instances' worth of demand beyond what `instances` carry at target: how many more the
        role needs. Prefill's compute is linear in instances, so it is the projected excess times
        the instances; decode's batch is not (its pressure stops falling in proportion near the
        cliff), so it is the instances it is short of the fewest that bring it to target."""
        pressure = self.projected(role, demand, instances)
        if role == "prefill" or pressure <= 1.0:
            return max(0.0, pressure - 1.0) * max(instances, 1)
        # Where the pressure crosses 1, interpolated between whole instance counts.
        for more in range(instances + 1, instances + _MAX_SHORTFALL + 1):
            after = self.projected(role, demand, more)
            if after <= 1.0:
                return more - 1 - instances + (pressure - 1.0) / (pressure - after)
            pressure = after
        return float(_MAX_SHORTFALL)

    def _pick_donor(
        self, now: float, donor: Role, fleet: Sequence[InstanceState], metrics: Mapping[str, InstanceMetrics]
    ) -> InstanceState | None:
        """The least-loaded eligible instance of the donor role: it drains fastest."""
        cfg = self.config
        eligible = [
            s
            for s in fleet
            if s.role == donor
            and s.phase == "serving"
            and not s.pinned
            and (s.last_switch_at is None or now - s.last_switch_at >= cfg.cooldown_s)
        ]
        if not eligible:
            return None

        def load(s: InstanceState) -> tuple[float, int, str]:
            m = metrics.get(s.name)
            if m is None:
                return (float("inf"), 1, s.name)
            work = m.prefill_queue_tokens if donor == "prefill" else m.kv_usage
            return (float(work) + m.running_reqs * 1e-6, 0 if s.in_place else 1, s.name)

        return min(eligible, key=load)

    def _drain_estimate(self, m: InstanceMetrics | None, donor: Role, output_tokens: float = 0.0) -> float:
        """Seconds until the donor is idle: its queue (prefill) or its running batch (decode)."""
        if m is None:
            return 0.0
        if donor == "prefill":
            if not m.prefill_queue_tokens:
                return 0.0
            return self.model.prefill_step_overhead_s * self.model.time_scale + queued_prefill_seconds(m, self.model)
        if m.running_reqs == 0:
            return 0.0
        step = self.model.decode_step_seconds(m.running_reqs, int(m.kv_usage * self.model.kv_capacity_tokens))
        return step * (output_tokens or self.config.typical_output_tokens)


def _capacity(fleet: Sequence[InstanceState], role: Role) -> int:
    """Instances serving `role` and not leaving it, plus those on their way to it."""
    return sum(
        1
        for s in fleet
        if (s.role == role and s.phase == "serving") or (s.phase in ("draining", "switching") and s.target_role == role)
    )


def _held_peak(memory: PolicyMemory, load: float, now: float, memory_s: float) -> float:
    """This tick's prefill load, or the last peak decayed over the time since, if higher."""
    if memory_s <= 0:
        return 0.0
    if memory.smoothed_at is None:
        return load
    return max(load, memory.prefill_peak_load * math.exp(-(now - memory.smoothed_at) / memory_s))


def _held_since(was: float | None, on: bool, now: float) -> float | None:
    """Since when a condition has held: kept while it holds, started now, cleared when it stops."""
    if not on:
        return None
    return was if was is not None else now


def _smoothed_output_length(
    memory: PolicyMemory, fleet: Sequence[InstanceState], metrics: Mapping[str, InstanceMetrics], alpha: float
) -> float:
    """EWMA of the decode instances' mean output length (weighted by what each runs)."""
    pairs = [
        (length, max(1, metrics[s.name].running_reqs))
        for s in fleet
        if s.role == "decode" and s.name in metrics and (length := metrics[s.name].output_tokens_per_request)
    ]
    if not pairs:
        return memory.output_tokens_per_request
    now = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    if not memory.output_tokens_per_request:
        return now
    return _ewma(memory.output_tokens_per_request, now, alpha)


# --------------------------------------------------------------------------------------------
# Scaling total capacity: the same projections decide how many instances each role needs


@dataclass(frozen=True)
class ScaleAction:
    """Launch an instance into a role (`add`: a pod start and a weight load, minutes) or drain
    one and take it down (`remove`)."""

    kind: Literal["add", "remove"]
    instance: str
    role: Role
    reason: str


@dataclass(frozen=True)
class ScalingConfig:
    """Bounds and pacing of total capacity. Floors are per role; the ceiling and the launch
    budget bound what the fleet may hold and start at once."""

    max_instances: int
    min_prefill: int = 1
    min_decode: int = 1
    max_launching: int = 2
    """Instances launching at once (a budget on cold starts and on GPUs claimed ahead of need)."""
    target_pressure: float = 0.85
    """Each role is sized so its projected pressure stays at or below this."""
    release_pressure: float = 0.6
    """An instance is surplus when the role, without it, still projects at or below this."""
    up_sustain_s: float = 20.0
    """A shortfall must hold this long before a launch."""
    scale_down_delay_s: float = 600.0
    """A surplus must hold this long, and the last launch be this old, before a removal."""
    forecast_fast_s: float = 60.0
    forecast_slow_s: float = 300.0
    """Time constants of the two demand EWMAs whose gap gives the demand's trend; launches
    are sized for the demand one launch time ahead on that trend (never below today's)."""

    @classmethod
    def from_spec(cls, scaling: Any, role_switch: Any) -> ScalingConfig:
        """From the API's ScalingSpec and RoleSwitchSpec (duck-typed, so the core does not import
        the API): the role-switch floors are the scaler's floors too."""
        return cls(
            max_instances=scaling.max_replicas,
            min_prefill=role_switch.min_prefill,
            min_decode=role_switch.min_decode,
            max_launching=scaling.max_launching,
            scale_down_delay_s=float(scaling.scale_down_delay_seconds),
        )


@dataclass(frozen=True)
class ScalerMemory:
    short_since: float | None = None
    """Since when the fleet needs more instances than it holds (None: it does not)."""
    surplus_since: float | None = None
    last_add_at: float | None = None
    at: float | None = None
    fast_prefill: float = 0.0
    slow_prefill: float = 0.0
    fast_decode: float = 0.0
    slow_decode: float = 0.0


def _holding(fleet: Sequence[InstanceState]) -> list[InstanceState]:
    """Instances holding GPUs and staying: serving, launching or switching (not down, not leaving)."""
    return [s for s in fleet if s.phase != "down" and not (s.phase == "draining" and s.target_role is None)]


@dataclass(frozen=True)
class FleetScaler:
    """How many instances each role needs, from the role-switch policy's own projections.

    Role switching moves capacity in seconds; a launch adds it in minutes. So the scaler acts
    only on the *total*: when the instances both roles need exceed what the fleet holds (a
    switch cannot help: the other role has nothing to give), it launches the shortfall at
    once, sized for the demand a launch time ahead; when the fleet holds more than both roles
    need at a low pressure for `scale_down_delay_s`, it drains one instance of the role with
    the most surplus and takes it down. Floors, the ceiling and the launch budget always hold.
    """

    config: ScalingConfig
    policy: RoleSwitchPolicy

    def needs(self, demand: RoleDemand, pressure: float) -> dict[Role, int]:
        """Fewest instances per role whose projected pressure is at or below `pressure` (the
        ceiling when none is)."""
        cfg = self.config
        out: dict[Role, int] = {}
        floors: tuple[tuple[Role, int], ...] = (("prefill", cfg.min_prefill), ("decode", cfg.min_decode))
        for role, floor in floors:
            k = max(1, floor)
            while k < cfg.max_instances and self.policy.projected(role, demand, k) > pressure:
                k += 1
            out[role] = k
        return out

    def decide(
        self,
        now: float,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        demand: RoleDemand,
        memory: ScalerMemory = ScalerMemory(),
    ) -> tuple[list[ScaleAction], ScalerMemory]:
        cfg = self.config
        memory = self._observe(now, demand, memory)
        ahead = replace(
            demand,
            prefill_load=max(demand.prefill_load, self._forecast(memory.fast_prefill, memory.slow_prefill)),
            decode_tokens_per_s=max(demand.decode_tokens_per_s, self._forecast(memory.fast_decode, memory.slow_decode)),
        )
        need = self.needs(ahead, cfg.target_pressure)
        holding = _holding(fleet)
        launching = sum(1 for s in fleet if s.phase == "switching" and _is_launch(s))
        shortfall = min(need["prefill"] + need["decode"], cfg.max_instances) - len(holding)
        if shortfall > 0:
            short_since = memory.short_since if memory.short_since is not None else now
            memory = replace(memory, surplus_since=None, short_since=short_since)
            if now - short_since < cfg.up_sustain_s:
                return [], memory
            down = [s for s in fleet if s.phase == "down"]
            budget = min(shortfall, cfg.max_launching - launching, len(down))
            if budget <= 0:
                return [], memory
            cap = {r: _capacity(fleet, r) for r in ("prefill", "decode")}
            actions = []
            for slot in sorted(down, key=lambda s: s.name)[:budget]:
                role: Role = max(("prefill", "decode"), key=lambda r: (need[r] - cap[r], r == "prefill"))
                cap[role] += 1
                actions.append(
                    ScaleAction(
                        "add", slot.name, role, f"fleet needs {need['prefill']}+{need['decode']}, holds {len(holding)}"
                    )
                )
            return actions, replace(memory, short_since=None, last_add_at=now)
        memory = replace(memory, short_since=None)
        keep = self.needs(demand, cfg.release_pressure)
        leaving = any(s.phase == "draining" and s.target_role is None for s in fleet)
        if keep["prefill"] + keep["decode"] >= len(holding) or launching or leaving:
            return [], replace(memory, surplus_since=None)
        since = memory.surplus_since if memory.surplus_since is not None else now
        memory = replace(memory, surplus_since=since)
        recent_add = memory.last_add_at is not None and now - memory.last_add_at < cfg.scale_down_delay_s
        if now - since < cfg.scale_down_delay_s or recent_add:
            return [], memory
        cap = {r: _capacity(fleet, r) for r in ("prefill", "decode")}
        floors = {"prefill": cfg.min_prefill, "decode": cfg.min_decode}
        roles: tuple[Role, ...] = ("prefill", "decode")
        for role in sorted(roles, key=lambda r: cap[r] - keep[r], reverse=True):
            serving = [s for s in fleet if s.role == role and s.phase == "serving" and not s.pinned]
            if cap[role] - 1 < max(keep[role], floors[role], 1) or not serving:
                continue
            victim = self.policy._pick_donor(now, role, serving, metrics) or min(serving, key=lambda s: s.name)
            reason = f"fleet needs {keep['prefill']}+{keep['decode']} at {cfg.release_pressure}, holds {len(holding)}"
            return [ScaleAction("remove", victim.name, role, reason)], replace(memory, surplus_since=None)
        return [], memory

    def _observe(self, now: float, demand: RoleDemand, memory: ScalerMemory) -> ScalerMemory:
        cfg = self.config
        if memory.at is None:
            return replace(
                memory, at=now, fast_prefill=demand.prefill_load, slow_prefill=demand.prefill_load,
                fast_decode=demand.decode_tokens_per_s, slow_decode=demand.decode_tokens_per_s,
            )  # fmt: skip
        dt = max(0.0, now - memory.at)
        fa = 1.0 - math.exp(-dt / cfg.forecast_fast_s)
        sa = 1.0 - math.exp(-dt / cfg.forecast_slow_s)
        return replace(
            memory,
            at=now,
            fast_prefill=_ewma(memory.fast_prefill, demand.prefill_load, fa),
            slow_prefill=_ewma(memory.slow_prefill, demand.prefill_load, sa),
            fast_decode=_ewma(memory.fast_decode, demand.decode_tokens_per_s, fa),
            slow_decode=_ewma(memory.slow_decode, demand.decode_tokens_per_s, sa),
        )

    def _forecast(self, fast: float, slow: float) -> float:
        """Demand one launch time ahead: the fast EWMA plus the trend (the two EWMAs lag by the
        difference of their time constants), never below the fast EWMA."""
        cfg = self.config
        trend = (fast - slow) / (cfg.forecast_slow_s - cfg.forecast_fast_s)
        return max(fast, fast + trend * self.policy.model.launch_seconds() * self.policy.model.time_scale)


def _is_launch(s: InstanceState) -> bool:
    """A launching instance: switching towards the role it already has (a role switch changes it)."""
    return s.target_role == s.role
