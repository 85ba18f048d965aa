"""The role-switch policy: invariants checked at every tick of whole simulated scenarios."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.core.policy import (
    InstanceMetrics,
    InstanceState,
    PolicyConfig,
    PolicyMemory,
    RoleDemand,
    RoleSwitchPolicy,
    projected_decode_batch,
)
from hybridserving.api.profiles import PROFILES

MODEL = PerformanceModel.for_role(PROFILES["glm-5.2"], tp=8)


def fleet(prefill: int, decode: int, **kw) -> list[InstanceState]:
    return [InstanceState(f"p{i}", "prefill", **kw) for i in range(prefill)] + [
        InstanceState(f"d{i}", "decode", **kw) for i in range(decode)
    ]


def metrics_for(
    states, prefill_util: float, decode_kv: float, queue_tokens: int = 0, prealloc: int = 0
):
    out = {}
    for i, s in enumerate(states):
        if s.role == "prefill":
            out[s.name] = InstanceMetrics(
                "prefill",
                prefill_queue_tokens=queue_tokens + i,
                prefill_queue_reqs=1 if queue_tokens else 0,
                utilization=prefill_util,
            )
        else:
            out[s.name] = InstanceMetrics(
                "decode", kv_usage=decode_kv, running_reqs=int(decode_kv * 100) + i, prealloc_queue_reqs=prealloc
            )
    return out


def test_sustained_prefill_pressure_moves_the_least_loaded_decode_instance():
    policy = RoleSwitchPolicy(PolicyConfig(sustain_s=20), MODEL)
    states = fleet(2, 6)
    memory = PolicyMemory()
    decision = None
    for t in range(0, 40, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 1.0, 0.1, 40_000), memory)
        if decision:
            break
    assert decision is not None and t >= 20
    assert decision.to_role == "prefill" and decision.instance == "d0"  # fewest running requests
    assert decision.mode == "in-place" and decision.expected_benefit_s > 0


def test_pressure_that_is_not_sustained_switches_nothing():
    policy = RoleSwitchPolicy(PolicyConfig(sustain_s=30), MODEL)
    states = fleet(2, 6)
    memory = PolicyMemory()
    for t in range(0, 600, 5):
        hot = (t // 10) % 12 == 0  # pressure for 10 s every two minutes: its peak fades in between
        decision, memory = policy.decide(float(t), states, metrics_for(states, 1.0 if hot else 0.3, 0.1), memory)
        assert decision is None


def test_bursts_that_recur_within_the_burst_memory_are_sustained_pressure():
    """Prefill busy half of every 20 s averages 0.65 (below target), but each burst queues
    prompts and costs their TTFT: judged at its recent peak, prefill gets an idle decode
    instance; judged by the mean alone (burst memory 0) it never does."""

    def run(cfg: PolicyConfig):
        policy = RoleSwitchPolicy(cfg, MODEL)
        states = fleet(2, 6)
        memory = PolicyMemory()
        for t in range(0, 300, 5):
            hot = (t // 10) % 2 == 0
            decision, memory = policy.decide(float(t), states, metrics_for(states, 1.0 if hot else 0.3, 0.1), memory)
            if decision:
                return decision, t
        return None, None

    decision, t = run(PolicyConfig(sustain_s=30))
    assert decision is not None and decision.to_role == "prefill" and t >= 30
    assert run(PolicyConfig(sustain_s=30, burst_memory_s=0)) == (None, None)


def test_relaunch_that_cannot_pay_back_within_the_cooldown_is_not_started():
    cfg = PolicyConfig(sustain_s=0, cooldown_s=300)
    states = fleet(2, 6, in_place=False)
    m = metrics_for(states, 1.0, 0.1, 50_000)
    decision, _ = RoleSwitchPolicy(cfg, MODEL).decide(0.0, states, m)
    assert decision is None  # 780 s of relaunch > 300 s horizon
    decision, _ = RoleSwitchPolicy(replace(cfg, cooldown_s=3600), MODEL).decide(0.0, states, m)
    assert decision is not None and decision.mode == "relaunch"


def test_disabled_or_paused_decides_nothing():
    states = fleet(2, 6)
    m = metrics_for(states, 1.0, 0.1, 50_000)
    for cfg in (PolicyConfig(sustain_s=0, enabled=False), PolicyConfig(sustain_s=0, paused=True)):
        assert RoleSwitchPolicy(cfg, MODEL).decide(0.0, states, m)[0] is None


def test_pinned_instances_are_never_chosen():
    states = [replace(s, pinned=s.role == "decode" and s.name != "d5") for s in fleet(2, 6)]
    decision, _ = RoleSwitchPolicy(PolicyConfig(sustain_s=0), MODEL).decide(
        0.0, states, metrics_for(states, 1.0, 0.1, 50_000)
    )
    assert decision is not None and decision.instance == "d5"


def test_from_spec_reads_the_api_fields():
    from hybridserving.api.v1alpha1 import RoleSwitchSpec

    spec = RoleSwitchSpec(enabled=True, min_prefill=2, min_decode=3, cooldown_seconds=120, max_concurrent=2)
    cfg = PolicyConfig.from_spec(spec, paused=True)
    assert (cfg.min_prefill, cfg.min_decode, cfg.cooldown_s, cfg.max_concurrent, cfg.paused) == (2, 3, 120.0, 2, True)
    assert cfg.ttft_slo_s == 2.0 and cfg.tpot_slo_s == 0.05


class Fleet:
    """A scripted fleet: applies decisions, completes switches after a fixed time, checks invariants."""

    def __init__(self, prefill: int, decode: int, cfg: PolicyConfig, pinned=()):
        self.states = {s.name: replace(s, pinned=s.name in pinned) for s in fleet(prefill, decode)}
        self.cfg = cfg
        self.policy = RoleSwitchPolicy(cfg, MODEL)
        self.memory = PolicyMemory()
        self.started: dict[str, float] = {}
        self.switches: list[tuple[float, str, str]] = []

    def step(self, t: float, prefill_util: float, decode_kv: float, queue: int, prealloc: int = 0) -> None:
        for name, at in list(self.started.items()):
            if t - at >= 15:
                s = self.states[name]
                self.states[name] = replace(s, role=s.target_role, target_role=None, phase="serving", last_switch_at=t)
                del self.started[name]
        states = list(self.states.values())
        m = metrics_for(states, prefill_util, decode_kv, queue, prealloc)
        decision, self.memory = self.policy.decide(t, states, m, self.memory)
        if decision:
            s = self.states[decision.instance]
            assert s.phase == "serving" and not s.pinned and s.role == decision.from_role
            assert s.last_switch_at is None or t - s.last_switch_at >= self.cfg.cooldown_s
            self.states[s.name] = replace(s, phase="switching", target_role=decision.to_role)
            self.started[s.name] = t
            self.switches.append((t, decision.instance, decision.to_role))
        self.check()

    def check(self) -> None:
        serving = list(self.states.values())
        in_flight = [s for s in serving if s.phase != "serving"]
        assert len(in_flight) <= self.cfg.max_concurrent
        for role, floor in (("prefill", self.cfg.min_prefill), ("decode", self.cfg.min_decode)):
            assert sum(1 for s in serving if s.role == role and s.phase == "serving") >= floor


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    loads=st.lists(
        st.tuples(st.floats(0, 1), st.floats(0, 1), st.integers(0, 200_000)),
        min_size=20,
        max_size=120,
    ),
    max_concurrent=st.integers(1, 3),
    min_prefill=st.integers(1, 3),
    min_decode=st.integers(1, 3),
    pinned=st.sets(st.sampled_from(["p0", "p1", "d0", "d1", "d2"])),
    declared=st.sampled_from([None, 0.125, 0.5, 0.875]),
)
def test_invariants_hold_at_every_tick_under_arbitrary_load(
    loads, max_concurrent, min_prefill, min_decode, pinned, declared
):
    cfg = PolicyConfig(
        max_concurrent=max_concurrent, min_prefill=min_prefill, min_decode=min_decode, cooldown_s=60, sustain_s=10,
        declared_prefill_share=declared,
    )  # fmt: skip
    f = Fleet(4, 4, cfg, pinned)
    for i, (util, kv, queue) in enumerate(loads):
        # each load holds for 30 s so that sustained pressure can actually trigger switches
        for k in range(6):
            f.step(i * 30.0 + k * 5.0, util, kv, queue)
    moved = {name for _, name, _ in f.switches}
    assert not moved & set(pinned)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_metrics_around_the_thresholds_do_not_flap(seed):
    import random

    rng = random.Random(seed)
    cfg = PolicyConfig(cooldown_s=300, sustain_s=20)
    f = Fleet(4, 4, cfg)
    for t in range(0, 3600, 5):
        # a balanced fleet whose prefill hovers just around its target, decode comfortably loaded
        f.step(float(t), 0.85 * (1 + rng.uniform(-0.15, 0.15)), 0.5 + rng.uniform(-0.1, 0.1), 0)
    directions = [to for _, _, to in f.switches]
    reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    assert reversals == 0


def test_a_quiet_fleet_returns_to_its_declared_split_one_instance_at_a_time():
    cfg = PolicyConfig(cooldown_s=300, sustain_s=10, max_concurrent=3, declared_prefill_share=2 / 8)
    f = Fleet(2, 6, cfg)
    for t in range(0, 400, 5):  # a prefill-heavy burst
        f.step(float(t), 1.0, 0.02, 100_000)
    assert len(f.switches) >= 2 and all(to == "prefill" for _, _, to in f.switches)
    for t in range(400, 2400, 5):  # then quiet (the smoothed demand takes a while to fall)
        f.step(float(t), 0.1, 0.05, 0)
        if f.memory.quiet_since is None:
            quiet_from = t + 5
    moved = [to for _, _, to in f.switches].count("prefill")
    returns = f.switches[moved:]
    assert [to for _, _, to in returns] == ["decode"] * moved
    assert returns[0][0] - quiet_from >= cfg.cooldown_s
    for (t0, _, _), (t1, _, _) in itertools.pairwise(returns):
        assert t1 >= t0 + 15  # the next return only once the last one landed
    roles = [s.role for s in f.states.values()]
    assert roles.count("prefill") == 2 and roles.count("decode") == 6


def test_no_return_while_the_role_giving_the_instance_would_need_it():
    """Prefill at 5 instances runs at 0.71 of its target: no pressure, but at 4 it would be at
    0.88, past the reversal ceiling (0.75), so the instance stays; at a lighter load it goes."""
    cfg = PolicyConfig(cooldown_s=300, declared_prefill_share=3 / 8)
    policy = RoleSwitchPolicy(cfg, MODEL)
    states = fleet(5, 3)
    memory = PolicyMemory()
    for t in range(0, 1800, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 0.6, 0.05), memory)
        assert decision is None
    assert memory.quiet_since == 0.0
    decision, memory = policy.decide(1800.0, states, metrics_for(states, 0.3, 0.05), memory)
    decision, memory = policy.decide(1900.0, states, metrics_for(states, 0.3, 0.05), memory)
    assert decision is not None and (decision.from_role, decision.to_role) == ("prefill", "decode")
    assert "declared split 3:5" in decision.reason


def test_any_switch_an_on_call_one_included_holds_for_a_cooldown_before_a_return():
    """Quiet for long, at its declared 4:4; an on-call request moves d3 to prefill at 1000 s. The
    fleet has been quiet far longer than a cooldown, yet d3's switch holds until 1300 s."""
    policy = RoleSwitchPolicy(PolicyConfig(cooldown_s=300, declared_prefill_share=4 / 8), MODEL)
    states = fleet(4, 4)
    memory = PolicyMemory()
    for t in range(0, 1000, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 0.1, 0.05), memory)
        assert decision is None  # at its declared split
    states = [replace(s, role="prefill", last_switch_at=1000.0) if s.name == "d3" else s for s in states]
    for t in range(1000, 1300, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 0.1, 0.05), memory)
        assert decision is None
    assert memory.quiet_since == 0.0
    decision, memory = policy.decide(1300.0, states, metrics_for(states, 0.1, 0.05), memory)
    assert decision is not None and decision.to_role == "decode" and decision.instance != "d3"


