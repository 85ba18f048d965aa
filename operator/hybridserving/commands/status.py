"""`hybridserving status`: the fleet at a glance for the engineer on call.

`kubectl get hs` shows one line per fleet; during an incident the questions are per
instance (which role does it serve now, is it draining, where does it run) and what the
role-switch controller did recently. Everything shown comes from the objects' status, so
it reads the same facts the operator wrote, nothing recomputed.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, TextIO, cast

from hybridserving.api.v1alpha1 import GROUP, INSTANCE_PLURAL, PLURAL, VERSION
from hybridserving.commands.cluster import (
    NAMESPACE_HELP,
    add_connection_flags,
    answered,
    custom_objects,
    with_namespace,
)
from hybridserving.commands.output import EXIT_INVALID, EXIT_OK, whole_number, write_table
from hybridserving.core.naming import LABEL_SURGE

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("status", help="the fleet at a glance: instances, roles, phases, capacity, switches")
    p.add_argument("name", nargs="?", help="one HybridServing (default: every one in the namespace)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default=None, help=NAMESPACE_HELP)
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every fleet in every namespace")
    add_connection_flags(p)
    p.add_argument("--switches", type=whole_number(0), default=5, help="recent switches to show per fleet (0: none)")
    p.set_defaults(func=run)


def render(hs: dict[str, Any], instances: list[dict[str, Any]], out: TextIO, switches: int = 5,
           with_namespace: bool = False) -> None:
    """Write one fleet's view; pure over the objects so it is testable without a cluster.

    The operator stops reconciling a fleet once it is being deleted, and so stops writing its
    status: read as usual, the status of a fleet that was healthy when deleted would say it still
    is while its instances go. Such a fleet is said to be terminating, with the finalizers it
    waits on, and what its status says as what was last written before the deletion."""
    meta, status = hs["metadata"], hs.get("status") or {}
    conds = {c["type"]: c for c in status.get("conditions") or []}
    prefill, decode = status.get("prefill") or {}, status.get("decode") or {}
    where = f"{meta.get('namespace')}/{meta['name']}" if with_namespace else meta["name"]
    facts = (f"ready={status.get('ready', 'Unknown')}  prefill {prefill.get('summary', '-')}  "
             f"decode {decode.get('summary', '-')}")
    deleted = meta.get("deletionTimestamp")
    if deleted:
        finalizers = ", ".join(meta.get("finalizers") or [])
        out.write(f"{where}  Terminating since {deleted}" + (f" (finalizers: {finalizers})" if finalizers else "")
                  + f"  generation {meta.get('generation')}\n"
                  f"  last written before the deletion, no longer updated: {facts}"
                  f" (observed generation {status.get('observedGeneration')})\n")
    else:
        out.write(f"{where}  {facts}  generation {meta.get('generation')}"
                  f" (observed {status.get('observedGeneration')})\n")
    capacity = (status.get("capacity") or {}).get("summary")
    if capacity:
        out.write(f"  KV capacity: {capacity}\n")
    weights = status.get("weights") or {}
    if weights:
        out.write(f"  Weights: {weights_line(weights)}\n")
    rollout = status.get("rollout") or {}
    if rollout:
        held = f" [held: {rollout['held']}]" if rollout.get("held") else ""
        names = [rollout.get(k) or "-" for k in ("updateRevision", "currentRevision", "lastGoodRevision")]
        out.write(f"  Rollout{held}: {rollout.get('message', '')}; update {names[0]}, current {names[1]}, "
                  f"last good {names[2]}\n")
    shown = [(t, conds[t]) for t in ("Ready", "LayoutValid", "Progressing", "Degraded", "RoleSwitching") if t in conds]
    if deleted and shown:
        out.write("  conditions as last written before the deletion:\n")
    for type_, c in shown:
        out.write(f"  {'  ' if deleted else ''}{type_:<13} {c['status']:<7} {c.get('reason', '')}: "
                  f"{c.get('message', '')}\n")
    rows = [["INSTANCE", "ROLE", "RUNNING", "PHASE", "READY PODS", "NODES"]]
    for inst in sorted(instances, key=lambda i: i["spec"].get("index", 0)):
        st = inst.get("status") or {}
        rows.append(
            [
                inst["metadata"]["name"],
                inst["spec"].get("role", "-") + (" (surge)" if LABEL_SURGE in (inst["metadata"].get("labels") or {})
                                                 else ""),
                st.get("role", "-"),
                st.get("phase", "-"),
                f"{st.get('readyPods', 0)}/{inst['spec'].get('nodes', 1)}",
                ",".join(n for n in st.get("nodeNames") or [] if n) or "-",
            ]
        )
    write_table(rows, out, indent="  ")
    if switches == 0:  # asked for none (a slice from -0 would be every one)
        return
    recent = (status.get("switches") or [])[-switches:]
    if recent:
        out.write("  recent role switches:\n")
        # DETAIL: the step a switch in progress is at, or how it ended (the engine's message for a
        # refusal or failure, each step's seconds): what the role-switch runbooks diagnose from.
        rows = [["INSTANCE", "FROM", "TO", "MODE", "OUTCOME", "STARTED", "REASON", "DETAIL"]]
        for s in recent:
            rows.append([s["instance"], s["fromRole"], s["toRole"], s["mode"], s["outcome"], s["started"], s["reason"],
                         s.get("phase") or "-"])
        write_table(rows, out, indent="    ")
    else:
        out.write("  no role switches yet\n")


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def weights_line(w: dict[str, Any]) -> str:
    """`status.weights` in one line: nodes by state, the download's progress when known, errors."""
    line = (f"{w.get('source', '-')}  {w.get('nodesReady', 0)} node(s) ready, {w.get('nodesFilling', 0)} filling, "
            f"{w.get('nodesFailed', 0)} failed")
    done, total = w.get("bytesDone"), w.get("bytesTotal")
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        line += f"; {done * 100 // total}% ({_size(done)} of {_size(total)})"
    elif w.get("nodesFilling"):
        line += "; progress unknown"
    if w.get("errors"):
        line += f"; last error {w['errors'][0]}"
    return line


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.all_namespaces and args.name:
        out.write("error: a fleet name needs its namespace\n  fix: give -n NAMESPACE instead of -A\n")
        return EXIT_INVALID
    args = with_namespace(args)
    return answered(lambda: _show(custom_objects(args.kubeconfig, args.context, args.request_timeout), args, out),
                    args.name, args.namespace, out, timeout=args.request_timeout)


