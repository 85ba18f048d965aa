"""Pod templates, weights and gang admission as the planner renders them, and their refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from hybridserving.api.v1alpha1 import INSTANCE_KIND, HybridServing
from hybridserving.contract import ANNOTATION_ROLE
from hybridserving.core import gang, planner, podtemplate, surface, weights
from hybridserving.core.naming import LABEL_COMPONENT, LABEL_INSTANCE, LABEL_NAME
from hybridserving.core.observed import Observed
from hybridserving.api.v1alpha1 import ROUTER_METRICS_PORT
from hybridserving.core.rendering import role_config
from support.apiserver import FakeCluster
from support.fleets import converge, fleet, router_deployment, uids

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pods_of(hs: HybridServing) -> dict[str, dict[str, Any]]:
    cluster = FakeCluster()
    converge(cluster, hs)
    return cluster.pods()


def engine(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "engine")


def issues(hs: HybridServing) -> list[tuple[str, str, str]]:
    return [(i.path, i.rule, i.severity) for i in surface.check(hs.spec)]


# --------------------------------------------------------------------------- merge rule


def test_merge_appends_lists_merges_maps_replaces_scalars_and_merges_containers_by_name() -> None:
    base = {"tolerations": [{"key": "a"}], "nodeSelector": {"x": "1"}, "schedulerName": "default-scheduler",
            "containers": [{"name": "engine", "image": "e", "env": [{"name": "A", "value": "1"}],
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    patch = {"tolerations": [{"key": "b"}], "nodeSelector": {"y": "2"}, "schedulerName": "volcano",
             "containers": [{"name": "engine", "env": [{"name": "B", "value": "2"}],
                             "resources": {"limits": {"memory": "1Ti"}, "requests": {"cpu": "32"}}},
                            {"name": "sidecar", "image": "s"}]}
    out = podtemplate.merge(base, patch)
    assert out["tolerations"] == [{"key": "a"}, {"key": "b"}]
    assert out["nodeSelector"] == {"x": "1", "y": "2"}
    assert out["schedulerName"] == "volcano"
    eng, side = out["containers"]
    assert eng["image"] == "e" and [e["name"] for e in eng["env"]] == ["A", "B"]
    assert eng["resources"] == {"limits": {"nvidia.com/gpu": "8", "memory": "1Ti"}, "requests": {"cpu": "32"}}
    assert side == {"name": "sidecar", "image": "s"}
    assert base["tolerations"] == [{"key": "a"}], "the inputs are not changed"


def test_fleet_then_role_templates_land_on_every_pod_of_that_role_only() -> None:
    hs = fleet(
        podTemplate={
            "metadata": {"labels": {"team": "llm"}, "annotations": {"cost-center": "42"}},
            "spec": {"tolerations": [TOLERATION], "nodeSelector": {"pool": "gpu"}, "priorityClassName": "serving",
                     "imagePullSecrets": [{"name": "regcred"}], "runtimeClassName": "nvidia",
                     "serviceAccountName": "engine-sa",
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "gpu", "operator": "In", "values": ["h200"]}]}]}}},
                     "volumes": [{"name": "scratch", "emptyDir": {}}],
                     "containers": [{"name": "engine", "resources": {"requests": {"cpu": "16", "memory": "512Gi"}},
                                     "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]},
        },
        decode={"podTemplate": {"spec": {"schedulerName": "gang-scheduler"}}},
    )
    pods = pods_of(hs)
    roles = {p["metadata"]["annotations"][ANNOTATION_ROLE] for p in pods.values()}
    assert roles == {"prefill", "decode"}
    for pod in pods.values():
        spec, meta = pod["spec"], pod["metadata"]
        assert TOLERATION in spec["tolerations"] and spec["nodeSelector"] == {"pool": "gpu"}
        assert spec["priorityClassName"] == "serving" and spec["runtimeClassName"] == "nvidia"
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["serviceAccountName"] == "engine-sa"
        assert "nodeAffinity" in spec["affinity"] and "podAffinity" in spec["affinity"], "both kept"
        assert meta["labels"]["team"] == "llm" and meta["annotations"]["cost-center"] == "42"
        eng = engine(pod)
        assert eng["resources"]["requests"] == {"nvidia.com/gpu": "8", "cpu": "16", "memory": "512Gi"}
        assert eng["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert {"name": "scratch", "mountPath": "/scratch"} in eng["volumeMounts"]
        decode = meta["annotations"][ANNOTATION_ROLE] == "decode"
        assert spec.get("schedulerName") == ("gang-scheduler" if decode else None)


def test_changing_the_pod_template_rolls_pods_and_an_unchanged_one_writes_nothing() -> None:
    hs = fleet()
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    assert cluster.reconcile(hs) == []
    changed = fleet(podTemplate={"metadata": {"labels": {"team": "llm"}}, "spec": {"tolerations": [TOLERATION]}})
    converge(cluster, changed)
    after = uids(cluster)
    assert not set(before.values()) & set(after.values()), "every pod rolled onto the new template"
    assert all(TOLERATION in p["spec"]["tolerations"] for p in cluster.pods().values())
    assert cluster.reconcile(changed) == []


def test_equal_role_templates_keep_role_switches_in_place() -> None:
    template = {"spec": {"tolerations": [TOLERATION]}}
    hs = fleet(roleSwitch={"enabled": True}, prefill={"podTemplate": template}, decode={"podTemplate": template})
    assert not [i for i in issues(hs) if i[1] == "pod-template-role-switch"]
    cluster = FakeCluster()
    converge(cluster, hs)
    before = uids(cluster)
    cluster.store[(INSTANCE_KIND, "hs-5")]["spec"]["role"] = "prefill"
    converge(cluster, hs)
    assert uids(cluster) == before
    differing = fleet(roleSwitch={"enabled": True}, prefill={"podTemplate": template})
    assert ("spec.prefill.podTemplate", "pod-template-role-switch", "warning") in issues(differing)


# --------------------------------------------------------------------------- owned fields


@pytest.mark.parametrize(
    ("template", "path"),
    [
        ({"spec": {"containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}},
         "spec.podTemplate.spec.containers[engine].resources.limits[nvidia.com/gpu]"),
        ({"spec": {"containers": [{"name": "engine", "command": ["python3"]}]}},
         "spec.podTemplate.spec.containers[engine].command"),
        ({"spec": {"containers": [{"name": "engine", "ports": [{"containerPort": 30000}]}]}},
         "spec.podTemplate.spec.containers[engine].ports"),
        ({"spec": {"containers": [{"name": "engine", "image": "mine"}]}},
         "spec.podTemplate.spec.containers[engine].image"),
        ({"metadata": {"labels": {"hybridserving.io/role": "decode"}}},
         "spec.podTemplate.metadata.labels[hybridserving.io/role]"),
        ({"metadata": {"annotations": {"sglang.ai/bootstrap-port": "1"}}},
         "spec.podTemplate.metadata.annotations[sglang.ai/bootstrap-port]"),
        ({"spec": {"hostNetwork": True}}, "spec.podTemplate.spec.hostNetwork"),
        ({"spec": {"volumes": [{"name": "config", "emptyDir": {}}]}}, "spec.podTemplate.spec.volumes[config]"),
        ({"spec": {"containers": [{"name": "engine", "env": [{"name": "HYBRIDSERVING_PORT", "value": "1"}]}]}},
         "spec.podTemplate.spec.containers[engine].env[HYBRIDSERVING_PORT]"),
        ({"spec": {"containers": [{"name": "engine", "volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}]}},
         "spec.podTemplate.spec.containers[engine].volumeMounts[x]"),
    ],
)
def test_an_override_of_an_operator_owned_field_is_refused_naming_it(template: dict[str, Any], path: str) -> None:
    found = [i for i in surface.check(fleet(podTemplate=template).spec) if i.severity == "error"]
    assert [i.path for i in found] == [path]
    assert found[0].fix and found[0].rule == "pod-template-owned-field"


def test_a_custom_gpu_resource_name_is_owned_too() -> None:
    hs = fleet(hardware={"gpuResourceName": "amd.com/gpu"},
               decode={"podTemplate": {"spec": {"containers": [
                   {"name": "engine", "resources": {"limits": {"amd.com/gpu": "1", "nvidia.com/gpu": "1"}}}]}}})
    assert [p for p, _, s in issues(hs) if s == "error"] == [
        "spec.decode.podTemplate.spec.containers[engine].resources.limits[amd.com/gpu]"]


def test_only_the_engine_containers_gpus_are_the_operators_an_init_containers_are_checked_against_limits() -> None:
    gpus = {"requests": {"nvidia.com/gpu": 1}}
    # The pod's own resources take no GPU at all (tests/unit/test_admission.py).
    hs = fleet(podTemplate={"spec": {"initContainers": [{"name": "engine", "image": "x", "resources": gpus}],
                                     "containers": [{"name": "engine", "resources": gpus}]}})
    assert [(p, r) for p, r, s in issues(hs) if s == "error"] == [
        ("spec.podTemplate.spec.initContainers[engine].resources.requests[nvidia.com/gpu]", "pod-template-resources"),
        ("spec.podTemplate.spec.containers[engine].resources.requests[nvidia.com/gpu]", "pod-template-owned-field"),
    ]


def test_a_sidecar_needs_an_image() -> None:
    hs = fleet(podTemplate={"spec": {"containers": [{"name": "log-shipper"}]}})
    assert ("spec.podTemplate.spec.containers[log-shipper].image", "pod-template-shape", "error") in issues(hs)


def test_names_the_apiserver_refuses_in_a_pod_are_errors_not_silently_merged() -> None:
    """A container or volume name is a DNS-1123 label, unique in its list; the template's items
    merge into the pod's by name, so a duplicate would otherwise vanish into the first."""
    hs = fleet(podTemplate={"spec": {
        "containers": [{"name": "Log Shipper", "image": "a"}, {"name": "side", "image": "a"},
                       {"name": "side", "image": "b"}],
        "initContainers": [{"name": "init", "image": "a"}, {"name": "init", "image": "b"}],
        "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]}})
    assert [(p, r) for p, r, s in issues(hs) if s == "error"] == [
        ("spec.podTemplate.spec.containers[Log Shipper].name", "pod-template-shape"),
        ("spec.podTemplate.spec.containers[side]", "pod-template-shape"),
        ("spec.podTemplate.spec.initContainers[init]", "pod-template-shape"),
        ("spec.podTemplate.spec.volumes[cache]", "pod-template-shape"),
    ]
    fine = fleet(podTemplate={"spec": {"containers": [{"name": "engine"}, {"name": "log-shipper", "image": "a"}]}})
    assert not [p for p, _, s in issues(fine) if s == "error"]


# --------------------------------------------------------------------------- env


def test_env_value_from_secret_and_config_map_and_env_from_reach_the_engine() -> None:
    hs = fleet(engine={"env": [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}}},
        {"name": "LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "log"}}},
        {"name": "PLAIN", "value": "x"},
    ], "envFrom": [{"configMapRef": {"name": "nccl-tuning"}}, {"secretRef": {"name": "extra"}, "prefix": "X_"}]})
    eng = engine(next(iter(pods_of(hs).values())))
    env = {e["name"]: e for e in eng["env"]}
    assert env["API_KEY"] == {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}}}
    assert env["LOG_LEVEL"]["valueFrom"] == {"configMapKeyRef": {"name": "tuning", "key": "log"}}
    assert env["PLAIN"] == {"name": "PLAIN", "value": "x"}
    assert eng["envFrom"] == [
        {"configMapRef": {"name": "nccl-tuning"}}, {"prefix": "X_", "secretRef": {"name": "extra"}}
    ]


