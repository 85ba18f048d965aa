"""The operator's only door to the Kubernetes API.

Every read and write the reconcile makes goes through `Kube`, by kind name, as plain JSON
dicts (the same shapes the planner builds and reads). Keeping it in one place lets the unit
tests inject faults (409s, 500s) without a cluster and lets the benchmarks count reads and writes.
Writes are JSON merge patches carrying preconditions (resourceVersion or uid), so a stale
read turns into a 409 and a retry instead of overwriting someone else's change. With leader
election every write first passes the replica's fence (`leadership.Leadership.fence`), so a
replica that may no longer lead sends none.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from hybridserving.api.v1alpha1 import GROUP, INSTANCE_KIND, INSTANCE_PLURAL, KIND, PLURAL, VERSION
from hybridserving.controller import metrics

FIELD_MANAGER = "hybridserving-operator"
Objects = list[dict[str, Any]]  # as read: JSON objects of one kind
REQUEST_TIMEOUT = 30.0
"""Seconds one API call may wait on the connection and on each read; the Lease's calls wait less
(leadership.Election.request_timeout_seconds)."""


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path; `namespace` None for a cluster-scoped kind."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        path = f"{base}/{self.plural}" if namespace is None else f"{base}/namespaces/{quote(namespace)}/{self.plural}"
        if name is not None:
            path += f"/{quote(name)}"
        if subresource:
            path += f"/{subresource}"
        return path


RESOURCES: dict[str, Resource] = {
    KIND: Resource(GROUP, VERSION, PLURAL),
    INSTANCE_KIND: Resource(GROUP, VERSION, INSTANCE_PLURAL),
    "Pod": Resource("", "v1", "pods"),
    "Service": Resource("", "v1", "services"),
    "ConfigMap": Resource("", "v1", "configmaps"),
    "ServiceAccount": Resource("", "v1", "serviceaccounts"),
    "Event": Resource("", "v1", "events"),
    "Deployment": Resource("apps", "v1", "deployments"),
    "ControllerRevision": Resource("apps", "v1", "controllerrevisions"),
    "PodDisruptionBudget": Resource("policy", "v1", "poddisruptionbudgets"),
    "NetworkPolicy": Resource("networking.k8s.io", "v1", "networkpolicies"),
    "Role": Resource("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": Resource("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "Secret": Resource("", "v1", "secrets"),  # written, never read (reconcile.write_engine_key)
    "Lease": Resource("coordination.k8s.io", "v1", "leases"),  # leader election (leadership.py)
    "Workload": Resource("scheduling.k8s.io", "v1alpha1", "workloads"),
    # Cluster-scoped, read only by name to compare schema digests (crdcheck.py).
    "CustomResourceDefinition": Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
}

# Kinds the operator owns besides instances and pods, observed on every reconcile.
OWNED_KINDS = ("ConfigMap", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceAccount", "Role", "RoleBinding",
               "Deployment", "ControllerRevision")


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 when no response came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def conflict(self) -> bool:
        """A stale read or a race (409), or the object went away meanwhile (404): retry, not an error."""
        return self.status in (404, 409)


class Fenced(Exception):
    """A write refused before it was sent: this replica can no longer be sure it leads. Not a
    KubeError, so no caller takes it for a conflict to retry."""


Fence = Callable[[], None]
"""Called before every write; raises `Fenced` to refuse it."""


class FencedRetry(Retry):
    """urllib3's own retries, which ask the fence again before they resend a write. The pool
    resends a PUT or DELETE whose reply timed out, and any call whose connection failed, without
    coming back through `Kube._call`: a replica that froze while a write was in flight would
    otherwise send it again on waking, past its deadline."""

    def __init__(self, *args: Any, fence: Fence | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fence = fence

    def __deepcopy__(self, memo: dict[int, Any]) -> FencedRetry:
        return self.new()  # a copied configuration keeps the replica's one fence, not a copy of it

    def new(self, **kw: Any) -> FencedRetry:
        retry = super().new(**kw)
        retry.fence = self.fence
        return retry

    def increment(self, method: str | None = None, *args: Any, **kw: Any) -> FencedRetry:
        if method != "GET" and self.fence is not None:
            self.fence()
        return super().increment(method, *args, **kw)


def describe_failure(exc: Exception) -> str:
    """An exception as status may name it: an API error as the apiserver said it, anything else
    with its type (the traceback is in the operator's log)."""
    return str(exc) if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"


def _retries_fenced_by(retries: object, fence: Fence) -> bool:
    return isinstance(retries, FencedRetry) and retries.fence == fence


class Kube:
    """Typed-by-kind JSON access to the API, with a count of reads and writes by (verb, kind).

    `component` names the part of the operator that reads through this instance (the
    `hybridserving_api_reads_total` label); `sibling` gives another part its own count over
    the same connection pool. `request_timeout` bounds each call's connect and each read. `fence`,
    where several replicas elect a leader, is asked before every write and before each resend of
    one (on a pool of its own, whose retries are a `FencedRetry`), and its siblings share it.
    """

    def __init__(self, api_client: client.ApiClient, component: str = "reconcile", *,
                 request_timeout: float = REQUEST_TIMEOUT, fence: Fence | None = None) -> None:
        if fence is not None and not _retries_fenced_by(api_client.configuration.retries, fence):
            configuration = copy.deepcopy(api_client.configuration)
            configuration.retries = FencedRetry(Retry.DEFAULT.total, fence=fence)
            api_client = client.ApiClient(configuration=configuration)
        self.api = api_client
        self.component = component
        self.request_timeout = request_timeout
        self.fence = fence
        self.writes: Counter[tuple[str, str]] = Counter()
        self.reads: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def sibling(self, component: str) -> Kube:
        """The same API access, counted as `component`'s."""
        return Kube(self.api, component, request_timeout=self.request_timeout, fence=self.fence)

    def unretried(self, component: str, *, request_timeout: float) -> Kube:
        """The same credentials on a pool of its own that never retries: urllib3 otherwise tries a
        GET that timed out three more times, so a call would end only after four timeouts, where the
        Lease's calls must end within one to leave the renew deadline its margin. Unfenced: the
        Lease's own calls are how a replica comes to lead."""
        configuration = copy.deepcopy(self.api.configuration)
        configuration.retries = False
        return Kube(client.ApiClient(configuration=configuration), component, request_timeout=request_timeout)

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, pool_size: int = 16) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig."""
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = pool_size
        return cls(client.ApiClient(configuration=cfg))

    # -- transport

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        if method != "GET" and self.fence is not None:
            self.fence()  # at the last moment before sending: a replica frozen until now sends nothing
        url_path = path + (("?" + urlencode(query)) if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            params = self.api.param_serialize(
                method=method, resource_path=url_path, header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*params, _request_timeout=self.request_timeout)
            data = response.read()
        except Fenced:  # a resend refused by the pool's FencedRetry
            raise
        except ApiException as exc:
            raise KubeError(exc.status or 0, str(exc.reason)) from exc
        except Exception as exc:  # urllib3 transport errors: connection refused, timeouts
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from exc
        if response.status >= 400:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data.decode(errors="replace")[:500]
            raise KubeError(response.status, message)
        return json.loads(data) if data else {}

    def _count(self, verb: str, kind: str) -> None:
        with self._lock:
            self.writes[(verb, kind)] += 1

    def _count_read(self, verb: str, kind: str) -> None:
        with self._lock:
            self.reads[(verb, kind)] += 1
        metrics.API_READS.labels(self.component, verb, kind).inc()

    # -- reads

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        self._count_read("get", kind)
        return self._call("GET", RESOURCES[kind].path(namespace, name))

    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return self.list_versioned(kind, namespace, labels)[0]

    def list_versioned(self, kind: str, namespace: str, labels: dict[str, str]) -> tuple[Objects, str | None]:
        """The objects and the list's resourceVersion (the state they were read at)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        self._count_read("list", kind)
        result = self._call("GET", RESOURCES[kind].path(namespace), query={"labelSelector": selector})
        items = result.get("items") or []
        for item in items:  # lists leave out kind and apiVersion on their items
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", result.get("apiVersion", ""))
        return items, (result.get("metadata") or {}).get("resourceVersion")

    def list_cluster_named(self, kind: str, name: str) -> Objects:
        """The cluster-scoped object `name` of `kind`, as a list of none or one: a LIST with a field
        selector, which a role granting `list` without `get` allows."""
        self._count_read("list", kind)
        result = self._call("GET", RESOURCES[kind].path(None), query={"fieldSelector": f"metadata.name={name}"})
        return list(result.get("items") or [])

    # -- writes

    def create(self, kind: str, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create `body`; with `dry_run`, only the object as the apiserver would store it (defaulted,
        admitted, fields of disabled features dropped), nothing written."""
        self._count("create-dry-run" if dry_run else "create", kind)
        query = {"fieldManager": FIELD_MANAGER, **({"dryRun": "All"} if dry_run else {})}
        return self._call("POST", RESOURCES[kind].path(namespace), query=query, body=body)

    def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        body: dict[str, Any],
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch; `resource_version`/`uid` make it conditional (409 when stale)."""
        body = json.loads(json.dumps(body))
        meta = body.setdefault("metadata", {})
        if resource_version:
            meta["resourceVersion"] = resource_version
        if uid:
            meta["uid"] = uid
        if not meta:
            del body["metadata"]
        self._count("patch" if not subresource else f"patch-{subresource}", kind)
        return self._call(
            "PATCH",
            RESOURCES[kind].path(namespace, name, subresource),
            query={"fieldManager": FIELD_MANAGER},
            body=body,
            content_type="application/merge-patch+json",
        )

    def server_side_apply(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        """A server-side apply without force: creates or updates what this operator set, and fails
        with 409 where another manager set the same fields (an object that is not the operator's).
        The answer is dropped, so a Secret's data is never held."""
        self._count("apply", kind)
        self._call("PATCH", RESOURCES[kind].path(namespace, body["metadata"]["name"]),
                   query={"fieldManager": FIELD_MANAGER}, body=body, content_type="application/apply-patch+yaml")

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> None:
        """Delete, the garbage collector taking the dependents; 404 is done. With `resource_version`,
        only the object as read: one changed since (a role switch started on it) is a 409.

        A router Deployment goes in the foreground: it stays, marked for deletion, until its pods
        are gone, so the rollout can see that a retired router still takes requests through its
        preStop window (`core.router.PRESTOP_SECONDS`) and keep the pair it routes to until then.
        Everything else goes in the background.
        """
        body: dict[str, Any] = {"propagationPolicy": "Foreground" if kind == "Deployment" else "Background"}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        self._count("delete", kind)
        try:
            self._call("DELETE", RESOURCES[kind].path(namespace, name), body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise
