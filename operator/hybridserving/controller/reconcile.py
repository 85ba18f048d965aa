"""One level-triggered reconcile of one HybridServing: observe, plan, act, report.

It reads everything it needs on every pass and keeps no state of its own, so any trigger
(an event on the HybridServing or on a child, a resync, a restart) runs the same code to the
same result. In the operator those reads come from the read cache (controller/cache.py), which
the watches and the pass's own writes keep current. The steps:

1. observe: the HybridServing and every object labelled with its name, kept only when the
   ownerReferences lead back to it;
2. validate: pydantic and `core.fleet.check` (layout rules, pod surface, capacity, the
   installation's privileges), as the admission webhook does; an invalid spec is reported and the fleet is
   planned from the last valid spec (kept in the `<name>-applied` ConfigMap), so a bad edit
   never touches a serving fleet;
3. plan and diff (pure, `core.planner`);
4. act: each action as one conditional write; a 409/404 ends the pass early and asks for a
   quick retry, because what follows was planned from a state that no longer holds, except
   a create whose name an object of someone else holds, which, like a refused write (403,
   422), is reported while the rest goes on;
5. report: instance status, HybridServing status and conditions (only when they change;
   Degraded names what the pass could not do), and an Event per kind of decision. A failing
   pass comes back after a backoff that grows with the time the fleet has been Degraded.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hybridserving.api.base import FROM_CLUSTER, field_errors
from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND, HybridServing, HybridServingSpec, WeightsStatus
from hybridserving.api.weights import WeightsSpec
from hybridserving.controller import gauges, metrics
from hybridserving.controller.kube import OWNED_KINDS, Kube, KubeError
from hybridserving.controller.status import (
    PROGRESS_DEADLINE_SECONDS,
    SWITCH_TICKS_FAILING,
    PlanFailure,
    PlanFallback,
    Validation,
    changed,
    failing_status,
    fleet_status,
    instance_status,
    now,
    wire,
)
from hybridserving.contract import ANNOTATION_ROLE
from hybridserving.core import enginekey, fleet, planner, privileges, revisions, weights
from hybridserving.core.actions import Action, Cause
from hybridserving.core.desired import DesiredState
from hybridserving.core.health import InstanceView, view
from hybridserving.core.naming import (
    API_VERSION,
    LABEL_COMPONENT,
    LABEL_NAME,
    applied_spec_name,
    owner_reference,
    selectable,
    standard_labels,
)
from hybridserving.core.observed import Observed
from hybridserving.core.privileges import EnginePolicy
from hybridserving.core.rendering import EngineAccess

log = logging.getLogger("hybridserving.controller")

# The Event reason of a group of writes with one of these causes (the first that applies), else
# the verb and kind ("CreatedPod", "DeletedInstance").
EVENT_REASONS = {Cause.GANG_RESTART: "GangRestart", Cause.ROLLOUT: "RollingUpdate", Cause.ROLE_SWITCH: "RoleSwitch"}

# How soon to look again while something is still moving (pods start, old pods go away).
FOLLOW_UP_SECONDS = 2.0
# How often a download's progress is read while a node fills its weights cache (nothing in
# the pods' objects changes while it runs, so no event would bring the next look).
WEIGHTS_PROGRESS_SECONDS = 5.0

# The Degraded reason (and Warning Event) of a cluster that drops image volumes.
WEIGHTS_VOLUME_DROPPED = "WeightsVolumeDropped"
ROLLOUT_POD_INVALID = "RolloutPodInvalid"

# Asks the running fill steps for their progress: pod name → (IP, port) in, the answers out.
FillProbe = Callable[[Mapping[str, tuple[str, int]]], Mapping[str, weights.FillProgress]]

# Frozen, so one shared instance is safe as a default: it grants nothing.
DEFAULT_ENGINE_POLICY = EnginePolicy()


@dataclass
class Outcome:
    """What one pass did, and when the next one should come at the latest.

    `errors` are writes or steps that failed; `error_reason` says of what kind (the
    Degraded condition's reason): a write the apiserver refused, a name held by an object
    that is not the fleet's, a plan that could not be made.
    """

    actions: list[Action] = field(default_factory=list)
    applied: list[Action] = field(default_factory=list)
    """The actions the apiserver took, in order (a refused one is not among them)."""
    conflict: bool = False
    errors: list[str] = field(default_factory=list)
    error_reason: str = "ReconcileError"
    plan_failure: PlanFailure | None = None
    """The spec could not be planned, and what the pass did instead (status says the generation is not applied)."""
    requeue_after: float | None = None
    gone: bool = False

    def fail(self, reason: str, message: str) -> None:
        if not self.errors:
            self.error_reason = reason
        self.errors.append(message)


def observe(kube: Kube, namespace: str, name: str, hs_uid: str, extra_kinds: tuple[str, ...] = ()) -> Observed:
    """Every child of the HybridServing: listed by its label, kept when ownership leads back to it."""
    selector = {LABEL_NAME: name}
    instances = [
        i for i in kube.list(INSTANCE_KIND, namespace, selector)
        if hs_uid in {r.get("uid") for r in i["metadata"].get("ownerReferences") or []}
    ]
    instance_uids = {i["metadata"]["uid"] for i in instances}
    owners = instance_uids | {hs_uid}

    def ours(obj: dict[str, Any]) -> bool:
        return bool(owners & {r.get("uid") for r in obj["metadata"].get("ownerReferences") or []})

    pods = [p for p in kube.list("Pod", namespace, selector) if ours(p)]
    objects = [o for kind in OWNED_KINDS for o in kube.list(kind, namespace, selector) if ours(o)]
    for kind in extra_kinds:
        try:
            objects += [o for o in kube.list(kind, namespace, selector) if ours(o)]
        except KubeError as exc:
            if exc.status != 404:
                raise
            # Not served (an alpha API switched off): creating one fails and Degraded says so (APINotServed).
            log.warning("%s/%s: %s is not served by this cluster", namespace, name, kind)
    return Observed.from_manifests(instances, pods, objects, now=time.time())


def validate(
    body: dict[str, Any], engine_policy: EnginePolicy = DEFAULT_ENGINE_POLICY
) -> tuple[HybridServing | None, Validation]:
    """The typed HybridServing and what is wrong with it (CEL catches much, not everything).

    The admission webhook refuses exactly the specs this finds invalid: an update it let through
    while down is judged here by the same checks.
    """
    try:
        hs = HybridServing.model_validate(
            {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}, context=FROM_CLUSTER
        )
    except ValidationError as exc:
        return None, Validation(issues=(), parse_errors=field_errors(exc))
    hs = privileges.with_default_image(hs, engine_policy)
    return hs, Validation(issues=fleet.check(hs.spec, engine_policy))


def resized(body: dict[str, Any], good: HybridServingSpec, engine_policy: EnginePolicy) -> HybridServing | None:
    """The last applied configuration under the live spec's replicas, rollout and scaling, where
    that passes validation; None where it does not.

    An invalid edit holds what the fleet runs, not how many of it or how it rolls: `kubectl scale`
    and HPA write `spec.replicas` through the scale subresource, which no webhook sees, and an
    incident's scale-down or pause must not wait for someone to fix an unrelated field (one an
    operator upgrade started refusing, one an update let through while the webhook was down).
    As a rollback does (`revisions.restore`), the sizing is taken whole from the live spec."""
    spec = revisions.restore(body.get("spec") or {}, good.to_wire())
    if spec == revisions.restore(good.to_wire(), good.to_wire()):
        return None  # the live sizing is the applied one's: nothing to take
    resized_hs, validation = validate({**body, "spec": spec}, engine_policy)
    return resized_hs if validation.valid else None


def last_applied(observed: Observed, name: str) -> HybridServingSpec | None:
    """The spec the fleet was last planned from, if one was ever valid."""
    obj = observed.objects.get(("ConfigMap", applied_spec_name(name)))
    return None if obj is None else spec_of_applied(obj)


def spec_of_applied(obj: Mapping[str, Any]) -> HybridServingSpec | None:
    """The spec an `<name>-applied` ConfigMap holds (None: unreadable, as if never written)."""
    try:
        return HybridServingSpec.model_validate(json.loads((obj.get("data") or {})["spec.json"]), context=FROM_CLUSTER)
    except (KeyError, ValueError, ValidationError):
        return None


def _holder(kube: Kube, namespace: str, action: Action) -> dict[str, Any] | None:
    """The object that holds a name a create was refused for (None: it is gone again)."""
    try:
        return kube.get(action.kind, namespace, action.name)
    except KubeError:
        return None


def _owned(obj: Mapping[str, Any], owners: set[str]) -> bool:
    return bool({r.get("uid") for r in obj.get("metadata", {}).get("ownerReferences") or []} & owners)


def _leaving(kube: Kube, namespace: str, held: Mapping[str, Any], action: Action) -> bool:
    """Whether the object that holds a name the fleet creates goes away by itself: it is being
    deleted, or it carries the fleet's label and every owner it names is gone (the garbage
    collector deletes it). The pods of a scaled-down instance drain under its uid for up to
    drainTimeoutSeconds + the stop grace, and a new instance that takes its index (a scale-up, a rollout's
    surge) asks for the same names meanwhile: the create is due again once they are gone."""
    meta = held.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return True
    refs = meta.get("ownerReferences") or []
    planned = (((action.body or {}).get("metadata") or {}).get("labels") or {}).get(LABEL_NAME)
    if not refs or not planned or (meta.get("labels") or {}).get(LABEL_NAME) != planned:
        return False  # an orphan, or someone else's: nothing deletes it
    return all(_owner_gone(kube, namespace, ref) for ref in refs)


def _owner_gone(kube: Kube, namespace: str, ref: Mapping[str, Any]) -> bool:
    """Whether the fleet or instance an ownerReference names no longer exists (its name may be
    taken again, by another uid); any other owner counts as there."""
    if ref.get("apiVersion") != API_VERSION or ref.get("kind") not in (KIND, INSTANCE_KIND):
        return False
    try:
        owner = kube.get(str(ref["kind"]), namespace, str(ref.get("name")))
    except KubeError as exc:
        return exc.status == 404
    return bool(owner["metadata"].get("uid") != ref.get("uid"))


def _hidden(obj: Mapping[str, Any], action: Action) -> str | None:
    """The fleet-name label value the object lost (a `kubectl label ... hybridserving.io/name-`),
    or None: the pass lists children by that label, so it cannot see the object and keeps
    planning to create it."""
    planned = (((action.body or {}).get("metadata") or {}).get("labels") or {}).get(LABEL_NAME)
    held = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_NAME)
    return planned if planned and held != planned else None


def act(kube: Kube, namespace: str, actions: list[Action], outcome: Outcome, owners: set[str] | None = None) -> None:
    """Apply actions in order; stop at the first conflict (the rest was planned on stale state).

    A create that finds its name held by an object the fleet does not own (an orphaned pod,
    a squatted ConfigMap) is no race: retrying cannot succeed, so it is reported, naming the
    object, and the pass goes on with the rest. One that leaves by itself (`_leaving`: the
    draining pod of a deleted instance) is waited for: skipped, not an error, and the pass's
    follow-up (or the holder's deletion event) tries again. So is a write the apiserver refuses (403,
    422): the fleet keeps being repaired where it can, and the pass backs off. A create that
    finds the fleet's own object, hidden from the pass by a removed label, labels it again.
    """
    for action in actions:
        try:
            if action.verb == "create":
                assert action.body is not None
                kube.create(action.kind, namespace, action.body)
            elif action.verb == "patch":
                assert action.body is not None
                body = action.body
                if action.kind not in ("Pod", INSTANCE_KIND):
                    body = {k: v for k, v in body.items() if k not in ("apiVersion", "kind")}
                    body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in ("name", "namespace")}
                kube.patch(action.kind, namespace, action.name, body,
                           resource_version=action.resource_version, uid=action.uid)
            else:
                kube.delete(action.kind, namespace, action.name, uid=action.uid,
                            resource_version=action.resource_version)
        except KubeError as exc:
            held = _holder(kube, namespace, action) if exc.status == 409 and action.verb == "create" else None
            if held is not None and not _owned(held, owners or set()):
                if _leaving(kube, namespace, held, action):
                    log.info("%s/%s: %s is held by an object on its way out; created once it is gone", namespace,
                             action.name, action.kind)
                else:
                    outcome.fail("NameTaken", f"{action.kind}/{action.name} already exists and is not owned by "
                                 "this fleet: delete or rename that object (the operator will not take it over)")
                    metrics.ACTION_ERRORS.labels(action.kind).inc()
                continue
            if held is not None and (label := _hidden(held, action)):
                # The fleet's own object, hidden from the pass by a removed label: give it back,
                # and the next pass sees (and repairs) it like any other child.
                try:
                    kube.patch(action.kind, namespace, action.name, {"metadata": {"labels": {LABEL_NAME: label}}},
                               uid=held["metadata"].get("uid"))
                    log.info("%s/%s: restored its label %s", namespace, action.name, LABEL_NAME)
                except KubeError as again:
                    outcome.fail("ReconcileError", f"{action.kind}/{action.name} lost its label {LABEL_NAME} and "
                                 f"could not be relabelled ({again}): label it {LABEL_NAME}={label}")
                    metrics.ACTION_ERRORS.labels(action.kind).inc()
                continue
            if exc.status == 404 and action.verb == "create":
                # A create's 404 is its kind not served here (an alpha API switched off, a CRD not
                # installed), not a race: retrying at once cannot succeed.
                outcome.fail("APINotServed", f"{action.kind}/{action.name} cannot be created: this cluster does not "
                             f"serve {action.kind} ({exc.message}): enable that API or install its CRD, or change "
                             "the spec that asks for it")
                metrics.ACTION_ERRORS.labels(action.kind).inc()
                continue
            if exc.conflict:
                outcome.conflict = True
                metrics.CONFLICTS.inc()
                log.info("%s/%s: %s (%s); retrying from a fresh read", namespace, action.name, exc.status,
                         exc.message)
                return
            outcome.fail(_write_reason(exc), f"{action}: {exc}")
            metrics.ACTION_ERRORS.labels(action.kind).inc()
            continue
        outcome.applied.append(action)
        metrics.ACTIONS.labels(action.verb, action.kind, action.cause.value).inc()


def count_switches(observed: Observed, applied: list[Action]) -> None:
    """A switch is adopted once: when the instance's hash takes the new role's flags half."""
    for action in applied:
        if action.kind != INSTANCE_KIND or Cause.ROLE_SWITCH not in action.causes:
            continue
        inst = observed.instances[action.name]
        leader = next((p for p in observed.pods_of(action.name) if p.rank == 0), None)
        if leader is not None:
            from_role = leader.annotations.get(ANNOTATION_ROLE, "")
            metrics.ROLE_SWITCHES.labels(from_role, inst.spec.role).inc()


def post_events(kube: Kube, hs_body: dict[str, Any], actions: list[Action], warning: str | None,
                more_warnings: tuple[tuple[str, str], ...] = ()) -> None:
    """One Event per kind of decision this pass made, naming every object and the first reason."""
    grouped: dict[tuple[str, str], list[Action]] = defaultdict(list)
    for a in actions:
        grouped[(a.verb, a.kind)].append(a)
    events = []
    for (verb, kind), group in grouped.items():
        reason = {
            "create": "Created", "patch": "Updated", "delete": "Deleted",
        }[verb] + kind.replace("HybridServingInstance", "Instance")
        causes = {c for a in group for c in a.causes}
        reason = next((EVENT_REASONS[c] for c in EVENT_REASONS if c in causes), reason)
        names = ", ".join(a.name for a in group[:20]) + (f" and {len(group) - 20} more" if len(group) > 20 else "")
        events.append(("Normal", reason, f"{verb} {kind} {names}: {group[0].reason}"))
    if warning:
        events.append(("Warning", "LayoutInvalid", warning))
    events.extend(("Warning", reason, message) for reason, message in more_warnings)
    meta = hs_body["metadata"]
    for type_, reason, message in events:
        stamp = now()
        try:
            kube.create("Event", meta["namespace"], {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": hs_body.get("apiVersion"), "kind": KIND, "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta.get("uid")},
                "type": type_, "reason": reason, "message": message[:1000],
                "source": {"component": "hybridserving-operator"},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            })
        except KubeError as exc:  # events are best effort: never fail a reconcile on them
            log.debug("event not posted: %s", exc)


def post_instance_event(kube: Kube, namespace: str, name: str, type_: str, reason: str, message: str) -> None:
    """An Event on one instance, where `kubectl describe hybridservinginstance` shows it."""
    stamp = now()
    try:
        kube.create("Event", namespace, {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": INSTANCE_KIND, "name": name,
                               "namespace": namespace},
            "type": type_, "reason": reason, "message": message[:1000],
            "source": {"component": "hybridserving-operator"},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })
    except KubeError as exc:  # events are best effort: never fail a reconcile on them
        log.debug("event not posted: %s", exc)


def announce_restarts(kube: Kube, namespace: str, applied: list[Action]) -> None:
    """A Warning Event on each instance whose gang this pass restarted, with why and how many
    restarts in a row (the back-off the next one waits)."""
    for action in applied:
        if action.kind == INSTANCE_KIND and Cause.GANG_RESTART in action.causes:
            post_instance_event(kube, namespace, action.name, "Warning", EVENT_REASONS[Cause.GANG_RESTART],
                                action.reason)


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def degraded_warning(previous: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A Warning when the fleet turns Degraded or is Degraded for another reason: once, when it
    starts (on every pass while the status that would say it cannot be written)."""
    was, now_ = _condition(previous, "Degraded"), _condition(status, "Degraded")
    if now_.get("status") != "True" or (was.get("status"), was.get("reason")) == ("True", now_.get("reason")):
        return ()
    return ((str(now_["reason"]), str(now_.get("message", ""))),)


