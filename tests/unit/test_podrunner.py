"""The pod runner's worker keeps its container through an apiserver outage and reports its
status again when another writer changed it, and its containers never outlive the runner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from urllib3.exceptions import MaxRetryError

from support.polling import wait_for
from hybridserving.contract import expand_references
from hybridserving.devcluster.cluster import pid_alive
from hybridserving_engine.podrunner.container import container_command
from hybridserving_engine.podrunner.runner import FINALIZER, PodRunner, PodWorker, runs


class FlakyCore:
    """CoreV1Api as an apiserver that is down for the first `down` calls, then up."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.calls = 0
        self.statuses: list[dict[str, Any]] = []
        self.patches: list[tuple[str | None, Any]] = []
        self.finalizers: list[str] = ["someone-else"]

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.calls <= self.down:
            raise MaxRetryError(None, "/api/v1", "connection refused")  # type: ignore[arg-type]

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        self._maybe_fail()
        return client.V1ConfigMap(data={"x": "1"})

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self._maybe_fail()
        self.statuses.append(body)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> None:
        """The pod's finalizers, as the apiserver applies the two patches the worker sends."""
        self._maybe_fail()
        self.patches.append((kwargs.get("_content_type"), body))
        if isinstance(body, dict):
            self.finalizers += [f for f in body["metadata"]["finalizers"] if f not in self.finalizers]
        else:
            assert body[0] == {"op": "test", "path": "/metadata/uid", "value": "uid-12345678"}
            index = int(body[2]["path"].rsplit("/", 1)[1])
            assert body[1]["value"] == self.finalizers[index]
            del self.finalizers[index]

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        self._maybe_fail()
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name, uid="uid-12345678",
                                                         finalizers=list(self.finalizers)))


def leader_pod(command: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "f-0-0", "namespace": "ns", "uid": "uid-12345678",
                     "labels": {"hybridserving.io/node-rank": "0"}},
        "spec": {"nodeName": "n", "containers": [{
            "name": "engine", "image": "x", "command": command,
            "volumeMounts": [{"name": "config", "mountPath": "/etc/c"}],
        }], "volumes": [{"name": "config", "configMap": {"name": "cm"}}]},
        "status": {"phase": "Running", "podIP": "127.0.0.9"},
    }


def test_the_worker_keeps_its_container_through_an_apiserver_outage(tmp_path: Path) -> None:
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=2)
    core = FlakyCore(down=10)
    runner.core = core  # type: ignore[assignment]
    worker = PodWorker(runner, leader_pod([sys.executable, "-c", "import time; time.sleep(60)"]))
    worker.thread.start()
    try:
        wait_for(lambda: core.calls > core.down and worker.process is not None and core.statuses, timeout=20)
        assert worker.thread.is_alive(), "the worker died on the outage"
        assert worker.process is not None and worker.process.exit_code() is None
        assert worker.restarts == 0
    finally:
        worker.terminate(1)
        worker.thread.join(10)


