"""Per-fleet gauges the alerts read (charts/hybridserving/templates/prometheusrule.yaml).

Conditions and instance health already live in status, but Prometheus cannot read status; these
gauges mirror what the reconcile just computed, so an alert says what `kubectl get` says. They are
set from values in hand (no API call) and dropped with the fleet, so a deleted fleet leaves no
stale series that would keep an alert firing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridserving.controller import metrics
from hybridserving.core.health import InstanceView
from hybridserving.core.switching import SWITCH_PHASES

STATUSES = ("True", "False", "Unknown")

# (namespace, fleet) -> instance names with series, so that removed instances lose theirs.
_instances: dict[tuple[str, str], set[str]] = {}
_conditions: dict[tuple[str, str], set[str]] = {}


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
        metrics.INSTANCE_SWITCHING.labels(namespace, name, inst).set(1 if v.observed.phase in SWITCH_PHASES else 0)
        metrics.INSTANCE_RELAUNCHING.labels(namespace, name, inst).set(1 if v.observed.phase == "Relaunching" else 0)
    for inst in _instances.get(key, set()) - names:
        _remove_instance(namespace, name, inst)
    _instances[key] = names


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


def _remove_instance(namespace: str, name: str, inst: str) -> None:
    for gauge in (metrics.INSTANCE_RESTARTS, metrics.INSTANCE_CRASH_LOOPING, metrics.INSTANCE_SWITCHING,
                  metrics.INSTANCE_RELAUNCHING):
        try:
            gauge.remove(namespace, name, inst)
        except KeyError:
            pass
