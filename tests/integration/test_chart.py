"""The Helm chart against a real apiserver: lint, server-side dry run, install under the
"restricted" Pod Security admission, upgrade with a CRD change, uninstall, and RBAC sufficiency.

RBAC sufficiency is shown the way it matters: the operator runs (out of cluster) with a token of
the chart's ServiceAccount and nothing else, reconciles examples/role-switch.yaml into instances
and pods with no 403 in its log, while the same token is refused what the chart must not grant.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from hybridserving.devcluster import Cluster, bin_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hybridserving"
EXAMPLE = ROOT / "examples" / "role-switch.yaml"
GROUP, VERSION = "hybridserving.io", "v1alpha1"
# Fully qualified: `hybridserving` alone is also the CRDs' category, which kubectl expands to both kinds.
FLEETS = f"hybridservings.{GROUP}"
FIELD_MANAGER = "hybridserving-crds"  # the one docs/install.md tells people to use
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}


def helm(cluster: Cluster, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    binary = bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build it with `bash tools/build-tools.sh`", pytrace=False)
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, env=cluster.env(), input=stdin,
                          timeout=180)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_namespace(core_v1, labels: dict[str, str] | None = None) -> str:
    name = f"chart-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    return name


def manifest(cluster: Cluster, release: str, namespace: str) -> list[dict]:
    out = helm(cluster, "get", "manifest", release, "-n", namespace).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def crd_printer_columns(cluster: Cluster, name: str) -> list[str]:
    crd = yaml.safe_load(cluster.kubectl("get", "crd", name, "-o", "yaml").stdout)
    return [c["name"] for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", [])]


def apply_crds_server_side(cluster: Cluster, crd_dir: pathlib.Path) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
                    "-f", str(crd_dir))
    for path in crd_dir.glob("*.yaml"):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


@pytest.fixture
def delete_namespaces(core_v1) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ApiException):
            core_v1.delete_namespace(name)


# ----------------------------------------------------------------------------- lint and dry run


def test_lint(cluster: Cluster) -> None:
    helm(cluster, "lint", str(CHART), "--strict")


def test_rendered_chart_passes_server_side_dry_run(cluster: Cluster, core_v1, delete_namespaces) -> None:
    release_ns = make_namespace(core_v1)
    fleet_ns = make_namespace(core_v1)
    delete_namespaces += [release_ns, fleet_ns]
    rendered = helm(cluster, "template", "hs", str(CHART), "-n", release_ns, "--include-crds",
                    "--set", f"watchNamespaces={{{release_ns},{fleet_ns}}}",
                    "--set", "enginePolicy.allowHostNetwork=true").stdout
    proc = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=rendered)
    applied = proc.stdout.splitlines()
    assert any("deployment.apps/hs-hybridserving" in line for line in applied), proc.stdout
    for kind in ("role", "rolebinding"):  # one of each per watched namespace
        assert sum(line.startswith(f"{kind}.rbac.authorization.k8s.io/hs-hybridserving ") for line in applied) == 2
    # A dry run of a workload under "restricted" reports violations as warnings.
    assert "would violate PodSecurity" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------- lifecycle


def test_install_upgrade_with_crd_change_uninstall(cluster: Cluster, core_v1, apps_v1, wait_for,
                                                   delete_namespaces, tmp_path: pathlib.Path) -> None:
    ns = make_namespace(core_v1, RESTRICTED)
    delete_namespaces.append(ns)
    chart_v1 = tmp_path / "v1" / "hybridserving"
    shutil.copytree(CHART, chart_v1)
    ports = ["--set", f"metrics.port={free_port()}", "--set", f"healthPort={free_port()}"]

    # install: creates (or keeps) the CRDs, the operator Deployment and its RBAC.
    helm(cluster, "install", "hs", str(chart_v1), "-n", ns, *ports)
    deployment = apps_v1.read_namespaced_deployment("hs-hybridserving", ns)
    assert deployment.spec.strategy.type == "Recreate"
    # The namespace enforces "restricted" (a plain pod is refused), so the ReplicaSet's pod is only
    # created if it complies.
    with pytest.raises(ApiException) as refused:
        core_v1.create_namespaced_pod(ns, {"metadata": {"name": "plain"},
                                           "spec": {"containers": [{"name": "c", "image": "x"}]}}, dry_run="All")
    assert refused.value.status == 403 and "violates PodSecurity" in refused.value.body
    selector = "app.kubernetes.io/name=hybridserving,app.kubernetes.io/instance=hs"
    wait_for(lambda: core_v1.list_namespaced_pod(ns, label_selector=selector).items, timeout=90,
             what=f"the operator pod to pass Pod Security admission in {ns} "
                  f"(events: kubectl get events -n {ns})")

    # a HybridServing that must survive the CRD upgrade untouched
    cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
    # Every fleet's engine key derives from the operator key: an upgrade must keep it (`lookup`).
    operator_key = core_v1.read_namespaced_secret("hs-hybridserving-operator-key", ns).data
    assert operator_key
    grace = deployment.spec.template.spec.termination_grace_period_seconds
    assert grace == 45, "unset: the longer of 45 s and what handing the Lease over needs"

    crd_name = FLEETS
    before = crd_printer_columns(cluster, crd_name)
    assert "Upgrade Check" not in before

    # chart v0.1.1: the CRD gains a printer column.
    chart_v2 = tmp_path / "v2" / "hybridserving"
    shutil.copytree(CHART, chart_v2)
    chart_meta = yaml.safe_load((chart_v2 / "Chart.yaml").read_text())
    chart_meta["version"] = "0.1.1"
    (chart_v2 / "Chart.yaml").write_text(yaml.safe_dump(chart_meta))
    crd_path = chart_v2 / "crds" / f"{GROUP}_hybridservings.yaml"
    crd = yaml.safe_load(crd_path.read_text())
    crd["spec"]["versions"][0]["additionalPrinterColumns"].append(
        {"name": "Upgrade Check", "type": "string", "jsonPath": ".spec.model.profile", "priority": 1})
    crd_path.write_text(yaml.safe_dump(crd))

    try:
        # helm upgrade alone never touches crds/: the column does not appear.
        helm(cluster, "upgrade", "hs", str(chart_v2), "-n", ns, *ports)
        assert crd_printer_columns(cluster, crd_name) == before
        assert core_v1.read_namespaced_secret("hs-hybridserving-operator-key", ns).data == operator_key

        # the documented steps: apply the chart's CRDs server-side, then upgrade keeping the values set.
        apply_crds_server_side(cluster, chart_v2 / "crds")
        helm(cluster, "upgrade", "hs", str(chart_v2), "-n", ns, "--reset-then-reuse-values")
        assert crd_printer_columns(cluster, crd_name) == before + ["Upgrade Check"]
        (release,) = yaml.safe_load(helm(cluster, "list", "-n", ns, "-o", "json").stdout)
        assert (release["chart"], release["revision"], release["status"]) == ("hybridserving-0.1.1", "3", "deployed")
        kept = yaml.safe_load(helm(cluster, "get", "values", "hs", "-n", ns, "-o", "yaml").stdout)
        assert f"metrics.port={kept['metrics']['port']}" in ports, "the values set at install are kept"
        assert core_v1.read_namespaced_secret("hs-hybridserving-operator-key", ns).data == operator_key
        fleet = yaml.safe_load(cluster.kubectl("get", FLEETS, "dsv3-flex", "-n", ns, "-o", "yaml").stdout)
        assert fleet["spec"]["roleSwitch"]["enabled"] is True
    finally:
        # back to the committed CRDs, for the tests that follow
        apply_crds_server_side(cluster, CHART / "crds")
    assert crd_printer_columns(cluster, crd_name) == before

    # uninstall: the operator and its RBAC go; the CRDs and the user's HybridServings stay.
    helm(cluster, "uninstall", "hs", "-n", ns, "--wait", "--timeout", "150s")
    assert helm(cluster, "status", "hs", "-n", ns, check=False).returncode != 0
    with pytest.raises(ApiException) as gone:
        apps_v1.read_namespaced_deployment("hs-hybridserving", ns)
    assert gone.value.status == 404
    assert cluster.kubectl("get", "clusterrole", "hs-hybridserving-cluster", check=False).returncode != 0
    assert cluster.kubectl("get", "crd", crd_name, check=False).returncode == 0
    assert cluster.kubectl("get", FLEETS, "dsv3-flex", "-n", ns, check=False).returncode == 0
    cluster.kubectl("delete", FLEETS, "dsv3-flex", "-n", ns, "--wait=false")


# ------------------------------------------------------------------------------ RBAC sufficiency


def token_kubeconfig(cluster: Cluster, token: str, path: pathlib.Path) -> pathlib.Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_path)}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "c", "user": "operator"}}],
    }))
    return path


@contextlib.contextmanager
def operator_process(args: list[str], kubeconfig: pathlib.Path, namespace: str, log: pathlib.Path,
                     operator_key: str) -> Iterator[subprocess.Popen]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": namespace,
           "HYBRIDSERVING_OPERATOR_KEY": operator_key}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hybridserving.controller", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
        assert proc.poll() is None, f"the operator exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def webhook_cert_dir(core_v1, container: dict, namespace: str, deployment: dict, path: pathlib.Path) -> list[str]:
    """The chart's arguments with --webhook-cert-dir at a local copy of the mounted Secret, as the
    kubelet would hand it over."""
    args = list(container["args"])
    (i,) = [i for i, a in enumerate(args) if a.startswith("--webhook-cert-dir=")]
    mount_path = args[i].split("=", 1)[1]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == mount_path]
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    data = core_v1.read_namespaced_secret(volume["secret"]["secretName"], namespace).data
    path.mkdir()
    for item in volume["secret"]["items"]:
        (path / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
    args[i] = f"--webhook-cert-dir={path}"
    return args


def admission_review(port: int, ca: bytes, body: dict) -> dict:
    """What the operator answers the apiserver for a CREATE of `body` (trusting the chart's CA)."""
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False  # called at 127.0.0.1; the certificate names the Service
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": GROUP, "version": VERSION, "kind": "HybridServing"},
        "resource": {"group": GROUP, "version": VERSION, "resource": "hybridservings"},
        "operation": "CREATE", "object": body, "userInfo": {}}}
    request = urllib.request.Request(f"https://127.0.0.1:{port}/create", data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return dict(json.load(response))


@pytest.mark.parametrize("webhook", [False, True], ids=["plain", "webhook"])
def test_service_account_token_is_enough_and_no_more(cluster: Cluster, core_v1, wait_for, delete_namespaces,
                                                     tmp_path: pathlib.Path, webhook: bool) -> None:
    """With the webhook too: the operator serves it with the chart's certificate and no permission
    on webhook configurations (kopf's managed mode would create them, be refused and exit)."""
    release_ns = make_namespace(core_v1)
    fleet_ns = make_namespace(core_v1)
    other_ns = make_namespace(core_v1)
    delete_namespaces += [release_ns, fleet_ns, other_ns]
    webhook_port = free_port()
    values = ["--set", f"watchNamespaces={{{fleet_ns}}}",
              "--set", f"metrics.port={free_port()}", "--set", f"healthPort={free_port()}"]
    if webhook:
        values += ["--set", "webhook.enabled=true", "--set", f"webhook.port={webhook_port}"]
        # The chart's configuration calls a Service this apiserver cannot reach, and creates fail
        # closed: the fleet exists before the release.
        apply_crds_server_side(cluster, CHART / "crds")
        cluster.kubectl("apply", "-n", fleet_ns, "-f", str(EXAMPLE))
    helm(cluster, "install", "hs", str(CHART), "-n", release_ns, *values)
    apply_crds_server_side(cluster, CHART / "crds")  # a no-op unless a CRD predates the chart
    try:
        docs = manifest(cluster, "hs", release_ns)
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = cluster.kubectl("create", "token", sa, "-n", release_ns, "--duration=3600s").stdout.strip()
        kubeconfig = token_kubeconfig(cluster, token, tmp_path / "operator.kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        core = client.CoreV1Api(api)
        admission = client.AdmissionregistrationV1Api(api)

        # what must be refused, with 403
        node = core_v1.list_node().items[0].metadata.name
        refused = {
            "list secrets cluster-wide": lambda: core.list_secret_for_all_namespaces(),
            "list secrets in the watched namespace": lambda: core.list_namespaced_secret(fleet_ns),
            "delete a node": lambda: core.delete_node(node, dry_run="All"),
            "list nodes (the operator does not read them)": lambda: core.list_node(),
            "create a pod outside the watched namespaces": lambda: core.create_namespaced_pod(other_ns, {
                "metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": "x"}]}}, dry_run="All"),
            "list pods outside the watched namespaces": lambda: core.list_namespaced_pod(other_ns),
            "create a validating webhook configuration": lambda: admission.create_validating_webhook_configuration(
                {"metadata": {"name": "x"}}, dry_run="All"),
            "create a mutating webhook configuration": lambda: admission.create_mutating_webhook_configuration(
                {"metadata": {"name": "x"}}, dry_run="All"),
        }
        for what, call in refused.items():
            with pytest.raises(ApiException) as denied:
                call()
            assert denied.value.status == 403, f"{what}: {denied.value.status}"
        # what it needs: the CRDs cluster-wide, pods in the watched namespace
        client.ApiextensionsV1Api(api).list_custom_resource_definition()
        core.list_namespaced_pod(fleet_ns)

        # The operator with exactly the chart's arguments and only that token.
        args = container["args"]
        if webhook:
            args = webhook_cert_dir(core_v1, container, release_ns, deployment, tmp_path / "webhook")
        else:
            cluster.kubectl("apply", "-n", fleet_ns, "-f", str(EXAMPLE))
        custom = client.CustomObjectsApi(api)
        log = tmp_path / "operator.log"
        # The operator's key, as the kubelet hands it over from the chart's Secret (secretKeyRef).
        key_ref = {e["name"]: e for e in container["env"]}["HYBRIDSERVING_OPERATOR_KEY"]["valueFrom"]["secretKeyRef"]
        operator_key = base64.b64decode(core_v1.read_namespaced_secret(key_ref["name"], release_ns)
                                        .data[key_ref["key"]]).decode()
        with operator_process(args, kubeconfig, release_ns, log, operator_key) as operator:
            def running_and(check):
                def probe():
                    if operator.poll() is not None:
                        pytest.fail(f"the operator exited ({operator.returncode}):\n{log.read_text()[-4000:]}")
                    return check()
                return probe

            def all_instances() -> list[dict] | None:
                """2 prefill + 2 decode in the example; the operator creates them one write at a time."""
                listed = custom.list_namespaced_custom_object(GROUP, VERSION, fleet_ns, "hybridservinginstances")
                items = listed["items"]
                return items if len(items) >= 4 else None

            instances = wait_for(running_and(all_instances), timeout=120,
                                 what=f"the example's four HybridServingInstances in {fleet_ns}; operator log: {log}")
            pods = wait_for(running_and(lambda: core.list_namespaced_pod(fleet_ns).items), timeout=120,
                            what=f"engine pods in {fleet_ns}; operator log: {log}")
            assert len(instances) >= 4
            assert pods
            # `upgrade-check` in a pod with the operator's account reads all it needs (docs/install.md).
            check = subprocess.run([sys.executable, "-m", "hybridserving.cli", "upgrade-check", "-n", fleet_ns,
                                    "-o", "json", "--kubeconfig", str(kubeconfig)],
                                   capture_output=True, text=True, timeout=60, check=False)
            assert check.returncode == 0, check.stdout + check.stderr
            assert "CRDs:" not in check.stderr, check.stderr  # read, and the chart's: nothing to say
            [preview] = json.loads(check.stdout)
            assert (preview["name"], len(preview["instances"])) == ("dsv3-flex", 4), check.stdout
            if webhook:
                ca = base64.b64decode([d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"][0]
                                      ["webhooks"][0]["clientConfig"]["caBundle"])
                answer = admission_review(webhook_port, ca, yaml.safe_load(EXAMPLE.read_text()))
                assert answer["response"]["allowed"] is True, answer
            # The fleet's engine key was written with the chart's RBAC, which cannot read it back.
            assert core_v1.read_namespaced_secret("dsv3-flex-engine-key", fleet_ns).data["api-key"]
            with pytest.raises(ApiException) as denied:
                core.read_namespaced_secret("dsv3-flex-engine-key", fleet_ns)
            assert denied.value.status == 403
            cluster.kubectl("delete", FLEETS, "dsv3-flex", "-n", fleet_ns, "--timeout=60s")
        text = log.read_text()
        assert "Forbidden" not in text, text[-4000:]
        if webhook:
            # The configuration and its certificate are the release's: an upgrade keeps the
            # certificate, an uninstall removes both (no configuration left refusing creates).
            secret = "hs-hybridserving-webhook-tls"
            before = core_v1.read_namespaced_secret(secret, release_ns).data
            helm(cluster, "upgrade", "hs", str(CHART), "-n", release_ns, "--reuse-values")
            assert core_v1.read_namespaced_secret(secret, release_ns).data == before
            (configuration,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
            helm(cluster, "uninstall", "hs", "-n", release_ns, "--wait", "--timeout", "60s")
            assert cluster.kubectl("get", "validatingwebhookconfiguration", configuration, check=False).returncode != 0
            assert cluster.kubectl("get", "secret", secret, "-n", release_ns, check=False).returncode != 0
    finally:
        cluster.kubectl("delete", FLEETS, "--all", "-n", fleet_ns, "--wait=false", check=False)
        helm(cluster, "uninstall", "hs", "-n", release_ns, check=False)


def test_a_fleet_the_operator_can_no_longer_observe_stops_saying_ready(cluster: Cluster, core_v1, wait_for,
                                                                         delete_namespaces,
                                                                         tmp_path: pathlib.Path) -> None:
    """An RBAC edit takes the chart's `list pods` away: every pass then fails before it can write
    status, which used to leave the fleet saying what it said before. Within about a minute and a
    half Ready is Unknown and Degraded names the 403; giving the permission back makes the next pass
    say what it observes again. (The operator relists every 3 s here, so the cache asks the apiserver
    at once rather than after 10 minutes.)"""
    release_ns = make_namespace(core_v1)
    fleet_ns = make_namespace(core_v1)
    delete_namespaces += [release_ns, fleet_ns]
    helm(cluster, "install", "hs", str(CHART), "-n", release_ns, "--set", f"watchNamespaces={{{fleet_ns}}}",
         "--set", f"metrics.port={free_port()}", "--set", f"healthPort={free_port()}")
    try:
        docs = manifest(cluster, "hs", release_ns)
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"].get("namespace") == fleet_ns]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = cluster.kubectl("create", "token", sa, "-n", release_ns, "--duration=3600s").stdout.strip()
        kubeconfig = token_kubeconfig(cluster, token, tmp_path / "operator.kubeconfig")
        key_ref = {e["name"]: e for e in container["env"]}["HYBRIDSERVING_OPERATOR_KEY"]["valueFrom"]["secretKeyRef"]
        operator_key = base64.b64decode(core_v1.read_namespaced_secret(key_ref["name"], release_ns)
                                        .data[key_ref["key"]]).decode()
        cluster.kubectl("apply", "-n", fleet_ns, "-f", str(EXAMPLE))
        log = tmp_path / "operator.log"
        with operator_process([*container["args"], "--relist-seconds=3"], kubeconfig, release_ns, log,
                              operator_key) as operator:
            def condition(type_: str) -> dict:
                if operator.poll() is not None:
                    pytest.fail(f"the operator exited ({operator.returncode}):\n{log.read_text()[-4000:]}")
                body = json.loads(cluster.kubectl("get", FLEETS, "dsv3-flex", "-n", fleet_ns, "-o", "json").stdout)
                return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

            first = wait_for(lambda: condition("Ready") or None, timeout=120,
                             what=f"the fleet's first status; operator log: {log}")
            assert first["reason"] != "ReconcileFailed"

            without = json.loads(json.dumps(role))
            for rule in without["rules"]:
                rule["resources"] = [r for r in rule["resources"] if r != "pods"]
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(without))
            cluster.kubectl("annotate", FLEETS, "dsv3-flex", "-n", fleet_ns, "poke=1")  # a pass now, not at resync
            failing = wait_for(lambda: (c := condition("Ready")).get("reason") == "ReconcileFailed" and c, timeout=180,
                               interval=2, what=f"Ready turning Unknown; operator log: {log}")
            assert failing["status"] == "Unknown"
            assert "reconcile passes in a row failed" in failing["message"], failing
            assert "403" in failing["message"] and '"pods"' in failing["message"], failing
            degraded = condition("Degraded")
            assert (degraded["status"], degraded["reason"]) == ("True", "ReconcileFailed")
            events = json.loads(cluster.kubectl("get", "events", "-n", fleet_ns, "-o", "json",
                                                "--field-selector", "reason=ReconcileFailed").stdout)["items"]
            assert len(events) == 1 and events[0]["type"] == "Warning"

            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
            wait_for(lambda: condition("Ready").get("reason") != "ReconcileFailed", timeout=240, interval=2,
                     what=f"status observed again once the permission is back; operator log: {log}")
            assert condition("Degraded").get("reason") != "ReconcileFailed"
    finally:
        cluster.kubectl("delete", FLEETS, "--all", "-n", fleet_ns, "--wait=false", check=False)
        helm(cluster, "uninstall", "hs", "-n", release_ns, check=False)
