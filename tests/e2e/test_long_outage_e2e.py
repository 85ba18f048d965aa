"""A kube-apiserver down for 90 s under a single operator replica: the fleet stays up, the operator
comes back under control.

Platform teams run one replica (the chart's default, without leader election), and an apiserver
upgrade can keep the API away for minutes, longer than one cycle of kopf's request retries
(1+1+2+3+5+8+13+21 = 54 s). Two fleets on the local cluster, each under its own single operator
replica in its own namespace: one without leader election, one with `--leader-elect`. The
apiserver is stopped for OUTAGE_SECONDS and started again with the same command line. A replica
that exits meanwhile is started again as its kubelet would restart the container (crash-loop
back-off: 10 s, doubling), which needs no apiserver. The replica without election must ride the
outage out; the leader exits once, at its renew deadline, and its successor waits for the
apiserver. Once the apiserver is back, each operator must act on a spec edit and recreate a
NetworkPolicy deleted before its watch reconnected (its fleet's only one: the kind lists empty)
within ACT_WITHIN_S, and no engine, pod or container of either fleet may have restarted.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx
import yaml

from hybridserving.devcluster import stack
from hybridserving_engine.simulator.process import free_ports
from support.polling import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUTAGE_SECONDS = 90
# After the apiserver serves again, a watch (or the successor's discovery) waits out its current
# back-off, at most 21 s, before it calls again; measured: 12 to 17 s. The rest is room for a
# loaded machine.
ACT_WITHIN_S = 60
KUBELET_BACKOFF_S, KUBELET_BACKOFF_MAX_S = 10.0, 300.0


@dataclass
class Replica:
    """One operator container as its kubelet runs it: started again with back-off each time it exits."""

    cluster: object
    namespace: str
    directory: pathlib.Path
    leader_elect: bool
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    exits: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, exit status)
    starts: list[float] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        health, = free_ports(1)
        args = ["--namespace", self.namespace, "--health-port", str(health), "--resync-seconds", "30"]
        if self.leader_elect:
            args += ["--leader-elect", "--leader-elect-namespace", self.namespace,
                     "--leader-elect-identity", f"{self.namespace}-{len(self.procs)}"]
        log = self.directory / f"{self.namespace}-{len(self.procs)}.log"
        self.procs.append(stack.start_operator(self.cluster, log, *args))  # type: ignore[arg-type]
        self.starts.append(time.monotonic())

    def supervise(self) -> None:
        """The kubelet's part: a container that exits is started again after 10 s, 20 s, 40 s, ..."""
        backoff = KUBELET_BACKOFF_S
        while not self.stopping.wait(0.5):
            status = self.procs[-1].poll()
            if status is None:
                continue
            self.exits.append((time.monotonic(), status))
            if self.stopping.wait(backoff):
                return
            backoff = min(2 * backoff, KUBELET_BACKOFF_MAX_S)
            self.start()

    def stop(self) -> None:
        self.stopping.set()
        for proc in self.procs:
            stack.stop(proc, 30)


def fleet_manifest(name: str) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["prefill"]["replicas"] = 1
    spec["decode"]["replicas"] = 1
    spec["roleSwitch"].update(cooldownSeconds=3600, minPrefill=1, minDecode=1)
    spec["engine"] = {"env": [
        {"name": "HYBRIDSERVING_SIM_PROFILE", "value": spec["model"]["profile"]},
        {"name": "HYBRIDSERVING_SIM_STARTUP_SECONDS", "value": "1"},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0.2"},
    ]}
    return doc


