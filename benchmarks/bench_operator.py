"""Operator figures on a local control plane (apiserver, etcd, KCM, scheduler, kwok nodes).

1. apply → all pods created / all Running, for one fleet of 16 instances;
2. API writes of a reconcile of a settled fleet (target: zero), counted by the client wrapper;
3. API reads (GET/LIST by kind) of the running operator per steady-state reconcile pass and per
   role-switch tick of that settled fleet (role switching on), from its metrics;
4. 50 HybridServings x 8 instances on 100 fake nodes: time to converge, the operator
   process's CPU time and peak memory, and the reads and writes it made.

    python benchmarks/bench_operator.py [--fleets 50] [--instances 8] [--nodes 100]

Starts (and stops) its own clusters; the operator runs as `python -m hybridserving.controller`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from hybridserving.controller.kube import Kube  # noqa: E402
from hybridserving.controller.reconcile import reconcile  # noqa: E402
from hybridserving.devcluster import Cluster, FleetSpec  # noqa: E402
from hybridserving.devcluster.stack import operator_key  # noqa: E402

GROUP, VERSION = "hybridserving.io", "v1alpha1"


def fleet_manifest(name: str, namespace: str, instances: int, tp: int, role_switch: bool = False) -> dict[str, Any]:
    half = instances // 2
    manifest: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "HybridServing",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"path": "bench/model", "architecture": {
                "hfArchitecture": "DeepseekV3ForCausalLM", "attention": "mla", "layers": 8, "mlaLayers": 8,
                "kvBytesPerTokenLayer": 576, "weightBytes": 16_000_000_000, "attentionHeads": 16,
            }},
            "prefill": {"replicas": instances - half, "layout": {"tp": tp}},
            "decode": {"replicas": half, "layout": {"tp": tp}},
        },
    }
    if role_switch:
        # Switching on, so every tick reads the fleet; the rollout paused keeps the policy from
        # sampling engines that kwok pods do not run (engine reads are not API reads).
        manifest["spec"]["roleSwitch"] = {"enabled": True}
        manifest["spec"]["rollout"] = {"paused": True}
    return manifest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    def __init__(self, cluster: Cluster, workers: int) -> None:
        self.metrics_port = free_port()
        self.log = cluster.dir / "operator.log"
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), PYTHONPATH=str(ROOT / "operator"),
                   HYBRIDSERVING_OPERATOR_KEY=operator_key(cluster))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridserving.controller", "--metrics-port", str(self.metrics_port),
             "--workers", str(workers)],
            env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
        )

    def cpu_seconds(self) -> float:
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def series(self, prefix: str) -> dict[str, float]:
        """Every sample whose line starts with `prefix`, by its full name and labels."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(prefix) and not line.startswith("#")}

    def metric(self, name: str) -> float:
        return sum(self.series(name).values())

    def reads(self, component: str) -> dict[str, float]:
        """API reads made by `component` so far, by "VERB Kind"."""
        out: dict[str, float] = {}
        for key, value in self.series(f'hybridserving_api_reads_total{{component="{component}"').items():
            labels = dict(part.split("=", 1) for part in key.split("{", 1)[1].rstrip("}").split(","))
            out[f"{labels['verb'].strip(chr(34)).upper()} {labels['kind'].strip(chr(34))}"] = value
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> float:
    start = time.monotonic()

    def ok() -> bool:
        try:
            return check()
        except OSError:  # the operator's metrics endpoint is not up yet
            return False

    while not ok():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not after {timeout}s")
        time.sleep(interval)
    return time.monotonic() - start


def engine_pods(core, namespace: str | None = None) -> list[Any]:
    selector = "hybridserving.io/component=engine"
    if namespace:
        return core.list_namespaced_pod(namespace, label_selector=selector).items
    return core.list_pod_for_all_namespaces(label_selector=selector).items


def create(custom, manifest: dict[str, Any]) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, manifest["metadata"]["namespace"], "hybridservings",
                                           manifest)


def per(after: dict[str, float], before: dict[str, float], count: float) -> dict[str, float]:
    """Reads between two snapshots, per pass, by "VERB Kind"."""
    return {k: (v - before.get(k, 0.0)) / count for k, v in sorted(after.items()) if v - before.get(k, 0.0) > 0}