def test_a_role_that_lent_an_instance_recalls_it_before_it_is_overloaded():
    """Declared 5:3, at 6:2 since a prefill burst a minute ago. While decode runs at 0.56 of
    its target nothing moves (a return waits for a quiet cooldown); once it reaches 0.8 on its
    two instances an instance comes back at once, a minute after the last switch, not
    after a cooldown; not while prefill, at its recent peak, would be past the donor ceiling
    with one fewer."""
    policy = RoleSwitchPolicy(PolicyConfig(cooldown_s=300, declared_prefill_share=5 / 8), MODEL)
    states = [replace(s, last_switch_at=0.0) if s.name == "p5" else s for s in fleet(6, 2)]
    memory = PolicyMemory()
    for t in range(60, 120, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 0.2, 0.5), memory)
        assert decision is None
    decision, memory = policy.decide(120.0, states, metrics_for(states, 0.2, 0.8), memory)
    assert decision is not None and (decision.from_role, decision.to_role) == ("prefill", "decode")
    assert decision.instance != "p5"  # the instance that just switched keeps its cooldown
    assert decision.reason.startswith("decode recalled at 0.8") and "declared split 5:3" in decision.reason
    # The same rise while prefill has just burst: its peak at 5 instances would be past 0.85.
    memory = PolicyMemory()
    decision, memory = policy.decide(60.0, states, metrics_for(states, 0.9, 0.5), memory)
    assert decision is None
    decision, memory = policy.decide(65.0, states, metrics_for(states, 0.2, 0.8), memory)
    assert decision is None
    assert policy.projected("prefill", policy.demand_of(memory).with_bursts(), 5) > 0.85


