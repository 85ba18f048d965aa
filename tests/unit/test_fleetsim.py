"""The fleet simulator, its trace readers and the goodput search."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.core.policy import (
    FleetScaler,
    InstanceMetrics,
    InstanceState,
    PolicyConfig,
    RoleSwitchPolicy,
    ScaleAction,
    ScalingConfig,
)
from hybridserving.api.profiles import PROFILES
from hybridserving.fleetsim import traces
from hybridserving.fleetsim.baselines import (
    PlannerStyleScaler,
    PolicyController,
    RestartRebalancer,
    ScalingPlanner,
    SplitwiseMixedPool,
    zero_cost_relabel,
)
from hybridserving.fleetsim.experiment import SPLITWISE_ONE_SETTING, policy_sweeps
from hybridserving.fleetsim.goodput import Slo, oracle_phase_score, phase_score, search_goodput
from hybridserving.fleetsim.simulator import FleetConfig, FleetSimulator

MODEL = PerformanceModel.for_role(PROFILES["glm-5.2"], tp=8)
REPO = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("HYBRIDSERVING_TRACES", REPO.parent / "shared" / "traces"))


def test_azure_csv_reader(tmp_path):
    f = tmp_path / "azure.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:05.5000000,100,0\n"
    )
    t = traces.read_azure_csv(f)
    assert t.arrival_s.tolist() == pytest.approx([0.0, 0.052, 1.52004], abs=1e-6)
    assert t.prompt_tokens.tolist() == [4808, 3180, 100]
    assert t.output_tokens.tolist() == [10, 8, 1]  # at least one output token
    assert traces.read_azure_csv(f, limit=2).prompt_tokens.tolist() == [4808, 3180]


def test_mooncake_reader_counts_prefix_hits_from_repeated_blocks(tmp_path):
    f = tmp_path / "mc.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 2500, "input_length": 1600, "output_length": 20, "hash_ids": [1, 2, 4, 5]},
        {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [9, 1]},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = traces.read_mooncake_jsonl(f)
    assert t.arrival_s.tolist() == [0.0, 2.5, 3.0]
    assert t.cached_tokens.tolist() == [0, 1024, 0]  # leading run of seen blocks only


def test_scaling_and_folding_keep_requests_and_change_rate():
    t = traces.make_trace("x", np.arange(100.0), np.full(100, 1000), np.full(100, 50))
    assert traces.Trace.scaled(t, 2.0).duration_s == pytest.approx(t.duration_s / 2)
    folded = traces.fold(t, 25.0)
    assert len(folded) == 100 and folded.duration_s < 25.0


def test_mix_shift_alternates_prefill_and_decode_heavy_segments():
    rng = np.random.default_rng(0)
    code = traces.make_trace("code", np.sort(rng.uniform(0, 3600, 500)), np.full(500, 2000), np.full(500, 20))
    conv = traces.make_trace("conv", np.sort(rng.uniform(0, 3600, 500)), np.full(500, 1000), np.full(500, 200))
    mix = traces.mix_shift(code, conv, segment_s=600.0, segments=4)
    seg = (mix.arrival_s // 600).astype(int)
    assert set(mix.output_tokens[seg == 0]) == {20} and set(mix.output_tokens[seg == 1]) == {200}
    assert len(mix) == 4 * 500


def test_agentic_sessions_grow_context_and_hit_the_cache():
    t = traces.agentic_sessions(sessions=6, context_tokens=100_000, duration_s=1800, waves=2)
    assert t.prompt_tokens.max() <= 100_000 + 6000 and t.prompt_tokens.min() >= 50_000
    assert (t.cached_tokens > 0).mean() > 0.5 and np.all(t.cached_tokens < t.prompt_tokens)


@pytest.mark.skipif(
    not (TRACES / "conversation_trace.jsonl").exists(),
    reason=f"public traces not found at {TRACES} (set HYBRIDSERVING_TRACES)",
)
def test_reads_the_first_rows_of_the_real_traces():
    code = traces.read_azure_csv(TRACES / "AzureLLMInferenceTrace_code.csv", limit=200)
    conv = traces.read_azure_csv(TRACES / "AzureLLMInferenceTrace_conv.csv", limit=200)
    kimi = traces.read_mooncake_jsonl(TRACES / "conversation_trace.jsonl", limit=200)
    for t in (code, conv, kimi):
        assert len(t) == 200 and t.prompt_tokens.min() >= 1 and np.all(np.diff(t.arrival_s) >= 0)
    assert code.prompt_tokens.mean() / code.output_tokens.mean() > conv.prompt_tokens.mean() / conv.output_tokens.mean()


def poisson(rate, duration, prompt, output, seed=0):
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate * duration)
    return traces.make_trace("p", np.sort(rng.uniform(0, duration, n)), np.full(n, prompt), np.full(n, output))


def test_light_load_meets_the_perf_model_latencies():
    trace = poisson(0.2, 300, 4096, 100)
    r = FleetSimulator(FleetConfig(4, 2, MODEL)).run(trace)
    assert np.all(np.isfinite(r.ttft_s)) and np.all(np.isfinite(r.tpot_s))
    floor = MODEL.prefill_seconds(4096) + MODEL.transfer_seconds(4096)
    assert r.ttft_s.min() == pytest.approx(floor, rel=1e-6)
    assert r.tpot_s.min() >= MODEL.decode_step_seconds(1, 4096) * 0.999
    assert r.attainment(2.0, 0.05) == 1.0


def test_decode_kv_exhaustion_is_a_cliff_for_ttft():
    small = PerformanceModel.for_role(PROFILES["glm-5.2"], tp=8, kv_tokens=200_000)
    trace = poisson(4.0, 200, 8000, 1500)
    roomy = FleetSimulator(FleetConfig(4, 2, MODEL)).run(trace)
    tight = FleetSimulator(FleetConfig(4, 2, small)).run(trace)
    assert np.median(tight.ttft_s) > 5 * np.median(roomy.ttft_s)


def test_decode_kv_usage_is_what_is_resident_not_the_output_still_to_come():
    """SGLang's token usage counts the KV slots held now; the output a request will generate is
    known to no engine, so a policy reading the simulator must not see it either."""
    trace = traces.make_trace("one", np.array([0.0]), np.array([1000]), np.array([30_000]))
    sim = FleetSimulator(FleetConfig(2, 1, MODEL))
    sim.start(trace)
    cap = MODEL.kv_capacity_tokens
    seen = []
    for t in (2.0, 6.0, 12.0):
        sim.advance(t)
        seen.append(sim.metrics(t)["i001"].kv_usage * cap)
    assert 1000 <= seen[0] < seen[1] < seen[2] < 1000 + 30_000 / 2, seen
    step = MODEL.decode_step_seconds(1, 1000)
    assert seen[2] - seen[1] == pytest.approx(6.0 / step, rel=0.2), "one token per step"


def test_more_decode_instances_lower_tpot_under_decode_heavy_load():
    trace = poisson(20.0, 200, 500, 400)
    one = FleetSimulator(FleetConfig(4, 3, MODEL)).run(trace)
    three = FleetSimulator(FleetConfig(4, 1, MODEL)).run(trace)
    assert np.median(three.tpot_s) < np.median(one.tpot_s)


class Checked:
    """Wraps a controller and asserts the fleet invariants at every tick of a simulation."""

    def __init__(self, inner, cfg: PolicyConfig):
        self.inner, self.cfg, self.name = inner, cfg, inner.name
        self.ticks = 0

    def tick(self, now, fleet, metrics):
        self.ticks += 1
        in_flight = sum(1 for s in fleet if s.phase != "serving")
        assert in_flight <= self.cfg.max_concurrent
        for role, floor in (("prefill", self.cfg.min_prefill), ("decode", self.cfg.min_decode)):
            assert sum(1 for s in fleet if s.role == role and s.phase == "serving") >= floor
        decisions = self.inner.tick(now, fleet, metrics)
        for d in decisions:
            s = next(x for x in fleet if x.name == d.instance)
            assert not s.pinned
            assert s.last_switch_at is None or now - s.last_switch_at >= self.cfg.cooldown_s
        return decisions


def shifting_trace():
    a = poisson(16.0, 600, 6000, 30, seed=1)
    b = poisson(12.0, 600, 600, 600, seed=2)
    return traces.make_trace(
        "shift",
        np.concatenate([a.arrival_s, b.arrival_s + 600]),
        np.concatenate([a.prompt_tokens, b.prompt_tokens]),
        np.concatenate([a.output_tokens, b.output_tokens]),
    )


@pytest.mark.slow
def test_policy_follows_a_mix_shift_within_its_invariants():
    cfg = PolicyConfig(cooldown_s=120, sustain_s=10, max_concurrent=2, min_prefill=1, min_decode=1)
    ctl = Checked(PolicyController(RoleSwitchPolicy(cfg, MODEL)), cfg)
    sim = FleetSimulator(FleetConfig(6, 3, MODEL), ctl, pinned=["i005"])
    r = sim.run(shifting_trace(), "ours")
    assert ctl.ticks > 100 and r.switches >= 1
    assert np.all(np.isfinite(r.ttft_s))  # every request finished
    assert "i005" not in {d.instance for _, d in r.decisions}
    first_half = r.timeline_prefill[r.timeline_t < 600].max()
    assert first_half > 3  # moved towards prefill while prompts were long


@pytest.mark.slow
def test_between_agentic_waves_the_fleet_is_back_at_its_declared_split():
    """Waves of long-context sessions (prefill-heavy as a wave opens, KV-heavy as it proceeds, idle
    between): whatever the policy does inside a wave, the next wave opens at the split the fleet
    was declared at, and no wave fares worse than on that split held fixed."""
    from hybridserving.fleetsim.experiment import LONG_CONTEXT_SLO, shipped_config
    from hybridserving.fleetsim.goodput import phase_attainments

    trace = traces.agentic_sessions().at_load(4.4)
    cfg = shipped_config(LONG_CONTEXT_SLO)
    ctl = Checked(PolicyController(RoleSwitchPolicy(cfg, MODEL)), cfg)
    ours = FleetSimulator(FleetConfig(8, 6, MODEL), ctl).run(trace, "ours")
    static = FleetSimulator(FleetConfig(8, 6, MODEL)).run(trace, "static 6:2")
    assert ours.switches >= 2  # it moved inside the waves...
    for opens in (1200.0, 2400.0):  # ...and each later wave opens at 6:2
        before = (ours.timeline_t > opens - 60) & (ours.timeline_t <= opens)
        assert before.any() and set(ours.timeline_prefill[before].tolist()) == {6}
    returns = [d for _, d in ours.decisions if "declared split 6:2" in d.reason]
    assert returns and all(d.to_role == "prefill" for d in returns)
    waves = (0.0, 1200.0, 2400.0, 3600.0)
    mine = phase_attainments(ours, LONG_CONTEXT_SLO, waves)
    fixed = phase_attainments(static, LONG_CONTEXT_SLO, waves)
    assert all(a >= b - 0.02 for a, b in zip(mine, fixed, strict=True)), (mine, fixed)


def test_hindsight_sizing_serves_each_window_with_the_fewest_instances_that_meet_it():
    from hybridserving.fleetsim.experiment import DEFAULT_SLO, hindsight_sizing
    from hybridserving.fleetsim.simulator import SimResult

    arrival = np.arange(0.0, 1200.0)
    quiet_then_busy = arrival < 600  # two instances meet the first window only

    def fleet(n: int, ok: np.ndarray) -> SimResult:
        ttft = np.where(ok, 0.5, 5.0)
        empty = np.zeros(0)
        return SimResult(f"fixed {n}", "t", n, 8, arrival, ttft, np.full(len(arrival), 0.01), 0, 0.0, 0.0,
                         empty, empty, empty)

    fixed = {2: [fleet(2, quiet_then_busy)], 3: [fleet(3, np.ones(len(arrival), dtype=bool))]}
    row = hindsight_sizing(fixed, DEFAULT_SLO, 3, 1200.0)
    assert row.gpu_hours == pytest.approx((2 * 600 + 3 * 600) * 8 / 3600)
    assert row.attainment == 1.0 and row.misses == 0
    # A window no smaller fleet meets falls to the peak fleet's best split, misses and all.
    fixed[3] = [fleet(3, arrival % 10 != 0), fleet(3, arrival % 5 != 0)]
    row = hindsight_sizing(fixed, DEFAULT_SLO, 3, 1200.0)
    assert row.gpu_hours == pytest.approx((2 * 600 + 3 * 600) * 8 / 3600) and row.misses == 60
    # Each window may take another split of the same size: two instances serve both windows.
    fixed[2].append(fleet(2, ~quiet_then_busy))
    row = hindsight_sizing(fixed, DEFAULT_SLO, 3, 1200.0)
    assert row.gpu_hours == pytest.approx(2 * 1200 * 8 / 3600) and row.misses == 0


class PlannerProbe:
    """Wraps the restart-based planner; at each of its decisions records and checks its own plan."""

    def __init__(self, inner: RestartRebalancer):
        self.inner, self.name = inner, inner.name
        self.moves: list[tuple[float, str, int, int | None, int | None]] = []

    def tick(self, now, fleet, metrics):
        decisions = self.inner.tick(now, fleet, metrics)
        if decisions:
            assert len(decisions) == 1  # one instance per interval
            assert all(s.phase == "serving" for s in fleet)  # blocks while a change is in flight
            d = decisions[0]
            assert d.mode == "relaunch"
            need_p, need_d = self.inner.needs(self.inner.predicted_demand(), len(fleet))
            left = sum(1 for s in fleet if s.role == d.from_role) - 1
            need = need_p if d.from_role == "prefill" else need_d
            if need_p is not None and need_d is not None and need_p + need_d <= len(fleet):
                assert left >= need, f"{d.from_role} thinned to {left} below its projected need {need}"
            self.moves.append((now, d.to_role, left, need_p, need_d))
        return decisions


def test_restart_based_leaves_a_fleet_alone_at_low_steady_load():
    # The rule sizes each role from its projected need: at low load no role is short, so nothing
    # moves (a split proportional to the two roles' pressures would thin decode to one instance).
    cfg = PolicyConfig(min_prefill=1, min_decode=1)
    probe = PlannerProbe(RestartRebalancer(cfg, MODEL, interval_s=60))
    r = FleetSimulator(FleetConfig(6, 3, MODEL, in_place=False), probe).run(
        poisson(2.0, 1800, 2000, 300), "restart-based"
    )
    assert r.switches == 0 and r.timeline_decode.min() == 3
    need_p, need_d = probe.inner.needs(probe.inner.predicted_demand(), 6)
    assert need_p is not None and need_d is not None and need_p <= 3 and need_d <= 3


def test_restart_based_moves_to_a_short_role_one_relaunch_at_a_time_never_below_the_donors_need():
    # Prompt-heavy steady load on a 1:5 fleet: prefill is short, decode has instances to spare.
    cfg = PolicyConfig(min_prefill=1, min_decode=1)
    probe = PlannerProbe(RestartRebalancer(cfg, MODEL, interval_s=60))
    r = FleetSimulator(FleetConfig(6, 1, MODEL, in_place=False), probe).run(
        poisson(3.0, 3600, 8000, 50), "restart-based"
    )
    assert r.switches >= 1 and all(to == "prefill" for _, to, *_ in probe.moves)
    # Every move pays the model's restart time, and the receiver gets nothing before it has passed.
    assert r.switch_s == pytest.approx(r.switches * MODEL.relaunch_switch_s)
    first = probe.moves[0][0]
    before = (r.timeline_t > first) & (r.timeline_t < first + MODEL.relaunch_switch_s)
    assert r.timeline_prefill[before].max() == 1
    assert r.timeline_prefill[r.timeline_t >= first + MODEL.relaunch_switch_s + 60].max() == 2
    # Blocking: the next move starts only after the last one has landed.
    gaps = np.diff([t for t, *_ in probe.moves])
    assert np.all(gaps >= MODEL.relaunch_switch_s)
    # Decode keeps what its own projection says it needs at the end, as at every move.
    need_p, need_d = probe.inner.needs(probe.inner.predicted_demand(), 6)
    assert need_d is not None and r.timeline_decode[-1] >= need_d


def test_splitwise_triggers_on_the_least_loaded_prefill_queue_and_borrows_one_at_a_time():
    cfg = PolicyConfig(min_prefill=1, min_decode=1)
    sw = SplitwiseMixedPool(cfg, queue_threshold_tokens=8192)
    fleet = [
        InstanceState("p0", "prefill"),
        InstanceState("p1", "prefill"),
        InstanceState("d0", "decode"),
        InstanceState("d1", "decode"),
        InstanceState("d2", "decode"),
    ]
    m = {
        "p0": InstanceMetrics("prefill", prefill_queue_tokens=20000),
        "p1": InstanceMetrics("prefill", prefill_queue_tokens=1000),
        "d0": InstanceMetrics("decode", kv_usage=0.2),
        "d1": InstanceMetrics("decode", kv_usage=0.1),
        "d2": InstanceMetrics("decode", kv_usage=0.3),
    }
    assert sw.tick(0.0, fleet, m) == []  # the best prefill instance still has room
    m["p1"] = InstanceMetrics("prefill", prefill_queue_tokens=9000)
    [d] = sw.tick(5.0, fleet, m)
    assert (d.instance, d.to_role) == ("d1", "prefill")
    moving = [replace(s, phase="draining", target_role="prefill") if s.name == "d1" else s for s in fleet]
    assert sw.tick(10.0, moving, m) == []  # wait for the borrowed instance to land


@pytest.mark.slow
def test_zero_cost_relabel_pays_no_switch_time():
    from hybridserving.fleetsim.experiment import DEFAULT_SLO, Runner, Workload

    w = Workload("shift", "shift", shifting_trace(), DEFAULT_SLO)
    runner = Runner(w, 6, MODEL, iterations=1)
    cfg = PolicyConfig(cooldown_s=60, sustain_s=0, max_concurrent=4)
    r = runner.simulate(1.0, 3, zero_cost_relabel(MODEL, cfg), name="zero-cost", free=True)
    assert r.switches >= 1 and r.switch_s == 0.0
    paid = runner.simulate(1.0, 3, zero_cost_relabel(MODEL, cfg), name="in-place")
    assert paid.switch_s == pytest.approx(paid.switches * MODEL.in_place_switch_s)


@pytest.mark.slow
def test_restart_based_and_splitwise_run_and_respect_floors():
    cfg = PolicyConfig(max_concurrent=8, min_prefill=1, min_decode=1, cooldown_s=0)
    for inner in (RestartRebalancer(cfg, MODEL, interval_s=60), SplitwiseMixedPool(cfg)):
        r = FleetSimulator(
            FleetConfig(6, 3, MODEL, in_place=not isinstance(inner, RestartRebalancer)), Checked(inner, cfg)
        ).run(shifting_trace(), inner.name)
        assert np.isfinite(r.ttft_s).all()


def test_splitwise_at_one_setting_is_a_point_of_its_own_sweep():
    """The one-setting row is the swept rule held still (as ours is), not a different rule."""
    sweeps = policy_sweeps(MODEL, Slo(ttft_s=2.0, tpot_s=0.050), quick=True)
    one, swept = sweeps["splitwise-one"], sweeps["splitwise"]
    assert list(one.grid) == [SPLITWISE_ONE_SETTING]
    assert SPLITWISE_ONE_SETTING in list(swept.grid)
    built = one.make(**one.grid[0])
    assert isinstance(built, SplitwiseMixedPool)
    assert (built.queue_threshold_tokens, built.return_hold_s) == (32768, 300.0)
    assert "one setting" in one.note and not swept.note


def test_goodput_search_finds_the_threshold_of_a_monotone_curve():
    assert search_goodput(lambda s: 1.0 if s <= 2.5 else 0.5, low=0.1, high=10, iterations=20) == pytest.approx(
        2.5, rel=1e-3
    )
    assert search_goodput(lambda s: 0.0) == 0.0


@pytest.mark.slow
def test_per_window_projection_is_at_least_every_static_split_in_every_phase():
    trace = shifting_trace()
    slo = Slo(2.0, 0.05)
    bounds = (0.0, 600.0, 1200.0)
    results = [FleetSimulator(FleetConfig(4, k, MODEL)).run(trace) for k in (1, 2, 3)]
    projection = oracle_phase_score(results, slo, 120.0, bounds)
    assert all(projection >= phase_score(r, slo, bounds) - 1e-12 for r in results)


@pytest.mark.slow
def test_an_hour_of_a_small_fleet_simulates_quickly():
    import time

    trace = poisson(10.0, 3600, 2000, 200)
    start = time.process_time()
    FleetSimulator(FleetConfig(8, 4, MODEL)).run(trace)
    assert time.process_time() - start < 30


def test_goodput_search_looks_past_a_dip_and_reports_the_highest_passing_rate():
    curve = lambda s: 1.0 if s <= 2.0 or 2.2 < s <= 2.6 else 0.0  # noqa: E731 - a dip at 2.0..2.2
    found = search_goodput(curve, start=1.0, step=1.1, iterations=4)
    assert 2.4 < found <= 2.6
    assert search_goodput(lambda s: 1.0 if s <= 0.3 else 0.0, start=1.0, step=1.25, iterations=6) == pytest.approx(
        0.3, rel=0.03
    )


class CheckedScaling:
    """Wraps a scaling planner and asserts its invariants at every tick of a whole scenario:
    floors, the ceiling, the launch budget, drain before removal, pins, and no flapping (no
    removal within the scale-down delay of a launch)."""

    def __init__(self, inner, scaling: ScalingConfig):
        self.inner, self.scaling, self.name = inner, scaling, inner.name
        self.ticks = 0
        self.phases: dict[str, str] = {}
        self.adds: list[float] = []
        self.removes: list[float] = []
        self.removed: set[str] = set()

    def tick(self, now, fleet, metrics):
        self.ticks += 1
        cfg = self.scaling
        held = [s for s in fleet if s.phase != "down"]
        assert len(held) <= cfg.max_instances
        assert sum(1 for s in fleet if s.phase == "switching" and s.target_role == s.role) <= cfg.max_launching
        for role, floor in (("prefill", cfg.min_prefill), ("decode", cfg.min_decode)):
            assert sum(1 for s in fleet if s.role == role and s.phase == "serving") >= floor
        for s in fleet:
            before = self.phases.get(s.name)
            if s.phase == "down" and before not in (None, "down"):
                # Only an instance the planner removed goes down, and only through its drain (the
                # simulator takes it down once it holds no work; no request is lost, checked below).
                assert s.name in self.removed, f"{s.name} went down from {before} without a removal"
            self.phases[s.name] = s.phase
        actions = self.inner.tick(now, fleet, metrics)
        for a in actions:
            s = next(x for x in fleet if x.name == a.instance)
            assert not s.pinned
            if isinstance(a, ScaleAction) and a.kind == "add":
                assert s.phase == "down"
                self.adds.append(now)
            elif isinstance(a, ScaleAction):
                assert s.phase == "serving"
                assert not self.adds or now - max(self.adds) >= cfg.scale_down_delay_s
                self.removes.append(now)
                self.removed.add(a.instance)
        return actions


def ramp_trace():
    """Low load, a peak several times higher, then low again (conversation-like requests)."""
    parts = [
        poisson(4.0, 600, 1500, 150, seed=3),
        poisson(24.0, 900, 1500, 150, seed=4),
        poisson(4.0, 1500, 1500, 150, seed=5),
    ]
    offsets = [0.0, 600.0, 1500.0]
    return traces.make_trace(
        "ramp",
        np.concatenate([p.arrival_s + o for p, o in zip(parts, offsets, strict=True)]),
        np.concatenate([p.prompt_tokens for p in parts]),
        np.concatenate([p.output_tokens for p in parts]),
    )


@pytest.mark.slow
def test_scaling_planner_scales_up_and_down_within_its_invariants():
    cfg = PolicyConfig(cooldown_s=120, sustain_s=10)
    scaling = ScalingConfig(max_instances=8, max_launching=2, scale_down_delay_s=300)
    policy = RoleSwitchPolicy(cfg, MODEL)
    ctl = CheckedScaling(ScalingPlanner(policy, FleetScaler(scaling, policy)), scaling)
    sim = FleetSimulator(FleetConfig(8, 1, MODEL, initial_decode=1, launch_s=120.0), ctl, pinned=["i000"])
    r = sim.run(ramp_trace(), "ours+scaling")
    assert np.isfinite(r.ttft_s).all()  # nothing lost: removals drained first
    assert r.scale_ups >= 1 and r.scale_downs >= 1
    assert ctl.adds and ctl.removes and min(ctl.removes) > min(ctl.adds)
    held = r.timeline_provisioned
    assert held.max() > 2 and held[-1] < held.max()
    assert "i000" not in {a.instance for _, a in r.decisions if isinstance(a, ScaleAction) and a.kind == "remove"}
    # GPU-hours count what the fleet held, less than the full ceiling for the whole run.
    assert 0 < r.gpu_hours < 8 * 8 * r.timeline_t[-1] / 3600


@pytest.mark.slow
def test_planner_style_scaler_moves_one_per_role_per_interval_and_pays_the_launch():
    cfg = PolicyConfig()
    ctl = PlannerStyleScaler(cfg, MODEL, max_instances=8, interval_s=60.0, headroom=0.85)
    sim = FleetSimulator(FleetConfig(8, 1, MODEL, initial_decode=1, launch_s=120.0), ctl)
    r = sim.run(ramp_trace(), "planner")
    per_tick: dict[float, list] = {}
    for t, a in r.decisions:
        per_tick.setdefault(t, []).append(a)
    for actions in per_tick.values():
        for role in ("prefill", "decode"):
            assert sum(1 for a in actions if a.role == role) <= 1
    adds = [t for t, a in r.decisions if a.kind == "add"]
    assert adds and np.isfinite(r.ttft_s).all()
    # The first launched instance serves only after its launch time.
    first = adds[0]
    served = r.timeline_t[(r.timeline_prefill + r.timeline_decode) > 2]
    assert served.size and served.min() >= first + 120.0


@pytest.mark.slow
def test_hindsight_oracle_is_at_least_the_best_static_split_and_ours():
    from hybridserving.fleetsim.experiment import DEFAULT_SLO, Runner, Workload, shipped_config

    w = Workload("shift", "shift", shifting_trace(), DEFAULT_SLO, (0.0, 600.0, 1200.0))
    runner = Runner(w, 6, MODEL, iterations=1)
    for scale in (1.0, 1.5):
        bound, _ = runner.hindsight(scale)
        assert bound >= runner.best_static(scale)[1]
        # The search halves its segments while that gains: no grid it tries scores above it.
        assert bound >= max(runner.hindsight_at(scale, s)[0] for s in (75.0, 37.5))
        ours = runner.dynamic(
            scale, lambda: PolicyController(RoleSwitchPolicy(shipped_config(DEFAULT_SLO), MODEL)), True, "ours"
        )
        assert bound >= runner.score(ours, scale)


def test_load_is_varied_on_the_trace_clock_and_nested():
    t = traces.make_trace("x", np.arange(1000.0), np.full(1000, 100), np.full(1000, 10))
    low, high = t.at_load(0.5), t.at_load(2.5)
    assert abs(len(low) - 500) < 60 and abs(len(high) - 2500) < 60
    assert high.duration_s == pytest.approx(t.duration_s, abs=3.0)  # phases keep their length
    assert set(low.arrival_s.tolist()) <= set(
        t.at_load(0.7).arrival_s.tolist()
    )  # a higher load keeps what a lower one has


def test_relabel_is_instant_and_keeps_old_work_running():
    sim = FleetSimulator(FleetConfig(4, 2, MODEL))
    sim.start(shifting_trace())
    sim.advance(100.0)
    twin = sim.fork()
    twin.relabel(100.0, 3)
    assert sum(1 for i in twin.instances if i.role == "prefill") == 3
    assert sum(1 for i in sim.instances if i.role == "prefill") == 2  # the fork is independent
    twin.advance(float("inf"))
    assert np.isfinite(twin.ttft).all()
