"""Fleet revisions: every configuration a fleet was given, kept as ControllerRevisions for rollback.

A revision is the spec less what configures no instance: `rollout` (how to roll, not what),
the replica counts, the fleet's total and its scaler (scaling is not a new configuration), as
a Deployment's revision is its pod template and not its replicas or strategy. Its name is
`<fleet>-<hash>`; its number grows with every configuration applied, and going back to an
earlier one records that revision again as the newest (as `kubectl rollout undo` renumbers
it), so the numbers read as the order they were run in.
Each instance carries the hash of the revision its spec was rolled to (`LABEL_REVISION`), so
which revision runs where is observable after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridserving.api.v1alpha1 import KIND, ROLES, HybridServingSpec
from hybridserving.core.actions import Action, Cause
from hybridserving.core.desired import DesiredState
from hybridserving.core.naming import (
    API_VERSION,
    LABEL_COMPONENT,
    LABEL_NAME,
    LABEL_REVISION,
    digest,
    owner_reference,
    revision_name,
    standard_labels,
)
from hybridserving.core.observed import Observed

REVISION_KIND = "ControllerRevision"
COMPONENT = "revision"


# Top-level spec fields that size or pace the fleet rather than configure its instances.
SIZING = ("rollout", "replicas", "scaling")


def revision_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration part of a spec (wire form): all of it but `SIZING` and the roles' replicas."""
    out = {k: v for k, v in spec.items() if k not in SIZING}
    for role in ROLES:
        if isinstance(out.get(role), Mapping):
            out[role] = {k: v for k, v in out[role].items() if k != "replicas"}
    return out


def revision_hash(spec: HybridServingSpec) -> str:
    return digest(revision_spec(spec.to_wire()))


def restore(live: Mapping[str, Any], revision: Mapping[str, Any]) -> dict[str, Any]:
    """The spec a rollback writes: the revision's configuration with the live sizing (rollout,
    replicas, total, scaler).

    Rolling back changes what runs, not how many or how carefully: a canary or pause set on the
    live spec holds the way back as it held the way forward.
    """
    out = dict(revision_spec(revision))
    for key in SIZING:
        if key in live:
            out[key] = live[key]
    for role in ROLES:
        replicas = (live.get(role) or {}).get("replicas")
        if replicas is not None:
            out[role] = {**out.get(role, {}), "replicas": replicas}
    return out


# Images the operator fills in where the spec names none (its chart's defaults), which every
# revision records: a new default is a new configuration, and rolls out as one.
DEFAULTED = (("engine", "image"), ("router", "image"))


def defaults_kept(restored: Mapping[str, Any], live: Mapping[str, Any],
                  running: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """(`restored` without the defaulted images the rollback does not change, the paths of those it
    pins).

    A revision records the default image the fleet ran with; written into a spec that names
    none, it would pin the fleet to it, and the fleet would stop following the chart's default.
    Where the live spec names none and the revision's image is the one the fleet runs now
    (`running`: that revision's spec), the rollback is not of the image: it is left out. Where
    it differs, going back to it is part of the rollback, and it is pinned.
    """
    out = dict(restored)
    pinned: list[str] = []
    for section, key in DEFAULTED:
        if (live.get(section) or {}).get(key) or key not in (out.get(section) or {}):
            continue
        if running is not None and out[section][key] == (running.get(section) or {}).get(key):
            out[section] = {k: v for k, v in out[section].items() if k != key}
            if not out[section]:
                del out[section]
        else:
            pinned.append(f"spec.{section}.{key}")
    return out, pinned


@dataclass(frozen=True)
class Revision:
    """A ControllerRevision of the fleet, as the planner reads it."""

    name: str
    number: int
    uid: str

    @classmethod
    def from_manifest(cls, obj: Mapping[str, Any]) -> Revision:
        meta = obj.get("metadata") or {}
        return cls(meta["name"], int(obj.get("revision") or 0), meta.get("uid", ""))


def observed_revisions(observed: Observed) -> list[Revision]:
    """The fleet's revisions, newest first."""
    found = [Revision.from_manifest(o) for (kind, _), o in observed.objects.items() if kind == REVISION_KIND]
    return sorted(found, key=lambda r: -r.number)


def manifest(desired: DesiredState, number: int) -> dict[str, Any]:
    """The ControllerRevision of the desired spec, owned by the fleet (collected with it)."""
    name = desired.name
    return {
        "apiVersion": "apps/v1",
        "kind": REVISION_KIND,
        "metadata": {
            "name": revision_name(name, desired.revision_hash),
            "namespace": desired.namespace,
            "labels": {**standard_labels(name, COMPONENT), LABEL_NAME: name, LABEL_COMPONENT: COMPONENT,
                       LABEL_REVISION: desired.revision_hash},
            "ownerReferences": [owner_reference(API_VERSION, KIND, name, desired.uid)],
        },
        "data": {"spec": revision_spec(desired.spec.to_wire())},
        "revision": number,
    }


def in_use(desired: DesiredState, observed: Observed) -> set[str]:
    """Names of the revisions some instance of the fleet runs."""
    return {revision_name(desired.name, h) for i in observed.instances.values()
            if (h := i.labels.get(LABEL_REVISION))}


def actions(desired: DesiredState, observed: Observed) -> tuple[list[Action], list[Action]]:
    """(record, prune): record the spec's revision first, prune old ones once the rest is done.

    Kept: the spec's revision, every revision an instance runs, the last good one, and the
    newest `revisionHistoryLimit` others.
    """
    revisions = observed_revisions(observed)
    update = revision_name(desired.name, desired.revision_hash)
    newest = revisions[0].number if revisions else 0
    record: list[Action] = []
    mine = next((r for r in revisions if r.name == update), None)
    if mine is None:
        record.append(Action("create", REVISION_KIND, update, (Cause.MISSING,),
                             f"revision {newest + 1}: the fleet's configuration", manifest(desired, newest + 1)))
    elif mine.number < newest:
        # Recreated rather than renumbered in place: a merge patch makes the apiserver re-encode
        # `data`, whose bytes then differ from the stored ones, and `data` is immutable.
        record.append(Action("delete", REVISION_KIND, update, (Cause.DRIFT,),
                             f"back to the configuration of revision {mine.number}: recorded again as the newest",
                             uid=mine.uid))
        record.append(Action("create", REVISION_KIND, update, (Cause.MISSING,),
                             f"revision {newest + 1}: back to the configuration of revision {mine.number}",
                             manifest(desired, newest + 1)))
    keep = {update, desired.last_good_revision} | in_use(desired, observed)
    old = [r for r in revisions if r.name not in keep]
    limit = desired.spec.rollout.revision_history_limit
    prune = [Action("delete", REVISION_KIND, r.name, (Cause.PRUNE,),
                    f"revision {r.number} is older than the last {limit} (rollout.revisionHistoryLimit)", uid=r.uid)
             for r in old[limit:]]
    return record, prune
