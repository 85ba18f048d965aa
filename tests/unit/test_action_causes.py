"""Every planned write carries a typed cause; Events and metrics key on it, never on the wording."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hybridserving.api.v1alpha1 import INSTANCE_KIND
from hybridserving.controller import metrics
from hybridserving.controller import reconcile as rec
from hybridserving.core.actions import Action, Cause
from support.apiserver import NS, MemoryApi
from support.fleets import SPEC, settle



def events(api: MemoryApi) -> list[dict[str, Any]]:
    return [o for (k, _), o in sorted(api.store.items()) if k == "Event"]


def applied(api: MemoryApi, cause: Cause, verb: str = "delete", kind: str = "Pod") -> float:
    value: float = metrics.ACTIONS.labels(verb, kind, cause.value)._value.get()
    return value


def test_an_action_without_a_cause_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a cause"):
        Action("patch", "Pod", "p", (), "no reason")


def test_the_naming_cause_is_the_most_disruptive() -> None:
    both = Action("patch", INSTANCE_KIND, "fleet-0", (Cause.ROLE_SWITCH, Cause.GANG_RESTART), "switch; restart")
    assert both.cause is Cause.GANG_RESTART


def test_a_fresh_fleet_is_built_from_missing_and_scale_up_writes(api: MemoryApi) -> None:
    outcome = rec.reconcile(api, NS, "fleet")
    assert outcome.actions
    assert {a.cause for a in outcome.actions} <= {Cause.MISSING, Cause.SCALE_UP}
    assert {a.cause for a in outcome.actions if a.kind == INSTANCE_KIND} == {Cause.SCALE_UP}


def test_a_rollout_is_caused_so_and_reported_as_a_rolling_update(api: MemoryApi) -> None:
    settle(api)
    before = applied(api, Cause.ROLLOUT)
    newer = copy.deepcopy(SPEC)
    newer["engine"] = {"image": "v2"}
    api.user_apply(newer)
    first = rec.reconcile(api, NS, "fleet")
    instance_patches = [a for a in first.actions if a.kind == INSTANCE_KIND]
    assert instance_patches and all(a.causes == (Cause.ROLLOUT,) for a in instance_patches)
    deletes = [a for a in first.actions if a.verb == "delete" and a.kind == "Pod"]
    assert deletes and {a.cause for a in deletes} == {Cause.ROLLOUT}
    assert applied(api, Cause.ROLLOUT) == before + len(deletes)
    assert "RollingUpdate" in {e["reason"] for e in events(api)}


def test_a_broken_gang_is_restarted_with_that_cause(api: MemoryApi) -> None:
    settle(api)
    api.store[("Pod", "fleet-1-0")]["status"]["phase"] = "Failed"
    outcome = rec.reconcile(api, NS, "fleet")
    restart = next(a for a in outcome.actions if a.kind == INSTANCE_KIND)
    assert restart.causes == (Cause.GANG_RESTART,) and "gang restart" in restart.reason
    assert [a.cause for a in outcome.actions if a.kind == "Pod"] == [Cause.GANG_RESTART]
    assert "GangRestart" in {e["reason"] for e in events(api)}


def test_the_event_reason_follows_the_cause_not_the_words(api: MemoryApi) -> None:
    body = api.store[("HybridServing", "fleet")]
    worded_like_a_rollout = Action("patch", "ConfigMap", "fleet-prefill-config", (Cause.DRIFT,),
                                   "rolling gang restart role switched (words only)")
    rec.post_events(api, body, [worded_like_a_rollout], None)
    rec.post_events(api, body, [Action("patch", "Pod", "fleet-0-0", (Cause.ROLE_SWITCH,), "relabelled")], None)
    assert [e["reason"] for e in events(api)] == ["UpdatedConfigMap", "RoleSwitch"]
