"""Per-fleet gauges the alerts read (charts/hybridserving/templates/prometheusrule.yaml).

Conditions and instance health already live in status, but Prometheus cannot read status; these
gauges mirror what the reconcile just computed, so an alert says what `kubectl get` says. They are
set from values in hand (no API call) and dropped with the fleet, so a deleted fleet leaves no
stale series that would keep an alert firing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from hybridserving.controller import metrics
from hybridserving.core.health import InstanceView
from hybridserving.core.switching import ANNOTATION_SWITCH, LauncherView, SwitchState, launcher_relaunched

STATUSES = ("True", "False", "Unknown")
RELAUNCH_STEPS = frozenset({"Switch", "Verify"})
"""The steps in which a relaunch restarts the engine and waits for it to serve (core/switching.py)."""

# (namespace, fleet) -> instance names with series, so that removed instances lose theirs.
_instances: dict[tuple[str, str], set[str]] = {}
_conditions: dict[tuple[str, str], set[str]] = {}
# (namespace, fleet, instance) -> the start of the in-place switch its launcher turned into a
# relaunch, noted by the role-switch ticks (the only readers of launchers) for the passes.
_relaunched: dict[tuple[str, str, str], float] = {}
_relaunched_lock = threading.Lock()


def record(namespace: str, name: str, status: Mapping[str, Any], views: Mapping[str, InstanceView]) -> None:
    """Set the gauges of one fleet from the status just computed and the instances just observed."""
    key = (namespace, name)
    types = set()
    for cond in status.get("conditions") or []:
        types.add(cond["type"])
        _set_condition(namespace, name, cond["type"], cond.get("status"))
    for gone in _conditions.get(key, set()) - types:
        for value in STATUSES:
            metrics.FLEET_CONDITION.remove(namespace, name, gone, value)
    _conditions[key] = types

    names = set(views)
    for inst, v in views.items():
        pods = [p for p in v.pods if not p.deleting]
        metrics.INSTANCE_RESTARTS.labels(namespace, name, inst).set(sum(p.restarts for p in pods))
        metrics.INSTANCE_CRASH_LOOPING.labels(namespace, name, inst).set(1 if any(p.crash_looping for p in pods) else 0)
        switch = SwitchState.from_annotation(v.observed.annotations.get(ANNOTATION_SWITCH))
        with _relaunched_lock:
            noted = _relaunched.get((namespace, name, inst))
            if noted is not None and (switch is None or switch.started != noted):
                del _relaunched[(namespace, name, inst)]  # that switch has ended
        switching, relaunching = switch_gauges(switch, switch is not None and switch.started == noted)
        metrics.INSTANCE_SWITCHING.labels(namespace, name, inst).set(1 if switching else 0)
        metrics.INSTANCE_RELAUNCHING.labels(namespace, name, inst).set(1 if relaunching else 0)
    for inst in _instances.get(key, set()) - names:
        _remove_instance(namespace, name, inst)
    _instances[key] = names


def switch_gauges(switch: SwitchState | None, launcher_relaunched: bool) -> tuple[bool, bool]:
    """Whether an instance is switching, and whether its engine is relaunching, from its switch
    record: the phase says neither, as Route and Restore write Ready, Restart writes Starting, and
    an in-place switch that the launcher turned into a relaunch stays Switching.

    Relaunching covers the Switch and Verify steps (those a relaunch's phase says Relaunching in)
    of a relaunch, or of an in-place switch whose launcher relaunched (`launcher_relaunched`): its
    Switch takes an engine start-up, which the Switch step's timeout gives an hour, not minutes."""
    if switch is None or switch.finished:
        return False, False
    relaunch = switch.mode == "relaunch" or launcher_relaunched
    return True, relaunch and switch.step in RELAUNCH_STEPS


def launcher_seen(namespace: str, name: str, inst: str, switch: SwitchState, launcher: LauncherView | None) -> None:
    """What a role-switch tick read of the launcher of an instance in a switch, for the next pass's
    gauges: the instance's objects keep no trace of an in-place switch become a relaunch. The
    launcher's `/status` is read as the Switch step's timeout reads it."""
    if switch.step in RELAUNCH_STEPS and launcher_relaunched(switch, launcher):
        with _relaunched_lock:
            _relaunched[(namespace, name, inst)] = switch.started


def record_failing(namespace: str, name: str) -> None:
    """Ready Unknown and Degraded True for a fleet whose passes keep failing, whether or not its
    status could be written: the alerts on these series are what is left when the apiserver
    refuses the operator everything."""
    for type_, now_ in (("Ready", "Unknown"), ("Degraded", "True")):
        _set_condition(namespace, name, type_, now_)
        _conditions.setdefault((namespace, name), set()).add(type_)


def _set_condition(namespace: str, name: str, type_: str, status: str | None) -> None:
    """One condition's series: 1 for the status it has, 0 for the others."""
    for value in STATUSES:
        metrics.FLEET_CONDITION.labels(namespace, name, type_, value).set(1 if status == value else 0)


def forget(namespace: str, name: str) -> None:
    """Drop every series of a fleet that is gone."""
    key = (namespace, name)
    for cond in _conditions.pop(key, set()):
        for value in STATUSES:
            metrics.FLEET_CONDITION.remove(namespace, name, cond, value)
    for inst in _instances.pop(key, set()):
        _remove_instance(namespace, name, inst)
    with _relaunched_lock:
        for noted in [k for k in _relaunched if k[:2] == key]:
            del _relaunched[noted]


def _remove_instance(namespace: str, name: str, inst: str) -> None:
    with _relaunched_lock:
        _relaunched.pop((namespace, name, inst), None)
    for gauge in (metrics.INSTANCE_RESTARTS, metrics.INSTANCE_CRASH_LOOPING, metrics.INSTANCE_SWITCHING,
                  metrics.INSTANCE_RELAUNCHING):
        try:
            gauge.remove(namespace, name, inst)
        except KeyError:
            pass
