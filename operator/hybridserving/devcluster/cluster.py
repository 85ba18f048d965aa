"""A local Kubernetes control plane with fake GPU nodes.

Components (all bound to 127.0.0.1, ports picked at runtime):
etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.
Binaries come from ``tools/build-tools.sh`` (``$HYBRIDSERVING_CACHE/bin``).

State of a cluster lives in ``$HYBRIDSERVING_CACHE/clusters/<name>/``:
``state.json`` (pids, ports), ``logs/``, ``pki/``, ``kubeconfig``,
``etcd/`` (data). Several clusters can run side by side.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .nodes import KWOK_SELECTOR, FleetSpec, create_nodes

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Run with leader election, as in a real control plane, and so, as there, under a supervisor that
# starts them again when they exit (`supervise.py`, the kubelet's part): they exit on a lost lease
# (an apiserver outage past the renew deadline) and the scheduler on a corrupted cache, and only a
# fresh process has a fresh cache. etcd, the apiserver and kwok hold no lease and do not exit on an
# outage of another component: their exit stays a fault the cluster reports (`ComponentDied`).
SUPERVISED = ("kube-controller-manager", "kube-scheduler")
SUPERVISOR = pathlib.Path(__file__).with_name("supervise.py")
# Gang admission through the Workload API (scheduling.k8s.io/v1alpha1, alpha in 1.35): the
# apiserver serves Workloads and pods' spec.workloadRef, the scheduler's gang plugin holds a
# pod group until all of its pods fit. Pods without a workloadRef schedule as before.
# Image volumes (oci:// weights) need no gate here: ImageVolume is beta and on by default in
# 1.35 (`kube-apiserver --help`: "ImageVolume=true|false (BETA - default=true)").
FEATURE_GATES = "GenericWorkload=true,GangScheduling=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha1=true"
BINARIES = COMPONENTS + ("kubectl",)

SERVICE_CIDR = "10.96.0.0/16"


def pod_cidr(name: str) -> str:
    """The loopback range kwok hands pod IPs out of, one /16 per cluster name.

    Loopback, so nothing ever routes off the host; per cluster, so that two clusters whose
    pods are stood in for by local processes never hand out the same address.
    """
    second = 64 + int(hashlib.sha256(name.encode()).hexdigest(), 16) % 64
    return f"127.{second}.0.1/16"
NODE_IP = "127.0.0.1"

DEFAULT_UP_TIMEOUT = 120.0

Progress = Callable[[str], None]


class DevClusterError(RuntimeError):
    """Raised when the cluster cannot be started or stopped cleanly."""


class MissingBinaries(DevClusterError):
    pass


class ComponentDied(DevClusterError):
    pass


# --------------------------------------------------------------------------- paths


def repo_root() -> pathlib.Path:
    # operator/hybridserving/devcluster/cluster.py -> repository root
    return pathlib.Path(__file__).resolve().parents[3]


def cache_dir() -> pathlib.Path:
    """Absolute: components run with their own working directory and take paths under it as flags."""
    env = os.environ.get("HYBRIDSERVING_CACHE")
    return (pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "hybridserving").absolute()


def bin_dir() -> pathlib.Path:
    env = os.environ.get("HYBRIDSERVING_BIN")
    return pathlib.Path(env) if env else cache_dir() / "bin"


def clusters_dir() -> pathlib.Path:
    return cache_dir() / "clusters"


def read_versions(path: pathlib.Path | None = None) -> dict[str, str]:
    """Parse ``tools/versions.env`` (KEY=value lines)."""
    path = path or repo_root() / "tools" / "versions.env"
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip().strip("'\"")
    return out


def find_binaries() -> dict[str, pathlib.Path]:
    """Locate the control-plane binaries or explain how to build them."""
    bdir = bin_dir()
    found: dict[str, pathlib.Path] = {}
    missing = []
    for name in BINARIES:
        path = bdir / name
        if path.exists() and os.access(path, os.X_OK):
            found[name] = path
        else:
            missing.append(name)
    if "kwok" in found and not kwok_stage_files(found["kwok"]):
        missing.append("kwok stages (next to the kwok binary)")
    if missing:
        raise MissingBinaries(
            f"missing control-plane binaries in {bdir}: {', '.join(missing)}. "
            f"Build them with: bash {repo_root() / 'tools' / 'build-tools.sh'} "
            "(a cold build takes a while; results are cached outside the repository)"
        )
    return found


def probed_pod_ready(stage: str) -> str:
    """kwok's pod-ready stage with the kubelet's rule for readiness: a pod whose containers have a
    readiness probe starts Ready=False, and only the pod runner's probe turns it Ready.

    kwok's own stage marks every scheduled pod Ready at once, so a router Service, or a client
    reading endpoints as kube-proxy does, could send to a pod whose process had not yet started or
    had no workers yet, something a kubelet never allows. Only clusters whose pods the pod runner
    runs want this; without one, nothing would ever make those pods Ready.
    """
    out, n = re.subn(r'status: "True"(\n\s+)type: (Ready|ContainersReady)\b',
                     r"status: {{ $ready | Quote }}\1type: \2", stage)
    out, m = re.subn(r"(containerStatuses:\n\s+\{\{ range \.spec\.containers \}\}(?:\n.*?){2}\n\s+)ready: true",
                     r"\1ready: {{ if .readinessProbe }}false{{ else }}true{{ end }}", out)
    head = "{{ $now := Now }}"
    if n != 2 or m != 1 or out.count(head) != 1:
        raise DevClusterError("kwok's pod-ready stage is not in the shape the pod runner's readiness expects")
    probed = ('{{ $ready := "True" }}{{ range .spec.containers }}{{ if .readinessProbe }}{{ $ready = "False" }}'
              "{{ end }}{{ end }}")
    return out.replace(head, head + "\n      " + probed)


def kwok_stage_files(kwok: pathlib.Path) -> list[pathlib.Path]:
    """kwok's default Stage manifests, installed by build-tools.sh beside the binary.

    kwok runs no stage at all unless its configuration lists them (kwokctl
    normally adds these defaults): node-initialize, node heartbeat with lease,
    pod-ready, pod-complete and pod-delete.
    """
    stages = pathlib.Path(os.path.realpath(kwok)).parent / "stages"
    return sorted(stages.glob("*.yaml")) if stages.is_dir() else []


# --------------------------------------------------------------------------- helpers


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (bind to port 0, read, release)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DevClusterError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def make_pki(pki: pathlib.Path) -> None:
    """CA, apiserver serving certificate and service-account key via openssl."""
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "apiserver.crt").exists():
        return
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-subj", "/CN=hybridserving-devcluster-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=pki)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", "apiserver.key", "-out", "apiserver.csr", cwd=pki)
    sans = ",".join([
        "IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes",
        "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ])
    (pki / "apiserver.ext").write_text(
        f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "3650", "-extfile", "apiserver.ext",
             "-out", "apiserver.crt", cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def pid_alive(pid: int) -> bool:
    """A zombie is not alive: it holds no port or memory, only an entry until its reaper waits on it,
    and a reaper outside this process (the machine's init) waits when it will."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    # the state follows the parenthesised command name
    state = stat.rpartition(")")[2].split()[0]
    return state not in ("Z", "X")


def _pid_starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [p.decode(errors="replace") for p in fh.read().split(b"\0") if p]
    except OSError:
        return []


def _pid_rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _is_supervisor(cmd: list[str]) -> bool:
    """A supervisor's command line (`_supervised`), whichever checkout started it: a stray one
    would start its component again after `down` killed it."""
    return len(cmd) > 2 and pathlib.PurePath(cmd[2]).parts[-2:] == SUPERVISOR.parts[-2:]


def _is_component(cmd: list[str]) -> bool:
    return bool(cmd) and (os.path.basename(cmd[0]) in COMPONENTS or _is_supervisor(cmd))


def _references(cmd: list[str], marker: str) -> bool:
    return any(marker in arg for arg in cmd[1:])


def _process_table() -> dict[int, tuple[int, int]]:
    """Every process's parent and process group (pid → (ppid, pgid))."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _group_rss_kib(pgid: int) -> int:
    """The resident memory of a process group: a supervised component's is its supervisor's."""
    return sum(_pid_rss_kib(pid) for pid, (_, group) in _process_table().items() if group == pgid)


def _clients_referencing(marker: str) -> list[int]:
    """The cluster's clients still running, and every process below them.

    The operator and the pod runner name the cluster's kubeconfig on their command line. A session
    killed before its teardown leaves them running, and the pod runner's engines (in sessions of
    their own) with them, bound to pod IPs that the next cluster hands out again.
    """
    table = _process_table()
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:  # never this process or the ones that started it
        mine.add(pid)
        pid = table.get(pid, (0, 0))[0]
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    clients = [pid for pid, cmd in ((p, _pid_cmdline(p)) for p in table if p not in mine and pid_alive(p))
               if _references(cmd, marker) and not _is_component(cmd)]
    out: dict[int, None] = {}  # in the order found, each once
    while clients:
        pid = clients.pop()
        if pid not in mine and pid not in out:
            out[pid] = None
            clients.extend(children.get(pid, []))
    return list(out)


def _pids_referencing(marker: str) -> list[int]:
    """Control-plane processes whose command line mentions ``marker`` (a cluster's state dir)."""
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me or not pid_alive(pid):
            continue
        cmd = _pid_cmdline(pid)
        if _is_component(cmd) and _references(cmd, marker):
            out.append(pid)
    return out


def _supervised(cmd: list[str]) -> list[str]:
    """`cmd` under its supervisor, run isolated from this process's import path (it needs none)."""
    return [sys.executable, "-I", str(SUPERVISOR), "--", *cmd]


def tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-64 * 1024:]
    except OSError:
        return "(no log)"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


