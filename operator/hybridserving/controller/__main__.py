"""`python -m hybridserving.controller`: run the operator (with --leader-elect, one of several replicas)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket

import kopf
from kubernetes.config import kube_config
from prometheus_client import start_http_server

from hybridserving.controller import handlers, health
from hybridserving.controller.status import PROGRESS_DEADLINE_SECONDS
from hybridserving.controller.leadership import Election
from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE, DEFAULT_ROUTER_IMAGE
from hybridserving.core.liveness import STUCK_PASS_SECONDS
from hybridserving.core.privileges import DEFAULT_NODE_CACHE_PATHS, EnginePolicy


def _flag(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError("expected true or false")
    return value.lower() == "true"


def arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hybridserving.controller", description=__doc__)
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="watch only these namespaces (repeatable); default: the whole cluster")
    ap.add_argument("--kubeconfig", default=None, help="outside a cluster: the kubeconfig (default $KUBECONFIG)")
    ap.add_argument("--workers", type=int, default=4, help="HybridServings reconciled in parallel")
    ap.add_argument("--resync-seconds", type=float, default=60.0, help="reconcile every fleet at least this often")
    ap.add_argument("--relist-seconds", type=float, default=600.0,
                    help="the read cache LISTs a fleet's objects again after this long (bounds how long a deletion "
                    "that fell between two watches can go unseen)")
    ap.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0: off)")
    ap.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics server binds")
    ap.add_argument("--health-port", type=int, default=0,
                    help="liveness endpoint /healthz on this port (0: off)")
    ap.add_argument("--stuck-pass-seconds", type=float, default=STUCK_PASS_SECONDS,
                    help="/healthz fails once a reconcile pass or role-switch tick has run this long (0: never)")
    ap.add_argument("--engine-allow-host-network", type=_flag, default=False, metavar="true|false",
                    help="whether engine pods may use the host network (refused fleets get LayoutValid=False)")
    ap.add_argument("--engine-allow-ipc-lock", type=_flag, default=False, metavar="true|false",
                    help="whether engine pods may get IPC_LOCK (needed by RDMA)")
    ap.add_argument("--allowed-image", action="append", default=[], metavar="PREFIX",
                    help="engine and router images must start with one of these prefixes (repeatable; "
                    "default: any image)")
    ap.add_argument("--engine-allow-node-cache", type=_flag, default=False, metavar="true|false",
                    help="whether engine pods may fill a host directory with their weights (weights.cache: Node)")
    ap.add_argument("--allowed-node-cache-path", action="append", default=None, metavar="DIR",
                    help="host directories a node cache may be in (repeatable; default: "
                    f"{', '.join(DEFAULT_NODE_CACHE_PATHS)})")
    ap.add_argument("--engine-allow-service-account", type=_flag, default=False, metavar="true|false",
                    help="whether pod templates may pick a service account or mount its token")
    ap.add_argument("--operator-secret", action="append", default=[], metavar="NAME",
                    help="a Secret of the operator's own (its key, its webhook's certificate) that no fleet may "
                    "reference (repeatable; the chart passes its own)")
    ap.add_argument("--default-engine-image", default=DEFAULT_ENGINE_IMAGE, metavar="IMAGE",
                    help="engine image of fleets that name none (spec.engine.image unset)")
    ap.add_argument("--default-router-image", default=DEFAULT_ROUTER_IMAGE, metavar="IMAGE",
                    help="router (smg) image of fleets that name none (spec.router.image unset)")
    ap.add_argument("--operator-namespace", default=os.environ.get("POD_NAMESPACE"),
                    help="namespace of the operator's pods, admitted to engine ports by each fleet's "
                    "NetworkPolicy (default $POD_NAMESPACE; unset: no operator peer, as out of cluster)")
    ap.add_argument("--progress-deadline-seconds", type=float, default=PROGRESS_DEADLINE_SECONDS,
                    help="a fleet progressing longer than this is reported ProgressDeadlineExceeded")
    ap.add_argument("--leader-elect", action="store_true",
                    help="run as one of several replicas: act only while holding the Lease")
    ap.add_argument("--leader-elect-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                    help="namespace of the Lease (default $POD_NAMESPACE)")
    ap.add_argument("--leader-elect-lease", default="hybridserving-operator", help="name of the Lease")
    ap.add_argument("--leader-elect-identity",
                    default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
                    help="this replica in the Lease (default $POD_NAME)")
    ap.add_argument("--leader-elect-lease-seconds", type=float, default=15.0,
                    help="a standby takes over after the leader has not renewed for this long; the leader "
                    "stops when it could not renew for two thirds of it")
    ap.add_argument("--webhook-port", type=int, default=0,
                    help="serve the validating admission webhook on this port (0: off)")
    ap.add_argument("--webhook-addr", default="0.0.0.0", help="address the webhook server binds")
    ap.add_argument("--webhook-cert-dir", default=None,
                    help="tls.crt and tls.key the webhook serves (the chart's Secret); needed with --webhook-port")
    ap.add_argument("--verbose", "-v", action="store_true")
    return ap


OPERATOR_KEY_ENV = "HYBRIDSERVING_OPERATOR_KEY"
OPERATOR_KEY_MIN_LENGTH = 32


def operator_key(env: dict[str, str] | os._Environ[str]) -> bytes:
    """The secret each fleet's engine key is derived from (core/enginekey.py). It must outlive the
    process: a new one would change every fleet's key and lock the operator out of running engines
    until their pods restart. The chart keeps it in a Secret generated once at install."""
    key = env.get(OPERATOR_KEY_ENV, "")
    if len(key) < OPERATOR_KEY_MIN_LENGTH:
        raise SystemExit(
            f"{OPERATOR_KEY_ENV} must hold at least {OPERATOR_KEY_MIN_LENGTH} characters (it has {len(key)}): "
            "the chart sets it from the Secret <release>-operator-key; elsewhere set it to a stable random "
            "value, e.g. `openssl rand -hex 32`, kept across restarts")
    return key.encode()


def engine_policy(args: argparse.Namespace) -> EnginePolicy:
    """What engine pods may be given: only what the flags grant."""
    return EnginePolicy(
        allow_host_network=args.engine_allow_host_network, allow_ipc_lock=args.engine_allow_ipc_lock,
        allowed_images=tuple(args.allowed_image), operator_namespace=args.operator_namespace,
        default_image=args.default_engine_image, default_router_image=args.default_router_image,
        allow_node_cache=args.engine_allow_node_cache,
        allowed_node_cache_paths=tuple(args.allowed_node_cache_path or DEFAULT_NODE_CACHE_PATHS),
        allow_service_account=args.engine_allow_service_account, operator_secrets=tuple(args.operator_secret))


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # kopf logs every handled watch event; the reconcile logs what matters.
        logging.getLogger("kopf").setLevel(logging.WARNING)
    handlers.OPTIONS.operator_key = operator_key(os.environ)
    handlers.OPTIONS.kubeconfig = args.kubeconfig
    if args.kubeconfig:
        # kopf logs in through the Kubernetes client's default kubeconfig, which the client took from
        # $KUBECONFIG when it was imported (before these flags were read).
        os.environ["KUBECONFIG"] = args.kubeconfig
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = args.kubeconfig
    handlers.OPTIONS.workers = args.workers
    handlers.OPTIONS.resync_seconds = args.resync_seconds
    handlers.OPTIONS.relist_seconds = args.relist_seconds
    handlers.OPTIONS.engine_policy = engine_policy(args)
    handlers.OPTIONS.progress_deadline_seconds = args.progress_deadline_seconds
    handlers.OPTIONS.stuck_pass_seconds = args.stuck_pass_seconds
    if args.leader_elect:
        if not args.leader_elect_namespace:
            arguments().error("--leader-elect needs --leader-elect-namespace (or $POD_NAMESPACE)")
        seconds = args.leader_elect_lease_seconds
        handlers.OPTIONS.election = Election(
            namespace=args.leader_elect_namespace, identity=args.leader_elect_identity,
            name=args.leader_elect_lease, lease_seconds=seconds,
            renew_deadline_seconds=seconds * 2 / 3, retry_seconds=min(2.0, seconds / 4))
    if args.webhook_port:
        if not args.webhook_cert_dir:
            # The apiserver trusts only the CA in the webhook configuration, which the operator does not write.
            arguments().error("--webhook-port needs --webhook-cert-dir")
        from hybridserving.controller import admission  # registers the webhook handlers

        cert_dir = args.webhook_cert_dir

        @kopf.on.startup()
        def serve_webhook(settings: kopf.OperatorSettings, **_: object) -> None:
            admission.configure(settings, addr=args.webhook_addr, port=args.webhook_port,
                                certfile=f"{cert_dir}/tls.crt", keyfile=f"{cert_dir}/tls.key")
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    asyncio.run(run(args))
    return 0


async def run(args: argparse.Namespace) -> None:
    """kopf, with the liveness endpoint (controller/health.py) beside it in the same event loop."""
    probe = await health.listen(handlers.unhealthy, "0.0.0.0", args.health_port) if args.health_port else None
    try:
        await kopf.operator(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace)
    finally:
        if probe is not None:
            await probe.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
