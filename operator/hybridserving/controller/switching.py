"""The role-switch controller: observe the fleet, ask the policy, drive each switch, report.

Every few seconds, for each HybridServing, one `tick` (each fleet in its own task, so a slow or
failing fleet delays only itself):

1. observe: the HybridServing, its instances and their leader pods (through `kube.py`), and each
   leader's engine and launcher (through `engines.py`: `/v1/loads`, `/metrics`, `/ready`,
   `/model_info`, `/server_info`, launcher `/status`);
2. drive every switch in flight one step (`core.switching.step`, pure) and write what the step
   wants, only where the objects differ: the record annotation and `spec.role` /
   `spec.restartGeneration` in one conditional patch, `status.phase` on the status subresource;
3. start switches: an on-call request (annotation `hybridserving.io/switch-to`) or the policy's
   decisions (`core.policy.RoleSwitchPolicy.decide_all`, which applies paused, pins, floors,
   maxConcurrent and cooldown);
4. report: the history in the HybridServing's `status.switches` (only that field is patched; the
   last `HISTORY_LIMIT`, newest last), an Event per step, metrics.

No state is kept here that a restart would need: the record of each switch lives on its instance,
so a new operator resumes every switch where it stopped. The policy's smoothing memory and the
previous `/metrics` reads are kept in memory; after a restart they start afresh (the policy then
waits its sustain window again before deciding).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND, ROLES, HybridServingSpec
from hybridserving.contract import ANNOTATION_ROLE, LABEL_ROLE
from hybridserving.controller import gauges, metrics
from hybridserving.controller.engines import LAUNCHER_PORT, EngineSample, Engines, Scrape, instance_metrics
from hybridserving.controller.kube import KubeError, describe_failure
from hybridserving.controller.reconcile import DEFAULT_ENGINE_POLICY, spec_of_applied, validate
from hybridserving.core import enginekey, flags, liveness, switching
from hybridserving.core.fleet import role_capacity
from hybridserving.core.assignment import prefill_share
from hybridserving.core.observed import format_time, parse_time, restart_generation
from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.core.naming import (
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_NODE_RANK,
    LABEL_REVISION,
    LABEL_SURGE,
    applied_spec_name,
)
from hybridserving.core.privileges import EnginePolicy
from hybridserving.api.v1alpha1 import Role
from hybridserving.core.policy import (
    Decision,
    FleetScaler,
    InstanceMetrics,
    InstanceState,
    Phase,
    PolicyConfig,
    PolicyMemory,
    RoleSwitchPolicy,
    ScalerMemory,
    ScalingConfig,
)
from hybridserving.core.switching import (
    ANNOTATION_IN_PLACE_REFUSED,
    ANNOTATION_SWITCH,
    ANNOTATION_SWITCH_TO,
    Observation,
    LauncherView,
    SWITCH_PHASES,
    SwitchConfig,
    SwitchState,
)

log = logging.getLogger("hybridserving.switching")

TICK_SECONDS = 2.0
HISTORY_LIMIT = 20
IDLE_FLEET_EVERY = 10
"""A fleet with switching off and nothing in flight is looked at every this many ticks."""
ERROR_BACKOFF_MAX_SECONDS = 60.0
"""A fleet whose ticks keep failing retries after 2, 4, 8 … intervals, at most this long."""
TICK_THREADS = 8
"""Fleets ticking at the same time (each tick is blocking API and engine reads)."""


class KubeLike(Protocol):
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]: ...
    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...
    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *,
              resource_version: str | None = None, uid: str | None = None,
              subresource: str | None = None) -> dict[str, Any]: ...


class EnginesLike(Protocol):
    def sample_many(self, targets: Mapping[str, tuple[str, str | None, bool, bool]],
                    api_key: str | None = None) -> dict[str, EngineSample]: ...


def launcher_port(pod: Mapping[str, Any]) -> int:
    """The launcher's port: a container port named `launcher`, else HYBRIDSERVING_LAUNCHER_PORT, else 8080."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "launcher":
                return int(port["containerPort"])
        for env in container.get("env") or []:
            if env.get("name") == "HYBRIDSERVING_LAUNCHER_PORT" and str(env.get("value", "")).isdigit():
                return int(env["value"])
    return LAUNCHER_PORT


