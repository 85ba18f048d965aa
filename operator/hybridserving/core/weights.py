"""Model weights on the pods: volumes, mounts, the node-cache fill step, the engine's model path.

Every source ends up as a read-only directory at `MOUNT_PATH` in the engine container, so
the engine's `--model-path` is the same whatever the source, and `model.path` stays the
public model id (it becomes `--served-model-name` unless one is set). The hub token only
ever travels as a `secretKeyRef`: nothing the operator writes holds its value.

The node cache is a host directory per node, keyed by repository and revision; the fill step
(`hybridserving-weights`, an init container in the engine image) takes a per-node lock and
skips the download when a completed copy is there, so restarts, gang restarts and role
switches on that node start without a second download. While it runs it serves its
progress at `contract.WEIGHTS_PROGRESS_PATH` on the pod's launcher port (the launcher starts
only after it), which the operator reads into `FillProgress`: engine pods never get API
access to report it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hybridserving.api.v1alpha1 import WEIGHTS_ERROR_DETAIL, WEIGHTS_ERRORS_KEPT, HybridServingSpec
from hybridserving.api.weights import WeightsSpec
from hybridserving.contract import ENV_LAUNCHER_PORT
from hybridserving.core.layout import LayoutIssue

MOUNT_PATH = "/models/weights"
VOLUME = "weights"
FILL_CONTAINER = "weights"
FILL_COMMAND = ("hybridserving-weights",)
TOKEN_ENV = "HF_TOKEN"
COPY_ENV = "HYBRIDSERVING_WEIGHTS_DIR"
# A hub commit: the only revision that names the same files on every node at every time.
COMMIT = re.compile(r"[0-9a-f]{40}")
# Init container termination messages carry the fill's outcome (bytes, files, downloaded).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def cache_key(weights: WeightsSpec) -> str:
    """The node-cache directory of one repository at one revision (readable, collision-free)."""
    repo = weights.location.replace("/", "--")
    revision = weights.revision or "main"
    suffix = hashlib.sha256(f"{weights.location}@{revision}".encode()).hexdigest()[:8]
    return f"{repo}--{revision.replace('/', '--')}--{suffix}"


def copy_directory(weights: WeightsSpec) -> str:
    """Where the fill step sees the copy of `weights` (the node cache is mounted at /cache)."""
    return f"/cache/{cache_key(weights)}"


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


def render(spec: HybridServingSpec, progress_port: int) -> PodWeights:
    """The weights' part of an engine pod; a fill step serves its progress on `progress_port`."""
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
            {"name": COPY_ENV, "value": copy_directory(w)},
            {"name": ENV_LAUNCHER_PORT, "value": str(progress_port)},
            *_hub_env(w),
        ],
        "volumeMounts": [{"name": VOLUME, "mountPath": "/cache"}],
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    return PodWeights([volume], [{**mount, "subPath": key}], [], [fill])


def volume_kept(pod: Mapping[str, Any]) -> bool:
    """Whether a pod, as the apiserver stores it, still has its weights volume.

    An apiserver whose ImageVolume feature gate is off drops image volumes and their mounts
    from new pods without an error (kubernetes pkg/api/pod/util.go, dropImageVolumes); such a
    pod would run its engine with no weights.
    """
    return any(v.get("name") == VOLUME for v in (pod.get("spec") or {}).get("volumes") or [])


