"""The operator's CRD schema check against a real apiserver: the committed CRDs read back as
current (the apiserver's own additions to a CRD do not count), a CRD of another schema is
reported with the gauge and an ERROR naming the fix, and the check reads with no more than the
operator's ClusterRole grants (list, watch); without it the read fails and nothing is reported.
"""

from __future__ import annotations

import copy
import logging
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from hybridserving.api import crd as crdgen
from hybridserving.controller import crdcheck, rbac
from hybridserving.controller.kube import Kube
from hybridserving.core.crdschema import Current, Differs, Finding, Unstamped

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_FILES = sorted((REPO / "crds").glob("*.yaml"))
FLEETS = "hybridservings.hybridserving.io"


def new_api(cluster: Any, user: str | None = None) -> client.ApiClient:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    if user is not None:
        api.set_default_header("Impersonate-User", user)
    return api


def put(extensions: client.ApiextensionsV1Api, body: dict[str, Any]) -> None:
    """Create the CRD, or replace the one installed, and wait until it is Established."""
    name = body["metadata"]["name"]
    try:
        extensions.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = extensions.read_custom_resource_definition(name)
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        extensions.replace_custom_resource_definition(name, body)
    deadline = time.monotonic() + 60
    while True:
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        assert time.monotonic() < deadline, f"{name} never became Established: {conditions}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def api(cluster) -> Iterator[client.ApiClient]:
    api_client = new_api(cluster)
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture(scope="module")
def committed(api) -> dict[str, dict[str, Any]]:
    """The committed CRD files, installed; by CRD name."""
    bodies = {}
    for path in CRD_FILES:
        body = yaml.safe_load(path.read_text())
        put(client.ApiextensionsV1Api(api), body)
        bodies[body["metadata"]["name"]] = body
    return bodies


@pytest.fixture
def fleet_crd_replaced(api, committed) -> Iterator[Any]:
    """`replace(body)` installs another HybridServing CRD; the committed one is back afterwards,
    whatever the test did: the other integration tests create fleets against it."""
    extensions = client.ApiextensionsV1Api(api)
    try:
        yield lambda body: put(extensions, body)
    finally:
        put(extensions, committed[FLEETS])


def by_crd(findings: list[Finding] | None) -> dict[str, Finding]:
    assert findings is not None, "the CRDs could not be read"
    return {finding.crd: finding for finding in findings}


def gauge(crd: str) -> float | None:
    return REGISTRY.get_sample_value("hybridserving_crd_schema_current", {"crd": crd})


def test_the_committed_crds_as_installed_are_current(api, committed) -> None:
    findings = crdcheck.SchemaCheck(Kube(api, "crd"), crdcheck.EXPECTED).once()
    assert findings == [Current(name, digest) for name, digest in crdcheck.EXPECTED.items()]
    assert all(gauge(name) == 1 for name in committed)


def test_a_crd_of_another_schema_is_reported_with_the_fix(
        api, committed, fleet_crd_replaced, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "hybridserving.controller.crdcheck")
    check = crdcheck.SchemaCheck(Kube(api, "crd"), crdcheck.EXPECTED)
    assert all(f.current for f in check.once() or [])
    expected = crdcheck.EXPECTED[FLEETS]

    # An older release: a field the operator writes is missing, and the CRD is stamped as its own.
    older = copy.deepcopy(committed[FLEETS])
    status = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"]["capacity"]
    older_digest = crdgen.schema_digest(older["spec"])
    older["metadata"]["annotations"][crdgen.ANNOTATION_SCHEMA_DIGEST] = older_digest
    fleet_crd_replaced(older)
    assert by_crd(check.once())[FLEETS] == Differs(FLEETS, older_digest, expected)
    assert gauge(FLEETS) == 0
    (record,) = caplog.records
    message = record.getMessage()
    assert FLEETS in message and older_digest in message and expected in message
    assert "kubectl apply --server-side" in message

    # A release before the stamp: the same schema without the annotation.
    caplog.clear()
    del older["metadata"]["annotations"][crdgen.ANNOTATION_SCHEMA_DIGEST]
    fleet_crd_replaced(older)
    assert by_crd(check.once())[FLEETS] == Unstamped(FLEETS, expected)
    assert gauge(FLEETS) == 0
    assert [r.getMessage() for r in caplog.records] == [Unstamped(FLEETS, expected).describe()]

    # The documented apply brings it back.
    fleet_crd_replaced(committed[FLEETS])
    assert check.once() == [Current(name, digest) for name, digest in crdcheck.EXPECTED.items()]
    assert gauge(FLEETS) == 1


def test_the_operators_cluster_role_suffices_and_a_refused_read_reports_nothing(
        cluster, api, committed, caplog: pytest.LogCaptureFixture) -> None:
    rbac_api = client.RbacAuthorizationV1Api(api)
    suffix = uuid.uuid4().hex[:8]
    role, user, stranger = f"crd-check-{suffix}", f"operator-{suffix}", f"stranger-{suffix}"
    (cluster_role,) = [m for m in rbac.manifests() if m["kind"] == "ClusterRole"]
    rbac_api.create_cluster_role({**cluster_role, "metadata": {"name": role}})
    rbac_api.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })
    as_operator, as_stranger = new_api(cluster, user), new_api(cluster, stranger)
    try:
        check = crdcheck.SchemaCheck(Kube(as_operator, "crd"), crdcheck.EXPECTED)
        deadline = time.monotonic() + 30  # the authorizer learns of the new binding shortly
        while (findings := check.once()) is None:
            assert time.monotonic() < deadline, "the operator's ClusterRole does not let it read the CRDs"
            time.sleep(0.5)
        assert findings == [Current(name, digest) for name, digest in crdcheck.EXPECTED.items()]

        caplog.clear()
        caplog.set_level(logging.WARNING, "hybridserving.controller.crdcheck")
        before = {name: gauge(name) for name in committed}
        assert crdcheck.SchemaCheck(Kube(as_stranger, "crd"), crdcheck.EXPECTED).once() is None
        assert {name: gauge(name) for name in committed} == before
        (record,) = caplog.records
        assert record.levelno == logging.WARNING and "403" in record.getMessage()
    finally:
        as_operator.close()
        as_stranger.close()
        rbac_api.delete_cluster_role_binding(role)
        rbac_api.delete_cluster_role(role)
