"""What this version of the operator would roll in a running fleet, known before it runs.

An operator upgrade rolls every instance whose pods the new version renders differently
(`rollout.rerendered`), each fleet within its own `spec.rollout`. The engineer about to run
`helm upgrade` wants that answer first, fleet by fleet, with its reason: a pod field, an engine
flag, a new default engine image. The answer is the planner's own verdict
(`InstanceView.current`) on the objects the cluster holds, computed with this version's code, so
the preview and the upgrade cannot disagree; the reasons are read from the same objects.

The upgrade also rolls a router Deployment whose pod template it renders differently (a new smg
flag, say): no engine restarts, but every client connection to the router is drained and
reopened, which the engineer wants to know of too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from hybridserving.api.base import FROM_CLUSTER, field_errors
from hybridserving.api.v1alpha1 import HybridServing, Role
from hybridserving.core import fleet, layout, planner, privileges, rendering
from hybridserving.core.drift import short
from hybridserving.core.health import InstanceView, views_of
from hybridserving.core.naming import LABEL_REVISION, config_map_name, revision_name, split_config_hash
from hybridserving.core.observed import Observed
from hybridserving.core.privileges import EnginePolicy
from hybridserving.core.rollout import RERENDERED, rerendered

Cause = Literal["current", "rendering", "configuration", "rollout"]

# Why an instance rolls, in words; the first three are what an upgrade does, the last is not.
CAUSES: dict[Cause, str] = {
    "current": "up to date",
    "rendering": RERENDERED,
    "configuration": "a new configuration this version derives from the same spec",
    "rollout": "the spec's new configuration (a rollout under way before this version)",
}

GRANTS_UNKNOWN = EnginePolicy(allow_host_network=True, allow_ipc_lock=True, allow_node_cache=True,
                              allowed_node_cache_paths=("/",), allow_service_account=True)
"""Every grant assumed and this version's default engine image: only the spec decides."""

# Pod fields the cluster rewrites after creation: a difference there is not this version's.
_SET_BY_THE_CLUSTER = frozenset({"schedulingGates", "nodeName"})


@dataclass(frozen=True)
class InstancePreview:
    name: str
    role: Role
    cause: Cause
    changes: tuple[str, ...] = ()  # what differs, in words (empty when current)


@dataclass(frozen=True)
class RouterPreview:
    name: str  # the router Deployment
    changes: tuple[str, ...]  # what differs in its pod template, in words


@dataclass(frozen=True)
class FleetPreview:
    name: str
    namespace: str
    revision: str = ""  # the configuration revision this version derives from the spec
    instances: tuple[InstancePreview, ...] = ()
    pace: str = ""  # how fast the roll goes: spec.rollout in words
    invalid: tuple[str, ...] = ()  # why this version would not plan the fleet at all
    already_invalid: bool = False
    """The fleet's status says LayoutValid False: the running version does not plan it either."""
    routers: tuple[RouterPreview, ...] = ()  # the router Deployments that would roll

    @property
    def rolling(self) -> tuple[InstancePreview, ...]:
        return tuple(i for i in self.instances if i.cause != "current")

    @property
    def upgrade_rolls(self) -> tuple[InstancePreview, ...]:
        """The instances the upgrade itself rolls (a rollout under way rolls them anyway)."""
        return tuple(i for i in self.rolling if i.cause != "rollout")

    @property
    def upgrade_refuses(self) -> bool:
        """This version would stop planning a fleet the running one plans: nothing would heal,
        roll or switch it until its spec is fixed."""
        return bool(self.invalid) and not self.already_invalid


