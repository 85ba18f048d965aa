"""Install the CRDs on a test cluster and wait until the apiserver serves them."""

from __future__ import annotations

import pathlib

from hybridserving.devcluster import Cluster

CRDS = pathlib.Path(__file__).resolve().parents[2] / "crds"
NAMES = ("hybridservings.hybridserving.io", "hybridservinginstances.hybridserving.io")


def apply_crds(cluster: Cluster, timeout: float = 60) -> None:
    """Apply the CRDs and wait until both are Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.wait_established(NAMES, timeout=timeout)
