"""Checks an engine pod runs before it starts SGLang: the GPUs and RDMA devices its flags need.

A pod scheduled without its GPUs or without the RDMA devices of its transfer backend fails only
minutes later, deep inside weights loading or the first KV transfer, with an error that names
neither. The launcher checks first and reports what is missing in words an operator can act on.
The probes are injectable so the checks are testable on machines with neither.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridserving_engine.argv import flag_value

# Python modules each RDMA transfer backend loads (NIXL loads UCX through its own module).
BACKEND_MODULES = {"mooncake": "mooncake", "nixl": "nixl", "mori": "mori"}
INFINIBAND_CLASS = "/sys/class/infiniband"


def _torch_gpu_count() -> int:
    import torch  # imported here: the launcher itself must start without torch

    count: int = torch.cuda.device_count()
    return count


def _infiniband_devices() -> list[str]:
    try:
        return sorted(os.listdir(INFINIBAND_CLASS))
    except FileNotFoundError:
        return []


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class Probes:
    """How the host is inspected; tests pass fakes."""

    gpu_count: Callable[[], int] = _torch_gpu_count
    rdma_devices: Callable[[], list[str]] = _infiniband_devices
    importable: Callable[[str], bool] = field(default=_importable)


def expected_gpus_per_node(argv: list[str]) -> int:
    """GPUs one node of the instance drives: (tp × pp × dp) / nnodes."""
    tp = int(flag_value(argv, "--tp-size", "1"))
    pp = int(flag_value(argv, "--pp-size", "1"))
    dp = int(flag_value(argv, "--dp-size", "1"))
    nnodes = int(flag_value(argv, "--nnodes", "1"))
    return max(1, tp * pp * dp // nnodes)


def check(argv: list[str], probes: Probes, require_rdma: bool = True) -> list[str]:
    """Every problem that would stop this argv from serving on this host; empty when none."""
    problems: list[str] = []
    want = expected_gpus_per_node(argv)
    try:
        have = probes.gpu_count()
    except Exception as e:  # noqa: BLE001 - any failure to see the GPUs is the finding
        problems.append(f"cannot count GPUs ({type(e).__name__}: {e}); the engine needs {want} per node")
    else:
        if have < want:
            problems.append(
                f"found {have} GPU(s), the engine flags need {want} on this node (tp × pp × dp / nnodes); "
                "check the pod's GPU resource request and the node's device plugin"
            )
    mode = flag_value(argv, "--disaggregation-mode", "null")
    backend = flag_value(argv, "--disaggregation-transfer-backend", "mooncake")
    if mode in ("prefill", "decode") and backend in BACKEND_MODULES:
        module = BACKEND_MODULES[backend]
        if not probes.importable(module):
            problems.append(
                f"transfer backend {backend!r} needs the Python module {module!r}, which is not installed "
                "in the engine image"
            )
        if require_rdma and not probes.rdma_devices():
            problems.append(
                f"no RDMA device under {INFINIBAND_CLASS}; transfer backend {backend!r} moves KV over RDMA. "
                "Request the RDMA resource (spec.transfer.rdmaResourceName/Count) or mount /dev/infiniband"
            )
    return problems