def steady_reads(op: OperatorProcess, custom: Any, namespace: str, name: str, passes: int) -> dict[str, Any]:
    """Reads of the running operator per reconcile pass (each one triggered by an annotation) and per switch tick."""
    rec0, sw0 = op.reads("reconcile"), op.reads("switch")
    passes0, ticks0 = op.metric("hybridserving_reconciles_total"), op.metric("hybridserving_role_switch_ticks_total")
    for i in range(passes):
        done = op.metric("hybridserving_reconciles_total")
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "hybridservings", name,
                                              {"metadata": {"annotations": {"bench.hybridserving.io/poke": str(i)}}})
        wait(lambda done=done: op.metric("hybridserving_reconciles_total") > done, 30,  # type: ignore[misc]
             "reconcile after a poke", interval=0.05)
        time.sleep(1.0)
    rec1, sw1 = op.reads("reconcile"), op.reads("switch")
    n_passes = op.metric("hybridserving_reconciles_total") - passes0
    n_ticks = op.metric("hybridserving_role_switch_ticks_total") - ticks0
    return {"passes": n_passes, "ticks": n_ticks,
            "reads_per_reconcile": per(rec1, rec0, n_passes), "reads_per_switch_tick": per(sw1, sw0, n_ticks)}


def repair_reads(op: OperatorProcess, core: Any, custom: Any, namespace: str, name: str,
                 instances: int) -> dict[str, Any]:
    """Reads per reconcile pass while the operator brings back an engine pod that was deleted (passes that act)."""
    rec0, passes0 = op.reads("reconcile"), op.metric("hybridserving_reconciles_total")
    victim = sorted(p.metadata.name for p in engine_pods(core, namespace))[0]
    core.delete_namespaced_pod(victim, namespace)

    def repaired() -> bool:
        pods = engine_pods(core, namespace)
        fleet = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "hybridservings", name)
        return (sum(p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in pods) == instances
                and (fleet.get("status") or {}).get("ready") == "True")

    wait(lambda: not repaired(), 30, "pod deletion seen", interval=0.05)
    seconds = wait(repaired, 120, "pod repaired")
    time.sleep(2)
    n_passes = op.metric("hybridserving_reconciles_total") - passes0
    return {"repair_s": seconds, "repair_passes": n_passes,
            "reads_per_repair_pass": per(op.reads("reconcile"), rec0, n_passes)}


def describe(reads: dict[str, float]) -> str:
    return f"{sum(reads.values()):.1f} (" + (", ".join(f"{k} {v:.2f}" for k, v in reads.items()) or "none") + ")"


def bench_single_fleet(instances: int) -> dict[str, Any]:
    from kubernetes import client

    cluster = Cluster(f"bench-one-{os.getpid()}", FleetSpec(nodes=instances))
    cluster.up()
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        api = cluster.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": "bench"}})
        op = OperatorProcess(cluster, workers=4)
        wait(lambda: op.metric("hybridserving_queue_depth") >= 0, 60, "operator metrics", interval=0.5)
        time.sleep(2)  # watches established
        start = time.monotonic()
        create(custom, fleet_manifest("big", "bench", instances, tp=8, role_switch=True))
        created = wait(lambda: len(engine_pods(core, "bench")) == instances, 120, "pods created")
        running = wait(lambda: sum(p.status.phase == "Running" for p in engine_pods(core, "bench")) == instances,
                       120, "pods running") + created
        ready = wait(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, "bench", "hybridservings", "big")
                              .get("status") or {}).get("ready") == "True", 120, "fleet ready") + running
        del start
        time.sleep(3)
        # Steady state: reconcile in-process through a counting client; the operator keeps running.
        kube = Kube(api)
        for _ in range(3):
            reconcile(kube, "bench", "big", operator_key=operator_key(cluster).encode())
        steady_writes = sum(kube.writes.values())
        op_writes_before = op.metric("hybridserving_actions_total")
        time.sleep(20)
        op_idle_writes = op.metric("hybridserving_actions_total") - op_writes_before
        reads = steady_reads(op, custom, "bench", "big", passes=5)
        repair = repair_reads(op, core, custom, "bench", "big", instances)
        op.stop()
        return {"instances": instances, "pods_created_s": created, "pods_running_s": running,
                "fleet_ready_s": ready, "steady_state_writes_per_reconcile": steady_writes / 3,
                "operator_writes_idle_20s": op_idle_writes, **reads, **repair}
    finally:
        cluster.down()


