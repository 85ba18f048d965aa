"""One container of a pod as a local process: its command, environment and lifecycle.

The container runtime gives a container its own mount and network namespaces and kills
its whole cgroup at the end of the grace period. A local process has neither, so the runner
maps mount paths to the directories it materialised, binds the launcher to the pod IP, and
finds the container's processes by ancestry to kill them all (the launcher puts its engine
in a session of its own, which a process-group kill would miss).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hybridserving.contract import expand_references
from hybridserving_engine.podrunner.volumes import WILDCARD_HOSTS, field_value

# What the runner sets on top of the pod's own environment: the SGLang simulator stands in
# for the GPU engine, and the launcher's HTTP listens on the pod IP (its port is not a
# container port the pod declares, so it keeps the launcher's default unless the pod sets one).
BACKEND_ENV = {"HYBRIDSERVING_ENGINE_BACKEND": "simulator"}
LAUNCHER_PORT = 8080


def remap_path(value: str, mounts: Mapping[str, Path]) -> str:
    """A path inside the container translated to the local directory that backs its mount."""
    for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
        mount_path = mount_path.rstrip("/")
        if value == mount_path:
            return str(local)
        if value.startswith(mount_path + "/"):
            return str(local / value[len(mount_path) + 1:])
    return value


# Reads a `secretKeyRef` / `configMapKeyRef` selector's value (None when the key is absent).
KeyReader = Callable[[str, Mapping[str, Any]], "str | None"]


def container_environment(container: Mapping[str, Any], pod: Mapping[str, Any], mounts: Mapping[str, Path],
                          base: Mapping[str, str] | None = None, read_key: KeyReader | None = None) -> dict[str, str]:
    """The environment of `container`: the runner's own (it plays the image's), then the pod's
    `env` (values, downward-API fields and Secret/ConfigMap keys, with mount paths remapped),
    then the runner's settings."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for entry in container.get("env") or []:
        source = entry.get("valueFrom") or {}
        if "value" in entry:
            env[entry["name"]] = remap_path(str(entry["value"]), mounts)
        elif "fieldRef" in source:
            env[entry["name"]] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif read_key is not None:
            for kind in ("secretKeyRef", "configMapKeyRef"):
                if kind in source:
                    value = read_key(kind, source[kind])
                    if value is not None:
                        env[entry["name"]] = value
    env.update(BACKEND_ENV)
    env["HYBRIDSERVING_LAUNCHER_HOST"] = (pod.get("status") or {})["podIP"]
    env.setdefault("HYBRIDSERVING_LAUNCHER_PORT", str(LAUNCHER_PORT))
    return env


def container_command(container: Mapping[str, Any], env: Mapping[str, str], pod_ip: str) -> list[str]:
    """`command` + `args` as the kubelet runs them (`$(VAR)` expanded), the executable found on
    the container's PATH, and a wildcard bind (`--host 0.0.0.0`, `--prometheus-host ::`) pinned to
    the pod IP, which is what it means in a pod's own network namespace (`pin_wildcard_host`)."""
    written = list(container.get("command") or []) + list(container.get("args") or [])
    command = [expand_references(str(a), env) for a in written]
    if not command:
        raise ValueError(f"container {container.get('name')} has no command; the runner has no image to take one from")
    resolved = shutil.which(command[0], path=env.get("PATH"))
    if resolved is None:
        raise FileNotFoundError(f"{command[0]} is not on the container's PATH")
    for i in range(1, len(command) - 1):
        if command[i].startswith("--") and command[i].endswith("-host") and command[i + 1] in WILDCARD_HOSTS:
            command[i + 1] = pod_ip
    return [resolved, *command[1:]]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, found through /proc (children first, recursively)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


_PR_SET_PDEATHSIG = 1
_STOP_POLL_SECONDS = 0.1


def _die_with_parent() -> None:
    """In the forked child: SIGKILL me when the thread that started me exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ContainerProcess:
    """The running process of one container, started and stopped the way the runtime does."""

    def __init__(self, command: list[str], env: dict[str, str], workdir: Path, log_path: Path) -> None:
        self.command = command
        self.env = env
        self.workdir = workdir
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        # The container's processes as last seen: an engine whose launcher died is reparented
        # away from it, yet still belongs to the container.
        self._family: list[int] = []

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            # A session of its own: signals meant for the runner (Ctrl-C) do not reach pods.
            # The kernel kills the container when the runner dies, even by SIGKILL: no launcher
            # outlives the kubelet stand-in that would stop it (Linux: PR_SET_PDEATHSIG).
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        self.started_at = time.time()
        self._family = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        """None while it runs (or before it started), else its exit status; an exited
        container's leftover processes are killed, as the end of its cgroup would."""
        if self.proc is None:
            return None
        code = self._watch()
        if code is not None:
            self._kill_family()
        return code

    def _watch(self) -> int | None:
        """The main process's exit status once it has exited; while it runs, its processes seen now.

        The processes are read between two polls: a main process that dies during the read has
        already handed its orphans to another parent, so the read misses them. Such a read is
        dropped and the processes seen before it stand, to be killed with the container.
        """
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            family = descendants(self.proc.pid)
            code = self.proc.poll()
            if code is None:
                self._family = family
        return code

    def _kill_family(self) -> None:
        for pid in self._family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._family = []

    def stop(self, deadline: Callable[[], float]) -> int | None:
        """SIGTERM to the container's main process, SIGKILL to all of its processes at the deadline.

        The deadline (a `time.monotonic()` instant) is asked again while the process drains: the
        runner's own shutdown can bring it forward.
        """
        if self.proc is None:
            return None
        if self._watch() is None:
            self.proc.send_signal(signal.SIGTERM)
            while (code := self._watch()) is None and time.monotonic() < deadline():
                time.sleep(_STOP_POLL_SECONDS)
            if code is None:
                self._family = [self.proc.pid, *self._family]
        self._kill_family()
        self.proc.wait()
        return self.proc.returncode
