"""A fleet's pod templates, weights and Secret references are held to the chart's `enginePolicy`:
nothing they add to the engine pods gives more of the node, of the Kubernetes API or of the
operator's own Secrets than the platform team granted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hybridserving.api.v1alpha1 import HybridServing
from hybridserving.controller.reconcile import validate
from hybridserving.core import fleet as core_fleet
from hybridserving.core import planner, rendering
from hybridserving.core.layout import LayoutIssue
from hybridserving.core.observed import Observed
from hybridserving.core.privileges import EnginePolicy, check, with_default_image
from hybridserving.core.upgrade import GRANTS_UNKNOWN

MIRROR = EnginePolicy(allowed_images=("registry.ok/",), default_image="registry.ok/engine:1",
                      default_router_image="registry.ok/smg:1")
SPEC: dict[str, Any] = {
    "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
    "prefill": {"replicas": 1, "layout": {"tp": 8}},
    "decode": {"replicas": 1, "layout": {"tp": 8}},
}
HOSTILE_TEMPLATE: dict[str, Any] = {"spec": {
    "hostPID": True,
    "hostIPC": True,
    "hostNetwork": True,
    "serviceAccountName": "some-admin",
    "automountServiceAccountToken": True,
    "securityContext": {"runAsUser": 0},
    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    "containers": [{
        "name": "debug", "image": "evil.example/any:latest",
        "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
    }],
}}
AT = "spec.prefill.podTemplate.spec"


def body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServing",
            "metadata": {"name": "hs", "namespace": "ns", "uid": "hs-uid", "generation": 1},
            "spec": {**copy.deepcopy(SPEC), **copy.deepcopy(spec)}}


def hs(**spec: Any) -> HybridServing:
    return HybridServing.model_validate(body(**spec))


def errors(policy: EnginePolicy, **spec: Any) -> dict[str, LayoutIssue]:
    found = [i for i in check(with_default_image(hs(**spec), policy).spec, policy) if i.severity == "error"]
    by_path = {i.path: i for i in found}
    assert len(by_path) == len(found), "one error per field"
    return by_path


def template(pod: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"prefill": {**SPEC["prefill"], "podTemplate": {"spec": pod, **metadata}}}


def test_a_template_gets_none_of_what_the_chart_did_not_grant_and_every_refusal_names_its_field_and_fix() -> None:
    """Before, only the template's hostNetwork was refused (an owned field): the pod was rendered
    with the host's processes, a hostPath of /, root, an admin's token and a privileged sidecar
    from anywhere."""
    _, validation = validate(body(prefill={**SPEC["prefill"], "podTemplate": HOSTILE_TEMPLATE}), MIRROR)
    found = {i.path: i for i in validation.errors}
    assert set(found) == {
        f"{AT}.hostNetwork",  # the operator's (spec.network.hostNetwork), as before
        f"{AT}.hostPID",
        f"{AT}.hostIPC",
        f"{AT}.serviceAccountName",
        f"{AT}.automountServiceAccountToken",
        f"{AT}.securityContext.runAsUser",
        f"{AT}.volumes[host].hostPath",
        f"{AT}.containers[debug].image",
        f"{AT}.containers[debug].securityContext.privileged",
        f"{AT}.containers[debug].securityContext.capabilities.add",
    }
    assert "enginePolicy.allowServiceAccount" in found[f"{AT}.serviceAccountName"].fix
    assert "enginePolicy.allowedImages" in found[f"{AT}.containers[debug].image"].fix
    assert "SYS_ADMIN" in found[f"{AT}.containers[debug].securityContext.capabilities.add"].message
    assert "allowIpcLock" not in found[f"{AT}.containers[debug].securityContext.capabilities.add"].fix
    assert "persistentVolumeClaim" in found[f"{AT}.volumes[host].hostPath"].fix
    assert all(i.fix and i.message for i in found.values())
    assert not validation.valid


def test_what_a_template_may_add_passes_and_grants_open_what_they_name() -> None:
    sidecar = {"name": "proxy", "image": "registry.ok/proxy:2", "ports": [{"containerPort": 9000}],
               "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                   "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}
    ordinary = template({"tolerations": [{"operator": "Exists"}], "containers": [sidecar],
                         "initContainers": [{"name": "warm", "image": "registry.ok/warm:1"}],
                         "securityContext": {"runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                         "volumes": [{"name": "scratch", "emptyDir": {}}]})
    assert errors(MIRROR, **ordinary) == {}
    account = template({"serviceAccountName": "reader", "automountServiceAccountToken": True,
                        "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {
                            "path": "token"}}]}}]})
    assert set(errors(MIRROR, **account)) == {f"{AT}.serviceAccountName", f"{AT}.automountServiceAccountToken",
                                              f"{AT}.volumes[token].projected.sources[0].serviceAccountToken"}
    assert errors(EnginePolicy(allow_service_account=True), **account) == {}
    pinning = template({"containers": [{"name": "agent", "image": "registry.ok/a:1",
                                        "securityContext": {"capabilities": {"add": ["cap_ipc_lock"]}}}]})
    refused = errors(MIRROR, **pinning)[f"{AT}.containers[agent].securityContext.capabilities.add"]
    assert "enginePolicy.allowIpcLock: true" in refused.fix, "the grant that would allow it"
    assert errors(EnginePolicy(allow_ipc_lock=True), **pinning) == {}


@pytest.mark.parametrize(("pod", "path"), [
    ({"securityContext": {"runAsNonRoot": False}}, "securityContext.runAsNonRoot"),
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "securityContext.seccompProfile.type"),
    ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "securityContext.seLinuxOptions"),
    ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, "securityContext.windowsOptions.hostProcess"),
    ({"containers": [{"name": "s", "image": "i", "securityContext": {"allowPrivilegeEscalation": True}}]},
     "containers[s].securityContext.allowPrivilegeEscalation"),
    ({"containers": [{"name": "s", "image": "i", "securityContext": {"runAsUser": 0}}]},
     "containers[s].securityContext.runAsUser"),
    ({"containers": [{"name": "s", "image": "i", "securityContext": {"procMount": "Unmasked"}}]},
     "containers[s].securityContext.procMount"),
    ({"containers": [{"name": "s", "image": "i", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]},
     "containers[s].securityContext.appArmorProfile.type"),
    ({"initContainers": [{"name": "s", "image": "i", "securityContext": {"privileged": True}}]},
     "initContainers[s].securityContext.privileged"),
    ({"containers": [{"name": "s", "image": "i", "ports": [{"containerPort": 80, "hostPort": 80}]}]},
     "containers[s].ports[0].hostPort"),
])
def test_each_security_setting_a_template_may_not_lift_is_refused_at_its_field(pod: dict[str, Any],
                                                                                path: str) -> None:
    found = errors(EnginePolicy(), **template(pod))
    assert list(found) == [f"{AT}.{path}"]


def test_an_unconfined_apparmor_annotation_is_refused_like_the_field() -> None:
    key = "container.apparmor.security.beta.kubernetes.io/engine"
    found = errors(EnginePolicy(), **template({}, metadata={"annotations": {key: "unconfined"}}))
    assert list(found) == [f"spec.prefill.podTemplate.metadata.annotations[{key}]"]


def test_host_ports_are_for_granted_host_network_fleets_only() -> None:
    pod = template({"containers": [{"name": "s", "image": "i", "ports": [{"containerPort": 9, "hostPort": 9}]}]})
    granted = EnginePolicy(allow_host_network=True, allow_ipc_lock=True)
    assert f"{AT}.containers[s].ports[0].hostPort" in errors(granted, **pod)
    assert errors(granted, network={"hostNetwork": True}, **pod) == {}


def test_sidecar_and_init_container_images_are_held_to_the_allow_list() -> None:
    pod = template({"containers": [{"name": "ok", "image": "registry.ok/a:1"}, {"name": "bad", "image": "x/y:1"}],
                    "initContainers": [{"name": "init", "image": "docker.io/busybox"}]})
    assert set(errors(MIRROR, **pod)) == {f"{AT}.containers[bad].image", f"{AT}.initContainers[init].image"}
    assert errors(EnginePolicy(), **pod) == {}, "an empty allow-list allows any image"


def test_values_of_the_wrong_type_outside_the_shape_table_are_judged_without_failing() -> None:
    pod = template({"hostPID": "yes", "volumes": [{"name": "v", "projected": 5}],
                    "containers": [{"name": "s", "image": "i", "env": [{"name": "A", "valueFrom": "x"}],
                                    "securityContext": {"capabilities": "ALL", "seLinuxOptions": None}},
                                   {"name": "t", "image": "i", "securityContext": {"seLinuxOptions": {"type": [1]}}}]})
    assert list(errors(EnginePolicy(operator_secrets=("k",)), **pod)) == [
        f"{AT}.hostPID", f"{AT}.containers[t].securityContext.seLinuxOptions"]


# --------------------------------------------------------------------------- weights

NODE_CACHE = {"uri": "hf://deepseek-ai/DeepSeek-V3", "cache": "Node"}


def node_cache(**weights: Any) -> dict[str, Any]:
    return {"model": {**SPEC["model"], "weights": {**NODE_CACHE, **weights}}}


def test_a_node_cache_needs_the_grant_and_a_directory_the_chart_allows() -> None:
    refused = errors(EnginePolicy(), **node_cache())
    assert list(refused) == ["spec.model.weights.cache"]
    assert "enginePolicy.allowNodeCache" in refused["spec.model.weights.cache"].fix
    granted = EnginePolicy(allow_node_cache=True)
    assert errors(granted, **node_cache()) == {}, "the default nodeCachePath is in the default directory"
    for path in ("/etc", "/var/lib/hybridservingx/m", "/var/lib/hybridserving/../../../etc", "/"):
        found = errors(granted, **node_cache(nodeCachePath=path))
        assert list(found) == ["spec.model.weights.nodeCachePath"], path
        assert "enginePolicy.allowedNodeCachePaths: /var/lib/hybridserving" in found[
            "spec.model.weights.nodeCachePath"].message
    assert errors(granted, **node_cache(nodeCachePath="/var/lib/hybridserving")) == {}
    assert errors(granted, **node_cache(nodeCachePath="//var/lib/./hybridserving/m")) == {}
    anywhere = EnginePolicy(allow_node_cache=True, allowed_node_cache_paths=("/",))
    assert errors(anywhere, **node_cache(nodeCachePath="/mnt/nvme")) == {}
    assert errors(GRANTS_UNKNOWN, **node_cache(nodeCachePath="/mnt/nvme")) == {}, "upgrade-check assumes grants"


def test_no_template_container_mounts_the_node_cache_every_fleet_on_the_node_shares() -> None:
    mount = {"name": "weights", "mountPath": "/all"}
    pod = {"containers": [{"name": "engine", "volumeMounts": [mount]},
                          {"name": "s", "image": "i", "volumeMounts": [mount]}]}
    spec = {**node_cache(), **template(pod)}
    granted = EnginePolicy(allow_node_cache=True)
    assert set(errors(granted, **spec)) == {f"{AT}.containers[engine].volumeMounts[weights]",
                                            f"{AT}.containers[s].volumeMounts[weights]"}
    assert errors(granted, **template(pod)) == {}, "without a node cache there is no such volume to reach"


def test_the_fill_step_runs_restricted_without_a_capability_even_beside_rdma() -> None:
    """Before, the init container had no security context: it ran with the runtime's default
    capabilities, privilege escalation allowed, on a host directory."""
    for extra in ({}, {"transfer": {"rdmaResourceCount": 1, "rdmaResourceName": "rdma/hca"}}):
        fleet = hs(**node_cache(), **extra)
        inst = next(iter(planner.plan(fleet, Observed()).instances.values()))
        pod = rendering.pod_spec(fleet, inst.name, 0, inst.role, inst.ports)
        (fill,) = pod["initContainers"]
        assert fill["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                           "capabilities": {"drop": ["ALL"]}}


# --------------------------------------------------------------------------- the operator's Secrets

OPERATOR = EnginePolicy(operator_secrets=("hs-operator-key", "hs-webhook-tls"))


def test_the_operator_key_never_becomes_a_hub_token() -> None:
    """Before, the fill step sent the operator's key as a Bearer token to the fleet's endpoint."""
    spec = {"model": {**SPEC["model"], "weights": {"uri": "hf://org/m", "endpoint": "https://evil.example",
                                                   "tokenSecretRef": {"name": "hs-operator-key",
                                                                      "key": "operator-key"}}}}
    found = errors(OPERATOR, **spec)
    assert list(found) == ["spec.model.weights.tokenSecretRef.name"]
    assert found["spec.model.weights.tokenSecretRef.name"].rule == "operator-secret-reference"
    assert "hs-operator-key" in found["spec.model.weights.tokenSecretRef.name"].message
    assert errors(EnginePolicy(), **spec) == {}, "an operator that knows no Secret of its own refuses none"


def test_no_reference_of_a_fleet_reaches_the_operators_secrets() -> None:
    key = {"name": "hs-operator-key", "key": "operator-key"}
    pod = {"containers": [{"name": "s", "image": "i", "env": [{"name": "K", "valueFrom": {"secretKeyRef": key}}],
                           "envFrom": [{"secretRef": {"name": "hs-webhook-tls"}}]}],
           "volumes": [{"name": "tls", "secret": {"secretName": "hs-webhook-tls"}},
                       {"name": "p", "projected": {"sources": [{"secret": {"name": "hs-operator-key"}}]}},
                       {"name": "mine", "secret": {"secretName": "my-own"}}]}
    engine = {"env": [{"name": "K", "valueFrom": {"secretKeyRef": key}}],
              "envFrom": [{"secretRef": {"name": "hs-operator-key"}}]}
    assert set(errors(OPERATOR, engine=engine, **template(pod))) == {
        "spec.engine.env[K].valueFrom.secretKeyRef.name",
        "spec.engine.envFrom[0].secretRef.name",
        f"{AT}.containers[s].env[K].valueFrom.secretKeyRef.name",
        f"{AT}.containers[s].envFrom[0].secretRef.name",
        f"{AT}.volumes[tls].secret.secretName",
        f"{AT}.volumes[p].projected.sources[0].secret.name",
    }


# --------------------------------------------------------------------------- where the policy comes from


def test_the_operator_flags_grant_the_new_privileges_only_when_passed() -> None:
    from hybridserving.controller.__main__ import arguments, engine_policy

    nothing = engine_policy(arguments().parse_args([]))
    assert not nothing.allow_node_cache and not nothing.allow_service_account and not nothing.operator_secrets
    assert nothing.allowed_node_cache_paths == ("/var/lib/hybridserving",)
    granted = engine_policy(arguments().parse_args([
        "--engine-allow-node-cache=true", "--allowed-node-cache-path=/mnt/nvme", "--allowed-node-cache-path=/data",
        "--engine-allow-service-account=true", "--operator-secret=hs-operator-key"]))
    assert granted.allow_node_cache and granted.allow_service_account
    assert granted.allowed_node_cache_paths == ("/mnt/nvme", "/data")
    assert granted.operator_secrets == ("hs-operator-key",)


def test_the_cli_without_the_installations_policy_leaves_the_grants_to_the_cluster() -> None:
    spec = hs(prefill={**SPEC["prefill"], "podTemplate": {"spec": {"hostPID": True}}}).spec
    assert not [i for i in core_fleet.check(spec) if i.path.endswith("hostPID")]
    assert [i for i in core_fleet.check(spec, EnginePolicy()) if i.path.endswith("hostPID")]
