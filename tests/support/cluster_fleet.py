"""A fleet on a real control plane, for integration tests: the operator as its own process (restartable,
killable, as in a pod) and one HybridServing in one namespace with ways to look at what the operator
made of it."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from hybridserving.devcluster import Cluster

ROOT = pathlib.Path(__file__).resolve().parents[2]
GROUP, VERSION = "hybridserving.io", "v1alpha1"


class Operator:
    """The operator process; restartable, killable."""

    def __init__(self, kubeconfig: pathlib.Path, log: pathlib.Path, extra: tuple[str, ...] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.key = secrets.token_hex(32)  # one operator key for every start: engine keys stay the same
        self.log = log
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1",
                   HYBRIDSERVING_OPERATOR_KEY=self.key)
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            # As a platform that granted RDMA to engine pods: the examples use it.
            [sys.executable, "-m", "hybridserving.controller", "--metrics-port", "0", "--resync-seconds", "15",
             "--engine-allow-host-network=true", "--engine-allow-ipc-lock=true", *self.extra],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )

    def __enter__(self) -> Operator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Fleet:
    """One HybridServing in one namespace, and ways to look at what the operator made of it."""

    def __init__(self, cluster: Cluster, api_client: Any, namespace: str, wait_for: Callable[..., Any],
                 op: Operator) -> None:
        from kubernetes import client

        self.cluster = cluster
        self.ns = namespace
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.wait_for = wait_for
        self.op = op
        self.name = ""

    def apply(self, manifest: dict[str, Any]) -> None:
        manifest = copy.deepcopy(manifest)
        manifest["metadata"]["namespace"] = self.ns
        self.name = manifest["metadata"]["name"]
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def edit(self, change: Callable[[dict[str, Any]], None]) -> None:
        obj = self.get()
        spec = obj["spec"]
        change(spec)
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, "hybridservings", self.name,
                                                   {"spec": spec})

    def get(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, "hybridservings",
                                                                       self.name)
        return obj

    def instances(self) -> dict[str, dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, "hybridservinginstances")["items"]
        return {i["metadata"]["name"]: i for i in items}

    def pods(self) -> dict[str, Any]:
        return {p.metadata.name: p for p in self.core.list_namespaced_pod(
            self.ns, label_selector=f"hybridserving.io/name={self.name},hybridserving.io/component=engine").items}

    def uids(self) -> dict[str, str]:
        return {n: p.metadata.uid for n, p in self.pods().items()}

    def condition(self, type_: str) -> dict[str, Any]:
        conds = (self.get().get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == type_), {})

    def settled(self) -> bool:
        obj = self.get()
        status = obj.get("status") or {}
        if status.get("observedGeneration") != obj["metadata"]["generation"] or status.get("ready") != "True":
            return False
        conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conds.get("Progressing") != "False":
            return False
        pods = self.pods().values()
        want = sum(i["spec"]["nodes"] for i in self.instances().values())
        return len(pods) == want and all(
            p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in pods)

    def wait_settled(self, timeout: float = 120) -> None:
        try:
            self.wait_for(self.settled, timeout=timeout, interval=0.5, what=f"{self.name} settled")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstatus: {json.dumps(self.get().get('status'), indent=1)[:3000]}\n"
                                 f"operator log:\n{self.op.tail()}") from None
