"""The one in-memory apiserver of the unit tests, and the cluster around it.

`MemoryApi` has the same methods as `controller.kube.Kube` and the apiserver's semantics that
the operator relies on: merge patches, resourceVersion and uid preconditions, AlreadyExists,
the status subresource, generation bumped by spec writes. Its `fail` hook injects HTTP errors
into chosen writes; `down` makes every call fail as a refused connection does. It is a mock of
the Kubernetes API for fault injection only: the real apiserver is exercised by
tests/integration.

`FakeCluster` is that apiserver plus just enough scheduler, kubelet and garbage collector for
the planner: it applies the planner's actions, places pods by GPU capacity, host ports and
NVLink-domain affinity, turns them Running then Ready, deletes pods gracefully and collects
objects whose owners are gone.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND, ROLES, HybridServing
from hybridserving.controller.kube import KubeError
from hybridserving.core import health, planner
from hybridserving.core.actions import Action
from hybridserving.core.naming import LABEL_NAME
from hybridserving.core.observed import Observed
from support.patches import apply_merge_patch

NS = "serving"
GPUS = 8
NODES_PER_DOMAIN = 2


def drop_image_volumes(pod_spec: dict[str, Any]) -> None:
    """What kube-apiserver does to a new pod while the ImageVolume feature gate is off: the image
    volumes and every mount of them go, silently (pkg/api/pod/util.go, dropImageVolumes)."""
    names = {v["name"] for v in pod_spec.get("volumes") or [] if "image" in v}
    pod_spec["volumes"] = [v for v in pod_spec.get("volumes") or [] if v["name"] not in names]
    for c in [*(pod_spec.get("containers") or []), *(pod_spec.get("initContainers") or [])]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m["name"] not in names]


class MemoryApi:
    """An in-memory stand-in for `Kube`, with fault injection."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.counter = itertools.count(1)
        self.writes: Counter[tuple[str, str]] = Counter()
        self.fail: Callable[[str, str, str], int | None] = lambda verb, kind, name: None
        self.down = False
        self.image_volumes = True  # False: the ImageVolume feature gate is off (see drop_image_volumes)

    def _check(self, verb: str, kind: str, name: str) -> None:
        if self.down:
            raise KubeError(0, "connection refused")
        status = self.fail(verb, kind, name)
        if status:
            raise KubeError(status, f"injected {status}")

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        if self.down:
            raise KubeError(0, "connection refused")
        obj = self.store.get((kind, name))
        if obj is None:
            raise KubeError(404, "not found")
        return copy.deepcopy(obj)

    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o) for (k, _), o in sorted(self.store.items())
            if k == kind and all(o["metadata"].get("labels", {}).get(a) == b for a, b in labels.items())
        ]

    def create(self, kind: str, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        meta = body["metadata"]
        name = meta.get("name") or f"{meta['generateName']}{next(self.counter)}"
        self._check("create-dry-run" if dry_run else "create", kind, name)
        self.writes[("create-dry-run" if dry_run else "create", kind)] += 1
        if (kind, name) in self.store:
            raise KubeError(409, "already exists")
        obj = copy.deepcopy(body)
        obj["kind"] = kind
        obj["metadata"].update(name=name, uid=f"uid-{next(self.counter)}", resourceVersion=str(next(self.counter)),
                               generation=1)
        if kind == "Pod" and not self.image_volumes:
            drop_image_volumes(obj["spec"])
        if not dry_run:
            self.store[(kind, name)] = obj
        return copy.deepcopy(obj)

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *,
              resource_version: str | None = None, uid: str | None = None,
              subresource: str | None = None) -> dict[str, Any]:
        self._check("patch", kind, name)
        self.writes[("patch" if not subresource else f"patch-{subresource}", kind)] += 1
        obj = self.store.get((kind, name))
        if obj is None:
            raise KubeError(404, "not found")
        if resource_version and obj["metadata"]["resourceVersion"] != resource_version:
            raise KubeError(409, "the object has been modified")
        if uid and obj["metadata"]["uid"] != uid:
            raise KubeError(409, "uid precondition failed")
        if subresource == "status":
            apply_merge_patch(obj, {"status": body["status"]})
        else:
            body = {k: v for k, v in body.items() if k != "status"}
            if "spec" in body:
                obj["metadata"]["generation"] += 1
            obj["metadata"]["resourceVersion"] = str(next(self.counter))
            apply_merge_patch(obj, body)
        obj["metadata"]["resourceVersion"] = str(next(self.counter))
        return copy.deepcopy(obj)

    def server_side_apply(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        """Server-side apply without force: 409 on an object another manager wrote."""
        name = body["metadata"]["name"]
        self._check("apply", kind, name)
        self.writes[("apply", kind)] += 1
        obj = self.store.get((kind, name))
        if obj is not None and not obj["metadata"].get("applied"):
            raise KubeError(409, "Apply failed with 1 conflict")
        obj = copy.deepcopy(body)
        obj["metadata"].update(uid=f"uid-{next(self.counter)}", resourceVersion=str(next(self.counter)), applied=True)
        self.store[(kind, name)] = obj

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> None:
        self._check("delete", kind, name)
        self.writes[("delete", kind)] += 1
        obj = self.store.get((kind, name))
        if obj is None or (uid and obj["metadata"]["uid"] != uid):
            return
        if resource_version and obj["metadata"].get("resourceVersion") != resource_version:
            raise KubeError(409, "the object has been modified")
        del self.store[(kind, name)]

    # -- playing kubelet and user
    def run_pods(self) -> None:
        for (kind, _), obj in self.store.items():
            if kind == "Pod":
                obj["spec"]["nodeName"] = "node-0"
                obj["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self._ready_routers()

    def _ready_routers(self) -> None:
        """A router Deployment is ready as smg is: with a ready leader of each role among the pods
        its selectors pick (`--prefill-selector` / `--decode-selector`), a step after they are."""
        for (kind, _), deployment in self.store.items():
            if kind != "Deployment":
                continue
            args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            roles = set()
            for flag in ("--prefill-selector", "--decode-selector"):
                at = args.index(flag) + 1
                terms = []
                while at < len(args) and not args[at].startswith("--"):
                    terms.append(args[at].split("=", 1))
                    at += 1
                for (pod_kind, _), pod in self.store.items():
                    if pod_kind != "Pod":
                        continue
                    labels = pod["metadata"].get("labels") or {}
                    ready = any(c["type"] == "Ready" and c["status"] == "True"
                                for c in (pod.get("status") or {}).get("conditions") or [])
                    if ready and not pod["metadata"].get("deletionTimestamp") and all(
                            labels.get(k) == v for k, v in terms):
                        roles.add(flag)
            # smg health-checks a new worker before using it, and the readiness probe runs
            # periodically: a router turns ready a step after its pair does.
            seen = deployment["_pair_seen"] = deployment.get("_pair_seen", 0) + 1 if len(roles) == 2 else 0
            serving = deployment["spec"]["replicas"] if seen > 1 else 0
            deployment["status"] = {"readyReplicas": serving, "availableReplicas": serving}

    def user_apply(self, spec: dict[str, Any], name: str = "fleet") -> None:
        key = (KIND, name)
        if key in self.store:
            obj = self.store[key]
            obj["spec"] = copy.deepcopy(spec)
            obj["metadata"]["generation"] += 1
            obj["metadata"]["resourceVersion"] = str(next(self.counter))
        else:
            self.store[key] = {
                "apiVersion": "hybridserving.io/v1alpha1", "kind": KIND,
                "metadata": {"name": name, "namespace": NS, "uid": "hs-uid", "generation": 1,
                             "resourceVersion": "1"},
                "spec": copy.deepcopy(spec),
            }

    def children(self) -> set[tuple[str, str]]:
        return {k for k, o in self.store.items() if o["metadata"].get("labels", {}).get(LABEL_NAME) == "fleet"}

    def status(self) -> dict[str, Any]:
        return self.store[(KIND, "fleet")].get("status") or {}

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == type_)


class FakeCluster(MemoryApi):
    """Just enough apiserver, scheduler, kubelet and garbage collector for the planner."""

    def __init__(self, nodes: int = 16, ready_after: int = 1, step_seconds: float | None = None) -> None:
        """`step_seconds`: each `advance` is that much time, pods carry when they turned Ready and
        the planner reads the time (minReadySeconds); None: no time passes, readiness is timeless."""
        super().__init__()
        self.step_seconds = step_seconds
        self.clock = 1_000_000.0
        self.nodes: dict[str, dict[str, Any]] = {
            f"node-{i}": {"domain": f"nvl-{i // NODES_PER_DOMAIN}", "gpus": GPUS} for i in range(nodes)
        }
        self.ready_after = ready_after
        self.pod_uids_seen: dict[str, list[str]] = {}

    # -- apiserver: pods start Pending and are deleted gracefully, as on a node
    def create(self, kind: str, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        created = super().create(kind, namespace, body, dry_run=dry_run)
        if kind == "Pod" and not dry_run:
            name, uid = created["metadata"]["name"], created["metadata"]["uid"]
            self.store[(kind, name)]["status"] = {"phase": "Pending"}
            self.store[(kind, name)]["_age"] = 0
            self.pod_uids_seen.setdefault(name, []).append(uid)
        return created

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> None:
        obj = self.store.get((kind, name))
        # Pods terminate gracefully; the operator deletes router Deployments in the foreground, so
        # they stay, marked, while their pods terminate. Both are gone at the next `advance`.
        if kind in ("Pod", "Deployment") and obj is not None and not (uid and obj["metadata"]["uid"] != uid):
            self._check("delete", kind, name)
            self.writes[("delete", kind)] += 1
            obj["metadata"]["deletionTimestamp"] = "now"
            return
        super().delete(kind, namespace, name, uid=uid, resource_version=resource_version)

    def apply(self, action: Action) -> None:
        """One planner action, as the operator's reconcile writes it; a 409 or 404 raises `KubeError`."""
        if action.verb == "create":
            assert action.body is not None
            self.create(action.kind, NS, action.body)
        elif action.verb == "patch":
            self.patch(action.kind, NS, action.name, action.body or {},
                       resource_version=action.resource_version, uid=action.uid)
        else:
            self.delete(action.kind, NS, action.name, uid=action.uid, resource_version=action.resource_version)

    def observed(self) -> Observed:
        pods = [o for (k, _), o in self.store.items() if k == "Pod"]
        insts = [o for (k, _), o in self.store.items() if k == INSTANCE_KIND]
        others = [o for (k, _), o in self.store.items() if k not in ("Pod", INSTANCE_KIND)]
        return Observed.from_manifests(insts, pods, others,
                                       now=self.clock if self.step_seconds is not None else None)

    def reconcile(self, hs: HybridServing, limit: int | None = None) -> list[Action]:
        """One operator pass; `limit` stops it after that many writes (a crash)."""
        actions = planner.diff(planner.plan(hs, self.observed()), self.observed())
        for action in actions[: len(actions) if limit is None else limit]:
            self.apply(action)
        return actions

    # -- scheduler, kubelet, garbage collector
    def used(self, node: str) -> tuple[int, set[int]]:
        gpus, host_ports = 0, set()
        for (kind, _), pod in self.store.items():
            if kind == "Pod" and pod["spec"].get("nodeName") == node:
                c = pod["spec"]["containers"][0]
                gpus += int(c["resources"]["limits"]["nvidia.com/gpu"])
                host_ports |= {p["hostPort"] for p in c["ports"] if "hostPort" in p}
        return gpus, host_ports

    def fits(self, pod: dict[str, Any], node: str) -> bool:
        c = pod["spec"]["containers"][0]
        gpus, taken = self.used(node)
        if gpus + int(c["resources"]["limits"]["nvidia.com/gpu"]) > self.nodes[node]["gpus"]:
            return False
        if {p["hostPort"] for p in c["ports"] if "hostPort" in p} & taken:
            return False
        for term in pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]:
            if term["topologyKey"] != "hybridserving.io/nvlink-domain":
                continue  # one fabric here
            match = term["labelSelector"]["matchLabels"]
            peers = [
                o for (k, _), o in self.store.items()
                if k == "Pod" and o["spec"].get("nodeName")
                and all(o["metadata"]["labels"].get(a) == b for a, b in match.items())
            ]
            if not peers or self.nodes[peers[0]["spec"]["nodeName"]]["domain"] != self.nodes[node]["domain"]:
                return False
        return True

    def advance(self) -> None:
        for key, obj in list(self.store.items()):
            if key[0] in ("Pod", "Deployment") and obj["metadata"].get("deletionTimestamp"):
                del self.store[key]
        owners = {o["metadata"]["uid"] for o in self.store.values()} | {"hs-uid"}
        for key, obj in list(self.store.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and not {r["uid"] for r in refs} & owners:
                del self.store[key]
        for key, pod in sorted(self.store.items()):
            if key[0] != "Pod":
                continue
            status = pod["status"]
            if not pod["spec"].get("nodeName"):
                node = next((n for n in sorted(self.nodes, key=lambda n: int(n.split("-")[1]))
                             if self.fits(pod, n)), None)
                if node is None:
                    status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                             "reason": "Unschedulable", "message": "0/16 nodes are available"}]
                    continue
                pod["spec"]["nodeName"] = node
                status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                continue
            pod["_age"] += 1
            status["phase"] = "Running"
            if pod["_age"] >= self.ready_after and not any(
                    c["type"] == "Ready" for c in status.get("conditions") or []):
                ready: dict[str, Any] = {"type": "Ready", "status": "True"}
                if self.step_seconds is not None:
                    ready["lastTransitionTime"] = dt.datetime.fromtimestamp(
                        self.clock, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                status["conditions"] = [{"type": "PodScheduled", "status": "True"}, ready]
        self._ready_routers()
        if self.step_seconds is not None:
            self.clock += self.step_seconds

    # -- reading the fleet
    def pods(self) -> dict[str, dict[str, Any]]:
        return {name: o for (k, name), o in self.store.items() if k == "Pod"}

    def instances(self) -> dict[str, dict[str, Any]]:
        return {name: o for (k, name), o in self.store.items() if k == INSTANCE_KIND}

    def unavailable(self, hs: HybridServing) -> dict[str, int]:
        desired = planner.plan(hs, self.observed())
        views = health.view(desired, self.observed())
        out: dict[str, int] = {role: 0 for role in ROLES}
        for v in views.values():
            if not v.settled:  # available, and for minReadySeconds where time passes
                out[v.plan.role] += 1
        return out
