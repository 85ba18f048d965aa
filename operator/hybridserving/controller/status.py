"""What the operator reports: HybridServing status, conditions and instance status.

Everything here is computed from the plan and the observed state (no API calls), so a
restarted operator reports the same thing; conditions keep their lastTransitionTime while
their status stays the same (Kubernetes API conventions).
"""

from __future__ import annotations

import datetime as dt
import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from hybridserving.api.base import ApiModel, FieldError
from hybridserving.api.instance import HybridServingInstanceStatus, InstancePhase
from hybridserving.api.v1alpha1 import (
    ROLES,
    CapacityStatus,
    Condition,
    HybridServingSpec,
    HybridServingStatus,
    InstanceStatus,
    RoleCounts,
    RoleStatus,
    RolloutStatus,
)
from hybridserving.contract import ANNOTATION_ROLE
from hybridserving.core import backoff, capacity, fleet, router, stalled
from hybridserving.core.desired import DesiredState
from hybridserving.core.health import InstanceState, InstanceView
from hybridserving.core.layout import LayoutIssue
from hybridserving.core.naming import LABEL_COMPONENT, LABEL_REVISION, engine_selector, revision_name
from hybridserving.core.observed import Observed, format_time, parse_time
from hybridserving.core.rollout import RERENDERED, canaries_coming_up, held_by, instance_pairing_key, rerendered
from hybridserving.core.switching import ANNOTATION_SWITCH, SWITCH_PHASES, switch_owns_phase


# RoleSwitching's reason while the fleet's role-switch ticks keep failing.
SWITCH_TICKS_FAILING = "SwitchTicksFailing"
# How long a fleet may keep Progressing before status says it is stuck (a Deployment's
# progressDeadlineSeconds). Generous: a large model takes many minutes to load.
PROGRESS_DEADLINE_SECONDS = 1800.0


def wire(status: ApiModel) -> dict[str, Any]:
    """A status model as the status subresource takes it: camelCase, no nulls, and only the
    fields this writer set. A status field has one writer: the reconcile never sends a field
    the role-switch controller owns (`switches`, `lastSwitch`, `phase` during a switch), so
    its merge patches cannot write over them."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Validation:
    """The outcome of checking a spec: the issues, and whether the fleet follows it."""

    issues: Sequence[LayoutIssue]
    parse_errors: Sequence[FieldError] = ()

    @property
    def errors(self) -> list[LayoutIssue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def valid(self) -> bool:
        return not self.parse_errors and not self.errors

    @property
    def refusals(self) -> list[str]:
        """Each error as `field: what is wrong`."""
        return [f"{e.path}: {e.message}" for e in self.parse_errors] + [f"{i.path}: {i.message}" for i in self.errors]

    def message(self) -> str:
        if self.parse_errors:
            return "; ".join(self.refusals)
        shown = self.errors or list(self.issues)
        return " | ".join(f"{i.path}: {i.message}. Fix: {i.fix}" for i in shown)[:4000]


class PlanFallback(enum.Enum):
    """What a pass does with a fleet whose spec it could not plan (the value says it to users)."""

    LAST_APPLIED = "the fleet keeps running the last applied spec"
    AS_IS = "the fleet is left as it is until its spec can be planned"
    NOTHING = "no spec was applied before: nothing was created"


@dataclass(frozen=True)
class PlanFailure:
    """The spec passed validation and planning it raised: a rule validation lacks. The error,
    as `Type: text`, and what the pass did instead."""

    error: str
    fallback: PlanFallback

    def message(self) -> str:
        return f"the spec could not be planned ({self.error}); {self.fallback.value}"

    def not_applied_message(self, generation: int | None) -> str:
        return f"generation {generation} is not applied: it could not be planned ({self.error}); {self.fallback.value}"


def unschedulable_message(desired: DesiredState, v: InstanceView) -> str:
    """Why an instance cannot be placed, in the terms of its spec and the scheduler's words."""
    spec = desired.spec
    rs = spec.role(v.plan.role)
    gpus = rs.gpus_per_pod
    needs = (
        f"needs {rs.nodes_per_instance} node(s) with {gpus} free {spec.hardware.gpu_resource_name} "
        f"in one {spec.network.nvlink_domain_key} value"
    )
    if rs.nodes_per_instance == 1:
        needs = f"needs a node with {gpus} free {spec.hardware.gpu_resource_name}"
    if spec.transfer.rdma_resource_count:
        needs += f" and {spec.transfer.rdma_resource_count} {spec.transfer.rdma_resource_name}"
    needs += f", in the {spec.network.rdma_fabric_key} of the fleet"
    scheduler = next((p.unschedulable for p in v.pods if p.unschedulable), "")
    return f"{v.plan.name} ({v.plan.role}) {needs}; scheduler: {scheduler}"


