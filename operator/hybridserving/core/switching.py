"""The role-switch state machine of one instance: pure, idempotent, resumable.

A switch moves one running instance between prefill and decode without dropping a request:

    Unroute → Drain → Switch → Verify → Route → Done
                │        │        │
                │        │        └─ engine unhealthy or in the wrong role ─→ Restart (Failed)
                │        ├─ launcher Refused (safe_to_restore) / Aborted ──→ Restore
                │        └─ launcher Failed, or no answer in time ─────────→ Restart (Failed)
                └─ not idle within roleSwitch.drainTimeoutSeconds ────────→ Restore (Aborted)

An in-place switch the engine refused (outcome Refused) is remembered on the instance, per
direction and for the revision it runs (`ANNOTATION_IN_PLACE_REFUSED`): SGLang repeats most
refusals every time (no memory left for decode CUDA graphs, a staging buffer, a transfer backend
that cannot switch), so the next switch of that instance that way goes by relaunch (`start_switch`).
The launcher relaunches only where the roles' flags do not switch in place, so that relaunch
recreates the gang in the new role (`recreate`: `spec.role` and `spec.restartGeneration` + 1 in one
write); a new revision (the fleet's configuration changed) tries in place again. A multi-node
instance that cannot switch in place is always recreated so (`start_switch`): its ranks change
role together.

* **Unroute**: instance status.phase `Draining`; the planner drops the leader's router label
  (`hybridserving.io/role`), so the router removes the worker. Done when the label is gone.
* **Drain**: wait (at least `unroute_settle_s`, for the router to act on the relabel) until the
  engine's `/v1/loads` shows nothing running, waiting or queued.
* **Switch**: instance `spec.role` = the new role, phase `Switching` (in place) or `Relaunching`;
  the planner rewrites the pods' role annotation, the launcher drains once more and switches
  (`POST /pd_role_switch`) or relaunches. With `recreate`, `spec.restartGeneration` + 1 as well:
  the planner recreates the gang, whose fresh launchers start in the new role. Done when the
  launcher runs the new role.
* **Verify**: engine `/ready` answers and `/model_info` reports the live `disaggregation_mode` = new role
  (`/server_info`'s top level is the start-up configuration and keeps the old role).
* **Route**: phase `Ready`; the planner labels the leader with the new role. Done when labelled.
* **Restore**: spec.role back to the old role, phase `Ready` (routed again in the old role).
* **Restart**: spec.role back, `spec.restartGeneration` + 1 (the gang is recreated), phase `Starting`.

Everything the machine needs lives on the instance: its phase, its spec, and a small JSON record in
the annotation `hybridserving.io/switch`. `step(record, observation, now, config)` returns the next
record and what the objects should look like (`Desired`); the driver writes only the differences,
so applying a step twice, or resuming after an operator restart at any point, converges to the
same end state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from hybridserving.api.v1alpha1 import Role
from hybridserving.core.naming import revision_name

Mode = Literal["in-place", "relaunch"]
Step = Literal["Unroute", "Drain", "Switch", "Verify", "Route", "Restore", "Restart", "Done"]
Outcome = Literal["InProgress", "Succeeded", "Aborted", "Refused", "Failed"]

ANNOTATION_SWITCH = "hybridserving.io/switch"
"""The in-flight switch record (JSON) on the instance."""
ANNOTATION_SWITCH_TO = "hybridserving.io/switch-to"
"""An on-call request on the instance: `prefill` or `decode`."""
ANNOTATION_PINNED = "hybridserving.io/pinned"
"""`"true"`: the policy never moves this instance."""


def pinned(annotations: Mapping[str, str]) -> bool:
    """Whether an instance's annotations pin it (`ANNOTATION_PINNED`, any case of "true")."""
    return annotations.get(ANNOTATION_PINNED, "").lower() == "true"


