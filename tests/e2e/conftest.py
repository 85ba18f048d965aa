"""Fixtures for end-to-end tests on 127.0.0.1: engine pods (launcher + SGLang simulator) and the real router.

Each engine is started the way a pod starts it: `hybridserving-engine --backend simulator` reading
a per-role config directory and a role file. The router is the `smg` binary from PyPI
(`pip install smg==1.13.0`); when it is missing the tests fail with that instruction.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from hybridserving.core.router import WORKER_FLAGS
from hybridserving_engine.simulator.process import free_ports, simulator_env, wait_http

@dataclass
class EnginePod:
    """One launcher process and the simulator it runs, as an engine pod would."""

    role_file: pathlib.Path
    launcher_url: str
    engine_url: str
    bootstrap_port: int
    proc: subprocess.Popen
    log: pathlib.Path

    def status(self) -> dict:
        with urllib.request.urlopen(self.launcher_url + "/status", timeout=5) as resp:
            return json.load(resp)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.engine_url + "/metrics", timeout=5) as resp:
            return resp.read().decode()

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops the pod. A launcher still draining after 30 s (a request
        that waits on a crashed peer) is killed, and the engine it runs in its own process group
        with it: nothing else would stop that engine (a launcher that drained took it down itself)."""
        from hybridserving.devcluster import stack

        if self.proc.poll() is not None:
            return
        try:
            engine_pid = self.status()["engine"]["pid"]
        except OSError:
            engine_pid = None
        stack.stop(self.proc, 30)
        if engine_pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine_pid, signal.SIGKILL)


def role_argv(role: str, port: int, bootstrap_port: int, extra: list[str]) -> list[str]:
    return [
        "--model-path", "zai-org/GLM-5.2-FP8", "--served-model-name", "glm-5.2",
        "--host", "127.0.0.1", "--port", str(port), "--tp-size", "8",
        "--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(bootstrap_port),
        "--disaggregation-transfer-backend", "mooncake", "--enable-metrics", *extra,
    ]


@pytest.fixture
def engine_pod(tmp_path: pathlib.Path):
    """Start engine pods: `engine_pod(role, time_scale=..., extra=[...])`; all are stopped at teardown."""
    pods: list[EnginePod] = []

    def start(role: str, time_scale: float = 1.0, extra: list[str] | None = None,
              startup_seconds: float = 0.0, faults: str = "") -> EnginePod:
        home = tmp_path / f"pod{len(pods)}"
        (home / "config").mkdir(parents=True)
        port, bootstrap_port, launcher_port = free_ports(3)
        for r in ("prefill", "decode"):
            config = {"nnodes": 1, "argv": role_argv(r, port, bootstrap_port, extra or []),
                      "decode_cuda_graph_memory_gb": 2.0}
            (home / "config" / f"{r}.json").write_text(json.dumps(config))
        role_file = home / "role"
        role_file.write_text(role)
        env = simulator_env(time_scale=time_scale, startup_seconds=startup_seconds, faults=faults)
        env.update({
            "HYBRIDSERVING_CONFIG_DIR": str(home / "config"),
            "HYBRIDSERVING_ROLE_FILE": str(role_file),
            "HYBRIDSERVING_LAUNCHER_HOST": "127.0.0.1",
            "HYBRIDSERVING_LAUNCHER_PORT": str(launcher_port),
            "HYBRIDSERVING_POLL_INTERVAL_S": "0.2",
        })
        log = home / "launcher.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hybridserving_engine.launcher", "--backend", "simulator"],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        pod = EnginePod(role_file, f"http://127.0.0.1:{launcher_port}", f"http://127.0.0.1:{port}",
                        bootstrap_port, proc, log)
        pods.append(pod)
        wait_http(pod.launcher_url + "/readyz", timeout=60)
        return pod

    yield start
    for pod in pods:
        pod.stop()


class RouterURL(str):
    """A router's URL, which requests are sent to, with its Prometheus endpoint beside it."""

    metrics_url: str

    def __new__(cls, url: str, metrics_url: str) -> RouterURL:
        router = super().__new__(cls, url)
        router.metrics_url = metrics_url
        return router

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=5) as resp:
            return resp.read().decode()