def test_readiness_another_writer_changed_is_reported_again(tmp_path: Path) -> None:
    """As the kubelet's status manager does: the node lifecycle controller marks the pods of a node
    whose lease it saw go stale NotReady (an apiserver outage longer than its grace period), while
    their containers still serve; the pod's next event puts the runner's own status back."""
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=2)
    core = FlakyCore(down=0)
    runner.core = core  # type: ignore[assignment]
    pod = leader_pod([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = PodWorker(runner, pod)

    def ready(body: dict[str, Any]) -> str:
        return next(c["status"] for c in body["status"]["conditions"] if c["type"] == "Ready")

    worker.thread.start()
    try:
        wait_for(lambda: core.statuses and ready(core.statuses[-1]) == "True", timeout=20)
        reported = len(core.statuses)
        worker.update({**pod, "status": {**pod["status"], "conditions": core.statuses[-1]["status"]["conditions"]}})
        time.sleep(0.5)
        assert len(core.statuses) == reported, "the runner's own status is not sent again"
        marked = {**pod, "status": {**pod["status"], "conditions": [{"type": "Ready", "status": "False"}]}}
        worker.update(marked)
        wait_for(lambda: len(core.statuses) > reported, timeout=5)
        assert ready(core.statuses[-1]) == "True"
        assert worker.restarts == 0
    finally:
        worker.terminate(1)
        worker.thread.join(10)


def test_a_pod_is_held_by_a_finalizer_until_its_process_has_stopped(tmp_path: Path) -> None:
    """As the kubelet keeps a deleted pod's object until its containers stopped: kwok deletes at
    once, and the freed IP would go to a replacement while the old engine still drains on it."""
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=5)
    core = FlakyCore(down=3)
    runner.core = core  # type: ignore[assignment]
    script = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n" \
             "while True: time.sleep(1)"
    worker = PodWorker(runner, leader_pod([sys.executable, "-c", script]))
    worker.thread.start()
    wait_for(lambda: worker.process is not None and FINALIZER in core.finalizers, timeout=20)
    assert core.finalizers == ["someone-else", FINALIZER], "held through the outage at start"
    process = worker.process
    worker.terminate(5)
    wait_for(lambda: FINALIZER not in core.finalizers, timeout=20)
    assert process.exit_code() is not None, "released only once the process had stopped"
    assert core.finalizers == ["someone-else"], "only its own finalizer removed"
    worker.thread.join(10)


class HoldRefusedAtFirst(FlakyCore):
    """An apiserver that answers reads but fails the first `refusals` finalizer patches."""

    def __init__(self, refusals: int) -> None:
        super().__init__(down=0)
        self.refusals = refusals

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> None:
        if isinstance(body, dict) and self.refusals > 0:
            self.refusals -= 1
            raise MaxRetryError(None, "/api/v1", "connection refused")  # type: ignore[arg-type]
        super().patch_namespaced_pod(name, namespace, body, **kwargs)


def test_a_container_starts_only_once_its_pod_is_held(tmp_path: Path) -> None:
    """A container started before the finalizer is on its pod could be left draining on an IP that
    a deletion in between has already freed for another pod."""
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=2)
    core = HoldRefusedAtFirst(refusals=3)
    runner.core = core  # type: ignore[assignment]
    worker = PodWorker(runner, leader_pod([sys.executable, "-c", "import time; time.sleep(60)"]))
    held_at_start: list[bool] = []
    start = worker._start

    def start_and_record() -> None:
        held_at_start.append(FINALIZER in core.finalizers)
        start()

    worker._start = start_and_record  # type: ignore[method-assign]
    worker.thread.start()
    try:
        wait_for(lambda: worker.process is not None, timeout=20)
        assert core.refusals == 0 and held_at_start == [True]
    finally:
        worker.terminate(1)
        worker.thread.join(10)


class SecretAwayAtFirst(FlakyCore):
    """An apiserver that answers all but the first `misses` reads of a Secret."""

    def __init__(self, misses: int) -> None:
        super().__init__(down=0)
        self.misses = misses

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        if self.misses > 0:
            self.misses -= 1
            raise MaxRetryError(None, "/api/v1", "connection refused")  # type: ignore[arg-type]
        return client.V1Secret(data={"key": "c2VjcmV0"})


def test_a_secret_unreadable_for_a_moment_delays_the_start_and_keeps_the_worker(tmp_path: Path) -> None:
    """Every engine pod reads its API key from a Secret into its env: an apiserver away when the
    container starts delays it, as it delays the kubelet's, and the worker (with the pod's restart
    count and last state) lives on."""
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=2)
    core = SecretAwayAtFirst(misses=2)
    runner.core = core  # type: ignore[assignment]
    pod = leader_pod([sys.executable, "-c", "import os, time; assert os.environ['KEY'] == 'secret'; time.sleep(60)"])
    pod["spec"]["containers"][0]["env"] = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "key"}}}]
    worker = PodWorker(runner, pod)
    worker.thread.start()
    try:
        wait_for(lambda: worker.process is not None, timeout=20)
        assert core.misses == 0 and worker.thread.is_alive(), "the worker died on the unreadable Secret"
        time.sleep(0.5)
        assert worker.process is not None and worker.process.exit_code() is None and worker.restarts == 0
    finally:
        worker.terminate(1)
        worker.thread.join(10)


