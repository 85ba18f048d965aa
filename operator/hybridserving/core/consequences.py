"""What an edit of a fleet's spec does that the edit itself does not show.

A spec judged alone can be valid and the step from the one before still surprise: a field
that reads as a controller setting restarts every engine, or a field the edit leaves out keeps
the value someone else wrote. The admission webhook returns these as warnings on the update;
they never refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserving.api.v1alpha1 import HybridServingSpec
from hybridserving.core import flags


@dataclass(frozen=True)
class Consequence:
    """A surprising effect of an update, the field it comes from and what to do about it."""

    path: str
    message: str
    fix: str


REMOVE_REPLICAS = """kubectl patch hybridserving <name> --type=json -p '[{"op":"remove","path":"/spec/replicas"}]'"""


def of_update(old: HybridServingSpec, new: HybridServingSpec) -> list[Consequence]:
    """The consequences of going from `old` to `new` that a reader of `new` would not expect."""
    found: list[Consequence] = []
    if old.role_switch.drain_timeout_seconds != new.role_switch.drain_timeout_seconds:
        found.append(Consequence(
            "spec.roleSwitch.drainTimeoutSeconds",
            f"{old.role_switch.drain_timeout_seconds} → {new.role_switch.drain_timeout_seconds} rolls every "
            "instance: it is each engine's drain timeout and part of its pods' terminationGracePeriodSeconds, "
            "which a running pod cannot change",
            "change it together with a change that rolls anyway, or pace the roll with spec.rollout "
            "(canary, maxUnavailable)"))
    if flags.in_place_role_switch(old) != flags.in_place_role_switch(new):
        turned = "on" if new.role_switch.enabled else "off"
        found.append(Consequence(
            "spec.roleSwitch.enabled",
            f"turning role switching {turned} rolls every instance: it sets or clears the engines' in-place "
            "switch flags (--enable-pd-role-switch), which take effect only at a start",
            "pace the roll with spec.rollout (canary, maxUnavailable)"))
    if old.scaling.enabled and not new.scaling.enabled and new.replicas is not None:
        found.append(Consequence(
            "spec.replicas",
            f"the built-in scaler is off, and the fleet stays at the {new.replicas} instance(s) it last wrote "
            "(kubectl apply leaves a field it did not set), not at prefill.replicas + decode.replicas",
            f"remove spec.replicas: {REMOVE_REPLICAS}, or set it in the manifest"))
    return found