@dataclass
class Instance:
    """One instance as read this tick, with its leader pod and what its engine said."""

    obj: dict[str, Any]
    pods: list[dict[str, Any]]
    sample: EngineSample | None = None

    @property
    def name(self) -> str:
        name: str = self.obj["metadata"]["name"]
        return name

    @property
    def annotations(self) -> dict[str, str]:
        return self.obj["metadata"].get("annotations") or {}

    @property
    def role(self) -> Role:
        # The CRD's enum admits only prefill and decode for spec.role.
        role: Role = self.obj["spec"]["role"]
        return role

    @property
    def phase(self) -> str | None:
        return (self.obj.get("status") or {}).get("phase")

    @property
    def surge(self) -> bool:
        """Started above its role's replicas while the role rolls (`rollout.maxSurge`)."""
        return LABEL_SURGE in (self.obj["metadata"].get("labels") or {})

    @property
    def record(self) -> SwitchState | None:
        return SwitchState.from_annotation(self.annotations.get(ANNOTATION_SWITCH))

    @property
    def revision(self) -> str:
        """The revision its spec was rolled to (`hybridserving.io/revision-hash`), "" when unlabelled."""
        return str((self.obj["metadata"].get("labels") or {}).get(LABEL_REVISION, ""))

    def refused_in_place(self, to_role: str) -> switching.InPlaceRefusal | None:
        """The engine's refusal of the in-place switch to `to_role` on this revision, or None."""
        return switching.refused_in_place(self.annotations.get(ANNOTATION_IN_PLACE_REFUSED), self.role, to_role,
                                          self.revision)

    @property
    def leader(self) -> dict[str, Any] | None:
        return next((p for p in self.pods if (p["metadata"].get("labels") or {}).get(LABEL_NODE_RANK) == "0"), None)

    def urls(self) -> tuple[str, str] | None:
        leader = self.leader
        ip = ((leader or {}).get("status") or {}).get("podIP")
        if not ip:
            return None
        http = self.obj["spec"]["ports"]["http"]
        return f"http://{ip}:{http}", f"http://{ip}:{launcher_port(leader or {})}"

    def refresh(self, written: Mapping[str, Any]) -> None:
        """Take the object a status write returned (its resourceVersion moved on)."""
        if written.get("metadata", {}).get("resourceVersion"):
            self.obj = dict(written)

    def observation(self) -> Observation:
        leader = self.leader
        labels = ((leader or {}).get("metadata") or {}).get("labels") or {}
        roles = {(p["metadata"].get("annotations") or {}).get(ANNOTATION_ROLE) for p in self.pods}
        s = self.sample or EngineSample()
        generation = int(self.obj["spec"].get("restartGeneration") or 0)
        return Observation(
            phase=self.phase,
            spec_role=self.role,
            restart_generation=generation,
            old_gang=any(not p["metadata"].get("deletionTimestamp")
                         and restart_generation(p["metadata"].get("annotations") or {}) < generation
                         for p in self.pods),
            leader_label=labels.get(LABEL_ROLE),
            pods_role=next(iter(roles)) if len(roles) == 1 else None,
            inflight=s.inflight,
            engine_healthy=s.healthy,
            engine_role=s.role,
            launcher=LauncherView.from_status(s.launcher) if s.launcher is not None else None,
        )