def instance_phase(v: InstanceView) -> InstancePhase:
    """The operator's view of an instance; switch phases belong to the role-switch controller.

    A starting instance whose pod waits past its grace (`instance_stall`) is `Stalled`, not
    `Starting`: nothing else on the instance would tell that it may never start.
    """
    if v.observed.phase in SWITCH_PHASES:
        return cast(InstancePhase, v.observed.phase)
    pods = [p for p in v.pods if not p.deleting]
    if any(p.crash_looping for p in pods):
        return "CrashLoop"
    if any(p.blocked for p in pods):
        return "Blocked"
    if v.state == "Starting" and instance_stall(v) is not None:
        return "Stalled"
    if not v.available and any(p.lost_readiness and not v.stale(p) for p in pods):
        return "Unready"
    settled: dict[InstanceState, InstancePhase] = {"Ready": "Ready", "Failed": "Failed", "Pending": "Pending"}
    return settled.get(v.state, "Starting" if v.pods else "Pending")


def restart_loop_message(v: InstanceView) -> str:
    """Where a gang in its restart loop (`v.restart_looping`) is: held by its back-off until the
    next restart, restarting, or starting again after the last restart."""
    restarts = v.restarts
    assert restarts is not None, "only a gang restarted before is in a restart loop"
    failure = v.failure()
    if v.backing_off:
        return (f"{v.plan.name} keeps failing ({failure}) after {restarts.count} gang restart(s) in a row: "
                f"next restart at {format_time(restarts.last + backoff.delay(restarts.count))}")
    if failure:
        return f"{v.plan.name} keeps failing ({failure}) after {restarts.count} gang restart(s) in a row: restarting"
    return (f"{v.plan.name} keeps failing: gang restart {restarts.count} in a row at {format_time(restarts.last)} "
            "is starting again, not Ready yet")


def instance_stall(v: InstanceView) -> stalled.StalledPod | None:
    """The instance's first pod gated from scheduling, never tried by its scheduler, or not getting
    its containers, for too long when its pods were read; None where none is, or no time was read."""
    if v.now is None:
        return None
    return next(iter(stalled.stalled(v.pods, v.now)), None)


def stalled_pods(views: Mapping[str, InstanceView], clock: float) -> list[stalled.StalledPod]:
    """The fleet's pods gated from scheduling, never tried by their scheduler, or not getting their
    containers, for too long."""
    return stalled.stalled([p for v in sorted(views.values(), key=lambda v: v.plan.index) for p in v.pods], clock)


