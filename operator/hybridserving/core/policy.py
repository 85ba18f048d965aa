"""Which instance should change role, and when: the role-switch policy.

A switch is never free: the donor instance drains (it stops taking work and finishes what it
holds), then rebuilds in place (seconds) or relaunches (minutes), and meanwhile serves nothing.
So the policy only moves an instance when one role has been under sustained pressure, the other
role can spare an instance without coming under pressure itself, and the overload removed over
the cooldown horizon outweighs the capacity the switch takes away. Pressure uses asymmetric
thresholds (enter high, exit lower) and must hold for a window, so metric noise does not move
instances back and forth.

Everything here is a pure, deterministic function of its arguments: the caller keeps the small
`PolicyMemory` between ticks (in status, in the simulator) and passes it back in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Sequence

from hybridserving.core.perfmodel import PerformanceModel, SwitchMode

Role = Literal["prefill", "decode"]
Phase = Literal["serving", "draining", "switching", "down"]


def other_role(role: Role) -> Role:
    return "decode" if role == "prefill" else "prefill"


@dataclass(frozen=True)
class InstanceMetrics:
    """What one engine reports (SGLang `/metrics` and `/v1/loads`), reduced to what the policy reads."""

    role: Role
    prefill_queue_reqs: int = 0
    prefill_queue_tokens: int = 0
    prefill_wait_s: float = 0.0
    """Age of the oldest queued prompt."""
    utilization: float = 0.0
    """Fraction of the recent interval the scheduler was running a forward pass (`sglang:utilization`)."""
    kv_usage: float = 0.0
    """Decode KV pool in use, 0..1 (`sglang:token_usage`)."""
    prealloc_queue_reqs: int = 0
    """Requests waiting for decode KV slots (`num_decode_prealloc_queue_reqs`): the latency cliff."""
    running_reqs: int = 0
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None


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

    @classmethod
    def from_spec(cls, role_switch, paused: bool = False, **tuning) -> PolicyConfig:
        """From the API's RoleSwitchSpec (duck-typed, so the core does not import the API)."""
        return cls(
            enabled=role_switch.enabled,
            paused=paused,
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
    """Since when each role has been under pressure (None: not under pressure)."""

    prefill_pressure_since: float | None = None
    decode_pressure_since: float | None = None

    def since(self, role: Role) -> float | None:
        return self.prefill_pressure_since if role == "prefill" else self.decode_pressure_since

    def with_since(self, role: Role, value: float | None) -> PolicyMemory:
        field = "prefill_pressure_since" if role == "prefill" else "decode_pressure_since"
        return replace(self, **{field: value})


@dataclass(frozen=True)
class Decision:
    instance: str
    from_role: Role
    to_role: Role
    mode: SwitchMode
    reason: str
    expected_benefit_s: float
    """Instance-seconds of overload removed over the horizon, net of the switch's cost."""


@dataclass(frozen=True)
class RolePressure:
    """Load of one role normalised to its target (1.0 = full), over its serving instances."""

    role: Role
    pressure: float
    serving: int
    incoming: int
    """Instances draining or switching towards this role."""


def prefill_pressure(metrics: Sequence[InstanceMetrics], config: PolicyConfig) -> float:
    """Busy fraction against the target, or the queue's age against the TTFT limit if worse.

    Utilisation says how close prefill is to saturating before queues form; the oldest wait and
    the TTFT p90 say how far past saturation it already is.
    """
    if not metrics:
        return 0.0
    util = sum(m.utilization for m in metrics) / len(metrics) / config.target_utilization
    wait = sum(m.prefill_wait_s for m in metrics) / len(metrics) / config.ttft_slo_s
    ttft = [m.ttft_p90_s / config.ttft_slo_s for m in metrics if m.ttft_p90_s is not None]
    slo = sum(ttft) / len(ttft) if ttft else 0.0
    return max(util, 2.0 * wait, slo)


def decode_pressure(metrics: Sequence[InstanceMetrics], config: PolicyConfig, model: PerformanceModel) -> float:
    """KV usage against its target, or token throughput against what the role can emit within TPOT.

    Step time grows with the batch, so a decode instance's throughput saturates: the batch
    alone understates how close it is to the cliff. The throughput ratio (tokens per second
    now, over tokens per second at the largest batch that still meets TPOT) is linear in the
    demand, which is what projecting "one instance fewer" needs. Requests waiting for KV slots
    (the prealloc queue) count as demand on top.
    """
    if not metrics:
        return 0.0
    n = len(metrics)
    running = sum(m.running_reqs for m in metrics)
    waiting = sum(m.prealloc_queue_reqs for m in metrics)
    usage = sum(m.kv_usage for m in metrics) / n
    kv = usage / config.target_kv_usage
    if running and waiting:
        kv *= (running + waiting) / running
    throughput = 0.0
    if running:
        batch = (running + waiting) / n
        resident = usage * model.kv_capacity_tokens
        per_request = resident / max(1.0, running / n)
        limit = max_batch_within_tpot(model, config.tpot_slo_s, per_request)
        rate = batch / model.decode_step_seconds(max(1, round(batch)), int(resident * batch / max(1.0, running / n)))
        best = limit / model.decode_step_seconds(limit, int(per_request * limit))
        throughput = rate / best / config.target_utilization
    tpot = [m.tpot_p90_s / config.tpot_slo_s for m in metrics if m.tpot_p90_s is not None]
    slo = sum(tpot) / len(tpot) if tpot else 0.0
    return max(kv, throughput, slo)


def max_batch_within_tpot(model: PerformanceModel, tpot_slo_s: float, context_tokens: float = 0.0) -> int:
    """Largest batch of requests holding `context_tokens` each whose step still meets TPOT."""
    per_request = (model.decode_per_request_s + model.decode_per_context_token_s * context_tokens) * model.time_scale
    fixed = (model.decode_base_s + model.decode_dcp_comm_s) * model.time_scale
    room = tpot_slo_s * model.time_scale - fixed
    if per_request <= 0 or room <= 0:
        return 1
    return max(1, min(model.max_running_requests, int(room / per_request)))


def role_pressures(
    fleet: Sequence[InstanceState],
    metrics: Mapping[str, InstanceMetrics],
    config: PolicyConfig,
    model: PerformanceModel,
) -> dict[Role, RolePressure]:
    out: dict[Role, RolePressure] = {}
    for role in ("prefill", "decode"):
        serving = [s for s in fleet if s.role == role and s.phase == "serving"]
        incoming = sum(1 for s in fleet if s.phase in ("draining", "switching") and s.target_role == role)
        ms = [metrics[s.name] for s in serving if s.name in metrics]
        p = prefill_pressure(ms, config) if role == "prefill" else decode_pressure(ms, config, model)
        out[role] = RolePressure(role, p, len(serving), incoming)
    return out


def _overload(pressure: float, instances: int) -> float:
    """Instances' worth of load beyond what `instances` can carry at target."""
    return max(0.0, pressure * instances - instances) if instances else pressure


def _projected(p: RolePressure, delta: int) -> float:
    """Pressure once pending switches land and `delta` more instances join (or leave)."""
    after = p.serving + p.incoming + delta
    return p.pressure * p.serving / after if after > 0 else float("inf")


@dataclass(frozen=True)
class RoleSwitchPolicy:
    config: PolicyConfig
    model: PerformanceModel

    def decide(
        self,
        now: float,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        memory: PolicyMemory = PolicyMemory(),
    ) -> tuple[Decision | None, PolicyMemory]:
        """One tick: update the pressure memory and return at most one switch to start now."""
        cfg = self.config
        pressures = role_pressures(fleet, metrics, cfg, self.model)
        for role, p in pressures.items():
            memory = self._remember(memory, role, now, _projected(p, 0))
        if not cfg.enabled or cfg.paused:
            return None, memory
        in_flight = sum(1 for s in fleet if s.phase in ("draining", "switching"))
        if in_flight >= cfg.max_concurrent:
            return None, memory
        candidates = []
        for receiver in ("prefill", "decode"):
            decision = self._consider(now, receiver, fleet, metrics, pressures, memory)
            if decision is not None:
                candidates.append(decision)
        if not candidates:
            return None, memory
        best = max(candidates, key=lambda d: (d.expected_benefit_s, d.to_role == "prefill"))
        return best, memory

    def _remember(self, memory: PolicyMemory, role: Role, now: float, pressure: float) -> PolicyMemory:
        since = memory.since(role)
        if since is None and pressure >= self.config.enter_pressure:
            return memory.with_since(role, now)
        if since is not None and pressure < self.config.exit_pressure:
            return memory.with_since(role, None)
        return memory

    def _consider(
        self,
        now: float,
        receiver: Role,
        fleet: Sequence[InstanceState],
        metrics: Mapping[str, InstanceMetrics],
        pressures: Mapping[Role, RolePressure],
        memory: PolicyMemory,
    ) -> Decision | None:
        cfg = self.config
        donor = other_role(receiver)
        since = memory.since(receiver)
        if since is None or now - since < cfg.sustain_s:
            return None
        recv, give = pressures[receiver], pressures[donor]
        recv_now = _projected(recv, 0)
        if recv_now < cfg.enter_pressure:
            return None
        donor_after = _projected(give, -1)
        if donor_after > cfg.donor_ceiling:
            return None
        floor = cfg.min_prefill if donor == "prefill" else cfg.min_decode
        if give.serving - 1 < floor:
            return None
        # No reversal within the cooldown: an instance recently moved *to* the donor role means
        # the last projection said that role needed it; taking one back now would be flapping.
        if any(
            s.last_switch_at is not None and now - s.last_switch_at < cfg.cooldown_s and s.role == donor
            for s in fleet
        ) or any(s.phase in ("draining", "switching") and s.target_role == donor for s in fleet):
            return None
        instance = self._pick_donor(now, donor, fleet, metrics)
        if instance is None:
            return None
        mode: SwitchMode = "in-place" if instance.in_place else "relaunch"
        drain = self._drain_estimate(metrics.get(instance.name), donor)
        busy = drain + self.model.switch_seconds(mode) / self.model.time_scale
        horizon = cfg.cooldown_s
        n_recv = recv.serving + recv.incoming
        removed = _overload(recv_now, n_recv) - _overload(recv_now * n_recv / (n_recv + 1), n_recv + 1)
        donor_n = give.serving + give.incoming
        added = _overload(donor_after, donor_n - 1) - _overload(_projected(give, 0), donor_n)
        # The receiver gets its instance only after drain + switch; the donor loses it at once
        # (any overload that adds there counts over the whole horizon), and the instance's own
        # capacity is lost while it drains and switches, in proportion to how loaded the donor is.
        gain = removed * max(0.0, horizon - busy)
        cost = busy * min(1.0, _projected(give, 0)) + added * horizon
        if gain <= cost:
            return None
        return Decision(
            instance=instance.name,
            from_role=donor,
            to_role=receiver,
            mode=mode,
            reason=(
                f"{receiver} pressure {recv_now:.2f} for {now - since:.0f}s "
                f"(≥{cfg.enter_pressure:.2f}); {donor} at {_projected(give, 0):.2f} → {donor_after:.2f} after"
            ),
            expected_benefit_s=gain - cost,
        )

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

    def _drain_estimate(self, m: InstanceMetrics | None, donor: Role) -> float:
        """Seconds until the donor is idle: its queue (prefill) or its running batch (decode)."""
        if m is None:
            return 0.0
        if donor == "prefill":
            if not m.prefill_queue_tokens:
                return 0.0
            return self.model.prefill_step_overhead_s + m.prefill_queue_tokens * self.model.prefill_per_token_s
        if m.running_reqs == 0:
            return 0.0
        step = self.model.decode_step_seconds(m.running_reqs, 0) / self.model.time_scale
        return step * self.config.typical_output_tokens
