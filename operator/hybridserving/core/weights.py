"""Model weights on the pods: volumes, mounts, the node-cache fill step, the engine's model path.

Every source ends up as a read-only directory at `MOUNT_PATH` in the engine container, so
the engine's `--model-path` is the same whatever the source, and `model.path` stays the
public model id (it becomes `--served-model-name` unless one is set). The hub token only
ever travels as a `secretKeyRef`: nothing the operator writes holds its value.

The node cache is a host directory per node, keyed by repository and revision; the fill step
(`hybridserving-weights`, an init container in the engine image) takes a per-node lock and
skips the download when a completed copy is there, so restarts, gang restarts and role
switches on that node start without a second download.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hybridserving.api.v1alpha1 import HybridServingSpec
from hybridserving.api.weights import WeightsSpec
from hybridserving.core.layout import LayoutIssue

MOUNT_PATH = "/models/weights"
VOLUME = "weights"
FILL_CONTAINER = "weights"
FILL_COMMAND = ("hybridserving-weights",)
TOKEN_ENV = "HF_TOKEN"
# Init container termination messages carry the fill's outcome (bytes, files, downloaded).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def cache_key(weights: WeightsSpec) -> str:
    """The node-cache directory of one repository at one revision (readable, collision-free)."""
    repo = weights.location.replace("/", "--")
    revision = weights.revision or "main"
    suffix = hashlib.sha256(f"{weights.location}@{revision}".encode()).hexdigest()[:8]
    return f"{repo}--{revision.replace('/', '--')}--{suffix}"


def engine_model_path(spec: HybridServingSpec) -> str:
    """What the engine loads: the mount for mounted sources, the hub id when the engine downloads."""
    w = spec.model.weights
    if w is None:
        return spec.model.path
    if w.scheme == "hf" and w.cache == "None":
        return w.location
    return MOUNT_PATH


def served_model_name(spec: HybridServingSpec) -> str | None:
    """Clients keep asking for `model.path` when the engine loads from a mount."""
    if spec.model.served_model_name:
        return spec.model.served_model_name
    if spec.model.weights is not None and engine_model_path(spec) != spec.model.path:
        return spec.model.path
    return None


def engine_args(spec: HybridServingSpec) -> list[str]:
    """Extra SGLang flags for the weights (the revision when the engine downloads itself)."""
    w = spec.model.weights
    if w is not None and w.scheme == "hf" and w.cache == "None" and w.revision:
        return ["--revision", w.revision]
    return []


def _hub_env(w: WeightsSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if w.token_secret_ref is not None:
        env.append({"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": w.token_secret_ref.name, "key": w.token_secret_ref.key}}})
    if w.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": w.endpoint})
    return env


@dataclass(frozen=True)
class PodWeights:
    """What the weights add to an engine pod."""

    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    env: list[dict[str, Any]]
    init_containers: list[dict[str, Any]]


def render(spec: HybridServingSpec) -> PodWeights:
    w = spec.model.weights
    if w is None:
        return PodWeights([], [], [], [])
    mount = {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}
    if w.scheme == "pvc":
        claim, sub = w.claim
        if sub:
            mount["subPath"] = sub
        volume = {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return PodWeights([volume], [mount], [], [])
    if w.scheme == "oci":
        volume = {"name": VOLUME, "image": {"reference": w.location, "pullPolicy": "IfNotPresent"}}
        return PodWeights([volume], [mount], [], [])
    if w.cache == "None":
        # The engine downloads at start (SGLang reads HF_TOKEN / HF_ENDPOINT).
        return PodWeights([], [], _hub_env(w), [])
    key = cache_key(w)
    volume = {"name": VOLUME, "hostPath": {"path": w.node_cache_path, "type": "DirectoryOrCreate"}}
    fill = {
        "name": FILL_CONTAINER,
        "image": spec.engine_image(),
        "command": list(FILL_COMMAND),
        "env": [
            {"name": "HYBRIDSERVING_WEIGHTS_REPO", "value": w.location},
            {"name": "HYBRIDSERVING_WEIGHTS_REVISION", "value": w.revision or "main"},
            {"name": "HYBRIDSERVING_WEIGHTS_DIR", "value": f"/cache/{key}"},
            *_hub_env(w),
        ],
        "volumeMounts": [{"name": VOLUME, "mountPath": "/cache"}],
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    return PodWeights([volume], [{**mount, "subPath": key}], [], [fill])


def check(spec: HybridServingSpec) -> list[LayoutIssue]:
    """What pydantic and CEL cannot see: the weights next to the rest of the spec."""
    w = spec.model.weights
    issues: list[LayoutIssue] = []
    if w is None:
        if any(e.name == TOKEN_ENV and e.value for e in spec.engine.env):
            issues.append(LayoutIssue(
                path="spec.engine.env", rule="weights-token-in-plain-text", severity="error",
                message=f"{TOKEN_ENV} is written in plain text into the resource (readable by anyone who can "
                "read HybridServings)",
                fix="store the token in a Secret and set spec.model.weights.tokenSecretRef (or env valueFrom: "
                "secretKeyRef)",
            ))
        return issues
    if any(e.name == TOKEN_ENV and e.value for e in spec.engine.env):
        issues.append(LayoutIssue(
            path="spec.engine.env", rule="weights-token-in-plain-text", severity="error",
            message=f"{TOKEN_ENV} is written in plain text into the resource",
            fix="remove it and set spec.model.weights.tokenSecretRef to the Secret key holding the token",
        ))
    if w.scheme == "hf" and w.cache == "None" and max(spec.prefill.nodes_per_instance,
                                                      spec.decode.nodes_per_instance) > 1:
        issues.append(LayoutIssue(
            path="spec.model.weights.cache", rule="weights-node-cache-multi-node", severity="warning",
            message="every pod of a multi-node instance downloads the weights from the hub at each start",
            fix="set spec.model.weights.cache: Node (filled once per node) or use a pvc:// source",
        ))
    return issues


def fill_outcome(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(state, detail) of a pod's fill step: Filled/Filling/Failed with the message, or None if it has none."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != FILL_CONTAINER:
            continue
        state = status.get("state") or {}
        last = status.get("lastState") or {}
        if "terminated" in state:
            term = state["terminated"]
            if term.get("exitCode") == 0:
                return "Filled", term.get("message") or ""
            return "Failed", term.get("message") or term.get("reason") or f"exit code {term.get('exitCode')}"
        if "terminated" in last and last["terminated"].get("exitCode") not in (0, None):
            return "Failed", last["terminated"].get("message") or last["terminated"].get("reason") or "failed"
        return "Filling", ""
    return None


def summarize(w: WeightsSpec, pods: Iterable[Any]) -> dict[str, Any]:
    """Status of the weights across nodes: how many have them, how many fill, bytes, errors.

    A node counts once, by its best outcome (a node where one pod filled the cache has the
    weights even if another pod's earlier attempt failed). Sources mounted from a volume are
    ready where a pod runs; their readiness shows in the pods' own status.
    """
    per_node: dict[str, tuple[str, str]] = {}
    rank = {"Filled": 2, "Filling": 1, "Failed": 0}
    for pod in pods:
        if pod.weights_fill is None or not pod.node_name:
            continue
        best = per_node.get(pod.node_name)
        if best is None or rank[pod.weights_fill[0]] > rank[best[0]]:
            per_node[pod.node_name] = pod.weights_fill
    filled = [detail for state, detail in per_node.values() if state == "Filled"]
    size = 0
    for detail in filled:
        try:
            size = max(size, int(json.loads(detail).get("bytes", 0)))
        except (ValueError, AttributeError):
            continue
    errors = sorted({f"{node}: {detail[:200]}" for node, (state, detail) in per_node.items() if state == "Failed"})
    return {
        "source": w.uri,
        "cache": w.cache,
        "nodesReady": len(filled),
        "nodesFilling": sum(1 for state, _ in per_node.values() if state == "Filling"),
        "nodesFailed": len(errors),
        "bytes": size,
        "errors": errors[:5],
    }
