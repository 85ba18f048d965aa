"""Roles for people on the real apiserver, by impersonation.

The chart's view/edit ClusterRoles aggregate into the built-in view/edit roles, the on-call role
grants what the runbooks ask in a fleet's namespace, and the admission policy keeps an instance's spec and labels the
operator's: a user bound only to the on-call role can switch or pin an instance and nothing
else; the operator's ServiceAccount still writes specs.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from hybridserving.devcluster import Cluster, bin_dir
from support.crds import apply_crds
from support.polling import wait_for

from support.chart import CHART

RELEASE, RELEASE_NS = "hs", "hs-system"
OPERATOR = f"system:serviceaccount:{RELEASE_NS}:hs-hybridserving"


def rendered_user_roles() -> list[dict]:
    # Every namespace: the tests use fresh ones (a release binds its guard to the ones it reconciles).
    proc = subprocess.run([str(bin_dir() / "helm"), "template", RELEASE, str(CHART), "-n", RELEASE_NS,
                           "--set", "watchAllNamespaces=true", "--show-only", "templates/userroles.yaml"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def instance(name: str) -> dict:
    return {
        "apiVersion": "hybridserving.io/v1alpha1", "kind": "HybridServingInstance",
        "metadata": {"name": name, "labels": {"hybridserving.io/name": "fleet"}},
        "spec": {"role": "decode", "index": 0, "nodes": 1, "configHash": "abc", "restartGeneration": 0,
                 "ports": {"http": 30000, "bootstrap": 30001, "distInit": 30002, "engineInfoBootstrap": 30003,
                           "launcher": 30004}},
    }


@pytest.fixture(scope="module")
def user_roles(cluster: Cluster):
    apply_crds(cluster)
    docs = rendered_user_roles()
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    # The apiserver enforces a new admission policy once its informer has it (the RBAC authorizer
    # likewise): wait until the guard refuses even the admin a spec change of a probe instance.
    cluster.kubectl("apply", "-n", "default", "-f", "-", input=json.dumps(instance("guard-probe")))
    roles = iter(["prefill", "decode"] * 1000)  # a real change every time (a no-op passes the guard)

    def refused() -> bool:
        change = json.dumps({"spec": {"role": next(roles)}})
        return cluster.kubectl("patch", "hybridservinginstance/guard-probe", "-n", "default", "--type=merge",
                               "-p", change, check=False).returncode != 0

    wait_for(refused, timeout=60, what="the instance guard admission policy in effect")
    cluster.kubectl("delete", "hybridservinginstance/guard-probe", "-n", "default", check=False)
    yield docs
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input="\n---\n".join(json.dumps(d) for d in docs),
                    check=False)


def as_user(cluster: Cluster, user: str, *args: str, groups: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    flags = [f"--as={user}", *(f"--as-group={g}" for g in groups)]
    return cluster.kubectl(*flags, *args, check=False)


def bind(cluster: Cluster, namespace: str, role: str, user: str) -> None:
    cluster.kubectl("create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
                    "-n", namespace)


def can(cluster: Cluster, user: str, verb: str, resource: str, namespace: str) -> bool:
    return as_user(cluster, user, "auth", "can-i", verb, resource, "-n", namespace).stdout.strip() == "yes"


def test_on_call_can_switch_and_pin_an_instance_but_not_change_it(cluster: Cluster, user_roles, namespace, wait_for):
    backing_off = instance("fleet-0")  # a gang in its restart back-off, as the operator annotates it
    backing_off["metadata"]["annotations"] = {"hybridserving.io/gang-restarts": '{"count": 3, "last": 1764842450.0}'}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(backing_off))
    bind(cluster, namespace, "hs-hybridserving-oncall", "alice")
    # The RBAC authorizer sees a new binding once its informer has it.
    wait_for(lambda: can(cluster, "alice", "patch", "hybridservinginstances.hybridserving.io", namespace),
             timeout=30, what="the on-call binding in effect")
    assert can(cluster, "alice", "get", "pods/log", namespace)
    assert not can(cluster, "alice", "delete", "hybridservinginstances.hybridserving.io", namespace)
    hsi = ["hybridservinginstance/fleet-0", "-n", namespace]

    switched = as_user(cluster, "alice", "annotate", *hsi, "hybridserving.io/switch-to=prefill")
    assert switched.returncode == 0, switched.stderr
    pinned = as_user(cluster, "alice", "annotate", *hsi, "hybridserving.io/pinned=true")
    assert pinned.returncode == 0, pinned.stderr
    unpinned = as_user(cluster, "alice", "annotate", *hsi, "hybridserving.io/pinned-")
    assert unpinned.returncode == 0, unpinned.stderr
    got = json.loads(cluster.kubectl("get", *hsi, "-o", "json").stdout)
    assert got["metadata"]["annotations"].get("hybridserving.io/switch-to") == "prefill"
    assert "hybridserving.io/pinned" not in got["metadata"]["annotations"]

    spec = as_user(cluster, "alice", "patch", *hsi, "--type=merge", "-p", '{"spec":{"role":"prefill"}}')
    assert spec.returncode != 0 and "the spec of a HybridServingInstance belongs to the operator" in spec.stderr, spec
    label = as_user(cluster, "alice", "label", *hsi, "hybridserving.io/name=other", "--overwrite")
    assert label.returncode != 0 and "labels of a HybridServingInstance belong to the operator" in label.stderr
    other = as_user(cluster, "alice", "annotate", *hsi, "hybridserving.io/switch=forged")
    assert other.returncode != 0 and "only the hybridserving.io/switch-to and" in other.stderr
    # The runbooks restart a crash-looping gang at once by removing its back-off count; only that.
    forged = as_user(cluster, "alice", "annotate", "--overwrite", *hsi, 'hybridserving.io/gang-restarts={"count": 0}')
    assert forged.returncode != 0 and "only the hybridserving.io/switch-to and" in forged.stderr
    restarted = as_user(cluster, "alice", "annotate", *hsi, "hybridserving.io/gang-restarts-")
    assert restarted.returncode == 0, restarted.stderr
    assert as_user(cluster, "alice", "annotate", *hsi, 'hybridserving.io/gang-restarts={"count": 9}').returncode != 0
    got = json.loads(cluster.kubectl("get", *hsi, "-o", "json").stdout)
    assert as_user(cluster, "alice", "delete", *hsi).returncode != 0
    after = json.loads(cluster.kubectl("get", *hsi, "-o", "json").stdout)
    assert after["spec"] == got["spec"] and after["metadata"]["labels"] == got["metadata"]["labels"]

    # Fleets are read-only to on-call; what a runbook in the fleet's namespace reads is readable
    # (router Deployments, the role ConfigMaps and the applied spec), and a hung gang can be
    # restarted by deleting its leader pod; nothing else is writable.
    assert can(cluster, "alice", "get", "hybridservings.hybridserving.io", namespace)
    assert not can(cluster, "alice", "patch", "hybridservings.hybridserving.io", namespace)
    assert can(cluster, "alice", "get", "pods/log", namespace)
    for verb, resource in (("list", "deployments.apps"), ("get", "deployments.apps"), ("get", "configmaps"),
                           ("list", "events"), ("delete", "pods")):
        assert can(cluster, "alice", verb, resource, namespace), (verb, resource)
    for verb, resource in (("delete", "deployments.apps"), ("patch", "deployments.apps"), ("patch", "configmaps"),
                           ("create", "pods"), ("patch", "pods"), ("get", "secrets"), ("list", "secrets")):
        assert not can(cluster, "alice", verb, resource, namespace), (verb, resource)
    assert not can(cluster, "alice", "delete", "pods", "default")
    assert not can(cluster, "alice", "patch", "hybridservinginstances.hybridserving.io", "default")

    # The operator's ServiceAccount is the one identity that writes instance specs.
    operator = as_user(cluster, OPERATOR, "patch", *hsi, "--type=merge", "-p", '{"spec":{"role":"prefill"}}',
                       groups=("system:masters",))
    assert operator.returncode == 0, operator.stderr


def test_view_and_edit_aggregate_into_the_built_in_roles(cluster: Cluster, user_roles, namespace, wait_for):
    bind(cluster, namespace, "view", "carol")
    bind(cluster, namespace, "edit", "bob")
    wait_for(lambda: can(cluster, "bob", "create", "hybridservings.hybridserving.io", namespace),
             timeout=30, what="edit aggregated")
    assert can(cluster, "carol", "list", "hybridservinginstances.hybridserving.io", namespace)
    assert not can(cluster, "carol", "create", "hybridservings.hybridserving.io", namespace)
    assert not can(cluster, "carol", "patch", "hybridservinginstances.hybridserving.io", namespace)
    assert can(cluster, "bob", "delete", "hybridservings.hybridserving.io", namespace)
    # edit may annotate instances, but their spec stays the operator's for editors too.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(instance("fleet-1")))
    hsi = ["hybridservinginstance/fleet-1", "-n", namespace]
    assert as_user(cluster, "bob", "annotate", *hsi, "hybridserving.io/pinned=true").returncode == 0
    spec = as_user(cluster, "bob", "patch", *hsi, "--type=merge", "-p", '{"spec":{"role":"prefill"}}')
    assert spec.returncode != 0 and "belongs to the operator" in spec.stderr


def test_an_instance_keeps_its_owner_and_finalizers_but_the_garbage_collector_may_orphan_it(
        cluster: Cluster, user_roles, namespace, wait_for):
    """Without its fleet as owner the operator no longer sees an instance and deleting the fleet
    leaves it running; a finalizer nobody removes holds it past that deletion. People bound to
    on-call or edit change neither; the garbage collector may still orphan it (--cascade=orphan)."""
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = json.loads(cluster.kubectl("get", "configmap/owner", "-n", namespace, "-o", "json").stdout)
    owned = instance("fleet-1")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                             "uid": owner["metadata"]["uid"]}]
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(owned))
    bind(cluster, namespace, "hs-hybridserving-oncall", "bob")
    wait_for(lambda: can(cluster, "bob", "patch", "hybridservinginstances.hybridserving.io", namespace),
             timeout=30, what="the on-call binding in effect")
    hsi = ["hybridservinginstance/fleet-1", "-n", namespace]

    disowned = as_user(cluster, "bob", "patch", *hsi, "--type=json",
                       "-p", '[{"op": "remove", "path": "/metadata/ownerReferences"}]')
    assert disowned.returncode != 0 and "ownerReferences of a HybridServingInstance belong" in disowned.stderr
    held = as_user(cluster, "bob", "patch", *hsi, "--type=merge", "-p",
                   '{"metadata": {"finalizers": ["example.com/hold"]}}')
    assert held.returncode != 0 and "finalizers of a HybridServingInstance belong" in held.stderr
    got = json.loads(cluster.kubectl("get", *hsi, "-o", "json").stdout)
    assert got["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert not got["metadata"].get("finalizers")

    # What the garbage collector does for `--cascade=orphan`, as the identity it runs under.
    collector = "system:serviceaccount:kube-system:generic-garbage-collector"
    orphaned = as_user(cluster, collector, "patch", *hsi, "--type=json",
                       "-p", '[{"op": "remove", "path": "/metadata/ownerReferences"}]')
    assert orphaned.returncode == 0, orphaned.stderr
    assert not json.loads(cluster.kubectl("get", *hsi, "-o", "json").stdout)["metadata"].get("ownerReferences")
