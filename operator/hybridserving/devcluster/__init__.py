"""Local Kubernetes control plane with fake GPU nodes, for development and tests.

    python -m hybridserving.devcluster up [--name N] [--nodes 8 --gpus-per-node 8 ...]
    python -m hybridserving.devcluster status|env|down [--name N]

Python API::

    from hybridserving.devcluster import Cluster, FleetSpec
    c = Cluster("dev", FleetSpec(nodes=4)).up()
    ... c.kubeconfig ... c.api_client() ...
    c.down()

Binaries are built by ``tools/build-tools.sh``.
"""

from .cluster import (
    COMPONENTS,
    ComponentDied,
    Cluster,
    DevClusterError,
    MissingBinaries,
    bin_dir,
    cache_dir,
    find_binaries,
    list_clusters,
    read_versions,
    reap_orphans,
)
from .nodes import FleetSpec, node_manifests

__all__ = [
    "COMPONENTS",
    "Cluster",
    "ComponentDied",
    "DevClusterError",
    "FleetSpec",
    "MissingBinaries",
    "bin_dir",
    "cache_dir",
    "find_binaries",
    "list_clusters",
    "node_manifests",
    "read_versions",
    "reap_orphans",
]
