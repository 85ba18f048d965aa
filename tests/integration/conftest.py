"""Fixtures for tests against a real local control plane with fake GPU nodes.

The control-plane binaries come from ``tools/build-tools.sh``; when they are
missing the tests fail (they are never skipped).

Environment:
    HYBRIDSERVING_CACHE            cache root (default ~/.cache/hybridserving)
    HYBRIDSERVING_KEEP_CLUSTER=1   keep the test cluster's state dir (logs) after the run
"""

from __future__ import annotations

import os
import pathlib
import sys
import uuid
from typing import Any, Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT / "operator") not in sys.path:
    sys.path.insert(0, str(ROOT / "operator"))

from hybridserving.devcluster import (  # noqa: E402
    Cluster,
    DevClusterError,
    FleetSpec,
    MissingBinaries,
    find_binaries,
    reap_orphans,
)
from support.polling import wait_for as wait_for_condition  # noqa: E402

UP_TIMEOUT = float(os.environ.get("HYBRIDSERVING_UP_TIMEOUT", "120"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "multicluster: starts an additional control plane (slower, still run by default)")


def unique_name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def require_binaries() -> None:
    try:
        find_binaries()
        problem = None
    except MissingBinaries as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """A control plane with the default fake fleet (8 nodes x 8 GPUs), one per test session."""
    require_binaries()
    # control planes left by an earlier test run that was killed before its teardown
    for prefix in ("it-", "itx-"):
        for name in reap_orphans(prefix):
            sys.stderr.write(f"stopped orphaned test cluster {name}\n")
    c = Cluster(unique_name("it"), FleetSpec())
    problem = None
    try:
        c.up(timeout=UP_TIMEOUT)
    except DevClusterError as exc:
        problem = f"local control plane did not come up: {exc}"
    if problem:
        pytest.fail(problem, pytrace=False)
    try:
        yield c
    finally:
        crashed = c.crashed()
        if crashed:
            sys.stderr.write(f"\ncomponents died during the tests: {crashed}\n{c.crash_report(crashed)}\n")
        c.down(purge=os.environ.get("HYBRIDSERVING_KEEP_CLUSTER") != "1")


@pytest.fixture(scope="session")
def api_client(cluster: Cluster):
    """``kubernetes.client.ApiClient`` for the session cluster."""
    api = cluster.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def core_v1(api_client):
    from kubernetes import client
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def apps_v1(api_client):
    from kubernetes import client
    return client.AppsV1Api(api_client)


@pytest.fixture
def namespace(core_v1) -> str:
    """A fresh namespace, deleted (without waiting) after the test."""
    from kubernetes.client.rest import ApiException

    name = f"t-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        try:
            core_v1.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def kubectl(cluster: Cluster) -> Callable[..., Any]:
    """Run the built kubectl against the session cluster."""
    return cluster.kubectl


@pytest.fixture(scope="session")
def wait_for() -> Callable[..., Any]:
    """``wait_for(check, timeout=60, interval=0.5, what=...)``: poll until truthy."""
    return wait_for_condition


@pytest.fixture(scope="session")
def make_cluster():
    """Factory for extra clusters (unique names); all are stopped at session end."""
    started: list[Cluster] = []

    def make(fleet: FleetSpec | None = None, prefix: str = "itx", feature_gates: str = "",
             probed_readiness: bool = False) -> Cluster:
        require_binaries()
        c = Cluster(unique_name(prefix), fleet or FleetSpec(nodes=1), feature_gates=feature_gates,
                    probed_readiness=probed_readiness)
        started.append(c)
        return c

    try:
        yield make
    finally:
        for c in started:
            c.down(quiet=True)
