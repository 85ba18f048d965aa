"""`hybridserving upgrade-check`: which engine instances this version of the operator would roll.

Run it from the version about to be installed, before `helm upgrade`: it reads the fleets and
what they own, plans them with this version's code (`core.upgrade`) and prints, fleet by fleet,
the instances that would restart and why (a pod field, an engine flag, a new default engine
image), and how fast the roll would go (`spec.rollout`). It writes nothing. An empty answer means
the upgrade restarts no engine; with `--exit-code` a pipeline can stop on the other answer, as
`git diff --exit-code` does.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any, TextIO, cast

from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE, GROUP, INSTANCE_PLURAL, PLURAL, VERSION
from hybridserving.commands.cluster import answered, custom_objects
from hybridserving.commands.output import EXIT_INVALID, EXIT_OK, write_json, write_table
from hybridserving.core.naming import LABEL_NAME
from hybridserving.core.upgrade import CAUSES, FleetPreview, preview

EXIT_ROLLS = 3  # with --exit-code: this version would roll an engine instance


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "upgrade-check", help="before an operator upgrade: the engine instances this version would roll, and why")
    p.add_argument("name", nargs="?", help="one HybridServing (default: every one in the namespace)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default="default")
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--default-engine-image", default=DEFAULT_ENGINE_IMAGE, metavar="IMAGE",
                   help="the engine image the upgraded operator gives fleets that name none (the chart's "
                        "engineImage; default: this version's)")
    p.add_argument("--exit-code", action="store_true",
                   help=f"exit {EXIT_ROLLS} when this version would roll an engine instance (0 when none)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.all_namespaces and args.name:
        out.write("error: a fleet name needs its namespace\n  fix: give -n NAMESPACE instead of -A\n")
        return EXIT_INVALID
    return answered(lambda: report(_read(args), args, out), args.name, args.namespace, out)


def report(previews: list[FleetPreview], args: argparse.Namespace, out: TextIO) -> int:
    """The previews in the asked format; a rollout under way does not set `--exit-code`'s 3, as
    it rolls whichever version runs."""
    if args.output == "json":
        write_json([to_dict(p) for p in previews], out)
    else:
        render(previews, out)
    return EXIT_ROLLS if args.exit_code and any(p.upgrade_rolls for p in previews) else EXIT_OK


def _read(args: argparse.Namespace) -> list[FleetPreview]:
    from kubernetes import client

    custom = custom_objects(args.kubeconfig)
    core = client.CoreV1Api()
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
        def items(listed: Any) -> list[dict[str, Any]]:
            # Pods and ConfigMaps as the JSON the apiserver sent, the shape the core reads.
            return cast(list[dict[str, Any]], json.loads(listed.data)["items"])

        instances = cast(dict[str, Any], custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, INSTANCE_PLURAL, label_selector=LABEL_NAME))["items"]
        pods = items(core.list_namespaced_pod(namespace, label_selector=LABEL_NAME, _preload_content=False))
        configmaps = [dict(c, kind="ConfigMap") for c in items(
            core.list_namespaced_config_map(namespace, label_selector=LABEL_NAME, _preload_content=False))]
        for body in sorted((f for f in fleets if f["metadata"]["namespace"] == namespace),
                           key=lambda f: f["metadata"]["name"]):
            name = body["metadata"]["name"]
            previews.append(preview(body, _labelled(instances, name), _labelled(pods, name),
                                    _labelled(configmaps, name), default_image=args.default_engine_image))
    return previews


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
            out.write(f"{where}: not planned by this version, its instances stay as they are "
                      f"(LayoutValid False):\n")
            for issue in p.invalid:
                out.write(f"  {issue}\n")
            continue
        if not p.rolling:
            out.write(f"{where}: nothing rolls ({len(p.instances)} instance(s) up to date)\n")
            continue
        out.write(f"{where}: {len(p.rolling)} of {len(p.instances)} instance(s) would roll, {p.pace}\n")
        rows = [["INSTANCE", "ROLE", "WHY", "WHAT CHANGES"]]
        for i in p.rolling:
            rows.append([i.name, i.role, CAUSES[i.cause], "; ".join(i.changes) or "-"])
        write_table(rows, out, indent="  ")
    rolling = sum(len(p.upgrade_rolls) for p in previews)
    total = sum(len(p.instances) for p in previews)
    out.write(f"this version rolls {rolling} of {total} instance(s) in {len(previews)} fleet(s)"
              + (": set spec.rollout.canary or spec.rollout.paused on a fleet first to roll it later\n"
                 if rolling else "\n"))


def to_dict(p: FleetPreview) -> dict[str, Any]:
    """The `-o json` shape: camelCase keys, only ever added to."""
    return {
        "name": p.name,
        "namespace": p.namespace,
        "revision": p.revision,
        "pace": p.pace,
        "invalid": list(p.invalid),
        "instances": [{"name": i.name, "role": i.role, "cause": i.cause, "rolls": i.cause != "current",
                       "changes": list(i.changes)} for i in p.instances],
    }
