"""Layout rules: each rule fires on a spec that breaks it, names the field and a fix, and stays
quiet on the nearest spec that keeps it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridserving.api.v1alpha1 import HybridServing, HybridServingSpec
from hybridserving.core.layout import (
    RULES,
    LayoutIssue,
    applies,
    engine_version,
    errors,
    role_switch_capability,
    validate,
)
from hybridserving.core import resolution
from support.patches import overlaid

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# A fix starts with what to do.
FIX_VERBS = {"set", "use", "remove", "choose", "give", "lower", "run", "accept", "check"}

BASE: dict[str, Any] = {
    "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
    "hardware": {"gpusPerNode": 8},
    "prefill": {"replicas": 1, "layout": {"tp": 8}},
    "decode": {"replicas": 1, "layout": {"tp": 8}},
}

CUSTOM_ARCH = {
    "hfArchitecture": "CustomMlaForCausalLM",
    "attention": "mla",
    "layers": 40,
    "mlaLayers": 40,
    "kvBytesPerTokenLayer": 576,
    "weightBytes": 100_000_000_000,
    "attentionHeads": 20,
}


def make(patch: dict[str, Any] | None = None) -> HybridServingSpec:
    return HybridServingSpec.model_validate(overlaid(BASE, patch or {}))


def _model(profile: str) -> dict[str, Any]:
    return {"model": {"path": f"org/{profile}", "profile": profile}}


GLM = _model("glm-5.3")
KIMI = _model("kimi-k3")
V32 = _model("deepseek-v3.2")
RDMA = {"transfer": {"rdmaResourceCount": 8}}
# An EAGLE draft tree four wide: DeepSeek V3 pages it on an H200 (fa3, page size 1), not on a B200
# (trtllm_mla, page size 64).
TREE_DRAFT = {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 4, "numDraftTokens": 8}
DSA_SPLIT = overlaid(GLM, {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "interleave", "layerSplit": True}}})
SWITCH = {"roleSwitch": {"enabled": True}}

# rule id -> (spec that breaks it, nearest spec that keeps it, path of the issue)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "model-profile-known": ({"model": {"profile": "llama-9"}}, {}, "spec.model.profile"),
    "engine-version-supported": ({"engine": {"sglangVersion": "0.5.22"}}, {"engine": {"sglangVersion": "0.5.23"}},
                                 "spec.engine.sglangVersion"),
    "engine-version-verified": ({"engine": {"sglangVersion": "0.6.0"}}, {"engine": {"sglangVersion": "0.5.23"}},
                                "spec.engine.sglangVersion"),
    "dcp-divides-tp": ({"decode": {"layout": {"dcp": 3}}}, {"decode": {"layout": {"dcp": 4}}},
                       "spec.decode.layout.dcp"),
    "attn-dp-divides-tp": ({"decode": {"layout": {"attnDp": 3}}}, {"decode": {"layout": {"attnDp": 4}}},
                           "spec.decode.layout.attnDp"),
    "attn-cp-divides-tp": ({"prefill": {"layout": {"attnCp": 3, "cpStrategy": "zigzag"}}},
                           {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                           "spec.prefill.layout.attnCp"),
    "attn-dp-cp-divide-tp": ({"prefill": {"layout": {"attnDp": 4, "attnCp": 4, "cpStrategy": "zigzag"}}},
                             {"prefill": {"layout": {"attnDp": 2, "attnCp": 4, "cpStrategy": "zigzag"}}},
                             "spec.prefill.layout.attnCp"),
    "attention-heads-divisible": ({"model": {"profile": None, "architecture": CUSTOM_ARCH}},
                                  {"model": {"profile": None, "architecture": CUSTOM_ARCH},
                                   "prefill": {"layout": {"attnDp": 2}}, "decode": {"layout": {"attnDp": 2}}},
                                  "spec.prefill.layout.tp"),
    "ep-divides-tp": ({"decode": {"layout": {"ep": 3}}}, {"decode": {"layout": {"ep": 8}}}, "spec.decode.layout.ep"),
    "nodes-divide-world": ({"prefill": {"nodesPerInstance": 3}}, {"prefill": {"nodesPerInstance": 1}},
                           "spec.prefill.nodesPerInstance"),
    "gpus-per-node": ({"prefill": {"layout": {"tp": 16}}}, {"prefill": {"nodesPerInstance": 2, "layout": {"tp": 16}}},
                      "spec.prefill.nodesPerInstance"),
    "multi-node-fills-nodes": ({"prefill": {"nodesPerInstance": 2}},
                               {"prefill": {"nodesPerInstance": 2, "layout": {"tp": 16}}},
                               "spec.prefill.nodesPerInstance"),
    "cp-strategy-required": ({"prefill": {"layout": {"attnCp": 8}}},
                             {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                             "spec.prefill.layout.cpStrategy"),
    "cp-strategy-unused": ({"prefill": {"layout": {"cpStrategy": "zigzag"}}},
                           {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                           "spec.prefill.layout.cpStrategy"),
    "prefill-cp-excludes-dcp": ({"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag", "dcp": 2}}},
                                {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                                "spec.prefill.layout.dcp"),
    "dcp-decode-only": ({"prefill": {"layout": {"dcp": 2}}}, {"decode": {"layout": {"dcp": 2}}},
                        "spec.prefill.layout.dcp"),
    "attn-cp-prefill-only": ({"decode": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                             {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                             "spec.decode.layout.attnCp"),
    "kda-excludes-prefill-cp": (overlaid(KIMI, {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}}),
                                overlaid(KIMI, {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}}}),
                                "spec.prefill.layout.cpStrategy"),
    "dsa-v32-zigzag": (overlaid(V32, {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}}),
                       overlaid(V32, {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "interleave"}}}),
                       "spec.prefill.layout.cpStrategy"),
    "dsa-prefill-cp-max-tp": (
        overlaid(GLM, {"prefill": {"nodesPerInstance": 2,
                                 "layout": {"tp": 16, "attnCp": 8, "cpStrategy": "interleave"}}}),
        overlaid(GLM, {"prefill": {"layout": {"tp": 8, "attnCp": 8, "cpStrategy": "interleave"}}}),
        "spec.prefill.layout.tp"),
    "dsa-prefill-cp-single-node": (
        overlaid(GLM, {"prefill": {"nodesPerInstance": 2,
                                   "layout": {"pp": 2, "attnCp": 8, "cpStrategy": "interleave"}}}),
        overlaid(GLM, {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "interleave"}}}),
        "spec.prefill.nodesPerInstance"),
    "dsa-dcp-in-pd": (overlaid(GLM, {"decode": {"layout": {"dcp": 4}}}),
                      overlaid(GLM, {"decode": {"layout": {"dcp": 4}}, "engine": {"capabilities": ["dsa-dcp-pd"]}}),
                      "spec.decode.layout.dcp"),
    "prefill-cp-forces-ep": ({"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                             {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag", "ep": 8,
                                                     "moeA2aBackend": "deepep"}}},
                             "spec.prefill.layout.ep"),
    "mla-prefill-cp-size": ({"prefill": {"layout": {"attnCp": 4, "cpStrategy": "zigzag"}}},
                            {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}},
                            "spec.prefill.layout.attnCp"),
    "moe-a2a-forces-ep": ({"decode": {"layout": {"ep": 4, "moeA2aBackend": "deepep"}}},
                          {"decode": {"layout": {"ep": 8, "moeA2aBackend": "deepep"}}}, "spec.decode.layout.ep"),
    "layer-split-needs-dsa": ({"prefill": {"layout": {"attnCp": 8, "cpStrategy": "interleave", "layerSplit": True}}},
                              DSA_SPLIT, "spec.prefill.layout.layerSplit"),
    "layer-split-prefill-only": (overlaid(GLM, {"decode": {"layout": {"layerSplit": True}}}), DSA_SPLIT,
                                 "spec.decode.layout.layerSplit"),
    "layer-split-needs-interleave": (overlaid(DSA_SPLIT, {"prefill": {"layout": {"cpStrategy": "zigzag"}}}), DSA_SPLIT,
                                     "spec.prefill.layout.cpStrategy"),
    "layer-split-needs-mooncake": (overlaid(DSA_SPLIT, {"transfer": {"backend": "nixl"}}), DSA_SPLIT,
                                   "spec.transfer.backend"),
    "layer-split-excludes-pp": (overlaid(DSA_SPLIT, {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}}}),
                                DSA_SPLIT, "spec.prefill.layout.pp"),
    "prefill-cp-dcp-reshard": (
        overlaid(DSA_SPLIT, {"decode": {"layout": {"dcp": 4}}, "engine": {"capabilities": ["dsa-dcp-pd"]}}),
        overlaid(DSA_SPLIT, {"decode": {"layout": {"dcp": 4}},
                           "engine": {"capabilities": ["dsa-dcp-pd", "prefill-cp-dcp-reshard"]}}),
        "spec.prefill.layout.attnCp"),
    "roles-pp-agree": ({"decode": {"nodesPerInstance": 2, "layout": {"pp": 2}}},
                       {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}},
                        "decode": {"nodesPerInstance": 2, "layout": {"pp": 2}}},
                       "spec.decode.layout.pp"),
    "dcp-backend-needs-dcp": ({"decode": {"layout": {"dcpCommBackend": "a2a"}}},
                              {"decode": {"layout": {"dcp": 4, "dcpCommBackend": "a2a"}}},
                              "spec.decode.layout.dcpCommBackend"),
    "replicate-q-proj-needs-dcp": ({"decode": {"layout": {"replicateQProj": True}}},
                                   {"decode": {"layout": {"dcp": 4, "replicateQProj": True}}},
                                   "spec.decode.layout.replicateQProj"),
    "replicate-q-proj-needs-a2a": (
        {"decode": {"layout": {"dcp": 4, "dcpCommBackend": "ag_rs", "replicateQProj": True}}},
        {"decode": {"layout": {"dcp": 4, "dcpCommBackend": "a2a", "replicateQProj": True}}},
        "spec.decode.layout.replicateQProj"),
    "speculative-pp-prefill-only": (
        {"decode": {"nodesPerInstance": 2, "layout": {"pp": 2}, "speculative": {"algorithm": "EAGLE"}}},
        {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}, "speculative": {"algorithm": "EAGLE"}}},
        "spec.decode.speculative"),
    "speculative-pp-eagle-only": (
        {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}, "speculative": {"algorithm": "NGRAM"}}},
        {"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}, "speculative": {"algorithm": "NEXTN"}}},
        "spec.prefill.speculative.algorithm"),
    "eagle-running-request-cap": (
        {"decode": {"layout": {"attnDp": 8}, "speculative": {"algorithm": "NEXTN"}}},
        {"decode": {"layout": {"attnDp": 8}, "speculative": {"algorithm": "NEXTN"}, "maxRunningRequests": 256}},
        "spec.decode.maxRunningRequests"),
    "speculative-params-together": (
        {"decode": {"maxRunningRequests": 128, "speculative": {"algorithm": "EAGLE", "numSteps": 3}}},
        {"decode": {"maxRunningRequests": 128, "speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1}}},
        "spec.decode.speculative.eagleTopk"),
    "speculative-chain-draft-tokens": (
        {"decode": {"maxRunningRequests": 128, "speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1,
                                                               "numDraftTokens": 8}}},
        {"decode": {"maxRunningRequests": 128, "speculative": {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 1,
                                                               "numDraftTokens": 4}}},
        "spec.decode.speculative.numDraftTokens"),
    "speculative-tree-page-size": (
        {"hardware": {"gpuType": "B200"}, "decode": {"maxRunningRequests": 128, "speculative": TREE_DRAFT}},
        {"hardware": {"gpuType": "H200"}, "decode": {"maxRunningRequests": 128, "speculative": TREE_DRAFT}},
        "spec.decode.speculative.eagleTopk"),
    "speculative-attn-dp": (
        {"decode": {"layout": {"attnDp": 8}, "maxRunningRequests": 128,
                    "speculative": {"algorithm": "STANDALONE", "draftModelPath": "org/draft"}}},
        {"decode": {"layout": {"attnDp": 8}, "maxRunningRequests": 128,
                    "speculative": {"algorithm": "EAGLE3", "draftModelPath": "org/draft"}}},
        "spec.decode.layout.attnDp"),
    "gpu-architecture-supported": (
        overlaid(KIMI, {"hardware": {"gpuType": "H200"}, "decode": {"layout": {"dcp": 8}}}),
        overlaid(KIMI, {"hardware": {"gpuType": "B300"}, "decode": {"layout": {"dcp": 8}}}),
        "spec.decode.layout.dcp"),
    "gpu-type-declared": (overlaid(KIMI, {"decode": {"layout": {"dcp": 8}}}),
                          overlaid(KIMI, {"hardware": {"gpuType": "GB300"}, "decode": {"layout": {"dcp": 8}}}),
                          "spec.hardware.gpuType"),
    "roles-page-size-agree": (
        # A page size on decode only: prefill keeps fa3's page size of 1 on an H200. (Kimi K3's DCP
        # backends no longer split the roles on Blackwell: its prefill takes trtllm_mla there, with
        # the same page size of 64; test_sglang_resolution.py checks the rule against the wheel.)
        {"decode": {"pageSize": 64}},
        {"prefill": {"pageSize": 64}, "decode": {"pageSize": 64}},
        "spec.prefill.pageSize"),
    "extra-args-value": ({"engine": {"extraArgs": ["--load-balance-method", "bogus"]}},
                         {"engine": {"extraArgs": ["--load-balance-method", "total_tokens"]}},
                         "spec.engine.extraArgs[0]"),
    "moe-a2a-flashinfer-topology": (
        {"decode": {"layout": {"ep": 8, "moeA2aBackend": "flashinfer"}},
         "engine": {"extraArgs": ["--moe-runner-backend", "flashinfer_cutlass"]}},
        {"decode": {"layout": {"ep": 8, "attnDp": 8, "moeA2aBackend": "flashinfer"}},
         "engine": {"extraArgs": ["--moe-runner-backend", "flashinfer_cutlass"]}},
        "spec.decode.layout.attnDp"),
    "moe-a2a-flashinfer-runner": (
        {"decode": {"layout": {"ep": 8, "attnDp": 8, "moeA2aBackend": "flashinfer"}}},
        {"decode": {"layout": {"ep": 8, "attnDp": 8, "moeA2aBackend": "flashinfer"}},
         "engine": {"extraArgs": ["--moe-runner-back=deep_gemm"]}},
        "spec.decode.layout.moeA2aBackend"),
    "moe-a2a-mori-dispatch": (
        {"prefill": {"layout": {"ep": 8, "moeA2aBackend": "mori"}}},
        {"prefill": {"layout": {"ep": 8, "moeA2aBackend": "mori"}},
         "engine": {"env": [{"name": "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "value": "16384"}]}},
        "spec.prefill.layout.moeA2aBackend"),
    "kv-dtype-supported": (overlaid(GLM, {"prefill": {"kvCacheDtype": "fp8_e5m2"},
                                          "decode": {"kvCacheDtype": "fp8_e5m2"}}),
                           overlaid(GLM, {"prefill": {"kvCacheDtype": "bf16"}, "decode": {"kvCacheDtype": "bf16"}}),
                           "spec.prefill.kvCacheDtype"),
    "roles-kv-dtype-agree": ({"decode": {"kvCacheDtype": "bf16"}},
                             {"prefill": {"kvCacheDtype": "bf16"}, "decode": {"kvCacheDtype": "bf16"}},
                             "spec.prefill.kvCacheDtype"),
    "speculative-needs-draft": (
        overlaid(KIMI, {"decode": {"speculative": {"algorithm": "EAGLE"}}}),
        overlaid(KIMI, {"decode": {"speculative": {"algorithm": "EAGLE", "draftModelPath": "org/k3-draft"}}}),
        "spec.decode.speculative.draftModelPath"),
    "vision-encoder-heads-tp": (KIMI,
                                overlaid(KIMI, {"prefill": {"layout": {"tp": 4}}, "decode": {"layout": {"tp": 4}}}),
                                "spec.prefill.layout.tp"),
    "prefill-prefix-caching": ({"prefill": {"prefixCaching": False}}, {"decode": {"prefixCaching": False}},
                               "spec.prefill.prefixCaching"),
    "role-has-instances": ({"decode": {"replicas": 0}}, {"decode": {"replicas": 1}}, "spec.decode.replicas"),
    "multi-node-needs-rdma": ({"prefill": {"nodesPerInstance": 2, "layout": {"tp": 16}}},
                              overlaid(RDMA, {"prefill": {"nodesPerInstance": 2, "layout": {"tp": 16}}}),
                              "spec.transfer.rdmaResourceCount"),
    "rdma-resource-named": ({"transfer": {"rdmaResourceCount": 8, "rdmaResourceName": ""}}, RDMA,
                            "spec.transfer.rdmaResourceName"),
    "ib-devices-per-gpu": ({"transfer": {"ibDevices": [f"mlx5_{i}" for i in range(8)], "ibDevicesPerGpu": 2}},
                           {"transfer": {"ibDevices": [f"mlx5_{i}" for i in range(16)], "ibDevicesPerGpu": 2}},
                           "spec.transfer.ibDevices"),
    "role-switch-relaunch-compatible": (
        overlaid(SWITCH, {"decode": {"nodesPerInstance": 2, "layout": {"tp": 16}}}),
        overlaid(SWITCH, {"decode": {"layout": {"attnDp": 8}}}),
        "spec.roleSwitch.enabled"),
    "role-switch-in-place": (overlaid(SWITCH, {"decode": {"layout": {"dcp": 2}}}), SWITCH, "spec.roleSwitch.enabled"),
    "role-switch-floors-fit": (overlaid(SWITCH, {"roleSwitch": {"minPrefill": 2}}), SWITCH,
                               "spec.roleSwitch.minPrefill"),
    "total-replicas-needs-role-switch": ({"replicas": 4}, overlaid(SWITCH, {"replicas": 4}), "spec.replicas"),
    "scaling-bounds": (overlaid(SWITCH, {"scaling": {"enabled": True, "minReplicas": 6, "maxReplicas": 4}}),
                       overlaid(SWITCH, {"scaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 4}}),
                       "spec.scaling.minReplicas"),
    "role-switch-floor-above-replicas": (
        overlaid(SWITCH, {"roleSwitch": {"minPrefill": 2}, "decode": {"replicas": 3}}),
        overlaid(SWITCH, {"roleSwitch": {"minPrefill": 2}, "prefill": {"replicas": 2}, "decode": {"replicas": 2}}),
        "spec.roleSwitch.minPrefill"),
    "extra-args-owned-flag": ({"engine": {"extraArgs": ["--trust-remote-code", "--dcp-size=2"]}},
                              {"engine": {"extraArgs": ["--trust-remote-code"]}}, "spec.engine.extraArgs[1]"),
    "extra-args-rejected-flag": ({"engine": {"extraArgs": ["--cuda-graph-max-bs", "8"]}},
                                 {"engine": {"extraArgs": ["--cuda-graph-max-bs-decode", "8"]}},
                                 "spec.engine.extraArgs[0]"),
    "extra-args-deprecated-flag": ({"engine": {"extraArgs": ["--disable-cuda-graph"]}},
                                   {"engine": {"extraArgs": ["--cuda-graph-backend-decode=disabled"]}},
                                   "spec.engine.extraArgs[0]"),
    "extra-args-placeholder": ({"engine": {"extraArgs": ["--trust-remote-code", "{dist_init_addr}"]}},
                               {"engine": {"extraArgs": ["--trust-remote-code", "{\"a\": 1}"]}},
                               "spec.engine.extraArgs[1]"),
    "model-not-a-flag": ({"model": {"servedModelName": "--port"}}, {"model": {"servedModelName": "m-1"}},
                         "spec.model.servedModelName"),
    "engine-env-owned": ({"engine": {"env": [{"name": "HYBRIDSERVING_SIM_PROFILE", "value": "x"},
                                             {"name": "HYBRIDSERVING_PORT", "value": "1"}]}},
                         {"engine": {"env": [{"name": "HYBRIDSERVING_SIM_PROFILE", "value": "x"}]}},
                         "spec.engine.env[1]"),
    "bootstrap-port-distinct": ({"transfer": {"bootstrapPort": 12003}}, {"transfer": {"bootstrapPort": 19999}},
                                "spec.transfer.bootstrapPort"),
    "role-switch-drain-timeout": (overlaid(SWITCH, {"roleSwitch": {"drainTimeoutSeconds": 3}}),
                                  overlaid(SWITCH, {"roleSwitch": {"drainTimeoutSeconds": 4}}),
                                  "spec.roleSwitch.drainTimeoutSeconds"),
    "fleet-size": ({"prefill": {"replicas": 512}, "decode": {"replicas": 510}, "rollout": {"maxSurge": 2}},
                   {"prefill": {"replicas": 512}, "decode": {"replicas": 510}, "rollout": {"maxSurge": 1}},
                   "spec.rollout.maxSurge"),
    "engine-env-setting": ({"engine": {"env": [{"name": "HYBRIDSERVING_IDLE_WINDOW_S", "value": "3s"}]}},
                           {"engine": {"env": [{"name": "HYBRIDSERVING_IDLE_WINDOW_S", "value": "3.5"}]}},
                           "spec.engine.env[0].value"),
}


def _with_rule(issues: list[LayoutIssue], rule: str) -> list[LayoutIssue]:
    return [issue for issue in issues if issue.rule == rule]


def test_any_prefill_context_parallelism_feeding_dcp_decode_is_refused_as_decode_would() -> None:
    """disaggregation/common/conn.py:1411-1421: decode refuses a prefill with attention CP > 1,
    layer-split or not, on its first request; a zigzag DeepSeek prefill is the common case."""
    spec = make(overlaid(_model("deepseek-v3"), {
        "prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag", "ep": 8, "moeA2aBackend": "deepep"}},
        "decode": {"layout": {"dcp": 8}}}))
    (issue,) = _with_rule(validate(spec), "prefill-cp-dcp-reshard")
    assert issue.path == "spec.prefill.layout.attnCp" and "prefill with attnCp 8" in issue.message
    assert "spec.decode.layout.dcp to 1" in issue.fix


def test_the_launchers_settings_are_checked_as_the_launcher_reads_them() -> None:
    env = [
        {"name": "HYBRIDSERVING_IDLE_WINDOW_S", "value": "nan"},
        {"name": "HYBRIDSERVING_POLL_INTERVAL_S", "value": "0"},
        {"name": "HYBRIDSERVING_CRASH_LOOP_RESTARTS", "value": "2.5"},
        {"name": "HYBRIDSERVING_PREFLIGHT", "value": "enfroce"},
        {"name": "HYBRIDSERVING_CRASH_LOOP_EXIT", "value": "false"},
        {"name": "SGLANG_HEALTH_CHECK_TIMEOUT", "value": "2.5"},
        {"name": "HYBRIDSERVING_STOP_GRACE_S"},  # neither value nor valueFrom: empty, as in a Pod
        {"name": "HYBRIDSERVING_STARTUP_TIMEOUT_S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "HYBRIDSERVING_CONFIG_WAIT_S", "value": "1e3"},
        {"name": "SGLANG_ENABLE_METRICS_DEVICE_TIMER", "value": "0"},
    ]
    found = {(i.path, i.message, i.fix) for i in validate(make({"engine": {"env": env}}))
             if i.rule in ("engine-env-setting", "engine-env-owned")}
    assert found == {
        ("spec.engine.env[0].value", "HYBRIDSERVING_IDLE_WINDOW_S='nan' is not a number of seconds at least 0",
         "set HYBRIDSERVING_IDLE_WINDOW_S to a number of seconds at least 0 (default 3), or remove it"),
        ("spec.engine.env[1].value", "HYBRIDSERVING_POLL_INTERVAL_S='0' is not a number of seconds above 0",
         "set HYBRIDSERVING_POLL_INTERVAL_S to a number of seconds above 0 (default 1), or remove it"),
        ("spec.engine.env[2].value", "HYBRIDSERVING_CRASH_LOOP_RESTARTS='2.5' is not a whole number at least 1",
         "set HYBRIDSERVING_CRASH_LOOP_RESTARTS to a whole number at least 1 (default 5), or remove it"),
        ("spec.engine.env[3].value", "HYBRIDSERVING_PREFLIGHT='enfroce' is not one of enforce, warn, off",
         "set HYBRIDSERVING_PREFLIGHT to one of enforce, warn, off (default enforce), or remove it"),
        ("spec.engine.env[4].value", "HYBRIDSERVING_CRASH_LOOP_EXIT='false' is not one of 1, 0",
         "set HYBRIDSERVING_CRASH_LOOP_EXIT to one of 1, 0 (default 1), or remove it"),
        ("spec.engine.env[5].value", "SGLANG_HEALTH_CHECK_TIMEOUT='2.5' is not a whole number at least 1",
         "set SGLANG_HEALTH_CHECK_TIMEOUT to a whole number at least 1 (default 20), or remove it"),
        ("spec.engine.env[6].value", "HYBRIDSERVING_STOP_GRACE_S='' is not a number of seconds at least 0",
         "set HYBRIDSERVING_STOP_GRACE_S to a number of seconds at least 0 (default 30), or remove it"),
        ("spec.engine.env[9]", "SGLANG_ENABLE_METRICS_DEVICE_TIMER is set by the operator for each pod; a copy "
         "here would replace it", "remove SGLANG_ENABLE_METRICS_DEVICE_TIMER from spec.engine.env"),
    }


def test_base_spec_is_clean() -> None:
    assert validate(make()) == []


def test_every_rule_has_a_case() -> None:
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_with_path_and_fix(rule: str) -> None:
    bad, _, path = CASES[rule]
    found = _with_rule(validate(make(bad)), rule)
    assert found, f"{rule} did not fire"
    issue = found[0]
    assert issue.path == path
    assert issue.severity == RULES[rule].severity
    assert issue.engine_versions == RULES[rule].engine_versions
    assert issue.message
    assert issue.fix.split()[0].lower() in FIX_VERBS, issue.fix
    assert rule in str(issue) and path in str(issue)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_quiet_on_nearest_good_spec(rule: str) -> None:
    _, good, _ = CASES[rule]
    assert _with_rule(validate(make(good)), rule) == []


def test_ib_devices_per_gpu_waits_for_a_device_list() -> None:
    """The old default (1 per GPU, no devices: the engine detects them) stays valid."""
    assert _with_rule(validate(make({"transfer": {"ibDevicesPerGpu": 1}})), "ib-devices-per-gpu") == []
    (issue,) = _with_rule(validate(make({"transfer": {"ibDevices": ["mlx5_0", "mlx5_1", "mlx5_2"],
                                                      "ibDevicesPerGpu": 2}})), "ib-devices-per-gpu")
    assert "give 16 devices" in issue.fix


def test_dcp_fix_lists_divisors() -> None:
    (issue,) = _with_rule(validate(make(CASES["dcp-divides-tp"][0])), "dcp-divides-tp")
    assert "dcp must divide tp" in issue.message
    assert issue.fix.endswith("1, 2, 4, 8")


def test_unknown_profile_lists_known_ones() -> None:
    (issue,) = validate(make({"model": {"profile": "llama-9"}}))
    for name in ("deepseek-v3", "deepseek-v3.2", "glm-5.2", "glm-5.3", "kimi-k3"):
        assert name in issue.fix


def test_gpus_per_node_fix_names_the_node_count() -> None:
    (issue,) = _with_rule(validate(make({"prefill": {"layout": {"tp": 24}}})), "gpus-per-node")
    assert "set nodesPerInstance to 3" in issue.fix


def test_combined_cp_and_dcp_reports_the_engine_rule_once() -> None:
    issues = validate(make(CASES["prefill-cp-excludes-dcp"][0]))
    assert [i.rule for i in issues if i.path == "spec.prefill.layout.dcp"] == ["prefill-cp-excludes-dcp"]


def test_glm_zigzag_prefill_cp_is_rewritten_but_v32_zigzag_is_rejected() -> None:
    glm = validate(make(overlaid(GLM, {"prefill": {"layout": {"attnCp": 8, "cpStrategy": "zigzag"}}})))
    assert _with_rule(glm, "prefill-cp-forces-ep") and not _with_rule(glm, "dsa-v32-zigzag")
    v32 = validate(make(CASES["dsa-v32-zigzag"][0]))
    assert _with_rule(v32, "dsa-v32-zigzag") and not _with_rule(v32, "prefill-cp-forces-ep")


def test_eagle3_needs_a_draft_even_with_mtp() -> None:
    spec = make({"decode": {"speculative": {"algorithm": "EAGLE3"}}})
    assert _with_rule(validate(spec), "speculative-needs-draft")
    assert not _with_rule(validate(make({"decode": {"speculative": {"algorithm": "EAGLE"}}})),
                          "speculative-needs-draft")


@pytest.mark.parametrize("given, path, named", [
    ({"eagleTopk": 1}, "numSteps", "eagleTopk without numSteps"),
    ({"numDraftTokens": 4}, "numSteps", "numDraftTokens without numSteps"),
    ({"eagleTopk": 1, "numDraftTokens": 4}, "numSteps", "eagleTopk and numDraftTokens without numSteps"),
    ({"numSteps": 3, "numDraftTokens": 4}, "eagleTopk", "numSteps without eagleTopk"),
])
def test_a_partial_draft_shape_names_what_is_missing(given: dict[str, int], path: str, named: str) -> None:
    spec = make({"decode": {"maxRunningRequests": 128, "speculative": {"algorithm": "NEXTN", **given}}})
    found = _with_rule(validate(spec), "speculative-params-together")
    assert [issue.path for issue in found] == [f"spec.decode.speculative.{path}"]
    assert named in found[0].message


def test_the_engine_picks_the_whole_draft_shape_and_ngram_takes_none() -> None:
    for speculative in ({"algorithm": "EAGLE"}, {"algorithm": "NGRAM", "numSteps": 3},
                        {"algorithm": "EAGLE", "numSteps": 3, "eagleTopk": 2}):
        spec = make({"decode": {"maxRunningRequests": 128, "speculative": speculative}})
        assert not _with_rule(validate(spec), "speculative-params-together"), speculative


@pytest.mark.parametrize("extra, refused", [
    ([], True),
    (["--speculative-ngram-max-bfs-breadth", "1"], False),
    (["--speculative-ngram-max-bfs=1"], False),  # argparse reads the unique prefix
    (["--speculative-ngram-max-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth=3"], True),  # last wins
])
def test_ngram_drafts_a_tree_as_wide_as_its_bfs_breadth(extra: list[str], refused: bool) -> None:
    spec = make({"hardware": {"gpuType": "B200"}, "engine": {"extraArgs": extra},
                 "decode": {"maxRunningRequests": 128, "speculative": {"algorithm": "NGRAM"}}})
    found = _with_rule(validate(spec), "speculative-tree-page-size")
    assert bool(found) == refused
    if refused:
        assert found[0].path == "spec.decode.speculative.algorithm"
        assert "trtllm_mla" in found[0].message and "--speculative-ngram-max-bfs-breadth 1" in found[0].fix


@pytest.mark.parametrize("extra", [["--attention-backend", "triton"], ["--decode-attention-back=triton"]])
def test_a_backend_chosen_in_extra_args_is_not_second_guessed(extra: list[str]) -> None:
    """The mirror resolves the engine's own backend; one named outright (which the wheel accepts a
    tree on, test_simulator_requests.py) is not refused for the backend it replaces."""
    spec = make({"hardware": {"gpuType": "B200"}, "engine": {"extraArgs": extra},
                 "decode": {"maxRunningRequests": 128, "speculative": TREE_DRAFT}})
    assert not _with_rule(validate(spec), "speculative-tree-page-size")


def test_ngram_without_a_cap_runs_48_requests_like_eagle() -> None:
    spec = make({"decode": {"speculative": {"algorithm": "NGRAM"}}})
    assert resolution.resolve(spec, "decode").max_running_requests == 48
    assert _with_rule(validate(spec), "eagle-running-request-cap")


def test_custom_build_suffix_keeps_release_rules() -> None:
    spec = make({"engine": {"sglangVersion": "0.5.23-reshard"}})
    assert str(engine_version(spec)) == "0.5.23"
    assert validate(spec) == []


def test_engine_version_ranges_use_version_order() -> None:
    # 0.5.9 < 0.5.23 as versions, not as strings.
    spec = make({"engine": {"sglangVersion": "0.5.9"}})
    assert _with_rule(validate(spec), "engine-version-supported")
    assert applies(RULES["dcp-divides-tp"], engine_version(spec))
    assert not applies(RULES["prefill-cp-excludes-dcp"], engine_version(spec))


def test_errors_filters_warnings() -> None:
    issues = validate(make({"prefill": {"prefixCaching": False}, "decode": {"layout": {"dcp": 3}}}))
    assert [i.rule for i in errors(issues)] == ["dcp-divides-tp"]


# --------------------------------------------------------------------------- role switch


def test_identical_plain_layouts_switch_in_place() -> None:
    assert role_switch_capability(make()) == (True, [])


@pytest.mark.parametrize(
    ("patch", "mentions"),
    [
        ({"decode": {"layout": {"ep": 8}}}, "spec.decode.layout.ep"),
        ({"prefill": {"layout": {"moeA2aBackend": "mooncake"}}}, "spec.prefill.layout.moeA2aBackend"),
        ({"prefill": {"nodesPerInstance": 2, "layout": {"pp": 2}}}, "spec.prefill.layout.pp"),
        ({"decode": {"layout": {"dcp": 2}}}, "spec.decode.layout.dcp"),
        ({"decode": {"speculative": {"algorithm": "EAGLE"}}}, "spec.decode.speculative"),
        ({"transfer": {"backend": "nixl"}}, "nixl"),
        ({"decode": {"layout": {"attnDp": 8}}}, "layout.attnDp"),
        ({"decode": {"kvCacheDtype": "bf16"}}, "kvCacheDtype"),
        ({"decode": {"memFractionStatic": 0.8}}, "memFractionStatic"),
    ],
)
def test_in_place_role_switch_blockers(patch: dict[str, Any], mentions: str) -> None:
    in_place, reasons = role_switch_capability(make(patch))
    assert not in_place
    assert any(mentions in reason for reason in reasons), reasons


# --------------------------------------------------------------------------- examples


def _load(path: Path) -> HybridServing:
    return HybridServing.model_validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_have_no_layout_errors(path: Path) -> None:
    assert errors(validate(_load(path).spec)) == []


LAYOUT_INVALID = ["dcp-not-dividing-tp", "dsa-dcp-in-pd", "kda-zigzag", "unknown-profile", "v32-zigzag",
                  "world-size-mismatch"]


@pytest.mark.parametrize("name", LAYOUT_INVALID)
def test_invalid_examples_report_the_expected_error(name: str) -> None:
    path = EXAMPLES / "invalid" / f"{name}.yaml"
    if not path.exists():
        pytest.skip(f"{path} not present")
    text = path.read_text()
    expected = re.findall(r"^# expect: (.+)$", text, flags=re.M)
    assert expected
    reported = [str(issue) for issue in errors(validate(_load(path).spec))]
    for needle in expected:
        assert any(needle in line for line in reported), (needle, reported)


# --------------------------------------------------------------------------- documentation


def test_every_rule_is_documented_with_its_severity() -> None:
    doc = (REPO / "docs" / "layout-rules.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", doc, flags=re.M)}
    assert set(rows) == set(RULES)
    for rule in RULES.values():
        assert f"| {rule.severity} |" in rows[rule.id], rule.id


# --------------------------------------------------------------------------- flags as the parser reads them


@pytest.mark.parametrize("extra, flag", [
    (["--disaggregation-mo", "decode"], "--disaggregation-mode"),
    (["--tp-si", "4"], "--tp-size"),
    (["--hos", "0.0.0.0"], "--host"),
    (["--por", "1"], "--port"),
    (["--por=1"], "--port"),
    (["--served-model-na", "x"], "--served-model-name"),
])
def test_owned_flags_are_caught_through_abbreviations(extra: list[str], flag: str) -> None:
    """argparse expands unique prefixes, so a prefix of an owned flag sets that flag."""
    found = _with_rule(validate(make({"engine": {"extraArgs": extra}})), "extra-args-owned-flag")
    assert found and f"read as {flag}" in found[0].message


@pytest.mark.parametrize("token", ["--mod", "--cuda-graph-max", "--tp-siz-e", "--no-such-flag"])
def test_ambiguous_or_unknown_flags_are_rejected(token: str) -> None:
    found = _with_rule(validate(make({"engine": {"extraArgs": [token, "1"]}})), "extra-args-rejected-flag")
    assert found and found[0].path == "spec.engine.extraArgs[0]"


@pytest.mark.parametrize("extra, refused", [
    (["--tokenizer-worker-num", "4"], True),
    (["--tokenizer-worker-num=2"], True),
    (["--tokenizer-worker", "8"], True),
    (["--tokenizer-worker-num", "1"], False),
    (["--detokenizer-worker-num", "4"], False),
    (["--tokenizer-worker-num", "4", "--tokenizer-worker-num=1"], False),  # the parser keeps the last
    (["--tokenizer-worker-num", "1", "--tokenizer-worker", "2"], True),
])
def test_several_tokenizer_workers_are_refused_since_every_engine_has_an_api_key(extra: list[str],
                                                                                 refused: bool) -> None:
    """In multi-tokenizer mode each tokenizer worker asserts that no API key is set
    (entrypoints/http_server.py:258-261), and the launcher always passes the fleet's key."""
    found = _with_rule(validate(make({"engine": {"extraArgs": ["--trust-remote-code", *extra]}})),
                       "extra-args-rejected-flag")
    assert bool(found) == refused
    if refused:
        assert found[0].path == "spec.engine.extraArgs[1]"
        assert "--api-key" in found[0].message and found[0].fix.startswith("remove it, or set it to 1")


