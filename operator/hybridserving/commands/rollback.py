"""`hybridserving rollback`: put a fleet back on an earlier configuration.

The operator keeps each configuration a fleet was given as a ControllerRevision
(`core.revisions`). Rollback writes one back into the fleet's spec, keeping the live rollout
settings and replica counts, as `kubectl rollout undo` does for a Deployment; the operator then
rolls to it like any other change (maxUnavailable, canary and paused apply). A fleet kept in git
by Argo CD or Flux is reverted in git instead: the tool writes its own spec back on its next
sync, so the CLI warns when it sees such a tool's marks on the object.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping
from typing import Any, Protocol, TextIO, cast

from pydantic import ValidationError

from hybridserving.api.base import FROM_CLUSTER
from hybridserving.api.v1alpha1 import GROUP, KIND, PLURAL, VERSION, HybridServingSpec
from hybridserving.commands.cluster import (
    NAMESPACE_HELP,
    add_connection_flags,
    answered,
    custom_objects,
    with_namespace,
)
from hybridserving.commands.output import EXIT_INVALID, EXIT_OK, whole_number, write_error
from hybridserving.core import drift, revisions
from hybridserving.core.fleet import assess
from hybridserving.core.naming import LABEL_NAME, revision_name
from hybridserving.manifests import ManifestInvalid, parse_document

FIELD_MANAGER = "hybridserving-rollback"  # who wrote the spec, in managedFields
CONFLICT_RETRIES = 3  # replaces retried after a conflict that left the spec as it was read

# Marks GitOps tools leave on what they apply: (where, key or key prefix, tool).
GITOPS_MARKS: tuple[tuple[str, str, str], ...] = (
    ("annotations", "argocd.argoproj.io/tracking-id", "Argo CD"),
    ("labels", "argocd.argoproj.io/instance", "Argo CD"),
    ("labels", "kustomize.toolkit.fluxcd.io/", "Flux"),
    ("labels", "helm.toolkit.fluxcd.io/", "Flux"),
)


class CustomObjects(Protocol):
    """What rollback uses of `kubernetes.client.CustomObjectsApi` (typed, so tests can stand in)."""

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str) -> object: ...

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, *,
                                      label_selector: str | None = ...) -> object: ...

    def replace_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                         body: dict[str, Any], *, field_manager: str | None = ...) -> object: ...


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "rollback", help="put a fleet back on an earlier configuration (default: the last good revision)")
    p.add_argument("name", help="the HybridServing")
    p.add_argument("-n", "--namespace", default=None, help=NAMESPACE_HELP)
    add_connection_flags(p)
    p.add_argument("--to-revision", type=whole_number(1), default=None,
                   help="the revision number (kubectl get controllerrevisions -l hybridserving.io/name=NAME)")
    p.add_argument("--dry-run", action="store_true",
                   help="say the revision and what it changes in the spec; write nothing")
    p.set_defaults(func=run)


def gitops_manager(meta: Mapping[str, Any]) -> str | None:
    """The GitOps tool whose marks the object carries, if any."""
    for where, key, tool in GITOPS_MARKS:
        found = meta.get(where) or {}
        if any(k == key or (key.endswith("/") and k.startswith(key)) for k in found):
            return tool
    return None


def choose(revisions_found: list[dict[str, Any]], current: str, last_good: str,
           to_revision: int | None) -> dict[str, Any]:
    """The revision to go back to: the one asked for; else the last good one unless it is the
    current one; else the newest one before the current one. Raises ValueError saying why none."""
    by_number = sorted(revisions_found, key=lambda r: -int(r.get("revision") or 0))
    numbers = ", ".join(str(r.get("revision")) for r in by_number) or "none"
    if to_revision is not None:
        found = next((r for r in by_number if r.get("revision") == to_revision), None)
        if found is None:
            raise ValueError(f"--to-revision {to_revision}: no such revision (kept: {numbers})")
        return found
    names = {r["metadata"]["name"]: r for r in by_number}
    if last_good and last_good != current and last_good in names:
        return names[last_good]
    now = int((names.get(current) or {}).get("revision") or 0)
    earlier = [r for r in by_number if int(r.get("revision") or 0) < now] if now else by_number[1:]
    if not earlier:
        raise ValueError(f"no earlier revision to go back to (kept: {numbers}); give --to-revision")
    return earlier[0]


def not_applied(hs: Mapping[str, Any]) -> str | None:
    """Why the operator does not run the spec's generation, as status says it of that very
    generation (None: it runs it, or status has not seen it yet). The fleet then keeps the last
    spec it applied, and status names that spec's revision as the update revision: the spec has
    no revision of its own to compare with."""
    generation = hs["metadata"].get("generation")
    status = hs.get("status") or {}
    if status.get("observedGeneration") != generation:
        return None
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if c.get("observedGeneration") in (None, generation)}
    if (conditions.get("LayoutValid") or {}).get("status") == "False":
        return "LayoutValid False: it fails validation"
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False" and progressing.get("reason") == "PlanFailed":
        return "Progressing False, PlanFailed: it could not be planned"
    return None


def refusals(name: str, namespace: str, spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(field, message, fix) of each error `hybridserving validate` finds in the fleet with `spec`:
    the schema and rules the apiserver applies, then the layout's. A restored spec is a revision's
    configuration under the live sizing, a combination no one has validated: the apiserver would
    refuse some, and the operator others, leaving the fleet on a spec it does not run."""
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name, "namespace": namespace},
           "spec": spec}
    try:
        hs = parse_document(doc, name)
    except ManifestInvalid as err:
        return [(e.path, e.message, e.fix) for e in err.errors]
    return [(i.path, i.message, i.fix) for i in assess(hs.spec).errors]