@dataclass
class FleetMemory:
    policy: PolicyMemory = field(default_factory=PolicyMemory)
    scaler: ScalerMemory = field(default_factory=ScalerMemory)
    scrapes: dict[str, Scrape] = field(default_factory=dict)
    ticks: int = 0
    drifting: set[str] = field(default_factory=set)  # instances whose engine role disagreed last tick
    announced: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Per instance, the (switch start, step) whose Event this process has posted: a replica that takes
    over mid-switch posts the one its predecessor may have died before posting."""
    valid_spec: tuple[str, HybridServingSpec] | None = None
    """The live spec last found valid, with the resourceVersion it was read at: a fleet left alone
    is validated once, not on every tick."""


@dataclass
class TickReport:
    """What one tick did (for tests and logs)."""

    transitions: list[tuple[str, str, str]] = field(default_factory=list)  # (instance, from step, to step)
    started: list[str] = field(default_factory=list)
    finished: list[tuple[str, str]] = field(default_factory=list)  # (instance, outcome)
    skipped: bool = False
    adopted: list[str] = field(default_factory=list)  # hand edits of spec.role turned into switches
    drift_repaired: list[str] = field(default_factory=list)  # engines restarted for serving the wrong role
    scaled_to: int | None = None  # the fleet's new total, when the built-in scaler resized it


class SwitchController:
    """Drives the role switches of every fleet it is ticked for."""

    def __init__(self, kube: KubeLike, engines: EnginesLike, clock: Callable[[], float] = time.time,
                 step_bounds: Mapping[str, float] | None = None,
                 policy_tuning: Mapping[str, Any] | None = None, *, operator_key: bytes = b"",
                 engine_policy: EnginePolicy = DEFAULT_ENGINE_POLICY) -> None:
        self.kube = kube
        self.engine_policy = engine_policy  # what the reconcile validates with (`--engine-*` flags)
        self.operator_key = operator_key  # engines answer only with their fleet's key (core/enginekey.py)
        self.engines = engines
        self.clock = clock
        self.step_bounds = dict(step_bounds or {})
        self.policy_tuning = dict(policy_tuning or {})
        self.memory: dict[tuple[str, str], FleetMemory] = {}

    def forget(self, namespace: str, name: str) -> None:
        self.memory.pop((namespace, name), None)

    # ------------------------------------------------------------------ one pass

    def tick(self, namespace: str, name: str) -> TickReport:
        report = TickReport()
        mem = self.memory.setdefault((namespace, name), FleetMemory())
        mem.ticks += 1
        try:
            body = self.kube.get(KIND, namespace, name)
        except KubeError as exc:
            if exc.status == 404:
                self.forget(namespace, name)
                report.skipped = True
                return report
            raise
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            report.skipped = True
            return report
        spec = self._effective_spec(namespace, name, body, mem)
        if spec is None:
            report.skipped = True  # never valid: the reconcile reports it, and nothing runs to switch
            return report
        enabled = spec.role_switch.enabled
        instances_raw = [
            i for i in self.kube.list(INSTANCE_KIND, namespace, {LABEL_NAME: name})
            if meta.get("uid") in {r.get("uid") for r in i["metadata"].get("ownerReferences") or []}
            and not i["metadata"].get("deletionTimestamp")
        ]
        in_flight = any(ANNOTATION_SWITCH in (i["metadata"].get("annotations") or {}) for i in instances_raw)
        # A hand edit of spec.role shows first as a status role that disagrees (cheap: no pod list).
        maybe_edited = any(
            ANNOTATION_SWITCH not in (i["metadata"].get("annotations") or {})
            and (i.get("status") or {}).get("role") not in (None, i["spec"].get("role"))
            for i in instances_raw)
        if not enabled and not in_flight and not maybe_edited:
            report.skipped = True
            return report
        pods = [p for p in self.kube.list("Pod", namespace, {LABEL_NAME: name})
                if not p["metadata"].get("deletionTimestamp")]
        instances = {
            i["metadata"]["name"]: Instance(i, sorted(
                (p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_INSTANCE) == i["metadata"]["name"]),
                key=lambda p: int((p["metadata"].get("labels") or {}).get(LABEL_NODE_RANK, "0"))))
            for i in instances_raw
        }
        policy_on = enabled and not spec.rollout.paused
        targets: dict[str, tuple[str, str | None, bool, bool]] = {}
        for inst in instances.values():
            urls = inst.urls()
            if urls is None:
                continue
            busy = inst.record is not None or ANNOTATION_SWITCH_TO in inst.annotations
            if busy or policy_on:
                targets[inst.name] = (urls[0], urls[1], busy, policy_on)
        samples = self.engines.sample_many(
            targets, enginekey.derive(self.operator_key, meta.get("uid") or "")) if targets else {}
        for n, s in samples.items():
            instances[n].sample = s

        now = self.clock()
        config = SwitchConfig.from_spec(spec.role_switch, **self.step_bounds)
        history = SwitchHistory.read(body)
        history.close_orphans(instances, now)

        for inst in instances.values():
            if inst.record is not None:
                self._drive(namespace, body, inst, config, now, history, report)
            else:
                self._adopt_hand_edit(namespace, body, spec, inst, report)
        if policy_on:
            self._repair_role_drift(namespace, body, instances, mem, report)

        if enabled:
            self._on_call(namespace, body, spec, instances, now, history, report)
        if policy_on:
            self._policy(namespace, body, spec, instances, mem, now, history, report)
        elif enabled:
            mem.scrapes.clear()

        self._write_history(namespace, name, history)
        return report

    def _write_history(self, namespace: str, name: str, history: SwitchHistory) -> bool:
        """`status.switches`, if it changed since read or last written (only that field is patched)."""
        if not history.changed:
            return True
        entries = history.entries[-HISTORY_LIMIT:]
        try:
            self.kube.patch(KIND, namespace, name, {"status": {"switches": entries}}, subresource="status")
        except KubeError as exc:
            log.info("%s/%s: switch history not written (%s); next tick", namespace, name, exc)
            return False
        history.entries, history.written = list(entries), list(entries)
        return True

    def _effective_spec(self, namespace: str, name: str, body: dict[str, Any],
                        mem: FleetMemory) -> HybridServingSpec | None:
        """The spec the reconcile plans from: the live one when it is valid, else the last applied.

        An invalid edit leaves the fleet on its last valid spec (`reconcile.validate`,
        `reconcile.last_applied`); switching by the edit instead (say one that turns switching on
        beside a bad flag) would move instances the reconcile then plans back or deletes, and a
        spec whose model cannot be resolved would fail every tick of the switches in flight.
        """
        version = body["metadata"].get("resourceVersion")
        if version and mem.valid_spec is not None and mem.valid_spec[0] == version:
            return mem.valid_spec[1]
        hs, validation = validate(body, self.engine_policy)
        if hs is not None and validation.valid:
            mem.valid_spec = (version, hs.spec) if version else None
            return hs.spec
        try:
            applied = self.kube.get("ConfigMap", namespace, applied_spec_name(name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return spec_of_applied(applied)

    # ------------------------------------------------------------------ driving one switch

    def _drive(self, namespace: str, hs_body: dict[str, Any], inst: Instance, config: SwitchConfig, now: float,
               history: SwitchHistory, report: TickReport) -> None:
        state = inst.record
        assert state is not None
        if self._fleet_memory(namespace, hs_body).announced.get(inst.name) != (state.started, state.step):
            self._event(namespace, hs_body, inst.name, state)  # named: a second post is refused
        obs = inst.observation()
        gauges.launcher_seen(namespace, hs_body["metadata"]["name"], inst.name, state, obs.launcher)
        new, want = state, None
        moves: list[tuple[SwitchState, SwitchState]] = []
        # Verify reads only the engine, already sampled this tick: it may follow Switch at once.
        for _ in range(2):
            before = new
            new, want = switching.step(before, obs, now, config)
            if new.step == before.step:
                break
            moves.append((before, new))
            if new.step != "Verify":
                break
        assert want is not None
        if new.finished:
            if not self._finish(namespace, hs_body, inst, new, now, history, report):
                return
        elif not self._write(namespace, inst, new, want):
            return  # nothing landed: the same transitions are found again next tick
        elif moves:
            history.upsert(_history_entry(inst.name, new))
        for before, after in moves:  # reported once the writes landed
            report.transitions.append((inst.name, before.step, after.step))
            metrics.ROLE_SWITCH_PHASE_SECONDS.labels(before.step, before.mode).observe(
                max(0.0, now - before.step_started))
            self._event(namespace, hs_body, inst.name, after)

    def _write(self, namespace: str, inst: Instance, state: SwitchState | None, want: switching.Desired | None,
               extra_annotations: Mapping[str, str | None] | None = None) -> bool:
        """The record, spec.role and restartGeneration in one conditional patch, then the phase."""
        annotations: dict[str, str | None] = dict(extra_annotations or {})
        record = None if state is None else state.to_annotation()
        if inst.annotations.get(ANNOTATION_SWITCH) != record:
            annotations[ANNOTATION_SWITCH] = record
        spec_patch: dict[str, Any] = {}
        if want is not None and inst.role != want.role:
            spec_patch["role"] = want.role
        if want is not None and want.restart_generation is not None and \
                int(inst.obj["spec"].get("restartGeneration") or 0) < want.restart_generation:
            spec_patch["restartGeneration"] = want.restart_generation
        body: dict[str, Any] = {}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        if spec_patch:
            body["spec"] = spec_patch
        if body:
            try:
                inst.obj = self.kube.patch(INSTANCE_KIND, namespace, inst.name, body,
                                           resource_version=inst.obj["metadata"].get("resourceVersion"))
            except KubeError as exc:
                if exc.conflict:
                    log.info("%s/%s: %s; the switch resumes next tick", namespace, inst.name, exc)
                    return False
                raise
        if want is not None and not switching.phase_applied(want.phase, inst.phase):
            return self._patch_status(namespace, inst, {"phase": want.phase})
        return True

    def _patch_status(self, namespace: str, inst: Instance, status: dict[str, Any]) -> bool:
        """Write part of the instance's status; False on a conflict (the next tick retries)."""
        try:
            inst.refresh(self.kube.patch(INSTANCE_KIND, namespace, inst.name, {"status": status},
                                         subresource="status"))
        except KubeError as exc:
            if not exc.conflict:
                raise
            return False
        return True

    def _finish(self, namespace: str, hs_body: dict[str, Any], inst: Instance, state: SwitchState, now: float,
                history: SwitchHistory, report: TickReport) -> bool:
        """History first, then the instance's lastSwitch, then the record goes: each step repeatable.

        The history is written before the record goes: once the record is gone nothing could
        say how this switch ended, and `status.switches` would show it in progress for good.
        """
        history.upsert(_history_entry(inst.name, state, finished=now))
        if not self._write_history(namespace, hs_body["metadata"]["name"], history):
            return False
        if not self._patch_status(namespace, inst, {"lastSwitch": format_time(now)}):
            return False
        # An in-place refusal is kept with the record's removal, in the same write: the next switch
        # of the instance that way relaunches (`core.switching.start_switch`).
        refused = inst.annotations.get(ANNOTATION_IN_PLACE_REFUSED)
        remembered = switching.remember_refusal(refused, state, inst.revision, now)
        if not self._write(namespace, inst, None, None,
                           {ANNOTATION_IN_PLACE_REFUSED: remembered} if remembered != refused else None):
            return False
        outcome = state.outcome
        metrics.ROLE_SWITCH_OUTCOMES.labels(_reason_kind(state.reason), outcome, state.mode).inc()
        if outcome == "Succeeded":
            metrics.ROLE_SWITCH_DURATION.labels(state.mode).observe(max(0.0, now - state.started))
        report.finished.append((inst.name, outcome))
        log.info("%s/%s: role switch %s -> %s (%s) %s: %s; %s", namespace, inst.name, state.from_role,
                 state.to_role, state.mode, outcome, state.message, _phase_summary(state))
        return True

    def _start(self, namespace: str, hs_body: dict[str, Any], spec: HybridServingSpec, inst: Instance, to_role: str,
               reason: str, now: float, history: SwitchHistory, report: TickReport,
               extra_annotations: Mapping[str, str | None] | None = None) -> bool:
        state = switching.start_switch(inst.role, to_role, reason, now,  # type: ignore[arg-type]
                                       in_place=flags.in_place_role_switch(spec),
                                       refused=inst.annotations.get(ANNOTATION_IN_PLACE_REFUSED),
                                       revision=inst.revision,
                                       nodes=max(spec.prefill.nodes_per_instance, spec.decode.nodes_per_instance))
        mode = state.mode
        want = switching.desired(state, inst.observation())
        if not self._write(namespace, inst, state, want, extra_annotations):
            return False
        report.started.append(inst.name)
        history.upsert(_history_entry(inst.name, state))
        metrics.ROLE_SWITCHES_STARTED.labels(_reason_kind(reason), mode).inc()
        self._event(namespace, hs_body, inst.name, state)
        return True

    # ------------------------------------------------------------------ hand edits and drift

    def _adopt_hand_edit(self, namespace: str, hs_body: dict[str, Any], spec: HybridServingSpec,
                         inst: Instance, report: TickReport) -> None:
        """A `spec.role` edited by hand becomes an on-call switch request, never a bare relabel.

        The planner keeps the pods on their role meanwhile (`core.assignment.held_role`). The edit is
        undone and `switch-to` set in one conditional patch, so the switch then runs the safe
        sequence (unroute, drain, switch, verify, route) with the floors and maxConcurrent.
        With role switching off, the edit is undone and reported.
        """
        pods_role = inst.observation().pods_role
        if pods_role not in ROLES or pods_role == inst.role or inst.phase in SWITCH_PHASES:
            return
        annotations = {ANNOTATION_SWITCH_TO: inst.role} if spec.role_switch.enabled else {}
        body: dict[str, Any] = {"spec": {"role": pods_role}}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        try:
            inst.obj = self.kube.patch(INSTANCE_KIND, namespace, inst.name, body,
                                       resource_version=inst.obj["metadata"].get("resourceVersion"))
        except KubeError as exc:
            if exc.conflict:
                return
            raise
        if annotations:
            report.adopted.append(inst.name)
            self._post(namespace, hs_body, "Normal", "RoleEditAdopted",
                       f"{inst.name}: spec.role was set to {annotations[ANNOTATION_SWITCH_TO]} directly; it switches "
                       f"from {pods_role} through unroute, drain, switch, verify and route instead")
        else:
            self._post(namespace, hs_body, "Warning", "RoleEditReverted",
                       f"{inst.name}: spec.role was set directly, but role switching is off for this fleet: "
                       f"reverted to {pods_role}; set spec.roleSwitch.enabled to move instances between roles")

    def _repair_role_drift(self, namespace: str, hs_body: dict[str, Any], instances: Mapping[str, Instance],
                           mem: FleetMemory, report: TickReport) -> None:
        """An engine serving another role than its routing says, outside any switch, is restarted.

        Its router label sends it the other role's requests, which it cannot serve. Seen on two
        ticks in a row (so a switch finishing between the read and the sample is no drift), the
        gang restarts: fresh engines read the role their pods carry.
        """
        drifting = set()
        for inst in instances.values():
            s = inst.sample
            obs = inst.observation()
            if (inst.record is None and inst.phase == "Ready" and s is not None and s.role in ROLES
                    and obs.pods_role in ROLES and s.role != obs.pods_role):
                drifting.add(inst.name)
        for name in drifting & mem.drifting:
            inst = instances[name]
            generation = int(inst.obj["spec"].get("restartGeneration") or 0) + 1
            try:
                inst.obj = self.kube.patch(INSTANCE_KIND, namespace, name, {"spec": {"restartGeneration": generation}},
                                           resource_version=inst.obj["metadata"].get("resourceVersion"))
            except KubeError as exc:
                if exc.conflict:
                    continue
                raise
            report.drift_repaired.append(name)
            self._post(namespace, hs_body, "Warning", "RoleDrift",
                       f"{name}: the engine serves {inst.sample.role if inst.sample else '?'} "
                       f"while its pods are routed "
                       f"as {inst.observation().pods_role}: restarting the gang")
        mem.drifting = drifting - set(report.drift_repaired)

    # ------------------------------------------------------------------ starting switches

    def _on_call(self, namespace: str, hs_body: dict[str, Any], spec: HybridServingSpec,
                 instances: Mapping[str, Instance], now: float, history: SwitchHistory,
                 report: TickReport) -> None:
        """`hybridserving.io/switch-to: prefill|decode` on an instance: the same safe sequence, on demand.

        It bypasses the policy's judgement (pins, cooldown, pressure) but not its safety: the
        floors, maxConcurrent and rollout.paused hold, and the instance must be serving.
        """
        for inst in instances.values():
            target = inst.annotations.get(ANNOTATION_SWITCH_TO)
            if target is None or inst.record is not None:
                continue
            remove = {ANNOTATION_SWITCH_TO: None}
            if target not in ROLES or target == inst.role:
                why = (f"already {inst.role}" if target == inst.role
                       else f"{target!r} is not a role (prefill or decode)")
                if self._write(namespace, inst, None, None, remove):
                    self._post(namespace, hs_body, "Warning" if target not in ROLES else "Normal",
                               "RoleSwitchRequestIgnored", f"{inst.name}: switch-to {target}: {why}")
                continue
            if spec.rollout.paused or inst.phase != "Ready" or switching.held_by_rollout(hs_body, inst.revision):
                continue  # honoured once unpaused, serving and let go by the rollout
            if _in_flight(instances) >= spec.role_switch.max_concurrent:
                continue
            floor = spec.role_switch.min_prefill if inst.role == "prefill" else spec.role_switch.min_decode
            serving = sum(
                1 for i in instances.values() if i.role == inst.role and i.record is None and i.phase == "Ready"
            )
            if serving - 1 < floor:
                if self._write(namespace, inst, None, None, remove):
                    self._post(namespace, hs_body, "Warning", "RoleSwitchRejected",
                               f"{inst.name}: switch-to {target} would leave {serving - 1} serving {inst.role} "
                               f"instance(s), below roleSwitch.min{inst.role.title()} = {floor}")
                continue
            self._start(namespace, hs_body, spec, inst, target, f"on-call request (annotation {ANNOTATION_SWITCH_TO})",
                        now, history, report, remove)

    def _policy(self, namespace: str, hs_body: dict[str, Any], spec: HybridServingSpec,
                instances: Mapping[str, Instance], mem: FleetMemory, now: float,
                history: SwitchHistory, report: TickReport) -> None:
        in_place = flags.in_place_role_switch(spec)
        states: list[InstanceState] = []
        observed: dict[str, InstanceMetrics] = {}
        for inst in instances.values():
            record = inst.record
            last = parse_time((inst.obj.get("status") or {}).get("lastSwitch"))
            # A surge instance leaves when its role has rolled: moving it would only unbalance the roles.
            pinned = (switching.pinned(inst.annotations)
                      or inst.surge
                      or switching.held_by_rollout(hs_body, inst.revision))
            phase: Phase
            if record is not None:
                phase = ("draining" if record.step in ("Unroute", "Drain")
                         else "switching" if record.step in ("Switch", "Verify", "Route") else "down")
                target = record.to_role if phase != "down" else None
                states.append(InstanceState(inst.name, record.from_role, phase, target, last, pinned, in_place,
                                            restoring=phase == "down"))
                continue
            phase = "serving" if inst.phase == "Ready" else "down"
            # An instance whose engine refused to switch in place would relaunch: the policy weighs
            # that (minutes, not seconds; never on its fast path), and of equally loaded donors takes
            # one that switches in place.
            own_in_place = in_place and inst.refused_in_place(switching.other_role(inst.role)) is None
            states.append(InstanceState(inst.name, inst.role, phase, None, last, pinned, own_in_place))
            s = inst.sample
            if phase == "serving" and s is not None and s.loads is not None:
                observed[inst.name] = instance_metrics(inst.role, s.loads, s.scrape, mem.scrapes.get(inst.name))
                if s.scrape is not None:
                    mem.scrapes[inst.name] = s.scrape
        model = policy_model(spec, instances)
        config = PolicyConfig.from_spec(spec.role_switch, paused=spec.rollout.paused,
                                        declared_prefill_share=prefill_share(spec), **self.policy_tuning)
        policy = RoleSwitchPolicy(config, model)
        decisions, mem.policy = policy.decide_all(now, states, observed, mem.policy)
        for d in decisions:
            chosen = instances.get(d.instance)
            if chosen is None or chosen.record is not None or chosen.role != d.from_role:
                continue
            self._start(namespace, hs_body, spec, chosen, d.to_role, f"policy: {d.reason}", now, history, report)
        if spec.scaling.enabled:
            self._scale(namespace, hs_body, spec, policy, states, instances, observed, decisions, mem, now, report)

    def _scale(self, namespace: str, hs_body: dict[str, Any], spec: HybridServingSpec, policy: RoleSwitchPolicy,
               states: list[InstanceState], instances: Mapping[str, Instance],
               observed: Mapping[str, InstanceMetrics], decisions: list[Decision],
               mem: FleetMemory, now: float, report: TickReport) -> None:
        """Resize the fleet's total from the policy's own demand, the way HPA would: through the
        scale subresource (`spec.replicas`), so that the reconcile adds or removes instances, the
        role-switch controller splits them, and a user or GitOps sees one writer of one field.

        Instances coming up count as launching (they hold GPUs): those pending or starting, for
        up to two launch times, and gangs a switch is restarting. One stuck otherwise (crash
        looping, failed, blocked, unready, or pending past that) counts as neither capacity nor a
        launch: counted as launching, it would hold every scale-down and a launch slot for as long
        as it stays stuck, which status reports. The room up to `scaling.maxReplicas` is what the
        scaler may launch into. The scaler names the instance it would remove; the fleet's
        assignment picks the one to go (`core.assignment`), and its pods drain on termination.
        It decides nothing while the fleet's instances differ from its total in number: the
        reconcile has a resize still to carry out.
        """
        if sum(1 for inst in instances.values() if not inst.surge) != spec.total_instances():
            # The last resize (this scaler's, HPA's, a user's) is not carried out yet: deciding on
            # the instances as they are would count an instance already asked away, or miss one
            # already asked for, and resize a second time.
            return
        config = ScalingConfig.from_spec(spec.scaling, spec.role_switch)
        moving = {d.instance for d in decisions}
        horizon = 2 * policy.model.launch_seconds() * policy.model.time_scale

        def coming_up(name: str) -> bool:
            inst = instances[name]
            if inst.record is not None:
                return True
            created = parse_time(inst.obj["metadata"].get("creationTimestamp"))
            return inst.phase in (None, "Pending", "Starting") and (created is None or now - created < horizon)

        fleet = [s if s.phase != "down" else InstanceState(s.name, s.role, "switching", s.role, s.last_switch_at,
                                                           s.pinned, s.in_place)
                 for s in states if s.name not in moving and (s.phase != "down" or coming_up(s.name))]
        room = max(0, config.max_instances - len(states))
        fleet += [InstanceState(f"(room {i})", "decode", "down") for i in range(room)]
        actions, mem.scaler = FleetScaler(config, policy).decide(
            now, fleet, observed, policy.demand_of(mem.policy), mem.scaler)
        if not actions:
            return
        current = spec.total_instances()
        added = sum(1 for a in actions if a.kind == "add")
        removed = sum(1 for a in actions if a.kind == "remove")
        want = min(spec.scaling.max_replicas, max(spec.scaling.min_replicas, current + added - removed))
        if want == current:
            return
        meta = hs_body["metadata"]
        try:
            # On the fleet as read: a `kubectl scale` or a spec edit since then is a 409, and the next
            # tick decides from it instead of writing over it.
            self.kube.patch(KIND, namespace, meta["name"], {"spec": {"replicas": want}}, subresource="scale",
                            resource_version=meta.get("resourceVersion"))
        except KubeError as exc:
            log.info("%s/%s: scale to %d not written (%s); next tick", namespace, meta["name"], want, exc)
            if exc.conflict:
                return
            self._post(namespace, hs_body, "Warning", "ScaleFailed",
                       f"the scaler could not resize the fleet from {current} to {want} instances: {exc}")
            return
        report.scaled_to = want
        verb = "ScaledUp" if want > current else "ScaledDown"
        self._post(namespace, hs_body, "Normal", verb, f"fleet resized from {current} to {want} instances: "
                   f"{actions[0].reason}")

    # ------------------------------------------------------------------ events

    def _fleet_memory(self, namespace: str, hs_body: dict[str, Any]) -> FleetMemory:
        return self.memory.setdefault((namespace, hs_body["metadata"]["name"]), FleetMemory())

    def _event(self, namespace: str, hs_body: dict[str, Any], instance: str, state: SwitchState) -> None:
        """The Event of the step `state` entered, named after the switch and the step so that it is
        posted once even when a replica taking over mid-switch posts it again."""
        self._fleet_memory(namespace, hs_body).announced[instance] = (state.started, state.step)
        s = state.step
        what = f"{instance} {state.from_role} → {state.to_role} ({state.mode})"
        if s == "Unroute":
            event = ("Normal", "RoleSwitchStarted", f"{what}: removed from the router, draining; {state.reason}")
        elif s == "Drain":
            event = ("Normal", "RoleSwitchUnrouted", f"{what}: out of the router, draining")
        elif s == "Switch" and state.recreate:
            event = ("Normal", "RoleSwitchDrained",
                     f"{what}: drained in {state.phases.get('Drain', 0):.1f} s; relaunching: the gang is recreated "
                     f"as {state.to_role} (restartGeneration {state.restart_generation}); {state.reason}")
        elif s == "Switch":
            event = ("Normal", "RoleSwitchDrained",
                     f"{what}: drained in {state.phases.get('Drain', 0):.1f} s; switching")
        elif s == "Verify":
            event = ("Normal", "RoleSwitchSwitched",
                     f"{what}: launcher runs {state.to_role} after {state.phases.get('Switch', 0):.1f} s; verifying")
        elif s == "Route":
            event = ("Normal", "RoleSwitchVerified", f"{what}: engine healthy as {state.to_role}; routing")
        elif s == "Restore" and state.outcome == "Refused" and state.mode == "in-place":
            event = ("Warning", "RoleSwitchRefused",
                     f"{what}: {state.message}; restoring {state.from_role}; its next switch to {state.to_role} "
                     f"relaunches the engine instead")
        elif s == "Restore":
            event = ("Warning", "RoleSwitchRefused" if state.outcome == "Refused" else "RoleSwitchAborted",
                     f"{what}: {state.message}; restoring {state.from_role}")
        elif s == "Restart":
            event = ("Warning", "RoleSwitchFailed",
                     f"{what}: {state.message}; restarting the instance as {state.from_role}")
        else:
            reason = {"Succeeded": "RoleSwitchSucceeded", "Failed": "RoleSwitchRestarted"}.get(
                state.outcome, "RoleSwitchRestored")
            event = ("Normal" if state.outcome == "Succeeded" else "Warning", reason,
                     f"{what}: {state.outcome}: {state.message}; {_phase_summary(state)}")
        self._post(namespace, hs_body, *event, name=f"{instance}.switch-{int(state.started * 1000):x}.{s.lower()}")

    def _post(self, namespace: str, hs_body: dict[str, Any], type_: str, reason: str, message: str,
              name: str | None = None) -> None:
        meta = hs_body["metadata"]
        stamp = format_time(self.clock())
        naming_ = {"name": name} if name else {"generateName": f"{meta['name']}."}
        try:
            self.kube.create("Event", namespace, {
                "metadata": {**naming_, "namespace": namespace},
                "involvedObject": {"apiVersion": hs_body.get("apiVersion"), "kind": KIND, "name": meta["name"],
                                   "namespace": namespace, "uid": meta.get("uid")},
                "type": type_, "reason": reason, "message": message[:1000],
                "source": {"component": "hybridserving-operator"},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            })
        except KubeError as exc:  # best effort; a 409 on a named Event: posted already
            log.debug("event not posted: %s", exc)


