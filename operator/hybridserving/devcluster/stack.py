"""The processes that make a local cluster serve: operator, pod runner, router.

On kwok's fake nodes nothing runs a pod, so the demo and the end-to-end tests start the
same three processes around a `Cluster`: the operator (as it would run in its Deployment),
the pod runner (standing in for the kubelet: it runs each leader pod's launcher with the
SGLang simulator at the pod's loopback IP) and the real `smg` router with the arguments the
operator rendered into the router Deployment, bound to 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from hybridserving.contract import ENV_ENGINE_API_KEY, expand_references

from .cluster import Cluster, DevClusterError, free_ports, tail


def _start_logged(cmd: list[str], log: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


class ProcessExited(DevClusterError):
    """A process the stack runs beside the cluster exited while the demo or a test still needed it."""


def exited(name: str, proc: subprocess.Popen[bytes], log: pathlib.Path, lines: int = 20) -> ProcessExited:
    """The error for a process that exited early: its status, its log and the end of it, so that whoever
    waited on it reads the cause at once instead of a timeout that names neither."""
    code = proc.returncode
    killed = signal.strsignal(-code) if code is not None and code < 0 else None
    return ProcessExited(f"{name} exited with {code}{f' ({killed})' if killed else ''}; see {log}\n"
                         f"--- last {lines} lines of {log}:\n{tail(log, lines)}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM, then SIGKILL after `timeout`: the operator and the pod runner drain on SIGTERM."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def operator_key(cluster: Cluster) -> str:
    """The operator's key on this cluster: made once, kept in the cluster's directory, so every
    operator started on it (restarts, replicas) derives the same engine keys, as the chart's
    Secret makes them do in a real cluster."""
    path = cluster.dir / "operator-key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return path.read_text().strip()


def start_operator(cluster: Cluster, log: pathlib.Path, *extra: str) -> subprocess.Popen[bytes]:
    """`python -m hybridserving.controller` out of cluster, metrics off (nothing binds a wildcard)."""
    env = cluster.env()
    env["HYBRIDSERVING_OPERATOR_KEY"] = operator_key(cluster)
    return _start_logged(
        [sys.executable, "-m", "hybridserving.controller", "--kubeconfig", str(cluster.kubeconfig),
         "--metrics-port", "0", *extra],
        log, env,
    )


def secret_value(cluster: Cluster, namespace: str, name: str, key: str) -> str:
    """One value of a Secret, as the kubelet hands it to a container."""
    out = cluster.kubectl("-n", namespace, "get", "secret", name, "-o", "json")
    return base64.b64decode(json.loads(out.stdout)["data"][key]).decode()


def _container_env(cluster: Cluster, namespace: str, container: dict[str, Any]) -> dict[str, str]:
    """The container's `env` (values and `secretKeyRef`s), resolved as the kubelet does."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            env[var["name"]] = secret_value(cluster, namespace, ref["name"], ref["key"])
        elif "value" in var:
            env[var["name"]] = var["value"]
    return env


# The pod runner gives its containers this long to stop when it stops; it is stopped with
# room to spare, since a runner killed early leaves its containers running.
POD_SHUTDOWN_GRACE_SECONDS = 10


def start_pod_runner(cluster: Cluster, state_dir: pathlib.Path) -> subprocess.Popen[bytes]:
    """The pod runner with probes, restarts and volume refreshes at one-second periods."""
    return _start_logged(
        [sys.executable, "-m", "hybridserving_engine.podrunner", "--kubeconfig", str(cluster.kubeconfig),
         "--state-dir", str(state_dir), "--probe-period-seconds", "1", "--restart-backoff-seconds", "1",
         "--volume-refresh-seconds", "1", "--shutdown-grace-seconds", str(POD_SHUTDOWN_GRACE_SECONDS)],
        state_dir / "runner.log",
    )


def delete_namespace(cluster: Cluster, namespace: str, timeout: float = 180) -> None:
    """Delete a namespace that holds fleets and return once it is gone, its pods first.

    The namespace controller deletes a namespace's pods before anything else, and while one is
    left it looks again only after half the longest `terminationGracePeriodSeconds` among them,
    plus a second (kube-controller-manager, pkg/controller/namespace: OrderedNamespaceDeletion,
    on by default since 1.33, and its requeue of a `ResourcesRemainingError`). An engine
    pod's grace is its fleet's `drainTimeoutSeconds` + its stop grace (30 s), a router's 120 s: a namespace deleted
    with its fleets stays Terminating for one to five minutes after their pods are gone. Deleted
    first, in the foreground, the fleets hand their pods to the garbage collector, and the
    namespace controller's first look finds none left and removes the rest at once.
    """
    deadline = time.monotonic() + timeout

    def left() -> int:
        return max(1, int(deadline - time.monotonic()))

    cluster.kubectl("-n", namespace, "delete", "hybridservings.hybridserving.io", "--all", "--cascade=foreground",
                    "--wait=true", f"--timeout={left()}s", timeout=left() + 10)
    while cluster.kubectl("-n", namespace, "get", "pods", "-o", "name").stdout.strip():
        if time.monotonic() > deadline:
            raise DevClusterError(f"namespace {namespace}: pods left {timeout:.0f} s after its fleets were deleted")
        time.sleep(0.5)
    cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", f"--timeout={left()}s",
                    timeout=left() + 10)


