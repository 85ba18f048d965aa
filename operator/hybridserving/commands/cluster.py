"""What `status` and `rollback` say when the cluster cannot answer: no kubeconfig, a cluster not
reachable, a fleet not found, a CRD not installed, a request refused. Each as "error: ...; fix: ...",
the way the offline commands report bad input, rather than the client's traceback."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from hybridserving.commands.output import EXIT_INVALID

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi


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

    in_pod = (kubeconfig is None and not os.environ.get("KUBECONFIG")
              and bool(os.environ.get(config.incluster_config.SERVICE_HOST_ENV_NAME))
              and not os.path.exists(os.path.expanduser("~/.kube/config")))
    try:
        if in_pod:
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=kubeconfig)
    except (ConfigException, OSError, ValueError) as exc:  # no file, not a kubeconfig, no such context
        if in_pod:
            raise ClusterError(f"cannot use the pod's service account: {exc}",
                               "mount its token (automountServiceAccountToken), or pass --kubeconfig") from None
        where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise ClusterError(f"cannot load the kubeconfig from {where}: {exc}",
                           "pass --kubeconfig with the cluster's kubeconfig, or set KUBECONFIG") from None
    return client.CustomObjectsApi()


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