def _in_flight(instances: Mapping[str, Instance]) -> int:
    return sum(1 for i in instances.values() if i.record is not None)


def _reason_kind(reason: str) -> metrics.SwitchReason:
    return "on-call" if reason.startswith("on-call") else "policy"


STEP_ORDER = ("Unroute", "Drain", "Switch", "Verify", "Route", "Restore", "Restart")


def _phase_summary(state: SwitchState) -> str:
    order = {s: i for i, s in enumerate(STEP_ORDER)}
    steps = sorted(state.phases.items(), key=lambda kv: order.get(kv[0], len(order)))
    return ", ".join(f"{k} {v:.1f} s" for k, v in steps)


def _history_entry(instance: str, state: SwitchState, finished: float | None = None) -> dict[str, Any]:
    """A `SwitchRecord` (api.v1alpha1) of `state`."""
    outcome = state.outcome if state.finished else "InProgress"
    entry: dict[str, Any] = {
        "instance": instance, "fromRole": state.from_role, "toRole": state.to_role, "mode": state.mode,
        "reason": state.reason[:512], "outcome": outcome, "started": format_time(state.started),
        "phase": state.step,
    }
    if state.finished:
        entry["finished"] = format_time(finished if finished is not None else state.step_started)
        detail = f"{state.outcome}: {state.message}" if state.message else state.outcome
        entry["phase"] = f"{detail} ({_phase_summary(state)})"
    return entry