def test_values_and_negative_numbers_are_not_flags() -> None:
    extra = ["--json-model-override-args", '{"x": -1}', "--chunked-prefill-size", "-1"]
    assert _with_rule(validate(make({"engine": {"extraArgs": extra}})), "extra-args-rejected-flag") == []


@pytest.mark.parametrize("host_network, port", [(False, 30000), (False, 6789), (True, 6000), (True, 19500),
                                                (True, 65000)])
def test_bootstrap_ports_that_collide_with_allocated_ports_are_errors(host_network: bool, port: int) -> None:
    spec = make({"transfer": {"bootstrapPort": port}, "network": {"hostNetwork": host_network}})
    assert _with_rule(validate(spec), "bootstrap-port-distinct")


@pytest.mark.parametrize("host_network, port",
                         [(False, 8998), (True, 8998), (False, 40000), (True, 1024), (True, 20191)])
def test_clear_bootstrap_ports_plan(host_network: bool, port: int) -> None:
    """Every port the rule lets through, the planner can allocate around (it raised before)."""
    from hybridserving.api.v1alpha1 import HybridServing
    from hybridserving.core import planner
    from hybridserving.core.observed import Observed

    spec = make({"transfer": {"bootstrapPort": port}, "network": {"hostNetwork": host_network},
                 "prefill": {"replicas": 3}, "decode": {"replicas": 3}})
    assert not _with_rule(validate(spec), "bootstrap-port-distinct")
    hs = HybridServing.model_validate({"metadata": {"name": "f", "namespace": "d", "uid": "u"},
                                       "spec": spec.to_wire()})
    assert len(planner.plan(hs, Observed()).instances) == 6


def test_every_variable_the_planner_sets_per_pod_is_owned() -> None:
    from hybridserving.core import planner, rendering
    from hybridserving.core.layout import OWNED_ENV
    from hybridserving.core.observed import Observed

    hs = HybridServing.model_validate({"metadata": {"name": "f", "namespace": "d", "uid": "u"},
                                       "spec": make().to_wire()})
    inst = next(iter(planner.plan(hs, Observed()).instances.values()))
    env = rendering.pod_spec(hs, inst.name, 0, inst.role, inst.ports)["containers"][0]["env"]
    rendered = {e["name"] for e in env if e["name"].startswith(("HYBRIDSERVING_", "SGLANG_"))}
    assert rendered == OWNED_ENV