# --------------------------------------------------------------------------- cluster


@dataclasses.dataclass
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


class Cluster:
    """One local control plane. ``Cluster(name).up()`` / ``.down()``."""

    def __init__(
        self,
        name: str = "dev",
        fleet: FleetSpec | None = None,
        *,
        root: pathlib.Path | None = None,
        progress: Progress | None = None,
        feature_gates: str = "",
        probed_readiness: bool = False,
    ) -> None:
        """`feature_gates` are set on top of `FEATURE_GATES` (`Name=false,...`): a cluster configured
        like one a fleet may meet, such as one without a beta feature. `probed_readiness`: pods with a
        readiness probe start not Ready (`probed_pod_ready`), for a cluster whose pods the pod runner runs."""
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ValueError(f"invalid cluster name {name!r}")
        self.name = name
        self.fleet = fleet or FleetSpec()
        self.dir = (root or clusters_dir()) / name
        self.progress: Progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.feature_gates = ",".join(g for g in (FEATURE_GATES, feature_gates) if g)
        self.probed_readiness = probed_readiness
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._t0 = time.monotonic()

    # ---------------------------------------------------------------- paths

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.dir / "kubeconfig"

    @property
    def _marker(self) -> str:
        # every component's command line holds a path below the state dir
        return str(self.dir) + os.sep

    @property
    def state_file(self) -> pathlib.Path:
        return self.dir / "state.json"

    @property
    def log_dir(self) -> pathlib.Path:
        return self.dir / "logs"

    def log_path(self, component: str) -> pathlib.Path:
        return self.log_dir / f"{component}.log"

    def state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _write_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        tmp.replace(self.state_file)

    @property
    def server(self) -> str:
        port = self.state().get("ports", {}).get("apiserver")
        if not port:
            raise DevClusterError(f"cluster {self.name} is not up")
        return f"https://127.0.0.1:{port}"

    @property
    def token(self) -> str:
        token: str = self.state()["token"]
        return token

    @property
    def ca_path(self) -> pathlib.Path:
        return self.dir / "pki" / "ca.crt"

    def env(self) -> dict[str, str]:
        """Environment for tools talking to this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{bin_dir()}{os.pathsep}{env.get('PATH', '')}"
        return env

    # ---------------------------------------------------------------- clients

    def api_client(self) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` for this cluster."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(configuration=cfg)

    def wait_established(self, crds: Iterable[str], timeout: float = 60) -> None:
        """Wait until every named CRD is Established.

        Polled rather than `kubectl wait`: right after a create a CRD has no status yet, and
        kubectl 1.35's wait then fails at once instead of waiting.
        """
        pending = list(crds)
        deadline = time.monotonic() + timeout
        while pending:
            out = self.kubectl("get", "crd", pending[0], "-o", "json", check=False)
            conditions = (
                (json.loads(out.stdout).get("status") or {}).get("conditions") or [] if out.returncode == 0 else []
            )
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise DevClusterError(f"CRD {pending[0]} not Established within {timeout:.0f}s")
            time.sleep(0.5)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise DevClusterError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    # ---------------------------------------------------------------- status

    def pids(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.state().get("pids", {}).items()}

    def alive(self) -> dict[str, bool]:
        out = {}
        for comp, pid in self.pids().items():
            proc = self._procs.get(comp)
            if proc is not None and proc.pid == pid:
                out[comp] = proc.poll() is None
            else:
                out[comp] = pid_alive(pid) and self._marker in " ".join(_pid_cmdline(pid))
        return out

    def is_running(self) -> bool:
        alive = self.alive()
        return bool(alive) and all(alive.get(c, False) for c in COMPONENTS)

    def rss_mib(self) -> dict[str, float]:
        return {c: _group_rss_kib(p) / 1024 for c, p in self.pids().items() if pid_alive(p)}

    def status(self) -> dict[str, Any]:
        st = self.state()
        alive = self.alive()
        rss = self.rss_mib()
        comps = {}
        for comp in COMPONENTS:
            pid = st.get("pids", {}).get(comp)
            comps[comp] = {
                "pid": pid,
                "alive": alive.get(comp, False),
                "rss_mib": round(rss.get(comp, 0.0), 1),
                "log": str(self.log_path(comp)),
            }
        return {
            "name": self.name,
            "dir": str(self.dir),
            "exists": self.dir.exists(),
            "running": self.is_running(),
            "server": f"https://127.0.0.1:{st['ports']['apiserver']}" if st.get("ports") else None,
            "kubeconfig": str(self.kubeconfig),
            "ports": st.get("ports", {}),
            "components": comps,
            "rss_total_mib": round(sum(rss.values()), 1),
            "fleet": st.get("fleet"),
            "up_seconds": st.get("up_seconds"),
            "versions": st.get("versions"),
        }

    def crashed(self) -> list[str]:
        return [c for c, ok in self.alive().items() if not ok]

    def crash_report(self, components: Iterable[str] | None = None, lines: int = 30) -> str:
        comps = list(components) if components is not None else self.crashed()
        parts = []
        for comp in comps:
            parts.append(f"--- {comp} (log {self.log_path(comp)}), last {lines} lines:\n"
                         f"{tail(self.log_path(comp), lines)}")
        return "\n".join(parts)

    # ---------------------------------------------------------------- up

    def _say(self, msg: str) -> None:
        self.progress(f"[devcluster {self.name} +{time.monotonic() - self._t0:5.1f}s] {msg}")

    def up(self, timeout: float = DEFAULT_UP_TIMEOUT) -> "Cluster":
        """Start the cluster and wait until it is usable. Idempotent."""
        self._t0 = time.monotonic()
        if self.dir.exists() and self.is_running():
            self._say(f"already running at {self.server}")
            return self
        bins = find_binaries()
        if self.dir.exists():
            self._say("cleaning up a previous, stopped instance")
            self.down(quiet=True)
        deadline = time.monotonic() + timeout
        for attempt in range(3):
            self.dir.mkdir(parents=True)
            self.log_dir.mkdir()
            try:
                self._start(bins, deadline)
                return self
            except ComponentDied as exc:
                # ports are picked before the components bind them; another
                # process may win the race. Retry with fresh ports.
                if "address already in use" in str(exc) and attempt < 2 and time.monotonic() < deadline:
                    self._say("a port was taken meanwhile; retrying with new ports")
                    self.down(quiet=True, purge=True)
                    continue
                self._say("start failed; stopping what was started (logs kept)")
                self.down(quiet=True, purge=False)
                raise
            except BaseException:
                self._say("start failed; stopping what was started (logs kept)")
                self.down(quiet=True, purge=False)
                raise
        raise DevClusterError(f"cluster {self.name}: could not start")  # pragma: no cover

    def owner_alive(self) -> bool:
        """Whether the process that ran ``up`` still exists."""
        st = self.state()
        pid, start = st.get("owner_pid"), st.get("owner_start")
        if not pid:
            return False
        return pid_alive(pid) and _pid_starttime(pid) == start

    def _start(self, bins: dict[str, pathlib.Path], deadline: float) -> None:
        d = self.dir
        p = Ports(*free_ports(6))
        token = secrets.token_hex(16)
        versions = read_versions()
        state: dict[str, Any] = {
            "name": self.name,
            "ports": dataclasses.asdict(p),
            "token": token,
            "pids": {},
            "fleet": dataclasses.asdict(self.fleet),
            "versions": versions,
            "started_at": time.time(),
            "owner_pid": os.getpid(),
            "owner_start": _pid_starttime(os.getpid()),
        }
        self._write_state(state)

        self._say("generating certificates")
        make_pki(d / "pki")
        pki = d / "pki"
        (d / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
        ca_b64 = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        server = f"https://127.0.0.1:{p.apiserver}"
        self.kubeconfig.write_text(
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            f"- name: {self.name}\n"
            "  cluster:\n"
            f"    server: {server}\n"
            f"    certificate-authority-data: {ca_b64}\n"
            "users:\n"
            f"- name: {self.name}-admin\n"
            "  user:\n"
            f"    token: {token}\n"
            "contexts:\n"
            f"- name: {self.name}\n"
            "  context:\n"
            f"    cluster: {self.name}\n"
            f"    user: {self.name}-admin\n"
            "    namespace: default\n"
            f"current-context: {self.name}\n"
        )
        os.chmod(self.kubeconfig, 0o600)
        kc = str(self.kubeconfig)

        # etcd
        etcd_url = f"http://127.0.0.1:{p.etcd_client}"
        peer_url = f"http://127.0.0.1:{p.etcd_peer}"
        self._spawn(state, "etcd", [
            str(bins["etcd"]),
            f"--name={self.name}",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self.name}={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",
            "--quota-backend-bytes=2147483648",
            "--snapshot-count=10000",
            "--log-level=warn",
        ])
        self._say(f"waiting for etcd on {etcd_url}")
        self._wait_ready("etcd", deadline)

        # kube-apiserver
        self._spawn(state, "kube-apiserver", [
            str(bins["kube-apiserver"]),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # KCM and scheduler read this bundle for delegated authentication
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--event-ttl=30m",
            f"--feature-gates={self.feature_gates}",
            f"--runtime-config={RUNTIME_CONFIG}",
            "--v=1",
        ])
        self._say(f"waiting for kube-apiserver on {server}")
        self._wait_ready("kube-apiserver", deadline)

        # kube-controller-manager
        self._spawn(state, "kube-controller-manager", [
            str(bins["kube-controller-manager"]),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            # as kubeadm runs it: the CA bundles from files, so that a restart while the apiserver
            # is away waits for it instead of exiting on the lookup of their ConfigMap
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--leader-elect=true",
            "--controllers=*",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            f"--cert-dir={pki / 'kcm'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--node-monitor-period=5s",
            # 1.35's default: kwok renews node leases every 10 s (a quarter of 40 s, as kubelets
            # do), and a shorter grace marks every node and its pods NotReady after an apiserver
            # restart of half a minute, which a cluster of this version rides out.
            "--node-monitor-grace-period=50s",
            "--concurrent-gc-syncs=5",
            "--profiling=false",
            "--v=1",
        ])

        # kube-scheduler
        sched_cfg = d / "scheduler.yaml"
        sched_cfg.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\n"
            "kind: KubeSchedulerConfiguration\n"
            "clientConnection:\n"
            f"  kubeconfig: {kc}\n"
            "leaderElection:\n"
            "  leaderElect: true\n"
        )
        self._spawn(state, "kube-scheduler", [
            str(bins["kube-scheduler"]),
            f"--config={sched_cfg}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.scheduler}",
            f"--cert-dir={pki / 'scheduler'}",
            f"--feature-gates={self.feature_gates}",
            "--profiling=false",
            "--v=1",
        ])

        # kwok
        kwok_cfg = d / "kwok.yaml"
        # only Stage objects: options come from flags (a KwokConfiguration
        # document here would bypass kwok's defaulting of its options)
        docs = [probed_pod_ready(f.read_text()) if self.probed_readiness and f.name == "pod-ready.yaml"
                else f.read_text() for f in kwok_stage_files(bins["kwok"])]
        kwok_cfg.write_text("---\n".join(doc if doc.endswith("\n") else doc + "\n" for doc in docs))
        self._spawn(state, "kwok", [
            str(bins["kwok"]),
            f"--kubeconfig={kc}",
            f"--config={kwok_cfg}",
            f"--manage-nodes-with-label-selector={KWOK_SELECTOR}",
            f"--cidr={pod_cidr(self.name)}",
            f"--node-ip={NODE_IP}",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{p.kwok}",
        ])

        self._say(f"creating {self.fleet.nodes} GPU node(s) x {self.fleet.gpus_per_node} GPU"
                  + (f" and {self.fleet.cpu_nodes} CPU node(s)" if self.fleet.cpu_nodes else ""))
        fleet = self.fleet
        if fleet.kubelet_version == "fake" and versions.get("K8S_VERSION"):
            fleet = dataclasses.replace(fleet, kubelet_version=versions["K8S_VERSION"])
        api = self.api_client()
        try:
            names = self._retry(deadline, lambda: create_nodes(api, fleet, self.name), "create nodes")
            self._say("waiting for serviceaccount default/default and Ready, untainted nodes")
            self._wait("serviceaccount default/default", deadline, lambda: self._sa_exists(api))
            self._wait(f"{len(names)} node(s) Ready and schedulable", deadline,
                       lambda: self._nodes_ready(api, names))
        finally:
            api.close()

        state["up_seconds"] = round(time.monotonic() - self._t0, 1)
        self._write_state(state)
        self._say(f"up in {state['up_seconds']}s; KUBECONFIG={self.kubeconfig}")

    def _spawn(self, state: dict[str, Any], comp: str, cmd: list[str]) -> None:
        """Start `comp` in its own process group, under its supervisor if it has one; `<comp>.cmd`
        records the component's own command line, which `restart` runs again."""
        log = open(self.log_path(comp), "ab")
        try:
            proc = subprocess.Popen(
                _supervised(cmd) if comp in SUPERVISED else cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,  # own process group: down() kills the group
                env=self._child_env(),
            )
        finally:
            log.close()
        self._procs[comp] = proc
        state["pids"][comp] = proc.pid
        self._write_state(state)
        (self.dir / f"{comp}.cmd").write_text(shlex.join(cmd) + "\n")
        self._say(f"started {comp} (pid {proc.pid})")

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("KUBECONFIG", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env["HOME"] = str(self.dir)  # kwok reads ~/.kwok; keep it inside the state dir
        return env

    def _check_alive(self) -> None:
        dead = [c for c, proc in self._procs.items() if proc.poll() is not None]
        if dead:
            codes = ", ".join(f"{c} exited {self._procs[c].returncode}" for c in dead)
            raise ComponentDied(f"cluster {self.name}: {codes}\n{self.crash_report(dead)}")

    def _wait_ready(self, comp: str, deadline: float) -> None:
        """Wait until `comp` serves, for the components the others need first: etcd before the
        apiserver starts, the apiserver before anything talks to it. The others just run."""
        ports = self.state()["ports"]
        if comp == "etcd":
            url = f"http://127.0.0.1:{ports['etcd_client']}"
            self._wait("etcd /health", deadline, lambda: self._http_ok(f"{url}/health", '"health":"true"'))
        elif comp == "kube-apiserver":
            ctx = ssl.create_default_context(cafile=str(self.ca_path))
            self._wait("kube-apiserver /readyz", deadline,
                       lambda: self._http_ok(f"{self.server}/readyz", "ok", ctx=ctx, token=self.token))

    def restart(self, comp: str, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
        """Stop one component and, `down_seconds` later, start it again with the command line it
        was started with (`<comp>.cmd`): the outage of an upgrade or a restart of that component,
        as its clients meet it (same address, same data). Returns once it serves again (etcd and
        the apiserver; the others once started). An apiserver down for longer than the leader
        election's renew deadline (10 s) costs the scheduler and the controller manager their
        leases: they exit and their supervisors start them again, as on a real control plane."""
        if comp not in COMPONENTS:
            raise ValueError(f"unknown component {comp!r}; one of {', '.join(COMPONENTS)}")
        state = self.state()
        pid = state.get("pids", {}).get(comp)
        if not pid:
            raise DevClusterError(f"cluster {self.name}: {comp} is not running")
        cmd = shlex.split((self.dir / f"{comp}.cmd").read_text())
        self._stop_component(comp, int(pid), self._say)
        self._procs.pop(comp, None)  # stopped on purpose: not a component that died
        time.sleep(down_seconds)
        self._spawn(state, comp, cmd)
        self._wait_ready(comp, time.monotonic() + timeout)

    def _wait(self, what: str, deadline: float, check: Callable[[], bool], interval: float = 0.5) -> None:
        last_msg = time.monotonic()
        while True:
            self._check_alive()
            try:
                if check():
                    self._say(f"{what}: ok")
                    return
            except Exception:  # noqa: BLE001 - keep polling until the deadline
                pass
            now = time.monotonic()
            if now > deadline:
                raise DevClusterError(
                    f"cluster {self.name}: timed out waiting for {what}\n{self.crash_report(COMPONENTS, 15)}")
            if now - last_msg > 10:
                self._say(f"still waiting for {what}")
                last_msg = now
            time.sleep(interval)

    def _retry(self, deadline: float, fn: Callable[[], Any], what: str) -> Any:
        while True:
            self._check_alive()
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001
                if time.monotonic() > deadline:
                    raise DevClusterError(f"cluster {self.name}: {what} failed: {exc}") from exc
                time.sleep(0.5)

    @staticmethod
    def _http_ok(url: str, expect: str, ctx: ssl.SSLContext | None = None, token: str | None = None) -> bool:
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
        try:
            with opener.open(req, timeout=3) as resp:
                return resp.status == 200 and expect in resp.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return False

    @staticmethod
    def _sa_exists(api: ApiClient) -> bool:
        from kubernetes import client
        client.CoreV1Api(api).read_namespaced_service_account("default", "default")
        return True

    @staticmethod
    def _nodes_ready(api: ApiClient, names: list[str]) -> bool:
        from kubernetes import client
        nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node(
            label_selector=KWOK_SELECTOR).items if n.metadata is not None}
        for name in names:
            node = nodes.get(name)
            if node is None:
                return False
            conditions = (node.status.conditions if node.status else None) or []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            taints = (node.spec.taints if node.spec else None) or []
            tainted = any(t.key.startswith("node.kubernetes.io/") for t in taints)
            if not ready or tainted:
                return False
        return True

    # ---------------------------------------------------------------- down

    def down(self, *, quiet: bool = False, purge: bool = True, grace: float = 5.0) -> None:
        """Stop every process of this cluster and verify that none is left.

        ``purge`` removes the state directory (data, logs, certificates).
        """
        say = (lambda m: None) if quiet else self._say
        pids = self.pids()
        marker = self._marker
        clients = _clients_referencing(marker)
        if clients:
            say(f"killing {len(clients)} processes the cluster's clients left running")
            for pid in clients:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # stop in reverse start order, one at a time: the apiserver exits in about
        # a second once its clients are gone, but hangs for long when etcd goes first
        order = [c for c in reversed(COMPONENTS) if c in pids]
        for comp in order:
            pid = pids[comp]
            self._stop_component(comp, pid, say, grace)
        # anything left (including strays mentioning our state dir) gets SIGKILL
        leftovers = {p for p in pids.values() if pid_alive(p) and marker in " ".join(_pid_cmdline(p))}
        leftovers.update(_pids_referencing(marker))
        for pid in leftovers:
            say(f"killing leftover pid {pid}")
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.monotonic() + 5
        while time.monotonic() < end:
            self._reap()
            remaining = _pids_referencing(marker)
            if not remaining:
                break
            time.sleep(0.1)
        else:
            raise DevClusterError(f"cluster {self.name}: processes still alive after down: {remaining}")
        self._procs.clear()
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            say("stopped; state removed")
        else:
            st = self.state()
            if st:
                st["pids"] = {}
                self._write_state(st)
            say(f"stopped; state kept in {self.dir}")

    def _stop_component(self, comp: str, pid: int, say: Progress, grace: float = 5.0) -> None:
        """SIGTERM to the component's process group (it leads its own), or to its supervisor alone,
        which hands it on (the component must get it once, `supervise.py`); SIGKILL to the group
        after `grace` seconds. A pid that is no longer this cluster's component is left alone."""
        if not (pid_alive(pid) and self._marker in " ".join(_pid_cmdline(pid))):
            return
        say(f"stopping {comp} (pid {pid})")
        terminate = os.kill if comp in SUPERVISED else os.killpg
        try:
            terminate(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self._reap()
            if not pid_alive(pid):
                return
            time.sleep(0.05)
        say(f"{comp} ignored SIGTERM for {grace}s; killing it")
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self) -> None:
        for proc in self._procs.values():
            proc.poll()

    # ---------------------------------------------------------------- context manager

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def reap_orphans(prefix: str, progress: Progress | None = None) -> list[str]:
    """Stop clusters named ``prefix*`` whose owning process is gone.

    Meant for clusters owned by a test session (the owner is the test
    process); a test run killed before its teardown leaves them behind.
    """
    reaped = []
    for name in list_clusters():
        if not name.startswith(prefix):
            continue
        c = Cluster(name, progress=progress)
        st = c.state()
        if not st:
            # being created right now, or a leftover without state
            try:
                if time.time() - c.dir.stat().st_mtime < 120:
                    continue
            except OSError:
                continue
        elif "owner_pid" not in st:
            # no owner recorded: only clean up when nothing of it runs
            if any(c.alive().values()):
                continue
        elif c.owner_alive():
            continue
        c.down(quiet=True)
        reaped.append(name)
    return reaped


def list_clusters() -> list[str]:
    root = clusters_dir()
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir())
