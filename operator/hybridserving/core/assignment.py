"""Which instances a fleet should have, with which index and which role.

Instances keep their index for life (their name and ports derive from it) and their role
until the role-switch controller moves them; scaling only adds the lowest free indexes and
removes the highest.
"""

from __future__ import annotations

from hybridserving.api.v1alpha1 import ROLES, HybridServingSpec, Role
from hybridserving.contract import ANNOTATION_ROLE
from hybridserving.core.naming import instance_name
from hybridserving.core.observed import Observed, ObservedInstance
from hybridserving.core.switching import ANNOTATION_SWITCH, SwitchState, pinned


def assign_instances(hs_name: str, spec: HybridServingSpec, observed: Observed) -> dict[str, tuple[int, Role]]:
    """Which instances should exist, by name, with their index and role.

    Existing instances keep their role: after a switch the instance's `spec.role` is the
    truth (an edit made outside a switch is not, until it becomes one: `held_role`).
    With role switching on, the controller owns the mix and the spec only sizes the
    fleet (`spec.total_instances()`: `spec.replicas` when set, e.g. by the scale subresource):
    a new instance joins the role furthest below its share of that total (the roles' replicas
    give the shares), a removed one leaves the role furthest above, never taking the instances
    that serve a role (ready, in no switch) below its floor, and of that role one not ready
    first: the total may come from HPA or `kubectl scale`, which name no instance, and removing
    the only ready one of a role could leave it with nothing serving. An instance in no switch
    that is not ready (crash looping, still starting) serves nothing and may always go. A pinned
    one goes only where no unpinned one may, whatever the roles' shares; one mid-switch only where
    nothing else may: it moves capacity the policy asked for, but it serves neither role until it
    lands.
    With role switching off, each role has exactly its replicas, kept from its instances in no
    switch and ready first: a switch still in flight when switching is turned off has its
    instance out of the router, and keeping it, or one that is not ready, in place of one that
    serves could leave the role nothing serving.
    Surplus instances go highest index first; new ones take the lowest free index (an
    instance still being deleted keeps its index until it is gone). Surge instances
    (`rollout.surge_plan`) are not counted: they come and go with a rollout.
    """
    live = sorted((i for i in observed.instances.values() if not i.deleting and not i.surge),
                  key=lambda i: i.spec.index)
    target = role_shares(spec)
    total = spec.total_instances()
    keep = [(i.spec.index, held_role(i, observed) or i.spec.role, i.name) for i in live]
    switching = {i.name for i in live if SwitchState.from_annotation(i.annotations.get(ANNOTATION_SWITCH))}
    ready = {i.name for i in live if _ready(i, observed)}
    if spec.role_switch.enabled:
        floors = {"prefill": spec.role_switch.min_prefill, "decode": spec.role_switch.min_decode}
        pins = {i.name for i in live if pinned(i.annotations)}
        while len(keep) > total:
            counts = {r: sum(1 for k in keep if k[1] == r) for r in ROLES}
            serves = {k[2] for k in keep if k[2] in ready and k[2] not in switching}
            serving = {r: sum(1 for k in keep if k[1] == r and k[2] in serves) for r in ROLES}
            removable = [k for k in keep if k[2] not in serves or serving[k[1]] > floors[k[1]]]
            settled = [k for k in removable if k[2] not in switching]
            pool = [k for k in settled if k[2] not in pins] or settled or removable or keep
            role = max({k[1] for k in pool}, key=lambda r: (counts[r] - target[r], r == "decode"))
            keep.remove(max((k for k in pool if k[1] == role), key=lambda k: (k[2] not in ready, k[0])))
    else:
        keep = sorted(k for role in ROLES for k in sorted(
            (k for k in keep if k[1] == role),
            key=lambda k: (k[2] in switching, k[2] not in ready, k[0]))[: int(target[role])])
    result = {name: (index, role) for index, role, name in keep}
    counts = {r: sum(1 for k in keep if k[1] == r) for r in ROLES}
    taken = {i.spec.index for i in observed.instances.values()}
    free = (index for index in range(1 << 20) if index not in taken)

    def add(role: Role) -> None:
        index = next(free)
        result[instance_name(hs_name, index)] = (index, role)
        counts[role] += 1

    if spec.role_switch.enabled:
        for _ in range(total - len(keep)):
            add(max(ROLES, key=lambda r: (target[r] - counts[r], r == "prefill")))
    else:
        for role in ROLES:
            while counts[role] < target[role]:
                add(role)
    return result


def _ready(instance: ObservedInstance, observed: Observed) -> bool:
    """Every pod of the instance there and ready: what the router and the policy count as serving."""
    pods = [p for p in observed.pods_of(instance.name) if not p.deleting]
    return len(pods) == instance.spec.nodes and all(p.ready for p in pods)


def role_shares(spec: HybridServingSpec) -> dict[Role, float]:
    """Each role's share of the fleet's total: its replicas, scaled to `spec.replicas` when set.

    Without `spec.replicas` the shares are the roles' replicas exactly (whole numbers)."""
    declared = {role: spec.role(role).replicas for role in ROLES}
    if spec.replicas is None:
        return {role: float(n) for role, n in declared.items()}
    whole = sum(declared.values())
    if whole == 0:
        return {role: spec.replicas / len(ROLES) for role in ROLES}
    return {role: spec.replicas * declared[role] / whole for role in ROLES}


def prefill_share(spec: HybridServingSpec) -> float | None:
    """Prefill's share of the declared split (the split a quiet fleet returns to); None when both
    roles declare no replicas."""
    shares = role_shares(spec)
    whole = shares["prefill"] + shares["decode"]
    return shares["prefill"] / whole if whole else None


def held_role(existing: ObservedInstance | None, observed: Observed) -> Role | None:
    """The role an instance's pods keep while its `spec.role` changed outside a switch, or None.

    Only the role-switch controller moves an instance between roles, recording each switch
    on the instance (`core.switching.ANNOTATION_SWITCH`) so that it unroutes and drains the engine
    before the pods follow. A `spec.role` edited by hand carries no such record: following it
    at once would relabel a serving engine under live traffic. The pods keep their role
    until the controller has turned the edit into a switch (controller/switching.py).
    """
    if existing is None or SwitchState.from_annotation(existing.annotations.get(ANNOTATION_SWITCH)) is not None:
        return None
    roles = {p.annotations.get(ANNOTATION_ROLE) for p in observed.pods_of(existing.name) if not p.deleting}
    if len(roles) != 1:
        return None
    role = roles.pop()
    if role in ROLES and role != existing.spec.role:
        return role
    return None
