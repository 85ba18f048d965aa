"""A spec generation that fails validation, or that passes it and cannot be planned, is not applied:
Progressing says so, Ready says what serves."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hybridserving.api.base import FieldError
from hybridserving.api.v1alpha1 import INSTANCE_KIND
from hybridserving.controller import reconcile as rec
from hybridserving.controller.status import PlanFallback, Validation, not_applied_message
from hybridserving.core.layout import LayoutIssue
from hybridserving.core.desired import DesiredState
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle


def test_the_message_counts_the_errors_and_names_the_first() -> None:
    issues = [LayoutIssue("spec.decode.layout.dcp", "dcp must divide tp", "set dcp to 1, 2, 4 or 8", "dcp", "error"),
              LayoutIssue("spec.prefill", "a warning", "none", "w", "warning"),
              LayoutIssue("spec.model.profile", "unknown profile", "name a built-in one", "p", "error")]
    message = not_applied_message(Validation(issues=issues), 7)
    assert message.startswith("generation 7 is not applied: 2 error(s), the first: "
                              "spec.decode.layout.dcp: dcp must divide tp;")
    unparsed = Validation(issues=(), parse_errors=[FieldError("spec.prefill.layout.tp", "not an integer", "int")])
    assert "1 error(s), the first: spec.prefill.layout.tp: not an integer" in not_applied_message(unparsed, 3)
    assert unparsed.message() == "spec.prefill.layout.tp: not an integer"


def test_an_invalid_generation_is_not_progressing_and_the_fleet_stays_ready_on_the_last_applied_spec(
    api: MemoryApi,
) -> None:
    settle(api)
    bad = copy.deepcopy(SPEC)
    bad["decode"]["layout"] = {"tp": 8, "dcp": 3}
    api.user_apply(bad)
    rec.reconcile(api, NS, "fleet")
    progressing = api.condition("Progressing")
    assert progressing["status"] == "False" and progressing["reason"] == "SpecNotApplied"
    assert progressing["observedGeneration"] == 2
    assert progressing["message"].startswith(
        "generation 2 is not applied: 1 error(s), the first: spec.decode.layout.dcp")
    assert "last applied spec" in progressing["message"]
    ready = api.condition("Ready")
    assert ready["status"] == "True" and ready["reason"] == "AllInstancesReady", "what serves still serves"
    assert api.condition("Degraded")["status"] == "False"
    writes = sum(api.writes.values())
    rec.reconcile(api, NS, "fleet")
    assert sum(api.writes.values()) == writes, "an invalid spec left alone writes nothing more"
    api.user_apply(SPEC)
    settle(api)
    assert api.condition("Progressing")["reason"] == "Complete"


def test_under_an_invalid_spec_its_sizing_still_applies_to_the_last_applied_configuration(api: MemoryApi) -> None:
    """An incident's scale-down or pause (kubectl scale and HPA go through the scale subresource,
    which no webhook sees) does not wait for someone to fix an unrelated field."""
    settle(api)
    images = {n: p["spec"]["containers"][0]["image"] for (k, n), p in api.store.items() if k == "Pod"}
    bad = copy.deepcopy(SPEC)
    bad["decode"]["layout"] = {"tp": 8, "dcp": 3}
    bad["decode"]["replicas"] = 1
    bad["rollout"] = {"paused": True}
    api.user_apply(bad)
    outcome = rec.reconcile(api, NS, "fleet")
    deleted = sorted(a.name for a in outcome.applied if a.verb == "delete" and a.kind == INSTANCE_KIND)
    assert deleted == ["fleet-3"], [str(a) for a in outcome.applied]
    assert api.condition("Progressing")["reason"] == "SpecNotApplied"
    settle(api)
    assert sorted(n for k, n in api.store if k == INSTANCE_KIND) == ["fleet-0", "fleet-1", "fleet-2"]
    left = {n: p["spec"]["containers"][0]["image"] for (k, n), p in api.store.items()
            if k == "Pod" and not n.startswith("fleet-3")}
    assert left == {n: i for n, i in images.items() if not n.startswith("fleet-3")}, "the configuration stays"
    assert '"paused": true' in api.store[("ConfigMap", "fleet-applied")]["data"]["spec.json"]

    # Sizing that fails with the applied configuration is not taken: the whole last applied spec holds.
    worse = copy.deepcopy(bad)
    worse["decode"]["replicas"] = 2
    worse["replicas"] = 6  # a total needs role switching, which the applied configuration has off
    api.user_apply(worse)
    outcome = rec.reconcile(api, NS, "fleet")
    assert not [a for a in outcome.applied if a.kind == INSTANCE_KIND], [str(a) for a in outcome.applied]


def test_a_spec_that_does_not_parse_is_not_applied_either(api: MemoryApi) -> None:
    settle(api)
    bad = copy.deepcopy(SPEC)
    bad["prefill"]["layout"] = {"tp": "eight"}
    api.user_apply(bad)
    rec.reconcile(api, NS, "fleet")
    progressing = api.condition("Progressing")
    assert progressing["reason"] == "SpecNotApplied" and "the first: spec.prefill.layout.tp" in progressing["message"]
    assert api.condition("Ready")["status"] == "True"


def test_a_gang_healed_under_an_invalid_spec_shows_in_ready_not_in_progressing(api: MemoryApi) -> None:
    settle(api)
    bad = copy.deepcopy(SPEC)
    bad["model"] = {"path": "x", "profile": "no-such-model"}
    api.user_apply(bad)
    del api.store[("Pod", "fleet-0-0")]
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.applied, "the last applied spec heals the fleet"
    assert api.condition("Progressing")["reason"] == "SpecNotApplied"
    ready = api.condition("Ready")
    assert ready["status"] == "False" and ready["reason"] == "InstancesNotReady"
    settle(api)
    assert api.condition("Ready")["status"] == "True"
    assert api.condition("Progressing")["reason"] == "SpecNotApplied"


def plan_raising_for(monkeypatch: pytest.MonkeyPatch, raises: Any) -> None:
    """The planner raises on the specs `raises` picks, as on an input validation let through."""
    real = rec.planner.plan

    def plan(hs: Any, observed: Any, access: Any = None, last_good_revision: str = "") -> DesiredState:
        if raises(hs.spec):
            raise ValueError("a spec validation let through")
        return real(hs, observed, access, last_good_revision)

    monkeypatch.setattr(rec.planner, "plan", plan)


def test_a_valid_generation_that_cannot_be_planned_is_not_progressing_and_the_fleet_keeps_the_last_applied_spec(
    api: MemoryApi, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settle(api)
    plan_raising_for(monkeypatch, lambda spec: spec.prefill.replicas == 3)
    bigger = copy.deepcopy(SPEC)
    bigger["prefill"]["replicas"] = 3
    api.user_apply(bigger)
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.plan_failure is not None and outcome.plan_failure.fallback is PlanFallback.LAST_APPLIED
    assert api.condition("LayoutValid")["status"] == "True"
    progressing = api.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "PlanFailed"), progressing
    assert progressing["observedGeneration"] == 2
    assert progressing["message"] == ("generation 2 is not applied: it could not be planned (ValueError: a spec "
                                      "validation let through); the fleet keeps running the last applied spec")
    assert api.condition("Ready")["status"] == "True", "what serves still serves"
    assert api.condition("Degraded")["reason"] == "PlanFailed"
    assert not [a for a in outcome.applied if a.kind == INSTANCE_KIND and a.verb == "create"], "no third prefill"
    api.user_apply(SPEC)
    settle(api)
    assert api.condition("Progressing")["reason"] == "Complete"
    assert api.condition("Degraded")["status"] == "False"


def test_a_first_spec_that_cannot_be_planned_creates_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    api = MemoryApi()
    api.user_apply(SPEC)
    plan_raising_for(monkeypatch, lambda spec: True)
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.actions == [] and api.children() == set()
    progressing = api.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "PlanFailed"), progressing
    assert progressing["message"].startswith("generation 1 is not applied: it could not be planned (ValueError: ")
    assert progressing["message"].endswith("; no spec was applied before: nothing was created")
    ready = api.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PlanFailed") and "nothing was created" in ready["message"]
    assert api.condition("Degraded")["reason"] == "PlanFailed"


def test_a_fleet_whose_applied_spec_cannot_be_planned_is_left_as_it_is_and_says_so(
    api: MemoryApi, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settle(api)
    plan_raising_for(monkeypatch, lambda spec: True)
    writes = sum(n for (verb, _), n in api.writes.items() if verb != "patch-status" and verb != "create")
    rec.reconcile(api, NS, "fleet")
    assert sum(n for (verb, _), n in api.writes.items() if verb != "patch-status" and verb != "create") == writes
    progressing = api.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "PlanFailed"), progressing
    assert progressing["message"].endswith("; the fleet is left as it is until its spec can be planned")
    assert "no valid spec has been applied" not in api.condition("Ready")["message"]


def test_an_invalid_generation_whose_last_applied_spec_cannot_be_planned_is_not_applied_for_its_errors(
    api: MemoryApi, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settle(api)
    plan_raising_for(monkeypatch, lambda spec: True)
    bad = copy.deepcopy(SPEC)
    bad["decode"]["layout"] = {"tp": 8, "dcp": 3}
    api.user_apply(bad)
    rec.reconcile(api, NS, "fleet")
    progressing = api.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "SpecNotApplied"), progressing
    assert api.condition("Degraded")["reason"] == "PlanFailed"


def test_a_fleet_whose_last_applied_spec_no_longer_reads_is_left_as_it_is_and_says_so(api: MemoryApi) -> None:
    """After an upgrade whose rules refuse both the current spec and the one applied before it, the
    instances run on untouched, and status does not call the fleet one that never started."""
    settle(api)
    bad = copy.deepcopy(SPEC)
    bad["decode"]["layout"] = {"tp": 8, "dcp": 3}
    api.user_apply(bad)
    applied = api.store[("ConfigMap", "fleet-applied")]
    applied["data"]["spec.json"] = applied["data"]["spec.json"].replace('"tp":', '"tp": "x", "tpp":', 1)
    pods = {key: copy.deepcopy(obj) for key, obj in api.store.items() if key[0] == "Pod"}
    outcome = rec.reconcile(api, NS, "fleet")
    assert not outcome.applied and {k: v for k, v in api.store.items() if k[0] == "Pod"} == pods
    progressing = api.condition("Progressing")
    assert progressing["reason"] == "NoValidSpec" and "last applied one does not pass" in progressing["message"]
    assert "instance(s) are left as they are" in progressing["message"]
    assert "applied yet" not in api.condition("Ready")["message"]
