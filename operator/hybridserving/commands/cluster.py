"""What `status`, `rollback` and `upgrade-check` say when the cluster cannot answer: no kubeconfig
(or one that is not), a cluster not reachable or not answering in time, a fleet not found, a CRD
not installed, a request refused. Each as "error: ...; fix: ...", the way the offline commands
report bad input, rather than the client's traceback or a wait without end. And the cluster and
namespace they use without -n, as kubectl picks them: kubectl refuses its own flags before a
plugin's name, so `--context` has to be the plugin's."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from hybridserving.commands.output import write_error

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CustomObjectsApi


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""Where the kubelet mounts the pod's namespace, beside its service account token."""


class ClusterError(Exception):
    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds one request may take. Without a bound, an apiserver that takes the connection and never
answers (a wedged control plane, a load balancer whose backends are gone) holds the command for
good, and the on-call's `status` hangs when it is needed most."""

MAX_REQUEST_TIMEOUT = 86_400.0  # a day: no request waits longer, and far past it the socket refuses the value


def request_timeout(text: str) -> float:
    """An argparse type: seconds above 0, as a number or as kubectl writes them (`30s`, `2m`,
    `1h`), so the flag reads as kubectl's own. No timeout at all (kubectl's `0`) is refused: it
    is the wait without end the flag is there to prevent."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, scale = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use seconds, or 30s, 2m, 1h") from None
    if not 0 < value <= MAX_REQUEST_TIMEOUT:
        raise argparse.ArgumentTypeError(f"{text} is out of range: use more than 0 seconds and at most a day")
    return value


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    """The flags that pick the cluster and bound the wait for it, the same on every command that asks one."""
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context", default=None,
                   help="the kubeconfig context to use, as kubectl's --context (default: its current-context)")
    p.add_argument("--request-timeout", type=request_timeout, default=DEFAULT_REQUEST_TIMEOUT, metavar="SECONDS",
                   help="how long one request to the cluster may take before the command gives up, in seconds "
                        "or as 30s, 2m (default: %(default)g)")


def connect(kubeconfig: str | None, context: str | None = None,
            timeout: float = DEFAULT_REQUEST_TIMEOUT) -> ApiClient:
    """A client for the kubeconfig's cluster (`context`, else its current one) whose every request
    ends within `timeout` seconds, or ClusterError saying which file or context to give.

    The client's own default is no timeout and three retries of a failed attempt, each with the
    full wait: one attempt per request keeps the wait the flag says. In a pod with no kubeconfig
    (no --kubeconfig, $KUBECONFIG or ~/.kube/config) it is the pod's service account, as for
    kubectl: the new operator image can check its own upgrade from inside the cluster (`kubectl
    run ... -- hybridserving upgrade-check -n NAMESPACE`)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    from urllib3.util.retry import Retry

    configuration = client.Configuration()
    in_pod = _in_pod(kubeconfig, context)
    where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
    try:
        if in_pod:
            config.load_incluster_config(client_configuration=configuration)
        else:
            _check_context(kubeconfig, context, where)
            with _logged_errors() as errors:
                config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
            _check_credentials(kubeconfig, context, where, configuration, errors)
    # No file, not YAML, not a kubeconfig's shape, no such context.
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError) as exc:
        if isinstance(exc, TypeError | AttributeError | KeyError):  # the client indexed a shape it assumed
            said = "not a kubeconfig: a YAML mapping of clusters, users, contexts and current-context"
        else:
            said = ("not YAML: " if isinstance(exc, yaml.YAMLError) else "") + " ".join(str(exc).split())
        if in_pod:
            raise ClusterError(f"cannot use the pod's service account: {said}",
                               "mount its token (automountServiceAccountToken), or pass --kubeconfig") from None
        raise ClusterError(f"cannot load the kubeconfig from {where}: {said}",
                           "pass --kubeconfig with the cluster's kubeconfig, or set KUBECONFIG") from None
    # Redirects are still followed; a failed attempt is not made again.
    configuration.retries = Retry(connect=0, read=0, other=0)
    api = client.ApiClient(configuration)
    unbounded = api.call_api

    def call_api(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        # Each generated API method takes its own `_request_timeout`: one call that left it out
        # would wait without end again.
        return unbounded(*args, **{**kwargs, "_request_timeout": _request_timeout or timeout})

    api.call_api = call_api  # type: ignore[method-assign]
    return api


def custom_objects(kubeconfig: str | None, context: str | None = None,
                   timeout: float = DEFAULT_REQUEST_TIMEOUT) -> CustomObjectsApi:
    """A client for custom objects (`connect`)."""
    from kubernetes import client

    return client.CustomObjectsApi(connect(kubeconfig, context, timeout))


def _check_context(kubeconfig: str | None, context: str | None, where: str) -> None:
    """A --context the kubeconfig does not have, named with the ones it has (the client says only
    that it expected an object by that name). A file that cannot be listed is left to the load."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    if context is None:
        return
    try:
        contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
        names = [c["name"] for c in contexts]
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError):
        return
    if context not in names:
        raise ClusterError(f"the kubeconfig from {where} has no context {context}",
                           f"pass --context with one of: {', '.join(map(str, names)) or 'none'} "
                           "(kubectl config get-contexts)")


@contextlib.contextmanager
def _logged_errors() -> Iterator[list[str]]:
    """The errors the kubernetes client logs (on the root logger) while it loads a kubeconfig: the one
    place it says why a credential plugin gave nothing. Kept from the terminal, where Python's
    last-resort handler would print them bare before the command's own error."""
    errors: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(" ".join(record.getMessage().split()))

    handler = Collect(logging.ERROR)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield errors
    finally:
        root.removeHandler(handler)


def _check_credentials(kubeconfig: str | None, context: str | None, where: str, configuration: Any,
                       errors: list[str]) -> None:
    """A credential plugin (`users[].user.exec`) that is not installed or failed. The client then
    sends every request without credentials, and the apiserver's 401 says nothing of the plugin."""
    if configuration.api_key.get("authorization") or configuration.cert_file:
        return
    command = _exec_command(kubeconfig, context)
    if command is None:
        return
    said = errors[-1] if errors else "it gave no token or client certificate"
    if shutil.which(command) is None:
        fix = f"install {command} where PATH finds it (kubectl needs it too), or pass another --kubeconfig"
    else:
        fix = f"run {command} by hand (or log in again with its tool) to see why, then try again"
    raise ClusterError(f"the kubeconfig from {where} gets its credentials from the plugin {command}, which failed: "
                       f"{said}", fix)


def _exec_command(kubeconfig: str | None, context: str | None) -> str | None:
    """The credential plugin the context's user runs, if any (the kubeconfig as the client merges it)."""
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION, KubeConfigMerger

    try:
        merged = KubeConfigMerger(kubeconfig or KUBE_CONFIG_DEFAULT_LOCATION).config.value
        name = context or merged["current-context"]
        user = next(c["context"]["user"] for c in merged["contexts"] if c["name"] == name)
        command = next(u["user"]["exec"]["command"] for u in merged["users"] if u["name"] == user)
    # No such context or user, or no plugin: nothing to name (a missing key is the client's ConfigException).
    except (ConfigException, StopIteration, LookupError, TypeError, AttributeError, OSError, yaml.YAMLError):
        return None
    return str(command)


def _in_pod(kubeconfig: str | None, context: str | None = None) -> bool:
    """No kubeconfig to read (no --kubeconfig, $KUBECONFIG or ~/.kube/config), in a pod: its
    service account is the identity, as for kubectl. A --context names a kubeconfig's context,
    so it asks for the kubeconfig, and its absence is the error."""
    from kubernetes.config import incluster_config

    return (kubeconfig is None and context is None and not os.environ.get("KUBECONFIG")
            and bool(os.environ.get(incluster_config.SERVICE_HOST_ENV_NAME))
            and not os.path.exists(os.path.expanduser("~/.kube/config")))


def default_namespace(kubeconfig: str | None, context: str | None = None) -> str:
    """The namespace kubectl would use without -n: that of the kubeconfig's context (`context`,
    else its current one), in a pod the pod's own, else `default`. A kubeconfig or context that
    cannot be read gives `default`: the request that follows says what is wrong with it."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    if _in_pod(kubeconfig, context):
        try:
            return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            current = next((c for c in contexts if c.get("name") == context), None)
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError):
        return "default"
    chosen = (current or {}).get("context") if isinstance(current, dict) else None
    namespace = chosen.get("namespace") if isinstance(chosen, dict) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def with_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with `-n`'s default filled in as kubectl fills it (`default_namespace`), from the
    context `--context` names on a command that has the flag."""
    if args.namespace is None:
        args.namespace = default_namespace(args.kubeconfig, getattr(args, "context", None))
    return args


NAMESPACE_HELP = "default: the kubeconfig context's namespace (in a pod, the pod's), else default"


def explain(exc: Exception, name: str | None, namespace: str,
            timeout: float | None = None) -> ClusterError | None:
    """`exc`, raised by a request for fleet `name` (None: the namespace's list), as a ClusterError;
    None for an exception that is not the cluster's answer or its absence. `timeout`: the
    --request-timeout the requests ran with, named when one ran out."""
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
        if exc.status in (400, 422):
            # The apiserver's schema, its CEL rules or the operator's admission webhook refused the
            # object written: running the command again writes the same one.
            return ClusterError(f"the cluster refused the spec written ({exc.status} {exc.reason}): {said}",
                                "nothing was changed; fix what the message names, or, for a rollback, pick "
                                "another revision with --to-revision")
        return ClusterError(f"the cluster answered {exc.status} {exc.reason}: {said}",
                            "check the cluster's health and run the command again")
    if isinstance(exc, HTTPError | OSError):  # refused, unresolvable, timed out, TLS
        # urllib3 wraps the last attempt's failure in MaxRetryError; its reason is the part to read.
        reason = getattr(exc, "reason", None) or exc
        fix = "check the cluster is up and the kubeconfig's server and context (kubectl cluster-info)"
        if timeout is not None and _timed_out(reason):
            return ClusterError(f"cannot reach the cluster: no answer within {timeout:g} s (--request-timeout)",
                                f"{fix}; on a slow cluster, give it longer with --request-timeout")
        return ClusterError(f"cannot reach the cluster: {reason}", fix)
    return None


def _timed_out(reason: object) -> bool:
    """Whether the failure is a wait that ran out, at the connect, the TLS handshake or the
    answer. A refused connection is urllib3's kind of connect timeout too; it is no wait."""
    from urllib3.exceptions import NewConnectionError
    from urllib3.exceptions import TimeoutError as WaitRanOut

    return isinstance(reason, WaitRanOut | TimeoutError) and not isinstance(reason, NewConnectionError)


def answered(command: Callable[[], int], name: str | None, namespace: str, out: TextIO, *,
             timeout: float | None = None, as_json: bool = False) -> int:
    """`command`'s exit code; where the cluster cannot answer it, the reason and its fix (as JSON
    with `-o json`, `write_error`), and 1. `timeout`: as for `explain`."""
    try:
        return command()
    except ClusterError as err:
        failure = err
    except Exception as exc:
        explained = explain(exc, name, namespace, timeout)
        if explained is None:
            raise
        failure = explained
    return write_error(out, as_json, None, failure.message, failure.fix)
