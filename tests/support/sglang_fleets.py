"""The fleets the SGLang tooling tests render: every example manifest and every built-in profile
under the layouts it is typically served with. Shared by the parser check (`test_sglang_argv.py`)
and the resolution check (`test_sglang_resolution.py`), so both judge the same command lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hybridserving.api.profiles import PROFILES
from hybridserving.api.v1alpha1 import HybridServing, HybridServingSpec
from hybridserving.api.instance import InstancePorts
from hybridserving.core.layout import errors, validate
from support.patches import overlaid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LEADER = "10.1.2.3"
PORTS = InstancePorts(http=30100, bootstrap=9100, dist_init=20100, engine_info_bootstrap=6800)

# Layouts each profile is typically served with, as patches over plain TP8 on both roles.
# Only those the layout rules accept for a profile are rendered (a DSA model's DCP decode
# needs its capability, a KDA model takes PP instead of prefill CP).
TYPICAL: dict[str, dict[str, Any]] = {
    "tp8": {},
    "attn-dp-decode": {"decode": {"layout": {"attnDp": 8}}},
    "dcp-decode": {"decode": {"layout": {"dcp": 4, "dcpCommBackend": "a2a", "replicateQProj": True}}},
    "dcp-decode-dsa": {"engine": {"capabilities": ["dsa-dcp-pd"]},
                       "decode": {"layout": {"dcp": 8, "replicateQProj": False}}},
    "zigzag-prefill-cp": {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag", "ep": 8,
                                                 "moeA2aBackend": "deepep"}}},
    "interleave-prefill-cp": {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "interleave"}}},
    "reshard": {"engine": {"capabilities": ["dsa-dcp-pd", "prefill-cp-dcp-reshard"]},
                "prefill": {"layout": {"attnCp": 8, "cpStrategy": "interleave", "layerSplit": True}},
                "decode": {"layout": {"dcp": 4, "dcpCommBackend": "ag_rs"}}},
    "pp-prefill": {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}}},
    "ep-multi-node": {"network": {"hostNetwork": True}, "transfer": {"ibDevices": ["mlx5_0", "mlx5_1"]},
                      "prefill": {"nodesPerInstance": 2, "layout": {"tp": 16, "attnDp": 16, "ep": 16,
                                                                     "moeA2aBackend": "deepep"}},
                      "decode": {"nodesPerInstance": 4, "layout": {"tp": 32, "attnDp": 32, "ep": 32,
                                                                    "moeA2aBackend": "mooncake"}}},
    "nic-per-gpu": {"transfer": {"ibDevices": [f"mlx5_{i}" for i in range(8)], "ibDevicesPerGpu": 1}},
    "role-switch": {"roleSwitch": {"enabled": True}, "prefill": {"replicas": 2}},
    "speculative": {"prefill": {"speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1,
                                                "numDraftTokens": 4}},
                    "decode": {"speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1,
                                               "numDraftTokens": 4, "draftModelPath": "org/draft"},
                               "maxRunningRequests": 128, "memFractionStatic": 0.85, "pageSize": 64}},
    "nixl-no-prefix-cache": {"transfer": {"backend": "nixl"}, "prefill": {"prefixCaching": False,
                                                                         "kvCacheDtype": "bf16"}},
    "extra-args": {"model": {"servedModelName": "served"},
                   "engine": {"extraArgs": ["--trust-remote-code", "--cuda-graph-max-bs-decode", "64"]}},
}


def profile_specs() -> dict[str, HybridServingSpec]:
    specs = {}
    for profile in sorted(PROFILES):
        base = {
            "model": {"path": f"org/{profile}", "profile": profile},
            "prefill": {"replicas": 1, "layout": {"tp": 8}},
            "decode": {"replicas": 1, "layout": {"tp": 8}},
        }
        for name, patch in TYPICAL.items():
            spec = HybridServingSpec.model_validate(overlaid(base, patch))
            if not errors(validate(spec)):
                specs[f"{profile}/{name}"] = spec
    return specs


def example_specs() -> dict[str, HybridServingSpec]:
    return {
        f"example/{path.stem}": HybridServing.model_validate(yaml.safe_load(path.read_text())).spec
        for path in sorted(EXAMPLES.glob("*.yaml"))
    }
