"""What a fleet should look like: the plan types the renderer fills and the rollout reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridserving.api.instance import InstancePorts
from hybridserving.api.v1alpha1 import HybridServingSpec, Role
from hybridserving.core.observed import ObjectKey


@dataclass
class InstancePlan:
    """One engine instance as it should be, and the objects it should own."""

    name: str
    index: int
    role: Role
    nodes: int
    ports: InstancePorts
    template_hash: str
    config_hash: str  # the target: template half + role-flags half
    manifest: dict[str, Any]
    pods: list[dict[str, Any]]  # empty until the instance exists (pods need its uid as owner)
    service: dict[str, Any] | None
    workload: dict[str, Any] | None = None  # gang admission (core.gang), owned by the instance
    surge: bool = False  # above its role's replicas while the role rolls (rollout.maxSurge)


@dataclass
class DesiredState:
    """The full object set of one HybridServing."""

    name: str
    namespace: str
    uid: str
    spec: HybridServingSpec
    spec_hash: str
    role_config_hashes: dict[Role, str]
    instances: dict[str, InstancePlan]
    objects: dict[ObjectKey, dict[str, Any]]
    revision_hash: str = ""  # of the spec's configuration (core.revisions)
    last_good_revision: str = ""  # as status last recorded it: never pruned
    pairing_key: str = ""  # what the spec's prefill and decode pair under (core.pairing)
    router_keys: tuple[str, ...] = ()  # the pairing keys that keep a router (rollout.routed_keys)

    @property
    def max_unavailable(self) -> int:
        return self.spec.rollout.max_unavailable

    @property
    def max_surge(self) -> int:
        return self.spec.rollout.max_surge

    @property
    def paused(self) -> bool:
        return self.spec.rollout.paused

    @property
    def canary(self) -> int | None:
        return self.spec.rollout.canary