def held_by_rollout(fleet: Mapping[str, Any], revision_label: str) -> bool:
    """Whether the fleet's rollout keeps an instance in its role: no switch starts on it.

    - One not on the update revision: the rollout replaces it, in the role it has then. Switched
      first, in place, its engine would keep the old configuration's flags (a switch changes only
      the role) while the switch's new flags made it count as rolled: never replaced, paired under
      the old key after that key's router is gone.
    - Any, while a rollout with a canary is under way: each role's canary counts the instances of
      that role rolled, so moving one to the other role would let the rollout roll one more.
    - Any, before the reconcile has reported on the spec's generation: a rollout the spec starts is
      not known yet.

    `fleet` is the HybridServing as read (its status is the reconcile's report); `revision_label`
    the instance's `hybridserving.io/revision-hash`.
    """
    meta = fleet.get("metadata") or {}
    status = fleet.get("status") or {}
    if status.get("observedGeneration") != meta.get("generation"):
        return True
    rollout = status.get("rollout") or {}
    update = rollout.get("updateRevision")
    if not update or rollout.get("currentRevision") == update:
        return False  # every instance runs the update revision
    canary = ((fleet.get("spec") or {}).get("rollout") or {}).get("canary")
    return (canary is not None or rollout.get("held") == "Canary"
            or revision_name(str(meta.get("name", "")), revision_label) != update)


ANNOTATION_IN_PLACE_REFUSED = "hybridserving.io/in-place-refused"
"""The in-place switches the engine refused (JSON, by direction `prefill->decode`): the next switch
of the instance that way relaunches, while it runs the same revision."""

SWITCH_PHASES = frozenset({"Draining", "Switching", "Relaunching"})

STEPS: tuple[Step, ...] = ("Unroute", "Drain", "Switch", "Verify", "Route", "Restore", "Restart", "Done")


def other_role(role: str) -> Role:
    return "decode" if role == "prefill" else "prefill"


@dataclass(frozen=True)
class SwitchConfig:
    """Bounds of each step, in seconds."""

    drain_timeout_s: float = 600.0
    unroute_settle_s: float = 2.0
    """After the router label is gone: time for the router to drop the worker before idle counts."""
    router_forget_s: float = 8.0
    """After the router label is gone: how long it stays gone before it comes back (Route,
    Restore). smg reconciles 1 s after a pod event and removes a worker whose label went 5 s
    later (its drain_settle_secs); a label back before that finds the worker still registered,
    is ignored, and the worker is then removed anyway, found again only by the periodic pass a
    minute later (`model_gateway/src/service_discovery.rs`, `workflow/steps/local/
    drain_workers.rs`): an instance its status calls routed would serve in no router."""
    in_place_timeout_s: float = 300.0
    relaunch_timeout_s: float = 3600.0
    verify_timeout_s: float = 120.0
    route_timeout_s: float = 120.0
    restore_timeout_s: float = 300.0

    @classmethod
    def from_spec(cls, role_switch: Any, **overrides: float) -> SwitchConfig:
        """From the API's RoleSwitchSpec (duck-typed: the core does not import the API)."""
        return cls(drain_timeout_s=float(role_switch.drain_timeout_seconds), **overrides)

    def switch_timeout(self, mode: str) -> float:
        return self.in_place_timeout_s if mode == "in-place" else self.relaunch_timeout_s


@dataclass(frozen=True)
class SwitchState:
    """The record kept in the instance's `hybridserving.io/switch` annotation."""

    from_role: Role
    to_role: Role
    mode: Mode
    reason: str
    started: float
    step: Step = "Unroute"
    step_started: float = 0.0
    outcome: Outcome = "InProgress"
    message: str = ""
    restart_generation: int | None = None
    """The generation a Restart, or the Switch of a `recreate` relaunch, asks for (the observed one
    + 1), fixed once so a resumed step does not bump twice."""
    launcher_switches: int | None = None
    """The launcher's switchCount when the role was changed: a later count names our switch."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each finished step."""
    recreate: bool = False
    """A relaunch the launchers should not make on their pods (both roles' flags switch in place,
    and the engine refused that before; or the instance spans several nodes, whose ranks must
    change role together): the Switch recreates the gang in the new role instead."""

    @classmethod
    def start(cls, from_role: Role, to_role: Role, mode: Mode, reason: str, now: float, *,
              recreate: bool = False) -> SwitchState:
        return cls(from_role, to_role, mode, reason[:500], now, "Unroute", now, recreate=recreate)

    @property
    def finished(self) -> bool:
        return self.step == "Done"

    def to_annotation(self) -> str:
        data = asdict(self)
        return json.dumps({_camel(k): v for k, v in data.items()}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str | None) -> SwitchState | None:
        """The record, or None when absent or unreadable (an unreadable one is dropped)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            kwargs = {f: data[_camel(f)] for f in cls.__dataclass_fields__ if _camel(f) in data}
            state = cls(**kwargs)
        except (ValueError, TypeError, KeyError):
            return None
        if state.from_role not in ("prefill", "decode") or state.to_role not in ("prefill", "decode"):
            return None
        if state.step not in STEPS:
            return None
        return state

    def advance(self, step: Step, now: float, **changes: Any) -> SwitchState:
        phases = dict(self.phases)
        phases[self.step] = round(phases.get(self.step, 0.0) + max(0.0, now - self.step_started), 3)
        return replace(self, step=step, step_started=now, phases=phases, **changes)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@dataclass(frozen=True)
class InPlaceRefusal:
    """An in-place switch the engine refused, as `ANNOTATION_IN_PLACE_REFUSED` keeps it."""

    revision: str
    """The instance's revision (`hybridserving.io/revision-hash`) when it was refused: another
    configuration may switch in place, so it is tried again."""
    at: float
    message: str


def _direction(from_role: str, to_role: str) -> str:
    return f"{from_role}->{to_role}"


def in_place_refusals(text: str | None) -> dict[str, InPlaceRefusal]:
    """The refusals an instance's annotation holds, by direction; an unreadable entry is dropped."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    out: dict[str, InPlaceRefusal] = {}
    for direction, entry in (data.items() if isinstance(data, dict) else ()):
        try:
            out[direction] = InPlaceRefusal(str(entry["revision"]), float(entry["at"]), str(entry.get("message", "")))
        except (TypeError, KeyError, ValueError):
            continue
    return out


