"""Tearing a local cluster down after the session that owned it was killed: its clients (the
operator, the pod runner) were never stopped, and the pod runner's engines run in sessions of
their own under it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.polling import wait_for
from hybridserving.devcluster.cluster import Cluster, cache_dir, pid_alive

# A client that names the cluster's kubeconfig and runs a grandchild in a session of its own, as the
# pod runner runs a launcher and the launcher its engine.
CLIENT = ("import subprocess, sys, time\n"
          "engine = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
          "open(sys.argv[3], 'w').write(str(engine.pid))\n"
          "time.sleep(120)")


def test_down_kills_the_clients_a_killed_session_left_and_every_process_below_them(tmp_path: Path) -> None:
    cluster = Cluster("orphaned", root=tmp_path, progress=lambda _: None)
    cluster.dir.mkdir()
    engine_file = tmp_path / "engine.pid"
    client = subprocess.Popen([sys.executable, "-c", CLIENT, "--kubeconfig", str(cluster.kubeconfig),
                               str(engine_file)])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--kubeconfig",
                                  str(tmp_path / "orphaned-not" / "kubeconfig")])
    try:
        wait_for(lambda: engine_file.exists() and engine_file.read_text(), timeout=20)
        engine = int(engine_file.read_text())
        cluster.down(quiet=True)
        assert client.wait(10) < 0, "the client was killed"
        wait_for(lambda: not pid_alive(engine), timeout=10)
        assert bystander.poll() is None, "a process naming another cluster's directory is left alone"
    finally:
        for proc in (client, bystander):
            proc.kill()
            proc.wait()


def test_a_relative_cache_is_resolved_once_against_the_callers_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each component runs with the cluster directory as its working directory and gets paths under
    the cache as flags: a relative one would name a place under the cluster directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDSERVING_CACHE", "cache")
    assert cache_dir() == tmp_path / "cache"
