"""The object plan: what a HybridServing should own, and the next safe step towards it.

Two pure functions carry the operator's decisions, so that a whole rollout can be simulated
and checked step by step without a cluster (LWS's planner does the same):

* `plan(hs, observed)` computes the full desired object set: per-role engine ConfigMaps, one
  HybridServingInstance per engine instance, per instance a headless Service and its pods,
  the router with its RBAC, a PodDisruptionBudget per role.
* `diff(desired, observed)` turns the difference into the actions of *this* step: create,
  patch or delete, each with its cause and reason, holding voluntary disruption to
  `rollout.maxUnavailable` instances per role and to one role at a time, and the number of
  instances rolled per role to `rollout.canary`.

The controller is stateless: every fact it needs to resume after a restart is written on
the objects themselves. An instance's `spec.configHash` says what its pods should run; the
planner moves it to the new hash only when it decides to roll that instance, so the set of
instances already rolled is observable. The hash has two halves, the pod template (which
never contains the role) and the role's engine flags, so a role switch changes the flags
half in place and pods are relabelled, never recreated.

The jobs live in their own modules, composed here: `observed` (what was found), `naming`
(names, labels, hashes), `assignment` (which instances, which role), `rendering` (every
manifest), `health` (what an instance is doing, which pods are stale), `backoff` (when a
gang that keeps failing may restart again), `rollout` (what moves this step), `drift`
(whether an object still says what the plan says), `revisions` (the configurations applied,
kept for rollback).
"""

from __future__ import annotations

from typing import Any

from hybridserving.api.instance import InstancePorts
from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND, ROLES, HybridServing, Role
from hybridserving.core import backoff, pairing, ports, revisions
from hybridserving.core.actions import Action, Cause
from hybridserving.core.assignment import assign_instances
from hybridserving.core.backoff import ANNOTATION_GANG_RESTARTS
from hybridserving.core.desired import DesiredState, InstancePlan
from hybridserving.core.drift import contains, extra_fields, overlay_removals
from hybridserving.core.health import view, views_of
from hybridserving.core.naming import (
    API_VERSION,
    LABEL_INSTANCE,
    LABEL_PAIRING,
    LABEL_REVISION,
    LABEL_SURGE,
    applied_spec_name,
    digest,
    instance_name,
    owner_reference,
    split_config_hash,
)
from hybridserving.core.observed import ObjectKey, Observed
from hybridserving.core.rendering import EngineAccess, fleet_objects, render_instance, role_config, running_documents
from hybridserving.core.rollout import (
    held_by,
    instance_pairing_key,
    pod_actions,
    routed_keys,
    select_rollout,
    surge_plan,
)


