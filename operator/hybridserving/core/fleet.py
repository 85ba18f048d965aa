"""One assessment of a HybridServing spec: its issues, its shape per role, its capacity.

The CLI's `validate`/`plan`, the admission webhook and the reconcile judge a spec by the same
`check`; computing it in one pure place keeps what a user sees before `kubectl apply`, what the
webhook refuses at it and what the operator follows after it equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridserving.api.v1alpha1 import ROLES, HybridServingSpec, Role
from hybridserving.core import capacity, flags, layout, privileges, surface
from hybridserving.core.layout import LayoutIssue
from hybridserving.core.privileges import EnginePolicy


@dataclass(frozen=True)
class RolePlan:
    role: Role
    instances: int
    nodes_per_instance: int
    gpus_per_pod: int
    world_size: int
    argv_by_rank: list[list[str]]
    capacity: capacity.InstanceCapacity | None

    @property
    def pods(self) -> int:
        return self.instances * self.nodes_per_instance

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "nodesPerInstance": self.nodes_per_instance,
            "pods": self.pods,
            "gpusPerPod": self.gpus_per_pod,
            "gpus": self.gpus,
            "worldSize": self.world_size,
            "argvByNodeRank": self.argv_by_rank,
            "capacity": None if self.capacity is None else self.capacity.to_dict(),
        }


@dataclass(frozen=True)
class FleetAssessment:
    issues: list[LayoutIssue]
    roles: dict[str, RolePlan] = field(default_factory=dict)
    in_place_switch: bool = False
    switch_reasons: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[LayoutIssue]:
        return layout.errors(self.issues)

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def decode_tokens_total(self) -> int:
        plan = self.roles.get("decode")
        if plan is None or plan.capacity is None:
            return 0
        return plan.capacity.tokens * plan.instances

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "issues": [issue_to_dict(i) for i in self.issues],
            "roles": {name: plan.to_dict() for name, plan in self.roles.items()},
            "roleSwitch": {"inPlace": self.in_place_switch, "reasonsNotInPlace": self.switch_reasons},
            "decodeTokensTotal": self.decode_tokens_total,
        }


def issue_to_dict(issue: LayoutIssue) -> dict[str, Any]:
    return {
        "path": issue.path,
        "message": issue.message,
        "fix": issue.fix,
        "rule": issue.rule,
        "severity": issue.severity,
    }


def role_capacity(spec: HybridServingSpec, role: Role) -> capacity.InstanceCapacity:
    """The capacity of one instance of `role` as the fleet's engines run it (with or without a prefix cache)."""
    return capacity.instance_capacity(spec.architecture(), spec.role(role), spec.hardware, role_name=role,
                                      radix_cache=flags.keeps_radix_cache(spec, role))


def _capacity_issue(err: capacity.CapacityError) -> LayoutIssue:
    return LayoutIssue(
        path=f"spec.{err.field_path}", message=err.message, fix=err.fix, rule="capacity-exists", severity="error"
    )


def check(spec: HybridServingSpec, policy: EnginePolicy | None = None) -> list[LayoutIssue]:
    """Every issue that decides whether a fleet may follow `spec`: a spec with an error is refused
    by the webhook, left unplanned by the reconcile and reported invalid by `hybridserving validate`.

    `policy` is what the installation grants engine pods; the CLI, which cannot know the chart's
    values, passes none and leaves the privileges to the cluster.
    """
    return _checked(spec, policy)[0]


def _checked(
    spec: HybridServingSpec, policy: EnginePolicy | None
) -> tuple[list[LayoutIssue], dict[Role, capacity.InstanceCapacity | None]]:
    """The issues and each role's capacity (None: it has none), capacity only once the layout
    rules pass: the capacity arithmetic assumes a layout they admit.

    Capacity errors (weights that do not fit) are issues like any layout rule, so a spec with no
    room for KV is refused before a single pod asks for GPUs.
    """
    issues = [*layout.validate(spec), *surface.check(spec)]
    capacities: dict[Role, capacity.InstanceCapacity | None] = {}
    if not layout.errors(issues):
        for role in ROLES:
            try:
                capacities[role] = role_capacity(spec, role)
            except capacity.CapacityError as err:
                issues.append(_capacity_issue(err))
                capacities[role] = None
    if policy is not None:
        issues += privileges.check(spec, policy)
    return issues, capacities


def assess(spec: HybridServingSpec, leader_host: str = "<leader>", policy: EnginePolicy | None = None
           ) -> FleetAssessment:
    """`check` (with an installation's policy where it is known: `validate --values`) and, where
    the spec is valid enough to plan, each role's plan."""
    issues, capacities = _checked(spec, policy)
    if not capacities:
        return FleetAssessment(issues=issues)
    roles: dict[str, RolePlan] = {}
    for role, cap in capacities.items():
        rs = spec.role(role)
        nodes = rs.nodes_per_instance
        argv = [
            flags.render_argv(spec, role, node_rank=rank, dist_init_addr=leader_host if nodes > 1 else None)
            for rank in range(nodes)
        ]
        roles[role] = RolePlan(
            role=role,
            instances=rs.replicas,
            nodes_per_instance=nodes,
            gpus_per_pod=rs.gpus_per_pod,
            world_size=rs.layout.world_size,
            argv_by_rank=argv,
            capacity=cap,
        )
    in_place, reasons = layout.role_switch_capability(spec)
    return FleetAssessment(issues=issues, roles=roles, in_place_switch=in_place, switch_reasons=reasons)
