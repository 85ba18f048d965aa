"""The role-switch state machine (`core.switching`) over whole scenarios, against a scripted world.

`World` plays everything around the machine: it applies what a step wants (spec.role, phase,
restartGeneration), the planner (the router label follows the phase; pods' role annotation follows
spec.role), the router (requests in flight drain at a given pace) and the launcher (on a role change
it switches in place or relaunches, or refuses, aborts, fails, as scripted). Each scenario runs the
machine to its end state; the same scenarios are replayed with the record thrown through its
annotation at every tick (an operator restart anywhere) and with every step applied twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from hybridserving.core.switching import (
    Desired,
    LauncherView,
    Observation,
    SwitchConfig,
    SwitchState,
    desired,
    held_by_rollout,
    phase_applied,
    refused_in_place,
    remember_refusal,
    start_switch,
    step,
)

CONFIG = SwitchConfig(drain_timeout_s=30, unroute_settle_s=2, in_place_timeout_s=60, relaunch_timeout_s=300,
                      verify_timeout_s=20, route_timeout_s=20, restore_timeout_s=60, router_forget_s=8)
TICK = 1.0


@dataclass
class World:
    role: str = "prefill"  # spec.role
    phase: str = "Ready"
    generation: int = 0
    label: str | None = "prefill"
    pods_role: str = "prefill"
    inflight: int = 3
    drain_per_tick: int = 1
    engine_role: str = "prefill"
    healthy: bool = True
    launcher_role: str = "prefill"
    launcher_phase: str = "Ready"
    switch_count: int = 2  # earlier switches happened; the last one is below
    last: tuple[str, str, str] | None = ("decode", "prefill", "Refused")
    # scripted behaviour
    mode: str = "in-place"
    launcher_outcome: str = "Succeeded"  # Succeeded | Refused | Aborted | Failed | Silent
    switch_ticks: int = 2
    unhealthy_after: bool = False
    _switch_at: int | None = None
    _target: str | None = None
    restarts: int = 0
    ticks: int = 0
    label_gone_at: int | None = None

    def apply(self, want: Desired) -> None:
        self.role = want.role
        if not phase_applied(want.phase, self.phase):
            self.phase = want.phase
        if want.restart_generation is not None and want.restart_generation > self.generation:
            self.generation = want.restart_generation

    def advance(self) -> None:
        """One tick of the planner, router, engine and launcher."""
        self.ticks += 1
        routed = self.phase not in ("Draining", "Switching", "Relaunching")
        label = self.role if routed and self.healthy_for_label() else None
        if self.label is not None and label is None:
            self.label_gone_at = self.ticks
        elif (self.label is None and label is not None and self.label_gone_at is not None
              and self.generation == self.restarts):  # pods recreated now are new to the router
            # smg drops a worker 1 + 5 s after its label goes and ignores the label back before that.
            assert (self.ticks - self.label_gone_at) * TICK >= CONFIG.router_forget_s, (
                f"the router label came back {self.ticks - self.label_gone_at} tick(s) after it went")
        self.label = label
        if self.pods_role != self.role:
            self.pods_role = self.role
            if self.generation > self.restarts:
                pass
            elif self.launcher_role != self.role:
                self._target, self._switch_at = self.role, self.ticks + self.switch_ticks
        if self.generation > self.restarts:  # gang recreated in the instance's role
            self.restarts = self.generation
            self.label_gone_at = None  # new pods: the router has never seen them
            self.launcher_role = self.engine_role = self.role
            self.pods_role = self.role
            self.healthy, self.launcher_phase, self.switch_count, self.last = True, "Ready", 0, None
            self._switch_at = None
        if self.label is None and self.inflight > 0:
            self.inflight = max(0, self.inflight - self.drain_per_tick)
        if self._switch_at is not None and self.ticks >= self._switch_at:
            self._finish_switch()

    def healthy_for_label(self) -> bool:
        return True

    def _finish_switch(self) -> None:
        target, source = self._target, self.launcher_role
        self._switch_at = None
        if target == source:
            return
        outcome = self.launcher_outcome
        if outcome == "Silent":
            self.launcher_phase = "Draining"
            return
        self.switch_count += 1
        self.last = (source, target, outcome)
        if outcome == "Succeeded":
            self.launcher_role = self.engine_role = target
            self.healthy = not self.unhealthy_after
        elif outcome == "Failed":
            self.healthy = False
            self.launcher_phase = "Restarting"

    def observe(self) -> Observation:
        last = self.last
        return Observation(
            phase=self.phase, spec_role=self.role, restart_generation=self.generation, leader_label=self.label,
            pods_role=self.pods_role, inflight=self.inflight, engine_healthy=self.healthy,
            engine_role=self.engine_role,
            launcher=LauncherView(self.launcher_role, self.launcher_phase, self.switch_count,
                                  last[0] if last else None, last[1] if last else None, last[2] if last else None,
                                  "scripted"),
        )


def run(world: World, *, to: str = "decode", restart_every_tick: bool = False, apply_twice: bool = False,
        max_ticks: int = 400, state: SwitchState | None = None) -> tuple[SwitchState, list[str]]:
    now = 1000.0 if state is None else state.started
    if state is None:
        state = SwitchState.start(world.role, to, world.mode, "test", now)  # type: ignore[arg-type]
    world.apply(desired(state, world.observe()))
    steps = [state.step]
    for _ in range(max_ticks):
        world.advance()
        now += TICK
        if restart_every_tick:  # a new operator: only what the annotation holds survives
            state = SwitchState.from_annotation(state.to_annotation())
            assert state is not None
        new, want = step(state, world.observe(), now, CONFIG)
        if apply_twice:
            again, want2 = step(new, world.observe(), now, CONFIG) if new.step == state.step else (new, want)
            assert want2 == want
            if new.step == state.step:
                assert again == new, "the same step applied twice changes nothing"
        world.apply(want)
        if new.step != state.step:
            steps.append(new.step)
        state = new
        if state.finished:
            return state, steps
    raise AssertionError(f"did not finish: {steps}, {state}")


VARIANTS = [
    pytest.param({}, id="plain"),
    pytest.param({"restart_every_tick": True}, id="operator-restarted-every-tick"),
    pytest.param({"apply_twice": True}, id="every-step-applied-twice"),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["in-place", "relaunch"])
def test_happy_path_routes_the_instance_in_its_new_role(mode: str, variant: dict) -> None:
    world = World(mode=mode, switch_ticks=2 if mode == "in-place" else 10)
    state, steps = run(world, **variant)
    assert steps == ["Unroute", "Drain", "Switch", "Verify", "Route", "Done"]
    assert state.outcome == "Succeeded"
    assert (world.role, world.label, world.engine_role, world.phase) == ("decode", "decode", "decode", "Ready")
    assert world.generation == 0, "no restart"
    assert set(state.phases) == {"Unroute", "Drain", "Switch", "Verify", "Route"}
    assert state.phases["Drain"] >= CONFIG.unroute_settle_s


def test_the_role_changes_only_once_the_engine_is_idle_and_out_of_the_router() -> None:
    world = World(inflight=5)
    now = 0.0
    state = SwitchState.start("prefill", "decode", "in-place", "test", now)
    world.apply(desired(state, world.observe()))
    while not state.finished:
        world.advance()
        now += TICK
        state, want = step(state, world.observe(), now, CONFIG)
        if want.role == "decode" and world.role == "prefill":
            assert world.inflight == 0 and world.label is None
        world.apply(want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_drain_timeout_aborts_and_restores_routing(variant: dict) -> None:
    world = World(inflight=10_000)
    state, steps = run(world, **variant)
    assert steps == ["Unroute", "Drain", "Restore", "Done"]
    assert state.outcome == "Aborted" and "not idle" in state.message
    assert (world.role, world.label, world.phase, world.launcher_role) == ("prefill", "prefill", "Ready", "prefill")


@pytest.mark.parametrize("variant", VARIANTS)
def test_refusal_restores_the_old_role(variant: dict) -> None:
    world = World(launcher_outcome="Refused", last=("decode", "prefill", "Succeeded"))
    state, steps = run(world, **variant)
    assert steps == ["Unroute", "Drain", "Switch", "Restore", "Done"]
    assert state.outcome == "Refused"
    assert (world.role, world.label, world.phase, world.engine_role) == ("prefill", "prefill", "Ready", "prefill")
    assert world.generation == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_after_an_in_place_refusal_the_next_switch_that_way_relaunches_by_recreating_the_gang(variant: dict) -> None:
    world = World(launcher_outcome="Refused", last=("decode", "prefill", "Succeeded"))
    refused, _ = run(world, **variant)
    assert refused.outcome == "Refused"
    memory = remember_refusal(None, refused, "rev-1", 1100.0)
    assert memory is not None and refused_in_place(memory, "prefill", "decode", "rev-1") is not None

    again = start_switch("prefill", "decode", "policy: prefill idle", 2000.0, in_place=True, refused=memory,
                         revision="rev-1", nodes=1)
    assert again.mode == "relaunch" and again.recreate
    assert "refused this switch in place 900 s ago" in again.reason and again.reason.startswith("policy: prefill idle")
    state, steps = run(world, state=again, **variant)  # the engine would still refuse in place
    assert steps == ["Unroute", "Drain", "Switch", "Verify", "Route", "Done"]
    assert state.outcome == "Succeeded" and state.mode == "relaunch"
    assert world.generation == 1, "the gang recreated once, in the new role"
    assert (world.role, world.label, world.engine_role, world.phase) == ("decode", "decode", "decode", "Ready")


def test_a_recreating_relaunch_asks_for_the_next_generation_with_the_new_role_in_one_step() -> None:
    state = start_switch("prefill", "decode", "r", 0.0, in_place=True, refused=remember_refusal(
        None, replace(SwitchState.start("prefill", "decode", "in-place", "r", 0.0), outcome="Refused"), "", 0.0),
        revision="", nodes=1)
    obs = World(inflight=0, label=None, phase="Draining", generation=4).observe()
    assert desired(state, obs) == Desired("Draining", "prefill")
    switching, want = step(state.advance("Drain", 0.0), obs, 10.0, CONFIG)
    assert switching.step == "Switch" and switching.restart_generation == 5
    assert want == Desired("Relaunching", "decode", 5)
    assert SwitchState.from_annotation(switching.to_annotation()) == switching


def test_a_multi_node_instance_that_cannot_switch_in_place_is_recreated_in_the_new_role() -> None:
    """Its ranks change role together; in place, the leader switches them all."""
    state = start_switch("prefill", "decode", "policy: decode short", 0.0, in_place=False, refused=None,
                         revision="rev-1", nodes=2)
    assert (state.mode, state.recreate) == ("relaunch", True)
    assert state.reason == ("policy: decode short; by relaunch (the gang is recreated as decode): its 2 ranks start "
                            "the new role together")
    obs = World(inflight=0, label=None, phase="Draining", generation=3).observe()
    switching, want = step(state.advance("Drain", 0.0), obs, 10.0, CONFIG)
    assert want == Desired("Relaunching", "decode", 4), "the next gang, in the new role, in one write"
    in_place = start_switch("prefill", "decode", "r", 0.0, in_place=True, refused=None, revision="rev-1", nodes=2)
    assert (in_place.mode, in_place.recreate) == ("in-place", False)
    one_node = start_switch("prefill", "decode", "r", 0.0, in_place=False, refused=None, revision="rev-1", nodes=1)
    assert (one_node.mode, one_node.recreate) == ("relaunch", False), "the launcher relaunches on its pod"


def test_an_in_place_refusal_is_remembered_only_for_its_direction_and_revision() -> None:
    refused = replace(SwitchState.start("prefill", "decode", "in-place", "r", 0.0), outcome="Refused",
                      message="launcher: Refused: insufficient decode CUDA graph headroom")
    memory = remember_refusal(None, refused, "rev-1", 5.0)

    def mode(from_role: str, to_role: str, revision: str = "rev-1", in_place: bool = True) -> tuple[str, bool]:
        s = start_switch(from_role, to_role, "r", 10.0, in_place=in_place, refused=memory,  # type: ignore[arg-type]
                         revision=revision, nodes=1)
        return s.mode, s.recreate

    assert mode("prefill", "decode") == ("relaunch", True)
    assert mode("decode", "prefill") == ("in-place", False), "the other direction still switches in place"
    assert mode("prefill", "decode", revision="rev-2") == ("in-place", False), "a new configuration is tried"
    assert mode("prefill", "decode", in_place=False) == ("relaunch", False), "the launcher relaunches itself"
    # A new revision's end of switch drops what an older one refused; other outcomes add nothing.
    for outcome in ("Succeeded", "Aborted", "Failed"):
        assert remember_refusal(memory, replace(refused, outcome=outcome), "rev-2", 9.0) is None
        assert remember_refusal(memory, replace(refused, outcome=outcome), "rev-1", 9.0) == memory
    assert remember_refusal(None, replace(refused, mode="relaunch"), "rev-1", 9.0) is None
    for bad in ("", "{", "[]", '{"prefill->decode": {"at": 1}}', '{"prefill->decode": 3}'):
        assert refused_in_place(bad, "prefill", "decode", "rev-1") is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_failed_rebuild_is_not_remembered_and_restarts_as_before(variant: dict) -> None:
    """Not safe_to_restore: the launcher relaunches itself; only when that fails does the instance restart."""
    world = World(launcher_outcome="Failed")
    state, steps = run(world, **variant)
    assert steps == ["Unroute", "Drain", "Switch", "Restart", "Done"] and state.outcome == "Failed"
    assert remember_refusal(None, state, "rev-1", 0.0) is None
    assert start_switch("prefill", "decode", "r", 0.0, in_place=True, refused=None, revision="rev-1",
                        nodes=1).mode == "in-place"


def test_an_old_refusal_on_the_launcher_is_not_taken_for_this_switch() -> None:
    # The launcher's last switch (before this one) was a refused prefill -> decode.
    world = World(last=("prefill", "decode", "Refused"), switch_ticks=4)
    state, steps = run(world)
    assert state.outcome == "Succeeded", steps


@pytest.mark.parametrize("variant", VARIANTS)
def test_launcher_abort_restores(variant: dict) -> None:
    state, steps = run(World(launcher_outcome="Aborted"), **variant)
    assert steps[-2:] == ["Restore", "Done"] and state.outcome == "Aborted"


@pytest.mark.parametrize("variant", VARIANTS)
def test_failed_rebuild_restarts_the_instance(variant: dict) -> None:
    world = World(launcher_outcome="Failed")
    state, steps = run(world, **variant)
    assert steps == ["Unroute", "Drain", "Switch", "Restart", "Done"]
    assert state.outcome == "Failed"
    assert world.generation == 1, "restartGeneration bumped exactly once"
    assert world.role == "prefill"


@pytest.mark.parametrize("variant", VARIANTS)
def test_unhealthy_after_switch_restarts_once(variant: dict) -> None:
    world = World(unhealthy_after=True)
    state, steps = run(world, **variant)
    assert steps == ["Unroute", "Drain", "Switch", "Verify", "Restart", "Done"]
    assert state.outcome == "Failed" and "unhealthy" in state.message
    assert world.generation == 1


def test_a_restart_ends_only_once_its_phase_is_written_and_the_old_gang_is_going() -> None:
    """The Restart write (spec.role, restartGeneration) can land while the phase write after it does
    not (a 5xx, the operator dying between them): ending then would leave the instance in a switch
    phase with no switch to end it, out of the router for good. And pods of the old gang still
    annotated with the failed role would read as a hand edit of spec.role once the record is gone."""
    state = (SwitchState.start("prefill", "decode", "in-place", "test", 0.0).advance("Drain", 10.0)
             .advance("Switch", 20.0).advance("Restart", 30.0, outcome="Failed", message="rebuild failed",
                                              restart_generation=1))
    landed = Observation(phase="Switching", spec_role="prefill", restart_generation=1, leader_label=None)
    held, want = step(state, landed, 31.0, CONFIG)
    assert held.step == "Restart" and want.phase == "Starting", "the phase is asked for again"
    written = replace(landed, phase="Starting")
    assert step(state, replace(written, old_gang=True), 32.0, CONFIG)[0].step == "Restart", "old pods not going yet"
    assert step(state, written, 33.0, CONFIG)[0].step == "Done"


def test_a_launcher_relaunching_after_a_failed_rebuild_gets_a_relaunchs_time() -> None:
    """SGLang's in-place rebuild failed unsafely: the launcher relaunches the engine in the new role
    itself, which takes minutes (a model load); cutting it off at the in-place bound would throw
    away a start that was going to succeed and restart the gang in the old role."""
    config = SwitchConfig(in_place_timeout_s=300, relaunch_timeout_s=3600)
    state = (SwitchState.start("prefill", "decode", "in-place", "test", 0.0).advance("Drain", 10.0)
             .advance("Switch", 20.0, launcher_switches=2))

    def seen(phase: str, switches: int = 3) -> Observation:
        return Observation(phase="Switching", spec_role="decode", restart_generation=0, leader_label=None,
                           pods_role="decode", launcher=LauncherView("prefill", phase, switches, "prefill", "decode",
                                                                     "InProgress", "switch failed"))

    assert step(state, seen("Relaunching"), 20.0 + 301, config)[0].step == "Switch"
    late = step(state, seen("Relaunching"), 20.0 + 3601, config)[0]
    assert late.step == "Restart" and "did not finish the relaunch switch within 3600 s" in late.message
    assert step(state, seen("Switching"), 20.0 + 301, config)[0].step == "Restart", "an in-place switch's bound"
    assert step(state, seen("Relaunching", switches=2), 20.0 + 301, config)[0].step == "Restart", \
        "an earlier switch's relaunch is not this one's"


def test_a_launcher_that_never_answers_times_out_into_a_restart() -> None:
    state, steps = run(World(launcher_outcome="Silent"))
    assert steps[-2:] == ["Restart", "Done"] and "did not finish" in state.message


def test_phase_and_role_asked_for_at_each_step() -> None:
    s = SwitchState.start("decode", "prefill", "relaunch", "r", 0.0)
    obs = World().observe()
    assert desired(s, obs) == Desired("Draining", "decode")
    assert desired(s.advance("Switch", 1), obs) == Desired("Relaunching", "prefill")
    assert desired(replace(s, mode="in-place").advance("Verify", 1), obs) == Desired("Switching", "prefill")
    assert desired(s.advance("Route", 1), obs) == Desired("Ready", "prefill")
    assert desired(s.advance("Restore", 1), obs) == Desired("Ready", "decode")


def test_record_round_trips_and_bad_records_are_dropped() -> None:
    s = SwitchState.start("prefill", "decode", "in-place", "why", 5.0).advance("Drain", 7.0)
    assert SwitchState.from_annotation(s.to_annotation()) == s
    assert '"fromRole":"prefill"' in s.to_annotation()
    for bad in (None, "", "{", '{"fromRole": "x", "toRole": "decode"}', "[]", '{"step": "Nope"}'):
        assert SwitchState.from_annotation(bad) is None


def test_resuming_from_any_recorded_step_reaches_the_same_end_state() -> None:
    """An operator that stops after each number of ticks and a new one that picks the record up."""
    reference_world = World()
    reference, _ = run(reference_world)
    for cut in range(1, 25):
        world = World()
        now = 1000.0
        state = SwitchState.start("prefill", "decode", "in-place", "test", now)
        world.apply(desired(state, world.observe()))
        for _ in range(cut):
            world.advance()
            now += TICK
            state, want = step(state, world.observe(), now, CONFIG)
            world.apply(want)
            if state.finished:
                break
        # The operator is down for a while; the world goes on without it.
        for _ in range(5):
            world.advance()
            now += TICK
        resumed = SwitchState.from_annotation(state.to_annotation())
        assert resumed is not None
        while not resumed.finished:
            world.advance()
            now += TICK
            resumed, want = step(resumed, world.observe(), now, CONFIG)
            world.apply(want)
        assert resumed.outcome == reference.outcome
        assert (world.role, world.label, world.engine_role) == (
            reference_world.role, reference_world.label, reference_world.engine_role)


def rolling_fleet(*, generation: int = 3, observed: int = 3, current: str = "hs-old", update: str = "hs-new",
                  held: str = "", canary: int | None = None) -> dict:
    return {"metadata": {"name": "hs", "generation": generation},
            "spec": {"rollout": {} if canary is None else {"canary": canary}},
            "status": {"observedGeneration": observed,
                       "rollout": {"currentRevision": current, "updateRevision": update, "held": held}}}


@pytest.mark.parametrize(("fleet", "revision", "held"), [
    (rolling_fleet(current="hs-new"), "new", False),  # every instance rolled
    (rolling_fleet(), "new", False),  # rolled, no canary: free to move
    (rolling_fleet(), "old", True),  # the rollout replaces it in its role
    (rolling_fleet(), "", True),  # unlabelled: not known to run the update revision
    (rolling_fleet(canary=1), "new", True),  # a canary counts each role's rolled instances
    (rolling_fleet(held="Canary"), "new", True),
    (rolling_fleet(observed=2, current="hs-new"), "new", True),  # the spec's rollout not reported yet
    ({"metadata": {"name": "hs", "generation": 1}, "status": {"observedGeneration": 1}}, "", False),  # no rollout
])
def test_a_rollout_holds_the_instances_it_has_not_rolled_and_with_a_canary_all(fleet: dict, revision: str,
                                                                               held: bool) -> None:
    assert held_by_rollout(fleet, revision) is held