def instance_status(v: InstanceView, generation: int | None) -> HybridServingInstanceStatus:
    """The fields of an instance's status the reconcile owns, from what it observed.

    `phase` is left out while the role-switch controller owns it (`switch_owns_phase`), and
    `lastSwitch` always: that controller writes them.
    """
    pods = [p for p in v.pods if not p.deleting]
    leader = next((p for p in pods if p.rank == 0), None)
    status = HybridServingInstanceStatus(
        ready_pods=sum(1 for p in pods if p.ready and not v.stale(p)),
        restarts=sum(p.restarts for p in pods),
        pod_names=[p.name for p in pods],
        node_names=[p.node_name or "" for p in pods],
    )
    if not switch_owns_phase(v.observed.annotations.get(ANNOTATION_SWITCH), v.observed.phase):
        status.phase = instance_phase(v)
    last_exit = next((p.last_exit for p in pods if p.last_exit), None)
    if last_exit:
        status.last_exit = last_exit[:1024]
    if leader is not None and v.observed.phase not in SWITCH_PHASES:
        role = leader.annotations.get(ANNOTATION_ROLE, v.observed.spec.role)
        status.role = role if role in ROLES else v.observed.spec.role
    if generation is not None:
        status.observed_generation = generation
    # A switch phase (Draining, Switching, ...) is the switch's to show; `Ready`, which it writes as it
    # routes the instance back or restores it, is a step it took, not what the pods say now.
    phase = (status.phase if "phase" in status.model_fields_set
             else v.observed.phase if v.observed.phase in SWITCH_PHASES else instance_phase(v))
    total = max(len(v.plan.pods), 1)
    blocked = next((p.blocked for p in pods if p.blocked), None)
    stall = instance_stall(v) if phase == "Stalled" else None
    message = f"{phase}: {status.ready_pods}/{total} pod(s) ready"
    if phase == "Ready":
        message = f"serving as {status.role or v.plan.role}"
    elif phase == "CrashLoop" and last_exit:
        message += f"; last exit: {last_exit[:200]}"
    elif phase == "Blocked":
        message += f"; {blocked}"
    elif stall is not None and v.now is not None:
        message += f"; {stall.describe(v.now)}"
    previous = {c.get("type", ""): c for c in v.observed.status.get("conditions") or []}
    # `kubectl wait --for=condition=Ready hybridservinginstance/NAME` works like it does for pods.
    reason = "CrashLoopBackOff" if v.restart_looping else stall.reason if stall is not None else phase
    if v.restart_looping:
        message = restart_loop_message(v)
    status.conditions = [condition("Ready", phase == "Ready", reason, message, generation, previous)]
    return status


def capacity_status(spec: HybridServingSpec, decode_instances: int) -> CapacityStatus:
    """KV capacity per instance from the layout; zeros with a reason when the layout has none."""
    try:
        decode, prefill = (fleet.role_capacity(spec, role) for role in ("decode", "prefill"))
    except (capacity.CapacityError, KeyError, ValueError, ArithmeticError) as exc:
        # Status must still be written: a layout that validation let through reads as no capacity.
        return CapacityStatus(summary=f"no capacity: {exc}")
    per_instance = decode.tokens
    return CapacityStatus(
        decode_tokens_per_instance=per_instance,
        decode_tokens_total=per_instance * decode_instances,
        prefill_tokens_per_instance=prefill.tokens,
        bytes_per_token_per_rank=int(decode.footprint.per_token),
        summary=f"{per_instance / 1e6:.2f}M tokens per decode instance, "
        f"{per_instance * decode_instances / 1e6:.2f}M in {decode_instances}",
    )


def condition(
    type_: str, ok: bool | None, reason: str, message: str, generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
) -> Condition:
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else ("True" if ok else "False")
    old = previous.get(type_) or {}
    changed = old.get("status") != status
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:4000],
        observed_generation=generation,
        last_transition_time=now() if changed or not old.get("lastTransitionTime") else old["lastTransitionTime"],
    )


