"""A spec generation that fails validation is not applied: Progressing says so, Ready says what serves."""

from __future__ import annotations

import copy

from hybridserving.api.base import FieldError
from hybridserving.controller import reconcile as rec
from hybridserving.controller.status import Validation, not_applied_message
from hybridserving.core.layout import LayoutIssue
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
