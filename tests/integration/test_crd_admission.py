"""The generated CRDs in a real apiserver: accepted, defaulting as the models do, and rejecting
bad objects at admission with a message that names the field.

Only an apiserver evaluates CEL exactly and estimates its cost, so every rule is exercised
here with objects that break it.
"""

from __future__ import annotations

import copy
import functools
import json
import pathlib
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from hybridserving import manifests
from hybridserving.api import crd as crdgen
from hybridserving.api.instance import CONFIG_HASH, HybridServingInstanceStatus
from hybridserving.api.v1alpha1 import (
    CONDITION_REASON,
    ENGINE_IMAGE,
    ENV_VAR_NAME,
    GROUP,
    INSTANCE_PLURAL,
    PLURAL,
    ROUTER_IMAGE,
    SGLANG_VERSION,
    VERSION,
    CapacityStatus,
    HybridServing,
    HybridServingStatus,
    RoleStatus,
)
from hybridserving.api.pods import (
    EXTENDED_RESOURCE,
    EXTENDED_RESOURCE_OR_EMPTY,
    LABEL_KEY,
    LABEL_VALUE,
    QUANTITY,
    canonical_quantity,
    requests_vs_limits,
)
from hybridserving.api.weights import ENDPOINT, HOST_PATH, REVISION, URI
from hybridserving.api.profiles import PROFILES
from hybridserving.core.fleet import assess
from hybridserving.core import planner
from hybridserving.core.drift import contains
from hybridserving.core.observed import Observed

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_FILES = sorted((REPO / "crds").glob("*.yaml"))

FLEET = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "HybridServing",
    "metadata": {"name": "fleet"},
    "spec": {
        "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
        "prefill": {"replicas": 2, "layout": {"tp": 8}},
        "decode": {"replicas": 2, "layout": {"tp": 8}},
    },
}
INSTANCE = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "HybridServingInstance",
    "metadata": {"name": "fleet-decode-0"},
    "spec": {
        "role": "decode",
        "index": 0,
        "nodes": 2,
        "configHash": "5f3a9c",
        "ports": {"http": 30000, "bootstrap": 8998, "distInit": 20000, "engineInfoBootstrap": 6789},
    },
}


@pytest.fixture(scope="module")
def api(cluster) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture(scope="module")
def installed(api) -> list[dict[str, Any]]:
    """The committed CRD files, created in the apiserver and established."""
    extensions = client.ApiextensionsV1Api(api)
    bodies = [yaml.safe_load(path.read_text()) for path in CRD_FILES]
    for body in bodies:
        try:
            extensions.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                pytest.fail(f"the apiserver refused {body['metadata']['name']}: {exc.body}", pytrace=False)
            current = extensions.read_custom_resource_definition(body["metadata"]["name"])
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version}}
            extensions.replace_custom_resource_definition(body["metadata"]["name"], body)
    deadline = time.monotonic() + 60
    for body in bodies:
        while True:
            conditions = extensions.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            assert time.monotonic() < deadline, f"{body['metadata']['name']} never became Established: {conditions}"
            time.sleep(0.2)
    return bodies


@pytest.fixture(scope="module")
def namespace(api, installed) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"crd-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture(scope="module")
def objects(api, namespace) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create(objects, namespace: str, body: dict[str, Any], *, dry_run: bool = True) -> dict[str, Any]:
    plural = PLURAL if body["kind"] == "HybridServing" else INSTANCE_PLURAL
    kwargs = {"dry_run": "All"} if dry_run else {}
    return objects.create_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, body, field_validation="Strict", **kwargs
    )


def rejection(call: Callable[[], Any]) -> tuple[str, set[str]]:
    """The apiserver's message and the fields its causes name, for a call that must fail."""
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 422, info.value.body
    status = json.loads(info.value.body)
    return status["message"], {cause.get("field", "") for cause in status["details"].get("causes", [])}


