"""The demo's failure paths: a process of the stack that exits ends the wait at once and names its log,
a failed step ends in a report instead of a traceback and keeps the logs it names, the teardown
outlasts a SIGTERM and a hangup, and a cluster another live process owns is left alone."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridserving.demo import __main__ as demo
from hybridserving.devcluster.cluster import Cluster, DevClusterError, _pid_starttime
from hybridserving.devcluster.stack import Child, ProcessExited, Stack

ARGS = argparse.Namespace(cluster="demo", nodes=4, phase_seconds=1.0, keep=False)


@pytest.fixture(autouse=True)
def signal_handlers() -> Iterator[None]:
    """run() installs its own handlers; the test process gets its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_wait_ends_at_once_when_a_process_of_the_stack_exited(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('cannot reach the apiserver'); raise SystemExit(3)"],
                                stdout=out, stderr=subprocess.STDOUT)
    proc.wait(30)
    child = Child("operator", proc, log)
    stack = Stack(Cluster("unit", root=tmp_path), tmp_path, [child])
    started = time.monotonic()
    with pytest.raises(ProcessExited) as raised:
        demo._wait("the fleet to be Ready", lambda: False, 180, stack.check_alive)
    assert time.monotonic() - started < 5
    assert str(raised.value).startswith(f"operator exited with 3; see {child.log}\n")
    assert "cannot reach the apiserver" in str(raised.value), "the end of its log comes with it"


def test_a_process_killed_by_a_signal_is_named_with_it(tmp_path: Path) -> None:
    log = tmp_path / "runner.log"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.kill()
    proc.wait(10)
    stack = Stack(Cluster("unit", root=tmp_path), tmp_path, [Child("pod runner", proc, log)])
    with pytest.raises(ProcessExited, match=r"^pod runner exited with -9 \(Killed\); see "):
        stack.check_alive()


def test_a_failed_read_is_blamed_on_the_process_that_exited_meanwhile() -> None:
    checks: list[int] = []

    def alive() -> None:
        if checks:
            raise ProcessExited("router demo exited with 1; see router-demo.log")

    def check() -> bool:
        checks.append(1)
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(ProcessExited, match="router demo exited"):
        demo._wait("the router to discover 4 healthy workers", check, 120, alive)


def test_a_wait_that_runs_out_names_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="waiting for a role switch to finish"):
        demo._wait("a role switch to finish", lambda: False, 0, lambda: None)


@pytest.mark.parametrize(("error", "hint"), [
    (FileNotFoundError(2, "No such file or directory", "openssl"), "make setup"),
    (subprocess.TimeoutExpired(["kubectl", "get", "crd"], 60), "busy machine"),
    (TimeoutError("timed out after 180 s waiting for the fleet to be Ready"), "busy machine"),
    (ProcessExited("operator exited with 1; see operator.log"), "end of its log"),
    (DevClusterError("cluster demo: kube-apiserver exited 1"), "control plane's logs"),
    (demo.ClientRequestsFailed("3 of 90 client requests failed"), "router's log"),
])
def test_a_failure_report_names_the_step_the_error_a_hint_and_the_logs(error: BaseException, hint: str,
                                                                        tmp_path: Path) -> None:
    logs = {"operator, pod runner and its engines, router": tmp_path / "work", "control plane": tmp_path / "logs"}
    report = demo.failure_report("waiting for the fleet to be Ready", error, logs)
    assert f"the demo failed while waiting for the fleet to be Ready: {error}" in report
    assert hint in report
    assert f"{tmp_path / 'work'}  (operator, pod runner and its engines, router)" in report
    assert f"{tmp_path / 'logs'}  (control plane)" in report


class FakeCluster:
    """The demo's view of a cluster whose start fails, recording how it is stopped."""

    def __init__(self, name: str, *_: Any, **__: Any) -> None:
        self.name = name
        self.log_dir = Path("/nonexistent/clusters") / name / "logs"
        self.downs: list[dict[str, Any]] = []

    def state(self) -> dict[str, Any]:
        return {}

    def owner_alive(self) -> bool:
        return False

    def is_running(self) -> bool:
        return False

    def up(self) -> None:
        raise DevClusterError("cluster demo: kube-apiserver exited 1")

    def down(self, **kwargs: Any) -> None:
        self.downs.append(kwargs)


