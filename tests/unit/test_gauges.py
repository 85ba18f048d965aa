"""The per-fleet gauges the alerts read: what they say of a switching instance, and that a deleted
fleet takes its series with it."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY

from hybridserving.api.v1alpha1 import INSTANCE_KIND, KIND
from hybridserving.controller import gauges, handlers, switching
from hybridserving.controller import reconcile as rec
from hybridserving.controller.engines import EngineSample
from hybridserving.controller.kube import Kube
from hybridserving.core.privileges import EnginePolicy
from hybridserving.core.switching import ANNOTATION_SWITCH, STEPS, SwitchState
from support.apiserver import NS, MemoryApi
from support.fleets import OPERATOR_KEY, SPEC, settle


def instance_gauges(instance: str, fleet: str = "fleet") -> tuple[float | None, float | None]:
    labels = {"namespace": NS, "hybridserving": fleet, "hybridserving_instance": instance}
    return (REGISTRY.get_sample_value("hybridserving_instance_switching", labels),
            REGISTRY.get_sample_value("hybridserving_instance_relaunching", labels))


def a_switch(mode: str = "in-place", step: str = "Unroute", now: float = 100.0) -> SwitchState:
    state = SwitchState.start("prefill", "decode", mode, "on-call request", now)  # type: ignore[arg-type]
    return state if step == "Unroute" else state.advance(step, now, launcher_switches=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("step", [s for s in STEPS if s != "Done"])
def test_an_instance_is_switching_in_every_step_whatever_its_phase_says(step: str) -> None:
    # Route and Restore write phase Ready, Restart writes Starting: the phase left them out.
    assert gauges.switch_gauges(a_switch(step=step), False)[0]


def test_an_instance_relaunches_in_the_switch_and_verify_of_a_relaunch_or_of_a_switch_its_launcher_relaunched(
) -> None:
    for mode, launcher_relaunched in (("relaunch", False), ("in-place", True)):
        relaunching = {s for s in STEPS if gauges.switch_gauges(a_switch(mode, s), launcher_relaunched)[1]}
        assert relaunching == {"Switch", "Verify"}, mode
    assert not any(gauges.switch_gauges(a_switch("in-place", s), False)[1] for s in STEPS)
    assert gauges.switch_gauges(None, False) == (False, False)
    assert gauges.switch_gauges(a_switch(step="Done"), True) == (False, False)


def annotate(api: MemoryApi, instance: str, switch: SwitchState | None, phase: str) -> None:
    obj = api.store[(INSTANCE_KIND, instance)]
    annotations = obj["metadata"].setdefault("annotations", {})
    if switch is None:
        annotations.pop(ANNOTATION_SWITCH, None)
    else:
        annotations[ANNOTATION_SWITCH] = switch.to_annotation()
    obj.setdefault("status", {})["phase"] = phase


def prefill_instance(api: MemoryApi) -> str:
    return min(n for (k, n), o in api.store.items() if k == INSTANCE_KIND and o["spec"]["role"] == "prefill")


def test_a_pass_reads_the_switch_from_the_record_not_the_phase(api: MemoryApi) -> None:
    settle(api)
    name = prefill_instance(api)
    annotate(api, name, a_switch(step="Route"), "Ready")
    rec.reconcile(api, NS, "fleet")
    assert instance_gauges(name) == (1.0, 0.0)
    annotate(api, name, a_switch(step="Restart"), "Starting")
    rec.reconcile(api, NS, "fleet")
    assert instance_gauges(name) == (1.0, 0.0)
    annotate(api, name, None, "Ready")
    rec.reconcile(api, NS, "fleet")
    assert instance_gauges(name) == (0.0, 0.0)


class RelaunchingLaunchers:
    """Every leader's launcher relaunches its engine for the switch under way (the engine failed
    the in-place rebuild unsafely, so the launcher restarts it in the new role)."""

    def sample_many(self, targets: dict[str, Any], api_key: str | None = None) -> dict[str, EngineSample]:
        launcher = {"role": "decode", "phase": "Relaunching", "switchCount": 1,
                    "lastSwitch": {"fromRole": "prefill", "toRole": "decode", "outcome": None}}
        return {name: EngineSample(launcher=launcher) for name in targets}


def test_an_in_place_switch_the_launcher_relaunches_counts_as_relaunching() -> None:
    """The phase stays Switching (the switch's mode is in-place); only the tick reads the launcher."""
    api = MemoryApi()
    api.user_apply({**copy.deepcopy(SPEC), "roleSwitch": {"enabled": True, "minPrefill": 1, "minDecode": 1}})
    settle(api)
    name = prefill_instance(api)
    switch = a_switch("in-place", "Switch", time.time())
    annotate(api, name, switch, "Switching")
    api.store[("Pod", f"{name}-0")]["status"]["podIP"] = "10.0.0.1"
    controller = handlers.CountedSwitches(api, RelaunchingLaunchers(), handlers.InFlight(),  # type: ignore[arg-type]
                                          operator_key=OPERATOR_KEY, engine_policy=EnginePolicy())
    controller.tick(NS, "fleet")
    assert SwitchState.from_annotation(
        api.store[(INSTANCE_KIND, name)]["metadata"]["annotations"][ANNOTATION_SWITCH]).step == "Switch"
    rec.reconcile(api, NS, "fleet")
    assert instance_gauges(name) == (1.0, 1.0)
    # The next switch of the instance starts without the note.
    annotate(api, name, a_switch("in-place", "Switch", switch.started + 1), "Switching")
    rec.reconcile(api, NS, "fleet")
    assert instance_gauges(name) == (1.0, 0.0)


def test_a_deleted_fleet_without_children_loses_its_gauges(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet whose spec was never valid has no children: no child's event brings a pass after
    its deletion, and its LayoutValid=False series kept the alert on it firing for good."""
    api = MemoryApi()
    api.user_apply({**copy.deepcopy(SPEC), "prefill": {"replicas": 2, "layout": {"tp": 7}}})
    monkeypatch.setattr(handlers, "reconcile", lambda kube, namespace, name, *_, **__: rec.reconcile(
        api, namespace, name))  # type: ignore[arg-type]
    monkeypatch.setattr(switching.SwitchController, "tick", lambda *_: switching.TickReport())
    monkeypatch.setattr(handlers, "OPTIONS", handlers.Options(kube=Kube(None)))  # type: ignore[arg-type]
    labels = {"namespace": NS, "hybridserving": "fleet", "type": "LayoutValid", "status": "False"}

    async def until(condition: Any) -> None:
        deadline = time.monotonic() + 5
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        await handlers.start(settings=kopf.OperatorSettings())
        try:
            body = api.store[(KIND, "fleet")]
            await handlers.fleet_changed(event={"type": "ADDED", "object": body}, namespace=NS, name="fleet")
            await until(lambda: REGISTRY.get_sample_value("hybridserving_fleet_condition", labels) == 1.0)
            assert not api.children()
            del api.store[(KIND, "fleet")]
            await handlers.fleet_changed(event={"type": "DELETED", "object": body}, namespace=NS, name="fleet")
            await until(lambda: REGISTRY.get_sample_value("hybridserving_fleet_condition", labels) is None)
            await until(lambda: (NS, "fleet") not in handlers.runtime().queue.known)
        finally:
            await handlers.stop()

    asyncio.run(scenario())