def with_changes(base: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    body = copy.deepcopy(base)
    body["metadata"]["name"] = f"{base['metadata']['name']}-{uuid.uuid4().hex[:6]}"
    change(body)
    return body


def test_the_apiserver_accepts_the_generated_crds(installed):
    assert {body["spec"]["names"]["kind"] for body in installed} == {"HybridServing", "HybridServingInstance"}


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_example_fleets_are_accepted_and_defaulted_as_the_models_do(objects, namespace, path):
    body = yaml.safe_load(path.read_text())
    stored = create(objects, namespace, copy.deepcopy(body))
    expected = HybridServing.model_validate(body).spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert stored["spec"] == expected


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return change


def _both(*changes: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        for one in changes:
            one(body)

    return change


ARCHITECTURE = PROFILES["deepseek-v3"].model_dump(by_alias=True, mode="json")


def _custom_architecture(**figures: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["spec"]["model"].pop("profile")
        body["spec"]["model"]["architecture"] = {**ARCHITECTURE, **figures}

    return change

BAD_FLEETS = {
    "dcp does not divide tp": (_set("spec.decode.layout.dcp", 3), "spec.decode.layout.dcp", "dcp must divide tp"),
    "attnCp without cpStrategy": (
        _set("spec.prefill.layout.attnCp", 4),
        "spec.prefill.layout.cpStrategy",
        "needs cpStrategy",
    ),
    "negative replicas": (_set("spec.prefill.replicas", -1), "spec.prefill.replicas", "greater than or equal to 0"),
    "profile and architecture": (
        _set("spec.model.architecture", ARCHITECTURE),
        "spec.model",
        "exactly one of model.profile",
    ),
    "neither profile nor architecture": (
        lambda body: body["spec"]["model"].pop("profile"),
        "spec.model",
        "exactly one of model.profile",
    ),
    "wrong type": (_set("spec.prefill.layout.tp", "eight"), "spec.prefill.layout.tp", "integer"),
    "a number in quotes": (_set("spec.decode.layout.tp", "8"), "spec.decode.layout.tp", "integer"),
    "a boolean in quotes": (_set("spec.prefill.prefixCaching", "true"), "spec.prefill.prefixCaching", "boolean"),
    "dcp on prefill": (_set("spec.prefill.layout.dcp", 2), "spec.prefill.layout.dcp", "prefill.layout.dcp must be 1"),
    "attnCp on decode": (
        _both(_set("spec.decode.layout.attnCp", 2), _set("spec.decode.layout.cpStrategy", "zigzag")),
        "spec.decode.layout.attnCp",
        "decode.layout.attnCp must be 1",
    ),
    "layerSplit without interleave": (
        _both(
            _set("spec.prefill.layout.attnCp", 2),
            _set("spec.prefill.layout.cpStrategy", "zigzag"),
            _set("spec.prefill.layout.layerSplit", True),
        ),
        "spec.prefill.layout.layerSplit",
        "layerSplit needs",
    ),
    "a2a backend without dcp": (
        _set("spec.decode.layout.dcpCommBackend", "a2a"),
        "spec.decode.layout.dcpCommBackend",
        "need dcp > 1",
    ),
    "replicateQProj without dcp": (
        _set("spec.decode.layout.replicateQProj", True),
        "spec.decode.layout.replicateQProj",
        "replicateQProj needs dcp > 1",
    ),
    "rdma count without a resource name": (
        _both(_set("spec.transfer.rdmaResourceCount", 8), _set("spec.transfer.rdmaResourceName", "")),
        "spec.transfer.rdmaResourceName",
        "rdmaResourceName is required",
    ),
    "rdma devices that do not split per GPU": (
        _both(
            _set("spec.transfer.ibDevices", ["mlx5_0", "mlx5_1", "mlx5_2"]), _set("spec.transfer.ibDevicesPerGpu", 2)
        ),
        "spec.transfer.ibDevices",
        "ibDevicesPerGpu splits ibDevices",
    ),
    "a draft width without the steps it drafts": (
        _set("spec.decode.speculative", {"algorithm": "EAGLE", "eagleTopk": 1, "numDraftTokens": 4}),
        "spec.decode.speculative.numSteps",
        "eagleTopk and numDraftTokens need numSteps",
    ),
    "draft steps without a draft width": (
        _set("spec.prefill.speculative", {"algorithm": "NEXTN", "numSteps": 3}),
        "spec.prefill.speculative.eagleTopk",
        "numSteps needs eagleTopk",
    ),
    "a rollout that can never roll": (
        _both(_set("spec.rollout.maxUnavailable", 0), _set("spec.rollout.maxSurge", 0)),
        "spec.rollout.maxUnavailable",
        "set maxUnavailable: 1",
    ),
    "role floors above the fleet": (
        _both(_set("spec.roleSwitch.enabled", True), _set("spec.roleSwitch.minPrefill", 4)),
        "spec.roleSwitch.minPrefill",
        "exceeds the instances of the fleet",
    ),
    "a name that starts with a digit": (
        _set("metadata.name", "1fleet"),
        "metadata.name",
        "must start with a lowercase letter",
    ),
    "a custom architecture without MLA layers": (
        _custom_architecture(mlaLayers=0),
        "spec.model.architecture.mlaLayers",
        "greater than or equal to 1",
    ),
    "more MLA layers than layers": (
        _custom_architecture(mlaLayers=62),
        "spec.model.architecture.mlaLayers",
        "set it to at most layers",
    ),
    "a DSA model without indexer layers": (
        _custom_architecture(attention="mla-dsa", indexerLayers=0, indexBytesPerTokenLayer=132),
        "spec.model.architecture.indexerLayers",
        "set indexerLayers to the layers that run the DSA indexer",
    ),
    "a label key that is not a qualified name": (
        _set("spec.podTemplate", {"metadata": {"labels": {"bad key!": "x"}}}),
        "spec.podTemplate.metadata.labels",
        "every label key must be",
    ),
    "a label value with a space": (
        _set("spec.podTemplate", {"metadata": {"labels": {"team": "ml infra"}}}),
        "spec.podTemplate.metadata.labels.team",
        LABEL_VALUE.message,
    ),
    "an annotation key that is not a qualified name": (
        _set("spec.podTemplate", {"metadata": {"annotations": {"bad key!": "x"}}}),
        "spec.podTemplate.metadata.annotations",
        "every annotation key must be",
    ),
    "a router quantity that is not a quantity": (
        _set("spec.router.resources", {"requests": {"cpu": "lots"}}),
        "spec.router.resources.requests.cpu",
        QUANTITY.message,
    ),
    "a negative router quantity": (
        _set("spec.router.resources", {"limits": {"memory": -1}}),
        "spec.router.resources.limits.memory",
        "should be greater than or equal to 0",
    ),
    "a router quantity as a fraction, not a string": (
        _set("spec.router.resources", {"requests": {"cpu": 0.5}}),
        "spec.router.resources.requests.cpu",
        "must be of type integer,string",
    ),
    "a router request above its limit": (
        _set("spec.router.resources", {"requests": {"cpu": 2, "memory": "8Gi"}, "limits": {"memory": "4096Mi"}}),
        "spec.router.resources.requests",
        "a request is more than its limit",
    ),
    "scaling bounds inverted with the scaler and role switching off": (
        _both(_set("spec.scaling.minReplicas", 5), _set("spec.scaling.maxReplicas", 4)),
        "spec.scaling.minReplicas",
        "scaling.minReplicas must not exceed scaling.maxReplicas",
    ),
    "role floors above spec.replicas though within the roles' replicas": (
        _both(_set("spec.roleSwitch.enabled", True), _set("spec.replicas", 3), _set("spec.roleSwitch.minPrefill", 2),
              _set("spec.roleSwitch.minDecode", 2)),
        "spec.roleSwitch.minPrefill",
        "exceeds the instances of the fleet",
    ),
    # A value of the wrong form: the schema's pattern says only "should match '<regex>'", the rule
    # beside it names the form, with an example (no webhook runs here).
    "a topology key that is not a label key": (
        _set("spec.network.rackKey", "rack id"),
        "spec.network.rackKey",
        LABEL_KEY.message,
    ),
    "a GPU resource in the kubernetes.io domain": (
        _set("spec.hardware.gpuResourceName", "kubernetes.io/gpu"),
        "spec.hardware.gpuResourceName",
        EXTENDED_RESOURCE.message,
    ),
    "an RDMA resource without a domain": (
        _set("spec.transfer.rdmaResourceName", "ib"),
        "spec.transfer.rdmaResourceName",
        EXTENDED_RESOURCE_OR_EMPTY.message,
    ),
    "an empty router image": (
        _set("spec.router.image", ""),
        "spec.router.image",
        ROUTER_IMAGE.message,
    ),
    "an engine image with a space after it": (
        _set("spec.engine.image", "registry.example/engine:v2 "),
        "spec.engine.image",
        ENGINE_IMAGE.message,
    ),
    "the router's metrics port as its HTTP port": (
        _set("spec.router.port", 29000),
        "spec.router.port",
        "router.port 29000 is the router's metrics port: choose another port",
    ),
    "a fleet total past the 1024 instances a fleet can number": (
        _both(_set("spec.roleSwitch.enabled", True), _set("spec.replicas", 1025)),
        "spec.replicas",
        "less than or equal to 1024",
    ),
    "weights from a scheme the operator cannot read": (
        _set("spec.model.weights", {"uri": "s3://bucket/model"}),
        "spec.model.weights.uri",
        URI.message,
    ),
    "a PVC name in capitals": (
        _set("spec.model.weights", {"uri": "pvc://Models/deepseek"}),
        "spec.model.weights.uri",
        URI.message,
    ),
    "a hub revision with a space": (
        _set("spec.model.weights", {"uri": "hf://org/model", "revision": "main branch"}),
        "spec.model.weights.revision",
        REVISION.message,
    ),
    "a hub endpoint that is no URL": (
        _set("spec.model.weights", {"uri": "hf://org/model", "endpoint": "hf-mirror.example.com"}),
        "spec.model.weights.endpoint",
        ENDPOINT.message,
    ),
    "a relative node cache path": (
        _set("spec.model.weights", {"uri": "hf://org/model", "cache": "Node", "nodeCachePath": "models"}),
        "spec.model.weights.nodeCachePath",
        HOST_PATH.message,
    ),
    "an SGLang version that is no release": (
        _set("spec.engine.sglangVersion", "latest"),
        "spec.engine.sglangVersion",
        SGLANG_VERSION.message,
    ),
    "an environment variable name with a dash": (
        _set("spec.engine.env", [{"name": "HF-HOME", "value": "/cache"}]),
        "spec.engine.env[0].name",
        ENV_VAR_NAME.message,
    ),
    "a capability given twice": (
        _set("spec.engine.capabilities", ["dsa-dcp-pd", "dsa-dcp-pd"]),
        "spec.engine.capabilities[1]",
        'Duplicate value: "dsa-dcp-pd"',
    ),
    # The apiserver's own metadata checks (apimachinery's ValidateLabels, ValidateAnnotations).
    "a fleet label value with a space": (_set("metadata.labels", {"team": "ml infra"}), "metadata.labels", "ml infra"),
    "a fleet label key with two slashes": (_set("metadata.labels", {"a/b/c": "x"}), "metadata.labels", "a/b/c"),
    "a fleet annotation key with spaces": (
        _set("metadata.annotations", {"note to self": "x"}), "metadata.annotations", "note to self"),
    "fleet annotations over 256 KiB": (
        _set("metadata.annotations", {"big": "x" * (256 * 1024)}), "metadata.annotations", "262144"),
    "pod template containers that are not a list": (
        _set("spec.podTemplate", {"spec": {"containers": 5}}),
        "spec.podTemplate.spec.containers",
        "must be of type array",
    ),
}

GOOD_FLEETS = {
    # The apiserver prunes a null field of the operator's own (none is nullable) and fills its default.
    "null where a field has a default or is optional": _both(
        _set("spec.hardware", None), _set("spec.engine", {"extraArgs": None}), _set("spec.prefill.speculative", None),
        _set("metadata.labels", None),
    ),
    "labels and annotations of every form the apiserver takes": _both(
        _set("metadata.labels", {"team": "ml-infra", "example.com/tier": "", "app.kubernetes.io/part-of": "x"}),
        _set("metadata.annotations", {"Example.COM/owner": "anyone, any text", "big": "x" * (255 * 1024)}),
    ),
    # NGRAM reads no draft width; an EAGLE draft shape given whole.
    "a whole draft shape, and NGRAM with its steps alone": _both(
        _set("spec.decode.speculative", {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1, "numDraftTokens": 4}),
        _set("spec.prefill.speculative", {"algorithm": "NGRAM", "numSteps": 3}),
    ),
    # spec.replicas, when set, is the fleet's size; the roles' replicas are only the initial shares.
    "role floors within spec.replicas though above the roles' replicas": _both(
        _set("spec.roleSwitch.enabled", True), _set("spec.replicas", 4), _set("spec.prefill.replicas", 1),
        _set("spec.decode.replicas", 1), _set("spec.roleSwitch.minPrefill", 2), _set("spec.roleSwitch.minDecode", 2),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FLEETS))
def test_bad_fleets_are_rejected_naming_the_field(objects, namespace, case):
    change, field, text = BAD_FLEETS[case]
    message, fields = rejection(lambda: create(objects, namespace, with_changes(FLEET, change)))
    assert text in message
    assert field in fields, (fields, message)


@pytest.mark.parametrize("case", sorted(BAD_FLEETS))
def test_the_cli_refuses_what_the_apiserver_refuses_naming_the_same_field(case):
    """`hybridserving validate` in a GitOps pipeline passes nothing that `kubectl apply` then refuses."""
    change, field, _ = BAD_FLEETS[case]
    try:
        hs = manifests.parse_document(with_changes(FLEET, change))
    except manifests.ManifestInvalid as refused:
        fields = [e.path for e in refused.errors]
    else:
        fields = [i.path for i in assess(hs.spec).issues if i.severity == "error"]
    assert field in fields, fields


@pytest.mark.parametrize("case", sorted(GOOD_FLEETS))
def test_what_the_apiserver_accepts_the_cli_accepts_with_the_same_spec(objects, namespace, case):
    body = with_changes(FLEET, GOOD_FLEETS[case])
    stored = create(objects, namespace, copy.deepcopy(body))
    hs = manifests.parse_document(body)
    assert not [i for i in assess(hs.spec).issues if i.severity == "error"]
    assert stored["spec"] == hs.spec.model_dump(by_alias=True, exclude_none=True, mode="json")


def test_nulls_in_a_pod_template_are_stored_as_written(objects, namespace):
    """The typed keys of a pod template keep a null as the open pod spec always has: an object stored
    with one stays readable and updatable once the CRD types the key, and the webhook and the reconcile
    see the null, to refuse it where it would replace the pod's value (api.podshape)."""
    pod = {"tolerations": None, "hostAliases": None,
           "containers": [{"name": "sidecar", "image": "registry.example/sidecar:1", "env": None}]}
    body = with_changes(FLEET, _set("spec.podTemplate", {"spec": pod}))
    assert create(objects, namespace, copy.deepcopy(body))["spec"]["podTemplate"]["spec"] == pod


def test_router_quantities_may_be_whole_numbers_as_in_a_pod(objects, namespace):
    resources = {"requests": {"cpu": 4, "memory": "2Gi"}, "limits": {"cpu": "4"}}
    body = with_changes(FLEET, _set("spec.router.resources", resources))
    assert create(objects, namespace, body)["spec"]["router"]["resources"] == resources
    assert manifests.parse_document(body).spec.router.resources.to_wire() == resources


QUANTITIES = ["0.5", "4", "1000", "1500", "2000m", "1024Mi", "1.5Gi", "0.5Gi", "1023Ki", "0.1Ki", "1e3", "1.5e3",
              "12e-1", "1E3", "3E", ".5", "1.", "+1", "0", "0.0000000001", "1000000", "100m", "1.25", "01", "+1000",
              "100u", "5Ki", "01Ki", "1.Ki", "2048Ki", "0Ki", "7e2", "1.5k", "0.1", "123456789", "1.000"]


def test_router_quantities_are_rendered_as_the_apiserver_stores_them(api, namespace):
    """A Deployment comes back with its quantities canonical; the router is rendered so, or every
    pass would read its own Deployment as drifted."""
    labels = {"app": "quantities"}
    containers = [{"name": f"c{i}", "image": "registry.example/router:1", "resources": {"requests": {"cpu": q}}}
                  for i, q in enumerate(QUANTITIES)]
    apps = client.AppsV1Api(api)
    created = apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "quantities"},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": containers}}},
    }, dry_run="All")
    stored = [c.resources.requests["cpu"] for c in created.spec.template.spec.containers]
    assert stored == [canonical_quantity(q) for q in QUANTITIES]
    # The planned router Deployment, stored, is what the plan says: no drift, no patch each pass.
    body = with_changes(FLEET, _set("spec.router.resources", {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                                                              "limits": {"cpu": 4}}))
    hs = manifests.parse_document(with_changes(body, _set("metadata.namespace", namespace)))
    [deployment] = [o for (kind, _), o in planner.plan(hs, Observed()).objects.items() if kind == "Deployment"]
    deployment["metadata"].pop("ownerReferences", None)  # its owner exists only in a cluster
    created = apps.create_namespaced_deployment(namespace, deployment, dry_run="All")
    stored = client.ApiClient().sanitize_for_serialization(created)
    assert stored["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "4"}}
    assert contains(stored, deployment)


# Requests against limits, each as `requests_vs_limits` judges it (refused or not): the apiserver's
# own validation of a Deployment's pod template is the authority it mirrors.
REQUESTS_AND_LIMITS = [
    ({"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}}, True),
    ({"requests": {"memory": "1025Mi"}, "limits": {"memory": "1Gi"}}, True),
    ({"requests": {"memory": "1024Mi"}, "limits": {"memory": "1Gi"}}, False),
    ({"requests": {"cpu": "1500m"}, "limits": {"cpu": 2}}, False),
    ({"requests": {"cpu": "0.5"}, "limits": {"cpu": "500m"}}, False),
    ({"requests": {"cpu": "0.0001"}, "limits": {"cpu": "1m"}}, False),
    ({"requests": {"cpu": "2001m"}, "limits": {"cpu": "2"}}, True),
    ({"requests": {"ephemeral-storage": "2Gi"}, "limits": {"ephemeral-storage": "1Gi"}}, True),
    ({"requests": {"example.com/fpga": 1}}, True),
    ({"requests": {"example.com/fpga": 1}, "limits": {"example.com/fpga": 2}}, True),
    ({"requests": {"example.com/fpga": "1"}, "limits": {"example.com/fpga": 1}}, False),
    ({"limits": {"example.com/fpga": 1}}, False),
    ({"requests": {"hugepages-2Mi": "2Mi", "memory": "1Gi"}, "limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}},
     True),
    ({"requests": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}, "limits": {"hugepages-2Mi": "4Mi", "memory": "2Gi"}},
     False),
]


def test_requests_against_limits_are_judged_as_the_apiserver_judges_them(api, namespace):
    apps = client.AppsV1Api(api)
    labels = {"app": "limits"}
    for resources, refused in REQUESTS_AND_LIMITS:
        # The client's models take quantities as strings only.
        written = {section: {k: str(v) for k, v in amounts.items()} for section, amounts in resources.items()}
        deployment = {"metadata": {"name": "limits"}, "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "image": "registry.example/c:1", "resources": written}]}}}}
        try:
            apps.create_namespaced_deployment(namespace, deployment, dry_run="All")
        except ApiException as exc:
            assert exc.status == 422, exc.body
            apiserver_refused = True
        else:
            apiserver_refused = False
        assert apiserver_refused == refused, resources
        assert bool(requests_vs_limits(resources)) == refused, resources


def test_unknown_fields_are_refused_not_silently_dropped(objects, namespace):
    # kubectl asks for strict field validation; a typo must not quietly fall back to a default.
    with pytest.raises(ApiException) as info:
        create(objects, namespace, with_changes(FLEET, _set("spec.prefill.replicaz", 2)))
    assert info.value.status == 400
    assert 'unknown field "spec.prefill.replicaz"' in json.loads(info.value.body)["message"]


def test_an_instance_config_hash_of_the_wrong_form_says_which_form(objects, namespace):
    body = with_changes(INSTANCE, _set("spec.configHash", "5F3A9C"))
    message, fields = rejection(lambda: create(objects, namespace, body))
    assert CONFIG_HASH.message in message and "spec.configHash" in fields


def test_instance_ports_must_be_distinct(objects, namespace):
    body = with_changes(INSTANCE, _set("spec.ports.distInit", 30000))
    message, fields = rejection(lambda: create(objects, namespace, body))
    assert "five distinct ports" in message and "spec.ports" in fields


def test_instance_identity_is_immutable_and_restarts_only_move_forward(objects, namespace):
    body = with_changes(INSTANCE, lambda b: None)
    name = body["metadata"]["name"]
    create(objects, namespace, body, dry_run=False)

    def patch(spec: dict[str, Any]) -> dict[str, Any]:
        return objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, INSTANCE_PLURAL, name, {"spec": spec}, dry_run="All"
        )

    assert patch({"role": "prefill", "restartGeneration": 1})["spec"]["role"] == "prefill"
    message, fields = rejection(lambda: patch({"index": 1}))
    assert "index is immutable" in message and "spec.index" in fields
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, INSTANCE_PLURAL, name, {"spec": {"restartGeneration": 2}}
    )
    message, fields = rejection(lambda: patch({"restartGeneration": 1}))
    assert "may only increase" in message and "spec.restartGeneration" in fields


def test_status_writes_keep_every_field_and_feed_the_printer_columns(kubectl, objects, namespace):
    body = with_changes(FLEET, lambda b: None)
    name = body["metadata"]["name"]
    created = create(objects, namespace, body, dry_run=False)
    status = HybridServingStatus(
        observed_generation=created["metadata"]["generation"],
        prefill=RoleStatus(desired=2, ready=2, updated=2, summary="2/2"),
        decode=RoleStatus(desired=2, ready=1, updated=2, summary="1/2"),
        capacity=CapacityStatus(decode_tokens_total=1_900_000, summary="1.9M tokens"),
        ready="False",
    )
    written = objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status.to_wire()}
    )
    assert HybridServingStatus.model_validate(written["status"]) == status
    assert written["metadata"]["generation"] == created["metadata"]["generation"], "status must not bump generation"

    # What `kubectl get` prints is the apiserver's Table rendering of the printer columns.
    shown_wide = kubectl("get", f"{PLURAL}.{GROUP}", name, "-n", namespace, "-o", "wide").stdout.splitlines()
    header, row = (re.split(r"\s{2,}", line.strip()) for line in shown_wide[:2])
    cells = dict(zip([h.title() if h != "KV CAPACITY" else "KV Capacity" for h in header], row, strict=False))
    shown = (cells["Ready"], cells["Prefill"], cells["Decode"], cells["KV Capacity"])
    assert shown == ("False", "2/2", "1/2", "1.9M tokens")
    assert cells["Profile"] == "deepseek-v3"


