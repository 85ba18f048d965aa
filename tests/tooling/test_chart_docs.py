"""What docs/install.md and docs/security.md give a platform team to run or apply beside the chart,
checked against the chart and the operator: a command or manifest copied from a page must work
where the page says it does, and must not drift from what it stands next to."""

from __future__ import annotations

import copy
import json
import re
import shlex
from typing import Any

import yaml
from test_chart_static import restricted_violations

from hybridserving.controller import rbac
from hybridserving.controller.__main__ import arguments
from support.chart import CHART, ROOT, helm, kube_version, of_kind, render, the
from support.patches import apply_merge_patch

INSTALL = ROOT / "docs" / "install.md"
SECURITY = ROOT / "docs" / "security.md"


def blocks(page: str, language: str) -> list[str]:
    return re.findall(rf"^ *```{language}\n(.*?)^ *```", page, re.S | re.M)


def manifests(page: str, kind: str) -> list[dict[str, Any]]:
    """The objects of `kind` in the page's YAML blocks."""
    docs = [d for block in blocks(page, "yaml") for d in yaml.safe_load_all(block) if isinstance(d, dict)]
    return [d for d in docs if d.get("kind") == kind]


# --------------------------------------------------------------------------- the upgrade-check pod


def strategic_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`kubectl run --override-type=strategic` on a pod: containers merge by name, other lists are
    replaced (the only merge keys an override of this page's shape meets)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key in ("containers", "initContainers") and isinstance(value, list):
            merged = {c["name"]: c for c in out.get(key, [])}
            for c in value:
                merged[c["name"]] = strategic_merge(merged.get(c["name"], {}), c)
            out[key] = list(merged.values())
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = strategic_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def kubectl_run_pod(argv: list[str]) -> dict[str, Any]:
    """The pod `kubectl run NAME --image=... [--overrides=...] --command -- CMD...` creates: one
    container named like the pod, then the overrides, JSON merge unless told otherwise."""
    assert argv[:2] == ["kubectl", "run"]
    name = argv[2]
    flags = dict(a.split("=", 1) for a in argv[3:argv.index("--")] if a.startswith("--") and "=" in a)
    container = {"name": name, "image": flags["--image"], "command": argv[argv.index("--") + 1:]}
    if "-i" in argv or "--stdin" in argv:
        container |= {"stdin": True, "stdinOnce": True}
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": {"containers": [container], "restartPolicy": flags.get("--restart", "Always")}}
    if "--overrides" in flags:
        overrides = json.loads(flags["--overrides"])
        if flags.get("--override-type", "merge") == "strategic":
            return strategic_merge(pod, overrides)
        assert flags.get("--override-type", "merge") == "merge"
        apply_merge_patch(pod, overrides)
    return pod


def test_the_upgrade_check_pod_is_admitted_where_the_operator_pod_is() -> None:
    """install.md lets the release namespace enforce Pod Security "restricted", and runs the
    upgrade check there as a pod of the operator's ServiceAccount: admission refuses that pod
    unless it carries the restricted fields itself (kubectl run sets none)."""
    page = INSTALL.read_text()
    (command,) = [b for b in blocks(page, "bash") if "kubectl run upgrade-check" in b]
    argv = shlex.split(re.sub(r"<[^>]+>", "IMAGE", command.replace("\\\n", " ")))
    pod = kubectl_run_pod(argv)
    (container,) = pod["spec"]["containers"]
    # A JSON merge of `containers` would replace the generated container, image and command with it.
    assert container["name"] == argv[2] and container["image"] == "IMAGE"
    assert container["command"][:2] == ["hybridserving", "upgrade-check"]
    assert restricted_violations(pod["spec"]) == []
    # Where install.md installs the chart (release hybridserving), with that release's ServiceAccount.
    proc = helm("template", "hybridserving", str(CHART), "--namespace", "hybridserving-system",
                "--kube-version", kube_version())
    assert proc.returncode == 0, proc.stderr
    chart = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert argv[argv.index("-n") + 1] == the(chart, "ServiceAccount")["metadata"]["namespace"]
    assert pod["spec"]["serviceAccountName"] == the(chart, "ServiceAccount")["metadata"]["name"]


def test_the_pod_model_sees_what_a_json_merge_of_containers_loses() -> None:
    argv = ["kubectl", "run", "x", "--image=IMAGE",
            '--overrides={"spec": {"containers": [{"name": "x", "securityContext": {}}]}}', "--command", "--", "c"]
    assert "image" not in kubectl_run_pod(argv)["spec"]["containers"][0]
    assert kubectl_run_pod([*argv[:4], "--override-type=strategic", *argv[4:]])["spec"]["containers"][0][
        "image"] == "IMAGE"


# ------------------------------------------------------------------------ the operator run by hand


def test_the_lease_role_for_an_operator_run_by_hand_is_the_charts() -> None:
    """deploy/operator-rbac.yaml grants no Lease; install.md's Role and RoleBinding fill in for the
    chart's leader-election ones, for deploy/'s ServiceAccount and the operator's default Lease."""
    page = INSTALL.read_text()
    (role,) = [r for r in manifests(page, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    (binding,) = [b for b in manifests(page, "RoleBinding") if b["metadata"]["name"].endswith("-leader-election")]
    (chart_role,) = [r for r in of_kind(render(), "Role") if r["metadata"]["name"].endswith("-leader-election")]
    default_lease = arguments().parse_args([]).leader_elect_lease
    assert role["rules"] == [
        {**rule, "resourceNames": [default_lease]} if "resourceNames" in rule else rule for rule in chart_role["rules"]]
    (deployed_sa,) = [m for m in rbac.manifests() if m["kind"] == "ServiceAccount"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == deployed_sa["metadata"]["namespace"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", **deployed_sa["metadata"]}]


# --------------------------------------------------------------------------------------- RBAC text


def flat(text: str) -> str:
    return " ".join(re.sub(r"^\s*#", "", text, flags=re.M).split()).lower()


def test_no_text_says_the_operator_cannot_read_secrets_while_it_may_patch_them() -> None:
    """The apiserver answers a PATCH with the whole object, so `patch` on Secrets reads them: the
    chart, its values and the pages may say the operator has no get, list or watch on Secrets,
    not that it has no Secret reads."""
    (role,) = [r for r in of_kind(render(), "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    secret_verbs = {v for rule in role["rules"] if "secrets" in rule["resources"] for v in rule["verbs"]}
    assert "patch" in secret_verbs
    texts = [*sorted((CHART / "templates").iterdir()), CHART / "values.yaml", INSTALL, SECURITY]
    for path in texts:
        text = flat(path.read_text())
        for claim in ("no secret reads", "reads no secrets", "never read secrets"):
            assert claim not in text, f"{path.relative_to(ROOT)} says {claim!r}"


def test_the_watch_all_namespaces_value_names_what_it_grants_in_every_namespace() -> None:
    """With watchAllNamespaces the operator's namespaced rules are bound cluster-wide: its
    description in values.yaml must name the grants that reach beyond the fleets (pods, Secret
    patches, Roles and RoleBindings), not only the harmless ones."""
    (fleet,) = [r for r in of_kind(render("watchAllNamespaces=true"), "ClusterRole")
                if r["metadata"]["name"].endswith("-fleet")]
    written = {res for rule in fleet["rules"] if set(rule["verbs"]) & {"create", "patch"}
               for res in rule["resources"]}
    sensitive = {"pods": "pods", "secrets": "secret", "roles": "roles", "rolebindings": "rolebindings"}
    assert set(sensitive) <= written
    values = (CHART / "values.yaml").read_text()
    comment = re.search(r"((?:^#.*\n)+)watchAllNamespaces:", values, re.M)
    assert comment
    text = flat(comment.group(1))
    for resource, word in sensitive.items():
        assert word in text, f"the watchAllNamespaces description does not name {resource}"


# ------------------------------------------------------------------------------------- monitoring


def test_the_scrape_policy_admits_every_port_the_engine_pod_monitor_scrapes() -> None:
    """The fleet's NetworkPolicy admits no scraper; the one security.md gives must open each port
    the chart's engine PodMonitor scrapes, or that job's series (the launcher's, for the alerts)
    go missing where the CNI enforces it."""
    (policy,) = manifests(SECURITY.read_text(), "NetworkPolicy")
    monitors = of_kind(render("monitoring.podMonitors.enabled=true"), "PodMonitor")
    (engines,) = [m for m in monitors if m["spec"]["selector"]["matchLabels"].get("hybridserving.io/component")
                  == "engine"]
    assert policy["spec"]["podSelector"] == engines["spec"]["selector"]
    (rule,) = policy["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {e["port"] for e in engines["spec"]["podMetricsEndpoints"]}