def switching_warning(previous: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A Warning when RoleSwitching turns to say that the role-switch ticks keep failing: once a
    streak, as `degraded_warning` does for Degraded."""
    was, now_ = _condition(previous, "RoleSwitching"), _condition(status, "RoleSwitching")
    if now_.get("reason") != SWITCH_TICKS_FAILING or was.get("reason") == SWITCH_TICKS_FAILING:
        return ()
    return ((SWITCH_TICKS_FAILING, str(now_.get("message", ""))),)


def report_failing(kube: Kube, namespace: str, name: str, message: str) -> None:
    """Say on the fleet that its passes keep failing: status (`status.failing_status`) and a Warning
    when Degraded turns to it. Best effort: the apiserver that fails the passes may refuse this too,
    and a pass that completes rewrites the whole status anyway."""
    gauges.record_failing(namespace, name)
    try:
        body = kube.get(KIND, namespace, name)
        previous = body.get("status") or {}
        status = failing_status(previous, message, body["metadata"].get("generation"))
        kube.patch(KIND, namespace, name, {"status": status}, subresource="status")
        warnings = degraded_warning(previous, status)
        if warnings:
            post_events(kube, body, [], None, warnings)
    except KubeError as exc:
        log.warning("%s/%s: could not report failing passes (%s)", namespace, name, exc)


def weights_warnings(previous: dict[str, Any] | None, current: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """A Warning when more nodes fail to get the weights than before (running pods are not touched),
    and one when the nodes' copies come to hold different commits."""
    if not current:
        return ()
    previous = previous or {}
    warnings: list[tuple[str, str]] = []
    if current.get("nodesFailed", 0) > previous.get("nodesFailed", 0):
        warnings.append(("WeightsFailed", f"weights from {current['source']} failed on {current['nodesFailed']} "
                         f"node(s); pods retry with back-off, running instances keep serving: "
                         f"{'; '.join(current['errors'])}"))
    if current.get("commits", 0) > 1 >= previous.get("commits", 0):
        warnings.append(("WeightsCommitsDiffer", f"the nodes' copies of {current['source']} hold "
                         f"{current['commits']} different commits (the revision moved between fills): engines run "
                         "different weights; set spec.model.weights.revision to one commit"))
    return tuple(warnings)


def weights_status(w: WeightsSpec, observed: Observed, previous: Mapping[str, Any] | None,
                   probe: FillProbe | None) -> dict[str, Any]:
    """`status.weights`, with the progress of the fills that run now read from their pods.

    One pod is asked per node: every fill step on a node reports that node's one download. A
    probe that fails leaves the figures unknown and nothing else. A figure that was set and is
    unknown now is sent as null: the status write is a merge patch, which keeps a field it does
    not mention.
    """
    targets: dict[str, tuple[str, int]] = {}
    asked: set[str] = set()
    for pod in sorted(observed.pods.values(), key=lambda p: p.name):
        if pod.weights_progress_at and pod.node_name and pod.node_name not in asked:
            asked.add(pod.node_name)
            targets[pod.name] = pod.weights_progress_at
    progress: Mapping[str, weights.FillProgress] = {}
    if probe is not None and targets:
        try:
            progress = probe(targets)
        except Exception:  # noqa: BLE001 - progress is a nicety: it never fails a pass
            log.exception("weights progress not read")
    status = wire(WeightsStatus.model_validate(weights.summarize(w, observed.pods.values(), progress)))
    for key in ("bytesDone", "bytesTotal"):
        if key not in status and key in (previous or {}):
            status[key] = None
    return status


def image_volume_refused(kube: Kube, namespace: str, spec: HybridServingSpec, todo: list[Action]) -> bool:
    """Whether the cluster would drop the image volume of an `oci://` fleet's pods (see
    `weights.volume_kept`): the first pod to create is created as a dry run and compared.

    A dry run that fails tells nothing (the real create then reports its own error), so it
    counts as kept.
    """
    w = spec.model.weights
    first = next((a for a in todo if a.verb == "create" and a.kind == "Pod"), None)
    if w is None or w.scheme != "oci" or first is None or first.body is None:
        return False
    try:
        stored = kube.create("Pod", namespace, first.body, dry_run=True)
    except KubeError as exc:
        log.info("%s/%s: dry-run create failed (%s)", namespace, first.name, exc)
        return False
    return not weights.volume_kept(stored)


def hold_invalid_rolls(kube: Kube, namespace: str, desired: DesiredState, todo: list[Action],
                       outcome: Outcome) -> list[Action]:
    """The pass's writes without the roll of any instance whose new pods the apiserver refuses.

    A rollout deletes the running gang before it creates the new one, so pod content that no
    admission check caught (an update while the webhook was down, a rule it does not mirror)
    would take the instance down for good. Its first new pod is created as a dry run, under a
    generated name (the running pod still holds the real one); refused as invalid (422), the
    instance keeps its spec and its gang, serving the old configuration, and the pass fails
    naming the apiserver's words. A dry run refused for anything else (a quota the old pods still
    use, a webhook that takes no dry runs) tells nothing: the roll goes on.
    """
    doomed = {a.name for a in todo if a.verb == "delete" and a.kind == "Pod" and Cause.ROLLOUT in a.causes}
    held: set[str] = set()
    for name, plan in desired.instances.items():
        if not plan.pods or not doomed & {pod["metadata"]["name"] for pod in plan.pods}:
            continue
        probe = copy.deepcopy(plan.pods[0])
        del probe["metadata"]["name"]
        probe["metadata"]["generateName"] = f"{plan.pods[0]['metadata']['name']}-"
        try:
            kube.create("Pod", namespace, probe, dry_run=True)
        except KubeError as exc:
            if exc.status != 422:
                log.info("%s/%s: dry-run create of its new pod failed (%s); rolling on", namespace, name, exc)
                continue
            held.add(name)
            outcome.fail(ROLLOUT_POD_INVALID,
                         f"{INSTANCE_KIND}/{name} not rolled: the apiserver refuses its new pods ({exc.message}); "
                         "its running gang keeps serving the previous configuration: fix the field the message "
                         "names (spec.podTemplate, spec.engine) or roll back the spec")
    if not held:
        return todo
    gangs = {pod["metadata"]["name"] for name in held for pod in desired.instances[name].pods}
    return [a for a in todo if not ((a.kind == INSTANCE_KIND and a.name in held)
                                    or (a.kind == "Pod" and a.name in gangs))]


def report_instances(kube: Kube, namespace: str, views: dict[str, InstanceView], outcome: Outcome) -> None:
    """Instance status, written only where it changed, and only on the instance as observed.

    The write is conditional on the instance's resourceVersion: the role-switch controller may
    have started a switch since (its record, then the phase it owns), and a status computed
    before that must not land over it; the next pass computes it afresh. A write the apiserver
    refuses is one of the pass's errors: the fleet's own status still says what is wrong.
    """
    for name, v in views.items():
        status = instance_status(v, v.observed.generation)
        new = wire(status)
        if not any(v.observed.status.get(k) != val for k, val in new.items()):
            continue
        try:
            kube.patch(INSTANCE_KIND, namespace, name, {"status": new}, subresource="status",
                       resource_version=v.observed.resource_version or None)
        except KubeError as exc:
            if not exc.conflict:
                outcome.fail(_write_reason(exc), f"status of {INSTANCE_KIND}/{name} not written: {exc}")
                metrics.ACTION_ERRORS.labels(INSTANCE_KIND).inc()
            continue
        if new.get("phase") == "CrashLoop" and v.observed.status.get("phase") != "CrashLoop":
            post_instance_event(kube, namespace, name, "Warning", "CrashLoop",
                                f"engine container restarted {status.restarts} time(s) and keeps exiting; "
                                f"last exit: {status.last_exit or 'not recorded'}")


def _write_reason(exc: KubeError) -> str:
    """The Degraded reason of a write the apiserver refused."""
    return {403: "WriteForbidden", 422: "WriteInvalid"}.get(exc.status, "ReconcileError")


def plan_safely(effective: HybridServing, meta: dict[str, Any], fallback: HybridServingSpec | None,
                observed: Observed, access: EngineAccess, outcome: Outcome,
                last_good_revision: str = "") -> DesiredState | None:
    """The plan of `effective`, or of the last applied spec when planning raises.

    Validation is meant to catch every input the planner cannot plan; should one slip
    through, the fleet is still repaired from the spec it runs, and status says why
    (`outcome.plan_failure`).
    """
    try:
        return planner.plan(effective, observed, access, last_good_revision)
    except Exception as exc:  # noqa: BLE001 - any planner bug must surface in status, not kill the pass
        log.exception("%s/%s: planning failed", effective.metadata.namespace, effective.metadata.name)
        error = f"{type(exc).__name__}: {exc}"
    desired: DesiredState | None = None
    if fallback is not None and fallback != effective.spec:
        try:
            desired = planner.plan(HybridServing.model_validate({"metadata": meta, "spec": fallback.to_wire()}),
                                   observed, access, last_good_revision)
        except Exception:  # noqa: BLE001
            log.exception("planning the last applied spec failed too")
    kept = (PlanFallback.LAST_APPLIED if desired is not None else
            PlanFallback.NOTHING if fallback is None else PlanFallback.AS_IS)
    outcome.plan_failure = PlanFailure(error, kept)
    outcome.fail("PlanFailed", outcome.plan_failure.message())
    return desired


def write_engine_key(kube: Kube, namespace: str, meta: dict[str, Any], operator_key: bytes, outcome: Outcome) -> None:
    """Apply the fleet's engine-key Secret (`core.enginekey`) before the writes that read it.

    Never read back (the operator has no Secret reads): applied by every pass that writes
    anything, ahead of those writes, so a pod or router created or changed finds it, and by every
    pass over a fleet that is not Ready, so a deleted Secret that keeps a restarted container from
    starting comes back; a Ready fleet's idle passes write nothing. An apply that changes nothing
    is a no-op for the apiserver, one that finds the key edited puts it back, and one that meets
    someone else's Secret by that name fails (409, the fields have another manager) instead of
    taking it over.
    """
    name = meta["name"]
    secret_meta = {
        "name": enginekey.secret_name(name),
        "namespace": namespace,
        "labels": {**standard_labels(name, "engine"), LABEL_NAME: name, LABEL_COMPONENT: "engine"},
        "ownerReferences": [owner_reference(API_VERSION, KIND, name, meta["uid"])],
    }
    try:
        key = enginekey.derive(operator_key, meta["uid"])
        kube.server_side_apply("Secret", namespace, enginekey.secret(secret_meta, key))
    except KubeError as exc:
        if exc.status == 409:
            outcome.fail("NameTaken", f"Secret/{secret_meta['name']} already exists and is not owned by this "
                         "HybridServing; delete or rename it (it holds the engines' API key)")
        else:
            outcome.fail(_write_reason(exc), f"Secret/{secret_meta['name']}: {exc}")
        metrics.ACTION_ERRORS.labels("Secret").inc()


def reconcile(kube: Kube, namespace: str, name: str,
              plan_hook: Callable[[list[Action]], list[Action]] | None = None,
              engine_policy: EnginePolicy = DEFAULT_ENGINE_POLICY,
              progress_deadline_seconds: float = PROGRESS_DEADLINE_SECONDS,
              *, operator_key: bytes = b"", fill_probe: FillProbe | None = None,
              switch_trouble: str | None = None) -> Outcome:
    """One pass over one HybridServing. `plan_hook` lets tests cut a pass short (a crash).
    `operator_key` derives the fleet's engine key (`core.enginekey`); an empty one is refused.
    `fill_probe` reads the progress of running weights downloads (none read without it).
    `switch_trouble` says why the fleet's role-switch ticks keep failing, when they do.
    Every pass is timed, one that raises as well: a pass cut short by an API timeout is the slow
    pass the histogram is there to show."""
    with metrics.DURATION.time():
        return _reconcile(kube, namespace, name, plan_hook, engine_policy, progress_deadline_seconds,
                          operator_key, fill_probe, switch_trouble)


def _reconcile(kube: Kube, namespace: str, name: str, plan_hook: Callable[[list[Action]], list[Action]] | None,
               engine_policy: EnginePolicy, progress_deadline_seconds: float, operator_key: bytes,
               fill_probe: FillProbe | None, switch_trouble: str | None) -> Outcome:
    outcome = Outcome()
    try:
        body = kube.get(KIND, namespace, name)
    except KubeError as exc:
        if exc.status == 404:
            outcome.gone = True
            gauges.forget(namespace, name)
            return outcome
        raise
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        outcome.gone = True  # the garbage collector takes the children
        gauges.forget(namespace, name)
        return outcome
    generation = meta.get("generation")
    # Workloads are listed only for fleets that ask for them: the API is alpha and often not served.
    extra = ("Workload",) if ((body.get("spec") or {}).get("gang") or {}).get("mode") == "Workload" else ()
    hs, validation = validate(body, engine_policy)
    # A name no label can carry has no children to find (validation reports the name), and the
    # apiserver would refuse the selector that looks for them.
    observed = observe(kube, namespace, name, meta["uid"], extra) if selectable(name) else Observed()
    good = last_applied(observed, name)
    effective: HybridServing | None = hs if validation.valid else None
    if effective is None and good is not None:
        effective = resized(body, good, engine_policy) or HybridServing.model_validate(
            {"metadata": meta, "spec": good.to_wire()})
    if not extra and any(s is not None and s.gang.mode == "Workload"
                         for s in (effective.spec if effective is not None else None, good)):
        # The live body does not ask for Workloads, but the spec the pass plans from (an invalid
        # edit falls back to the last applied one) or the one it replaces does: unlisted, they
        # would be created again (409) or left behind.
        extra = ("Workload",)
        observed = observe(kube, namespace, name, meta["uid"], extra)
    desired: DesiredState | None = None
    previous = body.get("status") or {}
    if effective is not None:
        access = EngineAccess(operator_namespace=engine_policy.operator_namespace)
        last_good = (previous.get("rollout") or {}).get("lastGoodRevision", "")
        desired = plan_safely(effective, meta, good, observed, access, outcome, last_good)
    if desired is not None:
        outcome.actions = planner.diff(desired, observed)
        todo = plan_hook(outcome.actions) if plan_hook else outcome.actions
        if image_volume_refused(kube, namespace, desired.spec, todo):
            assert desired.spec.model.weights is not None, "only a fleet with weights has an image volume"
            outcome.fail(WEIGHTS_VOLUME_DROPPED, weights.volume_dropped_message(desired.spec.model.weights))
            todo = [a for a in todo if not (a.verb == "create" and a.kind == "Pod")]
        todo = hold_invalid_rolls(kube, namespace, desired, todo, outcome)
        if todo or previous.get("ready") != "True":
            write_engine_key(kube, namespace, meta, operator_key, outcome)
        owners = {meta["uid"]} | {i.uid for i in observed.instances.values()}
        act(kube, namespace, todo, outcome, owners)
    if outcome.applied:
        count_switches(observed, outcome.applied)
        announce_restarts(kube, namespace, outcome.applied)
        # The state after the writes: through the cache, their own responses (no request).
        observed = observe(kube, namespace, name, meta["uid"], extra)
    views = view(desired, observed) if desired is not None else {}
    if not outcome.conflict:
        report_instances(kube, namespace, views, outcome)
    warning = None
    was_valid = {c.get("type"): c.get("status") for c in previous.get("conditions") or []}.get("LayoutValid")
    if not validation.valid and was_valid != "False":
        warning = validation.message()
    status = fleet_status(desired, observed, views, validation, generation, previous,
                          len(outcome.actions) - len(outcome.applied), outcome.errors,
                          error_reason=outcome.error_reason, plan_failure=outcome.plan_failure,
                          progress_deadline_seconds=progress_deadline_seconds, switch_trouble=switch_trouble)
    gauges.record(namespace, name, status, views)
    if desired is not None and desired.spec.model.weights is not None:
        status["weights"] = weights_status(desired.spec.model.weights, observed, previous.get("weights"), fill_probe)
    more = weights_warnings(previous.get("weights"), status.get("weights"))
    refused: KubeError | None = None
    if changed(previous, status):
        try:
            kube.patch(KIND, namespace, name, {"status": status}, subresource="status")
        except KubeError as exc:
            if not exc.conflict:
                refused = exc
                more += (("StatusNotWritten", f"status not written ({exc}); it would say: "
                          + "; ".join(f"{c['type']}={c['status']} ({c['reason']})" for c in status["conditions"])),)
    more += degraded_warning(previous, status) + switching_warning(previous, status)
    if outcome.applied or warning or more:
        post_events(kube, body, outcome.applied, warning, more)
    if refused is not None:
        raise refused  # the work queue retries with a growing back-off
    # A pass with errors is retried on the work queue's failure back-off, whatever is set here.
    if outcome.conflict:
        outcome.requeue_after = 1.0
    elif outcome.actions:
        outcome.requeue_after = FOLLOW_UP_SECONDS
    elif (status.get("weights") or {}).get("nodesFilling") and fill_probe is not None:
        outcome.requeue_after = WEIGHTS_PROGRESS_SECONDS
    elif status.get("ready") != "True":
        outcome.requeue_after = 10.0
    settling = [s for v in views.values() if (s := v.settles_in)]
    if settling:  # the rollout goes on when an instance has been ready for minReadySeconds
        outcome.requeue_after = min(outcome.requeue_after or math.inf, min(settling) + 0.5)
    due = [d for v in views.values() if (d := v.back_off_due_in)]
    if due:  # a gang restart held by its back-off falls due, or a gang that served forgets its restarts
        outcome.requeue_after = min(outcome.requeue_after or math.inf, min(due) + 0.5)
    return outcome
