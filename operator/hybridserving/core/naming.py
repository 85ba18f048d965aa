"""Names, labels, annotations and hashes of what a fleet owns.

Every object a HybridServing owns is found again by a name derived from the fleet's and by
the labels below, so an operator that restarts anywhere recognises its own objects; the
hashes say which configuration an object was rendered from.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from hybridserving.api.v1alpha1 import GROUP, VERSION, Role
from hybridserving.contract import HALF_HASH

API_VERSION = f"{GROUP}/{VERSION}"

# Labels: `name`, `instance`, `node-rank`, `leader` and `component` never change for an
# object's life. `role` sits on leaders only, because the router adds every pod matching its
# selector as a worker and only the leader serves HTTP; it is dropped while the instance
# drains for a switch so the router stops sending it work. `instance-role` is on every pod of
# an instance (PodDisruptionBudgets count whole gangs).
LABEL_NAME = "hybridserving.io/name"
LABEL_INSTANCE = "hybridserving.io/instance"
LABEL_NODE_RANK = "hybridserving.io/node-rank"
LABEL_LEADER = "hybridserving.io/leader"
LABEL_INSTANCE_ROLE = "hybridserving.io/instance-role"
LABEL_COMPONENT = "hybridserving.io/component"
# On instances: the fleet revision (ControllerRevision hash) whose configuration the instance's
# spec carries, as a StatefulSet's pods carry controller-revision-hash.
LABEL_REVISION = "hybridserving.io/revision-hash"
# On instances, engine pods and routers: the pairing key (`core.pairing`) of the configuration
# they run. A pod keeps its key for life; each router discovers the pods of one key only.
LABEL_PAIRING = "hybridserving.io/pairing-key"
# On instances started above a role's replicas while it rolls (`rollout.maxSurge`): they go
# once the role has rolled, and the role-switch policy leaves them where they are.
LABEL_SURGE = "hybridserving.io/surge"
# app.kubernetes.io/name of what each component runs.
APP_NAMES = {"engine": "sglang", "router": "smg"}

# The role annotation is what the engine launcher reads (downward API file); the hashes and
# the restart generation say which configuration and which gang a pod belongs to.
ANNOTATION_TEMPLATE_HASH = "hybridserving.io/template-hash"
ANNOTATION_CONFIG_HASH = "hybridserving.io/config-hash"
ANNOTATION_RESTART_GENERATION = "hybridserving.io/restart-generation"
ANNOTATION_SPEC_HASH = "hybridserving.io/spec-hash"
# Read by the router (hard-coded key in smg) for prefill workers' bootstrap servers, and
# the per-pod serving port when instances on the host network use distinct ports.
ANNOTATION_BOOTSTRAP_PORT = "sglang.ai/bootstrap-port"
ANNOTATION_WORKER_PORTS = "smg.ai/worker-ports"


def engine_selector(hs: str) -> str:
    """The fleet's instances as a label selector string, one pod each (its rank 0, which serves
    HTTP and exports the engine's metrics): what the scale subresource reports. HPA multiplies a
    per-pod usage ratio by the pods this selects and writes the result as the fleet's instances,
    so selecting every rank of a multi-node instance would count it several times."""
    return f"{LABEL_NAME}={hs},{LABEL_COMPONENT}=engine,{LABEL_LEADER}=true"


def instance_name(hs: str, index: int) -> str:
    """`<hs>-<index>`: no role in it, so the name survives switches."""
    return f"{hs}-{index}"


def pod_name(instance: str, rank: int) -> str:
    return f"{instance}-{rank}"


def config_map_name(hs: str, role: Role) -> str:
    return f"{hs}-{role}-config"


def applied_spec_name(hs: str) -> str:
    return f"{hs}-applied"


def revision_name(hs: str, revision_hash: str) -> str:
    return f"{hs}-{revision_hash}"


def router_deployment_name(hs: str, key: str) -> str:
    """One router per pairing key present in the fleet; the Service `router_name` spans them all."""
    return f"{router_name(hs)}-{key}"


def router_name(hs: str) -> str:
    return f"{hs}-router"


def pdb_name(hs: str, role: Role) -> str:
    return f"{hs}-{role}"


def network_policy_name(hs: str) -> str:
    return f"{hs}-engines"


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def selectable(name: str) -> bool:
    """Whether a fleet's children can be found by its name: a label value (at most 63 characters).

    The apiserver accepts object names of up to 253 characters; the API model refuses such a
    HybridServing (`metadata.name`), but only once read, and listing its children by a label
    selector the apiserver refuses must not come first.
    """
    return len(name) <= 63 and bool(_LABEL_VALUE.match(name))


def digest(value: Any, length: int = HALF_HASH) -> str:
    """A short, stable hex digest of a JSON-able value (lowercase, valid as a label value)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def split_config_hash(value: str) -> tuple[str, str]:
    """(template half, role-flags half) of an instance's configHash."""
    return value[:HALF_HASH], value[HALF_HASH:]


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """The controller reference that makes the garbage collector delete a child with its owner."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def standard_labels(hs: str, component: str) -> dict[str, str]:
    """Kubernetes' recommended labels (app.kubernetes.io/*), so that generic tools (dashboards,
    cost reports, `kubectl get -l`) group a fleet's objects; the selectors keep using ours."""
    return {
        "app.kubernetes.io/name": APP_NAMES.get(component, "hybridserving"),
        "app.kubernetes.io/instance": hs,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "hybridserving",
        "app.kubernetes.io/managed-by": "hybridserving-operator",
    }

