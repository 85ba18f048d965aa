"""One writer per status field: the reconcile and the role-switch controller never write over each other.

An instance's `status.phase` belongs to the role-switch controller while a switch is recorded on
the instance (`core.switching.switch_owns_phase`) and to the reconcile otherwise; the reconcile's
instance status write is conditional on the instance it observed, so a switch that starts between
its read and its write keeps the phase it wrote.
"""

from __future__ import annotations

from typing import Any


from hybridserving.api.v1alpha1 import INSTANCE_KIND
from hybridserving.controller import reconcile as rec
from hybridserving.core.switching import ANNOTATION_SWITCH, SwitchState
from support.apiserver import NS, MemoryApi
from support.fleets import settle

INSTANCE = "fleet-0"
UNROUTE_RECORD = SwitchState.start("prefill", "decode", "in-place", "test", 0.0).to_annotation()



def instance(api: MemoryApi) -> dict[str, Any]:
    return api.store[(INSTANCE_KIND, INSTANCE)]


def leader_not_ready(api: MemoryApi) -> None:
    """A fact the reconcile reports (the leader's engine stopped answering /ready)."""
    api.store[("Pod", f"{INSTANCE}-0")]["status"] = {"phase": "Running",
                                                    "conditions": [{"type": "Ready", "status": "False"}]}


def start_switch(api: MemoryApi) -> None:
    """What the role-switch controller writes to start a switch: its record, then the phase it owns."""
    api.patch(INSTANCE_KIND, NS, INSTANCE, {"metadata": {"annotations": {ANNOTATION_SWITCH: UNROUTE_RECORD}}},
              resource_version=instance(api)["metadata"]["resourceVersion"])
    api.patch(INSTANCE_KIND, NS, INSTANCE, {"status": {"phase": "Draining"}}, subresource="status")


def test_a_switch_started_between_the_reconciles_read_and_write_keeps_its_phase() -> None:
    api = MemoryApi()
    api.user_apply({"model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
                    "prefill": {"replicas": 1, "layout": {"tp": 8}}, "decode": {"replicas": 1, "layout": {"tp": 8}},
                    "roleSwitch": {"enabled": True}})
    settle(api)
    assert instance(api)["status"]["phase"] == "Ready"
    leader_not_ready(api)

    patch = api.patch
    raced: list[str] = []

    def racing_patch(kind: str, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        # The switch controller's writes land after the reconcile read the instance, before its status write.
        if (kind, name, kw.get("subresource")) == (INSTANCE_KIND, INSTANCE, "status") and not raced:
            raced.append(name)
            start_switch(api)
        return patch(kind, namespace, name, body, **kw)

    api.patch = racing_patch  # type: ignore[method-assign]
    rec.reconcile(api, NS, "fleet")
    assert raced, "the reconcile had a status change to write"
    assert instance(api)["status"]["phase"] == "Draining", "the reconcile wrote a phase it read before the switch"

    api.patch = patch  # type: ignore[method-assign]
    rec.reconcile(api, NS, "fleet")
    status = instance(api)["status"]
    assert status["phase"] == "Draining", "the switch controller owns the phase while its record is there"
    assert status["readyPods"] == 0, "the reconcile still reports the fields it owns"


def test_the_reconcile_leaves_the_phase_alone_once_a_switch_is_recorded(api: MemoryApi) -> None:
    settle(api)
    # The switch's record landed; the phase it owns is not written yet (two writes, in this order).
    instance(api)["metadata"].setdefault("annotations", {})[ANNOTATION_SWITCH] = UNROUTE_RECORD
    leader_not_ready(api)
    rec.reconcile(api, NS, "fleet")
    status = instance(api)["status"]
    assert status["phase"] == "Ready", "the reconcile wrote the phase during a switch"
    assert status["readyPods"] == 0
    ready = status["conditions"][0]
    assert ready["type"] == "Ready" and ready["status"] == "False" and ready["reason"] == "Starting", (
        "the condition tells what the pods say, not the step the switch wrote")

    # Once the record is gone the reconcile owns the phase again and reports the facts.
    del instance(api)["metadata"]["annotations"][ANNOTATION_SWITCH]
    rec.reconcile(api, NS, "fleet")
    assert instance(api)["status"]["phase"] == "Starting"


def test_the_reconcile_never_sends_the_fields_the_switch_controller_owns(api: MemoryApi) -> None:
    settle(api)
    instance(api)["status"]["lastSwitch"] = "2026-01-01T00:00:00Z"
    api.store[("HybridServing", "fleet")]["status"]["switches"] = [{"instance": INSTANCE}]
    sent: list[dict[str, Any]] = []
    patch = api.patch

    def recording_patch(kind: str, namespace: str, name: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if kw.get("subresource") == "status":
            sent.append(body["status"])
        return patch(kind, namespace, name, body, **kw)

    api.patch = recording_patch  # type: ignore[method-assign]
    leader_not_ready(api)
    api.store[("HybridServing", "fleet")]["metadata"]["generation"] += 1
    rec.reconcile(api, NS, "fleet")
    assert len(sent) >= 2, "both the instance and the fleet status were written"
    assert not any({"lastSwitch", "switches"} & set(s) for s in sent)
    assert instance(api)["status"]["lastSwitch"] == "2026-01-01T00:00:00Z"
    assert api.status()["switches"] == [{"instance": INSTANCE}]


def test_an_instance_has_a_ready_condition_that_follows_its_phase_and_keeps_its_transition_time(
        api: MemoryApi) -> None:
    settle(api)
    ready = {c["type"]: c for c in instance(api)["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Ready"), ready
    settle(api)
    again = {c["type"]: c for c in instance(api)["status"]["conditions"]}["Ready"]
    assert again["lastTransitionTime"] == ready["lastTransitionTime"], "a pass that changes nothing keeps the time"

    leader_not_ready(api)
    rec.reconcile(api, NS, "fleet")  # type: ignore[arg-type]
    down = {c["type"]: c for c in instance(api)["status"]["conditions"]}["Ready"]
    assert down["status"] == "False" and down["reason"] == instance(api)["status"]["phase"] != "Ready", down
    assert "pod(s) ready" in down["message"]

    start_switch(api)
    rec.reconcile(api, NS, "fleet")  # type: ignore[arg-type]
    switching = {c["type"]: c for c in instance(api)["status"]["conditions"]}["Ready"]
    assert (switching["status"], switching["reason"]) == ("False", "Draining"), "the switch's phase, not Ready"