@dataclass
class SwitchHistory:
    """A fleet's `status.switches` as this tick sees it, and as last read or written."""

    entries: list[dict[str, Any]]
    written: list[dict[str, Any]]

    @classmethod
    def read(cls, body: Mapping[str, Any]) -> SwitchHistory:
        entries = list((body.get("status") or {}).get("switches") or [])
        return cls(entries, list(entries))

    @property
    def changed(self) -> bool:
        return self.entries != self.written

    def upsert(self, entry: dict[str, Any]) -> None:
        """Replace the entry of the same switch (instance and start), or append: repeatable."""
        for i, old in enumerate(self.entries):
            if old.get("instance") == entry["instance"] and old.get("started") == entry["started"]:
                if old != entry:
                    self.entries[i] = entry
                return
        self.entries.append(entry)

    def close_orphans(self, instances: Mapping[str, Instance], now: float) -> None:
        """End the entries in progress that no switch record carries any more.

        A record lives on its instance until the switch has ended; an entry still in progress
        without one lost its instance (deleted: a scale-down, or its fleet shrank) or was left by
        an older operator that removed the record first. Left open, the entry would say the
        switch runs for good.
        """
        for i, entry in enumerate(self.entries):
            if entry.get("outcome") != "InProgress":
                continue
            inst = instances.get(entry.get("instance", ""))
            record = inst.record if inst is not None else None
            if record is not None and format_time(record.started) == entry.get("started"):
                continue
            why = "the instance was deleted" if inst is None else "its switch record is gone"
            self.entries[i] = {**entry, "outcome": "Aborted", "finished": format_time(now),
                               "phase": f"Aborted: {why} (last seen in {entry.get('phase')})"}