def test_a_recall_holds_the_giver_to_the_donor_ceiling_not_the_reversal_one():
    """Declared 5:3, at 7:1 after a code segment; decode is recalled while prefill's recent
    peak projects between the reversal ceiling (0.75) and the donor ceiling (0.85) at 6: the
    instance comes back now. A quiet return with the same giver would wait."""
    policy = RoleSwitchPolicy(PolicyConfig(cooldown_s=300, declared_prefill_share=5 / 8), MODEL)
    states = fleet(7, 1)
    memory = PolicyMemory(smoothed_at=60.0, prefill_load=2.0, prefill_peak_load=4.3, decode_tokens_per_s=300.0,
                          decode_tokens_per_request=2_000.0)  # fmt: skip
    assert 0.75 < policy.projected("prefill", policy.demand_of(memory).with_bursts(), 6) <= 0.85
    decision, _ = policy.decide(65.0, states, metrics_for(states, 0.3, 0.85, prealloc=40), memory)
    assert decision is not None and (decision.from_role, decision.to_role) == ("prefill", "decode")
    assert decision.reason.startswith("decode recalled") and "(≤0.85)" in decision.reason


def test_a_donor_within_its_ceiling_is_not_made_the_worse_of_the_two_roles():
    """Prefill at 1.17 would fall to 1.00 with decode's second instance, and decode on one would
    project just above that: past its ceiling, within half prefill's overload, but worse than
    prefill after the move (the minimax split is where it is). Nothing moves; the same prefill
    overload beside a decode role that stays the lesser of the two after the move still gets
    the instance."""
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    states = fleet(6, 2)
    base = PolicyMemory(prefill_pressure_since=0.0, smoothed_at=60.0, prefill_load=6 * 0.85 * 1.17,
                        decode_tokens_per_request=1_400.0)  # fmt: skip

    def at(tokens: float) -> PolicyMemory:
        return replace(base, decode_tokens_per_s=tokens)

    def decode_on_one(tokens: float) -> float:
        return policy.projected("decode", policy.demand_of(at(tokens)), 1)

    prefill_after = policy.projected("prefill", policy.demand_of(base), 7)
    tokens = [100.0 * 1.002**i for i in range(4000)]
    heavy = at(next(t for t in tokens if decode_on_one(t) > prefill_after))
    lighter = at(next(t for t in tokens if decode_on_one(t) > 0.9))
    assert prefill_after < policy.projected("decode", policy.demand_of(heavy), 1) < 1.0 + (1.17 - 1.0) / 2
    decision, _ = policy.decide(60.0, states, metrics_for(states, 0.99, 0.1), heavy)
    assert decision is None
    assert 0.85 < policy.projected("decode", policy.demand_of(lighter), 1) <= prefill_after
    decision, _ = policy.decide(60.0, states, metrics_for(states, 0.99, 0.1), lighter)
    assert decision is not None and (decision.from_role, decision.to_role) == ("decode", "prefill")