def fleet_status(
    desired: DesiredState | None,
    observed: Observed,
    views: Mapping[str, InstanceView],
    validation: Validation,
    generation: int | None,
    previous_status: Mapping[str, Any] | None,
    pending_actions: int,
    errors: Sequence[str],
    *,
    error_reason: str = "ReconcileError",
    plan_failure: PlanFailure | None = None,
    progress_deadline_seconds: float = PROGRESS_DEADLINE_SECONDS,
    at: float | None = None,
    switch_trouble: str | None = None,
) -> dict[str, Any]:
    """The HybridServing's status: conditions, per-role counts, instances, capacity.

    `errors` are what this pass failed to do (`error_reason` their kind); they make the
    fleet Degraded whatever else is true. A generation that fails validation, or that could
    not be planned (`plan_failure`), is not applied: Progressing is False and says why. A
    fleet Progressing for longer than `progress_deadline_seconds` turns
    Progressing=False/ProgressDeadlineExceeded and Degraded, naming the instances that are not
    ready, until it completes or its spec changes. `switch_trouble` (the role-switch ticks keep
    failing) makes RoleSwitching Unknown: whether a switch would start or finish is not known.
    """
    previous = {c.get("type"): c for c in (previous_status or {}).get("conditions") or []}
    clock = time.time() if at is None else at
    conds: list[Condition] = []
    if validation.valid:
        warnings = [i for i in validation.issues if i.severity == "warning"]
        conds.append(condition("LayoutValid", True, "LayoutValid",
                               validation.message() if warnings else "the spec's layout passes every rule",
                               generation, previous))
    else:
        kept = "; the fleet keeps running the last valid spec" if desired is not None else ""
        conds.append(condition("LayoutValid", False, "LayoutInvalid", validation.message() + kept,
                               generation, previous))
    not_applied = not_applied_reason(validation, plan_failure, generation)
    if desired is None:
        for type_ in ("Ready", "Progressing", "Degraded", "RoleSwitching"):
            if type_ == "Degraded" and errors:
                conds.append(condition(type_, True, error_reason, "; ".join(errors), generation, previous))
            elif plan_failure is None:
                conds.append(condition(type_, None if type_ != "Ready" else False, "NoValidSpec",
                                       no_valid_spec_message(observed), generation, previous))
            elif type_ == "Progressing" and not_applied is not None:
                conds.append(condition(type_, False, *not_applied, generation, previous))
            else:  # what the fleet does is not read while its spec cannot be planned
                conds.append(condition(type_, None if type_ != "Ready" else False, "PlanFailed",
                                       plan_failure.message(), generation, previous))
        # Nothing planned, so no instance is judged against a plan: the per-role counts, the
        # instance list and the capacity of an earlier pass would read as current (a merge patch
        # keeps what it does not name), so they are removed; the instances that exist are counted.
        unplanned = wire(HybridServingStatus(observed_generation=generation, conditions=conds, ready="False",
                                             replicas=len(observed.instances)))
        return {**unplanned, "prefill": None, "decode": None, "instances": None, "capacity": None}

    per_role: dict[str, RoleStatus] = {}
    for role in ROLES:
        planned = [p for p in desired.instances.values() if p.role == role]
        role_views = [v for v in views.values() if v.plan.role == role]
        ready = sum(1 for v in role_views if v.available)
        updated = sum(1 for v in role_views if v.current and not v.plan.surge and not any(v.stale(p) for p in v.pods))
        per_role[role] = RoleStatus(desired=len(planned), ready=ready, updated=updated,
                                    summary=f"{ready}/{len(planned)}")
    total = sum(r.desired for r in per_role.values())
    ready_total = sum(r.ready for r in per_role.values())
    all_ready = ready_total == total and len(views) == total
    routing = router_health(desired, observed, views, clock)
    serving = all_ready and (routing is None or routing.available)
    conds.append(ready_condition(all_ready, routing, per_role, generation, previous))
    outdated = [v.plan.name for v in views.values() if not v.current]
    # Instances that roll with their configuration unchanged say so: engines restarting after
    # an operator upgrade, with nothing changed in the spec, must not read as a spec rollout.
    to_roll = (f"{len(outdated)} instance(s) to roll to {RERENDERED}"
               if outdated and all(rerendered(v, desired.revision_hash) for v in views.values() if not v.current)
               else f"{len(outdated)} instance(s) to roll")
    progressing = bool(outdated) or pending_actions > 0 or not all_ready
    held = held_by(desired.spec.rollout, views)
    coming_up = canaries_coming_up(views) if held == "Canary" else []
    if coming_up:
        held = None
    rollout = rollout_status(desired, views, per_role, all_ready and len(views) == total, held,
                             (previous_status or {}).get("rollout") or {})
    if held == "Paused":
        reason = "RolloutPaused"
        message = f"rollout paused with {to_roll}: {', '.join(outdated)}"
    elif held == "Canary":
        reason, message = "RolloutHeldByCanary", rollout.message
    elif coming_up:
        reason = "RollingOut"
        message = f"{to_roll} once canary {', '.join(coming_up)} is available: {', '.join(outdated)}"
    elif outdated:
        reason = "RollingOut"
        message = f"{to_roll}, one role at a time: {', '.join(outdated)}"
    elif progressing:
        reason, message = "Reconciling", f"{pending_actions} change(s) in flight, {ready_total}/{total} instances ready"
    else:
        reason, message = "Complete", "every instance runs the current spec"
    if not_applied is not None:
        progressing, (reason, message) = False, not_applied
    not_ready = [v.plan.name for v in sorted(views.values(), key=lambda v: v.plan.index) if not v.available]
    progressed_at = last_progress(previous_status or {}, previous.get("Progressing") or {}, generation, per_role,
                                  held, progressing, clock)
    stuck = progressing and held is None and _past_deadline(
        previous.get("Progressing") or {}, generation, clock, progressed_at, progress_deadline_seconds)
    if stuck:
        progressing, reason = False, "ProgressDeadlineExceeded"
        message = (f"no completion within {progress_deadline_seconds:.0f}s: "
                   f"not ready: {', '.join(not_ready) or 'none'}; to roll: {', '.join(outdated) or 'none'}")
    conds.append(condition("Progressing", progressing, reason, message, generation, previous))

    troubles = [unschedulable_message(desired, v) for v in views.values() if v.state == "Pending"]
    waiting = stalled_pods(views, clock)
    gated = [p for p in waiting if p.reason == "SchedulingGated"]
    untried = [p for p in waiting if p.reason == "NoScheduler"]
    not_created = [p for p in waiting if p.reason == "ContainerNotCreated"]
    troubles += [p.describe(clock) for p in [*gated, *untried]]
    looping = [v for v in views.values() if v.restart_looping]
    troubles += [restart_loop_message(v) for v in looping]
    troubles += [f"{v.plan.name} failed: {v.failure()}" for v in views.values()
                 if v.state == "Failed" and not v.restart_looping]
    phases = {name: instance_phase(v) for name, v in views.items()}
    # From the pods, not the phase: an instance in a switch phase shows that phase, and its
    # engine crash-looping after a relaunch must still make the fleet Degraded.
    crash_looping = [v for v in views.values() if any(p.crash_looping for p in v.pods if not p.deleting)]
    troubles += [f"{v.plan.name} is crash looping ({instance_status(v, None).last_exit or 'no exit recorded'})"
                 for v in crash_looping]
    blocked = [v for v in views.values() if all(v is not c for c in crash_looping)
               and any(p.blocked for p in v.pods if not p.deleting)]
    troubles += [f"{v.plan.name} cannot start: {next(p.blocked for p in v.pods if p.blocked)}" for v in blocked]
    troubles += [p.describe(clock) for p in not_created]
    unready = [v.plan.name for name, v in views.items() if phases[name] == "Unready"]
    if unready:
        troubles.append(f"{', '.join(unready)} stopped answering the engine's readiness probe (/ready) after "
                        "serving: a hung or overloaded engine; its pod's events and the engine log say more")
    if stuck:
        troubles.append(message)
    if routing is not None and routing.trouble:
        troubles.append(routing.trouble)
    troubles += list(errors)
    conds.append(condition(
        "Degraded", bool(troubles),
        (error_reason if errors else
         "RouterUnavailable" if routing is not None and routing.trouble else
         "Unschedulable" if any(v.state == "Pending" for v in views.values()) else
         "SchedulingGated" if gated else
         "NoScheduler" if untried else
         "CrashLoopBackOff" if looping else
         "InstanceFailed" if any(v.state == "Failed" for v in views.values()) else
         "CrashLoop" if crash_looping else
         "ContainerBlocked" if blocked else
         "ContainerNotCreated" if not_created else
         "EngineUnready" if unready else
         "ProgressDeadlineExceeded" if stuck else "AsExpected"),
        "; ".join(troubles) if troubles else "no instance is failing or unschedulable",
        generation, previous,
    ))
    switching = [
        v.plan.name for v in views.values()
        if v.observed.phase in SWITCH_PHASES
        or any(p.annotations.get(ANNOTATION_ROLE) != v.plan.role for p in v.pods)
    ]
    if switch_trouble is not None:
        conds.append(condition(
            "RoleSwitching", None, SWITCH_TICKS_FAILING,
            switch_trouble + (f"; switching: {', '.join(switching)}" if switching else ""), generation, previous,
        ))
    else:
        conds.append(condition(
            "RoleSwitching", bool(switching), "Switching" if switching else "Idle",
            f"switching: {', '.join(switching)}" if switching else "no instance is changing role",
            generation, previous,
        ))
    return wire(HybridServingStatus(
        observed_generation=generation,
        conditions=conds,
        prefill=per_role["prefill"],
        decode=per_role["decode"],
        instances=[
            InstanceStatus(name=v.plan.name, role=v.plan.role, phase=instance_phase(v),
                           nodes=[p.node_name or "" for p in v.pods if not p.deleting],
                           generation=v.observed.spec.config_hash)
            for v in sorted(views.values(), key=lambda v: v.plan.index)
        ],
        capacity=capacity_status(desired.spec, per_role["decode"].desired),
        ready="True" if serving else "False",
        last_progress_time=format_time(progressed_at),
        replicas=len(views),
        selector=engine_selector(desired.name),
        rollout=rollout,
    ))


