"""The engine pod's entrypoint: runs SGLang (or its simulator) for the pod's role and node rank.

The operator renders both roles' engine flags once, into a mounted directory, and states the
pod's role as pod metadata (the `hybridserving.io/role` label, exposed through a downward-API
file). That keeps a role change from touching the pod template: the launcher sees the file
change and moves the engine to the other role, in place (`POST /pd_role_switch` once
`/v1/loads` shows it idle) or by relaunching it with the other role's flags on the same GPUs,
and reports each step on `/status` for the role-switch controller to follow.

It also supervises the engine (restarts it with backoff when it exits, hangs or does not start
in time, reports a crash loop), drains it on SIGTERM (waits for in-flight requests, then stops
it), and in production checks the GPUs and RDMA devices before the first start.

Configuration (see docs/engine.md): `$HYBRIDSERVING_CONFIG_DIR/{prefill,decode}.json`, each
`{"nnodes": N, "argv": [...]}` or `{"nnodes": N, "ranks": [[...rank 0...], [...rank 1...]]}`,
optionally with `"decode_cuda_graph_memory_gb"`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from hybridserving.contract import (
    CONFIG_DIR,
    CONFIG_HASH_FILE_NAME,
    ENV_CONFIG_DIR,
    ENV_DRAIN_TIMEOUT_S,
    ENV_ENGINE_API_KEY,
    ENV_LAUNCHER_PORT,
    ENV_SETTINGS,
    ENV_NODE_RANK,
    ENV_ROLE_FILE,
    HALF_HASH,
    LABEL_ROLE,
    PLACEHOLDERS,
    ROLE_CONFIG_KEYS,
    ROLE_FILE,
    ROLES,
    bearer,
    fill_placeholders,
    inflight_requests,
    placeholder_env,
    role_document_name,
)
from hybridserving_engine import preflight
from hybridserving_engine.argv import flag_value, has_flag
from hybridserving_engine.children import Forwarder, reap_orphans

log = logging.getLogger("hybridserving.launcher")
T = TypeVar("T")

PHASES = (
    "WaitingForRole", "PreflightFailed", "Starting", "Ready", "Restarting", "CrashLoop",
    "Draining", "Switching", "Relaunching", "Stopping", "Stopped", "Failed",
)

LEADER_MISSES = 3
"""Probes of the leader unanswered in a row that show a worker rank its leader has stopped."""
LEADER_RESOLVE_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------- configuration


class ConfigError(ValueError):
    """The mounted engine configuration cannot be used; names the file and what is wrong."""


@dataclass(frozen=True)
class RoleConfig:
    """One role's engine flags, as the operator rendered them."""

    nnodes: int
    argv: tuple[str, ...] = ()
    ranks: tuple[tuple[str, ...], ...] = ()
    decode_cuda_graph_memory_gb: float | None = None

    def argv_for(self, node_rank: int) -> list[str]:
        """The flags of `node_rank`: its own list if the operator wrote one per rank, else the shared
        argv with `--node-rank` appended for multi-node instances."""
        if not 0 <= node_rank < self.nnodes:
            raise ConfigError(f"node rank {node_rank} is outside 0..{self.nnodes - 1}")
        if self.ranks:
            return list(self.ranks[node_rank])
        argv = list(self.argv)
        if self.nnodes > 1:
            if not has_flag(argv, "--nnodes"):
                argv += ["--nnodes", str(self.nnodes)]
            if not has_flag(argv, "--node-rank"):
                argv += ["--node-rank", str(node_rank)]
        return argv


def fill_pod_values(argv: list[str], env: Mapping[str, str], node_rank: int) -> list[str]:
    """Fill the operator's per-pod placeholders (`{port}`, `{node_rank}`, ...) from the pod's env.

    One ConfigMap serves every instance of a role, so values that differ per instance (ports
    allocated under host networking, the leader's address) reach the pod as
    `HYBRIDSERVING_<NAME>` variables; a placeholder left without a value stops the launch.
    """
    values: dict[str, str | int] = {"node_rank": node_rank}
    for name in PLACEHOLDERS:
        value = env.get(placeholder_env(name))
        if value is not None and name != "node_rank":
            values[name] = value
    try:
        return fill_placeholders(argv, values)
    except ValueError as exc:
        raise ConfigError(f"{exc}: set HYBRIDSERVING_<NAME> in the pod's environment") from None


def load_role_config(path: Path) -> RoleConfig:
    """Read a role document (`<role>.json` or `<role>-<hash>.json`)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist; the operator mounts one file per role") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    unknown = set(data) - ROLE_CONFIG_KEYS
    if unknown:
        # A newer operator than this image's launcher wrote them (an engine image pinned across an
        # operator upgrade): refusing would crash-loop every pod it rolls, so they are skipped.
        log.warning("%s: ignoring keys this launcher does not know, %s (written by a newer operator)",
                    path, sorted(unknown))
    argv, ranks = data.get("argv"), data.get("ranks")
    if (argv is None) == (ranks is None):
        raise ConfigError(f"{path} must set exactly one of 'argv' (all ranks) or 'ranks' (one argv per rank)")
    if ranks is not None and not isinstance(ranks, list):
        raise ConfigError(f"{path}: 'ranks' must be a list of argvs, one per rank")
    nnodes = data.get("nnodes", len(ranks) if ranks is not None else 1)
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ConfigError(f"{path}: 'nnodes' must be a whole number of at least 1, not {nnodes!r}")
    if ranks is not None and len(ranks) != nnodes:
        raise ConfigError(f"{path} lists {len(ranks)} rank argvs for nnodes={nnodes}")
    for entry in [argv] if argv is not None else ranks or []:
        if not isinstance(entry, list) or not all(isinstance(a, str) for a in entry):
            raise ConfigError(f"{path}: every argv must be a list of strings")
    graph_gb = data.get("decode_cuda_graph_memory_gb")
    if graph_gb is not None and (isinstance(graph_gb, bool) or not isinstance(graph_gb, (int, float))):
        raise ConfigError(f"{path}: 'decode_cuda_graph_memory_gb' must be a number of GB, not {graph_gb!r}")
    return RoleConfig(
        nnodes=nnodes,
        argv=tuple(argv or ()),
        ranks=tuple(tuple(r) for r in ranks or ()),
        decode_cuda_graph_memory_gb=None if graph_gb is None else float(graph_gb),
    )


def restart_backoff(failures: int, first_s: float, most_s: float) -> float:
    """Doubling from `first_s` with each consecutive failure, capped at `most_s`; the exponent is
    capped too, so a launcher told never to exit on a crash loop keeps its cap after any number."""
    return min(first_s * 2.0 ** min(failures - 1, 64), most_s)


def read_role(path: Path) -> str | None:
    """The role a downward-API file states: either the bare annotation value (a single-key
    `fieldRef: metadata.annotations['hybridserving.io/role']`, as the operator mounts it) or a
    `key="value"` line of a whole annotations file. Anything but prefill or decode means "no role":
    keep the current one."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):  # missing, unreadable or garbled: a later read may succeed
        return None
    value = text.strip()
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if sep and key.strip() == LABEL_ROLE:
            value = raw.strip().strip('"')
            break
    return value if value in ROLES else None