def volume_dropped_message(w: WeightsSpec) -> str:
    """What to tell the fleet's owner when the cluster drops the image volume of `w`."""
    return (f"spec.model.weights.uri {w.uri}: the apiserver drops image volumes (its ImageVolume feature gate is "
            "off), so engines would start without their weights; no engine pod is created. Fix: enable the "
            "ImageVolume feature gate on kube-apiserver and the kubelets (on by default from Kubernetes 1.35; "
            "nodes need a runtime that mounts images: containerd 2.1+ or CRI-O 1.31+), or serve the weights "
            "from pvc:// or hf:// with cache: Node")


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
    if w.scheme == "hf" and w.cache == "Node" and not COMMIT.fullmatch(w.revision or ""):
        issues.append(LayoutIssue(
            path="spec.model.weights.revision", rule="weights-revision-unpinned", severity="warning",
            message=f"revision {w.revision or 'main'} can name another commit tomorrow: each node keeps the commit "
            "it filled first, so nodes filled on different days run different weights",
            fix="set spec.model.weights.revision to a 40-character commit hash",
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
        if "running" in state:  # a retry under way, whatever the attempt before it said
            return "Filling", ""
        if "terminated" in state:
            term = state["terminated"]
            if term.get("exitCode") == 0:
                return "Filled", term.get("message") or ""
            return "Failed", term.get("message") or term.get("reason") or f"exit code {term.get('exitCode')}"
        if "terminated" in last and last["terminated"].get("exitCode") not in (0, None):
            return "Failed", last["terminated"].get("message") or last["terminated"].get("reason") or "failed"
        return "Filling", ""
    return None


def fill_copy(pod: Mapping[str, Any]) -> str | None:
    """Which node-cache copy a pod's fill step fills (its directory), or None without one."""
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") == FILL_CONTAINER:
            return next((str(e.get("value", "")) for e in container.get("env") or []
                         if e.get("name") == COPY_ENV), None)
    return None


def progress_address(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """(pod IP, port) where the pod's fill step serves its progress while it runs, else None.

    Only a running step serves it (one waiting to retry or not yet started has nothing there),
    and only one whose container names the port (pods rendered before it did are never asked).
    """
    ip = (pod.get("status") or {}).get("podIP")
    running = any(s.get("name") == FILL_CONTAINER and "running" in (s.get("state") or {})
                  for s in (pod.get("status") or {}).get("initContainerStatuses") or [])
    if not ip or not running:
        return None
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") != FILL_CONTAINER:
            continue
        port = next((str(e.get("value", "")) for e in container.get("env") or []
                     if e.get("name") == ENV_LAUNCHER_PORT), "")
        return (ip, int(port)) if port.isdigit() else None
    return None


@dataclass(frozen=True)
class FillProgress:
    """What a running fill step said of its download: bytes so far and, when the hub listed every
    file's size, the total."""

    bytes_done: int
    bytes_total: int | None = None

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> FillProgress | None:
        """The figures of a progress document, or None when they are not figures (a document from
        something else on that port is no progress)."""
        done, total = doc.get("bytesDone"), doc.get("bytesTotal")
        if type(done) is not int or done < 0:
            return None
        if total is not None and (type(total) is not int or total < done):
            return None
        return cls(done, total)


def summarize(w: WeightsSpec, pods: Iterable[Any], progress: Mapping[str, FillProgress] | None = None
              ) -> dict[str, Any]:
    """Status of the weights across nodes: how many have them, how many fill, bytes, errors.

    A node counts once, by its best outcome (a node where one pod filled the cache has the
    weights even if another pod's earlier attempt failed). Only pods that fill the copy `w`
    names count: a pod of an earlier revision that filled its own copy, or one on its way out,
    says nothing of this one. Sources mounted from a volume are ready where a pod runs; their
    readiness shows in the pods' own status. `commits` counts the commits the ready nodes' copies
    hold: more than one (a branch that moved between their fills) means engines run different weights.

    `progress` (by pod name) is what running fill steps said. The fleet's `bytesDone` /
    `bytesTotal` add up the nodes whose figure is known: a node with the weights holds one
    copy, a filling node what its step reported (the furthest, when several of its pods
    report the one download they share) out of the copy's size. A filling node that did not
    answer is left out of both, so the ratio stays right; with no figure at all both are None.
    The copy's size comes from a finished fill, else the hub's listing, else `sizeBytes`.
    """
    progress = progress or {}
    per_node: dict[str, tuple[str, str]] = {}
    reported: dict[str, FillProgress] = {}
    rank = {"Filled": 2, "Filling": 1, "Failed": 0}
    copy = copy_directory(w)
    for pod in pods:
        if pod.weights_fill is None or not pod.node_name or pod.deleting or pod.weights_copy != copy:
            continue
        best = per_node.get(pod.node_name)
        if best is None or rank[pod.weights_fill[0]] > rank[best[0]]:
            per_node[pod.node_name] = pod.weights_fill
        said = progress.get(pod.name)
        if said is not None and (pod.node_name not in reported
                                 or said.bytes_done > reported[pod.node_name].bytes_done):
            reported[pod.node_name] = said
    filled = [detail for state, detail in per_node.values() if state == "Filled"]
    size = 0
    commits: set[str] = set()
    for state, detail in per_node.values():
        if state != "Filled":
            continue
        try:
            done = json.loads(detail)
            size = max(size, int(done.get("bytes", 0)))
        except (ValueError, AttributeError, TypeError):
            continue
        if isinstance(done.get("commit"), str):
            commits.add(done["commit"])
    filling = {node: reported[node] for node, (state, _) in per_node.items()
               if state == "Filling" and node in reported}
    whole = size or max((p.bytes_total for p in filling.values() if p.bytes_total is not None),
                       default=w.size_bytes or 0)
    bytes_done = bytes_total = None
    if whole and (filled or filling):
        bytes_done = whole * len(filled) + sum(min(p.bytes_done, whole) for p in filling.values())
        bytes_total = whole * (len(filled) + len(filling))
    failures = sorted({f"{node}: {detail[:WEIGHTS_ERROR_DETAIL]}"
                       for node, (state, detail) in per_node.items() if state == "Failed"})
    return {
        "source": w.uri,
        "cache": w.cache,
        "nodesReady": len(filled),
        "nodesFilling": sum(1 for state, _ in per_node.values() if state == "Filling"),
        "nodesFailed": len(failures),
        "commits": len(commits),
        "bytes": size,
        "bytesDone": bytes_done,
        "bytesTotal": bytes_total,
        "errors": failures[:WEIGHTS_ERRORS_KEPT],
    }