@pytest.fixture
def smg_router(tmp_path: pathlib.Path):
    """Start `smg launch --pd-disaggregation` over a prefill pod and decode pods; returns its URL."""
    binary = shutil.which("smg", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("smg")
    if binary is None:
        pytest.fail("the router binary `smg` is missing: run `.venv/bin/pip install smg==1.13.0`")
    procs: list[subprocess.Popen] = []

    def start(prefill: EnginePod | Sequence[EnginePod], *decodes: EnginePod,
              worker_flags: tuple[str, ...] = WORKER_FLAGS, prefill_policy: str = "round_robin") -> RouterURL:
        prefills = [prefill] if isinstance(prefill, EnginePod) else list(prefill)
        port, metrics_port = free_ports(2)
        cmd = [
            binary, "launch", "--pd-disaggregation",
            *(arg for p in prefills for arg in ("--prefill", p.engine_url, str(p.bootstrap_port))),
            *(arg for decode in decodes for arg in ("--decode", decode.engine_url)),
            "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--prefill-policy", prefill_policy, "--decode-policy", "round_robin",
            *worker_flags,  # as the operator renders the router unless a test says otherwise
        ]
        log = open(tmp_path / f"smg{len(procs)}.log", "wb")  # noqa: SIM115 - lives as long as the router
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        url = RouterURL(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/workers", timeout=2) as resp:
                    workers = json.load(resp).get("workers", [])
                if sum(1 for w in workers if w.get("is_healthy")) == len(prefills) + len(decodes):
                    return url
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"smg did not register every worker within 60 s; see {log.name}")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------------------------- the local cluster
#
# The whole path on a real control plane: the operator renders the fleet, the pod runner (standing in
# for the kubelet on kwok's fake GPU nodes) runs each leader pod's launcher and simulator at the pod IP
# (127.x), and the real router discovers the leaders through the API the way its Deployment would.

E2E_CLUSTER_PREFIX = "e2e-"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local control plane with eight fake GPU nodes (room for one fleet while the previous one is
    still being torn down) and the CRDs applied; one per session."""
    import os
    import uuid

    from hybridserving.devcluster import (
        Cluster,
        DevClusterError,
        FleetSpec,
        MissingBinaries,
        find_binaries,
        reap_orphans,
    )

    try:
        find_binaries()
    except MissingBinaries as exc:
        pytest.fail(str(exc), pytrace=False)
    reap_orphans(E2E_CLUSTER_PREFIX)  # left by a session killed before its teardown
    cluster = Cluster(f"{E2E_CLUSTER_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}", FleetSpec(nodes=8),
                      probed_readiness=True)
    try:
        cluster.up(timeout=120)
    except DevClusterError as exc:
        pytest.fail(f"local control plane did not come up: {exc}", pytrace=False)
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield cluster
    finally:
        cluster.down(purge=os.environ.get("HYBRIDSERVING_KEEP_CLUSTER") != "1")


@dataclass
class OperatorReplica:
    identity: str
    proc: subprocess.Popen
    log: pathlib.Path
    metrics_url: str
    health_url: str  # the operator's liveness endpoint (--health-port)


class OperatorReplicas:
    """The operator the e2e tests share, run as leader-elected replicas on one Lease (one replica to
    start with; tests/e2e/test_operator_ha_e2e.py adds one and kills the leader)."""

    LEASE_NAMESPACE, LEASE = "default", "hybridserving-operator"
    LEASE_SECONDS = 8

    def __init__(self, cluster, directory: pathlib.Path) -> None:
        self.cluster, self.directory = cluster, directory
        self.replicas: list[OperatorReplica] = []

    def start(self) -> OperatorReplica:
        from hybridserving.devcluster import stack

        identity = f"operator-{len(self.replicas)}"
        port, health = free_ports(2)
        log = self.directory / f"{identity}.log"
        proc = stack.start_operator(
            self.cluster,
            log,
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
            "--health-port",
            str(health),
            "--leader-elect",
            "--leader-elect-namespace",
            self.LEASE_NAMESPACE,
            "--leader-elect-identity",
            identity,
            # Shorter than the default 15 s, so a handover fits the e2e budget (HANDOVER_WITHIN_S).
            "--leader-elect-lease-seconds",
            str(self.LEASE_SECONDS),
            # The weights tests fill a node cache: a directory of the pod runner's, not of this host.
            "--engine-allow-node-cache=true",
        )
        self.replicas.append(OperatorReplica(identity, proc, log, f"http://127.0.0.1:{port}",
                                             f"http://127.0.0.1:{health}"))
        return self.replicas[-1]

    def holder(self) -> str:
        out = self.cluster.kubectl(
            "-n", self.LEASE_NAMESPACE, "get", "lease", self.LEASE, "-o", "jsonpath={.spec.holderIdentity}", check=False
        )
        return out.stdout.strip() if out.returncode == 0 else ""

    def leader(self, timeout: float = 60) -> OperatorReplica:
        """The live replica holding the Lease (waiting for one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            holder = self.holder()
            for r in self.replicas:
                if r.identity == holder and r.proc.poll() is None:
                    return r
            time.sleep(0.5)
        raise TimeoutError(f"no live operator replica holds the lease (holder {self.holder()!r})")

    @property
    def metrics_url(self) -> str:
        return self.leader().metrics_url

    def stop(self) -> None:
        from hybridserving.devcluster import stack

        for r in self.replicas:
            stack.stop(r.proc)


@pytest.fixture(scope="session")
def fleet_operator(local_cluster, tmp_path_factory: pytest.TempPathFactory):
    """`python -m hybridserving.controller --leader-elect` on the local cluster, metrics on loopback ports."""
    replicas = OperatorReplicas(local_cluster, tmp_path_factory.mktemp("operator"))
    replicas.start()
    replicas.leader()
    yield replicas
    replicas.stop()


@pytest.fixture(scope="session")
def pod_runner(local_cluster, tmp_path_factory: pytest.TempPathFactory):
    """The pod runner on the local cluster, with probes, restarts and volume refreshes sped up."""
    from hybridserving.devcluster import stack

    state = tmp_path_factory.mktemp("pods")
    proc = stack.start_pod_runner(local_cluster, state)
    yield state
    stack.stop(proc, 3 * stack.POD_SHUTDOWN_GRACE_SECONDS)


@pytest.fixture
def discovering_router(local_cluster, tmp_path: pathlib.Path):
    """Run the router the operator rendered: `discovering_router(namespace, deployment)` binds the
    Deployment's `smg` arguments to 127.0.0.1 on free ports, points the router's Kubernetes client at
    the local cluster and returns it once it answers (its URL, and the fleet's key its clients send)."""
    from hybridserving.devcluster import stack

    routers: list[stack.Router] = []

    def start(namespace: str, deployment: str) -> stack.Router:
        routers.append(stack.start_router(local_cluster, namespace, deployment, tmp_path / f"router{len(routers)}.log"))
        return routers[-1]

    yield start
    for router in routers:
        stack.stop(router.proc, 10)
