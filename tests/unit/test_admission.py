"""The webhook's decision: the same issues as `hybridserving validate`, never a blocked delete."""

from __future__ import annotations

import copy
import ssl
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


def test_the_self_signed_certificate_serves_its_host(tmp_path: Path) -> None:
    certfile, keyfile = admission.self_signed("127.0.0.1", tmp_path)
    context = ssl.create_default_context(cafile=str(certfile))
    context.load_cert_chain(str(certfile), str(keyfile))
    assert oct(keyfile.stat().st_mode)[-3:] == "600"
