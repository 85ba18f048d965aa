"""`python -m hybridserving.controller`: run the operator (one replica; see docs/operator.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf
from prometheus_client import start_http_server

from hybridserving.controller import handlers
from hybridserving.core.privileges import EnginePolicy


def _flag(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError("expected true or false")
    return value.lower() == "true"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybridserving.controller", description=__doc__)
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="watch only these namespaces (repeatable); default: the whole cluster")
    ap.add_argument("--kubeconfig", default=None, help="outside a cluster: the kubeconfig (default $KUBECONFIG)")
    ap.add_argument("--workers", type=int, default=4, help="HybridServings reconciled in parallel")
    ap.add_argument("--resync-seconds", type=float, default=60.0, help="reconcile every fleet at least this often")
    ap.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0: off)")
    ap.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics server binds")
    ap.add_argument("--health-port", type=int, default=0,
                    help="liveness endpoint /healthz on this port (0: off)")
    ap.add_argument("--engine-allow-host-network", type=_flag, default=True, metavar="true|false",
                    help="whether engine pods may use the host network (refused fleets get LayoutValid=False)")
    ap.add_argument("--engine-allow-ipc-lock", type=_flag, default=True, metavar="true|false",
                    help="whether engine pods may get IPC_LOCK (needed by RDMA)")
    ap.add_argument("--webhook-port", type=int, default=0,
                    help="serve the validating admission webhook on this port (0: off)")
    ap.add_argument("--webhook-addr", default="0.0.0.0", help="address the webhook server binds")
    ap.add_argument("--webhook-host", default=None,
                    help="name the apiserver reaches the webhook by (in a cluster: <service>.<namespace>.svc)")
    ap.add_argument("--webhook-cert-dir", default=None,
                    help="tls.crt and tls.key (e.g. from cert-manager); default: a self-signed pair made at start")
    ap.add_argument("--verbose", "-v", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # kopf logs every handled watch event; the reconcile logs what matters.
        logging.getLogger("kopf").setLevel(logging.WARNING)
    handlers.OPTIONS.kubeconfig = args.kubeconfig
    if args.kubeconfig:
        # kopf logs in through its own credential hooks, which read KUBECONFIG.
        os.environ["KUBECONFIG"] = args.kubeconfig
    handlers.OPTIONS.workers = args.workers
    handlers.OPTIONS.resync_seconds = args.resync_seconds
    handlers.OPTIONS.engine_policy = EnginePolicy(args.engine_allow_host_network, args.engine_allow_ipc_lock)
    if args.webhook_port:
        from hybridserving.controller import admission  # registers the webhook handlers

        cert_dir = args.webhook_cert_dir

        @kopf.on.startup()
        def serve_webhook(settings: kopf.OperatorSettings, **_: object) -> None:
            admission.configure(
                settings, addr=args.webhook_addr, port=args.webhook_port,
                host=args.webhook_host or args.webhook_addr,
                certfile=f"{cert_dir}/tls.crt" if cert_dir else None,
                keyfile=f"{cert_dir}/tls.key" if cert_dir else None,
            )
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    asyncio.run(kopf.operator(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
    ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
