"""What an update does that the new spec alone does not show (`core.consequences`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from hybridserving.api.v1alpha1 import HybridServingSpec
from hybridserving.core import flags
from hybridserving.core.consequences import of_update

ROOT = Path(__file__).resolve().parents[2]
SWITCHING: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "role-switch.yaml").read_text())["spec"]


def spec(**changes: Any) -> HybridServingSpec:
    out = copy.deepcopy(SWITCHING)
    for key, value in changes.items():
        if isinstance(value, dict):
            out[key] = {**out.get(key, {}), **value}
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return HybridServingSpec.model_validate(out)


def paths(old: HybridServingSpec, new: HybridServingSpec) -> list[str]:
    return [c.path for c in of_update(old, new)]


def test_an_edit_that_changes_nothing_surprising_says_nothing() -> None:
    assert of_update(spec(), spec()) == []
    assert of_update(spec(), spec(roleSwitch={"cooldownSeconds": 900})) == [], "the controller's own setting"
    assert of_update(spec(), spec(engine={"image": "registry.example/sglang:v2"})) == [], "an image rolls, as expected"


def test_a_new_drain_timeout_rolls_every_instance_and_says_why() -> None:
    [c] = of_update(spec(), spec(roleSwitch={"drainTimeoutSeconds": 900}))
    assert c.path == "spec.roleSwitch.drainTimeoutSeconds"
    assert c.message.startswith("300 → 900 rolls every instance") and "terminationGracePeriodSeconds" in c.message
    assert "spec.rollout" in c.fix


def test_turning_in_place_switching_on_or_off_rolls_every_instance() -> None:
    on, off = spec(), spec(roleSwitch={"enabled": False})
    assert flags.in_place_role_switch(on) and not flags.in_place_role_switch(off)
    assert paths(on, off) == ["spec.roleSwitch.enabled"]
    assert of_update(on, off)[0].message.startswith("turning role switching off rolls every instance")
    assert of_update(off, on)[0].message.startswith("turning role switching on rolls every instance")


def test_turning_the_scaler_off_names_the_total_it_left_behind_and_how_to_remove_it() -> None:
    scaling = {"enabled": True, "minReplicas": 2, "maxReplicas": 8}
    before = spec(scaling=scaling, replicas=6)
    [c] = of_update(before, spec(scaling={**scaling, "enabled": False}, replicas=6))
    assert c.path == "spec.replicas" and "stays at the 6 instance(s) it last wrote" in c.message
    assert '"op":"remove","path":"/spec/replicas"' in c.fix
    assert of_update(before, spec(scaling={**scaling, "enabled": False}, replicas=None)) == [], "removed with it"
