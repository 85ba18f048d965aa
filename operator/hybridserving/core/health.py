"""Instance health: whether a pod belongs to its gang, and what an instance is doing.

`is_stale` is the one rule for "this pod runs another configuration or gang than it should";
instance health (what is serving, what is broken) and the rollout (what to delete) both ask it,
each with its own target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hybridserving.api.v1alpha1 import Role
from hybridserving.contract import ANNOTATION_ROLE
from hybridserving.core import backoff
from hybridserving.core.desired import DesiredState, InstancePlan
from hybridserving.core.naming import ANNOTATION_CONFIG_HASH, split_config_hash
from hybridserving.core.observed import Observed, ObservedInstance, ObservedPod, parse_time
from hybridserving.core.switching import ANNOTATION_SWITCH, SWITCH_PHASES

InstanceState = Literal["Ready", "Starting", "Pending", "Failed", "Missing"]


@dataclass(frozen=True)
class GangTarget:
    """What the pods of an instance should run: role, configuration, gang generation and size."""

    role: Role
    config_hash: str
    restart_generation: int
    nodes: int


def is_stale(pod: ObservedPod, target: GangTarget) -> bool:
    """Whether a pod runs another configuration or an older gang than `target`, or lies outside it.

    A pod whose role differs from the target's is being switched, not stale: only its template
    half must match (the role-flags half follows the switch in place).
    """
    if pod.restart_generation < target.restart_generation or pod.rank >= target.nodes:
        return True
    pod_hash = pod.annotations.get(ANNOTATION_CONFIG_HASH, "")
    if pod.annotations.get(ANNOTATION_ROLE) != target.role:
        return split_config_hash(pod_hash)[0] != split_config_hash(target.config_hash)[0]
    return pod_hash != target.config_hash

@dataclass(frozen=True)
class InstanceView:
    """An existing instance read against its plan: is it serving, current, broken?"""

    plan: InstancePlan
    observed: ObservedInstance
    pods: list[ObservedPod]
    now: float | None = None  # when the pods were read; None: `settled` is `available`
    min_ready: float = 0.0  # rollout.minReadySeconds

    @property
    def by_rank(self) -> dict[int, ObservedPod]:
        return {p.rank: p for p in self.pods}

    @property
    def target(self) -> GangTarget:
        """What the instance's spec says its pods run (pods follow the spec, the spec the plan)."""
        inst = self.observed.spec
        return GangTarget(inst.role, inst.config_hash, inst.restart_generation, inst.nodes)

    def stale(self, pod: ObservedPod) -> bool:
        """Whether a pod runs another configuration or gang than its instance's spec says."""
        return is_stale(pod, self.target)

    @property
    def available(self) -> bool:
        pods = self.by_rank
        return all(
            (p := pods.get(rank)) is not None
            and not p.deleting
            and not self.stale(p)
            and p.phase == "Running"
            and p.ready
            for rank in range(self.observed.spec.nodes)
        )

    @property
    def out_for_switch(self) -> bool:
        """Out of the router for a role switch: from its first step until its record goes (its
        Route or Restore step writes phase Ready and routes it again, and the record goes once the
        router label is on). Its pods may stay ready throughout, but it serves neither role: the
        rollout must not count on it."""
        return self.observed.phase in SWITCH_PHASES or ANNOTATION_SWITCH in self.observed.annotations

    @property
    def settles_in(self) -> float | None:
        """Seconds until the rollout counts this available instance as serving (0: it does),
        None while it is not available or is out for a role switch. Counted from the later of
        its pods' Ready times and the end of its last switch (`status.lastSwitch`): a switch in
        place leaves the pods Ready, and the router registers the instance again only as the
        switch ends. A pod with no Ready time counts as ready long since."""
        if not self.available or self.out_for_switch:
            return None
        since = [p.ready_since for p in self.pods if not p.deleting and p.ready_since is not None]
        switched = parse_time(self.observed.status.get("lastSwitch"))
        if switched is not None:
            since.append(switched)
        if self.now is None or not since:
            return 0.0
        return max(0.0, max(since) + self.min_ready - self.now)

    @property
    def settled(self) -> bool:
        """Available for `minReadySeconds`: what the rollout counts as serving (the router has had
        time to register it)."""
        return self.settles_in == 0.0

    @property
    def switching(self) -> bool:
        """Whether the instance's role changed and its pods have not followed yet."""
        return any(p.annotations.get(ANNOTATION_ROLE) != self.observed.spec.role for p in self.pods)

    @property
    def current(self) -> bool:
        """Whether the instance's spec says what the plan says (pods may still be catching up).

        While a switch is being adopted only the template half counts: the flags half follows
        the role in place, it is no reason to roll.
        """
        inst = self.observed.spec
        if self.switching:
            same = split_config_hash(inst.config_hash)[0] == self.plan.template_hash
        else:
            same = inst.config_hash == self.plan.config_hash
        return same and inst.ports == self.plan.ports and inst.nodes == self.plan.nodes

    def failure(self) -> str | None:
        """Why the gang must restart whole, or None: a pod failed, exited, restarted, or went missing after start.

        Pods of an older configuration or gang are ignored: they are being replaced anyway.
        A multi-node gang whose pods have not started yet is completed, not restarted (the
        operator may have stopped half-way through creating it).
        """
        nodes = self.observed.spec.nodes
        pods = [p for p in self.pods if not self.stale(p)]
        for p in pods:
            if p.phase in ("Failed", "Succeeded") and not p.deleting:
                return f"pod {p.name} {p.phase.lower()}"
        if nodes > 1:
            for p in pods:
                if p.restarts > 0 and not p.deleting:
                    return f"pod {p.name} restarted its engine ({p.restarts}x): the gang's collectives broke"
        present = {p.rank for p in pods if not p.deleting}
        lost = sorted(set(range(nodes)) - present)
        if lost and any(p.started for p in pods if not p.deleting):
            return f"rank(s) {', '.join(map(str, lost))} lost while the rest of the gang ran"
        return None

    @property
    def restarts(self) -> backoff.GangRestarts | None:
        """Its gang's restarts in a row, as the instance records them (`core.backoff`)."""
        return backoff.GangRestarts.from_annotation(self.observed.annotations.get(backoff.ANNOTATION_GANG_RESTARTS))

    @property
    def restart_wait(self) -> float:
        """Seconds a broken gang of this instance waits before its next restart (0: now). Where
        no time was read, nothing is timed: it restarts at once."""
        return 0.0 if self.now is None else backoff.wait(self.restarts, self.now)

    @property
    def backing_off(self) -> bool:
        """Broken, and held from restarting by its back-off."""
        return self.restart_wait > 0 and self.failure() is not None

    @property
    def ready_since_restart(self) -> bool:
        """Whether the gang it runs now (its last restart's) has been Ready: every rank's pod of it
        is Ready, or was since its containers started (an engine that served may pause: a role
        switch, a hiccup). The pods of older gangs tell nothing: they are replaced."""
        pods = {p.rank: p for p in self.pods if not p.deleting and not self.stale(p)}
        return all((p := pods.get(rank)) is not None and (p.ready or p.was_ready)
                   for rank in range(self.observed.spec.nodes))

    @property
    def restart_looping(self) -> bool:
        """Its gang keeps failing: held by its back-off, or in its restart loop
        (`backoff.looping`) and not Ready since the last restart, while that restart starts."""
        return self.backing_off or (backoff.looping(self.restarts) and not self.ready_since_restart)

    @property
    def forgets_restarts_in(self) -> float | None:
        """Seconds until it has served long enough to forget its restarts (0: it has); None while
        it has none to forget, is not serving, or a pod has no Ready time to count from."""
        if self.restarts is None or self.now is None or not self.available:
            return None
        since = [p.ready_since for p in self.pods if not p.deleting]
        if not since or any(t is None for t in since):
            return None
        return backoff.forget_in(max(t for t in since if t is not None), self.now)

    @property
    def back_off_due_in(self) -> float | None:
        """Seconds until its back-off moves (a held restart is due, or its restarts are
        forgotten): when the next pass must look; None: nothing to wait for."""
        if self.backing_off:
            return self.restart_wait
        return self.forgets_restarts_in or None

    @property
    def state(self) -> InstanceState:
        if self.available:
            return "Ready"
        if self.failure():
            return "Failed"
        if any(p.unschedulable for p in self.pods):
            return "Pending"
        if not self.pods:
            return "Missing"
        return "Starting"

    @property
    def recovering(self) -> bool:
        """Down because its pods are being replaced or are starting (not stuck unschedulable)."""
        return not self.available and self.state in ("Starting", "Missing", "Failed")


def view(desired: DesiredState, observed: Observed) -> dict[str, InstanceView]:
    """Existing, planned instances read against their plans."""
    return views_of(desired.instances, observed, desired.spec.rollout.min_ready_seconds)


def views_of(plans: Mapping[str, InstancePlan], observed: Observed, min_ready: float) -> dict[str, InstanceView]:
    """`view` for plans not yet gathered into a DesiredState (the planner reads them while it plans)."""
    return {
        name: InstanceView(p, observed.instances[name], observed.pods_of(name), observed.now, min_ready)
        for name, p in plans.items()
        if name in observed.instances and not observed.instances[name].deleting
    }