def ready_condition(all_ready: bool, routing: router.RouterHealth | None, per_role: Mapping[str, RoleStatus],
                    generation: int | None, previous: Mapping[str, Mapping[str, Any]]) -> Condition:
    """Ready: every instance serves and clients reach them, which takes an available router
    (`routing`, None for a fleet without one)."""
    instances = f"prefill {per_role['prefill'].summary}, decode {per_role['decode'].summary} instances ready"
    if routing is not None and not routing.available:
        return condition("Ready", False, "RouterNotReady", f"{routing.message}; {instances}", generation, previous)
    return condition("Ready", all_ready, "AllInstancesReady" if all_ready else "InstancesNotReady", instances,
                     generation, previous)


def router_health(desired: DesiredState, observed: Observed, views: Mapping[str, InstanceView],
                  clock: float) -> router.RouterHealth | None:
    """What the fleet's router Deployments report, None for a fleet without router (disabled or
    scaled to zero replicas)."""
    if not desired.spec.router.enabled or desired.spec.router.replicas == 0:
        return None
    deployments = [
        router.RouterDeployment.from_manifest(obj) for (kind, _), obj in sorted(observed.objects.items())
        if kind == "Deployment" and (obj["metadata"].get("labels") or {}).get(LABEL_COMPONENT) == "router"
        and not obj["metadata"].get("deletionTimestamp")
    ]
    return router.health(deployments, paired_since(desired, views), clock)