def plan(hs: HybridServing, observed: Observed, access: EngineAccess | None = None,
         last_good_revision: str = "") -> DesiredState:
    """The full desired object set of `hs`, given what exists (roles, ports, uids).

    `access` says who besides the fleet may reach its engines (the operator's namespace);
    `last_good_revision` is the revision status last recorded as good, which is never pruned.
    """
    access = access or EngineAccess()
    spec = hs.spec
    name, namespace = hs.metadata.name, hs.metadata.namespace
    uid = hs.metadata.uid or ""
    owner = owner_reference(API_VERSION, KIND, name, uid)
    configs = {role: role_config(spec, role) for role in ROLES}
    role_hashes = {role: digest(configs[role]) for role in ROLES}
    spec_hash = digest(spec.to_wire())
    revision_hash = revisions.revision_hash(spec)
    pairing_key = pairing.pairing_key(spec)

    assigned = assign_instances(name, spec, observed)
    surging = {n: (i.spec.index, i.spec.role) for n, i in observed.instances.items()
               if i.surge and not i.deleting}
    members = {**assigned, **surging}
    order = sorted(members, key=lambda n: members[n][0])
    held = {n: observed.instances[n].spec.ports for n in order if n in observed.instances}
    leaving = [i.spec.ports for n, i in observed.instances.items() if n not in members]
    allocated = ports.allocate(
        order, held, host_network=spec.network.host_network, bootstrap_base=spec.transfer.bootstrap_port,
        reserved=leaving,
    )

    def render(inst_name: str, index: int, role: Role, inst_ports: InstancePorts, surge: bool) -> InstancePlan:
        out = render_instance(hs, inst_name, index, role, inst_ports, role_hashes, observed.instances.get(inst_name),
                              owner, pairing_key)
        out.manifest["metadata"]["labels"][LABEL_REVISION] = revision_hash
        if surge:
            out.manifest["metadata"]["labels"][LABEL_SURGE] = "true"
            out.surge = True
        return out

    instances = {n: render(n, *members[n], allocated[n], n in surging) for n in order}
    views = views_of(instances, observed, spec.rollout.min_ready_seconds)
    routers = _routed(observed)
    gone, wanted = surge_plan(spec.rollout, views, pairing_key, _routed(observed, leaving=True))
    for n in gone:
        del instances[n], views[n]
    if any(wanted.values()):
        taken = {i.spec.index for i in observed.instances.values()} | {p.index for p in instances.values()}
        free = (index for index in range(1 << 20) if index not in taken)
        added = [(index, role) for role in ROLES for index in (next(free) for _ in range(wanted[role]))]
        new_names = {instance_name(name, index): (index, role) for index, role in added}
        allocated = ports.allocate(
            [*instances, *new_names], {n: p.ports for n, p in instances.items()},
            host_network=spec.network.host_network, bootstrap_base=spec.transfer.bootstrap_port,
            reserved=leaving + [observed.instances[n].spec.ports for n in gone],
        )
        for n, (index, role) in new_names.items():
            instances[n] = render(n, index, role, allocated[n], True)
    # A router per pairing key the fleet still runs (the spec's, older ones until they retire).
    running = {pod.labels[LABEL_PAIRING] for pod in observed.pods.values()
               if not pod.deleting and pod.labels.get(LABEL_PAIRING)}
    holding = held_by(spec.rollout, views) is not None
    ready_routers = {obj["metadata"]["labels"].get(LABEL_PAIRING, "") for (kind, _), obj in observed.objects.items()
                     if kind == "Deployment" and ((obj.get("status") or {}).get("readyReplicas") or 0) > 0}
    pairing_keys = routed_keys(views, pairing_key, running, holding, routers, ready_routers)
    objects: dict[ObjectKey, dict[str, Any]] = {
        (obj["kind"], obj["metadata"]["name"]): obj
        for obj in fleet_objects(hs, configs, role_hashes, spec_hash, instances, access, owner, pairing_keys,
                                 running_documents(name, observed))
    }
    return DesiredState(
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        spec_hash=spec_hash,
        role_config_hashes=role_hashes,
        instances=instances,
        objects=objects,
        revision_hash=revision_hash,
        last_good_revision=last_good_revision,
        pairing_key=pairing_key,
        router_keys=tuple(pairing_keys),
    )


def _routed(observed: Observed, *, leaving: bool = False) -> frozenset[str]:
    """The pairing keys with a router Deployment not on its way out, or with `leaving` also those on
    their way out: a retired router's pods still take what stale proxies send them until they are
    gone (its Deployment is deleted in the foreground), so the last pair of its key stays till then."""
    return frozenset(obj["metadata"]["labels"].get(LABEL_PAIRING, "") for (kind, _), obj in observed.objects.items()
                     if kind == "Deployment" and (leaving or not obj["metadata"].get("deletionTimestamp")))


