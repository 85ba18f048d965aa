"""The webhook refuses exactly the specs the reconcile will not follow, and `hybridserving validate` agrees.

A spec the webhook admits but the reconcile refuses leaves a fleet silently on its last valid spec;
one the webhook refuses but the reconcile would follow blocks an edit for nothing. Both judge by
`core.fleet.check`; every shipped example, valid and invalid, goes through each path here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from hybridserving.controller import admission, handlers
from hybridserving.controller.reconcile import validate
from hybridserving.core import fleet
from hybridserving.core.privileges import EnginePolicy
from hybridserving.manifests import ManifestInvalid, load_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples" / "invalid").glob("*.yaml"))
GRANTED = EnginePolicy(allow_host_network=True, allow_ipc_lock=True, allow_node_cache=True)
POLICIES = {"nothing-granted": EnginePolicy(), "privileges-granted": GRANTED,
            "images-restricted": EnginePolicy(allow_host_network=True, allow_ipc_lock=True,
                                              allowed_images=("hybridserving/", "lightseekorg/"))}


def document(path: Path) -> dict[str, Any] | None:
    """The object as the apiserver would hand it on; None for YAML no client can send."""
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return None
    return doc if isinstance(doc, dict) else None


def webhook_admits(doc: dict[str, Any], policy: EnginePolicy, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(handlers.OPTIONS, "engine_policy", policy)
    try:
        admission.review(copy.deepcopy(doc), None, "CREATE", [])
    except kopf.AdmissionError:
        return False
    return True


def reconcile_follows(doc: dict[str, Any], policy: EnginePolicy) -> bool:
    return validate(copy.deepcopy(doc), policy)[1].valid


# Malformed YAML reaches neither.
SENDABLE = [path for path in EXAMPLES if document(path) is not None]


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("path", SENDABLE, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_the_webhook_and_the_reconcile_give_the_same_verdict(
    path: Path, policy: EnginePolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = document(path)
    assert doc is not None
    assert webhook_admits(doc, policy, monkeypatch) is reconcile_follows(doc, policy)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_validate_gives_the_verdict_of_an_operator_granting_the_privileges(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI cannot know the chart's policy: it leaves privileges to the cluster and judges the rest alike.
    Documents it refuses before checking (YAML, JSON types) the apiserver's schema refuses first."""
    try:
        (hs,) = load_file(path)
    except ManifestInvalid:
        return
    doc = document(path)
    assert doc is not None
    verdict = fleet.assess(hs.spec).valid
    assert webhook_admits(doc, GRANTED, monkeypatch) is verdict
    assert reconcile_follows(doc, GRANTED) is verdict
    assert verdict is (path.parent.name != "invalid")


def test_weights_that_leave_no_room_for_kv_are_refused_by_the_reconcile_too() -> None:
    doc = document(ROOT / "examples" / "invalid" / "weights-do-not-fit.yaml")
    assert doc is not None
    _, validation = validate(doc, GRANTED)
    assert [(i.path, i.rule) for i in validation.errors] == [
        ("spec.prefill.layout.tp", "capacity-exists"), ("spec.decode.layout.tp", "capacity-exists")]


def test_privileges_are_judged_only_with_the_installations_policy() -> None:
    (hs,) = load_file(ROOT / "examples" / "kimi-k3.yaml")
    assert fleet.check(hs.spec) == fleet.check(hs.spec, GRANTED)
    refused = fleet.check(hs.spec, EnginePolicy())
    assert "engine-ipc-lock-allowed" in {i.rule for i in refused if i.severity == "error"}