def test_a_decode_donor_is_never_taken_past_its_own_target_even_toward_the_minimax_split():
    """Prefill at 1.6 on 6 instances (1.37 on 7); decode on one would project just past 1.0:
    within half prefill's overload and still the lesser role after the move, but past decode's
    cliff, so nothing moves. Just below 1.0 the same prefill overload gets the instance."""
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    states = fleet(6, 2)
    base = PolicyMemory(prefill_pressure_since=0.0, smoothed_at=60.0, prefill_load=6 * 0.85 * 1.6,
                        decode_tokens_per_request=1_400.0)  # fmt: skip

    def at(tokens: float) -> PolicyMemory:
        return replace(base, decode_tokens_per_s=tokens)

    def decode_on_one(tokens: float) -> float:
        return policy.projected("decode", policy.demand_of(at(tokens)), 1)

    tokens = [100.0 * 1.002**i for i in range(4000)]
    past = at(next(t for t in tokens if decode_on_one(t) > 1.0))
    below = at(max(t for t in tokens if decode_on_one(t) <= 0.98))
    prefill_after = policy.projected("prefill", policy.demand_of(base), 7)
    assert 1.0 < policy.projected("decode", policy.demand_of(past), 1) < min(prefill_after, 1.0 + (1.6 - 1.0) / 2)
    decision, _ = policy.decide(60.0, states, metrics_for(states, 0.99, 0.1), past)
    assert decision is None
    assert 0.85 < policy.projected("decode", policy.demand_of(below), 1) <= 0.98
    decision, _ = policy.decide(60.0, states, metrics_for(states, 0.99, 0.1), below)
    assert decision is not None and (decision.from_role, decision.to_role) == ("decode", "prefill")