# ---------------------------------------------------------------------- the loop


async def run(kube: KubeLike, fleets: Callable[[], Iterable[tuple[str, str]]], *,
              interval: float = TICK_SECONDS, engines: EnginesLike | None = None,
              controller: SwitchController | None = None, threads: int = TICK_THREADS,
              operator_key: bytes = b"", engine_policy: EnginePolicy = DEFAULT_ENGINE_POLICY,
              failing: dict[tuple[str, str], liveness.FailingPasses] | None = None) -> None:
    """Tick every known fleet every `interval` seconds until cancelled, each fleet on its own.

    One asyncio task per fleet, its ticks in a thread pool of `threads`: a fleet whose API calls
    or engines hang holds one thread and delays only itself, and a fleet whose tick fails retries
    after a backoff while the others keep their pace. The set of fleets is read every interval;
    a fleet that left it has its task cancelled and its memory dropped. `failing` holds the
    fleets whose ticks are failing now, for the reconcile to report in status.
    """
    failing = {} if failing is None else failing
    own = None
    if controller is None:
        own = Engines() if engines is None else None
        controller = SwitchController(kube, engines or own, operator_key=operator_key,  # type: ignore[arg-type]
                                      engine_policy=engine_policy)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="role-switch")
    tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
    try:
        while True:
            known = set(fleets())
            for key in known - tasks.keys():
                tasks[key] = asyncio.create_task(_tick_fleet(controller, key, interval, pool, failing),
                                                 name=f"role-switch {key[0]}/{key[1]}")
            for key in tasks.keys() - known:
                tasks.pop(key).cancel()
                controller.forget(*key)
                failing.pop(key, None)
            await asyncio.sleep(interval)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        pool.shutdown(wait=False, cancel_futures=True)
        if own is not None:
            own.close()