def test_a_deleted_pod_no_worker_holds_is_released(tmp_path: Path) -> None:
    """Its worker gave up releasing it while the apiserver was away, or the runner was down when it
    was deleted: kept, the pod would stay Terminating and block its replacement's fixed name."""
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=2)
    core = FlakyCore(down=1)
    core.finalizers = ["someone-else", FINALIZER]
    runner.core = core  # type: ignore[assignment]
    pod = leader_pod([sys.executable, "-c", "pass"])
    pod["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=list(core.finalizers))
    runner.observe("MODIFIED", pod)
    assert core.finalizers == ["someone-else", FINALIZER], "the apiserver was away: left for the next relist"
    runner.observe("ADDED", pod)  # the relist
    assert core.finalizers == ["someone-else"] and not runner.workers
    other = leader_pod([sys.executable, "-c", "pass"])
    other["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["someone-else"])
    calls = core.calls
    runner.observe("MODIFIED", other)
    assert core.calls == calls, "not ours to release"


def test_a_runner_that_stops_cuts_a_pods_stop_under_way_to_its_shutdown_grace(tmp_path: Path) -> None:
    """A pod deleted with a long grace is still in its preStop sleep, or draining, when the runner
    is told to stop. The runner is killed soon after its own shutdown grace, and its containers'
    engines would outlive it: the stop under way must end within that grace, not the pod's."""
    runner = PodRunner(client.ApiClient(), tmp_path, volume_refresh_seconds=0.1, shutdown_grace_seconds=1)
    core = FlakyCore(down=0)
    runner.core = core  # type: ignore[assignment]
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)"
    pod = leader_pod([sys.executable, "-c", deaf])
    pod["spec"]["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 60}}}
    worker = PodWorker(runner, pod)
    runner.workers[worker.uid] = worker
    worker.thread.start()
    process = wait_for(lambda: worker.process if worker.process and worker.process.pid else None, timeout=20)
    assert FINALIZER in core.finalizers
    worker.terminate(90)
    time.sleep(0.5)  # in its preStop sleep
    began = time.monotonic()
    runner.stop()
    took = time.monotonic() - began
    assert took < 5, f"the runner's stop took {took:.1f} s: the pod's own grace was kept"
    assert not pid_alive(process.pid), "a container that ignores SIGTERM is killed at the shutdown grace"
    assert core.finalizers == ["someone-else"], "released once stopped"


def test_an_engine_orphaned_while_the_runner_reads_its_container_dies_with_the_container(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner reads a container's processes on every tick, to kill them all once it exits. A
    launcher killed during that read has already handed its engine to another parent, so the read
    finds none: the engine must still be killed with the container, not left holding its port."""
    from hybridserving_engine.podrunner import container

    launcher = "import subprocess, sys, time\n" \
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n" \
               "time.sleep(120)"
    proc = container.ContainerProcess([sys.executable, "-c", launcher], {}, tmp_path, tmp_path / "log")
    proc.start()
    assert proc.pid is not None
    engine = wait_for(lambda: next(iter(container.descendants(proc.pid or 0)), None), timeout=20)
    try:
        assert proc.exit_code() is None, "running"
        read = container.descendants

        def killed_during_the_read(pid: int) -> list[int]:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not pid_alive(pid), timeout=10)  # exited: its engine is reparented already
            return read(pid)

        monkeypatch.setattr(container, "descendants", killed_during_the_read)
        assert proc.exit_code() == -signal.SIGKILL, "the exit is seen on the tick that missed the engine"
        wait_for(lambda: not pid_alive(engine), timeout=10)
    finally:
        if pid_alive(engine):
            os.kill(engine, signal.SIGKILL)
        if proc.proc is not None and proc.proc.poll() is None:
            proc.proc.kill()


def test_containers_die_with_the_runner(tmp_path: Path) -> None:
    """A runner killed outright (SIGKILL) leaves no launcher behind."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import sys, time, threading
        from pathlib import Path
        from hybridserving_engine.podrunner.container import ContainerProcess
        proc = ContainerProcess([sys.executable, "-c", "import time; time.sleep(120)"], {{}}, Path({str(tmp_path)!r}),
                                Path({str(tmp_path / "log")!r}))
        proc.start()
        Path({str(pid_file)!r}).write_text(str(proc.pid))
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runner = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        wait_for(pid_file.exists, timeout=20)
        child = int(pid_file.read_text())
        os.kill(child, 0)  # running
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
        wait_for(lambda: not pid_alive(child), timeout=10)
    finally:
        if runner.poll() is None:
            runner.kill()


def test_command_and_args_run_as_the_kubelet_runs_them_in_the_pods_network() -> None:
    """`$(VAR)` expands from the container's environment (`$$` is a `$`, an unknown reference stays),
    and a wildcard bind means the pod's own address."""
    container = {"name": "router", "command": ["python3"],
                 "args": ["--api-key", "$(KEY)", "--host", "0.0.0.0", "--prometheus-host", "0.0.0.0",
                          "--note", "$$(KEY) $(UNKNOWN)"]}
    argv = container_command(container, {"PATH": os.environ["PATH"], "KEY": "s3cret"}, "127.0.0.7")
    assert argv[1:] == ["--api-key", "s3cret", "--host", "127.0.0.7", "--prometheus-host", "127.0.0.7",
                        "--note", "$(KEY) $(UNKNOWN)"]
    assert expand_references("a$(KEY)b", {"KEY": "x"}) == "axb"


def test_routers_run_alongside_engine_leaders_and_engine_workers_do_not() -> None:
    def pod(**labels: str) -> dict[str, Any]:
        return {"metadata": {"labels": labels}}

    assert runs(pod(**{"hybridserving.io/component": "router"}))
    assert runs(pod(**{"hybridserving.io/component": "engine", "hybridserving.io/node-rank": "0"}))
    assert not runs(pod(**{"hybridserving.io/component": "engine", "hybridserving.io/node-rank": "1"}))
