"""`hybridserving upgrade-check`: which engine instances this version of the operator would roll.

Run it from the version about to be installed, before `helm upgrade`: it reads the fleets and
what they own, plans them with this version's code (`core.upgrade`) and prints, fleet by fleet,
the instances that would restart and why (a pod field, an engine flag, a new default engine
image), how fast the roll would go (`spec.rollout`), the router Deployments that would roll, and
the fleets this version would stop planning; first, whether the installed CRDs are this
version's (Helm never upgrades them: the step of docs/install.md is easily skipped). It writes
nothing. An empty answer means the upgrade restarts no engine; with `--exit-code` a pipeline can
stop on the other answers, as `git diff --exit-code` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO, cast

from hybridserving.api.crd import expected_digests
from hybridserving.api.v1alpha1 import GROUP, INSTANCE_PLURAL, PLURAL, VERSION
from hybridserving.commands import chartvalues
from hybridserving.commands.cluster import NAMESPACE_HELP, add_connection_flags, answered, connect, with_namespace
from hybridserving.commands.output import (
    EXIT_INVALID,
    EXIT_OK,
    write_error,
    write_json,
    write_manifest_errors,
    write_table,
)
from hybridserving.core import crdschema
from hybridserving.core.naming import LABEL_NAME
from hybridserving.core.privileges import EnginePolicy
from hybridserving.core.upgrade import CAUSES, GRANTS_UNKNOWN, FleetPreview, preview
from hybridserving.manifests import ManifestInvalid

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

EXIT_ROLLS = 3  # with --exit-code: this version would roll an engine instance
EXIT_REFUSES = 4  # with --exit-code: this version would stop planning a fleet the running one plans


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "upgrade-check", help="before an operator upgrade: the engine instances this version would roll, and why")
    p.add_argument("name", nargs="?", help="one HybridServing (default: every one in the namespace)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default=None, help=NAMESPACE_HELP)
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    add_connection_flags(p)
    p.add_argument("-f", "--values", action="append", default=[], metavar="FILE",
                   help="the chart values the upgrade runs with, as for `helm upgrade -f` (repeatable; `helm get "
                        "values RELEASE -o yaml` writes the installed ones): their engineImage, routerImage and "
                        "enginePolicy "
                        "are checked too (default: the grants are left to the cluster)")
    p.add_argument("--default-engine-image", default=None, metavar="IMAGE",
                   help="the engine image the upgraded operator gives fleets that name none (default: the "
                        "values' engineImage, else this version's)")
    p.add_argument("--default-router-image", default=None, metavar="IMAGE",
                   help="the router image the upgraded operator gives fleets that name none (default: the "
                        "values' routerImage, else this version's)")
    p.add_argument("--exit-code", action="store_true",
                   help=f"exit {EXIT_REFUSES} when this version would stop planning a fleet the running one plans, "
                        f"else {EXIT_ROLLS} when it would roll an engine instance (0 when neither)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    as_json = args.output == "json"
    if args.all_namespaces and args.name:
        return write_error(out, as_json, None, "a fleet name needs its namespace", "give -n NAMESPACE instead of -A")
    try:
        policy = chartvalues.read(args.values).policy() if args.values else GRANTS_UNKNOWN
    except ManifestInvalid as err:
        if as_json:
            return write_values_error(err, out)
        write_manifest_errors(err, out)
        return EXIT_INVALID
    if args.default_engine_image:
        policy = replace(policy, default_image=args.default_engine_image)
    if args.default_router_image:
        policy = replace(policy, default_router_image=args.default_router_image)
    args = with_namespace(args)

    def check() -> int:
        api = connect(args.kubeconfig, args.context, args.request_timeout)
        return report(_read(api, args, policy), _read_crds(api), args, out)

    return answered(check, args.name, args.namespace, out, timeout=args.request_timeout, as_json=as_json)


def write_values_error(err: ManifestInvalid, out: TextIO) -> int:
    """The values' errors with `-o json`: one `{"error": ...}` object, as every other failure of
    the command writes it (`write_error`), where the output of a check that ran is a list, so a
    script tells the two apart by the shape; its keys say the first error, `issues` every one."""
    issues = [{"source": doc.source, "path": e.path, "message": e.message, "fix": e.fix}
              for doc in err.documents for e in doc.errors]
    first = issues[0] if issues else {"source": err.source, "path": "(document)", "message": str(err), "fix": ""}
    write_json({"error": {"path": f"--values {first['source']}: {first['path']}", "message": first["message"],
                          "fix": first["fix"], "issues": issues}}, out)
    return EXIT_INVALID


def report(previews: list[FleetPreview], crds: list[crdschema.Finding] | str, args: argparse.Namespace,
           out: TextIO, err: TextIO = sys.stderr) -> int:
    """The previews in the asked format, after what the installed CRDs are (`-o json`: on stderr,
    so the document on stdout keeps its shape). `--exit-code` counts only what the upgrade does:
    a rollout under way rolls whichever version runs, a fleet the running version refuses already
    stays as it is, and CRDs not yet this version's are the step before the upgrade, not a
    finding against it (a pipeline may gate first and apply the CRDs after)."""
    if args.output == "json":
        if crds_say := describe_crds(crds, only_outdated=True):
            err.write(crds_say)
        write_json([to_dict(p) for p in previews], out)
    else:
        out.write(describe_crds(crds))
        render(previews, out)
    if not args.exit_code:
        return EXIT_OK
    if any(p.upgrade_refuses for p in previews):
        return EXIT_REFUSES
    return EXIT_ROLLS if any(p.upgrade_rolls for p in previews) else EXIT_OK


def _read(api: ApiClient, args: argparse.Namespace, policy: EnginePolicy) -> list[FleetPreview]:
    from kubernetes import client

    custom, core, apps = client.CustomObjectsApi(api), client.CoreV1Api(api), client.AppsV1Api(api)
    if args.name:
        fleets = [cast(dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL,
                                                                           args.name))]
    elif args.all_namespaces:
        fleets = cast(dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))["items"]
    else:
        fleets = cast(dict[str, Any], custom.list_namespaced_custom_object(GROUP, VERSION, args.namespace,
                                                                           PLURAL))["items"]
    previews = []
    for namespace in sorted({f["metadata"]["namespace"] for f in fleets}):
        instances = cast(dict[str, Any], custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, INSTANCE_PLURAL, label_selector=LABEL_NAME))["items"]
        pods = _items(core.list_namespaced_pod(namespace, label_selector=LABEL_NAME, _preload_content=False))
        # The engine flags (ConfigMaps) and the routers (Deployments): the other children roll nothing.
        objects = [*(dict(c, kind="ConfigMap") for c in _items(
            core.list_namespaced_config_map(namespace, label_selector=LABEL_NAME, _preload_content=False))),
                   *(dict(d, kind="Deployment") for d in _items(
            apps.list_namespaced_deployment(namespace, label_selector=LABEL_NAME, _preload_content=False)))]
        for body in sorted((f for f in fleets if f["metadata"]["namespace"] == namespace),
                           key=lambda f: f["metadata"]["name"]):
            name = body["metadata"]["name"]
            previews.append(preview(body, _labelled(instances, name), _labelled(pods, name),
                                    _labelled(objects, name), policy))
    return previews


def _read_crds(connected: ApiClient) -> list[crdschema.Finding] | str:
    """The installed CRDs judged against this version's digests, or why they could not be read
    (a cluster-scoped read the caller may lack: that is no reason to skip the fleets)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    expected = expected_digests()
    api = client.ApiextensionsV1Api(connected)
    try:
        installed = [crd for name in expected for crd in _items(api.list_custom_resource_definition(
            field_selector=f"metadata.name={name}", _preload_content=False))]
    except ApiException as exc:
        return f"{exc.status} {exc.reason}"
    return crdschema.assess(installed, expected)


