"""The checks of what users add to the pods (templates, weights), beside the layout rules.

One entry point so that `hybridserving validate`, the operator and the admission webhook
report the same issues with the same field paths and fixes.
"""

from __future__ import annotations

from hybridserving.api.v1alpha1 import HybridServingSpec
from hybridserving.contract import CONFIG_DIR, PODINFO_DIR
from hybridserving.core import podtemplate, weights
from hybridserving.core.layout import LayoutIssue

RESERVED_VOLUMES = frozenset({"config", "podinfo", "dshm", weights.VOLUME})
RESERVED_MOUNTS = frozenset({CONFIG_DIR, PODINFO_DIR, "/dev/shm", weights.MOUNT_PATH})


def check(spec: HybridServingSpec) -> list[LayoutIssue]:
    return [
        *podtemplate.check(spec, set(RESERVED_VOLUMES), set(RESERVED_MOUNTS)),
        *weights.check(spec),
    ]