def paired_since(desired: DesiredState, views: Mapping[str, InstanceView]) -> dict[str, float]:
    """Since when each pairing key has had an available prefill and decode (not out for a role
    switch): its router can be ready only from then. An instance is available since its pods'
    last Ready transition; one without Ready times counts as available long since."""
    since: dict[str, dict[str, float]] = {}
    for v in views.values():
        if not v.available or v.out_for_switch:
            continue
        at = max((p.ready_since for p in v.pods if not p.deleting and p.ready_since is not None), default=0.0)
        roles = since.setdefault(instance_pairing_key(v, desired.pairing_key), {})
        roles[v.plan.role] = min(roles.get(v.plan.role, at), at)
    return {key: max(roles.values()) for key, roles in since.items() if set(roles) == set(ROLES)}


def not_applied_reason(validation: Validation, plan_failure: PlanFailure | None,
                       generation: int | None) -> tuple[str, str] | None:
    """Progressing's reason and message while the spec's generation is not what the fleet runs:
    it fails validation (`SpecNotApplied`), or passes it and could not be planned (`PlanFailed`);
    None while it is applied."""
    if not validation.valid:
        return "SpecNotApplied", not_applied_message(validation, generation)
    if plan_failure is not None:
        return "PlanFailed", plan_failure.not_applied_message(generation)
    return None


