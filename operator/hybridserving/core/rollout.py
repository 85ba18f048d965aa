"""The rollout: which instances move to a new configuration in this step, and what their pods do.

Voluntary disruption (rolling a serving instance) is held to `rollout.maxUnavailable`
instances per role and one role at a time; pods of a gang are replaced whole (one rank alone
cannot rejoin a running collective), and a switched instance's pods are relabelled in place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from hybridserving.api.v1alpha1 import ROLES, Role
from hybridserving.contract import ANNOTATION_ROLE, LABEL_ROLE
from hybridserving.core.actions import Action, Cause
from hybridserving.core.desired import DesiredState
from hybridserving.core.health import GangTarget, InstanceView, is_stale
from hybridserving.core.naming import (
    ANNOTATION_BOOTSTRAP_PORT,
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_RESTART_GENERATION,
    ANNOTATION_WORKER_PORTS,
    split_config_hash,
)
from hybridserving.core.observed import ObservedPod


def pod_actions(v: InstanceView, config_hash: str, restarting: bool) -> list[Action]:
    """Delete stale gangs whole, relabel switched pods, create missing ones once the gang is gone.

    `config_hash` is what the instance's spec says after this step; pods that run another
    configuration or an older gang go together (one rank alone cannot rejoin a running
    collective), and their replacements are created only when all of them are gone.
    """
    actions: list[Action] = []
    p = v.plan
    generation = v.observed.spec.restart_generation + (1 if restarting else 0)
    flags_half = split_config_hash(config_hash)[1]
    target = GangTarget(p.role, config_hash, generation, p.nodes)
    live = [pod for pod in v.pods if not pod.deleting]
    if any(is_stale(pod, target) for pod in live):
        if restarting:
            cause, why = Cause.GANG_RESTART, "gang restart"
        else:
            cause, why = Cause.ROLLOUT, "rolling to the new configuration"
        for pod in live:
            actions.append(Action("delete", "Pod", pod.name, (cause,), f"{why} of {p.name} (whole gang)", uid=pod.uid))
        return actions
    desired_pods = {pod["metadata"]["name"]: pod for pod in p.pods}
    for pod in live:
        want = desired_pods.get(pod.name)
        body = {} if want is None else _metadata_patch(pod, want, flags_half, p.role)
        if body:
            if pod.annotations.get(ANNOTATION_ROLE) != p.role:
                cause, why = Cause.ROLE_SWITCH, f"role switched to {p.role} (relabel, no restart)"
            else:
                cause, why = Cause.DRIFT, "pod metadata drifted from the plan"
            actions.append(Action("patch", "Pod", pod.name, (cause,), why, body, uid=pod.uid))
    if any(pod.deleting for pod in v.pods):
        return actions  # the old gang is still going; its names are not free yet
    if config_hash != p.config_hash:
        # An instance not yet rolled that lost pods is down anyway, so select_rollout rolls
        # it in this very step; creating old-configuration pods would only roll them again.
        return actions
    present = {pod.rank for pod in live}
    for rank, want in enumerate(p.pods):
        if rank not in present:
            actions.append(Action("create", "Pod", want["metadata"]["name"], (Cause.MISSING,),
                                  f"rank {rank} of {p.role} instance {p.name}", _stamp(want, generation)))
    return actions


def _stamp(pod: dict[str, Any], generation: int) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(pod))
    out["metadata"]["annotations"][ANNOTATION_RESTART_GENERATION] = str(generation)
    return out


def _metadata_patch(pod: ObservedPod, want: Mapping[str, Any], flags_half: str, role: Role) -> dict[str, Any]:
    """A merge patch bringing a live pod's labels and role annotations to the plan (or {})."""
    labels: dict[str, str | None] = {}
    want_labels = want["metadata"]["labels"]
    for key, value in want_labels.items():
        if pod.labels.get(key) != value:
            labels[key] = value
    if LABEL_ROLE not in want_labels and LABEL_ROLE in pod.labels:
        labels[LABEL_ROLE] = None
    annotations: dict[str, str] = {}
    if pod.annotations.get(ANNOTATION_ROLE) != role:
        annotations[ANNOTATION_ROLE] = role
        pod_template_half = split_config_hash(pod.annotations.get(ANNOTATION_CONFIG_HASH, ""))[0]
        annotations[ANNOTATION_CONFIG_HASH] = pod_template_half + flags_half
    for key in (ANNOTATION_BOOTSTRAP_PORT, ANNOTATION_WORKER_PORTS):
        value = want["metadata"]["annotations"].get(key)
        if value is not None and pod.annotations.get(key) != value:
            annotations[key] = value
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta} if meta else {}


def updated(views: Mapping[str, InstanceView], role: Role) -> int:
    """Instances of `role` whose spec already says what the plan says."""
    return sum(1 for v in views.values() if v.plan.role == role and v.current)


def held_by(desired: DesiredState, views: Mapping[str, InstanceView]) -> Literal["Canary", "Paused"] | None:
    """What keeps instances on an older configuration on purpose, if anything.

    Paused: while set, nothing serving rolls. Canary: every role with instances left to roll has
    its `canary` instances rolled already (one role still rolling towards its canary is progress,
    not a hold).
    """
    pending = {v.plan.role for v in views.values() if not v.current}
    if not pending:
        return None
    if desired.paused:
        return "Paused"
    canary = desired.canary
    if canary is not None and all(updated(views, role) >= canary for role in pending):
        return "Canary"
    return None


def select_rollout(desired: DesiredState, views: Mapping[str, InstanceView]) -> dict[str, str]:
    """Instances whose spec moves to the planned configuration now, with the reason.

    An instance that is down anyway is rolled at once: it costs no availability, and the plan
    renders only the new configuration's pods, so it could not come back on the old one. A
    serving one is rolled only within its role's budget (maxUnavailable minus instances already
    down), only while its role has fewer than `canary` instances rolled, only in the first role
    (prefill, then decode) that still has instances it may roll, and only while the other role
    has no instance coming back from its own roll.
    """
    selected: dict[str, str] = {}
    pending = {role: [v for v in views.values() if v.plan.role == role and not v.current] for role in ROLES}
    for role in ROLES:
        for v in pending[role]:
            if not v.available:
                selected[v.plan.name] = f"rolling {role} instance (down already: costs no availability)"
    if desired.paused:
        return selected
    for role in ROLES:
        serving = [v for v in pending[role] if v.available]
        room = len(serving)
        if desired.canary is not None:
            rolled = updated(views, role) + sum(1 for v in pending[role] if v.plan.name in selected)
            room = min(room, desired.canary - rolled)
        if room <= 0:
            continue  # nothing to roll, or held at its canary: the other role may roll
        other = [v for v in views.values() if v.plan.role != role]
        if any(v.recovering for v in other):
            break  # the other role is mid-rollout: one role at a time
        down = sum(1 for v in views.values() if v.plan.role == role and not v.available)
        budget = min(room, desired.max_unavailable - down)
        for v in sorted(serving, key=lambda v: -v.plan.index)[: max(0, budget)]:
            selected[v.plan.name] = (
                f"rolling {role} instance to the new configuration "
                f"({down + 1}/{desired.max_unavailable} of the role's budget"
                + (f", canary {desired.canary}" if desired.canary is not None else "") + ")"
            )
            down += 1
        break
    return selected
