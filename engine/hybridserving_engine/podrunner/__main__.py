"""`python -m hybridserving_engine.podrunner --kubeconfig K [--namespace N]`: run engine pods locally."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path

from kubernetes import client, config

from hybridserving_engine.podrunner.runner import FAKE_NODE_SELECTOR, PodRunner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybridserving_engine.podrunner",
                                 description="Run the leader pods of engine fleets on fake nodes as local processes "
                                             "(the launcher with the SGLang simulator), standing in for the kubelet.")
    ap.add_argument("--kubeconfig", required=True, help="the local cluster's kubeconfig")
    ap.add_argument("--namespace", "-n", default=None, help="only this namespace (default: all)")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="where volumes and container logs go (default: a new temporary directory)")
    ap.add_argument("--node-selector", default=FAKE_NODE_SELECTOR, help="nodes whose pods to run (%(default)s)")
    ap.add_argument("--probe-period-seconds", type=float, default=None,
                    help="override every readiness probe's periodSeconds (faster tests)")
    ap.add_argument("--volume-refresh-seconds", type=float, default=5.0,
                    help="how often ConfigMap volumes are re-read (%(default)s)")
    ap.add_argument("--restart-backoff-seconds", type=float, default=10.0,
                    help="first restart delay of an exited container, doubling per restart (%(default)s)")
    ap.add_argument("--restart-backoff-max-seconds", type=float, default=300.0)
    ap.add_argument("--shutdown-grace-seconds", type=float, default=30.0,
                    help="on the runner's own exit, the most each pod gets to stop (%(default)s)")
    ap.add_argument("--verbose", "-v", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kubernetes").setLevel(logging.WARNING)
    cfg = client.Configuration()
    config.load_kube_config(config_file=args.kubeconfig, client_configuration=cfg)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="hybridserving-pods-"))
    # What a pod's service account gives its Kubernetes clients (the router's discovery): the
    # containers inherit the runner's environment.
    os.environ["KUBECONFIG"] = str(Path(args.kubeconfig).resolve())
    runner = PodRunner(
        client.ApiClient(cfg), state_dir, args.namespace,
        probe_period_seconds=args.probe_period_seconds,
        volume_refresh_seconds=args.volume_refresh_seconds,
        restart_backoff_seconds=args.restart_backoff_seconds,
        restart_backoff_max_seconds=args.restart_backoff_max_seconds,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        node_selector=args.node_selector,
    )
    # A hangup (the terminal it runs in closed) stops it as SIGTERM does: the containers run in
    # sessions of their own, so the hangup never reaches them, and a runner that died of it would
    # leave them holding the pod addresses that the next cluster hands out again.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: runner.stopping.set())
    watcher = threading.Thread(target=runner.run, name="watch", daemon=True)
    watcher.start()
    runner.stopping.wait()
    runner.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