def no_valid_spec_message(observed: Observed) -> str:
    """Why a fleet whose spec fails validation has no plan. Its instances, where it has some, run a
    spec applied earlier that this operator no longer reads back (an earlier version wrote it, and a
    rule added since refuses it): they are left as they are, not taken for a fleet never started."""
    if not observed.instances:
        return "no valid spec has been applied yet"
    return (f"no valid spec to follow: the current one fails validation and the last applied one does not pass "
            f"this operator's rules either; the fleet's {len(observed.instances)} instance(s) are left as they "
            "are until the spec is fixed (see LayoutValid)")


def not_applied_message(validation: Validation, generation: int | None) -> str:
    """Why the spec's generation does not progress: the fleet runs the last spec that was valid."""
    refusals = validation.refusals
    return (f"generation {generation} is not applied: {len(refusals)} error(s), the first: {refusals[0]}; "
            "the fleet keeps running the last applied spec (sized by this one's replicas, rollout and "
            "scaling where those pass with it)")


def rollout_status(desired: DesiredState, views: Mapping[str, InstanceView], per_role: Mapping[str, RoleStatus],
                   all_ready: bool, held: Literal["Canary", "Paused"] | None,
                   previous: Mapping[str, Any]) -> RolloutStatus:
    """Revisions as a StatefulSet reports them, and the last one the whole fleet was ready on.

    The current revision is the one most instances not yet updated run (by their revision
    label); the last good one moves only when every instance runs the update revision and is
    ready, so a rollout that never became ready leaves it where it was.
    """
    update = revision_name(desired.name, desired.revision_hash)
    behind = [h for v in views.values() if (h := v.observed.labels.get(LABEL_REVISION)) != desired.revision_hash]
    current = update
    if behind:
        known = [h for h in behind if h]
        current = revision_name(desired.name, max(set(known), key=known.count)) if known else ""
    done = not behind and all_ready and all(v.current for v in views.values())
    last_good = update if done else str(previous.get("lastGoodRevision", ""))
    counts = RoleCounts(prefill=per_role["prefill"].updated, decode=per_role["decode"].updated)
    surge = {role: sum(1 for p in desired.instances.values() if p.role == role and p.surge) for role in ROLES}
    progress = (f"prefill {counts.prefill}/{per_role['prefill'].desired - surge['prefill']}, "
                f"decode {counts.decode}/{per_role['decode'].desired - surge['decode']} updated")
    if any(surge.values()):
        progress += " (" + ", ".join(f"{n} surge {role}" for role, n in surge.items() if n) + " on top)"
    if held == "Canary":
        message = (f"held by canary {desired.canary}: {progress}; raise or remove spec.rollout.canary "
                   "to roll the rest")
    elif held == "Paused":
        message = f"paused: {progress}; set spec.rollout.paused to false to roll the rest"
    elif current != update:
        message = f"rolling from {current or 'an unrecorded revision'} to {update}: {progress}"
    elif any(rerendered(v, desired.revision_hash) for v in views.values() if not v.plan.surge):
        message = (f"configuration {update} unchanged, rolling to the pod template this operator now renders "
                   f"(its version or settings changed): {progress}")
    else:
        message = f"every instance runs {update}"
    keys = list(desired.router_keys) if desired.spec.router.enabled else []
    if len(keys) > 1:
        message += (f"; prefill and decode pair apart under {len(keys)} routers (pairing key {keys[0]} of the spec, "
                    f"{', '.join(keys[1:])} still serving)")
    status = RolloutStatus(current_revision=current, update_revision=update, updated=counts, message=message,
                           held=held or "", pairing_keys=keys)
    if last_good:
        status.last_good_revision = last_good
    return status