def test_without_a_declared_split_the_fleet_stays_where_it_was_moved():
    policy = RoleSwitchPolicy(PolicyConfig(cooldown_s=300), MODEL)
    states = fleet(5, 3)
    memory = PolicyMemory()
    for t in range(0, 1800, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 0.1, 0.05), memory)
        assert decision is None


def test_from_spec_carries_the_declared_split():
    from hybridserving.api.v1alpha1 import RoleSwitchSpec

    cfg = PolicyConfig.from_spec(RoleSwitchSpec(enabled=True), declared_prefill_share=0.25)
    assert cfg.declared_prefill_share == 0.25
    assert PolicyConfig.from_spec(RoleSwitchSpec(enabled=True)).declared_prefill_share is None


@settings(max_examples=200, deadline=None)
@given(tokens=st.floats(100.0, 500_000.0), per_request=st.floats(100.0, 200_000.0))
def test_more_decode_instances_never_project_more_pressure_nor_a_larger_shortfall(tokens, per_request):
    """Across the cliff too: a batch that only just keeps up is as bad as one that cannot, never
    worse, so one more instance always helps a role past its cliff."""
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    demand = RoleDemand(0.0, tokens, per_request)
    pressure = [policy.projected("decode", demand, n) for n in range(1, 40)]
    short = [policy.shortfall("decode", demand, n) for n in range(1, 40)]
    assert all(a >= b for a, b in itertools.pairwise(pressure))
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(short))
    assert all((s > 0) == (p > 1.0) for s, p in zip(short, pressure, strict=True))