def diff(desired: DesiredState, observed: Observed) -> list[Action]:
    """The writes of this step, in the order to make them.

    Config first (new pods mount it), then instances (their spec gates their pods), then
    pods, then the rest. Involuntary trouble (a broken gang, an instance already down) is
    repaired at once; voluntary disruption (rolling a serving instance to a new config) is
    held to `maxUnavailable` per role, one role at a time, to `canary` instances per role, and
    stops while paused. The spec's revision is recorded before anything rolls to it; old
    revisions are pruned last.
    """
    actions: list[Action] = []
    owned_uids = {desired.uid} | {i.uid for i in observed.instances.values()}

    def sync(obj: dict[str, Any], why: str) -> None:
        key = (obj["kind"], obj["metadata"]["name"])
        current = observed.objects.get(key)
        if current is None:
            actions.append(Action("create", key[0], key[1], (Cause.MISSING,), f"{why} is missing", obj))
            return
        removals = extra_fields(current, obj)
        if not contains(current, obj) or removals:
            body = overlay_removals(obj, removals)
            actions.append(
                Action("patch", key[0], key[1], (Cause.DRIFT,), f"{why} drifted from the plan", body,
                       resource_version=current.get("metadata", {}).get("resourceVersion"))
            )

    for (kind, name), obj in desired.objects.items():
        if kind == "ConfigMap":
            sync(obj, "engine configuration" if name != applied_spec_name(desired.name) else "applied spec")
    record, prune = revisions.actions(desired, observed)
    actions.extend(record)

    views = view(desired, observed)
    selected = select_rollout(desired, views, _routed(observed, leaving=True))

    # Instances: create, adopt role switches, roll, restart broken gangs. `next_hash` is the
    # configHash each instance carries once this step's patch lands; its pods follow it.
    next_hash: dict[str, str] = {}
    gang_restarts: set[str] = set()
    backing_off: set[str] = set()  # broken gangs left as they are until their back-off ends
    for name, p in desired.instances.items():
        existing = observed.instances.get(name)
        if existing is None:
            if p.surge:
                actions.append(Action("create", INSTANCE_KIND, name, (Cause.ROLLOUT,),
                                      f"surge {p.role} instance on the new configuration while the role rolls "
                                      f"(maxSurge {desired.max_surge})", p.manifest))
            else:
                actions.append(Action("create", INSTANCE_KIND, name, (Cause.SCALE_UP,), f"new {p.role} instance",
                                      p.manifest))
            continue
        if existing.deleting:
            continue
        v = views[name]
        patch: dict[str, Any] = {}
        causes: list[Cause] = []
        reasons: list[str] = []
        next_hash[name] = existing.spec.config_hash
        labels: dict[str, str] = {}
        if existing.labels.get(LABEL_REVISION) != desired.revision_hash and (name in selected or v.current):
            labels[LABEL_REVISION] = desired.revision_hash
        pairs_under = desired.pairing_key if name in selected else instance_pairing_key(v, desired.pairing_key)
        if existing.labels.get(LABEL_PAIRING) != pairs_under:
            labels[LABEL_PAIRING] = pairs_under
        if name in selected:
            patch.update(configHash=p.config_hash, ports=p.ports.to_wire(), nodes=p.nodes)
            causes.append(Cause.ROLLOUT)
            reasons.append(selected[name])
            next_hash[name] = p.config_hash
        else:
            template_half, flags_half = split_config_hash(existing.spec.config_hash)
            role_hash = desired.role_config_hashes[p.role]
            if flags_half != role_hash and v.switching:
                next_hash[name] = patch["configHash"] = template_half + role_hash
                causes.append(Cause.ROLE_SWITCH)
                reasons.append(f"role switched to {p.role}: the pods follow in place with the {p.role} flags")
        if labels and name not in selected:
            causes.append(Cause.DRIFT)
            if LABEL_REVISION in labels:
                reasons.append(f"runs revision {desired.revision_hash} already (its configuration did not change)")
            if LABEL_PAIRING in labels:
                reasons.append(f"pairs under key {labels[LABEL_PAIRING]}")
        annotations: dict[str, str | None] = {}
        history = v.restarts
        if name in selected and history is not None:
            annotations[ANNOTATION_GANG_RESTARTS] = None  # a new configuration starts its back-off afresh
        failure = v.failure()
        if failure and (name in selected or not v.restart_wait):
            patch["restartGeneration"] = existing.spec.restart_generation + 1
            causes.append(Cause.GANG_RESTART)
            gang_restarts.add(name)
            if name in selected or v.now is None:
                reasons.append(f"gang restart: {failure}")
            else:
                after = backoff.restarted(history, v.now)
                annotations[ANNOTATION_GANG_RESTARTS] = after.to_annotation()
                reasons.append(f"gang restart {after.count} in a row: {failure}; should it fail again, the next "
                               f"restart waits {backoff.delay(after.count):.0f}s")
        elif failure:
            backing_off.add(name)
        elif history is not None and v.forgets_restarts_in == 0:
            annotations[ANNOTATION_GANG_RESTARTS] = None
            causes.append(Cause.BACK_OFF_RESET)
            reasons.append(f"served for {backoff.FORGET_AFTER_READY_SECONDS:.0f}s: its {history.count} gang "
                           "restart(s) in a row are forgotten")
        if patch or labels or annotations:
            body: dict[str, Any] = {"spec": patch} if patch else {}
            meta: dict[str, Any] = {}
            if labels:
                meta["labels"] = labels
            if annotations:
                meta["annotations"] = annotations
            if meta:
                body["metadata"] = meta
            actions.append(
                Action("patch", INSTANCE_KIND, name, tuple(causes), "; ".join(reasons), body,
                       resource_version=existing.resource_version)
            )

    for name, inst in observed.instances.items():
        if name not in desired.instances and not inst.deleting and desired.uid in inst.owner_uids:
            if inst.surge:
                actions.append(Action("delete", INSTANCE_KIND, name, (Cause.ROLLOUT,),
                                      f"surge {inst.spec.role} instance retired: its role has rolled, the rollout "
                                      "is held, or it runs an older configuration", uid=inst.uid))
            else:
                # On the instance as read: a role switch started on it since makes this a 409, and
                # the retry's assignment sees the switch.
                actions.append(Action("delete", INSTANCE_KIND, name, (Cause.SCALE_DOWN,),
                                      f"scaled down: {inst.spec.role} instance no longer wanted", uid=inst.uid,
                                      resource_version=inst.resource_version))

    # Per-instance Services and pods, for instances whose spec is what the pods should run.
    for name, p in desired.instances.items():
        if name not in views:
            continue
        if p.service is not None:
            sync(p.service, f"rendezvous Service of {name}")
        if p.workload is not None:
            sync(p.workload, f"gang Workload of {name}")
        actions.extend(pod_actions(views[name], next_hash[name], name in gang_restarts, desired.pairing_key,
                                   hold=name in backing_off))

    for (kind, _), obj in desired.objects.items():
        if kind != "ConfigMap":
            sync(obj, {"PodDisruptionBudget": "disruption budget", "NetworkPolicy": "engine network policy"}.get(
                kind, f"router {kind}"))

    # Anything of ours the plan no longer has (router turned off, a role's objects renamed).
    wanted = set(desired.objects) | {
        ("Service", n) for n, p in desired.instances.items() if p.service is not None
    } | {("Workload", p.workload["metadata"]["name"]) for p in desired.instances.values() if p.workload is not None}
    for key, obj in observed.objects.items():
        meta = obj.get("metadata") or {}
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if key[0] == revisions.REVISION_KIND:
            continue  # kept or pruned by revisions.actions
        if key not in wanted and owners & owned_uids and not meta.get("deletionTimestamp"):
            instance = (meta.get("labels") or {}).get(LABEL_INSTANCE)
            if key[0] in ("Service", "Workload") and instance and instance not in desired.instances:
                continue  # goes with its instance (garbage collection)
            actions.append(Action("delete", key[0], key[1], (Cause.PRUNE,), "no longer part of the plan",
                                  uid=meta.get("uid")))
    actions.extend(prune)
    return actions