class Fleet:
    def __init__(self, cluster, namespace: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, "fleet"

    def json(self, *args: str) -> dict:
        return json.loads(self.cluster.kubectl("-n", self.namespace, *args, "-o", "json").stdout)

    def current(self) -> dict | None:
        """The fleet once its status reports its latest spec and says Ready."""
        hs = self.json("get", "hybridserving", self.name)
        status = hs.get("status") or {}
        ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready")
        return hs if status.get("observedGeneration") == hs["metadata"]["generation"] and ready == "True" else None

    def engines(self) -> dict[str, tuple[str, int, int, int, float]]:
        """Per leader pod what any restart changes: its uid, the container's restarts, the engine
        process, its restarts and start (the launcher's /status)."""
        pods = self.json("get", "pods", "-l", f"hybridserving.io/name={self.name},hybridserving.io/leader=true")
        out = {}
        for pod in pods["items"]:
            engine = httpx.get(stack.launcher_url(pod) + "/status", timeout=5, trust_env=False).json()["engine"]
            restarts = pod["status"]["containerStatuses"][0]["restartCount"]
            out[pod["metadata"]["name"]] = (pod["metadata"]["uid"], restarts, engine["pid"], engine["restarts"],
                                            engine["startedAt"])
        return out

    def policy_exists(self) -> bool:
        out = self.cluster.kubectl("-n", self.namespace, "get", "networkpolicy", f"{self.name}-engines", check=False)
        return out.returncode == 0


def test_single_replica_survives_a_long_apiserver_outage(local_cluster, pod_runner, fleet_operator,
                                                         tmp_path: pathlib.Path) -> None:
    # The session's operator watches every namespace: it would manage these fleets beside their own
    # replicas, and its leader would exit at the outage's renew deadline with no kubelet to start it
    # again. It stops for this test; a fresh replica takes its Lease afterwards.
    for shared in fleet_operator.replicas:
        stack.stop(shared.proc)
    replicas = {ns: Replica(local_cluster, ns, tmp_path, leader_elect=ns.endswith("elect"))
                for ns in ("outage-solo", "outage-elect")}
    fleets = {ns: Fleet(local_cluster, ns) for ns in replicas}
    kubelets: list[threading.Thread] = []
    try:
        for ns, replica in replicas.items():
            local_cluster.kubectl("create", "namespace", ns)
            local_cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(fleet_manifest("fleet")))
            replica.start()
            kubelets.append(threading.Thread(target=replica.supervise, daemon=True))
            kubelets[-1].start()
        for ns, fleet in fleets.items():
            wait_for(lambda f=fleet: f.current() and len(f.engines()) == 2, 180, f"{ns}: the fleet Ready")
        before = {ns: fleet.engines() for ns, fleet in fleets.items()}

        down = time.monotonic()
        local_cluster.restart("kube-apiserver", down_seconds=OUTAGE_SECONDS, timeout=120)
        back = time.monotonic()

        edited: dict[str, float] = {}
        for ns, fleet in fleets.items():
            local_cluster.kubectl("-n", ns, "patch", "hybridserving", fleet.name, "--type=merge", "-p",
                                  json.dumps({"spec": {"roleSwitch": {"cooldownSeconds": 3599}}}))
            local_cluster.kubectl("-n", ns, "delete", "networkpolicy", f"{fleet.name}-engines")
            edited[ns] = time.monotonic()
        acted: dict[str, float] = {}
        for ns, fleet in fleets.items():
            wait_for(fleet.current, ACT_WITHIN_S, f"{ns}: the spec edit in status after the outage", interval=1)
            wait_for(fleet.policy_exists, ACT_WITHIN_S, f"{ns}: the deleted NetworkPolicy recreated", interval=1)
            acted[ns] = time.monotonic()
        after = {ns: fleet.engines() for ns, fleet in fleets.items()}

        for ns, replica in replicas.items():
            exits = ", ".join(f"exit {status} at +{at - down:.0f} s" for at, status in replica.exits) or "no exit"
            print(f"\n[outage] {ns}: apiserver down {back - down:.0f} s (stopped for {OUTAGE_SECONDS} s); "
                  f"{exits}; {len(replica.procs)} process(es); spec edit and deleted NetworkPolicy acted on "
                  f"{acted[ns] - edited[ns]:.0f} s after the edit, {acted[ns] - back:.0f} s after the apiserver "
                  "was back")
        assert after == before, "an engine, its pod or its container restarted"
        assert replicas["outage-solo"].exits == [], "the replica without leader election exited"
        # The leader exits once, at its renew deadline; the replica started in its place waits for
        # the apiserver instead of crash-looping through the kubelet's back-off.
        assert [status for _, status in replicas["outage-elect"].exits] == [1], replicas["outage-elect"].exits
    finally:
        for ns, replica in replicas.items():
            replica.stopping.set()
            print(f"\n[outage] {ns}: exits {replica.exits}, starts {replica.starts}, logs in {tmp_path}")
        for thread in kubelets:
            thread.join(5)
        for replica in replicas.values():
            replica.stop()
        # The next test's pods may get these fleets' loopback IPs: their engines must be gone, and
        # so must the fleets before the session's operator, which watches every namespace, starts
        # again. Fleets first: a namespace deleted with them stays Terminating for minutes.
        for ns in replicas:
            stack.delete_namespace(local_cluster, ns)
        fleet_operator.start()
        fleet_operator.leader(timeout=120)
