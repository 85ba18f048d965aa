"""Command line: python -m hybridserving.devcluster {up,down,status,env,list,reap}."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

from .cluster import Cluster, DevClusterError, bin_dir, list_clusters, reap_orphans
from .nodes import FleetSpec


def _fleet_args(p: argparse.ArgumentParser) -> None:
    d = FleetSpec()
    g = p.add_argument_group("fake node fleet")
    g.add_argument("--nodes", type=int, default=d.nodes, help="GPU nodes (default %(default)s)")
    g.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    g.add_argument("--rdma-per-node", type=int, default=d.rdma_per_node, help="rdma/ib devices per node")
    g.add_argument("--cpu", default=d.cpu, help="CPU capacity of a GPU node")
    g.add_argument("--memory", default=d.memory, help="memory capacity of a GPU node")
    g.add_argument("--pods", type=int, default=d.pods, help="pod capacity per node")
    g.add_argument("--nodes-per-nvlink-domain", type=int, default=d.nodes_per_nvlink_domain)
    g.add_argument("--nodes-per-rack", type=int, default=d.nodes_per_rack)
    g.add_argument("--racks-per-zone", type=int, default=d.racks_per_zone)
    g.add_argument("--nodes-per-fabric", type=int, default=d.nodes_per_fabric,
                   help="GPU nodes per RDMA fabric (0: one fabric)")
    g.add_argument("--gpu-product", default=d.gpu_product)
    g.add_argument("--cpu-nodes", type=int, default=d.cpu_nodes, help="extra nodes without GPUs")


def _fleet(ns: argparse.Namespace) -> FleetSpec:
    names = {f.name for f in dataclasses.fields(FleetSpec)}
    return FleetSpec(**{k: v for k, v in vars(ns).items() if k in names})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybridserving.devcluster",
                                 description="Local Kubernetes control plane with fake GPU nodes.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="start a cluster and wait until it is ready")
    up.add_argument("--name", default="dev")
    up.add_argument("--timeout", type=float, default=120.0, help="readiness budget in seconds")
    _fleet_args(up)

    down = sub.add_parser("down", help="stop a cluster and remove its state")
    down.add_argument("--name", default="dev")
    down.add_argument("--all", action="store_true", help="stop every cluster in the cache")
    down.add_argument("--keep", action="store_true", help="keep the state dir (logs, data)")

    st = sub.add_parser("status", help="component liveness, ports, memory")
    st.add_argument("--name", default="dev")
    st.add_argument("--json", action="store_true")

    env = sub.add_parser("env", help="print shell exports for the cluster")
    env.add_argument("--name", default="dev")
    env.add_argument("--path", action="store_true", help="also put the tool binaries on PATH")

    sub.add_parser("list", help="list clusters in the cache")

    reap = sub.add_parser("reap", help="stop clusters named PREFIX* whose owning process is gone")
    reap.add_argument("--prefix", required=True, help="e.g. it- for test-session clusters")

    ns = ap.parse_args(argv)
    try:
        if ns.cmd == "up":
            c = Cluster(ns.name, _fleet(ns)).up(timeout=ns.timeout)
            print(f"export KUBECONFIG={shlex.quote(str(c.kubeconfig))}")
            return 0
        if ns.cmd == "down":
            names = list_clusters() if ns.all else [ns.name]
            failed = 0
            for name in names:
                try:
                    Cluster(name).down(purge=not ns.keep)
                except DevClusterError as exc:  # keep going: stop the others anyway
                    print(f"error: {exc}", file=sys.stderr)
                    failed += 1
            return 1 if failed else 0
        if ns.cmd == "status":
            c = Cluster(ns.name)
            s = c.status()
            if ns.json:
                print(json.dumps(s, indent=2))
            else:
                if not s["exists"]:
                    print(f"cluster {ns.name}: not found")
                    return 1
                print(f"cluster {s['name']}: {'running' if s['running'] else 'NOT RUNNING'}"
                      f"  server={s['server']}  kubeconfig={s['kubeconfig']}")
                for comp, info in s["components"].items():
                    print(f"  {comp:<24} pid={info['pid']!s:<8} "
                          f"{'alive' if info['alive'] else 'DEAD':<6} rss={info['rss_mib']:.0f}MiB")
                print(f"  total rss={s['rss_total_mib']:.0f}MiB  up_seconds={s['up_seconds']}")
                crashed = [k for k, v in s["components"].items() if v["pid"] and not v["alive"]]
                if crashed:
                    print(c.crash_report(crashed))
            return 0 if s["running"] else 1
        if ns.cmd == "env":
            c = Cluster(ns.name)
            print(f"export KUBECONFIG={shlex.quote(str(c.kubeconfig))}")
            if ns.path:
                print(f"export PATH={shlex.quote(str(bin_dir()))}:\"$PATH\"")
            return 0
        if ns.cmd == "reap":
            for name in reap_orphans(ns.prefix):
                print(f"stopped orphaned cluster {name}")
            return 0
        if ns.cmd == "list":
            for name in list_clusters():
                c = Cluster(name)
                print(f"{name}\t{'running' if c.is_running() else 'stopped'}\t{c.dir}")
            return 0
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