def test_instance_status_round_trips(objects, namespace):
    body = with_changes(INSTANCE, lambda b: None)
    name = body["metadata"]["name"]
    create(objects, namespace, body, dry_run=False)
    status = HybridServingInstanceStatus.model_validate(
        {
            "phase": "Ready",
            "role": "decode",
            "readyPods": 2,
            "podNames": [f"{name}-0", f"{name}-1"],
            "nodeNames": ["gpu-0", "gpu-1"],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "EngineReady",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "lastSwitch": "2026-01-01T00:00:00Z",
        }
    )
    written = objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, INSTANCE_PLURAL, name, {"status": status.to_wire()}
    )
    assert HybridServingInstanceStatus.model_validate(written["status"]) == status


def test_a_fleet_name_too_long_for_its_children_is_refused_at_admission(objects, namespace):
    body = with_changes(FLEET, lambda b: None)
    body["metadata"]["name"] = "f" * 41
    message, fields = rejection(lambda: create(objects, namespace, body))
    assert "have at most 40 characters" in message and "metadata.name" in fields
    body["metadata"]["name"] = "f" * 40
    assert create(objects, namespace, body)["metadata"]["name"] == "f" * 40


def test_conditions_follow_metav1_condition(objects, namespace):
    """lastTransitionTime is required and a date-time; reason is a CamelCase word."""
    body = with_changes(FLEET, lambda b: None)
    name = body["metadata"]["name"]
    create(objects, namespace, body, dry_run=False)

    def write(condition: dict[str, Any]) -> Any:
        return objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": {"conditions": [condition]}}
        )

    good = {
        "type": "Ready",
        "status": "False",
        "reason": "InstancesNotReady",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    assert write(good)["status"]["conditions"][0]["reason"] == "InstancesNotReady"
    for change, field, text in (
        ({"lastTransitionTime": None}, "lastTransitionTime", "Required value"),
        ({"lastTransitionTime": "yesterday"}, "lastTransitionTime", "date-time"),
        ({"reason": "not ready"}, "reason", CONDITION_REASON.message),
        ({"reason": ""}, "reason", "at least 1 chars long"),
    ):
        bad = {k: v for k, v in {**good, **change}.items() if v is not None}
        message, fields = rejection(functools.partial(write, bad))
        assert any(f.endswith(field) for f in fields) and text in message, (fields, message)


def test_crd_files_are_what_the_generator_renders():
    # The apiserver tests above ran on the committed files; they must be the generated ones.
    assert crdgen.check_all([REPO / "crds"]) == []
