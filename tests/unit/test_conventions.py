"""Kubernetes conventions on what the operator writes: the recommended app.kubernetes.io labels on
every operand, and conditions that a metav1.Condition reader accepts."""

from __future__ import annotations

import datetime as dt
import re

from hybridserving.api.v1alpha1 import Condition, HybridServingStatus

from support.apiserver import MemoryApi
from support.fleets import SPEC, settle

RECOMMENDED = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
               "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by")
REASON = re.compile(Condition.model_fields["reason"].metadata[-1].pattern)


def settled() -> MemoryApi:
    api = MemoryApi()
    api.user_apply(SPEC)
    settle(api)
    return api


def test_every_operand_carries_the_recommended_labels() -> None:
    api = settled()
    operands = [(kind, o) for (kind, _), o in api.store.items() if kind not in ("Event", "HybridServing")]
    assert {kind for kind, _ in operands} >= {"Pod", "HybridServingInstance", "Service", "ConfigMap", "Deployment"}
    for kind, obj in operands:
        labels = obj["metadata"]["labels"]
        assert all(k in labels for k in RECOMMENDED), (kind, obj["metadata"]["name"], labels)
        assert labels["app.kubernetes.io/instance"] == "fleet"
        assert labels["app.kubernetes.io/managed-by"] == "hybridserving-operator"
    pods = [o for kind, o in operands if kind == "Pod"]
    assert {p["metadata"]["labels"]["app.kubernetes.io/name"] for p in pods} == {"sglang"}
    (router,) = [o for kind, o in operands if kind == "Deployment"]
    template = router["spec"]["template"]["metadata"]["labels"]
    assert template["app.kubernetes.io/name"] == "smg" and template["app.kubernetes.io/component"] == "router"
    # Selectors stay on the operator's own labels (a Deployment's selector is immutable).
    assert not any(k.startswith("app.kubernetes.io/") for k in router["spec"]["selector"]["matchLabels"])


def test_conditions_are_metav1_conditions() -> None:
    status = settled().status()
    assert HybridServingStatus.model_validate(status).conditions
    for c in status["conditions"]:
        assert REASON.fullmatch(c["reason"]), c
        dt.datetime.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
        assert c["observedGeneration"] == 1 and isinstance(c["message"], str)


def test_the_scale_subresources_selector_picks_one_pod_per_instance() -> None:
    """HPA multiplies a per-pod usage ratio by the pods `status.selector` picks and writes the
    product as the fleet's instances: a multi-node instance must count once."""
    api = MemoryApi()
    api.user_apply({**SPEC, "prefill": {"replicas": 2, "nodesPerInstance": 2, "layout": {"tp": 16}}})
    settle(api)
    terms = dict(term.split("=") for term in api.status()["selector"].split(","))
    picked = [name for (kind, name), pod in api.store.items()
              if kind == "Pod" and terms.items() <= pod["metadata"]["labels"].items()]
    assert len([k for k in api.store if k[0] == "Pod"]) == 6, "two 2-node prefill instances, two decode"
    assert sorted(picked) == [f"fleet-{i}-0" for i in range(4)] and api.status()["replicas"] == 4