def preview(body: Mapping[str, Any], instances: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
            objects: Iterable[Mapping[str, Any]], policy: EnginePolicy = GRANTS_UNKNOWN) -> FleetPreview:
    """The fleet `body` as this version would reconcile it, given its children as read (listed by
    the fleet's label; only those it owns count, as for the reconcile) and what the installation
    about to run grants engine pods, with its default engine image (`GRANTS_UNKNOWN` where its
    chart values are not known: the grants are then left to the cluster, as `hybridserving
    validate` leaves them)."""
    meta = body.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    refused = any(c.get("type") == "LayoutValid" and c.get("status") == "False"
                  for c in (body.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping))
    try:
        hs = HybridServing.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body},
                                          context=FROM_CLUSTER)
    except ValidationError as exc:
        return FleetPreview(name, namespace, invalid=tuple(f"{e.path}: {e.message}" for e in field_errors(exc)),
                            already_invalid=refused)
    hs = privileges.with_default_image(hs, policy)
    errors = layout.errors(fleet.check(hs.spec, policy))
    if errors:
        return FleetPreview(name, namespace, invalid=tuple(f"{i.path}: {i.message}" for i in errors),
                            already_invalid=refused)

    owned_instances = [i for i in instances if _owned_by(i, {meta.get("uid")})]
    uids = {meta.get("uid")} | {i["metadata"].get("uid") for i in owned_instances}
    owned_pods = [p for p in pods if _owned_by(p, uids)]
    try:
        observed = Observed.from_manifests(owned_instances, owned_pods, [o for o in objects if _owned_by(o, uids)])
    except ValidationError as exc:  # an instance written by a version whose fields this one does not know
        return FleetPreview(name, namespace, invalid=tuple(
            f"a HybridServingInstance this version cannot read: {e.path}: {e.message}" for e in field_errors(exc)),
            already_invalid=refused)
    desired = planner.plan(hs, observed)
    views = views_of(desired.instances, observed, hs.spec.rollout.min_ready_seconds)
    revision = revision_name(name, desired.revision_hash)
    status = body.get("status") or {}
    running = (status.get("rollout") or {}).get("updateRevision")
    # A spec edited since the running version last reconciled (it lags, or is down) rolls
    # whichever version runs: its change is no more the upgrade's than a rollout under way is.
    unapplied = meta.get("generation") is not None and status.get("observedGeneration") != meta.get("generation")
    live = {p["metadata"]["name"]: p for p in owned_pods}
    out = []
    for v in sorted(views.values(), key=lambda v: v.plan.index):
        if v.current:
            out.append(InstancePreview(v.plan.name, v.plan.role, "current"))
        elif rerendered(v, desired.revision_hash):
            out.append(InstancePreview(v.plan.name, v.plan.role, "rendering",
                                       _rendering_changes(hs, v, live, observed, desired.objects)))
        elif running == revision:
            out.append(InstancePreview(v.plan.name, v.plan.role, "rollout"))
        elif unapplied:
            out.append(InstancePreview(v.plan.name, v.plan.role, "rollout", (
                f"generation {meta.get('generation')} of the spec, not yet applied by the running version "
                f"(observed: {status.get('observedGeneration', 'none')})",)))
        else:  # e.g. a new default engine image, for a fleet that names none
            old = v.observed.labels.get(LABEL_REVISION)
            was = revision_name(name, old) if old else "(none)"
            out.append(InstancePreview(v.plan.name, v.plan.role, "configuration", (
                f"revision {was} → {revision}", *_rendering_changes(hs, v, live, observed, desired.objects))))
    routers = (RouterPreview(key[1], _router_changes(observed.objects[key], want))
               for key, want in sorted(desired.objects.items()) if key[0] == "Deployment" and key in observed.objects)
    return FleetPreview(name, namespace, revision, tuple(out), _pace(hs),
                        routers=tuple(r for r in routers if r.changes))


def _owned_by(obj: Mapping[str, Any], uids: set[Any]) -> bool:
    return bool(uids & {r.get("uid") for r in obj.get("metadata", {}).get("ownerReferences") or []})


def _pace(hs: HybridServing) -> str:
    r = hs.spec.rollout
    if r.paused:
        return "held: spec.rollout.paused is set, nothing rolls until it is removed"
    if r.canary is not None:
        return (f"held at the canary: {r.canary} instance(s) of each role roll, the rest when "
                "spec.rollout.canary is removed")
    return f"within spec.rollout: {r.max_unavailable} instance(s) of a role at a time, one role at a time"


def _rendering_changes(hs: HybridServing, v: InstanceView, live: Mapping[str, Mapping[str, Any]], observed: Observed,
                       desired_objects: Mapping[tuple[str, str], Mapping[str, Any]]) -> tuple[str, ...]:
    """What this version renders differently for the instance: pod fields, the pod labels and
    annotations the template hash covers, engine flags, ports."""
    inst = v.observed.spec
    template, flags = split_config_hash(inst.config_hash)
    changes: list[str] = []
    if template != v.plan.template_hash:
        hashed = rendering.pod_extra_metadata(hs.spec, v.plan.name, v.plan.role, v.plan.nodes)
        paths = sorted({path for pod in v.plan.pods
                        for path in (*_pod_differences(live.get(pod["metadata"]["name"]), pod),
                                     *_metadata_differences(live.get(pod["metadata"]["name"]), hashed))})
        changes += [f"pod {p}" for p in paths] or [
            "the pod template (a field, label or annotation this version no longer sets)"]
    if flags != split_config_hash(v.plan.config_hash)[1]:
        key = ("ConfigMap", config_map_name(hs.metadata.name, v.plan.role))
        changes += _flag_changes(v.plan.role, observed.objects.get(key), desired_objects.get(key))
    if inst.ports != v.plan.ports:
        changes.append(f"ports {inst.ports.to_wire()} → {v.plan.ports.to_wire()}")
    if inst.nodes != v.plan.nodes:
        changes.append(f"nodes per instance {inst.nodes} → {v.plan.nodes}")
    return tuple(changes)


