"""Starting simulators as local processes on 127.0.0.1: for tests, benchmarks and demos."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


_HANDED_OUT: set[int] = set()


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports, none handed out before by this process: a port chosen for a server
    not started yet is free again to the kernel, which may offer it to the next caller, and the
    second server to bind it would fail."""
    sockets = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            sockets.append(s)  # held bound until all are chosen, so no two here are the same
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                ports.append(port)
        _HANDED_OUT.update(ports)
        return ports
    finally:
        for s in sockets:
            s.close()


def wait_http(url: str, timeout: float = 30.0, status: int = 200) -> None:
    """Block until `url` answers `status`; raise TimeoutError naming the last failure otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == status:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as e:
            if e.code == status:
                return
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} within {timeout:.0f} s ({last})")


def simulator_env(time_scale: float = 1.0, startup_seconds: float = 0.0, profile: str | None = None,
                  faults: str = "") -> dict[str, str]:
    """The environment of a simulator process with the given knobs."""
    env = dict(os.environ)
    env.update({
        "HYBRIDSERVING_SIM_TIME_SCALE": str(time_scale),
        "HYBRIDSERVING_SIM_STARTUP_SECONDS": str(startup_seconds),
        "HYBRIDSERVING_SIM_FAULTS": faults,
    })
    if profile:
        env["HYBRIDSERVING_SIM_PROFILE"] = profile
    return env


class SimulatorProcess:
    """One simulator subprocess serving SGLang's API on 127.0.0.1:`port`."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, log_path: str | None = None) -> None:
        self.argv = argv
        self.port = int(argv[argv.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115 - closed in stop()
        out = self._log if self._log is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridserving_engine.simulator", *argv],
            env=env or simulator_env(), stdout=out, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30.0) -> SimulatorProcess:
        wait_http(self.url + "/ready", timeout)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log:
            self._log.close()

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
