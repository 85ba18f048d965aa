"""oci:// weights against the real kube-apiserver: the image volume survives it, or the fleet says why not.

The session's control plane runs Kubernetes 1.35 as configured by default, where the
ImageVolume feature gate is beta and on: the engine pods the operator creates keep their
`image` volume and its mount. A second control plane runs with the gate off, as a cluster
that has not enabled it would: its apiserver drops image volumes from new pods without an
error, so the operator creates no engine pod (each would run with no weights) and says so in
the Degraded condition and a Warning Event, naming spec.model.weights.uri and the fix.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from hybridserving.core import weights
from support.cluster_fleet import GROUP, VERSION, Fleet, Operator
from support.crds import apply_crds

IMAGE = "registry.example/models/deepseek-v3:fp8"


def manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HybridServing", "metadata": {"name": name}, "spec": {
        "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3",
                  "weights": {"uri": f"oci://{IMAGE}"}},
        "prefill": {"replicas": 1, "layout": {"tp": 8}},
        "decode": {"replicas": 1, "layout": {"tp": 8}},
    }}


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory) -> Operator:
    apply_crds(cluster)
    with Operator(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


@pytest.fixture(scope="module")
def gate_off(make_cluster, tmp_path_factory):
    """A control plane whose apiserver has the ImageVolume feature gate off, and its operator."""
    c = make_cluster(prefix="itx", feature_gates="ImageVolume=false")
    c.up(timeout=120)
    apply_crds(c)
    api = c.api_client()
    try:
        with Operator(c.kubeconfig, tmp_path_factory.mktemp("operator-gate-off") / "operator.log") as op:
            yield c, api, op
    finally:
        api.close()


@contextlib.contextmanager
def fleet_in(cluster, api, op, wait_for) -> Iterator[Fleet]:
    """A fleet in a namespace of its own, deleted afterwards (its nodes are free for the next test)."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    try:
        yield Fleet(cluster, api, ns, wait_for, op)
    finally:
        core.delete_namespace(ns)


def test_engine_pods_keep_their_image_volume_through_the_apiserver(cluster, api_client, operator, wait_for) -> None:
    with fleet_in(cluster, api_client, operator, wait_for) as fleet:
        fleet.apply(manifest("oci-weights"))
        pods = fleet.wait_for(lambda: (lambda p: p if len(p) == 2 else None)(fleet.pods()), timeout=90,
                              what="engine pods created")
        for pod in pods.values():
            stored = client.ApiClient().sanitize_for_serialization(pod)
            assert {"name": weights.VOLUME, "image": {"reference": IMAGE, "pullPolicy": "IfNotPresent"}} \
                in stored["spec"]["volumes"]
            engine = stored["spec"]["containers"][0]
            assert {"name": weights.VOLUME, "mountPath": weights.MOUNT_PATH, "readOnly": True} \
                in engine["volumeMounts"]
        assert fleet.condition("Degraded").get("reason") != "WeightsVolumeDropped"


def test_a_cluster_without_image_volumes_gets_no_weightless_engine_and_says_why(gate_off, wait_for) -> None:
    c, api, op = gate_off
    with fleet_in(c, api, op, wait_for) as fleet:
        fleet.apply(manifest("oci-weights"))
        degraded = fleet.wait_for(
            lambda: (lambda d: d if d.get("reason") == "WeightsVolumeDropped" else None)(fleet.condition("Degraded")),
            timeout=90, what="Degraded: WeightsVolumeDropped")
        assert degraded["status"] == "True"
        assert f"spec.model.weights.uri oci://{IMAGE}" in degraded["message"]
        assert "enable the ImageVolume feature gate" in degraded["message"]
        assert len(fleet.instances()) == 2, "the rest of the fleet is made"
        assert fleet.pods() == {}, "no engine pod runs without its weights"
        events = json.loads(c.kubectl("-n", fleet.ns, "get", "events", "--field-selector",
                                      "reason=WeightsVolumeDropped", "-o", "json").stdout)["items"]
        assert len(events) == 1 and events[0]["type"] == "Warning"
        assert "ImageVolume" in events[0]["message"]
