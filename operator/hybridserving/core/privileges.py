"""What engine pods may ask of a node, as the platform team allowed it when installing.

Host networking and IPC_LOCK are node-level privileges: the chart makes them explicit
values and the operator refuses a fleet that needs one it was not granted, naming the field,
instead of creating pods that a Pod Security admission would reject one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserving.api.v1alpha1 import HybridServingSpec
from hybridserving.core.layout import LayoutIssue


@dataclass(frozen=True)
class EnginePolicy:
    allow_host_network: bool = True
    allow_ipc_lock: bool = True


def needs_ipc_lock(spec: HybridServingSpec) -> bool:
    """RDMA registers (pins) GPU and host memory, which takes IPC_LOCK."""
    return spec.network.host_network or spec.transfer.rdma_resource_count > 0


def check(spec: HybridServingSpec, policy: EnginePolicy) -> list[LayoutIssue]:
    issues = []
    if spec.network.host_network and not policy.allow_host_network:
        issues.append(LayoutIssue(
            path="spec.network.hostNetwork",
            message="this operator is installed without host networking for engine pods "
            "(chart value enginePolicy.allowHostNetwork: false)",
            fix="set spec.network.hostNetwork: false, or have the platform team set "
            "enginePolicy.allowHostNetwork: true in the operator's Helm values",
            rule="engine-host-network-allowed",
            severity="error",
        ))
    if needs_ipc_lock(spec) and not policy.allow_ipc_lock:
        issues.append(LayoutIssue(
            path="spec.transfer.rdmaResourceCount",
            message="RDMA needs the IPC_LOCK capability, which this operator may not grant "
            "(chart value enginePolicy.allowIpcLock: false)",
            fix="set spec.transfer.rdmaResourceCount: 0 and spec.network.hostNetwork: false (TCP transfer), "
            "or have the platform team set enginePolicy.allowIpcLock: true",
            rule="engine-ipc-lock-allowed",
            severity="error",
        ))
    return issues
