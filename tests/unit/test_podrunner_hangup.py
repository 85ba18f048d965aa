"""The pod runner stops on a hangup (its terminal closed) as on SIGTERM: its containers run in
sessions of their own, never get the hangup, and would outlive a runner that died of it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from hybridserving.devcluster.cluster import free_ports
from support.polling import wait_for

# An apiserver nobody listens on: the runner starts, fails its first list and keeps trying.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {server: "http://127.0.0.1:PORT"}
users:
- name: gone
  user: {token: "x"}
contexts:
- name: gone
  context: {cluster: gone, user: gone}
current-context: gone
"""


def test_a_hangup_stops_the_runner_as_sigterm_does(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.replace("PORT", str(free_ports(1)[0])))
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        runner = subprocess.Popen([sys.executable, "-m", "hybridserving_engine.podrunner", "--kubeconfig",
                                   str(kubeconfig), "--state-dir", str(tmp_path / "pods")],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        # its handlers are in place once it watches
        wait_for(lambda: "pod watch failed" in log.read_text(), 60, "the runner to watch")
        runner.send_signal(signal.SIGHUP)
        assert runner.wait(30) == 0, log.read_text()
    finally:
        runner.kill()
        runner.wait()