class FakeStack:
    def __init__(self, cluster: FakeCluster, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1

    def check_alive(self) -> None:
        pass


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    made: dict[str, Any] = {}

    def cluster(*args: Any, **kwargs: Any) -> FakeCluster:
        made["cluster"] = fake = FakeCluster(*args, **kwargs)
        return fake

    def stack(cluster: FakeCluster, workdir: Path) -> FakeStack:
        made["stack"] = fake = FakeStack(cluster, workdir)
        return fake

    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setattr(demo, "find_binaries", lambda: {})
    monkeypatch.setattr(demo, "Cluster", cluster)
    monkeypatch.setattr(demo, "Stack", stack)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(workdir))
    return made


def test_a_failed_step_ends_in_a_report_and_keeps_the_logs_it_names(fakes: dict[str, Any],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run(ARGS) == 1
    cluster = fakes["cluster"]
    assert fakes["stack"].stopped == 1
    assert cluster.downs == [{"quiet": True, "purge": False}], "the logs the report names are kept"
    err = capsys.readouterr().err
    assert "the demo failed while starting the local control plane 'demo': cluster demo: kube-apiserver" in err
    assert str(cluster.log_dir) in err and str(fakes["stack"].workdir) in err
    assert "hint: the control plane's logs say why" in err


def test_the_teardown_outlasts_the_sigterm_that_follows_a_ctrl_c(fakes: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI cancel sends SIGINT, then SIGTERM: the teardown goes on and stops the control plane."""
    def stop(self: FakeStack) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs here, in the main thread
        self.stopped += 1

    monkeypatch.setattr(FakeStack, "stop", stop)
    assert demo.run(ARGS) == 1
    assert fakes["stack"].stopped == 1 and fakes["cluster"].downs, "stopped the stack and then the cluster"


# run() with a cluster whose start hangs up the terminal; the teardown must go on, its output in the log.
HANGUP = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from hybridserving.demo import __main__ as demo

    workdir = Path(sys.argv[1])

    class Cluster:
        def __init__(self, name, *_, **__):
            self.name, self.log_dir = name, workdir / "cluster-logs"
        def state(self): return {}
        def owner_alive(self): return False
        def is_running(self): return False
        def up(self):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        def down(self, **kwargs):
            (workdir / "down").write_text(repr(kwargs))

    class Stack:
        def __init__(self, cluster, workdir):
            self.cluster, self.workdir = cluster, workdir
        def stop(self):
            os.kill(os.getpid(), signal.SIGHUP)  # a second one, during the teardown
            time.sleep(0.1)

    demo.find_binaries = lambda: {}
    demo.Cluster, demo.Stack = Cluster, Stack
    demo.tempfile.mkdtemp = lambda prefix: str(workdir)
    sys.exit(demo.main(["--cluster", "demo"]))
""")


def test_a_hangup_tears_down_with_the_output_moved_to_a_log(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", HANGUP, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGHUP, proc.stderr
    assert (tmp_path / "down").read_text() == "{'quiet': True, 'purge': True}"
    assert "tearing down" in (tmp_path / "demo.log").read_text()


def test_a_cluster_another_live_process_owns_is_left_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HYBRIDSERVING_CACHE", str(tmp_path))
    monkeypatch.delenv("HYBRIDSERVING_BIN", raising=False)
    monkeypatch.setattr(demo, "find_binaries", lambda: {})
    cluster = Cluster("demo")
    cluster.dir.mkdir(parents=True)
    owner = os.getppid()  # alive for as long as this test runs, and not the demo's process
    cluster.state_file.write_text(f'{{"owner_pid": {owner}, "owner_start": {_pid_starttime(owner)}}}')
    assert demo.run(ARGS) == 1
    err = capsys.readouterr().err
    assert f"belongs to a running process (pid {owner})" in err
    assert "`.venv/bin/python -m hybridserving.devcluster down --name demo`" in err
    assert cluster.state_file.exists(), "nothing of it was stopped"


def test_a_cluster_whose_owner_is_gone_or_is_this_process_is_the_demos_to_restart(tmp_path: Path) -> None:
    cluster = Cluster("demo", root=tmp_path)
    cluster.dir.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    for owner, start in ((gone.pid, 0), (os.getpid(), _pid_starttime(os.getpid()))):
        cluster.state_file.write_text(f'{{"owner_pid": {owner}, "owner_start": {start}}}')
        assert demo.owner_refusal(cluster) is None
