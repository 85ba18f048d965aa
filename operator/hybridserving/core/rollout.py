"""The rollout: which instances move to a new configuration in this step, and what their pods do.

Voluntary disruption (rolling a serving instance) is held to `rollout.maxUnavailable`
instances per role, counting `rollout.maxSurge` extra instances started on the new
configuration as serving, and one role at a time; an instance serves for the rollout once its
pods have been ready for `rollout.minReadySeconds`; pods of a gang are replaced whole (one rank alone
cannot rejoin a running collective), and a switched instance's pods are relabelled in place.
A change of what prefill and decode must agree on (`core.pairing`) also keeps a compatible
pair serving throughout: the roll alternates roles so that the old key keeps a prefill and a
decode until the new key has both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from hybridserving.api.v1alpha1 import ROLES, Role, RolloutSpec
from hybridserving.contract import ANNOTATION_ROLE, LABEL_ROLE
from hybridserving.core.actions import Action, Cause
from hybridserving.core.desired import DesiredState
from hybridserving.core.health import GangTarget, InstanceView, is_stale
from hybridserving.core.naming import (
    ANNOTATION_BOOTSTRAP_PORT,
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_RESTART_GENERATION,
    ANNOTATION_WORKER_PORTS,
    LABEL_PAIRING,
    LABEL_REVISION,
    split_config_hash,
)

from hybridserving.core.observed import ObservedPod

# The key of an instance created before pairing keys existed and not on the spec's configuration.
UNKNOWN_PAIRING = "unknown"


def instance_pairing_key(v: InstanceView, spec_key: str) -> str:
    """The key the instance's configuration pairs under: its label, else the spec's if it runs it."""
    return v.observed.labels.get(LABEL_PAIRING) or (spec_key if v.current else UNKNOWN_PAIRING)


def pod_actions(v: InstanceView, config_hash: str, restarting: bool, spec_key: str,
                hold: bool = False) -> list[Action]:
    """Delete stale gangs whole, relabel switched pods, create missing ones once the gang is gone.

    `config_hash` is what the instance's spec says after this step; pods that run another
    configuration or an older gang go together (one rank alone cannot rejoin a running
    collective), and their replacements are created only when all of them are gone. A broken
    gang waiting out its restart back-off (`hold`) gets no new pods: a lost rank created now
    would join peers whose collectives broke, and the instance would look whole again.
    """
    actions: list[Action] = []
    p = v.plan
    generation = v.observed.spec.restart_generation + (1 if restarting else 0)
    flags_half = split_config_hash(config_hash)[1]
    target = GangTarget(p.role, config_hash, generation, p.nodes)
    live = [pod for pod in v.pods if not pod.deleting]
    if any(is_stale(pod, target) for pod in live):
        if restarting:
            cause, why = Cause.GANG_RESTART, f"gang restart of {p.name} (whole gang)"
        else:
            cause, why = Cause.ROLLOUT, f"rolling {p.name} to what its spec now says (whole gang)"
        for pod in live:
            actions.append(Action("delete", "Pod", pod.name, (cause,), why, uid=pod.uid))
        return actions
    desired_pods = {pod["metadata"]["name"]: pod for pod in p.pods}
    for pod in live:
        want = desired_pods.get(pod.name)
        key = instance_pairing_key(v, spec_key)
        body = {} if want is None else _metadata_patch(pod, want, flags_half, p.role, key)
        if body:
            if pod.annotations.get(ANNOTATION_ROLE) != p.role:
                cause, why = Cause.ROLE_SWITCH, f"role switched to {p.role} (relabel, no restart)"
            else:
                cause, why = Cause.DRIFT, "pod metadata drifted from the plan"
            actions.append(Action("patch", "Pod", pod.name, (cause,), why, body, uid=pod.uid))
    if hold or any(pod.deleting for pod in v.pods):
        return actions  # backing off, or the old gang is still going (its names are not free yet)
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


def _metadata_patch(
    pod: ObservedPod, want: Mapping[str, Any], flags_half: str, role: Role, pairing_key: str
) -> dict[str, Any]:
    """A merge patch bringing a live pod's labels and role annotations to the plan (or {}).

    The pairing key is the one label a live pod never changes: it says what the pod runs,
    which the plan (rendered from the spec) does not know for an instance not rolled yet. A pod
    from before pairing keys gets its instance's.
    """
    labels: dict[str, str | None] = {}
    want_labels = want["metadata"]["labels"]
    for key, value in want_labels.items():
        if key != LABEL_PAIRING and pod.labels.get(key) != value:
            labels[key] = value
    if LABEL_PAIRING not in pod.labels:
        labels[LABEL_PAIRING] = pairing_key
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


RERENDERED = "the pod template this operator now renders (configuration unchanged)"


def rerendered(v: InstanceView, revision_hash: str) -> bool:
    """Whether the instance is to roll although it runs the spec's configuration already: what
    differs is how this operator renders it (an operator upgrade, or a change of the operator's
    own settings), not anything in the spec, and the on-call reading status must be told so."""
    return not v.current and v.observed.labels.get(LABEL_REVISION) == revision_hash


def roll_target(v: InstanceView, revision_hash: str) -> str:
    """What rolling the instance moves it to, in words for its reason."""
    return RERENDERED if rerendered(v, revision_hash) else "the new configuration"


def updated(views: Mapping[str, InstanceView], role: Role) -> int:
    """Instances of `role` whose spec already says what the plan says (surge instances aside:
    they are not what a canary counts)."""
    return sum(1 for v in views.values() if v.plan.role == role and v.current and not v.plan.surge)


def held_by(rollout: RolloutSpec, views: Mapping[str, InstanceView]) -> Literal["Canary", "Paused"] | None:
    """What keeps instances on an older configuration on purpose, if anything.

    Paused: while set, nothing serving rolls. Canary: every role with instances left to roll has
    its `canary` instances rolled already (one role still rolling towards its canary is progress,
    not a hold).
    """
    pending = {v.plan.role for v in views.values() if not v.current and not v.plan.surge}
    if not pending:
        return None
    if rollout.paused:
        return "Paused"
    canary = rollout.canary
    if canary is not None and all(updated(views, role) >= canary for role in pending):
        return "Canary"
    return None


def canaries_coming_up(views: Mapping[str, InstanceView]) -> list[str]:
    """The rolled instances not yet available while older ones remain: a canary holds the rest on
    purpose only once it serves. One that never comes up (an engine that hangs loading the new
    image) is progress owed, which the progress deadline must be able to call stuck; told as a
    hold, its status would ask on-call to promote it."""
    if not any(not v.current and not v.plan.surge for v in views.values()):
        return []
    return [v.plan.name for v in sorted(views.values(), key=lambda v: v.plan.index)
            if v.current and not v.plan.surge and not v.available]


def _serving_roles(views: Mapping[str, InstanceView], spec_key: str, down: set[str],
                   settled: bool = False) -> dict[str, list[Role]]:
    """The roles of the available instances of each pairing key, `down` taken out.

    What the rollout protects counts every available instance; what it relies on to go on
    (`settled`) only those ready for minReadySeconds, which the router has registered."""
    roles: dict[str, list[Role]] = {}
    for v in views.values():
        if (v.settled if settled else v.available) and v.plan.name not in down:
            roles.setdefault(instance_pairing_key(v, spec_key), []).append(v.plan.role)
    return roles


def _pair_serving(views: Mapping[str, InstanceView], spec_key: str, down: set[str], settled: bool = False) -> bool:
    """Whether some pairing key has an available (or settled) prefill and decode with `down` taken out."""
    return any(set(r) == set(ROLES) for r in _serving_roles(views, spec_key, down, settled).values())


def _ends_routed_pair(key: str, routed: frozenset[str], before: Mapping[str, list[Role]],
                      after: Mapping[str, list[Role]]) -> bool:
    """Whether going from `before` to `after` (`_serving_roles`) ends the last serving pair of
    `key` while its router is still there: the router must retire first."""
    return key in routed and set(before.get(key, ())) == set(ROLES) != set(after.get(key, ()))


def routed_keys(views: Mapping[str, InstanceView], spec_key: str, live_keys: set[str], holding: bool,
                routers: frozenset[str], ready_routers: set[str]) -> list[str]:
    """The pairing keys that keep a router: the spec's, and each older one its pods still run,
    until it retires. A retired key's router never comes back (`routers`: the keys with a router
    Deployment): the roll may already have taken what its pair needed.

    An older key retires once it is down to its last instance of a role while a key that keeps
    its router serves a pair through a ready router (`ready_routers`: the keys whose router
    Deployment has a ready replica, which smg is only with a worker of each role), the spec's
    first, then older ones by size. Its router then leaves the Service (smg drains what it has
    in flight) before the roll takes that instance; `select_rollout` waits for that. A held
    rollout (paused, or at its canary) keeps every key that serves a pair; a key without one has
    no router (smg would answer 503 to what it got).
    """
    serving = _serving_roles(views, spec_key, set())
    settled = _serving_roles(views, spec_key, set(), settled=True)
    keys = [spec_key]
    for key in sorted(live_keys - {spec_key}, key=lambda k: (-len(serving.get(k, ())), k)):
        roles = serving.get(key, [])
        if set(roles) != set(ROLES) or key not in routers:
            continue  # no pair (a router of it could only answer 503), or retired already
        last = min(roles.count(role) for role in ROLES) == 1
        covered = any(k in ready_routers and set(settled.get(k, ())) == set(ROLES) for k in keys)
        if holding or not last or not covered:
            keys.append(key)
    return keys


def surge_plan(rollout: RolloutSpec, views: Mapping[str, InstanceView], spec_key: str,
               routed: frozenset[str]) -> tuple[set[str], dict[Role, int]]:
    """Which surge instances go now, and how many new ones each role gets (`rollout.maxSurge`).

    A role with instances left to roll, neither paused nor held at its canary, runs `maxSurge`
    instances on the new configuration above its replicas; `select_rollout` counts those serving
    as up, so that with `maxUnavailable: 0` the role never serves below its replicas. A surge
    instance no longer wanted (its role has rolled, the rollout is held) or on an older
    configuration (the spec changed again) goes at once if it is down; if it serves, only once
    every other instance of its role serves again, never taking the last compatible prefill and
    decode, nor the last pair of an older key whose router has not retired yet (`routed`).
    Until it has gone it counts against `maxSurge`.
    """
    leaving: set[str] = set()
    new: dict[Role, int] = {}
    for role in ROLES:
        regular = [v for v in views.values() if v.plan.role == role and not v.plan.surge]
        surge = sorted((v for v in views.values() if v.plan.role == role and v.plan.surge), key=lambda v: v.plan.index)
        pending = any(not v.current for v in regular)
        held = rollout.paused or (rollout.canary is not None and updated(views, role) >= rollout.canary)
        want = rollout.max_surge if pending and not held else 0
        fresh = [v for v in surge if v.current]
        settled = all(v.settled for v in regular)
        for v in [v for v in surge if not v.current] + fresh[want:]:
            if v.available:
                after = leaving | {v.plan.name}
                if not settled or (_pair_serving(views, spec_key, leaving)
                                   and not _pair_serving(views, spec_key, after, settled=True)):
                    continue
                own = instance_pairing_key(v, spec_key)
                if own != spec_key and _ends_routed_pair(own, routed, _serving_roles(views, spec_key, leaving),
                                                         _serving_roles(views, spec_key, after)):
                    continue  # its router retires first (routed_keys)
            leaving.add(v.plan.name)
        new[role] = max(0, want - sum(1 for v in surge if v.plan.name not in leaving))
    return leaving, new


def select_rollout(desired: DesiredState, views: Mapping[str, InstanceView],
                   routed: frozenset[str] = frozenset()) -> dict[str, str]:
    """Instances whose spec moves to the planned configuration now, with the reason.

    An instance that is down anyway is rolled at once: it costs no availability, and the plan
    renders only the new configuration's pods, so it could not come back on the old one. A
    serving one is rolled only within its role's budget (maxUnavailable plus the role's surge
    instances that serve, minus its instances not serving; an instance serves once it has been
    ready for minReadySeconds, and not while a role switch has it out of the router, when it is
    not rolled either: its switch ends first), only while its role has fewer than `canary` instances rolled, only
    in the first role (prefill, then decode) that still has instances it may roll, and only while
    the other role has no instance coming back from its own roll. When the roll changes the pairing key, an
    instance is rolled only if a compatible prefill and decode keep serving without it, and the
    last pair of an older key only once that key has no router (`routed`: the keys with a router
    Deployment); a fleet too small for that (one instance of a role) rolls anyway once nothing
    is coming back, taking first the role the new key still lacks.
    """
    selected: dict[str, str] = {}
    pending = {role: [v for v in views.values() if v.plan.role == role and not v.current and not v.plan.surge]
               for role in ROLES}
    for role in ROLES:
        for v in pending[role]:
            if not v.available:
                selected[v.plan.name] = f"rolling {role} instance (down already: costs no availability)"
    if desired.paused:
        return selected
    key = desired.pairing_key
    before = _serving_roles(views, key, set(selected))
    paired_before = any(set(r) == set(ROLES) for r in before.values())
    blocked: list[tuple[Role, InstanceView, int]] = []
    for role in ROLES:
        serving = [v for v in pending[role] if v.available and not v.out_for_switch]  # a switch finishes first
        room = len(serving)
        if desired.canary is not None:
            rolled = updated(views, role) + sum(1 for v in pending[role] if v.plan.name in selected)
            room = min(room, desired.canary - rolled)
        if room <= 0:
            continue  # nothing to roll, or held at its canary: the other role may roll
        other = [v for v in views.values() if v.plan.role != role and not v.plan.surge]
        if any(v.recovering or (v.available and not v.settled) for v in other):
            break  # the other role is mid-rollout: one role at a time (a surge instance starting takes nothing)
        down = sum(1 for v in views.values() if v.plan.role == role and not v.settled and not v.plan.surge)
        surging = sum(1 for v in views.values() if v.plan.role == role and v.settled and v.plan.surge)
        budget = min(room, desired.max_unavailable + surging - down)
        chosen = 0
        for v in sorted(serving, key=lambda v: -v.plan.index):
            if chosen >= budget:
                break
            own = instance_pairing_key(v, key)
            if paired_before and own != key:
                after = set(selected) | {v.plan.name}
                if not _pair_serving(views, key, after, settled=True):
                    blocked.append((role, v, down))
                    continue
                if _ends_routed_pair(own, routed, before, _serving_roles(views, key, after)):
                    # The last pair of its key goes only once the key's router has: wait for a
                    # retiring router (routed_keys), pass over a kept one.
                    if own in desired.router_keys:
                        continue
                    return selected
            selected[v.plan.name] = (
                f"rolling {role} instance to {roll_target(v, desired.revision_hash)} "
                f"({down + 1}/{desired.max_unavailable + surging} of the role's budget"
                + (f", {surging} surge instance(s) serving" if surging else "")
                + (f", canary {desired.canary}" if desired.canary is not None else "") + ")"
            )
            down += 1
            chosen += 1
        if chosen:
            break
    too_small = any(sum(1 for v in views.values() if v.plan.role == role) < 2 for role in ROLES)
    if blocked and too_small and not any(v.plan.name in selected for v in views.values() if v.available) and not any(
            v.recovering for v in views.values()):
        # With one instance of a role, no compatible pair can survive the roll of that instance:
        # once nothing is on its way back, roll towards the role the new key lacks.
        new_roles = {v.plan.role for v in views.values() if v.available and instance_pairing_key(v, key) == key}
        role, v, down = min(blocked, key=lambda b: (b[0] in new_roles, ROLES.index(b[0])))
        selected[v.plan.name] = (
            f"rolling {role} instance to {roll_target(v, desired.revision_hash)} "
            f"({down + 1}/{desired.max_unavailable} of the role's budget; too few instances to keep a "
            "compatible prefill and decode serving meanwhile)"
        )
    return selected
