"""`hybridserving render -f FILE`: the Kubernetes objects the operator would create, as YAML.

Like `helm template`: a reviewer or a GitOps diff sees exactly what lands (ConfigMaps with each
role's engine flags, PodDisruptionBudgets, instances, their headless Services and pods, the router)
without a cluster. The planner runs twice, as the operator's reconciles would: instances first,
then the pods they own. Fields the apiserver fills (uids, status) are left out; owner references
to not-yet-created objects carry an empty uid.
"""

from __future__ import annotations

import argparse
import copy
import re
from typing import Any, TextIO

import yaml

from hybridserving.api.v1alpha1 import DNS_LABEL_PATTERN, DNS_LABEL_RULE, HybridServing
from hybridserving.commands.output import EXIT_INVALID, EXIT_OK, load_manifests
from hybridserving.core import planner
from hybridserving.core.observed import Observed
from hybridserving.core.fleet import assess

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("render", help="print the Kubernetes objects the operator would create (YAML)")
    p.add_argument("-f", "--file", required=True, help="a HybridServing manifest")
    p.add_argument("-n", "--namespace", type=namespace_name, default=None,
                   help="namespace of manifests that name none (default: default)")
    p.set_defaults(func=cmd_render)


def namespace_name(text: str) -> str:
    """An argparse type: a namespace name as the apiserver takes it (a DNS-1123 label), so the objects
    printed are ones `kubectl apply` accepts."""
    if not re.fullmatch(DNS_LABEL_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name: use {DNS_LABEL_RULE}")
    return text


def render(hs: HybridServing) -> list[dict[str, Any]]:
    """Every object the planner wants for `hs` on an empty cluster, in apply order."""
    first = planner.plan(hs, Observed())
    created = []
    for inst in first.instances.values():
        manifest = copy.deepcopy(inst.manifest)
        manifest["metadata"]["uid"] = PLACEHOLDER_UID
        created.append(manifest)
    desired = planner.plan(hs, Observed.from_manifests(instances=created))
    objects: list[dict[str, Any]] = list(desired.objects.values())
    for inst in desired.instances.values():
        objects.append(inst.manifest)
        if inst.service is not None:
            objects.append(inst.service)
        objects.extend(inst.pods)
    return [_without_uids(obj) for obj in objects]


def _without_uids(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: ("" if k == "uid" else _without_uids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_without_uids(v) for v in obj]
    return obj


def cmd_render(args: argparse.Namespace, out: TextIO) -> int:
    docs = load_manifests(args.file, out, False)
    if docs is None:
        return EXIT_INVALID
    rendered: list[dict[str, Any]] = []
    for hs in docs:
        # The model fills "default" into a namespace the manifest leaves out; what the manifest wrote
        # is told by the fields it set. As `kubectl apply -n`: the flag names the namespace of a
        # manifest that names none, and one that names another is an error, not silently moved.
        written = hs.metadata.namespace if "namespace" in hs.metadata.model_fields_set else ""
        if written and args.namespace and written != args.namespace:
            out.write(f"# error: {hs.metadata.name}: metadata.namespace is {written!r} but -n is {args.namespace!r}\n"
                      f"#   fix: pass -n {written}, or remove metadata.namespace from the manifest\n")
            return EXIT_INVALID
        namespace = written or args.namespace or "default"
        hs = hs.model_copy(update={"metadata": hs.metadata.model_copy(update={"namespace": namespace})})
        assessment = assess(hs.spec)
        if not assessment.valid:
            out.write(f"# {hs.metadata.name}: invalid, the operator creates nothing\n")
            for issue in assessment.errors:
                out.write(f"#   error: {issue.path}: {issue.message}\n#          fix: {issue.fix}\n")
            return EXIT_INVALID
        rendered.extend(render(hs))
    out.write(yaml.safe_dump_all(rendered, sort_keys=False, default_flow_style=False))
    return EXIT_OK
