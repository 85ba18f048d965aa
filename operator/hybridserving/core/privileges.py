"""What engine pods may ask of a node, as the platform team allowed it when installing.

Host networking and IPC_LOCK are node-level privileges: the chart makes them explicit
values and the operator refuses a fleet that needs one it was not granted, naming the field,
instead of creating pods that a Pod Security admission would reject one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE, DEFAULT_ROUTER_IMAGE, HybridServing, HybridServingSpec
from hybridserving.core.layout import LayoutIssue


@dataclass(frozen=True)
class EnginePolicy:
    """What the platform team granted engine pods; nothing unless granted.

    `allowed_images` are prefixes an engine or router image must start with (empty: any);
    `operator_namespace` is where the operator's pods run, the one namespace outside the
    fleet's whose operator pods may reach the engines; `default_image` and `default_router_image`
    are the engine and router images of a fleet that names none.
    """

    allow_host_network: bool = False
    allow_ipc_lock: bool = False
    allowed_images: tuple[str, ...] = ()
    operator_namespace: str | None = None
    default_image: str = DEFAULT_ENGINE_IMAGE
    default_router_image: str = DEFAULT_ROUTER_IMAGE


def with_default_image(hs: HybridServing, policy: EnginePolicy) -> HybridServing:
    """The fleet with the operator's default engine and router images where it names none, so that
    what is planned, hashed and checked against `allowed_images` is the image that will run."""
    update: dict[str, object] = {}
    if hs.spec.engine.image is None:
        update["engine"] = hs.spec.engine.model_copy(update={"image": policy.default_image})
    if hs.spec.router.image is None:
        update["router"] = hs.spec.router.model_copy(update={"image": policy.default_router_image})
    return hs.model_copy(update={"spec": hs.spec.model_copy(update=update)}) if update else hs


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
    for path, image in (("spec.engine.image", spec.engine_image()), ("spec.router.image", spec.router_image())):
        if policy.allowed_images and not any(image.startswith(prefix) for prefix in policy.allowed_images):
            issues.append(LayoutIssue(
                path=path,
                message=f"image {image!r} is not from a registry or repository this operator may run "
                f"(chart value enginePolicy.allowedImages: {', '.join(policy.allowed_images)})",
                fix="use an image under one of the allowed prefixes, or have the platform team add its "
                "prefix to enginePolicy.allowedImages",
                rule="image-allowed",
                severity="error",
            ))
    return issues