def refused_in_place(text: str | None, from_role: str, to_role: str, revision: str) -> InPlaceRefusal | None:
    """The refusal of an in-place switch `from_role` → `to_role` on this revision, or None."""
    refusal = in_place_refusals(text).get(_direction(from_role, to_role))
    return refusal if refusal is not None and refusal.revision == revision else None


def remember_refusal(text: str | None, state: SwitchState, revision: str, now: float) -> str | None:
    """The annotation once `state` has ended: an in-place switch ended Refused is added for its
    direction, and refusals of another revision go (None: nothing left)."""
    kept = {d: r for d, r in in_place_refusals(text).items() if r.revision == revision}
    if state.mode == "in-place" and state.outcome == "Refused":
        kept[_direction(state.from_role, state.to_role)] = InPlaceRefusal(revision, round(now, 3), state.message[:300])
    if not kept:
        return None
    return json.dumps({d: asdict(r) for d, r in sorted(kept.items())}, sort_keys=True, separators=(",", ":"))


def start_switch(from_role: Role, to_role: Role, reason: str, now: float, *, in_place: bool,
                 refused: str | None, revision: str, nodes: int) -> SwitchState:
    """The record of a switch about to start: in place where the layout allows it
    (`core.flags.in_place_role_switch`), else by relaunch (the launcher's, on the same pods).

    Where the engine refused this very move in place on this revision, it relaunches instead: the
    launcher would only try in place again (its flags allow it), so the gang is recreated in the
    new role (`recreate`), and the reason says why.

    An instance of several `nodes` that cannot switch in place is recreated too. Its ranks must
    stop together (a worker rank's engine stops only with rank 0's shutdown broadcast) and start
    the new role together, while each pod's launcher would see the role change on its own (the
    kubelet refreshes each pod's downward-API volume on its own schedule, up to a minute apart):
    on the same pods, a worker rank could restart in the old role beside a leader in the new one.
    A new gang's launchers all start in the new role.
    """
    if not in_place and nodes > 1:
        return SwitchState.start(from_role, to_role, "relaunch", f"{reason[:240]}; by relaunch (the gang is "
                                 f"recreated as {to_role}): its {nodes} ranks start the new role together", now,
                                 recreate=True)
    refusal = refused_in_place(refused, from_role, to_role, revision) if in_place else None
    if refusal is None:
        return SwitchState.start(from_role, to_role, "in-place" if in_place else "relaunch", reason, now)
    why = (f"by relaunch (the gang is recreated as {to_role}): the engine refused this switch in place "
           f"{max(0.0, now - refusal.at):.0f} s ago ({refusal.message[:150]})")
    return SwitchState.start(from_role, to_role, "relaunch", f"{reason[:240]}; {why}", now, recreate=True)


@dataclass(frozen=True)
class LauncherView:
    """What the launcher's `/status` says, reduced."""

    role: str | None
    phase: str
    switch_count: int = 0
    last_from: str | None = None
    last_to: str | None = None
    last_outcome: str | None = None
    last_message: str = ""

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> LauncherView:
        last = status.get("lastSwitch") or {}
        return cls(
            role=status.get("role"),
            phase=str(status.get("phase") or ""),
            switch_count=int(status.get("switchCount") or 0),
            last_from=last.get("fromRole"),
            last_to=last.get("toRole"),
            last_outcome=last.get("outcome"),
            last_message=str(last.get("message") or ""),
        )


