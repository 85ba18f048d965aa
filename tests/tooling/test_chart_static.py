"""The Helm chart, rendered by the real `helm` binary without a cluster.

What is checked here is what a reviewer of an operator chart looks for first: the operator pod
meets the Pod Security Standard "restricted", the RBAC has no wildcard and no get/list/watch on Secrets,
permissions are namespaced except the few read-only cluster ones, engine privileges are explicit
flags, and values.schema.json turns a wrong value into a failed install rather than a surprise.
The same chart is installed on a real control plane in tests/integration/test_chart.py.
"""

from __future__ import annotations

import base64
from typing import Any
import re

import kopf
import pytest
import yaml
from cryptography import x509

from hybridserving.controller.handlers import STOP_GRACE_SECONDS
from hybridserving.controller.leadership import Election

from support.chart import (
    CHART,
    RELEASE_NS,
    ROOT,
    helm,
    kube_version,
    of_kind,
    operator_container,
    render,
    render_error,
    template_args,
    the,
)

# Pod Security Standards, "restricted" profile (kubernetes.io/docs/concepts/security/pod-security-standards).
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
RESTRICTED_ADDABLE_CAPABILITIES = {"NET_BIND_SERVICE"}
READ_VERBS = {"get", "list", "watch"}
# Cluster-scoped resources the operator may need; everything else it is granted per namespace.
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "nodes"), ("", "namespaces")}
PRIVILEGE_VERBS = {"escalate", "bind", "impersonate"}


def restricted_violations(pod_spec: dict) -> list[str]:
    """Every way `pod_spec` breaks the "restricted" Pod Security Standard (baseline included)."""
    problems = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"{field} is set")
    pod_sc = pod_spec.get("securityContext", {})
    for volume in pod_spec.get("volumes", []):
        types = set(volume) - {"name"}
        if not types <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} has type {types - RESTRICTED_VOLUME_TYPES}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser is 0")
    if pod_sc.get("sysctls"):
        problems.append("pod sets sysctls")
    containers = pod_spec.get("initContainers", []) + pod_spec.get("containers", [])
    for c in containers:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp!r}")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if not set(caps.get("add", [])) <= RESTRICTED_ADDABLE_CAPABILITIES:
            problems.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount {sc['procMount']}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{name}: hostPort {port['hostPort']}")
    return problems


