"""The webhook's decision: the same issues as `hybridserving validate`, never a blocked delete."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from hybridserving.controller import admission

ROOT = Path(__file__).resolve().parents[2]


def body(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def test_a_bad_layout_is_refused_with_the_field_and_the_fix_of_validate() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(body("invalid/kda-zigzag.yaml"), None, "CREATE", [])
    assert "spec.prefill.layout.cpStrategy" in str(refused.value) and "Fix: remove attnCp" in str(refused.value)
    assert refused.value.code == 422


def test_owned_pod_fields_are_refused_and_warnings_come_back() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(body("invalid/pod-template-owned-gpus.yaml"), None, "CREATE", [])
    assert "spec.decode.podTemplate.spec.containers[engine].resources.limits[nvidia.com/gpu]" in str(refused.value)
    warnings: list[str] = []
    doc = body("role-switch.yaml")
    doc["spec"]["prefill"]["podTemplate"] = {"spec": {"tolerations": [{"operator": "Exists"}]}}
    admission.review(doc, None, "CREATE", warnings)
    assert any(w.startswith("spec.prefill.podTemplate: prefill and decode pod templates differ") for w in warnings)


def test_capacity_is_checked_at_admission_too() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(body("invalid/weights-do-not-fit.yaml"), None, "CREATE", [])
    assert "spec.decode.layout.tp" in str(refused.value) and "weights" in str(refused.value)


def test_malformed_input_is_refused_naming_the_field() -> None:
    doc = body("role-switch.yaml")
    doc["spec"]["model"]["weights"] = {"uri": "s3://bucket/model"}
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(doc, None, "CREATE", [])
    assert "spec.model.weights.uri" in str(refused.value)


def refusal(doc: dict[str, Any]) -> str:
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.review(doc, None, "CREATE", [])
    return str(refused.value)


@pytest.mark.parametrize("name", ["1abc", "9x", "a.b"])
def test_a_name_services_cannot_take_is_refused_naming_metadata_name(name: str) -> None:
    doc = body("role-switch.yaml")
    doc["metadata"]["name"] = name
    assert refusal(doc).startswith("metadata.name: ") and "must start with a lowercase letter" in refusal(doc)


def test_a_custom_architecture_without_mla_layers_is_refused_before_it_is_planned() -> None:
    doc = body("role-switch.yaml")
    doc["spec"]["model"] = {"path": "x", "architecture": {
        "hfArchitecture": "DeepseekV3ForCausalLM", "attention": "mla", "layers": 61, "mlaLayers": 0,
        "kvBytesPerTokenLayer": 576, "weightBytes": 700 * 10**9, "attentionHeads": 128}}
    assert "spec.model.architecture.mlaLayers" in refusal(doc)
    doc["spec"]["model"]["architecture"]["mlaLayers"] = 62
    assert "spec.model.architecture.mlaLayers: mlaLayers (62) counts some of the model's layers" in refusal(doc)


@pytest.mark.parametrize("template, field, text", [
    ({"metadata": {"labels": {"team": "ml infra"}}}, "spec.podTemplate.metadata.labels.team",
     "'ml infra' must be a label value"),
    ({"metadata": {"labels": {"bad key!": "x"}}}, "spec.podTemplate.metadata.labels", "label key 'bad key!'"),
    ({"metadata": {"annotations": {"bad key!": "x"}}}, "spec.podTemplate.metadata.annotations",
     "annotation key 'bad key!'"),
    ({"spec": {"containers": [{"name": "engine", "resources": {"limits": {"cpu": "lots"}}}]}},
     "spec.podTemplate.spec", "containers[engine].resources.limits[cpu]: 'lots' must be a Kubernetes quantity"),
    ({"spec": {"x": functools.reduce(lambda inner, _: {"a": inner}, range(40), {})}}, "spec.podTemplate.spec",
     "nested more than 32 levels"),
    # pkg/apis/core/validation/validation.go:7439-7450 (a container's), 7457-7468 (the pod's own).
    ({"spec": {"containers": [{"name": "engine", "resources": {"requests": {"cpus": "8"}}}]}},
     "spec.podTemplate.spec", "containers[engine].resources.requests[cpus]: resource 'cpus' is no standard "
     "resource for containers: name cpu, memory, ephemeral-storage, hugepages-<size>, or an extended resource"),
    ({"spec": {"containers": [{"name": "engine", "resources": {"limits": {"requests.example.com/x": 1}}}]}},
     "spec.podTemplate.spec", "limits[requests.example.com/x]: resource 'requests.example.com/x' must be a DNS"),
    ({"spec": {"resources": {"limits": {"nvidia.com/gpu": 8}}}},
     "spec.podTemplate.spec", "resources.limits[nvidia.com/gpu]: resource 'nvidia.com/gpu' cannot be set for "
     "the whole pod: name cpu, memory or hugepages-<size>"),
])
def test_pod_metadata_and_quantities_the_apiserver_would_refuse_are_refused_at_admission(
    template: dict[str, Any], field: str, text: str
) -> None:
    """The rollout deletes a pod before it creates its successor: one the apiserver refuses loses an instance."""
    doc = body("role-switch.yaml")
    doc["spec"]["podTemplate"] = template
    message = refusal(doc)
    assert message.startswith(f"{field}: ") and text in message


@pytest.mark.parametrize("resources, text", [
    ({"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}},
     "requests[memory]: 8Gi is more than the limit 4Gi; lower the request or raise the limit"),
    ({"requests": {"cpu": "1025m"}, "limits": {"cpu": 1}}, "requests[cpu]: 1025m is more than the limit 1"),
    ({"requests": {"example.com/fpga": 1}, "limits": {"example.com/fpga": 2}},
     "requests[example.com/fpga]: 1 must equal the limit 2: example.com/fpga cannot be overcommitted"),
    ({"requests": {"example.com/fpga": 1}},
     "requests[example.com/fpga]: example.com/fpga cannot be overcommitted, so it needs a limit; set its limit to 1"),
])
def test_a_router_request_the_apiserver_would_refuse_against_its_limit_is_refused(
    resources: dict[str, Any], text: str
) -> None:
    """The apiserver refuses such a Deployment: the fleet would run with no router at all."""
    doc = body("role-switch.yaml")
    doc["spec"]["router"] = {"resources": resources}
    message = refusal(doc)
    assert message.startswith("spec.router.resources.requests: ") and text in message


@pytest.mark.parametrize("container, field, text", [
    ({"name": "engine", "resources": {"requests": {"memory": "600Gi"}, "limits": {"memory": "512Gi"}}},
     "containers[engine].resources.requests[memory]", "600Gi is more than the limit 512Gi"),
    ({"name": "proxy", "image": "registry.example/proxy:1", "resources": {"requests": {"hugepages-2Mi": "4Mi"},
                                                                          "limits": {"hugepages-2Mi": "8Mi"}}},
     "containers[proxy].resources.requests[hugepages-2Mi]", "4Mi must equal the limit 8Mi"),
    ({"name": "engine", "resources": {"requests": {"example.com/fpga": 1}}},
     "containers[engine].resources.requests[example.com/fpga]", "needs a limit. Fix: set its limit to 1"),
])
def test_a_pod_template_request_above_its_limit_is_refused(container: dict[str, Any], field: str, text: str) -> None:
    """A pod the apiserver refuses is an instance the rollout deleted and cannot bring back."""
    doc = body("role-switch.yaml")
    doc["spec"]["podTemplate"] = {"spec": {"containers": [container]}}
    message = refusal(doc)
    assert message.startswith(f"spec.podTemplate.spec.{field}: ") and text in message


def test_the_engines_gpu_request_is_refused_as_the_operators_not_for_its_missing_limit() -> None:
    doc = body("role-switch.yaml")
    doc["spec"]["podTemplate"] = {"spec": {"containers": [
        {"name": "engine", "resources": {"requests": {"nvidia.com/gpu": 1}}}]}}
    message = refusal(doc)
    assert "nvidia.com/gpu is set by the operator" in message and "needs a limit" not in message


def test_requests_equal_to_their_limits_in_another_spelling_pass() -> None:
    doc = body("role-switch.yaml")
    doc["spec"]["router"] = {"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi", "example.com/fpga": "1"},
                                           "limits": {"cpu": "500m", "memory": "1Gi", "example.com/fpga": 1}}}
    doc["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "engine", "resources": {
        "requests": {"cpu": "0.0001", "memory": "1e9"}, "limits": {"cpu": "1m", "memory": "1G"}}}]}}
    admission.review(doc, None, "CREATE", [])


def test_kubernetes_labels_annotations_and_quantities_pass() -> None:
    doc = body("role-switch.yaml")
    doc["spec"]["podTemplate"] = {
        "metadata": {"labels": {"example.com/team": "ml-infra", "tier": ""},
                     "annotations": {"Example.com/Note": "any text at all"}},
        "spec": {"containers": [{"name": "engine", "resources": {"requests": {"cpu": 2, "memory": "512Gi"},
                                                                 "limits": {"cpu": "2.5", "memory": "1e12"}}}]},
    }
    doc["spec"]["router"] = {"resources": {"requests": {"cpu": "500m"}}}
    admission.review(doc, None, "CREATE", [])
    doc["spec"]["router"] = {"resources": {"requests": {"cpu": "lots"}}}
    assert refusal(doc).startswith("spec.router.resources.requests.cpu: 'lots' must be a Kubernetes quantity")
    doc["spec"]["router"] = {"resources": {"requests": {"cpus": "1"}}}
    assert refusal(doc).startswith("spec.router.resources.requests.cpus: resource 'cpus' is no standard resource")


@pytest.mark.parametrize("image", ["registry.example/engine:v2 ", " registry.example/engine:v2", ""])
def test_an_engine_image_the_apiserver_would_refuse_is_refused_at_admission(image: str) -> None:
    """pkg/apis/core/validation/validation.go:4436 (no whitespace around it) and an empty one: every
    engine pod the rollout recreates would be refused after its predecessor was deleted."""
    doc = body("role-switch.yaml")
    doc["spec"]["engine"] = {"image": image}
    message = refusal(doc)
    assert message.startswith("spec.engine.image: ") and "must be an image reference" in message, message


def test_the_routers_metrics_port_is_refused_as_its_http_port() -> None:
    """The router Service would carry two ports numbered 29000, which the apiserver refuses, and smg
    would bind its HTTP and metrics listeners to one port."""
    doc = body("role-switch.yaml")
    doc["spec"]["router"] = {"port": 29000}
    assert refusal(doc).startswith("spec.router.port: router.port 29000 is the router's metrics port: choose another")


@pytest.mark.parametrize("spec, field, text", [
    ({"prefill": {"replicas": 513}, "decode": {"replicas": 512}}, "spec.prefill.replicas",
     "the fleet may hold 1025 instances, more than the 1024 one fleet can number"),
    ({"prefill": {"replicas": 512}, "decode": {"replicas": 511}, "rollout": {"maxSurge": 1}}, "spec.rollout.maxSurge",
     "1023 instances plus 2 surge instances while both roles roll (maxSurge 1 each)"),
    ({"replicas": 1025}, "spec.replicas", "less than or equal to 1024"),
])
def test_a_fleet_larger_than_its_instance_indices_is_refused_before_it_cannot_be_planned(
    spec: dict[str, Any], field: str, text: str
) -> None:
    doc = body("role-switch.yaml")
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    message = refusal(doc)
    assert message.startswith(f"{field}: ") and text in message, message


@pytest.mark.parametrize("section, field, value, fix", [
    ("network", "rackKey", "rack id", "must be a label key: an optional DNS subdomain prefix"),
    ("network", "nvlinkDomainKey", "", "must be a label key: an optional DNS subdomain prefix"),
    ("network", "rdmaFabricKey", "Example.com/fabric", "must be a label key: an optional DNS subdomain prefix"),
    ("hardware", "gpuResourceName", "gpu", "e.g. nvidia.com/gpu"),
    ("hardware", "gpuResourceName", "kubernetes.io/gpu", "not ending in kubernetes.io"),
    ("transfer", "rdmaResourceName", "requests.rdma/ib", "nor starting with 'requests.'"),
    ("router", "image", "", "must be an image reference: a name without spaces"),
])
def test_names_that_pods_could_not_carry_are_refused_naming_the_field_and_the_fix(
    section: str, field: str, value: str, fix: str
) -> None:
    doc = body("role-switch.yaml")
    doc["spec"][section] = {**doc["spec"].get(section, {}), field: value}
    message = refusal(doc)
    assert message.startswith(f"spec.{section}.{field}: {value!r} must be "), message
    assert fix in message


def test_the_default_names_and_kubernetes_own_topology_labels_pass() -> None:
    doc = body("role-switch.yaml")
    admission.review(doc, None, "CREATE", [])
    doc["spec"]["network"] = {"rackKey": "topology.kubernetes.io/zone", "nvlinkDomainKey": "nvidia.com/gpu.clique"}
    doc["spec"]["hardware"] = {**doc["spec"].get("hardware", {}), "gpuResourceName": "amd.com/gpu"}
    doc["spec"]["transfer"] = {**doc["spec"].get("transfer", {}), "rdmaResourceName": ""}
    admission.review(doc, None, "CREATE", [])


def test_updates_that_keep_the_spec_and_objects_being_deleted_always_pass() -> None:
    bad = body("invalid/dcp-not-dividing-tp.yaml")
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "x"}
    admission.review(relabelled, bad, "UPDATE", [])
    deleting = copy.deepcopy(bad)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["spec"]["decode"]["replicas"] = 0
    admission.review(deleting, bad, "UPDATE", [])
    changed = copy.deepcopy(bad)
    changed["spec"]["decode"]["replicas"] = 3
    with pytest.raises(kopf.AdmissionError):
        admission.review(changed, bad, "UPDATE", [])


def test_an_update_that_rolls_every_engine_unexpectedly_is_admitted_with_a_warning_saying_so() -> None:
    old = body("role-switch.yaml")
    new = copy.deepcopy(old)
    new["spec"]["roleSwitch"]["drainTimeoutSeconds"] = 900
    warnings: list[str] = []
    admission.review(new, old, "UPDATE", warnings)
    assert any(w.startswith("spec.roleSwitch.drainTimeoutSeconds: 300 → 900 rolls every instance") and
               "Fix: change it together with a change that rolls anyway" in w for w in warnings), warnings
    created: list[str] = []
    admission.review(new, None, "CREATE", created)
    assert not any("rolls every instance" in w for w in created), "a new fleet has nothing to roll"
    unreadable = copy.deepcopy(old)
    unreadable["spec"]["decode"]["layout"]["tp"] = "eight"  # admitted by an older version: nothing to compare
    admission.review(new, unreadable, "UPDATE", [])


def test_the_operator_only_serves_and_writes_no_webhook_configuration() -> None:
    # kopf's managed mode would create and patch a ValidatingWebhookConfiguration and a
    # MutatingWebhookConfiguration, with permissions the chart does not grant: the chart owns the
    # configuration (templates/webhook.yaml).
    settings = kopf.OperatorSettings()
    admission.configure(settings, addr="0.0.0.0", port=9443, certfile="/certs/tls.crt", keyfile="/certs/tls.key")
    assert settings.admission.managed is None
    server = settings.admission.server
    assert isinstance(server, kopf.WebhookServer)
    assert (server.addr, server.port, server.certfile, server.pkeyfile) == (
        "0.0.0.0", 9443, "/certs/tls.crt", "/certs/tls.key")


def test_fields_a_newer_crd_defaults_are_dropped_from_cluster_objects_and_refused_in_files() -> None:
    """CRDs applied ahead of the operator (or an operator rolled back under them) give every
    fleet the newer fields' defaults; the apiserver has pruned anything its CRD does not know."""
    from pydantic import ValidationError

    from hybridserving.api.v1alpha1 import HybridServingSpec
    from hybridserving.controller.reconcile import validate
    from hybridserving.core.observed import ObservedInstance
    from hybridserving.manifests import ManifestInvalid, load_text

    doc = body("role-switch.yaml")
    doc["spec"]["rollout"] = {**doc["spec"].get("rollout", {}), "futureKnob": 3}
    doc["spec"]["futureField"] = {"enabled": True}
    warnings: list[str] = []
    admission.review(doc, None, "CREATE", warnings)
    admission.review(doc, body("role-switch.yaml"), "UPDATE", warnings)
    hs, validation = validate(doc)
    assert hs is not None and validation.valid and "futureField" not in hs.spec.to_wire()
    instance = {"metadata": {"name": "i"}, "spec": {
        "role": "decode", "index": 0, "nodes": 1, "configHash": "5f3a9c", "futureField": 1,
        "ports": {"http": 30000, "bootstrap": 8998, "distInit": 20000, "engineInfoBootstrap": 6789, "future": 1}}}
    assert ObservedInstance.from_manifest(instance).spec.role == "decode"
    with pytest.raises(ValidationError, match="futureField"):
        HybridServingSpec.model_validate(doc["spec"])  # a file's typo is still an error
    with pytest.raises(ManifestInvalid, match="futureField"):
        load_text(yaml.safe_dump(doc), "fleet.yaml")