@dataclass(frozen=True)
class Observation:
    """The instance as the driver read it this tick."""

    phase: str | None
    spec_role: Role
    restart_generation: int
    leader_label: str | None
    """The leader pod's router label (`hybridserving.io/role`), None when absent or no leader."""
    pods_role: str | None = None
    """The role annotation all pods carry (None: no pods, or they disagree)."""
    inflight: int | None = None
    """Requests the engine holds (`/v1/loads`), None when it did not answer."""
    engine_healthy: bool | None = None
    engine_role: str | None = None
    """The live role: `/model_info` disaggregation_mode."""
    launcher: LauncherView | None = None
    old_gang: bool = False
    """Pods of an earlier restart generation not yet being deleted: the gang a restart replaces."""


@dataclass(frozen=True)
class Desired:
    """How the instance should look for the current step; the driver writes only what differs."""

    phase: str
    role: Role
    restart_generation: int | None = None


def launcher_switched(state: SwitchState, launcher: LauncherView | None) -> bool:
    """Whether the launcher's last switch is this one: counted since the switch began, between its roles."""
    return (launcher is not None and launcher.switch_count > (state.launcher_switches or 0)
            and launcher.last_to == state.to_role and launcher.last_from == state.from_role)


def launcher_relaunched(state: SwitchState, launcher: LauncherView | None) -> bool:
    """Whether the launcher is relaunching the engine for this switch: an in-place rebuild that fails
    unsafely is relaunched by the launcher itself, in the new role on the same pods, and that start
    takes a relaunch's time, not an in-place switch's."""
    return launcher is not None and launcher_switched(state, launcher) and launcher.phase == "Relaunching"


def desired(state: SwitchState, obs: Observation) -> Desired:
    s = state.step
    if s in ("Unroute", "Drain"):
        return Desired("Draining", state.from_role)
    if s in ("Switch", "Verify"):
        return Desired("Switching" if state.mode == "in-place" else "Relaunching", state.to_role,
                       state.restart_generation if state.recreate else None)
    if s == "Route":
        return Desired("Ready", state.to_role)
    if s == "Restart":
        return Desired("Starting", state.from_role, state.restart_generation)
    if s == "Restore":
        return Desired("Ready", state.from_role)
    # Done: the end state of the outcome.
    if state.outcome == "Succeeded":
        return Desired("Ready", state.to_role)
    if state.outcome == "Failed":
        return Desired("Starting", state.from_role, state.restart_generation)
    return Desired("Ready", state.from_role)


def switch_owns_phase(record: str | None, phase: str | None) -> bool:
    """Whether the role-switch controller owns an instance's `status.phase` now.

    It does from the moment a switch is recorded on the instance (`ANNOTATION_SWITCH`) until
    the record is cleared, and while a switch phase is still written; the reconcile owns the
    phase at all other times and leaves it alone while this holds, so the two never write the
    field over each other (the switch's steps wait for the phases they wrote).
    """
    return SwitchState.from_annotation(record) is not None or phase in SWITCH_PHASES


def phase_applied(want: str, phase: str | None) -> bool:
    """A switch phase must be exactly there; any other phase hands the instance back to the
    reconcile, which then computes it (Ready, Starting, ...) itself."""
    return phase == want if want in SWITCH_PHASES else phase not in SWITCH_PHASES


def step(state: SwitchState, obs: Observation, now: float, config: SwitchConfig) -> tuple[SwitchState, Desired]:
    """Advance at most one step; returns the (possibly unchanged) record and the desired objects.

    A step advances only when the objects already show what it asked for (phase written, label
    gone, role annotated), so a write that did not land is simply asked for again next time.
    Route and Restore bring the router label back only `router_forget_s` after it went; until
    then they ask for what the step before them did.
    """
    new, want = _advance(state, obs, now, config)
    if new.step in ("Route", "Restore"):
        # Unroute saw the label gone no earlier than it went: a lower bound on how long ago.
        if now - new.started - new.phases.get("Unroute", 0.0) < config.router_forget_s:
            return new, desired(replace(new, step="Verify" if new.step == "Route" else "Drain"), obs)
    return new, want