def _show(api: CustomObjectsApi, args: argparse.Namespace, out: TextIO) -> int:
    # The client types custom objects as `object`; they are the JSON the apiserver sent.
    def listed(plural: str) -> list[dict[str, Any]]:
        answer = (api.list_cluster_custom_object(GROUP, VERSION, plural) if args.all_namespaces
                  else api.list_namespaced_custom_object(GROUP, VERSION, args.namespace, plural))
        return cast(list[dict[str, Any]], cast(dict[str, Any], answer)["items"])

    if args.name:
        fleets = [cast(dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL,
                                                                        args.name))]
    else:
        fleets = listed(PLURAL)
    if not fleets:
        out.write("no HybridServing in any namespace\n" if args.all_namespaces
                  else f"no HybridServing in namespace {args.namespace}\n")
        return EXIT_OK
    all_instances = listed(INSTANCE_PLURAL)
    for hs in sorted(fleets, key=lambda f: (f["metadata"].get("namespace", ""), f["metadata"]["name"])):
        mine = [
            i
            for i in all_instances
            if any(o.get("uid") == hs["metadata"]["uid"] for o in i["metadata"].get("ownerReferences") or [])
        ]
        render(hs, mine, out, args.switches, with_namespace=args.all_namespaces)
    return EXIT_OK
