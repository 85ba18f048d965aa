"""The operator's permissions, in one list: the ClusterRole in deploy/ is generated from it.

Each rule says why it exists. Run from deploy/, the operator watches every namespace, so it
needs a ClusterRole; it has no get, list or watch on Secrets (it writes one per fleet, the engines'
API key it derives itself: create and patch, by server-side apply; a patch answers with the
Secret, so patch is as much as a read of the Secrets it may patch) and escalates nothing: the Role
it creates for each router grants pod reads, which it holds itself. The leader-election Lease
rules are the chart's (docs/install.md lists them for deploy/). `python -m
hybridserving.controller.rbac --write` regenerates deploy/operator-rbac.yaml; a test fails
when the file and this list disagree.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from hybridserving.api.v1alpha1 import GROUP, INSTANCE_PLURAL, PLURAL

NAME = "hybridserving-operator"
NAMESPACE = "hybridserving-system"
WRITE = ("create", "patch", "delete")
READ = ("get", "list", "watch")
DEPLOY_FILE = pathlib.Path(__file__).resolve().parents[3] / "deploy" / "operator-rbac.yaml"


@dataclass(frozen=True)
class Rule:
    why: str
    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"apiGroups": [self.group], "resources": list(self.resources), "verbs": list(self.verbs)}


RULES: tuple[Rule, ...] = (
    Rule("Application: read the fleets (never their spec: no update or patch)", GROUP, (PLURAL,), READ),
    Rule("Application: report status and conditions", GROUP, (f"{PLURAL}/status",), ("get", "patch")),
    Rule("Application: resize fleets whose built-in scaler is on (spec.replicas, as HPA does)", GROUP,
         (f"{PLURAL}/scale",), ("get", "patch")),
    Rule("Application: one instance object per engine instance", GROUP, (INSTANCE_PLURAL,), READ + WRITE),
    Rule("Application: instance phase, ready pods, nodes", GROUP, (f"{INSTANCE_PLURAL}/status",), ("get", "patch")),
    Rule("Application: ownerReferences with blockOwnerDeletion on fleets and instances", GROUP,
         (f"{PLURAL}/finalizers", f"{INSTANCE_PLURAL}/finalizers"), ("update",)),
    Rule("Application: engine pods (gangs), their rendezvous Services, the engine ConfigMaps", "",
         ("pods", "services", "configmaps"), READ + WRITE),
    Rule("Application: the router's identity", "", ("serviceaccounts",), READ + WRITE),
    Rule("Application: the router", "apps", ("deployments",), READ + WRITE),
    Rule("Application: each configuration applied, kept for rollback (bounded history)", "apps",
         ("controllerrevisions",), READ + WRITE),
    Rule("Application: per-role disruption budgets", "policy", ("poddisruptionbudgets",), READ + WRITE),
    Rule("Application: who may reach the engines (the fleet, its router, the operator)", "networking.k8s.io",
         ("networkpolicies",), READ + WRITE),
    Rule("Application: one gang Workload per instance (spec.gang.mode: Workload)", "scheduling.k8s.io",
         ("workloads",), ("get", "list") + WRITE),
    Rule("Application: the router may read pods of its namespace (service discovery)",
         "rbac.authorization.k8s.io", ("roles", "rolebindings"), READ + WRITE),
    Rule("Application: each fleet's engine API key, written (server-side apply), never read: the key is "
         "derived, not stored (docs/security.md)", "", ("secrets",), ("create", "patch")),
    Rule("Application: an Event for every decision", "", ("events",), ("create",)),
    Rule("Framework: kopf discovers and follows custom resource definitions; the operator compares the "
         "installed CRDs' schema digests with its own (a LIST by name; never written)", "apiextensions.k8s.io",
         ("customresourcedefinitions",), ("list", "watch")),
    Rule("Framework: kopf resolves --namespace patterns against the namespaces that exist", "",
         ("namespaces",), ("list", "watch")),
)


def manifests() -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding of the operator."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": NAME},
         "rules": [r.to_wire() for r in RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": NAME},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
    ]


def render() -> str:
    """The YAML of `manifests()`, each ClusterRole rule preceded by its reason."""
    docs = []
    for obj in manifests():
        if obj["kind"] == "ClusterRole":
            head = yaml.safe_dump({k: v for k, v in obj.items() if k != "rules"}, sort_keys=False)
            rules = "".join(
                f"# {rule.why}\n" + yaml.safe_dump([rule.to_wire()], sort_keys=False) for rule in RULES
            )
            docs.append(head + "rules:\n" + rules)
        else:
            docs.append(yaml.safe_dump(obj, sort_keys=False))
    return "# generated by `python -m hybridserving.controller.rbac --write`; do not edit\n" + "---\n".join(docs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybridserving.controller.rbac", description=__doc__)
    ap.add_argument("--write", action="store_true", help=f"write {DEPLOY_FILE.name} instead of printing it")
    args = ap.parse_args(argv)
    if args.write:
        DEPLOY_FILE.write_text(render())
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