def test_a_decode_role_past_its_cliff_gets_an_instance_even_if_one_more_leaves_it_short():
    """3 decode instances cannot keep up; 4 keep up only with a batch far past the KV pool. The
    move still pays: decode is short of 1.7 instances, and 0.7 after it."""
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    states = fleet(5, 3)
    memory = PolicyMemory(
        decode_pressure_since=0.0, smoothed_at=60.0, prefill_load=1.0,
        decode_tokens_per_s=22_500.0, decode_tokens_per_request=1_400.0,
    )  # fmt: skip
    demand = policy.demand_of(memory)
    assert math.isinf(projected_decode_batch(demand, 3, MODEL)) and policy.projected("decode", demand, 4) > 1.0
    assert policy.shortfall("decode", demand, 3) - policy.shortfall("decode", demand, 4) == pytest.approx(1.0)
    decision, _ = policy.decide(60.0, states, metrics_for(states, 0.2, 0.95), memory)
    assert decision is not None and (decision.from_role, decision.to_role) == ("prefill", "decode")


def test_a_prefill_backlog_past_the_pressure_cap_still_gets_an_instance():
    """A backlog deep enough that two and three prefill instances would both read the old cap of
    50: the projection must still show what the third one relieves, or the policy holds still
    exactly when prefill is furthest behind."""
    policy = RoleSwitchPolicy(PolicyConfig(sustain_s=20), MODEL)
    states = fleet(2, 2)
    demand = RoleDemand(300.0, 100.0, 500.0)
    on_two, on_three = policy.projected("prefill", demand, 2), policy.projected("prefill", demand, 3)
    assert on_three > 50.0 and on_two == pytest.approx(on_three * 3 / 2)
    assert policy.projected("prefill", demand, 0) >= policy.projected("prefill", demand, 1)
    memory, decision = PolicyMemory(), None
    for t in range(0, 60, 5):
        decision, memory = policy.decide(float(t), states, metrics_for(states, 1.0, 0.01, 3_000_000), memory)
        if decision:
            break
    assert decision is not None and (decision.from_role, decision.to_role) == ("decode", "prefill")


def test_decisions_are_deterministic():
    states = fleet(3, 5)
    m = metrics_for(states, 1.0, 0.2, 80_000)
    policy = RoleSwitchPolicy(PolicyConfig(sustain_s=0), MODEL)
    assert policy.decide(10.0, states, m) == policy.decide(10.0, states, m)


def decode_metrics(
    states, kv: float, running: int, prealloc: int = 0, prefill_util: float = 1.0, queue_tokens: int = 60_000
):
    """Prefill saturated with a queue; decode at `kv` usage with `running` requests each."""
    out = {}
    for s in states:
        if s.role == "prefill":
            out[s.name] = InstanceMetrics(
                "prefill",
                prefill_queue_tokens=queue_tokens,
                prefill_queue_reqs=4,
                utilization=prefill_util,
            )
        else:
            out[s.name] = InstanceMetrics("decode", kv_usage=kv, running_reqs=running, prealloc_queue_reqs=prealloc)
    return out


def test_no_switch_on_steady_load_near_the_decode_cliff():
    """Prefill is short, decode has room on paper (40 % KV), but with long contexts the step time
    grows with the batch: one decode instance fewer would need a batch past the KV pool."""
    cfg = PolicyConfig(sustain_s=10)
    policy = RoleSwitchPolicy(cfg, MODEL)
    states = fleet(5, 3)
    m = decode_metrics(states, kv=0.40, running=40)
    # A linear projection ("the same load over one instance fewer") would call this safe...
    assert 0.40 * 3 / 2 / cfg.target_kv_usage < cfg.donor_ceiling
    # ...the queueing projection sees the cliff.
    demand = policy.demand_of(policy.observe(0.0, states, m, PolicyMemory()))
    assert policy.projected("decode", demand, 2) > 1.0 > policy.projected("decode", demand, 3)
    memory = PolicyMemory()
    for t in range(0, 1800, 5):
        decision, memory = policy.decide(float(t), states, m, memory)
        assert decision is None
    assert memory.prefill_pressure_since is not None  # prefill was under pressure all along