async def _tick_fleet(controller: SwitchController, key: tuple[str, str], interval: float,
                      pool: ThreadPoolExecutor, failing: dict[tuple[str, str], liveness.FailingPasses]) -> None:
    """One fleet's ticks, forever: every interval, less often while idle, backing off while failing."""
    loop = asyncio.get_running_loop()
    while True:
        started = time.monotonic()
        try:
            report = await loop.run_in_executor(pool, controller.tick, *key)
        except Exception as exc:  # noqa: BLE001 - a failing tick is retried; it never ends the fleet's task
            streak = failing[key] = liveness.failed_again(failing.get(key), describe_failure(exc), time.monotonic(),
                                                          "role-switch tick")
            metrics.ROLE_SWITCH_TICKS.labels("error").inc()
            log.exception("%s/%s: role-switch tick failed (%d in a row)", *key, streak.passes)
            delay = min(ERROR_BACKOFF_MAX_SECONDS, interval * 2 ** min(streak.passes, 16))
        else:
            failing.pop(key, None)
            metrics.ROLE_SWITCH_TICKS.labels("skipped" if report.skipped else "ran").inc()
            # A fleet with switching off and nothing in flight is looked at less often.
            delay = interval * (IDLE_FLEET_EVERY if report.skipped else 1) - (time.monotonic() - started)
        await asyncio.sleep(max(0.1 * interval, delay))