def describe_crds(crds: list[crdschema.Finding] | str, only_outdated: bool = False) -> str:
    """The installed CRDs in words: one line when they are this version's, else one per CRD with the fix."""
    if isinstance(crds, str):
        return (f"CRDs: not read ({crds}); before `helm upgrade`, apply this version's: {crdschema.FIX}\n")
    outdated = [f for f in crds if not isinstance(f, crdschema.Current)]
    if not outdated:
        return "" if only_outdated else f"CRDs: this version's ({', '.join(f.crd for f in crds)})\n"
    return "".join(f"CRDs: before `helm upgrade`: {f.describe()}\n" for f in outdated)


def _items(listed: Any) -> list[dict[str, Any]]:
    """Pods and ConfigMaps as the JSON the apiserver sent, the shape the core reads."""
    return cast(list[dict[str, Any]], json.loads(listed.data)["items"])


def _labelled(objs: Iterable[dict[str, Any]], fleet: str) -> list[dict[str, Any]]:
    """The objects carrying the fleet's label (the core then keeps only those the fleet owns)."""
    return [o for o in objs if (o["metadata"].get("labels") or {}).get(LABEL_NAME) == fleet]


def render(previews: list[FleetPreview], out: TextIO) -> None:
    """Fleet by fleet, then the total; pure over the previews so it is testable without a cluster."""
    if not previews:
        out.write("no HybridServing found: nothing to roll\n")
        return
    for p in previews:
        where = f"{p.namespace}/{p.name}"
        if p.invalid:
            out.write(f"{where}: not planned by this version, nor by the one running (LayoutValid False):\n"
                      if p.already_invalid else
                      f"{where}: this version would stop planning it (LayoutValid False): its instances "
                      f"stay as they are, but nothing heals, rolls or switches them until the spec is fixed:\n")
            for issue in p.invalid:
                out.write(f"  {issue}\n")
            continue
        if not p.rolling:
            out.write(f"{where}: {'no instance' if p.routers else 'nothing'} rolls "
                      f"({len(p.instances)} instance(s) up to date)\n")
        else:
            out.write(f"{where}: {len(p.rolling)} of {len(p.instances)} instance(s) would roll, {p.pace}\n")
            rows = [["INSTANCE", "ROLE", "WHY", "WHAT CHANGES"]]
            for i in p.rolling:
                rows.append([i.name, i.role, CAUSES[i.cause], "; ".join(i.changes) or "-"])
            write_table(rows, out, indent="  ")
        for r in p.routers:
            out.write(f"  router Deployment {r.name} would roll (smg restarts and drains its connections, no "
                      f"engine restarts): {'; '.join(r.changes)}\n")
    rolling = sum(len(p.upgrade_rolls) for p in previews)
    total = sum(len(p.instances) for p in previews)
    routers = sum(len(p.routers) for p in previews)
    out.write(f"this version rolls {rolling} of {total} instance(s)"
              + (f" and {routers} router Deployment(s)" if routers else "") + f" in {len(previews)} fleet(s)"
              + (": set spec.rollout.canary or spec.rollout.paused on a fleet first to roll it later\n"
                 if rolling else "\n"))
    refused = sum(p.upgrade_refuses for p in previews)
    if refused:
        out.write(f"this version would stop planning {refused} fleet(s) the running one plans: fix their spec "
                  "(the errors above) before the upgrade\n")


def to_dict(p: FleetPreview) -> dict[str, Any]:
    """The `-o json` shape: camelCase keys, only ever added to."""
    return {
        "name": p.name,
        "namespace": p.namespace,
        "revision": p.revision,
        "pace": p.pace,
        "invalid": list(p.invalid),
        "alreadyInvalid": p.already_invalid,
        "instances": [{"name": i.name, "role": i.role, "cause": i.cause, "rolls": i.cause != "current",
                       "changes": list(i.changes)} for i in p.instances],
        "routers": [{"name": r.name, "changes": list(r.changes)} for r in p.routers],
    }
