"""The chart's operator replicas: leader election at any count on a Lease Role; rolling updates with 2 or more."""

from __future__ import annotations

from support.chart import of_kind, operator_container, render, the


def test_two_replicas_elect_a_leader_on_a_lease_of_their_own() -> None:
    docs = render("replicaCount=2")
    deployment = the(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    container = operator_container(docs)
    # A standby answers its liveness probe (the operator's /healthz, healthy once the startup handler returns).
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--leader-elect" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "hs-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["hybridserving-operator"],
         "verbs": ["get", "patch"]},
    ]


def test_one_replica_elects_too_so_scaling_to_two_never_has_two_acting() -> None:
    """From 1 to 2 the pods roll (surge first): an old replica without election would act beside
    the new leader until it stops."""
    docs = render()
    assert the(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    args = operator_container(docs)["args"]
    assert "--leader-elect" in args and "--leader-elect-lease=hybridserving-operator" in args
    assert [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