@pytest.mark.parametrize("env", [
    {"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    {"name": "A", "valueFrom": {}},
    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "spec.nodeName"}}},
])
def test_ambiguous_env_is_refused(env: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        fleet(engine={"env": [env]})


# --------------------------------------------------------------------------- weights


def argv(hs: HybridServing, role: str = "decode") -> list[str]:
    return role_config(hs.spec, role)["argv"]  # type: ignore[arg-type]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_a_pvc_source_mounts_the_claim_read_only_and_serves_under_the_model_id() -> None:
    hs = fleet(model={"weights": {"uri": "pvc://models/deepseek-v3"}})
    pod = next(iter(pods_of(hs).values()))
    assert {"name": "weights", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} \
        in pod["spec"]["volumes"]
    assert {"name": "weights", "mountPath": weights.MOUNT_PATH, "readOnly": True, "subPath": "deepseek-v3"} \
        in engine(pod)["volumeMounts"]
    assert flag(argv(hs), "--model-path") == weights.MOUNT_PATH
    assert flag(argv(hs), "--served-model-name") == "deepseek-ai/DeepSeek-V3"
    assert "initContainers" not in pod["spec"]


def test_a_node_cache_fills_once_per_node_with_the_token_by_reference_only() -> None:
    hs = fleet(model={"weights": {"uri": "hf://deepseek-ai/DeepSeek-V3", "revision": "abc123", "cache": "Node",
                                  "tokenSecretRef": {"name": "hub-token"}}})
    pod = next(iter(pods_of(hs).values()))
    (fill,) = pod["spec"]["initContainers"]
    assert fill["name"] == "weights" and fill["command"] == ["hybridserving-weights"]
    env = {e["name"]: e for e in fill["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "HF_TOKEN"}}
    }
    assert env["HYBRIDSERVING_WEIGHTS_REVISION"]["value"] == "abc123"
    key = weights.cache_key(hs.spec.model.weights)  # type: ignore[arg-type]
    assert env["HYBRIDSERVING_WEIGHTS_DIR"]["value"] == f"/cache/{key}"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "weights")
    assert volume == {
        "name": "weights", "hostPath": {"path": "/var/lib/hybridserving/models", "type": "DirectoryOrCreate"}
    }
    mount = next(m for m in engine(pod)["volumeMounts"] if m["name"] == "weights")
    assert mount == {"name": "weights", "mountPath": weights.MOUNT_PATH, "readOnly": True, "subPath": key}
    assert "HF_TOKEN" not in {e["name"] for e in engine(pod)["env"]}, "the engine reads the local copy"
    assert flag(argv(hs), "--model-path") == weights.MOUNT_PATH


def test_the_cache_key_changes_with_the_revision_only() -> None:
    a = fleet(model={"weights": {"uri": "hf://org/m", "cache": "Node", "revision": "r1"}}).spec.model.weights
    b = fleet(model={"weights": {"uri": "hf://org/m", "cache": "Node", "revision": "r2"}}).spec.model.weights
    assert weights.cache_key(a) != weights.cache_key(b)  # type: ignore[arg-type]
    assert weights.cache_key(a).startswith("org--m--r1--")  # type: ignore[arg-type]


def test_a_hub_source_without_cache_lets_the_engine_download_with_its_revision() -> None:
    hs = fleet(model={"weights": {"uri": "hf://deepseek-ai/DeepSeek-V3", "revision": "v1",
                                  "tokenSecretRef": {"name": "t", "key": "token"},
                                  "endpoint": "http://hub-mirror.internal"}})
    eng = engine(next(iter(pods_of(hs).values())))
    env = {e["name"]: e for e in eng["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "t", "key": "token"}}
    assert env["HF_ENDPOINT"]["value"] == "http://hub-mirror.internal"
    assert flag(argv(hs), "--model-path") == "deepseek-ai/DeepSeek-V3"
    assert flag(argv(hs), "--revision") == "v1"


def test_an_oci_source_is_an_image_volume() -> None:
    hs = fleet(model={"weights": {"uri": "oci://registry.example/models/dsv3:fp8"}})
    pod = next(iter(pods_of(hs).values()))
    image = {"reference": "registry.example/models/dsv3:fp8", "pullPolicy": "IfNotPresent"}
    assert {"name": "weights", "image": image} in pod["spec"]["volumes"]


@pytest.mark.parametrize("w", [
    {"uri": "s3://bucket/model"},
    {"uri": "pvc://models", "cache": "Node"},
    {"uri": "oci://x", "tokenSecretRef": {"name": "t"}},
    {"uri": "hf://org/m", "endpoint": "ftp://x"},
    {"uri": "pvc://claim/../other"},
    {"uri": "pvc://claim//x"},
    {"uri": "pvc://claim/a/./b"},
])
def test_bad_weights_are_refused(w: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        fleet(model={"weights": w})


def test_a_plain_text_token_is_an_error_naming_the_secret_fix() -> None:
    hs = fleet(engine={"env": [{"name": "HF_TOKEN", "value": "hf_secret"}]})
    (issue,) = [i for i in surface.check(hs.spec) if i.severity == "error"]
    assert issue.path == "spec.engine.env" and "tokenSecretRef" in issue.fix


def test_fill_outcome_reads_the_init_container_status() -> None:
    def pod(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"status": {"initContainerStatuses": [{"name": "weights", "state": state, "lastState": last or {}}]}}

    done = json.dumps({"bytes": 10, "downloaded": False})
    assert weights.fill_outcome(pod({"terminated": {"exitCode": 0, "message": done}})) == ("Filled", done)
    assert weights.fill_outcome(pod({"running": {}})) == ("Filling", "")
    assert weights.fill_outcome(pod({"waiting": {"reason": "CrashLoopBackOff"}},
                                    {"terminated": {"exitCode": 1, "message": "401 Unauthorized"}})) \
        == ("Failed", "401 Unauthorized")
    assert weights.fill_outcome({"status": {}}) is None
    assert weights.fill_outcome(pod({"running": {}}, {"terminated": {"exitCode": 1, "message": "503"}})) \
        == ("Filling", ""), "a retry under way is filling, whatever the last attempt said"


# --------------------------------------------------------------------------- gang


def test_workload_gangs_each_instance_and_follow_it_through_garbage_collection() -> None:
    hs = fleet(gang={"mode": "Workload"}, prefill={"replicas": 2, "nodesPerInstance": 2, "layout": {"tp": 16}})
    cluster = FakeCluster()
    converge(cluster, hs)
    workloads = {o["metadata"]["labels"][LABEL_INSTANCE]: o for (k, _), o in cluster.store.items()
                 if k == "Workload"}
    assert sorted(workloads) == [f"hs-{i}" for i in range(5)]
    insts = cluster.instances()
    for name, wl in workloads.items():
        nodes = insts[name]["spec"]["nodes"]
        assert wl["metadata"]["name"] == f"{name}-n{nodes}"
        assert wl["spec"]["podGroups"] == [{"name": "engine", "policy": {"gang": {"minCount": nodes}}}]
        assert wl["metadata"]["ownerReferences"][0]["uid"] == insts[name]["metadata"]["uid"]
    for pod in cluster.pods().values():
        inst = pod["metadata"]["labels"][LABEL_INSTANCE]
        assert pod["spec"]["workloadRef"] == {"name": workloads[inst]["metadata"]["name"], "podGroup": "engine"}
    assert cluster.reconcile(hs) == []


def test_a_new_instance_size_is_a_new_workload_since_pod_groups_are_immutable() -> None:
    hs = fleet(gang={"mode": "Workload"}, prefill={"replicas": 1, "layout": {"tp": 8}},
               decode={"replicas": 0, "layout": {"tp": 8}})
    cluster = FakeCluster()
    converge(cluster, hs)
    assert [n for k, n in cluster.store if k == "Workload"] == ["hs-0-n1"]
    bigger = fleet(gang={"mode": "Workload"}, prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}},
                   decode={"replicas": 0, "layout": {"tp": 8}})
    converge(cluster, bigger)
    assert [n for k, n in cluster.store if k == "Workload"] == ["hs-0-n2"]
    assert all(p["spec"]["workloadRef"]["name"] == "hs-0-n2" for p in cluster.pods().values())


def test_workloads_are_created_before_the_pods_that_wait_for_them() -> None:
    hs = fleet(gang={"mode": "Workload"})
    cluster = FakeCluster()
    cluster.reconcile(hs)  # instances
    order = [(a.verb, a.kind) for a in planner.diff(planner.plan(hs, cluster.observed()), cluster.observed())]
    assert order.index(("create", "Workload")) < order.index(("create", "Pod"))


def test_kueue_gets_pod_group_labels_and_a_fleet_without_gang_is_unchanged() -> None:
    hs = fleet(gang={"mode": "Kueue", "queueName": "gpu-queue"},
               prefill={"replicas": 1, "nodesPerInstance": 2, "layout": {"tp": 16}})
    pod = pods_of(hs)["hs-0-1"]
    assert pod["metadata"]["labels"][gang.KUEUE_POD_GROUP] == "hs-0"
    assert pod["metadata"]["labels"][gang.KUEUE_QUEUE] == "gpu-queue"
    assert pod["metadata"]["annotations"][gang.KUEUE_TOTAL] == "2"
    plain = planner.plan(fleet(), Observed())
    assert all(p.workload is None for p in plain.instances.values())


# --------------------------------------------------------------------------- router


def router_objects(hs: HybridServing) -> dict[tuple[str, str], dict[str, Any]]:
    return {k: v for k, v in planner.plan(hs, Observed()).objects.items() if k[1].startswith("hs-router")}


def test_the_pods_termination_grace_covers_the_drain_and_the_launchers_stop_grace() -> None:
    """After SIGTERM the launcher drains (up to drainTimeoutSeconds), then gives SGLang its stop
    grace before SIGKILL; a kubelet that killed the pod sooner would cut SGLang's exit short."""
    def grace(env: list[dict[str, Any]]) -> set[int]:
        hs = fleet(roleSwitch={"drainTimeoutSeconds": 120}, engine={"env": env})
        return {p["spec"]["terminationGracePeriodSeconds"] for p in pods_of(hs).values()}

    assert grace([]) == {150}
    assert grace([{"name": "HYBRIDSERVING_STOP_GRACE_S", "value": "89.5"}]) == {210}
    assert grace([{"name": "HYBRIDSERVING_STOP_GRACE_S", "value": "90"},
                  {"name": "HYBRIDSERVING_STOP_GRACE_S", "value": "10"}]) == {130}, "the last entry wins"
    from_secret = {"name": "HYBRIDSERVING_STOP_GRACE_S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert grace([from_secret]) == {150}, "unknown here: the default"


def test_the_router_has_probes_resources_and_scraped_metrics() -> None:
    objs = router_objects(fleet())
    container = objs[("Deployment", router_deployment(fleet()))]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    assert container["args"][container["args"].index("--prometheus-host") + 1] == "0.0.0.0"
    # Out of the Service before SIGTERM, then smg drains within the pod's grace period.
    prestop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = int(container["args"][container["args"].index("--shutdown-grace-period-secs") + 1])
    template = objs[("Deployment", router_deployment(fleet()))]["spec"]["template"]["spec"]
    grace = template["terminationGracePeriodSeconds"]
    assert prestop > 0 and grace > prestop + drain
    # No overload veto: with it, a draining worker left its peer vetoed and the role without one.
    assert "--disable-worker-overload-protection" in container["args"]
    # No breaker: smg blames both workers of a pair, so one crash opened the other role's circuits.
    assert "--disable-circuit-breaker" in container["args"]
    # Instead, each worker's own /ready every second: a dead engine is out within seconds.
    args = container["args"]
    assert args[args.index("--health-check-endpoint") + 1] == "/ready"
    assert args[args.index("--health-check-interval-secs") + 1] == "1"
    ports = {p["name"]: p["port"] for p in objs[("Service", "hs-router")]["spec"]["ports"]}
    assert ports == {"http": 8000, "metrics": ROUTER_METRICS_PORT}
    assert ("PodDisruptionBudget", "hs-router") not in objs, "one replica: nothing to protect"


def test_replicated_routers_get_a_budget_and_spread_and_lose_them_when_scaled_back() -> None:
    hs = fleet(router={"replicas": 3, "resources": {"requests": {"cpu": "4"}}})
    objs = router_objects(hs)
    pdb = objs[("PodDisruptionBudget", "hs-router")]
    # Unready routers (no healthy worker of a role, as while GPU nodes drain) may always go.
    assert pdb["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow", "selector": {
        "matchLabels": {LABEL_NAME: "hs", LABEL_COMPONENT: "router"}}}
    pod = objs[("Deployment", router_deployment(fleet()))]["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "4"}}
    cluster = FakeCluster()
    converge(cluster, hs)
    assert ("PodDisruptionBudget", "hs-router") in cluster.store
    converge(cluster, fleet(router={"replicas": 1}))
    assert ("PodDisruptionBudget", "hs-router") not in cluster.store