def pinned_document(config_dir: Path, role_file: Path, role: str) -> Path | None:
    """The document of exactly the configuration the pod is annotated with, when that is for `role`.

    None when the pod is annotated with another role or has no hash file beside its role file (a
    pod rendered by an operator that did not mount one): the spec's `<role>.json` then stands. The
    operator patches a pod's role and hash together, and the two files come from one downward-API
    volume, so a switched pod's hash is that of the role it is switching to.
    """
    try:
        config_hash = (role_file.parent / CONFIG_HASH_FILE_NAME).read_text().strip()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if read_role(role_file) != role or len(config_hash) <= HALF_HASH:
        return None
    return config_dir / role_document_name(role, config_hash[HALF_HASH:])


@dataclass(frozen=True)
class Settings:
    """Everything the launcher reads from its environment (see docs/engine.md)."""

    config_dir: Path
    role_file: Path
    node_rank: int = 0
    backend: str = "sglang"
    host: str = "0.0.0.0"
    port: int = 8080
    drain_timeout_s: float = 600.0
    idle_window_s: float = 3.0
    stop_grace_s: float = 30.0
    startup_timeout_s: float = 3600.0
    """Bounds every start of the engine: nothing else does (the liveness probe asks only whether the
    launcher lives), so a start that hangs would hold the pod's GPUs for good."""
    poll_interval_s: float = 1.0
    config_wait_s: float = 120.0
    """How long a start waits for its pinned document to appear: the kubelet updates the ConfigMap
    volume up to a sync period (a minute by default) after the pod's annotations."""
    restart_backoff_s: float = 2.0
    restart_backoff_max_s: float = 60.0
    crash_loop_restarts: int = 5
    crash_loop_exit: bool = True
    health_recheck_s: float = 30.0
    """How often the leader runs the engine's `/health` while Ready; two failures in a row are a hang."""
    engine_health_timeout_s: float = 20.0
    """`SGLANG_HEALTH_CHECK_TIMEOUT`, which the engine inherits: its `/health` answers within it and a second."""
    preflight: str = "enforce"
    preflight_rdma: bool = True
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        e = dict(os.environ if env is None else env)

        def setting(name: str) -> Any:
            """Read as the operator checked it at admission (`contract.ENV_SETTINGS`); a value it could
            not check (from a Secret or ConfigMap) that is wrong stops the launcher, naming it."""
            try:
                return ENV_SETTINGS[name].read(e.get(name))
            except ValueError as err:
                raise ConfigError(f"{err}: fix it in the fleet's spec.engine.env") from None

        def whole(name: str, default: str) -> int:
            """A number the operator renders (the pod's rank, its launcher port); an override
            that is not one stops the launcher naming it, not with a traceback."""
            raw = e.get(name, default)
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a whole number: remove it from the fleet's "
                                  "spec.engine.env, the operator sets it") from None
            if value < 0:
                raise ConfigError(f"{name}={raw!r} is negative: remove it from the fleet's spec.engine.env, "
                                  "the operator sets it")
            return value

        values: dict[str, Any] = dict(
            config_dir=Path(e.get(ENV_CONFIG_DIR, CONFIG_DIR)),
            role_file=Path(e.get(ENV_ROLE_FILE, ROLE_FILE)),
            node_rank=whole(ENV_NODE_RANK, "0"),
            backend=setting("HYBRIDSERVING_ENGINE_BACKEND"),
            host=e.get("HYBRIDSERVING_LAUNCHER_HOST", "0.0.0.0"),
            port=whole(ENV_LAUNCHER_PORT, "8080"),
            drain_timeout_s=setting(ENV_DRAIN_TIMEOUT_S),
            idle_window_s=setting("HYBRIDSERVING_IDLE_WINDOW_S"),
            stop_grace_s=setting("HYBRIDSERVING_STOP_GRACE_S"),
            startup_timeout_s=setting("HYBRIDSERVING_STARTUP_TIMEOUT_S"),
            poll_interval_s=setting("HYBRIDSERVING_POLL_INTERVAL_S"),
            config_wait_s=setting("HYBRIDSERVING_CONFIG_WAIT_S"),
            restart_backoff_s=setting("HYBRIDSERVING_RESTART_BACKOFF_S"),
            restart_backoff_max_s=setting("HYBRIDSERVING_RESTART_BACKOFF_MAX_S"),
            crash_loop_restarts=setting("HYBRIDSERVING_CRASH_LOOP_RESTARTS"),
            crash_loop_exit=setting("HYBRIDSERVING_CRASH_LOOP_EXIT") == "1",
            health_recheck_s=setting("HYBRIDSERVING_HEALTH_RECHECK_S"),
            engine_health_timeout_s=setting("SGLANG_HEALTH_CHECK_TIMEOUT"),
            preflight=setting("HYBRIDSERVING_PREFLIGHT"),
            preflight_rdma=setting("HYBRIDSERVING_PREFLIGHT_RDMA") == "1",
            api_key=e.get(ENV_ENGINE_API_KEY) or None,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def engine_command(backend: str, argv: list[str]) -> list[str]:
    """The process that serves `argv`: SGLang in production, its simulator in tests and demos."""
    module = "sglang.launch_server" if backend == "sglang" else "hybridserving_engine.simulator"
    return [sys.executable, "-m", module, *argv]


def engine_url(argv: list[str], node_rank: int, leader_address: str | None = None) -> str:
    """Where the instance's HTTP API answers. A worker rank's own server is only a health check
    (`local_url`), so worker ranks reach the leader (the host of `--dist-init-addr`) on the same
    port: at `leader_address`, the address that name last resolved to, where known. The name is the
    instance's headless Service, which the garbage collector deletes with the pods when the instance
    goes, while the leader still drains; the address, like the connections the ranks already hold,
    stays the leader's while it runs."""
    host = flag_value(argv, "--host", "127.0.0.1")
    if node_rank > 0 and flag_value(argv, "--dist-init-addr"):
        host = leader_address or leader_host(argv)
    return _http_url(host, flag_value(argv, "--port", "30000"))


def leader_host(argv: list[str]) -> str:
    """The leader's name on a worker rank: the host of `--dist-init-addr`."""
    return (flag_value(argv, "--dist-init-addr") or "127.0.0.1:0").rsplit(":", 1)[0]


def local_url(argv: list[str]) -> str:
    """This rank's own engine server: the whole API on rank 0; on a worker rank the dummy health check
    it serves once its schedulers are up (`entrypoints/engine.py:1234-1284`)."""
    return _http_url(flag_value(argv, "--host", "127.0.0.1"), flag_value(argv, "--port", "30000"))


def _http_url(host: str, port: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{port}"


# ---------------------------------------------------------------------------------- status


@dataclass
class SwitchRecord:
    """One role change as the controller sees it on `/status`."""

    from_role: str
    to_role: str
    mode: str
    started: float = field(default_factory=time.time)
    step: str = "Draining"
    outcome: str = "InProgress"
    message: str = ""
    finished: float | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)

    def advance(self, step: str, message: str = "") -> None:
        self.step = step
        self.steps.append({"step": step, "at": time.time(), "message": message})
        log.info("role switch %s -> %s (%s): %s %s", self.from_role, self.to_role, self.mode, step, message)

    def finish(self, outcome: str, message: str = "") -> None:
        self.outcome, self.message, self.finished = outcome, message, time.time()
        self.advance(outcome, message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fromRole": self.from_role, "toRole": self.to_role, "mode": self.mode, "step": self.step,
            "outcome": self.outcome, "message": self.message, "started": self.started,
            "finished": self.finished, "steps": self.steps,
        }


class LauncherMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.phase = Gauge("hybridserving_launcher_phase", "1 for the launcher's current phase.", ["phase"], registry=r)
        self.role = Gauge("hybridserving_launcher_role", "1 for the role the engine serves.", ["role"], registry=r)
        self.switches = Counter(
            "hybridserving_launcher_role_switches", "Role switches by outcome.",
            ["from_role", "to_role", "mode", "outcome"], registry=r)
        self.restarts = Counter("hybridserving_launcher_engine_restarts", "Engine restarts after a crash.",
                                registry=r)
        self.engine_up = Gauge("hybridserving_launcher_engine_up", "1 while the engine answers /health.",
                               registry=r)

    def show(self, phase: str, role: str | None) -> None:
        for p in PHASES:
            self.phase.labels(phase=p).set(1 if p == phase else 0)
        for r in ROLES:
            self.role.labels(role=r).set(1 if r == role else 0)


# ---------------------------------------------------------------------------------- the launcher


class Launcher:
    """Runs, supervises, drains and switches one engine; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        probes: preflight.Probes | None = None,
        command: Callable[[str, list[str]], list[str]] = engine_command,
        reaps_orphans: bool | None = None,
    ) -> None:
        self.settings = settings
        self.probes = probes or preflight.Probes()
        self.command = command
        # Orphans are re-parented to PID 1 (or a subreaper); elsewhere they are not the launcher's.
        self.reaps_orphans = os.getpid() == 1 if reaps_orphans is None else reaps_orphans
        self.metrics = LauncherMetrics()
        self.role: str | None = None
        self.desired_role: str | None = None
        self._handled_role: str | None = None
        self.phase = "WaitingForRole"
        self.message = ""
        self.proc: asyncio.subprocess.Process | None = None
        self.argv: list[str] = []
        self.nnodes = 1
        self.engine_healthy = False
        # A worker rank's leader: its address once resolved (`engine_url`), and its probes unanswered in a row.
        self.leader_address: str | None = None
        self._leader_misses = 0
        # Whether the engine may hold requests: set once the pod turns Ready (only then do the router
        # and Services send to it), cleared when it starts and when a drain ends idle. A drain with
        # nothing to wait for ends at once, not after polling a loading engine for the drain timeout.
        self.may_hold_requests = False
        self._output: list[Forwarder] = []
        self.restarts = 0
        self.consecutive_failures = 0
        self.last_exit_code: int | None = None
        self.exit_status: int | None = None
        self.started_at: float | None = None
        # By when (monotonic clock) the engine's latest start must serve; None once it has served.
        self._ready_by: float | None = None
        self.switch_count = 0
        self.last_switch: SwitchRecord | None = None
        self._terminate = asyncio.Event()
        self._terminated_at: float | None = None  # monotonic time of the SIGTERM
        self._role_changed = asyncio.Event()
        self._engine_hung = asyncio.Event()
        self._exit: tuple[asyncio.subprocess.Process, asyncio.Task[int]] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.set_phase("WaitingForRole")

    # ---- reporting

    def set_phase(self, phase: str, message: str = "") -> None:
        if phase != self.phase or message != self.message:
            log.info("launcher phase %s%s", phase, f": {message}" if message else "")
        self.phase, self.message = phase, message
        if phase == "Ready":
            self.may_hold_requests = True
        self.metrics.show(phase, self.role)

    def status(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "desiredRole": self.desired_role,
            "phase": self.phase,
            "message": self.message,
            "ready": self.is_ready(),
            "nodeRank": self.settings.node_rank,
            "nnodes": self.nnodes,
            "backend": self.settings.backend,
            "engine": {
                "pid": self.proc.pid if self.proc else None,
                "url": self._engine_url() if self.argv else None,
                "healthy": self.engine_healthy,
                "restarts": self.restarts,
                "lastExitCode": self.last_exit_code,
                "startedAt": self.started_at,
            },
            "switchCount": self.switch_count,
            "lastSwitch": self.last_switch.to_dict() if self.last_switch else None,
        }

    def is_ready(self) -> bool:
        return self.phase == "Ready" and self.engine_healthy and not self._terminate.is_set()

    def _on_terminate(self) -> None:
        if self._terminated_at is None:
            self._terminated_at = time.monotonic()
        self._terminate.set()

    # ---- HTTP surface

    async def start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.settings.host, self.settings.port).start()
        log.info("launcher listening on %s:%d", self.settings.host, self.settings.port)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "phase": self.phase})

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = self.is_ready()
        return web.json_response({"ready": ready, "phase": self.phase}, status=200 if ready else 503)

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.engine_up.set(1 if self.engine_healthy else 0)
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # The engine answers only with the fleet's key (`--api-key`, below); /ready would without.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10),
                                                  headers=bearer(self.settings.api_key))
        return self._session

    # ---- engine process

    async def _config(self, role: str) -> RoleConfig:
        """The document of the configuration this pod runs in `role` (`pinned_document`), once the
        ConfigMap volume shows it; else the spec's `<role>.json`.

        A ConfigMap written by an operator that keeps no documents by hash has no `<role>-*.json`
        key: nothing to wait for then; nor on SIGTERM, which would otherwise wait out the deadline
        (`_sleep` returns at once from then on) and keep the pod from stopping.
        """
        s = self.settings
        deadline = time.monotonic() + s.config_wait_s
        path = pinned_document(s.config_dir, s.role_file, role)
        while path is not None and not path.exists():
            if self._terminate.is_set() or not any(s.config_dir.glob(f"{role}-*.json")):
                path = None
            elif time.monotonic() >= deadline:
                log.warning("%s has not appeared in %.0f s; starting %s from %s.json, the spec's", path,
                            s.config_wait_s, role, role)
                path = None
            else:
                # Nothing starts or switches meanwhile; /status and the log say on what (the phase stays).
                waiting = (f"waiting up to {s.config_wait_s:.0f} s for {path.name}, the configuration this "
                           f"pod runs, in {s.config_dir}")
                if self.message != waiting:
                    log.info("%s", waiting)
                    self.message = waiting
                await self._sleep(s.poll_interval_s)
                path = pinned_document(s.config_dir, s.role_file, role)
        return load_role_config(path or s.config_dir / f"{role}.json")

    async def start_engine(self, role: str) -> None:
        """Start the engine in `role`, unless SIGTERM came while its configuration was awaited: an
        engine started then would only be stopped again, after taking the GPUs for its start-up."""
        config = await self._config(role)
        if self._terminate.is_set():
            return
        self.nnodes = config.nnodes
        self.argv = fill_pod_values(config.argv_for(self.settings.node_rank), os.environ, self.settings.node_rank)
        cmd = self.command(self.settings.backend, self.argv)
        log.info("starting engine as %s (node rank %d): %s", role, self.settings.node_rank, " ".join(cmd))
        if self.settings.api_key:
            # Appended here, after the log line, so the key is in no ConfigMap, launcher log line or
            # status: SGLang then asks it of every caller but probes and scrapers (utils/auth.py:98-151).
            # SGLang logs it among its server_args; the Forwarders blank it out of the engine's output.
            cmd += ["--api-key", self.settings.api_key]
        # Pipes of the launcher's own, not asyncio's: Process.wait() then ends with the engine, not
        # with the last process that holds its output open (asyncio wakes it once its pipes close).
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            # A session of its own: the pod's signals reach only the launcher, the engine's processes
            # can be killed as one group, and children.reap_orphans knows it for the launcher's.
            self.proc = await asyncio.create_subprocess_exec(*cmd, stdout=out_w, stderr=err_w,
                                                             start_new_session=True)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w):
                os.close(fd)
        self._output = [Forwarder(out_r, sys.stdout.fileno(), self.settings.api_key),
                        Forwarder(err_r, sys.stderr.fileno(), self.settings.api_key)]
        self.role = role
        self.engine_healthy = False
        self.may_hold_requests = False
        self.started_at = time.time()
        self._ready_by = time.monotonic() + self.settings.startup_timeout_s
        self.set_phase("Starting")

    async def stop_engine(self) -> None:
        """SIGTERM to the engine's main process only, SIGKILL to its whole process group after the
        stop grace or once the main process is gone.

        Only SGLang's main process handles SIGTERM (`managers/tokenizer_manager.py:2451-2455`): it
        asks its schedulers to exit and waits for them (lines 3508-3560). Its schedulers have no
        handler of their own; SIGTERM would kill them at once, its SubprocessWatchdog would take
        that for a crash and SIGQUIT the main process (`utils/watchdog.py:210-222`), which then
        kills its tree (`tokenizer_manager.py:4072-4081`) without releasing anything. The default
        grace (30 s) covers SGLang's own sequence: up to 5 s until it notices the signal, up to
        15 s for its schedulers to release (`_SCHEDULER_EXIT_TIMEOUT_SECS`, line 456), the rest
        for reaping them and stopping the HTTP server.
        """
        proc, self.proc = self.proc, None
        self.engine_healthy = False
        if proc is None:
            return
        self.last_exit_code = await self._end_engine(proc)
        await self._finish_output()

    async def _end_engine(self, proc: asyncio.subprocess.Process) -> int:
        """`proc`'s exit status, once SIGTERM and, after the grace, SIGKILL have ended it (see `stop_engine`)."""
        if proc.returncode is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                # It exited and asyncio's child watcher reaped it on its own thread, but the loop has
                # not heard yet: nothing to signal, and wait() below returns the status once it has.
                pass
            else:
                try:
                    await asyncio.wait_for(proc.wait(), self.settings.stop_grace_s)
                except asyncio.TimeoutError:
                    log.warning("engine did not stop within %.0f s; killing it", self.settings.stop_grace_s)
        self._kill_group(proc)
        return await proc.wait()

    @staticmethod
    def _kill_group(proc: asyncio.subprocess.Process) -> None:
        """SIGKILL what is left of the engine's process group (its main process leads it): after a
        clean exit nothing, after a crash or a missed grace the processes that would hold the GPUs."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing is left of the group

    async def _finish_output(self) -> None:
        """Let the engine's last lines reach the log before the launcher writes its own."""
        output, self._output = self._output, []
        for forwarder in output:
            if not await asyncio.to_thread(forwarder.join, 5.0):
                log.warning("the engine's output pipe is still held open by a process outside its group")

    async def probe_engine(self) -> bool:
        """Whether the engine serves: `/ready` on the leader (200 once warmed up, while healthy and
        not paused: `managers/tokenizer_manager.py:728-734`; `/health` would run a generation and
        answer after a second at the earliest); on a worker rank its dummy `/health`, which answers
        only once the rank's schedulers have loaded the model (`utils/common.py:3624-3664`)."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        path = "/health" if self.settings.node_rank > 0 else "/ready"
        return await self._engine_answers(path, 10.0)

    async def _engine_answers(self, path: str, timeout_s: float) -> bool:
        """Whether this rank's engine answers `path` with 200 within `timeout_s`."""
        try:
            async with self._client().get(local_url(self.argv) + path,
                                          timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):  # OSError: a reset some aiohttp versions pass on
            return False

    def _engine_url(self) -> str:
        return engine_url(self.argv, self.settings.node_rank, self.leader_address)

    async def engine_loads(self) -> dict[str, Any] | None:
        try:
            async with self._client().get(
                self._engine_url() + "/v1/loads",
                params={"include": "core,disagg,queues"},
            ) as resp:
                if resp.status != 200:
                    return None
                loads: dict[str, Any] = await resp.json()
                return loads
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, OSError):
            return None

    async def drain(self, until_terminate: bool = False, deadline: float | None = None) -> bool:
        """Wait until the engine has held no request for `idle_window_s` without a break.

        The caller has already stopped new traffic at its source (the controller unroutes the
        leader before a switch; on SIGTERM the pod is terminating, which the router watches), but
        the router learns that a moment later and requests already on their way still land. A
        window of idleness, not two polls, is what shows nothing more is coming. False at
        `deadline` (by default the drain timeout from now), which no read of the engine outlasts,
        and with `until_terminate` on SIGTERM: a switch then gives way to the pod's own drain.
        """
        if not self.may_hold_requests:
            return True
        if deadline is None:
            deadline = time.monotonic() + self.settings.drain_timeout_s
        idle_since: float | None = None
        while not (until_terminate and self._terminate.is_set()):
            try:
                loads = await asyncio.wait_for(self.engine_loads(), max(deadline - time.monotonic(), 0.1))
            except asyncio.TimeoutError:
                loads = None
            if loads is None and (self.proc is None or self.proc.returncode is not None):
                return True  # nothing left that could hold a request
            if loads is None and self.settings.node_rank > 0 and await self._leader_gone():
                return True  # a worker rank drains with its leader, which has stopped
            if loads is not None:
                self._leader_misses = 0
                busy = inflight_requests(loads)
                now = time.monotonic()
                if busy:
                    idle_since = None
                    self.message = f"{busy} request(s) in flight"
                else:
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= self.settings.idle_window_s:
                        self.may_hold_requests = False
                        return True
                    self.message = f"idle for {now - idle_since:.1f} s of {self.settings.idle_window_s:.1f} s"
            if time.monotonic() > deadline:
                return False
            if until_terminate:
                await self._sleep(min(self.settings.poll_interval_s, 0.5))
            else:
                await asyncio.sleep(min(self.settings.poll_interval_s, 0.5))
        return False

    # ---- main loop

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_terminate)
        await self.start_http()
        reaper = asyncio.create_task(self._reap_orphans()) if self.reaps_orphans else None
        try:
            if not await self._wait_for_role():
                return 0
            if not await self._preflight():
                return 1
            assert self.role is not None, "a role is read before the engine first starts"
            await self.start_engine(self.role)
            watchers = [asyncio.create_task(self._keep_watching(self._watch_role_file, "role file watch"))]
            if self.settings.node_rank == 0:
                watchers.append(asyncio.create_task(self._keep_watching(self._watch_health, "engine health watch")))
            try:
                await self._supervise()
            finally:
                for watcher in watchers:
                    watcher.cancel()
            if self.exit_status is not None:
                return self.exit_status
            await self._shutdown()
            return 0
        finally:
            if self.proc is not None:
                # Left running by an error on the way out. A container's end would take it with the
                # launcher; a launcher run outside one must not leave it holding its port.
                self._kill_group(self.proc)
            if reaper is not None:
                reaper.cancel()
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

    async def _reap_orphans(self) -> None:
        while True:
            for pid in reap_orphans():
                log.info("reaped orphaned process %d", pid)
            await asyncio.sleep(self.settings.poll_interval_s)

    async def _wait_for_role(self) -> bool:
        while not self._terminate.is_set():
            role = read_role(self.settings.role_file)
            if role is not None:
                self.role = self.desired_role = self._handled_role = role
                return True
            self.set_phase("WaitingForRole", f"no prefill/decode role in {self.settings.role_file}")
            await self._sleep(self.settings.poll_interval_s)
        return False

    async def _preflight(self) -> bool:
        """Whether the node can run the engine. A failure exits the launcher, as a crash loop does:
        the kubelet restarts the container with its back-off (a node still bringing up its GPUs
        or RDMA devices passes a later check) and keeps the last log line, which names the
        problems, as the termination message the instance status shows. The check runs off the
        event loop: importing torch and asking CUDA can take longer than the liveness probe waits."""
        if self.settings.backend != "sglang" or self.settings.preflight == "off":
            return True
        assert self.role is not None, "preflight runs once the role is read"
        argv = (await self._config(self.role)).argv_for(self.settings.node_rank)
        problems = await asyncio.to_thread(preflight.check, argv, self.probes,
                                           require_rdma=self.settings.preflight_rdma)
        for problem in problems:
            log.error("preflight: %s", problem)
        if problems and self.settings.preflight == "enforce":
            self.set_phase("PreflightFailed", "; ".join(problems))
            log.error("preflight failed: %s; exiting so that the container restarts and checks again",
                      "; ".join(problems))
            return False
        return True

    async def _keep_watching(self, watch: Callable[[], Awaitable[None]], what: str) -> None:
        """Run `watch` for as long as the engine is supervised. Nothing awaits a watcher, so one
        ended by an error it did not foresee would end silently: role switches, or the hang check,
        would stop while /status still said Ready. It is logged and started again instead."""
        while True:
            try:
                await watch()
            except Exception:
                log.exception("%s failed; starting it again", what)
                await asyncio.sleep(max(self.settings.poll_interval_s, 1.0))

    async def _watch_role_file(self) -> None:
        while True:
            role = read_role(self.settings.role_file)
            if role is not None and role != self._handled_role:
                self._handled_role = role
                self.desired_role = role
                self._role_changed.set()
            await asyncio.sleep(self.settings.poll_interval_s)

    async def _watch_health(self) -> None:
        """Tell a hung engine from a busy one. A scheduler that stops making progress leaves SGLang's
        HTTP server answering and its `/ready` at 200: only `/health` notices, its one-token request
        getting no output within `SGLANG_HEALTH_CHECK_TIMEOUT` (`entrypoints/http_server.py:776-799`),
        and that failure turns `/ready` and `/ping` 503 until a later `/health` passes (the status
        stays UnHealthy: line 784, `managers/tokenizer_manager.py:728-734`), which takes the pod out of
        its Services. So the leader runs `/health` every `health_recheck_s` while Ready, except on a
        paused engine (`/ready` 503, `/ping` 200), whose health request would wait for it to continue
        (`tokenizer_manager.py:938-939`); an engine that fails it twice in a row, `health_recheck_s`
        apart, is hung, and `_supervise` ends it for the crash path to restart."""
        failed = False
        while True:
            await asyncio.sleep(self.settings.health_recheck_s)
            proc = self.proc
            if self.phase != "Ready" or proc is None or proc.returncode is not None:
                failed = False
                continue
            switches = self.switch_count
            if not await self._engine_answers("/ready", 10.0) and await self._engine_answers("/ping", 10.0):
                failed = False  # paused
                continue
            answered = await self._engine_answers("/health", self.settings.engine_health_timeout_s + 5)
            if self.proc is not proc or self.switch_count != switches or self.phase != "Ready":
                failed = False  # a switch or restart meanwhile: a failure says nothing of the engine now
            elif answered:
                if failed:
                    log.info("engine answers /health again")
                failed = False
            elif failed:
                self._engine_hung.set()
            else:
                failed = True
                log.warning("engine answered no /health within %.0f s; checking again in %.0f s",
                            self.settings.engine_health_timeout_s, self.settings.health_recheck_s)

    async def _end_hung_engine(self) -> None:
        """Restart an engine `_watch_health` found hung (SGLang, unhealthy, exits at once on SIGTERM:
        `managers/tokenizer_manager.py:3517-3524`)."""
        proc = self.proc
        if proc is None or proc.returncode is not None or self.phase != "Ready":
            return
        await self._restart_broken_engine(
            f"engine hung: /health failed twice, {self.settings.health_recheck_s:.0f} s apart")

    def _start_overdue(self) -> bool:
        return self._ready_by is not None and time.monotonic() > self._ready_by

    def _start_timeout_cause(self) -> str:
        timeout = self.settings.startup_timeout_s
        return f"engine not ready within HYBRIDSERVING_STARTUP_TIMEOUT_S ({timeout:g} s) of its start"

    async def _restart_broken_engine(self, cause: str) -> None:
        """Stop an engine that runs but does not serve, as on SIGTERM, and restart it down the crash
        path, whose back-off and crash loop then apply to an engine that keeps failing this way."""
        assert self.proc is not None, "called for a running engine"
        log.error("%s; stopping it to restart it", cause)
        self.engine_healthy = False
        self.set_phase("Restarting", f"{cause}; stopping it")
        await self._end_engine(self.proc)
        await self._restart_after_crash(cause)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once on SIGTERM."""
        try:
            await asyncio.wait_for(self._terminate.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _supervise(self) -> None:
        while not self._terminate.is_set():
            if self._engine_hung.is_set():
                self._engine_hung.clear()
                await self._end_hung_engine()
                continue
            if self._role_changed.is_set():
                self._role_changed.clear()
                if self.desired_role is not None and self.desired_role != self.role:
                    await self.switch_role(self.desired_role)
                    continue
            if self.proc is not None and self.proc.returncode is not None:
                await self._restart_after_crash()
                continue
            healthy = await self.probe_engine()
            if healthy != self.engine_healthy:
                self.engine_healthy = healthy
                self.metrics.engine_up.set(1 if healthy else 0)
            if healthy:
                self._ready_by = None
                if self.phase in ("Starting", "Restarting", "CrashLoop"):
                    self.consecutive_failures = 0
                    if self.settings.node_rank > 0:
                        await self._remember_leader()
                    self.set_phase("Ready")
            elif self._start_overdue():
                await self._restart_broken_engine(self._start_timeout_cause())
                continue
            await self._wait_any(self.settings.poll_interval_s)

    async def _wait_any(self, seconds: float) -> None:
        """Wait for SIGTERM, a role change, a hung or exited engine or `seconds`, whichever comes first."""
        waits: list[asyncio.Task[Any]] = [
            asyncio.create_task(self._terminate.wait()), asyncio.create_task(self._role_changed.wait()),
            asyncio.create_task(self._engine_hung.wait()),
        ]
        exited = self._exit_of(self.proc) if self.proc is not None and self.proc.returncode is None else None
        if exited is not None:
            waits.append(exited)
        _, pending = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            if task is not exited:
                task.cancel()

    def _exit_of(self, proc: asyncio.subprocess.Process) -> asyncio.Task[int]:
        """One wait for the engine's exit for its whole life. asyncio keeps each `wait()`'s future
        until the process exits, a cancelled one too, so a new wait every poll would grow the
        launcher's memory by one future a second for as long as the engine runs."""
        if self._exit is None or self._exit[0] is not proc:
            self._exit = (proc, asyncio.ensure_future(proc.wait()))
        return self._exit[1]

    async def _restart_after_crash(self, stopped_for: str | None = None) -> None:
        """`stopped_for`: why the launcher ended the engine, when it did; /status and the crash loop's
        last log line then say so, not just the exit status the stop gave it."""
        assert self.proc is not None, "called for an engine that has exited"
        assert self.role is not None, "an engine ran, so its role is known"
        code = self.proc.returncode
        self.last_exit_code = code
        self._kill_group(self.proc)
        self.proc = None
        self.engine_healthy = False  # before any wait: /readyz answers meanwhile, and the engine is gone
        await self._finish_output()
        if self.phase == "Failed":
            # A gang whose switch failed: restarted alone, the leader would come back in its old role
            # beside worker ranks in the new one. The controller recreates the gang.
            self.set_phase("Failed", f"engine exited with status {code}; waiting for the gang to be recreated")
            return
        self.restarts += 1
        self.consecutive_failures += 1
        self.metrics.restarts.inc()
        backoff = restart_backoff(self.consecutive_failures, self.settings.restart_backoff_s,
                                  self.settings.restart_backoff_max_s)
        loop_phase = "CrashLoop" if self.consecutive_failures >= self.settings.crash_loop_restarts else "Restarting"
        if loop_phase == "CrashLoop" and self.settings.crash_loop_exit:
            self._exit_crash_looping(code, stopped_for)
            return
        cause = stopped_for or f"engine exited with status {code}"
        self.set_phase(loop_phase, f"{cause}; restart {self.restarts} in {backoff:.1f} s")
        await self._sleep(backoff)
        if self._terminate.is_set():
            return
        await self.start_engine(self.role)
        if loop_phase == "CrashLoop":
            self.set_phase("CrashLoop", f"{self.consecutive_failures} consecutive engine failures")

    def _exit_crash_looping(self, code: int | None, stopped_for: str | None) -> None:
        """Hand a crash loop to the kubelet: exit, so the container restarts with its back-off and
        `kubectl get pods` counts it. The last log line is the termination message
        (terminationMessagePolicy FallbackToLogsOnError), which the instance status shows."""
        self.exit_status = code if code and code > 0 else 128 - code if code and code < 0 else 1
        self.set_phase("CrashLoop", f"{self.consecutive_failures} consecutive engine failures")
        log.error("engine crash loop: %d consecutive engine failures, last exit status %s%s; exiting so that the "
                  "container restarts", self.consecutive_failures, code, f" ({stopped_for})" if stopped_for else "")
        self._terminate.set()

    # ---- role switch

    async def _switch_mode(self, to_role: str) -> str:
        """In place when the running engine's flags and those of the role it goes to both enable it
        (SGLang then keeps weights and KV pool), else relaunch."""
        target = (await self._config(to_role)).argv_for(self.settings.node_rank)
        both = all(has_flag(argv, "--enable-pd-role-switch") for argv in (self.argv, target))
        return "in-place" if both else "relaunch"

    async def switch_role(self, to_role: str) -> SwitchRecord:
        from_role = self.role
        assert from_role is not None, "a switch starts from the role the engine serves"
        record = SwitchRecord(from_role, to_role, await self._switch_mode(to_role))
        self.last_switch = record
        self.switch_count += 1
        try:
            if record.mode == "in-place" and self.settings.node_rank > 0:
                # The leader's scheduler switches every rank, and a worker rank holds no request of its
                # own: a drain here would wait out the leader's requests, which it may serve again by
                # the time this pod's role file changes (each kubelet refreshes it on its own schedule).
                self.role = to_role
                record.finish("Succeeded", f"the leader rank switches this rank's engine; it restarts as {to_role}")
                return record
            record.advance("Draining")
            self.set_phase("Draining", f"switching {from_role} -> {to_role}")
            if not await self.drain(until_terminate=True):
                if self._terminate.is_set():
                    record.finish("Aborted", "pod is terminating")
                else:
                    record.finish("Aborted",
                                  f"engine not idle after {self.settings.drain_timeout_s:.0f} s of draining")
                self.set_phase("Ready" if self.engine_healthy else "Starting", record.message)
                return record
            if record.mode == "in-place":
                await self._switch_in_place(record)
            else:
                await self._relaunch(record, to_role)
            return record
        finally:
            self.metrics.switches.labels(from_role=from_role, to_role=to_role, mode=record.mode,
                                         outcome=record.outcome).inc()
            self.metrics.show(self.phase, self.role)

    async def _switch_in_place(self, record: SwitchRecord) -> None:
        to_role = record.to_role
        self.set_phase("Switching", f"POST /pd_role_switch new_role={to_role}")
        record.advance("Switching")
        body: dict[str, Any] = {"new_role": to_role}
        target = await self._config(to_role)
        graph_gb = target.decode_cuda_graph_memory_gb
        if to_role == "decode" and graph_gb is not None:
            body["decode_cuda_graph_memory_gb"] = graph_gb
        answer = await self._until_terminate(self._post_role_switch(body))
        if answer is not None and not answer.get("success") and answer.get("safe_to_restore"):
            answer = await self._switch_again(body, answer)
        if answer is None:
            # The engine was drained and the pod has been unready since: the pod's own drain has
            # nothing to wait for, whatever state the switch left the engine in.
            record.finish("Aborted", f"pod is terminating; the engine was switching to {to_role}")
            return
        if answer.get("success"):
            record.advance("Verifying")
            mode = await self._engine_role()
            if mode != to_role:
                answer = {"success": False, "safe_to_restore": False,
                          "message": f"engine reports role {mode!r} after switching to {to_role!r}"}
        if answer.get("success"):
            self.role = to_role
            # A later restart must start in the new role with its own flags, filled for this pod.
            self.argv = fill_pod_values(target.argv_for(0), os.environ, 0)
            record.finish("Succeeded", answer.get("message", "ok"))
            self.set_phase("Ready")
        elif answer.get("safe_to_restore"):
            record.finish("Refused", f"engine refused, still {self.role}: {answer.get('message', '')}")
            self.set_phase("Ready", record.message)
        elif self.nnodes > 1:
            # This rank's relaunch would take the worker ranks' engines down with it, and they would
            # come back in whichever role their own launchers hold by then: a gang changes role
            # together, recreated by the controller on this outcome (Switch → Restart).
            # Until then the engine is left as the switch left it, neither ready (SGLang's `/ready`
            # still answers 200: the scheduler's broken flag only refuses later switches,
            # `disaggregation/role_switch.py:133-141, 183-187`) nor restarted alone (`_watch_health`
            # checks only Ready engines; `_restart_after_crash`).
            record.finish("Failed", f"switch failed, the gang needs a restart: {answer.get('message', '')}")
            self.set_phase("Failed", record.message)
        else:
            record.advance("Relaunching", f"switch failed, engine needs a restart: {answer.get('message', '')}")
            await self._relaunch(record, to_role)

    async def _switch_again(self, body: dict[str, Any], refusal: dict[str, Any]) -> dict[str, Any] | None:
        """Ask once more after a refusal that left the engine as it was: it may have been a request
        that landed after the drain's idle window, refused as not idle
        (`disaggregation/role_switch.py:73-77`), where the engine's other such refusals (no flag, a
        backend that cannot switch, no memory for decode graphs) repeat. Refused outright, an
        in-place switch is remembered on the instance and the next one that way goes by relaunch
        (docs/role-switch.md). So the engine is drained anew and asked again; its second answer
        stands, and the first one if the drain does not end idle. None: SIGTERM came."""
        log.info("engine refused the switch (%s); draining once more and asking again", refusal.get("message", ""))
        self.may_hold_requests = True
        if not await self.drain(until_terminate=True):
            return None if self._terminate.is_set() else refusal
        return await self._until_terminate(self._post_role_switch(body))

    async def _post_role_switch(self, body: dict[str, Any]) -> dict[str, Any]:
        """The engine's answer; no time limit, as rebuilding its pools and graphs takes as long as it takes."""
        url = engine_url(self.argv, 0) + "/pd_role_switch"
        try:
            async with self._client().post(url, json=body, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                answer: dict[str, Any] = await resp.json()
                return answer
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
            return {"success": False, "message": f"engine did not answer: {e}", "safe_to_restore": False}

    async def _until_terminate(self, work: Coroutine[Any, Any, T]) -> T | None:
        """`work`'s result, or None once SIGTERM arrives first (`work` is then cancelled)."""
        task = asyncio.create_task(work)
        terminated = asyncio.create_task(self._terminate.wait())
        await asyncio.wait([task, terminated], return_when=asyncio.FIRST_COMPLETED)
        terminated.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None

    async def _engine_role(self) -> str | None:
        """The live role: `/model_info` (`entrypoints/http_server.py:834-836`). `/server_info`'s top
        level is the start-up configuration and keeps the old role after a switch (lines 863-892)."""
        try:
            async with self._client().get(engine_url(self.argv, 0) + "/model_info") as resp:
                info: dict[str, Any] = await resp.json()
                mode: str | None = info.get("disaggregation_mode")
                return mode
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError):
            return None

    async def _relaunch(self, record: SwitchRecord, to_role: str) -> None:
        self.set_phase("Relaunching", f"restarting the engine as {to_role}")
        record.advance("Stopping")
        await self.stop_engine()
        if self._terminate.is_set():
            # A new engine would only be stopped again, after taking the GPUs for its start-up.
            record.finish("Aborted", f"pod is terminating; the engine was stopped before starting as {to_role}")
            return
        record.advance("Starting")
        await self.start_engine(to_role)
        self.set_phase("Relaunching", f"waiting for the engine to serve as {to_role}")
        while not self._terminate.is_set():
            if self.proc is None or self.proc.returncode is not None:
                record.finish("Failed", f"engine exited with status {self.proc.returncode if self.proc else None}")
                self.set_phase("Restarting", record.message)
                return
            if await self.probe_engine():
                self.engine_healthy = True
                self._ready_by = None
                self.consecutive_failures = 0
                record.finish("Succeeded", f"engine relaunched as {to_role}")
                self.set_phase("Ready")
                return
            if self._start_overdue():
                record.finish("Failed", self._start_timeout_cause())
                await self._restart_broken_engine(record.message)
                return
            await self._sleep(min(self.settings.poll_interval_s, 0.5))
        record.finish("Aborted", "pod is terminating")

    # ---- termination

    async def _shutdown(self) -> None:
        """SIGTERM: drain, then stop. New traffic stops at its source, not here: the pod is terminating,
        which the router (smg drops a pod with a deletion timestamp) and Services (terminating
        endpoints are not ready) go by; the pod's readiness is the engine's own `/ready`, which
        stays 200 so that requests already on their way are still served.

        The drain and a worker's wait for its leader share one drain timeout from the signal: the
        pod's terminationGracePeriodSeconds is that timeout plus the stop grace, and the kubelet
        kills whatever runs past it, mid-stop."""
        deadline = (self._terminated_at or time.monotonic()) + self.settings.drain_timeout_s
        self.set_phase("Draining", "pod is terminating")
        if self.proc is not None and self.proc.returncode is None:
            drained = await self.drain(deadline=deadline)
            if not drained:
                log.warning("drain timed out after %.0f s; stopping the engine with requests in flight",
                            self.settings.drain_timeout_s)
        self.set_phase("Stopping")
        if self.settings.node_rank > 0:
            await self._wait_for_leader_to_stop(deadline)
        await self.stop_engine()
        self.set_phase("Stopped")

    async def _wait_for_leader_to_stop(self, deadline: float) -> None:
        """A worker rank's engine ignores SIGTERM and stops when rank 0 broadcasts its shutdown
        (`entrypoints/engine.py:1261-1272`); killing it first would break the leader's collective
        calls mid-request. So a worker waits until the leader's HTTP server is gone (until
        `deadline`, the end of the pod's drain timeout) before signalling, and its stop grace then
        covers the broadcast."""
        while time.monotonic() < deadline and self.proc is not None and self.proc.returncode is None:
            if await self._leader_gone():
                return
            self.message = "waiting for the leader rank to stop"
            await asyncio.sleep(min(self.settings.poll_interval_s, 0.5))

    async def _leader_gone(self) -> bool:
        """Whether the leader has stopped: `LEADER_MISSES` probes in a row unanswered. A leader
        draining minutes of requests can miss one (a stalled event loop, a lost packet), and a worker
        that took that for its stop would be killed at the end of its stop grace, breaking the
        leader's collective calls and every request it still holds."""
        if await self._leader_answers():
            self._leader_misses = 0
            return False
        self._leader_misses += 1
        return self._leader_misses >= LEADER_MISSES

    async def _leader_answers(self) -> bool:
        """Whether the leader's HTTP server still answers at all (a 503 while it shuts down counts)."""
        try:
            async with self._client().get(self._engine_url() + "/ready"):
                return True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _remember_leader(self) -> None:
        """Resolve the leader's name while it resolves: its rank has just joined it by that name.
        A name that does not resolve now keeps the address resolved before, if any."""
        name = leader_host(self.argv)
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM), LEADER_RESOLVE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("could not resolve the leader rank's name %s (%s); its probes go by the name", name, exc)
            return
        if infos:
            self.leader_address = str(infos[0][4][0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridserving-engine", description="Run the engine of one pod.")
    parser.add_argument("--backend", choices=["sglang", "simulator"], default=None,
                        help="sglang (production) or simulator; default $HYBRIDSERVING_ENGINE_BACKEND or sglang")
    parser.add_argument("--config-dir", type=Path, default=None, help="default $HYBRIDSERVING_CONFIG_DIR")
    parser.add_argument("--role-file", type=Path, default=None, help="default $HYBRIDSERVING_ROLE_FILE")
    parser.add_argument("--node-rank", type=int, default=None, help="default $HYBRIDSERVING_NODE_RANK or 0")
    parser.add_argument("--port", type=int, default=None, help="default $HYBRIDSERVING_LAUNCHER_PORT or 8080")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env(
            backend=args.backend, config_dir=args.config_dir, role_file=args.role_file,
            node_rank=args.node_rank, port=args.port,
        )
        return asyncio.run(Launcher(settings).run())
    except ConfigError as e:
        log.error("launcher configuration: %s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
