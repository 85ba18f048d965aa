"""The local control plane's supervisor: a component that came up and exits is started again, one
that does not come up or crash-loops ends the supervisor, so the cluster reports it dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hybridserving.devcluster.cluster import SUPERVISOR, _is_supervisor, _supervised

# Every run appends a line to `runs`; $1 says how many runs come up (last 0.5 s, past the settle
# time) before the rest do what $2 says.
COMPONENT = 'echo run >> runs; if [ "$(wc -l < runs)" -le "$1" ]; then sleep 0.5; exit 1; fi; eval "$2"'


def supervise(tmp_path: Path, up: int, then: str, burst: int = 3) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", str(SUPERVISOR), "--settle", "0.3", "--backoff", "0.05", "--burst", str(burst),
         "--", "sh", "-c", COMPONENT, "component", str(up), then],
        cwd=tmp_path, start_new_session=True, stderr=subprocess.PIPE)


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_first_run_that_does_not_come_up_ends_the_supervisor_with_its_status(tmp_path: Path) -> None:
    proc = supervise(tmp_path, up=0, then="exit 3")
    assert proc.wait(10) == 3
    assert runs(tmp_path) == 1
    assert b"not starting it again" in (proc.stderr.read() if proc.stderr else b"")


def test_a_component_that_came_up_and_exits_is_started_again_until_its_supervisor_is_stopped(
        tmp_path: Path) -> None:
    proc = supervise(tmp_path, up=2, then="exec sleep 60")
    deadline = time.monotonic() + 10
    while runs(tmp_path) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, runs(tmp_path)
        time.sleep(0.05)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)  # the supervisor alone: it hands the signal on
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert runs(tmp_path) == 3
    deadline = time.monotonic() + 5
    while True:  # nothing is left in its process group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the component outlived its supervisor"
        time.sleep(0.05)


def test_a_crash_loop_ends_the_supervisor_after_burst_runs_in_a_row_that_did_not_come_up(tmp_path: Path) -> None:
    proc = supervise(tmp_path, up=1, then="exit 2", burst=3)
    assert proc.wait(20) == 2
    assert runs(tmp_path) == 1 + 3


def test_the_cluster_knows_its_supervisors_by_their_command_line() -> None:
    cmd = _supervised(["/bin/kube-scheduler", "--config=/c/scheduler.yaml"])
    assert _is_supervisor(cmd)
    other_checkout = [cmd[0], "-I", "/elsewhere/hybridserving/devcluster/supervise.py", *cmd[3:]]
    assert _is_supervisor(other_checkout)
    assert not _is_supervisor(["/bin/kube-scheduler", "--config=/c/scheduler.yaml"])


# Records each SIGTERM or SIGINT it gets, as its name, in `signals`; exits 0 a second after the first.
RECORDER = """
import signal, sys, time
got = []
def record(signum, _frame):
    got.append(signal.Signals(signum).name)
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, record)
open("started", "w").close()
while not got:
    time.sleep(0.01)
time.sleep(1)
open("signals", "w").write(" ".join(got))
"""


def test_a_stop_request_reaches_the_component_once_as_the_signal_it_was(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-I", str(SUPERVISOR), "--settle", "0.3", "--", sys.executable, "-c",
                             RECORDER], cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 10
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(10) == 0
    assert (tmp_path / "signals").read_text() == "SIGINT"