def _advance(state: SwitchState, obs: Observation, now: float, config: SwitchConfig) -> tuple[SwitchState, Desired]:
    want = desired(state, obs)
    applied = obs.spec_role == want.role and phase_applied(want.phase, obs.phase)
    elapsed = now - state.step_started
    s = state.step

    def restore(outcome: Outcome, message: str) -> tuple[SwitchState, Desired]:
        new = state.advance("Restore", now, outcome=outcome, message=message[:500])
        return new, desired(new, obs)

    def restart(message: str) -> tuple[SwitchState, Desired]:
        new = state.advance("Restart", now, outcome="Failed", message=message[:500],
                            restart_generation=obs.restart_generation + 1)
        return new, desired(new, obs)

    def go(next_step: Step, **changes: Any) -> tuple[SwitchState, Desired]:
        new = state.advance(next_step, now, **changes)
        return new, desired(new, obs)

    if s == "Unroute":
        if applied and obs.leader_label is None:
            return go("Drain")
        if now - state.started > config.drain_timeout_s:
            return restore("Aborted", f"the router label was not removed within {config.drain_timeout_s:.0f} s")
        return state, want

    if s == "Drain":
        if elapsed > config.drain_timeout_s:
            held = "no answer from the engine" if obs.inflight is None else f"{obs.inflight} request(s) still held"
            return restore("Aborted", f"not idle after {config.drain_timeout_s:.0f} s of draining ({held})")
        if (applied and obs.leader_label is None and elapsed >= config.unroute_settle_s
                and obs.inflight == 0 and obs.launcher is not None):
            # A recreating relaunch asks for the next gang with the new role in the same write: the
            # planner deletes the old pods without relabelling them, so their launcher never tries.
            recreate = {"restart_generation": obs.restart_generation + 1} if state.recreate else {}
            return go("Switch", launcher_switches=obs.launcher.switch_count, **recreate)
        return state, want

    if s == "Switch":
        launcher = obs.launcher
        ours = launcher_switched(state, launcher)
        if launcher is not None and obs.spec_role == state.to_role and obs.pods_role == state.to_role:
            if ours and launcher.last_outcome in ("Refused", "Aborted"):
                return restore("Refused" if launcher.last_outcome == "Refused" else "Aborted",
                               f"launcher: {launcher.last_outcome}: {launcher.last_message}")
            if ours and launcher.last_outcome == "Failed":
                return restart(f"launcher: Failed: {launcher.last_message}")
            if launcher.role == state.to_role and launcher.phase == "Ready":
                return go("Verify")
        mode = "relaunch" if launcher_relaunched(state, launcher) else state.mode
        if elapsed > config.switch_timeout(mode):
            return restart(f"the launcher did not finish the {mode} switch within "
                           f"{config.switch_timeout(mode):.0f} s")
        return state, want

    if s == "Verify":
        if obs.engine_healthy and obs.engine_role == state.to_role:
            return go("Route")
        if elapsed > config.verify_timeout_s:
            what = ("unhealthy (not ready)" if not obs.engine_healthy
                    else f"reports disaggregation_mode {obs.engine_role!r}")
            return restart(f"engine {what} {config.verify_timeout_s:.0f} s after the switch")
        return state, want

    if s == "Route":
        if applied and obs.leader_label == state.to_role:
            return go("Done", outcome="Succeeded", message=state.message or f"serving as {state.to_role}")
        if elapsed > config.route_timeout_s and applied:
            return go("Done", outcome="Succeeded",
                      message=f"serving as {state.to_role}; router label not seen within "
                              f"{config.route_timeout_s:.0f} s")
        return state, want

    if s == "Restore":
        launcher_back = obs.launcher is None or obs.launcher.role in (None, state.from_role)
        if applied and launcher_back and obs.leader_label == state.from_role:
            return go("Done")
        if elapsed > config.restore_timeout_s:
            return restart(
                f"could not restore {state.from_role} within {config.restore_timeout_s:.0f} s (after: {state.message})"
            )
        return state, want

    if s == "Restart":
        # Done only once the phase is handed back (else it would stay a switch phase with no switch
        # to end it, the instance out of the router for good) and the old gang is being deleted
        # (else its pods, still annotated with the failed role, would read as a hand edit of
        # spec.role). The reconcile owns the phase from here: it recreates the gang.
        if (applied and not obs.old_gang and obs.restart_generation >= (state.restart_generation or 0)
                and obs.spec_role == state.from_role):
            return go("Done")
        return state, want

    return state, want  # Done: the driver records it and clears the annotation
