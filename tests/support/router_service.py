"""The fleet's router Service as kube-proxy serves it, for the e2e tests.

The pod runner runs the router pods the operator's router Deployments create (`smg`, at their pod
IPs, its readiness probe writing their Ready condition). The local cluster has no kube-proxy, and
its EndpointSlices stay empty (the API refuses the loopback addresses kwok gives pods), so this
plays both: the Service's endpoints are the pods its selector picks that are Ready and not
terminating, as the EndpointSlice controller counts them, read twice a second, and each request
goes to one of them at random. It also audits what each router routes between: every worker a
ready router lists must be a pod of the router's own pairing key.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hybridserving.contract import bearer
from hybridserving.core import enginekey
from hybridserving.core.naming import LABEL_PAIRING, router_name
from hybridserving.devcluster import Cluster
from hybridserving.devcluster.stack import secret_value

NOWHERE = "http://127.0.0.1:9"  # what a client of a Service without ready endpoints meets: refused


@dataclass(frozen=True)
class Endpoint:
    pod: str
    url: str
    key: str


@dataclass
class Audit:
    """Foreign: a worker of another key listed in three samples in a row (a second and more).
    Momentary: listed once or twice, the moment between a pod's deletion reaching the router and
    a new pod of another key taking its freed address (not yet serving there)."""

    samples: int = 0
    workers_seen: int = 0
    foreign: list[str] = field(default_factory=list)
    momentary: int = 0
    draining: list[str] = field(default_factory=list)  # of another key, but smg sends it nothing new
    streaks: dict[tuple[str, str, str], int] = field(default_factory=dict)


class RouterService:
    """One address in front of the fleet's ready router pods."""

    def __init__(self, cluster: Cluster, namespace: str, fleet: str) -> None:
        self.cluster, self.namespace, self.fleet = cluster, namespace, fleet
        self.headers = bearer(secret_value(cluster, namespace, enginekey.secret_name(fleet), enginekey.SECRET_KEY))
        self.ready: list[Endpoint] = []
        self.picks: Counter[str] = Counter()  # requests sent, by the pairing key of the router taking them
        self.no_router: Counter[int] = Counter()  # requests that found no ready endpoint, by second
        self.events: list[str] = []  # the ready endpoints as they changed, by time
        self.audit = Audit()
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """A ready router, picked per request; none ready: an address that refuses."""
        with self.lock:
            if not self.ready:
                self.no_router[int(time.monotonic() - self.started)] += 1
                return NOWHERE
            chosen = random.choice(self.ready)
            self.picks[chosen.key] += 1
            return chosen.url

    def ready_keys(self) -> set[str]:
        with self.lock:
            return {e.key for e in self.ready}

    def serving(self) -> bool:
        """Whether every ready endpoint's router says it is ready itself now (its pod's Ready
        condition is the pod runner's last probe, up to a probe period old)."""
        with self.lock:
            ready = list(self.ready)
        try:
            return bool(ready) and all(urllib.request.urlopen(e.url + "/readiness", timeout=2).status == 200
                                       for e in ready)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _get(self, *what: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.cluster.kubectl("-n", self.namespace, "get", *what, "-o", "json").stdout)
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self._get("pods", "-l", f"hybridserving.io/name={self.fleet}")["items"]
                self._sync(pods)
                self._audit(pods)
            except Exception as e:  # noqa: BLE001 - a read may fail while the cluster changes; try again
                print(f"router service: {type(e).__name__}: {e}")
            self._stop.wait(0.5)

    def _sync(self, pods: list[dict[str, Any]]) -> None:
        service = self._get("service", router_name(self.fleet))["spec"]
        port = next(p["targetPort"] for p in service["ports"] if p["name"] == "http")
        ready = []
        for p in pods:
            meta, status = p["metadata"], p.get("status") or {}
            selected = all(meta["labels"].get(k) == v for k, v in service["selector"].items())
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            if selected and conditions.get("Ready") == "True" and not meta.get("deletionTimestamp"):
                ready.append(Endpoint(meta["name"], f"http://{status['podIP']}:{port}",
                                      meta["labels"].get(LABEL_PAIRING, "")))
        ready.sort(key=lambda e: e.pod)
        with self.lock:
            changed = ready != self.ready
            self.ready = ready
        if changed:
            now = ", ".join(f"{e.pod} ({e.key})" for e in ready) or "none"
            self.events.append(f"{time.monotonic() - self.started:6.1f} s  ready routers: {now}")

    def _audit(self, pods: list[dict[str, Any]]) -> None:
        """Each ready router's workers, against the pods at their addresses now (an address no pod
        holds any more is stale, not foreign: smg drops it on its next health check)."""
        by_ip = {(p.get("status") or {}).get("podIP"): p for p in pods
                 if p["metadata"]["labels"].get("hybridserving.io/component") == "engine"}
        for e in list(self.ready):
            request = urllib.request.Request(e.url + "/workers", headers=self.headers)
            try:
                with urllib.request.urlopen(request, timeout=2) as resp:
                    workers = json.load(resp).get("workers", [])
            except (urllib.error.URLError, OSError, ValueError):
                continue
            self.audit.samples += 1
            listed = set()
            for w in workers:
                self.audit.workers_seen += 1
                host = w["url"].split("://", 1)[-1].rsplit(":", 1)[0]
                pod = by_ip.get(host)
                if pod is not None and pod["metadata"]["labels"].get(LABEL_PAIRING) != e.key:
                    if "draining" in json.dumps(w).lower() or not w.get("is_healthy", True):
                        # smg drains a removed worker for 5 s before dropping it
                        # (workflow/steps/local/drain_workers.rs): listed, no new requests.
                        self.audit.draining.append(json.dumps(
                            {k: v for k, v in w.items() if isinstance(v, (str, bool, int)) and k != "id"}))
                        continue
                    at = (e.pod, w["url"], pod["metadata"]["uid"])
                    listed.add(at)
                    streak = self.audit.streaks[at] = self.audit.streaks.get(at, 0) + 1
                    if streak == 3:
                        self.audit.foreign.append(f"{e.pod} ({e.key}) lists {w['url']}, {pod['metadata']['name']} "
                                                  f"({pod['metadata']['labels'].get(LABEL_PAIRING)})")
            for at in [a for a in self.audit.streaks if a[0] == e.pod and a not in listed]:
                if self.audit.streaks.pop(at) < 3:
                    self.audit.momentary += 1