def _pod_differences(live: Mapping[str, Any] | None, planned: Mapping[str, Any]) -> list[str]:
    if live is None:
        return []
    spec, want = live.get("spec") or {}, planned.get("spec") or {}
    return [p for key, value in want.items() if key not in _SET_BY_THE_CLUSTER
            for p in _differences(spec.get(key), value, f"spec.{key}")]


def _metadata_differences(live: Mapping[str, Any] | None, hashed: tuple[Mapping[str, str], Mapping[str, str]]
                          ) -> list[str]:
    """The pod labels and annotations from the pod templates (and the gang) that the live pod
    lacks or holds another value of, keyed in brackets: their keys hold dots and slashes."""
    if live is None:
        return []
    meta = live.get("metadata") or {}
    out = []
    for field, want in zip(("labels", "annotations"), hashed, strict=True):
        have = meta.get(field) or {}
        out += [f"metadata.{field}[{k}]" + (f": {short(have[k])} → {short(w)}" if k in have else " (new)")
                for k, w in want.items() if have.get(k) != w]
    return out


def _differences(have: Any, want: Any, path: str) -> list[str]:
    """Where `want` is not in `have`, each as `path: old → new` (or `path (new)`): fields the
    cluster added or defaulted are not differences, and a quantity the apiserver wrote back as a
    string (`8` as "8") is the same quantity."""
    if have is None:
        return [f"{path} (new)"]
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            return [f"{path}: {short(have)} → {short(want)}"]
        return [p for k, w in want.items() for p in _differences(have.get(k), w, f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(have, list):
            return [f"{path}: {short(have)} → {short(want)}"]
        if all(isinstance(w, Mapping) and "name" in w for w in want):
            by_name = {h.get("name"): h for h in have if isinstance(h, Mapping)}
            return [p for w in want for p in _differences(by_name.get(w["name"]), w, f"{path}[{w['name']}]")]
        if len(have) != len(want):
            return [f"{path}: {short(have)} → {short(want)}"]
        return [p for i, (h, w) in enumerate(zip(have, want, strict=True)) for p in _differences(h, w, f"{path}[{i}]")]
    if have == want or str(have) == str(want):
        return []
    return [f"{path}: {short(have)} → {short(want)}"]


def _router_changes(live: Mapping[str, Any], want: Mapping[str, Any]) -> tuple[str, ...]:
    """The smg flags that change, one per item, then any other pod-template field by path."""
    have_template = (live.get("spec") or {}).get("template") or {}
    want_template = copy.deepcopy(dict((want.get("spec") or {}).get("template") or {}))
    have_args = {c.get("name"): c.get("args") for c in (have_template.get("spec") or {}).get("containers") or []
                 if isinstance(c, Mapping)}
    changes = []
    for container in (want_template.get("spec") or {}).get("containers") or []:
        changes += _argv_changes("router", have_args.get(container["name"]), container.pop("args", None))
    return (*changes, *(f"pod {p}" for p in _differences(have_template, want_template, "spec.template")))


def _argv_changes(who: str, old: Any, new: Any) -> list[str]:
    was, now = _flags(old), _flags(new)
    return [*(f"{who} flag {flag}: {_words(was.get(flag))} → {_words(args)}"
              for flag, args in now.items() if was.get(flag) != args),
            *(f"{who} flag {flag} removed" for flag in was if flag not in now)]


def _flag_changes(role: Role, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """The engine flags (and other launcher settings) of `role` that change, one per item."""
    before, after = _role_document(old, role), _role_document(new, role)
    if before is None or after is None:
        return [f"the {role} engine flags"]
    changes = _argv_changes(role, before.get("argv"), after.get("argv"))
    changes += [f"{role} launcher setting {key}: {before.get(key)} → {after.get(key)}"
                for key in sorted(set(before) | set(after)) if key != "argv" and before.get(key) != after.get(key)]
    return changes or [f"the {role} engine flags"]


def _role_document(configmap: Mapping[str, Any] | None, role: Role) -> dict[str, Any] | None:
    try:
        document = json.loads(((configmap or {}).get("data") or {})[f"{role}.json"])
    except (KeyError, TypeError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _flags(argv: Any) -> dict[str, tuple[str, ...]]:
    """`--flag value...` groups of an argv, by flag (the last occurrence wins, as in argparse)."""
    out: dict[str, tuple[str, ...]] = {}
    flag: str | None = None
    for token in argv if isinstance(argv, list) else []:
        token = str(token)
        if token.startswith("--"):
            flag = token.split("=", 1)[0]
            out[flag] = (token.split("=", 1)[1],) if "=" in token else ()
        elif flag is not None:
            out[flag] = (*out[flag], token)
    return out


def _words(args: tuple[str, ...] | None) -> str:
    if args is None:
        return "(unset)"
    return " ".join(args) or "(set)"