def writable(hs: Mapping[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The fleet as read with `spec`, for a replace conditional on its resourceVersion."""
    body = copy.deepcopy(dict(hs))
    body["spec"] = spec
    body.pop("status", None)
    body["metadata"].pop("managedFields", None)  # left out, the apiserver keeps and updates them
    return body


def deleting(out: TextIO, name: str, meta: Mapping[str, Any]) -> int:
    """Refuse a fleet being deleted: the operator stops reconciling it, so a spec written now
    would never roll out, and its revisions go with it."""
    return write_error(out, False, name,
                       f"being deleted (since {meta['deletionTimestamp']}): the operator no longer reconciles it, "
                       "so nothing would roll it back; nothing written",
                       "once it is gone, apply its manifest with the configuration to run")


def rollback(api: CustomObjects, namespace: str, name: str, to_revision: int | None, out: TextIO,
             dry_run: bool = False) -> int:
    """Write the chosen revision's configuration into the fleet's spec, conditionally on what was
    read, and say what it changes (`dry_run`: say it, write nothing)."""
    from kubernetes.client.exceptions import ApiException

    hs = cast(dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    meta = hs["metadata"]
    if meta.get("deletionTimestamp"):
        return deleting(out, name, meta)
    uid = meta["uid"]
    listed = cast(dict[str, Any], api.list_namespaced_custom_object(
        "apps", "v1", namespace, "controllerrevisions", label_selector=f"{LABEL_NAME}={name}"))
    found = [r for r in listed.get("items") or []
             if uid in {o.get("uid") for o in r["metadata"].get("ownerReferences") or []}]
    names = {r["metadata"]["name"]: r for r in found}
    status = hs.get("status") or {}
    rollout = status.get("rollout") or {}
    running = rollout.get("updateRevision", "")
    why = not_applied(hs)
    current = ""  # the spec's own revision, where the operator applies the spec
    if why is None and running and status.get("observedGeneration") == meta.get("generation"):
        # What the operator recorded for this very spec: its revisions carry what it fills in (the
        # chart's default engine image), which the spec alone does not say.
        current = running
    elif why is None and to_revision is None and not (hs["spec"].get("engine") or {}).get("image"):
        # The spec's revision records the chart's default image, which the spec alone does not
        # say: until the operator has applied this generation, which revision it is cannot be told,
        # and guessing would go "back" to the one that runs and pin its image.
        return write_error(out, False, name,
                           f"generation {meta.get('generation')} of the spec is not applied yet (status says "
                           f"{status.get('observedGeneration', 'none')}), and its revision, which holds the "
                           "chart's default image, cannot be told from the spec alone; nothing written",
                           "wait until the operator has applied it (hybridserving status), or name the revision "
                           "with --to-revision N (kubectl get controllerrevisions -l "
                           f"hybridserving.io/name={name})")
    elif why is None:
        try:
            current = revision_name(name, revisions.revision_hash(
                HybridServingSpec.model_validate(hs["spec"], context=FROM_CLUSTER)))
        except ValidationError:
            why = "it fails validation"
    if why is not None:
        runs = names.get(running)
        said = f"revision {runs.get('revision')} ({running})" if runs else running
        out.write(f"{name}: generation {meta.get('generation')} of the spec is not applied ({why})"
                  + (f"; the fleet runs {said}\n" if running else "\n"))
    try:
        if why is not None and to_revision is None and running in names:
            target = names[running]  # undoes the edit the operator refused; what runs stays
        else:
            target = choose(found, current or running, rollout.get("lastGoodRevision", ""), to_revision)
    except ValueError as exc:
        out.write(f"error: {name}: {exc}\n")
        return EXIT_INVALID
    number, target_name = target.get("revision"), target["metadata"]["name"]
    runs_now = names.get(current or running)
    restored, pinned = revisions.defaults_kept(revisions.restore(hs["spec"], target["data"]["spec"]), hs["spec"],
                                               runs_now["data"]["spec"] if runs_now else None)
    aborted = aborts_canary(rollout, target_name, restored)
    if aborted:
        restored["rollout"] = {k: v for k, v in restored["rollout"].items() if k != "canary"}
    changes = drift.changes(hs["spec"], restored, "spec")
    # The same name is only the same configuration for a spec the operator applies, and there the
    # spec can still differ from its revision by what the operator fills in (its default image):
    # writing that would pin it, not roll anything back.
    if not changes or target_name == current:
        out.write(f"{name} already has the configuration of revision {number} ({target_name}); nothing to do\n")
        return EXIT_OK
    refused = refusals(name, namespace, restored)
    if refused:
        out.write(f"error: {name}: revision {number} ({target_name}) with the live spec's rollout, replicas and "
                  "scaling, which a rollback keeps, fails validation; nothing written\n")
        for path, message, fix in refused:
            write_error(out, False, path, message, fix)
        return EXIT_INVALID
    tool = gitops_manager(meta)
    if tool:
        out.write(f"warning: {name} is managed by {tool}: revert the change in git, or {tool} will write its "
                  "spec back on the next sync\n")
    changed = "".join(f"  {c}\n" for c in changes)
    for path in pinned:
        out.write(f"note: {name}: {path} was the operator's default and is written as revision {number}'s "
                  f"{restored[path.split('.')[1]]['image']}: the fleet stays on it when the chart's default "
                  f"changes; remove {path} from the spec to follow the default again\n")
    if dry_run:
        out.write(f"{name} would roll back to revision {number} ({target_name}); nothing written (--dry-run)\n"
                  f"{changed}")
        return EXIT_OK
    body = writable(hs, restored)
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            api.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body,
                                                 field_manager=FIELD_MANAGER)
            break
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_RETRIES:
                raise
        # The operator writes the fleet's status all through a rollout, and each write moves the
        # resourceVersion: that conflict is retried; a changed spec is someone else's decision.
        again = cast(dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        now = again["metadata"]
        if now.get("deletionTimestamp"):
            return deleting(out, name, now)
        if (now.get("uid"), now.get("generation"), again.get("spec")) != (uid, meta.get("generation"), hs["spec"]):
            return write_error(out, False, name,
                               f"someone else changed the spec while rolling back (generation "
                               f"{meta.get('generation')} → {now.get('generation')}); nothing written",
                               f"check what changed (kubectl get hybridserving {name} -n {namespace} -o yaml), "
                               "then run the command again")
        body = writable(again, restored)
    out.write(f"{name} rolled back to revision {number} ({target_name}); the operator rolls it out "
              f"within spec.rollout (maxUnavailable, canary, paused)\n{changed}")
    if aborted:
        out.write(f"  the canary is called off: spec.rollout.canary is removed, or it would hold the canaries on "
                  f"{rollout.get('updateRevision')} (the instances it counts already run {target_name}); "
                  "set it again before the next change\n")
    if restored.get("rollout", {}).get("paused"):
        out.write("  warning: spec.rollout.paused is true: nothing that serves rolls back until it is set to false\n")
    return EXIT_OK


def aborts_canary(rollout: Mapping[str, Any], target_name: str, restored: Mapping[str, Any]) -> bool:
    """Whether going back to `target_name` calls off a canary rather than rolls back a configuration.

    A canary counts the instances of each role that run the spec's configuration. Held at it, the
    instances not yet rolled run `currentRevision`: going back to that one, they already run what
    the spec says, the canary is reached before anything moves, and it would hold the canaries
    on the configuration being abandoned for good."""
    return (rollout.get("held") == "Canary" and target_name == rollout.get("currentRevision")
            and (restored.get("rollout") or {}).get("canary") is not None)


def run(args: argparse.Namespace, out: TextIO) -> int:
    from kubernetes.client.exceptions import ApiException

    args = with_namespace(args)

    def once() -> int:
        try:
            api = custom_objects(args.kubeconfig, args.context, args.request_timeout)
            return rollback(api, args.namespace, args.name, args.to_revision, out, dry_run=args.dry_run)
        except ApiException as exc:
            if exc.status != 409:
                raise
            out.write(f"error: {args.name} changed while rolling back; run the command again\n")
            return EXIT_INVALID

    return answered(once, args.name, args.namespace, out, timeout=args.request_timeout)