def policy_model(spec: HybridServingSpec, instances: Mapping[str, Instance]) -> PerformanceModel:
    """The performance model the policy projects with: the decode layout on the fleet's GPU model,
    at the engines' time scale.

    The timings follow `hardware.gpuType` (an H200's, as its memory does, when none is named): an
    H200 prefills 2.3× slower than the B300 the model is calibrated on, so B300 timings would
    project an H200 fleet's prefill pressure 2.3× too low. `/server_info`'s `max_total_num_tokens`
    is one DP rank's pool (the data-parallel controller reports its first scheduler's:
    `managers/data_parallel_controller.py:821`), and each attention-DP rank has its own: the
    instance holds `attnDp` of them; before any engine answered, the capacity model's pool stands
    in. The running-request cap is the one the engine's schedulers sized, from `/v1/loads`
    (`EngineSample.max_running_requests`); `/server_info`'s is the flag, which stands in (or else
    the model's default) only while no engine answered that.
    """
    info: dict[str, Any] = {}
    cap: int | None = None
    for inst in instances.values():
        si = (inst.sample.server_info if inst.sample else None) or {}
        if si and (not info or inst.role == "decode"):
            info = si
        sized = inst.sample.max_running_requests if inst.sample else None
        if sized and (cap is None or inst.role == "decode"):
            cap = sized
    cap = cap or (int(info["max_running_requests"]) if info.get("max_running_requests") else None)
    kwargs: dict[str, Any] = {"max_running_requests": cap} if cap else {}
    layout = spec.decode.layout
    return PerformanceModel.for_role(
        spec.architecture(), tp=layout.tp, dcp=layout.dcp,
        kv_tokens=(int(info["max_total_num_tokens"]) * layout.attn_dp if info.get("max_total_num_tokens")
                   else role_capacity(spec, "decode").tokens),
        time_scale=float(info.get("simulator_time_scale") or 1.0), gpu=spec.hardware.assumed_gpu_type, **kwargs,
    )
