"""What `status`, `rollback` and `upgrade-check` say when the cluster cannot answer: no kubeconfig
(or one that is not), a cluster not reachable, a fleet not found, a CRD not installed, a request
refused. Each as "error: ...; fix: ...", the way the offline commands report bad input, rather
than the client's traceback. And the namespace they use without -n, as kubectl picks it."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import yaml

from hybridserving.commands.output import EXIT_INVALID

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""Where the kubelet mounts the pod's namespace, beside its service account token."""


class ClusterError(Exception):
    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


def custom_objects(kubeconfig: str | None) -> CustomObjectsApi:
    """A client for custom objects from the kubeconfig, or ClusterError saying which file to give.

    In a pod with no kubeconfig (no --kubeconfig, $KUBECONFIG or ~/.kube/config) it is the pod's
    service account, as for kubectl: the new operator image can check its own upgrade from inside
    the cluster (`kubectl run ... -- hybridserving upgrade-check -n NAMESPACE`)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    in_pod = _in_pod(kubeconfig)
    try:
        if in_pod:
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=kubeconfig)
    # No file, not YAML, not a kubeconfig's shape, no such context.
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError) as exc:
        if isinstance(exc, TypeError | AttributeError | KeyError):  # the client indexed a shape it assumed
            said = "not a kubeconfig: a YAML mapping of clusters, users, contexts and current-context"
        else:
            said = ("not YAML: " if isinstance(exc, yaml.YAMLError) else "") + " ".join(str(exc).split())
        if in_pod:
            raise ClusterError(f"cannot use the pod's service account: {said}",
                               "mount its token (automountServiceAccountToken), or pass --kubeconfig") from None
        where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise ClusterError(f"cannot load the kubeconfig from {where}: {said}",
                           "pass --kubeconfig with the cluster's kubeconfig, or set KUBECONFIG") from None
    return client.CustomObjectsApi()


def _in_pod(kubeconfig: str | None) -> bool:
    """No kubeconfig to read (no --kubeconfig, $KUBECONFIG or ~/.kube/config), in a pod: its
    service account is the identity, as for kubectl."""
    from kubernetes.config import incluster_config

    return (kubeconfig is None and not os.environ.get("KUBECONFIG")
            and bool(os.environ.get(incluster_config.SERVICE_HOST_ENV_NAME))
            and not os.path.exists(os.path.expanduser("~/.kube/config")))


def default_namespace(kubeconfig: str | None) -> str:
    """The namespace kubectl would use without -n: the kubeconfig's current context's, in a pod
    the pod's own, else `default`. A kubeconfig that cannot be read gives `default`: the request
    that follows says what is wrong with it."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    if _in_pod(kubeconfig):
        try:
            return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        _, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError):
        return "default"
    context = (current or {}).get("context") if isinstance(current, dict) else None
    namespace = context.get("namespace") if isinstance(context, dict) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def with_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with `-n`'s default filled in as kubectl fills it (`default_namespace`)."""
    if args.namespace is None:
        args.namespace = default_namespace(args.kubeconfig)
    return args


NAMESPACE_HELP = "default: the kubeconfig context's namespace (in a pod, the pod's), else default"


def explain(exc: Exception, name: str | None, namespace: str) -> ClusterError | None:
    """`exc`, raised by a request for fleet `name` (None: the namespace's list), as a ClusterError;
    None for an exception that is not the cluster's answer or its absence."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        try:
            said = json.loads(exc.body or "{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            said = exc.reason
        if exc.status == 404 and name is not None and str(said).startswith("hybridservings."):
            return ClusterError(f"HybridServing {name} not found in namespace {namespace}",
                                f"check the name and -n; `kubectl get hybridservings -n {namespace}` lists them")
        if exc.status == 404:
            return ClusterError(f"the cluster does not serve HybridServings: {said}",
                                "install the operator's chart (it installs the CRDs), or check the kubeconfig's "
                                "context points at the right cluster")
        if exc.status in (401, 403):
            return ClusterError(f"the cluster refused the request ({exc.status} {exc.reason}): {said}",
                                f"use credentials that may read and update hybridservings in {namespace}")
        return ClusterError(f"the cluster answered {exc.status} {exc.reason}: {said}",
                            "check the cluster's health and run the command again")
    if isinstance(exc, HTTPError | OSError):  # refused, unresolvable, timed out, TLS
        # urllib3 wraps the last attempt's failure in MaxRetryError; its reason is the part to read.
        return ClusterError(f"cannot reach the cluster: {getattr(exc, 'reason', None) or exc}",
                            "check the cluster is up and the kubeconfig's server and context "
                            "(kubectl cluster-info)")
    return None


def answered(command: Callable[[], int], name: str | None, namespace: str, out: TextIO) -> int:
    """`command`'s exit code; where the cluster cannot answer it, the reason and its fix, and 1."""
    try:
        return command()
    except ClusterError as err:
        failure = err
    except Exception as exc:
        explained = explain(exc, name, namespace)
        if explained is None:
            raise
        failure = explained
    out.write(f"error: {failure.message}\n  fix: {failure.fix}\n")
    return EXIT_INVALID