def bench_many_fleets(fleets: int, instances: int, nodes: int, workers: int) -> dict[str, Any]:
    from kubernetes import client

    cluster = Cluster(f"bench-many-{os.getpid()}", FleetSpec(nodes=nodes, pods=250))
    cluster.up(timeout=300)
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        api = cluster.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        for i in range(fleets):
            core.create_namespace({"metadata": {"name": f"team-{i}"}})
        op = OperatorProcess(cluster, workers=workers)
        wait(lambda: op.metric("hybridserving_queue_depth") >= 0, 60, "operator metrics", interval=0.5)
        time.sleep(2)
        cpu0 = op.cpu_seconds()
        start = time.monotonic()
        for i in range(fleets):
            create(custom, fleet_manifest(f"fleet-{i}", f"team-{i}", instances, tp=2))
        total = fleets * instances

        def all_ready() -> bool:
            items = custom.list_cluster_custom_object(GROUP, VERSION, "hybridservings")["items"]
            return len(items) == fleets and all((i.get("status") or {}).get("ready") == "True" for i in items)

        created = wait(lambda: len(engine_pods(core)) == total, 900, "pods created", interval=1.0)
        converged = wait(all_ready, 900, "all fleets ready", interval=1.0) + created
        cpu = op.cpu_seconds() - cpu0
        writes = op.metric("hybridserving_actions_total")
        reconciles = op.metric("hybridserving_reconciles_total")
        reads = sum(op.reads("reconcile").values()) + sum(op.reads("switch").values())
        peak = op.peak_rss_mib()
        del start
        op.stop()
        return {"fleets": fleets, "instances": total, "nodes": nodes, "pods_created_s": created,
                "converged_s": converged, "operator_cpu_s": cpu, "operator_peak_rss_mib": peak,
                "writes": writes, "reads": reads, "reconciles": reconciles}
    finally:
        cluster.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances-one", type=int, default=16)
    ap.add_argument("--fleets", type=int, default=50)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--only", choices=("one", "many"), default=None)
    args = ap.parse_args()
    results: dict[str, Any] = {}
    if args.only in (None, "one"):
        results["one_fleet"] = one = bench_single_fleet(args.instances_one)
        print(f"one fleet of {one['instances']} instances: pods created {one['pods_created_s']:.2f}s, running "
              f"{one['pods_running_s']:.2f}s, fleet Ready {one['fleet_ready_s']:.2f}s after apply")
        print(f"steady state: {one['steady_state_writes_per_reconcile']:.0f} API writes per reconcile; "
              f"{one['operator_writes_idle_20s']:.0f} writes by the idle operator in 20 s")
        print(f"steady state, the running operator: API reads per reconcile pass "
              f"{describe(one['reads_per_reconcile'])} "
              f"over {one['passes']:.0f} passes; per role-switch tick {describe(one['reads_per_switch_tick'])} "
              f"over {one['ticks']:.0f} ticks")
        print(f"an engine pod deleted: repaired and Ready in {one['repair_s']:.1f}s over {one['repair_passes']:.0f} "
              f"passes, API reads per pass {describe(one['reads_per_repair_pass'])}")
    if args.only in (None, "many"):
        results["many_fleets"] = many = bench_many_fleets(args.fleets, args.instances, args.nodes, args.workers)
        print(f"{many['fleets']} fleets x {args.instances} instances ({many['instances']} pods) on {many['nodes']} "
              f"nodes: all pods created {many['pods_created_s']:.1f}s, all fleets Ready {many['converged_s']:.1f}s; "
              f"operator CPU {many['operator_cpu_s']:.1f}s, peak RSS {many['operator_peak_rss_mib']:.0f} MiB, "
              f"{many['writes']:.0f} writes and {many['reads']:.0f} reads in {many['reconciles']:.0f} reconciles")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