def router_binary() -> str:
    binary = shutil.which("smg", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("smg")
    if binary is None:
        raise FileNotFoundError("the router binary `smg` is missing: pip install smg==1.13.0")
    return binary


def _replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2:]]
    return [*argv, flag, value]


@dataclass
class Router:
    proc: subprocess.Popen[bytes]
    url: str
    log: pathlib.Path
    api_key: str  # smg asks its clients for the key it sends to the engines (core/enginekey.py)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def workers(self) -> list[dict[str, Any]]:
        request = urllib.request.Request(self.url + "/workers", headers=self.headers)
        with urllib.request.urlopen(request, timeout=5) as resp:
            workers: list[dict[str, Any]] = json.load(resp).get("workers", [])
            return workers


def router_deployments(cluster: Cluster, namespace: str, fleet: str) -> list[str]:
    """The fleet's router Deployments, one per pairing key it runs (the spec's one when settled)."""
    out = cluster.kubectl("-n", namespace, "get", "deployments", "-o", "json", "-l",
                          f"hybridserving.io/name={fleet},hybridserving.io/component=router")
    return sorted(d["metadata"]["name"] for d in json.loads(out.stdout)["items"]
                  if not d["metadata"].get("deletionTimestamp"))


def start_router(cluster: Cluster, namespace: str, deployment: str, log: pathlib.Path,
                 timeout: float = 60) -> Router:
    """Run the router exactly as the operator rendered it, on 127.0.0.1 and free ports."""
    out = cluster.kubectl("-n", namespace, "get", "deployment", deployment, "-o", "json")
    container = json.loads(out.stdout)["spec"]["template"]["spec"]["containers"][0]
    if container.get("command") != ["smg"]:
        raise ValueError(f"deployment {deployment} does not run smg: {container.get('command')}")
    port, metrics_port = free_ports(2)
    container_env = _container_env(cluster, namespace, container)
    args = [expand_references(a, container_env) for a in container["args"]]
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port)),
                        ("--prometheus-host", "127.0.0.1"), ("--prometheus-port", str(metrics_port))):
        args = _replace_flag(args, flag, value)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(container_env)
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    router = Router(_start_logged([router_binary(), *args], log, env), f"http://127.0.0.1:{port}", log,
                    api_key=container_env.get(ENV_ENGINE_API_KEY, ""))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if router.proc.poll() is not None:
            raise exited("the router", router.proc, log)
        try:
            router.workers()
            return router
        except OSError:
            time.sleep(0.3)
    stop(router.proc, 10)  # nobody holds it once this raises: it would outlive the cluster
    raise TimeoutError(f"the router did not answer within {timeout:.0f} s; see {log}")


@dataclass
class Child:
    """A process of the stack with its name and log: what the report of its exit shows."""

    name: str
    proc: subprocess.Popen[bytes]
    log: pathlib.Path


@dataclass
class Stack:
    """Operator + pod runner (+ routers) on one cluster, stopped together."""

    cluster: Cluster
    workdir: pathlib.Path
    children: list[Child] = field(default_factory=list)

    def start(self, *operator_args: str) -> Stack:
        log = self.workdir / "operator.log"
        self.children.append(Child("operator", start_operator(self.cluster, log, *operator_args), log))
        pods = self.workdir / "pods"
        self.children.append(Child("pod runner", start_pod_runner(self.cluster, pods), pods / "runner.log"))
        return self

    def router(self, namespace: str, deployment: str) -> Router:
        router = start_router(self.cluster, namespace, deployment, self.workdir / f"router-{deployment}.log")
        self.children.append(Child(f"router {deployment}", router.proc, router.log))
        return router

    def check_alive(self) -> None:
        """Raise `ProcessExited` for the first process that exited: none of them exits on its own
        while the cluster runs, and one that did leaves those waiting on the fleet to time out."""
        for child in self.children:
            if child.proc.poll() is not None:
                raise exited(child.name, child.proc, child.log)

    def stop(self) -> None:
        for child in reversed(self.children):
            stop(child.proc, 3 * POD_SHUTDOWN_GRACE_SECONDS)
        self.children.clear()


def launcher_url(pod: dict[str, Any]) -> str:
    """The launcher of a running pod, at its pod IP and the port the operator named `launcher`."""
    for container in pod["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == "launcher":
                return f"http://{pod['status']['podIP']}:{port['containerPort']}"
    raise KeyError(f"pod {pod['metadata']['name']} declares no launcher port")