def test_a_clear_mix_reversal_moves_back_within_the_cooldown_but_never_the_same_instance():
    cfg = PolicyConfig(cooldown_s=600, sustain_s=10, max_concurrent=1)
    f = Fleet(3, 5, cfg)
    for t in range(0, 120, 5):  # prefill-heavy: decode nearly idle
        f.step(float(t), 1.0, 0.05, 80_000)
    assert f.switches and all(to == "prefill" for _, _, to in f.switches)
    moved_to_prefill = {name for _, name, _ in f.switches}
    first = len(f.switches)
    for t in range(120, 400, 5):  # the mix reverses: decode KV fills, prefill idles
        f.step(float(t), 0.1, 0.97, 0, prealloc=20)
    back = [(t, name) for t, name, to in f.switches[first:] if to == "decode"]
    assert back and back[0][0] < 600  # well inside the cooldown of the first move
    assert not {name for _, name in back} & moved_to_prefill  # per-instance cooldown


def test_a_large_imbalance_moves_several_instances_at_once_within_max_concurrent():
    cfg = PolicyConfig(sustain_s=0, max_concurrent=3)
    policy = RoleSwitchPolicy(cfg, MODEL)
    states = fleet(2, 6)
    m = metrics_for(states, 1.0, 0.02, 100_000)
    decisions, _ = policy.decide_all(0.0, states, m)
    assert 2 <= len(decisions) <= 3 and len({d.instance for d in decisions}) == len(decisions)
    assert all(d.to_role == "prefill" for d in decisions)
    one, _ = policy.decide(0.0, states, m)
    assert one == decisions[0]  # decide() is the first step of the same move


def test_a_switch_putting_its_instance_back_counts_against_max_concurrent():
    """A refused or failed switch holds its instance out of the router through Restore or Restart:
    with maxConcurrent 1 no other instance may start meanwhile."""
    cfg = PolicyConfig(sustain_s=0, max_concurrent=1)
    policy = RoleSwitchPolicy(cfg, MODEL)
    states = fleet(2, 6)
    m = metrics_for(states, 1.0, 0.02, 100_000)
    assert policy.decide(0.0, states, m)[0] is not None, "the move this test holds back"
    back = [replace(states[-1], phase="down", restoring=True), *states[:-1]]
    assert policy.decide(0.0, back, {k: v for k, v in m.items() if k != states[-1].name})[0] is None
    down = [replace(states[-1], phase="down"), *states[:-1]]
    assert policy.decide(0.0, down, {k: v for k, v in m.items() if k != states[-1].name})[0] is not None, \
        "a down instance in no switch holds nothing"


def test_memory_round_trips_through_a_dict():
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    states = fleet(3, 5)
    memory = policy.observe(10.0, states, metrics_for(states, 0.9, 0.4, 20_000), PolicyMemory())
    assert PolicyMemory.from_dict(memory.to_dict()) == memory
    assert PolicyMemory.from_dict({"prefill_pressure_since": 5, "unknown": 1}) == PolicyMemory(
        prefill_pressure_since=5.0
    )
    assert PolicyMemory.from_dict(None) == PolicyMemory()


def test_a_clear_large_overload_moves_after_the_acute_sustain_not_the_full_one():
    """Every prefill instance's queue alone exceeds the TTFT limit: the fast path needs only
    `acute_sustain_s`; a mild overload (queues within the limit) still waits for `sustain_s`."""
    cfg = PolicyConfig(sustain_s=60, acute_sustain_s=10)
    policy = RoleSwitchPolicy(cfg, MODEL)
    states = fleet(2, 6)
    hot = metrics_for(states, 1.0, 0.02, 200_000)  # ~5.8 s of work queued on each; decode nearly idle
    memory, first = PolicyMemory(), None
    for t in range(0, 60, 5):
        decision, memory = policy.decide(float(t), states, hot, memory)
        if decision:
            first = t
            break
    assert first is not None and 10 <= first < 60
    assert "acute" in decision.reason and decision.to_role == "prefill"
    # Queues that clear within the limit are not acute: the full sustain applies.
    mild = metrics_for(states, 1.0, 0.1, 30_000)
    memory, first = PolicyMemory(), None
    for t in range(0, 120, 5):
        decision, memory = policy.decide(float(t), states, mild, memory)
        if decision:
            first = t
            break
    assert first is None or first >= 60
    assert memory.prefill_acute_since is None


