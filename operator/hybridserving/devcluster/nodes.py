"""Fake GPU node fleet for the local development cluster.

Nodes are plain ``Node`` objects created with a status (capacity and
allocatable); kwok picks them up through the ``type=kwok`` label, marks them
Ready and keeps their heartbeats going. No kubelet runs anywhere.

Topology (all sizes configurable through :class:`FleetSpec`)::

    fabric  (hybridserving.io/rdma-fabric)        nodes_per_fabric  (0 = one fabric)
     └ zone (topology.kubernetes.io/zone)         racks_per_zone racks
        └ rack (hybridserving.io/rack)            nodes_per_rack nodes
           └ NVLink domain (hybridserving.io/nvlink-domain, nvidia.com/gpu.clique)
                                                  nodes_per_nvlink_domain nodes
"""

from __future__ import annotations

import dataclasses
from typing import Any

KWOK_LABEL_KEY = "type"
KWOK_LABEL_VALUE = "kwok"
KWOK_SELECTOR = f"{KWOK_LABEL_KEY}={KWOK_LABEL_VALUE}"

GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/ib"

LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_RACK = "hybridserving.io/rack"
LABEL_NVLINK_DOMAIN = "hybridserving.io/nvlink-domain"
LABEL_GPU_CLIQUE = "nvidia.com/gpu.clique"
LABEL_RDMA_FABRIC = "hybridserving.io/rdma-fabric"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
LABEL_NODE_ROLE = "hybridserving.io/node-role"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"


@dataclasses.dataclass
class FleetSpec:
    """Shape of the fake node fleet."""

    nodes: int = 8
    gpus_per_node: int = 8
    rdma_per_node: int = 8
    cpu: str = "128"
    memory: str = "1Ti"
    ephemeral_storage: str = "4Ti"
    pods: int = 110
    nodes_per_nvlink_domain: int = 2
    nodes_per_rack: int = 4
    racks_per_zone: int = 1
    nodes_per_fabric: int = 0  # 0: a single fabric for the whole fleet
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    region: str = "local-1"
    zone_prefix: str = "local-1"
    name_prefix: str = "gpu-node-"
    cpu_nodes: int = 0  # extra nodes without GPUs or RDMA
    cpu_node_prefix: str = "cpu-node-"
    cpu_node_cpu: str = "64"
    cpu_node_memory: str = "256Gi"
    kubelet_version: str = "fake"  # reported in status.nodeInfo (Cluster sets the server version)

    def validate(self) -> None:
        for field in ("nodes_per_nvlink_domain", "nodes_per_rack", "racks_per_zone"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1")
        if self.nodes < 0 or self.cpu_nodes < 0 or self.nodes_per_fabric < 0:
            raise ValueError("node counts must be >= 0")
        if self.nodes + self.cpu_nodes < 1:
            raise ValueError("the fleet needs at least one node")
        if self.gpus_per_node < 0 or self.rdma_per_node < 0:
            raise ValueError("gpus_per_node and rdma_per_node must be >= 0")


def _zone_name(spec: FleetSpec, index: int) -> str:
    return f"{spec.zone_prefix}{chr(ord('a') + index % 26)}" + (str(index // 26) if index >= 26 else "")


def gpu_node_topology(spec: FleetSpec, i: int, cluster_name: str = "local") -> dict[str, str]:
    """Topology labels of GPU node number ``i``."""
    rack = i // spec.nodes_per_rack
    zone = rack // spec.racks_per_zone
    domain = i // spec.nodes_per_nvlink_domain
    fabric = i // spec.nodes_per_fabric if spec.nodes_per_fabric else 0
    return {
        LABEL_REGION: spec.region,
        LABEL_ZONE: _zone_name(spec, zone),
        LABEL_RACK: f"rack-{rack}",
        LABEL_NVLINK_DOMAIN: f"nvl-{domain}",
        LABEL_GPU_CLIQUE: f"{cluster_name}.{domain}",
        LABEL_RDMA_FABRIC: f"fabric-{fabric}",
    }


def _base_node(name: str, labels: dict[str, str], resources: dict[str, str],
               kubelet_version: str = "fake") -> dict[str, Any]:
    all_labels = {
        KWOK_LABEL_KEY: KWOK_LABEL_VALUE,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": kubelet_version,
                "containerRuntimeVersion": "fake://kwok",
                "kernelVersion": "fake",
                "osImage": "fake",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def node_manifests(spec: FleetSpec, cluster_name: str = "local") -> list[dict[str, Any]]:
    """Node objects (with status) for the whole fleet."""
    spec.validate()
    out: list[dict[str, Any]] = []
    for i in range(spec.nodes):
        name = f"{spec.name_prefix}{i}"
        resources = {
            "cpu": spec.cpu,
            "memory": spec.memory,
            "ephemeral-storage": spec.ephemeral_storage,
            "pods": str(spec.pods),
        }
        labels = {
            LABEL_NODE_ROLE: "gpu",
            LABEL_INSTANCE_TYPE: f"fake-gpu-{spec.gpus_per_node}x",
            **gpu_node_topology(spec, i, cluster_name),
        }
        if spec.gpus_per_node:
            resources[GPU_RESOURCE] = str(spec.gpus_per_node)
            labels[LABEL_GPU_PRODUCT] = spec.gpu_product
            labels[LABEL_GPU_COUNT] = str(spec.gpus_per_node)
            labels[LABEL_GPU_MEMORY] = str(spec.gpu_memory_mib)
        if spec.rdma_per_node:
            resources[RDMA_RESOURCE] = str(spec.rdma_per_node)
        out.append(_base_node(name, labels, resources, spec.kubelet_version))
    for i in range(spec.cpu_nodes):
        name = f"{spec.cpu_node_prefix}{i}"
        resources = {
            "cpu": spec.cpu_node_cpu,
            "memory": spec.cpu_node_memory,
            "ephemeral-storage": spec.ephemeral_storage,
            "pods": str(spec.pods),
        }
        labels = {
            LABEL_NODE_ROLE: "cpu",
            LABEL_INSTANCE_TYPE: "fake-cpu",
            LABEL_REGION: spec.region,
            LABEL_ZONE: _zone_name(spec, 0),
        }
        out.append(_base_node(name, labels, resources, spec.kubelet_version))
    return out


def create_nodes(api_client: Any, spec: FleetSpec, cluster_name: str = "local") -> list[str]:
    """Create (or refresh) the fleet's Node objects; returns their names.

    Existing nodes get their labels and status resources patched, so
    re-running this is harmless.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    names = []
    for manifest in node_manifests(spec, cluster_name):
        name = manifest["metadata"]["name"]
        names.append(name)
        try:
            # The client serialises a manifest dict as it does a V1Node; its signature names only the model.
            created = core.create_node(body=manifest)  # type: ignore[arg-type]
            capacity = (created.status.capacity or {}) if created.status else {}
            if capacity.get("cpu") != manifest["status"]["capacity"]["cpu"]:
                core.patch_node_status(name, {"status": manifest["status"]})
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.patch_node(name, {"metadata": {"labels": manifest["metadata"]["labels"]}})
            core.patch_node_status(name, {"status": {
                "capacity": manifest["status"]["capacity"],
                "allocatable": manifest["status"]["allocatable"],
            }})
    return names