def last_progress(previous_status: Mapping[str, Any], progressing: Mapping[str, Any], generation: int | None,
                  per_role: Mapping[str, RoleStatus], held: str | None, progressing_now: bool,
                  clock: float) -> float:
    """When the fleet last moved forward (a Deployment's progress clock): more instances ready or
    updated than the last status said, a rollout hold lifted, a new generation, or progress just
    starting. A canary held for hours, then promoted, has its whole deadline again; a rollout that
    keeps bringing instances up is never called stuck however long it takes in all. A fleet at
    rest keeps the time it last moved (its status is not rewritten). Counted over both roles: a
    role switch moves an instance from one role's counts to the other's, which is no progress, and
    a policy that keeps switching would otherwise keep a stuck rollout from ever being called so."""
    since = parse_time(previous_status.get("lastProgressTime"))
    if not progressing_now:
        return clock if since is None else since
    before = {role: previous_status.get(role) or {} for role in ROLES}
    moved = (
        since is None
        or (progressing.get("status") != "True" and progressing.get("reason") != "ProgressDeadlineExceeded")
        or progressing.get("observedGeneration") != generation
        or (bool((previous_status.get("rollout") or {}).get("held")) and held is None)
        or sum(per_role[r].ready for r in ROLES) > sum(int(before[r].get("ready") or 0) for r in ROLES)
        or sum(per_role[r].updated for r in ROLES) > sum(int(before[r].get("updated") or 0) for r in ROLES)
    )
    return clock if moved or since is None else since


def _past_deadline(progressing: Mapping[str, Any], generation: int | None, clock: float, progressed_at: float,
                   deadline: float) -> bool:
    """Whether the fleet has made no progress on this generation for longer than the deadline.

    Once exceeded it stays exceeded until the fleet progresses again (as a Deployment's
    condition does), so the condition does not flap between "progressing" and "stuck".
    """
    if progressed_at == clock:
        return False
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return progressing.get("observedGeneration") == generation
    return progressing.get("status") == "True" and clock - progressed_at > deadline


def failing_status(previous_status: Mapping[str, Any], message: str, generation: int | None) -> dict[str, Any]:
    """The status of a fleet whose passes keep failing before they can report: Ready turns Unknown
    (nothing observed it since) and Degraded True, both `ReconcileFailed` with `message`; the other
    conditions stay as last written, and the next pass that completes rewrites them all."""
    previous = {c.get("type"): c for c in previous_status.get("conditions") or []}
    replaced = {"Ready": condition("Ready", None, "ReconcileFailed", message, generation, previous),
                "Degraded": condition("Degraded", True, "ReconcileFailed", message, generation, previous)}
    conditions = [wire(replaced.pop(c["type"])) if c.get("type") in replaced else dict(c)
                  for c in previous_status.get("conditions") or []]
    conditions += [wire(c) for c in replaced.values()]
    return {"conditions": conditions, "ready": "Unknown"}


def changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything a reader sees (times of unchanged conditions aside)."""
    def strip(status: Mapping[str, Any] | None) -> dict[str, Any]:
        # A key `new` names as null (removing it) matches a status without it.
        out = {k: (status or {}).get(k) for k in new}
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in out.get("conditions") or []
        ]
        return out

    return strip(previous) != strip(new)