def test_the_fast_path_can_be_turned_off():
    policy = RoleSwitchPolicy(PolicyConfig(sustain_s=60, acute_sustain_s=0), MODEL)
    states = fleet(2, 6)
    hot = metrics_for(states, 1.0, 0.1, 200_000)
    memory = PolicyMemory()
    for t in range(0, 60, 5):
        decision, memory = policy.decide(float(t), states, hot, memory)
        assert decision is None


def test_after_an_instance_lands_the_pressure_must_be_sustained_anew():
    """Feedback: the next instance follows only once the overload has outlasted the sustain
    since the last one landed (a backlog that the new instance is draining is not new demand)."""
    cfg = PolicyConfig(sustain_s=30, acute_sustain_s=10, cooldown_s=600, max_concurrent=1)
    f = Fleet(2, 6, cfg)
    for t in range(0, 300, 5):
        f.step(float(t), 1.0, 0.02, 200_000)
    assert len(f.switches) >= 2
    for (t0, _, _), (t1, _, _) in itertools.pairwise(f.switches):
        assert t1 - (t0 + 15) >= cfg.acute_sustain_s  # landed 15 s after the start


def test_memory_with_acute_clocks_round_trips_and_old_status_loads():
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    states = fleet(2, 6)
    memory = policy.observe(10.0, states, metrics_for(states, 1.0, 0.1, 200_000), PolicyMemory())
    assert memory.prefill_acute_since == 10.0
    assert PolicyMemory.from_dict(memory.to_dict()) == memory
    old = {k: v for k, v in memory.to_dict().items() if not k.endswith("acute_since")}
    assert PolicyMemory.from_dict(old).prefill_acute_since is None


def test_the_fast_path_does_not_start_a_relaunch():
    cfg = PolicyConfig(sustain_s=60, acute_sustain_s=10, cooldown_s=3600)
    policy = RoleSwitchPolicy(cfg, MODEL)
    states = fleet(2, 6, in_place=False)
    hot = metrics_for(states, 1.0, 0.1, 200_000)
    memory = PolicyMemory()
    for t in range(0, 60, 5):
        decision, memory = policy.decide(float(t), states, hot, memory)
        assert decision is None


def test_queued_prompts_are_priced_with_the_models_compute_not_per_token():
    from hybridserving.core.policy import queued_prefill_seconds

    m = InstanceMetrics("prefill", prefill_queue_tokens=64_000, prefill_queue_reqs=1)
    linear = 64_000 * MODEL.prefill_per_token_s
    assert queued_prefill_seconds(m, MODEL) == pytest.approx(MODEL.prefill_chunk_compute_seconds(64_000))
    assert queued_prefill_seconds(m, MODEL) > 1.5 * linear  # the attention pairs dominate long prompts
    split = replace(m, prefill_queue_reqs=16)
    assert queued_prefill_seconds(split, MODEL) < queued_prefill_seconds(m, MODEL)  # short prompts: few pairs


def test_a_short_kv_wait_is_not_an_acute_decode_overload_but_a_long_one_is():
    """Requests waiting a fraction of a second for KV cost little TTFT; the fast path ignores them."""
    policy = RoleSwitchPolicy(PolicyConfig(), MODEL)
    states = fleet(2, 2)

    def metrics(prealloc: int, running: int):
        m = metrics_for(states, 0.5, 0.95)
        for name in ("d0", "d1"):
            m[name] = InstanceMetrics(
                "decode",
                kv_usage=0.95,
                running_reqs=running,
                prealloc_queue_reqs=prealloc,
                output_tokens_per_request=20,
            )
        return m

    assert not policy.acute(states, metrics(prealloc=2, running=200))["decode"]
    memory = policy.observe(0.0, states, metrics(prealloc=2, running=200), PolicyMemory())
    assert memory.output_tokens_per_request == pytest.approx(20)  # from the counters' ratio
    long = PolicyMemory(output_tokens_per_request=2000)
    assert policy.acute(states, metrics(prealloc=100, running=50), long)["decode"]
