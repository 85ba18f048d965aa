"""A switching fleet served end to end, for the e2e tests: its manifest, bringing it up behind the real
router and tearing it down, closed-loop client load whose every answer is checked, and a report of a
switch."""

from __future__ import annotations

import json
import pathlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import yaml

from hybridserving.devcluster import Cluster
from hybridserving.devcluster import stack
from hybridserving.devcluster.stack import Router
from support.polling import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = "deepseek-ai/DeepSeek-V3"
SHORT_PROMPT = "The quick brown fox jumps over the lazy dog. " * 90  # ~1,000 simulated tokens


def manifest(name: str, *, backend: str, time_scale: float, startup_seconds: float | None) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["prefill"]["replicas"] = 1
    spec["decode"]["replicas"] = 2
    spec["transfer"] = {"backend": backend}
    # A cooldown longer than any test: a quiet fleet returns to its declared split (1:2) a cooldown
    # after its last switch, which would be a second switch in tests that check the first.
    spec["roleSwitch"].update(cooldownSeconds=900, drainTimeoutSeconds=60, maxConcurrent=1)
    env = [
        {"name": "HYBRIDSERVING_SIM_PROFILE", "value": spec["model"]["profile"]},
        # The simulators run at the speed of the GPU the operator times the fleet on.
        {"name": "HYBRIDSERVING_SIM_GPU_TYPE", "value": spec["hardware"]["gpuType"]},
        {"name": "HYBRIDSERVING_SIM_TIME_SCALE", "value": str(time_scale)},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0.2"},
        {"name": "HYBRIDSERVING_RESTART_BACKOFF_S", "value": "0.5"},
    ]
    if startup_seconds is not None:
        env.append({"name": "HYBRIDSERVING_SIM_STARTUP_SECONDS", "value": str(startup_seconds)})
    spec["engine"] = {"env": env}
    return doc


class Load:
    """Closed-loop clients through the router; every answer is checked."""

    def __init__(self, router: Router, clients: int, prompt: str, max_tokens: int, name: str) -> None:
        self.router, self.prompt, self.max_tokens, self.name = router, prompt, max_tokens, name
        self.stop_event = threading.Event()
        self.sent = self.ok = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        with httpx.Client(timeout=300, trust_env=False, headers=self.router.headers) as client:
            while not self.stop_event.is_set():
                with self.lock:
                    self.sent += 1
                try:
                    resp = client.post(self.router.url + "/v1/completions",
                                       json={"model": MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens})
                    good = resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == self.max_tokens
                    error = "" if good else f"{resp.status_code}: {resp.text[:200]}"
                except Exception as e:  # noqa: BLE001 - every failure counts
                    good, error = False, f"{type(e).__name__}: {e}"
                with self.lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failures.append(error)

    def stop(self) -> Load:
        self.stop_event.set()
        for t in self.threads:
            t.join(330)
        return self

    def __str__(self) -> str:
        return f"{self.name}: {self.sent} sent, {self.ok} ok, {len(self.failures)} failed"


class FleetUnderTest:
    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.router: Router  # set by bring_up, once the operator rendered it

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.cluster.kubectl("-n", self.namespace, *args, "-o", "json").stdout)
        return out

    def leaders(self) -> dict[str, dict[str, Any]]:
        pods = self.kubectl_json("get", "pods", "-l", f"hybridserving.io/name={self.name},hybridserving.io/leader=true")
        return {p["metadata"]["labels"]["hybridserving.io/instance"]: p for p in pods["items"]
                if not p["metadata"].get("deletionTimestamp")}

    def router_workers(self) -> Counter[str]:
        workers = httpx.get(self.router.url + "/workers", headers=self.router.headers, timeout=5,
                            trust_env=False).json()["workers"]
        return Counter(w["worker_type"] for w in workers if w.get("is_healthy"))

    def serving(self, prefill: int, decode: int) -> bool:
        leaders = self.leaders()
        ready = [p for p in leaders.values()
                 if {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready") == "True"
                 and p["metadata"]["labels"].get("hybridserving.io/role")]
        return len(ready) == prefill + decode and self.router_workers() == Counter(prefill=prefill, decode=decode)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.kubectl_json("get", "hybridserving", self.name).get("status") or {}
        return status

    def finished_switch(self) -> dict[str, Any] | None:
        return next((s for s in self.status().get("switches", []) if s["outcome"] != "InProgress"), None)

    def events(self) -> list[dict[str, Any]]:
        items = self.kubectl_json("get", "events")["items"]
        return sorted((e for e in items if e["reason"].startswith("RoleSwitch") and e["reason"] != "RoleSwitch"),
                      key=lambda e: e["metadata"]["creationTimestamp"])


def bring_up(cluster: Cluster, router_fixture: Callable[[str, str], Router], namespace: str,
             doc: dict[str, Any], serving: tuple[int, int] | None = (1, 2)) -> FleetUnderTest:
    """Apply the fleet, start the router, and wait for `serving` (prefill, decode) leaders in it
    (None: a fleet whose size is the test's subject; the test waits for it)."""
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(doc))
    f = FleetUnderTest(cluster, namespace, doc["metadata"]["name"])
    wait_for(lambda: stack.router_deployments(cluster, namespace, f.name), 60, "the router Deployment")
    f.router = router_fixture(namespace, stack.router_deployments(cluster, namespace, f.name)[0])
    if serving is not None:
        wait_for(lambda: f.serving(*serving), 180,
                 f"{serving[0]} prefill and {serving[1]} decode leaders in the router")
    return f


def tear_down(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False, timeout=200)


def report(f: FleetUnderTest, switch: dict[str, Any], loads: list[Load]) -> None:
    print(f"\n[{f.namespace}] {switch['instance']} {switch['fromRole']} -> {switch['toRole']} ({switch['mode']}) "
          f"{switch['outcome']}; started {switch['started']} finished {switch['finished']}")
    print(f"  steps: {switch['phase']}")
    print(f"  reason: {switch['reason']}")
    for load in loads:
        print(f"  {load}")
    print("  events: " + ", ".join(e["reason"] for e in f.events()))
