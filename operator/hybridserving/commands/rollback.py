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
from collections.abc import Mapping
from typing import Any, Protocol, TextIO, cast

from pydantic import ValidationError

from hybridserving.api.v1alpha1 import GROUP, PLURAL, VERSION, HybridServingSpec
from hybridserving.commands.cluster import NAMESPACE_HELP, answered, custom_objects, with_namespace
from hybridserving.commands.output import EXIT_INVALID, EXIT_OK, whole_number
from hybridserving.core import drift, revisions
from hybridserving.core.naming import LABEL_NAME, revision_name

FIELD_MANAGER = "hybridserving-rollback"  # who wrote the spec, in managedFields

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
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
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


def rollback(api: CustomObjects, namespace: str, name: str, to_revision: int | None, out: TextIO,
             dry_run: bool = False) -> int:
    """Write the chosen revision's configuration into the fleet's spec, conditionally on what was
    read, and say what it changes (`dry_run`: say it, write nothing)."""
    hs = cast(dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    uid = hs["metadata"]["uid"]
    listed = cast(dict[str, Any], api.list_namespaced_custom_object(
        "apps", "v1", namespace, "controllerrevisions", label_selector=f"{LABEL_NAME}={name}"))
    found = [r for r in listed.get("items") or []
             if uid in {o.get("uid") for o in r["metadata"].get("ownerReferences") or []}]
    status = hs.get("status") or {}
    rollout = status.get("rollout") or {}
    if rollout.get("updateRevision") and status.get("observedGeneration") == hs["metadata"].get("generation"):
        # What the operator recorded for this very spec: its revisions carry what it fills in (the
        # chart's default engine image), which the spec alone does not say.
        current = rollout["updateRevision"]
    else:
        try:
            current = revision_name(name, revisions.revision_hash(HybridServingSpec.model_validate(hs["spec"])))
        except ValidationError:
            current = rollout.get("updateRevision", "")  # an invalid spec: the fleet runs what status says
    try:
        target = choose(found, current, rollout.get("lastGoodRevision", ""), to_revision)
    except ValueError as exc:
        out.write(f"error: {name}: {exc}\n")
        return EXIT_INVALID
    number, target_name = target.get("revision"), target["metadata"]["name"]
    if target_name == current:
        out.write(f"{name} already has the configuration of revision {number} ({target_name}); nothing to do\n")
        return EXIT_OK
    tool = gitops_manager(hs["metadata"])
    if tool:
        out.write(f"warning: {name} is managed by {tool}: revert the change in git, or {tool} will write its "
                  "spec back on the next sync\n")
    restored = revisions.restore(hs["spec"], target["data"]["spec"])
    changed = "".join(f"  {c}\n" for c in drift.changes(hs["spec"], restored, "spec"))
    if dry_run:
        out.write(f"{name} would roll back to revision {number} ({target_name}); nothing written (--dry-run)\n"
                  f"{changed}")
        return EXIT_OK
    hs["spec"] = restored
    hs.pop("status", None)
    hs["metadata"].pop("managedFields", None)  # left out, the apiserver keeps and updates them
    api.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, hs, field_manager=FIELD_MANAGER)
    out.write(f"{name} rolled back to revision {number} ({target_name}); the operator rolls it out "
              f"within spec.rollout (maxUnavailable, canary, paused)\n{changed}")
    return EXIT_OK


def run(args: argparse.Namespace, out: TextIO) -> int:
    from kubernetes.client.exceptions import ApiException

    args = with_namespace(args)

    def once() -> int:
        try:
            return rollback(custom_objects(args.kubeconfig), args.namespace, args.name, args.to_revision, out,
                            dry_run=args.dry_run)
        except ApiException as exc:
            if exc.status != 409:
                raise
            out.write(f"error: {args.name} changed while rolling back; run the command again\n")
            return EXIT_INVALID

    return answered(once, args.name, args.namespace, out)