def permissions(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a list of PolicyRules grants."""
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", []) for r in rule.get("resources", [])
            for v in rule.get("verbs", [])}


# ---------------------------------------------------------------------------------------- lint


def test_chart_lints_strictly() -> None:
    proc = helm("lint", str(CHART), "--strict", "--kube-version", kube_version())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_app_version_is_the_package_version() -> None:
    import tomllib

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"] == "0.1.0"


# --------------------------------------------------------------------------------- operator pod


@pytest.mark.parametrize("sets", [(), ("watchAllNamespaces=true",), ("enginePolicy.allowHostNetwork=true",
                                                                    "enginePolicy.allowIpcLock=true"),
                                  ("webhook.enabled=true",)])
def test_operator_pod_meets_restricted(sets: tuple[str, ...]) -> None:
    pod = the(render(*sets), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    # The strictest reading: the fields are set explicitly, not left to image defaults.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_the_checker_sees_violations() -> None:
    """restricted_violations must not pass everything: a root, privileged pod fails it."""
    bad = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
           "containers": [{"name": "c", "securityContext": {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}},
                           "ports": [{"containerPort": 1, "hostPort": 1}]}]}
    problems = "\n".join(restricted_violations(bad))
    for needle in ("hostNetwork", "hostPath", "privileged", "allowPrivilegeEscalation", "runAsNonRoot",
                   "seccompProfile", "drop ALL", "IPC_LOCK", "hostPort"):
        assert needle in problems


def test_tmp_is_the_only_writable_mount() -> None:
    docs = render()
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    mounts = operator_container(docs)["volumeMounts"]
    assert [(m["name"], m["mountPath"]) for m in mounts] == [("tmp", "/tmp")]
    (volume,) = pod["volumes"]
    assert volume["name"] == "tmp" and "emptyDir" in volume
    # The webhook's certificate is mounted read-only.
    mounts = operator_container(render("webhook.enabled=true"))["volumeMounts"]
    assert [(m["name"], m["mountPath"]) for m in mounts if not m.get("readOnly")] == [("tmp", "/tmp")]


def test_one_replica_recreated_not_rolled() -> None:
    deployment = the(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_operator_runs_the_controller_module_as_its_service_account() -> None:
    docs = render()
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    assert operator_container(docs)["command"] == ["python", "-m", "hybridserving.controller"]
    assert pod["serviceAccountName"] == the(docs, "ServiceAccount")["metadata"]["name"]
    assert operator_container(docs)["image"] == "hybridserving/operator:0.1.0"


def test_image_digest_wins_over_tag() -> None:
    digest = "sha256:" + "a" * 64
    image = operator_container(render(f"image.digest={digest}", "image.tag=ignored"))["image"]
    assert image == f"hybridserving/operator@{digest}"


# ------------------------------------------------------------------------- namespaces and flags


def fleet_rbac(docs: list[dict], kind: str) -> list[dict]:
    """The Roles or RoleBindings of the fleets' namespaces: all but the leader Lease's (release namespace)."""
    return [r for r in of_kind(docs, kind) if not r["metadata"]["name"].endswith("-leader-election")]


def test_default_watches_the_release_namespace_only() -> None:
    docs = render()
    args = operator_container(docs)["args"]
    assert [a for a in args if a.startswith("--namespace")] == [f"--namespace={RELEASE_NS}"]
    assert [r["metadata"]["namespace"] for r in fleet_rbac(docs, "Role")] == [RELEASE_NS]


def test_watched_namespaces_get_a_role_and_a_flag_each() -> None:
    docs = render("watchNamespaces={serving-a,serving-b}")
    args = operator_container(docs)["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=serving-a", "--namespace=serving-b"]
    assert sorted(r["metadata"]["namespace"] for r in fleet_rbac(docs, "Role")) == ["serving-a", "serving-b"]
    bindings = fleet_rbac(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["serving-a", "serving-b"]
    sa = the(docs, "ServiceAccount")["metadata"]
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": RELEASE_NS}]
        assert b["roleRef"]["kind"] == "Role"


def test_all_namespaces_binds_the_fleet_rules_cluster_wide() -> None:
    docs = render("watchAllNamespaces=true")
    args = operator_container(docs)["args"]
    # The operator watches the whole cluster when given no --namespace.
    assert not any(a.startswith("--namespace") for a in args)
    assert fleet_rbac(docs, "Role") == [] and fleet_rbac(docs, "RoleBinding") == []
    fleet = next(r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-fleet"))
    (namespaced,) = fleet_rbac(render(), "Role")
    assert permissions(fleet["rules"]) == permissions(namespaced["rules"])


@pytest.mark.parametrize("host_network", [True, False])
@pytest.mark.parametrize("ipc_lock", [True, False])
def test_engine_privileges_are_explicit_flags(host_network: bool, ipc_lock: bool) -> None:
    args = operator_container(render(f"enginePolicy.allowHostNetwork={str(host_network).lower()}",
                                     f"enginePolicy.allowIpcLock={str(ipc_lock).lower()}"))["args"]
    # Both flags are always passed, off included: the operator never falls back to its own default.
    assert f"--engine-allow-host-network={str(host_network).lower()}" in args
    assert f"--engine-allow-ipc-lock={str(ipc_lock).lower()}" in args


def test_debug_logging_is_verbose() -> None:
    assert "--verbose" not in operator_container(render())["args"]
    assert "--verbose" in operator_container(render("logLevel=debug"))["args"]


def test_the_stuck_pass_limit_reaches_the_operator_as_it_parses_it() -> None:
    """The liveness probe fails once a pass has run `stuckPassSeconds` (0: never), the operator's
    own default unless set."""
    from hybridserving.controller.__main__ import arguments

    def limit(*sets: str) -> float:
        args = [a for a in operator_container(render(*sets))["args"] if a.startswith("--stuck-pass-seconds=")]
        assert len(args) == 1
        seconds: float = arguments().parse_args(args).stuck_pass_seconds
        return seconds

    assert limit() == arguments().parse_args([]).stuck_pass_seconds == 600
    assert limit("stuckPassSeconds=0") == 0
    assert limit("stuckPassSeconds=90") == 90
    assert "/stuckPassSeconds" in render_error("stuckPassSeconds=-1")


def test_engine_privileges_are_off_by_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["enginePolicy"] == {"allowHostNetwork": False, "allowIpcLock": False, "allowedImages": [],
                                      "allowNodeCache": False, "allowedNodeCachePaths": ["/var/lib/hybridserving"],
                                      "allowServiceAccount": False}


def test_the_operator_binary_grants_nothing_by_default() -> None:
    """Run without the chart (by hand, in a test), the operator is as strict as the chart's defaults."""
    from hybridserving.controller.__main__ import arguments, engine_policy

    policy = engine_policy(arguments().parse_args([]))
    assert not policy.allow_host_network and not policy.allow_ipc_lock
    assert not policy.allow_node_cache and not policy.allow_service_account


@pytest.mark.parametrize("granted", [True, False])
def test_node_cache_and_service_account_grants_are_explicit_flags(granted: bool) -> None:
    args = operator_container(render(f"enginePolicy.allowNodeCache={str(granted).lower()}",
                                     f"enginePolicy.allowServiceAccount={str(granted).lower()}"))["args"]
    assert f"--engine-allow-node-cache={str(granted).lower()}" in args
    assert f"--engine-allow-service-account={str(granted).lower()}" in args
    assert "--allowed-node-cache-path=/var/lib/hybridserving" in args


@pytest.mark.parametrize("sets", [(), ("webhook.enabled=true", "operatorKey.existingSecret=platform-key"),
                                  ("webhook.enabled=true", "webhook.certificate.existingSecret=issued",
                                   "webhook.certificate.caBundle=Q0E=")])
def test_the_operator_knows_its_own_secrets_so_that_no_fleet_references_them(sets: tuple[str, ...]) -> None:
    """The Secrets the operator's pod reads (its key, the webhook's certificate) are the ones it refuses."""
    docs = render(*sets)
    container = operator_container(docs)
    key = next(e for e in container["env"] if e["name"] == "HYBRIDSERVING_OPERATOR_KEY")
    mounted = [key["valueFrom"]["secretKeyRef"]["name"]]
    volumes = the(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    mounted += [v["secret"]["secretName"] for v in volumes if "secret" in v]
    assert [a.split("=", 1)[1] for a in container["args"] if a.startswith("--operator-secret=")] == mounted
    assert len(mounted) == (2 if sets else 1)


def test_node_cache_directories_are_absolute() -> None:
    assert "allowedNodeCachePaths" in render_error("enginePolicy.allowedNodeCachePaths={var/lib}")


def test_allowed_images_reach_the_operator() -> None:
    args = operator_container(render("enginePolicy.allowedImages={registry.example/serving/,lmsysorg/sglang:}"))["args"]
    assert "--allowed-image=registry.example/serving/" in args and "--allowed-image=lmsysorg/sglang:" in args
    assert not [a for a in operator_container(render())["args"] if a.startswith("--allowed-image")]


def test_the_default_engine_image_is_a_chart_value_pinned_by_tag_or_digest() -> None:
    from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE

    assert f"--default-engine-image={DEFAULT_ENGINE_IMAGE}" in operator_container(render())["args"]
    digest = "sha256:" + "a" * 64
    args = operator_container(render("engineImage.repository=registry.example/serving/engine",
                                     f"engineImage.digest={digest}"))["args"]
    assert f"--default-engine-image=registry.example/serving/engine@{digest}" in args


# ------------------------------------------------------------------------------------------ RBAC


@pytest.mark.parametrize("sets", [(), ("watchAllNamespaces=true",), ("watchNamespaces={a,b,c}",)])
def test_rbac_has_no_wildcards_and_no_privilege_verbs(sets: tuple[str, ...]) -> None:
    docs = render(*sets)
    roles = of_kind(docs, "Role") + of_kind(docs, "ClusterRole")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: wildcard in {key}: {rule}"
            assert not set(rule["verbs"]) & PRIVILEGE_VERBS, rule
            assert "nonResourceURLs" not in rule


@pytest.mark.parametrize("sets", [(), ("watchAllNamespaces=true",)])
def test_no_secret_reads(sets: tuple[str, ...]) -> None:
    """Secrets are written (each fleet's engine key, by server-side apply: create and patch), never
    fetched: get, list or watch would hand the operator every Secret of the namespace. (The patch
    answers with the Secret all the same; the texts say so: test_chart_docs.py.)"""
    docs = render(*sets)
    granted = [(role["metadata"]["name"], v) for role in of_kind(docs, "Role") + of_kind(docs, "ClusterRole")
               for _, r, v in permissions(role["rules"]) if r == "secrets"]
    assert granted and {v for _, v in granted} == {"create", "patch"}, granted


def test_operator_key_is_generated_once_and_reaches_the_operator_by_reference() -> None:
    docs = render()
    (secret,) = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-operator-key")]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["operator-key"])) >= 32
    env = {e["name"]: e for e in operator_container(docs)["env"]}
    assert env["HYBRIDSERVING_OPERATOR_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"], "key": "operator-key"}


def test_an_existing_operator_key_secret_is_referenced_and_none_is_rendered() -> None:
    """Rendered without a cluster (`helm template`, as Argo CD does), the generated key would be
    new on every render; a Secret created once is named instead."""
    docs = render("operatorKey.existingSecret=operator-key-from-vault")
    assert not [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-operator-key")]
    env = {e["name"]: e for e in operator_container(docs)["env"]}
    assert env["HYBRIDSERVING_OPERATOR_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "operator-key-from-vault", "key": "operator-key"}


def operator_cluster_roles(docs: list[dict]) -> list[dict]:
    """The operator's own ClusterRoles (the roles for people are checked in test_user_roles.py)."""
    people = ("-view", "-edit", "-oncall")
    return [r for r in of_kind(docs, "ClusterRole") if not r["metadata"]["name"].endswith(people)]


def test_no_role_of_the_release_is_aggregated() -> None:
    """The aggregation controller writes an aggregated ClusterRole by server-side apply
    (pkg/controller/clusterroleaggregation, `ClusterRoles().Apply` with no UID precondition), so
    an apply racing `helm uninstall` recreates the role without the release's labels: uninstall
    --wait never finishes and the next install is refused. Aggregating *into* the built-in roles
    is safe; a release-owned role must list its rules itself."""
    for sets in [(), ("watchAllNamespaces=true",)]:
        for role in of_kind(render(*sets), "ClusterRole"):
            assert "aggregationRule" not in role, role["metadata"]["name"]
            assert role["rules"], role["metadata"]["name"]


@pytest.mark.parametrize("sets", [(), ("webhook.enabled=true",)])
def test_cluster_role_is_read_only(sets: tuple[str, ...]) -> None:
    """Also with the webhook: its configuration is the chart's, so the operator writes none."""
    docs = render(*sets)
    (cluster_role,) = operator_cluster_roles(docs)
    granted = permissions(cluster_role["rules"])
    assert granted and {v for _, _, v in granted} <= READ_VERBS
    assert {(g, r) for g, r, _ in granted} <= CLUSTER_SCOPED
    binding = the(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]


@pytest.mark.parametrize("sets", [(), ("webhook.enabled=true",)])
def test_rules_are_the_operators_own(sets: tuple[str, ...]) -> None:
    """The chart grants exactly the operator's rule list (hybridserving.controller.rbac), split by
    scope: cluster-scoped resources in the ClusterRole, the rest in each namespace's Role. The
    webhook adds nothing: kopf's managed mode, which would create and patch validating and
    mutating webhook configurations, stays off."""
    from hybridserving.controller import rbac

    wanted = permissions([r.to_wire() for r in rbac.RULES])
    wanted_cluster = {p for p in wanted if p[:2] in CLUSTER_SCOPED}
    docs = render(*sets)
    (cluster_role,) = operator_cluster_roles(docs)
    assert permissions(cluster_role["rules"]) == wanted_cluster
    (role,) = fleet_rbac(docs, "Role")
    assert permissions(role["rules"]) == wanted - wanted_cluster


@pytest.mark.parametrize(("sets", "namespaces"), [
    ((), ["hs-system"]),
    (("watchNamespaces={team-a,team-b}",), ["team-a", "team-b"]),
    (("watchAllNamespaces=true",), None),
])
def test_the_instance_guard_binds_only_where_the_release_reconciles(sets: tuple[str, ...],
                                                                   namespaces: list[str] | None) -> None:
    """The guard lets only this release's operator write instance specs: bound in another release's
    namespaces it would refuse that release's operator every switch and roll."""
    binding = the(render(*sets), "ValidatingAdmissionPolicyBinding")
    selector = (binding["spec"].get("matchResources") or {}).get("namespaceSelector")
    if namespaces is None:
        assert selector is None
    else:
        assert selector == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}


def test_the_instance_guard_keeps_owner_references_and_finalizers_the_operators() -> None:
    """Without the fleet's ownerReference an instance drops out of the operator's view and out of
    the fleet's cascading deletion, its engines left running; a finalizer holds it past the fleet's
    deletion. Whoever may patch instances (edit, on-call) may change neither. The garbage collector
    may (it takes the ownerReference off on a `--cascade=orphan` delete, and its own finalizers off),
    and a finalizer may come off an instance being deleted (the apiserver adds none then)."""
    policy = the(render(), "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    collectors = set(re.findall(r"'([^']+)'", variables["collector"]))
    assert collectors == {"system:serviceaccount:kube-system:generic-garbage-collector",
                          "system:kube-controller-manager"}
    assert variables["collector"].startswith("request.userInfo.username in [")
    exemptions = {"ownerReferences": {"variables.collector"},
                  "finalizers": {"variables.collector", "has(object.metadata.deletionTimestamp)"}}
    for field, allowed in exemptions.items():
        (rule,) = [v for v in policy["spec"]["validations"] if f"object.metadata.{field}" in v["expression"]]
        *exempt, kept = [term.strip() for term in " ".join(rule["expression"].split()).split("||")]
        assert set(exempt) == allowed, (field, exempt)
        assert kept == (f"(has(object.metadata.{field}) ? object.metadata.{field} : []) == "
                        f"(has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : [])"), kept
        assert rule["reason"] == "Forbidden" and field in rule["message"]


def test_rbac_can_be_left_to_the_cluster_admin() -> None:
    docs = render("rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=preexisting")
    assert not {d["kind"] for d in docs} & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                                            "ServiceAccount", "ValidatingAdmissionPolicy"}
    assert the(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "preexisting"


# ---------------------------------------------------------------------------------------- metrics


def test_metrics_service_selects_the_operator_pod() -> None:
    docs = render()
    service = the(docs, "Service")
    pod_labels = the(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert "--metrics-port=8080" in operator_container(docs)["args"]
    assert of_kind(docs, "ServiceMonitor") == []


def test_service_monitor_is_optional() -> None:
    docs = render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
    monitor = the(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= the(docs, "Service")["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_service_monitor_without_service_is_refused() -> None:
    err = render_error("metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false")
    assert "metrics.service.enabled" in err


# ----------------------------------------------------------------------------------- values schema


@pytest.mark.parametrize(("sets", "path"), [
    (("replicaCount=two",), "/replicaCount"),
    (("replicaCount=6",), "/replicaCount"),
    (("enginePolicy.allowIpcLock=yes",), "/enginePolicy/allowIpcLock"),
    (("watchNamespaces={Not_A_Namespace}",), "/watchNamespaces/0"),
    (("image.pullPolicy=Sometimes",), "/image/pullPolicy"),
    (("metrics.port=70000",), "/metrics/port"),
    (("image.digest=latest",), "/image/digest"),
    (("replicaCuont=1",), "replicaCuont"),
])
def test_schema_rejects_bad_values(sets: tuple[str, ...], path: str) -> None:
    err = render_error(*sets)
    assert "values don't meet the specifications of the schema" in err
    assert path in err


def test_lint_fails_on_bad_values() -> None:
    proc = helm("lint", str(CHART), "--strict", "--set", "replicaCount=two")
    assert proc.returncode != 0
    assert "/replicaCount" in proc.stdout + proc.stderr


def test_every_value_is_in_the_schema() -> None:
    """The shipped values.yaml validates (helm would refuse a chart whose defaults fail) and the
    schema closes every object, so a misspelt key is an error rather than ignored."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"

    def closed(node: dict, where: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
            for key, sub in node["properties"].items():
                closed(sub, f"{where}.{key}")

    closed(schema, "values")
    render()


def test_the_admission_webhook_is_off_by_default_and_wired_when_enabled() -> None:
    docs = render()
    assert not any("webhook" in a for a in operator_container(docs)["args"])
    assert not of_kind(docs, "ValidatingWebhookConfiguration")
    assert not [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    docs = render("webhook.enabled=true")
    assert "--webhook-port=9443" in operator_container(docs)["args"]
    service = next(s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-webhook"))
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 9443, "targetPort": "webhook", "protocol": "TCP"}]
    # Only Ready pods (with several replicas, the leader) receive reviews.
    assert "publishNotReadyAddresses" not in service["spec"]
    pod_labels = the(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # The apiserver calls the Service, never a URL it may not resolve (cluster DNS).
    config = the(docs, "ValidatingWebhookConfiguration")
    assert RELEASE_NS in config["metadata"]["name"], "cluster-scoped: releases in two namespaces must not share it"
    for hook in config["webhooks"]:
        assert "url" not in hook["clientConfig"]
        called = {k: v for k, v in hook["clientConfig"]["service"].items() if k != "path"}
        assert called == {"name": service["metadata"]["name"], "namespace": RELEASE_NS, "port": 9443}
    policies = {(h["rules"][0]["operations"][0], h["failurePolicy"]) for h in config["webhooks"]}
    assert policies == {("CREATE", "Fail"), ("UPDATE", "Ignore")}
    assert all(h["rules"][0]["resources"] == ["hybridservings"] for h in config["webhooks"])


def test_the_webhook_paths_are_those_kopf_serves_the_handlers_at() -> None:
    """kopf's server routes /<handler id> to that handler alone."""
    from hybridserving.controller import admission

    registered = {h.id: list(h.operations or []) for h in kopf.get_default_registry()._webhooks.get_all_handlers()
                  if h.fn in (admission.check_create, admission.check_update)}
    config = the(render("webhook.enabled=true"), "ValidatingWebhookConfiguration")
    served = {h["clientConfig"]["service"]["path"].removeprefix("/"): h["rules"][0]["operations"]
              for h in config["webhooks"]}
    assert served == registered


def test_the_webhook_certificate_is_the_one_the_pods_serve_and_the_apiserver_trusts() -> None:
    docs = render("webhook.enabled=true")
    (secret,) = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    serving.verify_directly_issued_by(ca)
    service = next(s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-webhook"))
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{service['metadata']['name']}.{RELEASE_NS}.svc" in names.get_values_for_type(x509.DNSName)
    config = the(docs, "ValidatingWebhookConfiguration")
    assert {h["clientConfig"]["caBundle"] for h in config["webhooks"]} == {secret["data"]["ca.crt"]}
    container = operator_container(docs)
    (cert_dir,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--webhook-cert-dir=")]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == cert_dir]
    assert mount["readOnly"] is True
    volumes = the(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert {i["path"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}


def test_the_webhook_covers_only_the_namespaces_the_release_reconciles() -> None:
    def selectors(*sets: str) -> list[dict | None]:
        config = the(render("webhook.enabled=true", *sets), "ValidatingWebhookConfiguration")
        return [h.get("namespaceSelector") for h in config["webhooks"]]

    only = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}]}
    assert selectors("watchNamespaces={a,b}") == [only, only]
    assert selectors() == [{"matchExpressions": [{**only["matchExpressions"][0], "values": [RELEASE_NS]}]}] * 2
    assert selectors("watchAllNamespaces=true") == [None, None]


def test_a_webhook_certificate_of_your_own_is_mounted_and_trusted_and_none_is_rendered() -> None:
    """cert-manager or a GitOps pipeline keeps the certificate: `helm template` renders stay
    the same from one render to the next (the chart's own pair is new on each)."""
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n").decode()
    docs = render("webhook.enabled=true", "webhook.certificate.existingSecret=webhook-cert",
                  f"webhook.certificate.caBundle={ca}")
    assert not [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    volumes = the(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "webhook-cert"
    config = the(docs, "ValidatingWebhookConfiguration")
    assert [h["clientConfig"]["caBundle"] for h in config["webhooks"]] == [ca, ca]
    stable = ("webhook.enabled=true", "webhook.certificate.existingSecret=webhook-cert",
              f"webhook.certificate.caBundle={ca}", "operatorKey.existingSecret=operator-key")
    assert render(*stable) == render(*stable)


def test_a_ca_injector_fills_the_bundle_of_a_certificate_of_your_own() -> None:
    docs = render("webhook.enabled=true", "webhook.certificate.existingSecret=webhook-cert",
                  r"webhook.annotations.cert-manager\.io/inject-ca-from=hs-system/webhook-cert")
    config = the(docs, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "hs-system/webhook-cert"}
    assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])


@pytest.mark.parametrize(("sets", "names"), [
    (("webhook.certificate.existingSecret=webhook-cert",),
     ("webhook.certificate.caBundle", "webhook.annotations", "cert-manager.io/inject-ca-from")),
    (("webhook.certificate.caBundle=QUJD",), ("webhook.certificate.existingSecret",)),
])
def test_a_webhook_certificate_half_given_is_refused_naming_what_is_missing(sets: tuple[str, ...],
                                                                           names: tuple[str, ...]) -> None:
    err = render_error("webhook.enabled=true", *sets)
    assert all(n in err for n in names), err


@pytest.mark.parametrize(("sets", "lease"), [
    ((), "hybridserving-operator"),  # unchanged across upgrades: a renamed Lease means two leaders mid-rollout
    (("leaderElection.leaseName=team-b-operator",), "team-b-operator"),
])
def test_replicas_elect_on_the_named_lease_and_may_touch_no_other(sets: tuple[str, ...], lease: str) -> None:
    """Two releases in one namespace keep apart by Lease name; on one Lease a single replica of
    the two would act and the other release's fleets would go unreconciled."""
    docs = render("replicaCount=2", *sets)
    args = operator_container(docs)["args"]
    assert "--leader-elect" in args and f"--leader-elect-lease={lease}" in args
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    named = [rule for rule in role["rules"] if "resourceNames" in rule]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [lease], "verbs": ["get", "patch"]}]


@pytest.mark.parametrize("sets", [
    (), ("leaderElection.leaseDurationSeconds=30",), ("webhook.enabled=true",),
    ("leaderElection.leaseDurationSeconds=120", "webhook.enabled=true"),
    ("leaderElection.leaseDurationSeconds=300",), ("terminationGracePeriodSeconds=600",),
])
def test_a_stopping_replica_has_time_to_hand_the_lease_over(sets: tuple[str, ...]) -> None:
    """The pod's grace period covers the webhook pause, the wait for work under way and the release
    of the Lease: it waits for a renewal in flight (a read and a write) and then reads and writes
    itself, each call up to its timeout. A replica killed before it released leaves the fleets to
    wait for the Lease to run out. Unset, the grace follows the lease; a longer one stands."""
    docs = render("replicaCount=2", *sets)
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(docs)
    lease = next(float(a.split("=", 1)[1]) for a in container["args"] if a.startswith("--leader-elect-lease-seconds="))
    seconds = lease * 2 / 3
    election = Election(namespace="ops", identity="a", lease_seconds=lease, renew_deadline_seconds=seconds,
                        retry_seconds=min(2.0, lease / 4))
    pause = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep", {}).get("seconds", 0)
    if "webhook.enabled=true" in sets:
        assert pause >= 5  # the webhook Service stops sending reviews before the server closes
    needed = pause + STOP_GRACE_SECONDS + 4 * election.request_timeout_seconds
    assert pod["terminationGracePeriodSeconds"] >= needed
    if "terminationGracePeriodSeconds=600" in sets:
        assert pod["terminationGracePeriodSeconds"] == 600


def test_a_grace_period_too_short_to_hand_the_lease_over_is_refused_naming_what_it_needs() -> None:
    err = render_error("terminationGracePeriodSeconds=30", "webhook.enabled=true")
    assert "terminationGracePeriodSeconds (30)" in err and "at least 41" in err, err
    err = render_error("terminationGracePeriodSeconds=45", "leaderElection.leaseDurationSeconds=30")
    assert "at least 56" in err, err


@pytest.mark.parametrize("sets", [("metrics.port=8081",), ("webhook.enabled=true", "webhook.port=8080")])
def test_ports_that_collide_are_refused(sets: tuple[str, ...]) -> None:
    """The operator binds each of them; two on one port crash-loop the pod."""
    assert "must differ" in render_error(*sets)


def test_resource_quantities_may_be_numbers_in_a_values_file(tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("resources:\n  requests: {cpu: 0.5, memory: 512Mi}\n  limits: {cpu: 2}\n")
    proc = helm(*template_args(()), "-f", str(values))
    assert proc.returncode == 0, proc.stderr
    container = operator_container([d for d in yaml.safe_load_all(proc.stdout) if d])
    assert container["resources"]["requests"]["cpu"] == 0.5


def test_service_names_fit_a_dns_label_whatever_the_release_is_called() -> None:
    """A Service name is a DNS-1035 label (63 characters), shorter than the fullname may be: the
    metrics and webhook Services, and the webhook configuration that calls one, cut the fullname."""
    long = "a" * 60
    docs = render(f"fullnameOverride={long}", "webhook.enabled=true")
    names = {s["metadata"]["name"] for s in of_kind(docs, "Service")}
    assert names == {f"{long[:55]}-metrics", f"{long[:55]}-webhook"}
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", n) for n in names), names
    (config,) = of_kind(docs, "ValidatingWebhookConfiguration")
    assert {w["clientConfig"]["service"]["name"] for w in config["webhooks"]} == {f"{long[:55]}-webhook"}
