"""Install the CRDs on a test cluster and wait until the apiserver serves them."""

from __future__ import annotations

import json
import pathlib

from hybridserving.testing.polling import wait_for

CRDS = pathlib.Path(__file__).resolve().parents[3] / "crds"
NAMES = ("hybridservings.hybridserving.io", "hybridservinginstances.hybridserving.io")


def apply_crds(cluster, timeout: float = 60) -> None:
    """Apply the CRDs and wait until both are Established.

    Polled rather than `kubectl wait`: right after a create the CRD has no status yet, and
    kubectl 1.35's wait then fails at once instead of waiting.
    """
    cluster.kubectl("apply", "--server-side", "-f", str(CRDS))

    def established() -> bool:
        for name in NAMES:
            out = cluster.kubectl("get", "crd", name, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            conditions = (json.loads(out.stdout).get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=timeout, what="CRDs Established")
