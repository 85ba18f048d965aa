"""The operator's counters that alerts and dashboards take `increase()` of: every label set exists
from the start, so the first count after an operator start is an increase Prometheus sees."""

from __future__ import annotations

from typing import get_args

from prometheus_client import REGISTRY

from hybridserving.controller import metrics
from hybridserving.controller.switching import _reason_kind
from hybridserving.core.switching import Mode


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


# What the switch controller counts a switch's reason as: an on-call request, or the policy.
REASONS = {_reason_kind("on-call request (annotation hybridserving.io/switch-to)"),
           _reason_kind("decode KV usage 0.93 over 0.85")}


def test_every_finished_switch_has_a_series_before_the_first_one_finishes() -> None:
    # HybridServingRoleSwitchesFailing: increase(...{outcome="Failed"}[1h]) > 0 missed the first
    # Failed switch after each operator start, its series born at 1.
    for reason in REASONS:
        for mode in get_args(Mode):
            assert sample("hybridserving_role_switches_started_total", reason=reason, mode=mode) is not None
            for outcome in ("Succeeded", "Aborted", "Refused", "Failed"):
                assert sample("hybridserving_role_switch_outcomes_total", reason=reason, outcome=outcome,
                              mode=mode) is not None, (reason, outcome, mode)


def test_the_switch_controller_counts_under_the_reasons_that_have_series() -> None:
    assert REASONS == set(get_args(metrics.SwitchReason))
    assert "InProgress" not in metrics.FINISHED_OUTCOMES, "no switch finishes in progress"


def test_every_pass_result_has_a_series_before_the_first_pass() -> None:
    for result in ("ok", "conflict", "error", "gone"):
        assert sample("hybridserving_reconciles_total", result=result) is not None, result
