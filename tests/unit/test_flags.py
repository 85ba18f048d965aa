"""Engine flag rendering: the argv says exactly what the spec says, in a fixed order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridserving.api.instance import InstancePorts
from hybridserving.api.v1alpha1 import HybridServing, HybridServingSpec
from hybridserving.core.flags import (
    PLACEHOLDERS,
    fill_placeholders,
    render_argv,
    render_template,
)
from support.patches import overlaid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE: dict[str, Any] = {
    "model": {"path": "deepseek-ai/DeepSeek-V3", "profile": "deepseek-v3"},
    "prefill": {"replicas": 1, "layout": {"tp": 8}},
    "decode": {"replicas": 1, "layout": {"tp": 8}},
}


def make(patch: dict[str, Any] | None = None) -> HybridServingSpec:
    return HybridServingSpec.model_validate(overlaid(BASE, patch or {}))


def _load(name: str) -> HybridServingSpec:
    return HybridServing.model_validate(yaml.safe_load((EXAMPLES / name).read_text())).spec


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_plain_tp_decode_argv_exactly() -> None:
    assert render_argv(make(), "decode") == [
        "--model-path", "deepseek-ai/DeepSeek-V3",
        "--host", "0.0.0.0", "--port", "30000",
        "--tp-size", "8",
        "--disaggregation-mode", "decode",
        "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-bootstrap-port", "8998",
        "--engine-info-bootstrap-port", "6789",
        "--enable-metrics",
        "--kv-cache-dtype", "fp8_e4m3",
    ]


def test_default_layout_values_are_not_rendered() -> None:
    argv = render_argv(make(), "prefill")
    for flag in ("--pp-size", "--attn-dp-size", "--enable-prefill-cp", "--dcp-size", "--ep-size", "--nnodes",
                 "--enable-pd-role-switch", "--disable-radix-cache", "--served-model-name"):
        assert flag not in argv


def test_full_flag_names_only() -> None:
    spec = make({"prefill": {"layout": {"pp": 2, "attnDp": 2, "ep": 8}, "nodesPerInstance": 2}})
    argv = render_argv(spec, "prefill", node_rank=1, dist_init_addr="leader")
    assert not {"--tp", "--dp", "--ep", "--enable-dp-attention", "--dp-size"} & set(argv)
    assert _value(argv, "--tp-size") == "8" and _value(argv, "--pp-size") == "2"
    assert _value(argv, "--attn-dp-size") == "2" and _value(argv, "--ep-size") == "8"


def test_prefill_context_parallel_flags() -> None:
    argv = render_argv(_load("glm-5.2-reshard.yaml"), "prefill")
    assert "--enable-prefill-cp" in argv and "--enable-dsa-cache-layer-split" in argv
    assert _value(argv, "--attn-cp-size") == "8" and _value(argv, "--cp-strategy") == "interleave"


def test_decode_context_parallel_flags() -> None:
    argv = render_argv(_load("kimi-k3.yaml"), "decode")
    assert _value(argv, "--dcp-size") == "8" and _value(argv, "--dcp-comm-backend") == "a2a"
    assert "--dcp-replicate-q-proj" in argv and "--no-dcp-replicate-q-proj" not in argv


def test_replicate_q_proj_off_is_explicit_only_under_dcp() -> None:
    off = make({"decode": {"layout": {"dcp": 4, "replicateQProj": False}}})
    assert "--no-dcp-replicate-q-proj" in render_argv(off, "decode")
    no_dcp = make({"decode": {"layout": {"replicateQProj": False}}})
    assert not any("replicate-q-proj" in arg for arg in render_argv(no_dcp, "decode"))


def test_expert_parallel_flags() -> None:
    argv = render_argv(_load("deepseek-v3.yaml"), "decode", dist_init_addr="10.0.0.5")
    assert _value(argv, "--ep-size") == "16" and _value(argv, "--moe-a2a-backend") == "deepep"


def test_multi_node_flags_per_rank() -> None:
    spec = _load("kimi-k3.yaml")
    ports = InstancePorts(http=31000, bootstrap=9000, dist_init=21000, engine_info_bootstrap=7000)
    for rank in (0, 1):
        argv = render_argv(spec, "prefill", node_rank=rank, dist_init_addr="k3-prefill-0-0.k3", ports=ports)
        assert _value(argv, "--nnodes") == "2"
        assert _value(argv, "--node-rank") == str(rank)
        assert _value(argv, "--dist-init-addr") == "k3-prefill-0-0.k3:21000"


def test_multi_node_needs_a_leader_and_a_rank_in_range() -> None:
    spec = _load("kimi-k3.yaml")
    with pytest.raises(ValueError, match="dist_init_addr"):
        render_argv(spec, "prefill", node_rank=0)
    with pytest.raises(ValueError, match="node_rank 2"):
        render_argv(spec, "prefill", node_rank=2, dist_init_addr="leader")
    with pytest.raises(ValueError, match="node_rank 1"):
        render_argv(spec, "decode", node_rank=1)


def test_ports_are_the_instances() -> None:
    ports = InstancePorts(http=30100, bootstrap=9100, dist_init=20100, engine_info_bootstrap=6800)
    argv = render_argv(make(), "prefill", ports=ports)
    assert _value(argv, "--port") == "30100"
    assert _value(argv, "--disaggregation-bootstrap-port") == "9100"
    assert _value(argv, "--engine-info-bootstrap-port") == "6800"


def test_bootstrap_port_defaults_to_the_spec() -> None:
    argv = render_argv(make({"transfer": {"bootstrapPort": 9998}}), "decode")
    assert _value(argv, "--disaggregation-bootstrap-port") == "9998"


def test_transfer_flags() -> None:
    spec = make({"transfer": {"backend": "nixl", "ibDevices": ["mlx5_0", "mlx5_1"]}})
    argv = render_argv(spec, "prefill")
    assert _value(argv, "--disaggregation-transfer-backend") == "nixl"
    assert _value(argv, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"


def test_ib_devices_per_gpu_render_sglangs_per_gpu_map() -> None:
    devices = [f"mlx5_{i}" for i in range(16)]
    spec = make({"transfer": {"ibDevices": devices, "ibDevicesPerGpu": 2}})
    value = _value(render_argv(spec, "decode"), "--disaggregation-ib-device")
    assert json.loads(value) == {str(gpu): f"mlx5_{2 * gpu},mlx5_{2 * gpu + 1}" for gpu in range(8)}
    assert " " not in value  # one argv token, as the ConfigMap carries it
    assert "--disaggregation-ib-device" not in render_argv(make({"transfer": {"ibDevicesPerGpu": 2}}), "decode")


def test_role_switch_flag_only_in_place_and_enabled() -> None:
    assert "--enable-pd-role-switch" in render_argv(_load("role-switch.yaml"), "decode")
    assert "--enable-pd-role-switch" not in render_argv(make(), "decode")
    relaunch = make({"roleSwitch": {"enabled": True}, "decode": {"layout": {"ep": 8}}})
    assert "--enable-pd-role-switch" not in render_argv(relaunch, "prefill")


def test_speculative_flags() -> None:
    argv = render_argv(_load("glm-5.3.yaml"), "decode")
    assert _value(argv, "--speculative-algorithm") == "EAGLE"
    assert _value(argv, "--speculative-num-steps") == "3"
    assert _value(argv, "--speculative-eagle-topk") == "1"
    assert _value(argv, "--speculative-num-draft-tokens") == "4"
    assert "--speculative-algorithm" not in render_argv(_load("glm-5.3.yaml"), "prefill")
    drafted = make({"decode": {"speculative": {"algorithm": "EAGLE3", "draftModelPath": "org/draft"}}})
    assert _value(render_argv(drafted, "decode"), "--speculative-draft-model-path") == "org/draft"


def test_memory_and_cache_flags() -> None:
    spec = make({"prefill": {"memFractionStatic": 0.82, "maxRunningRequests": 64, "pageSize": 64,
                             "kvCacheDtype": "bf16", "prefixCaching": False},
                 "decode": {"prefixCaching": False}})
    argv = render_argv(spec, "prefill")
    assert _value(argv, "--mem-fraction-static") == "0.82"
    assert _value(argv, "--max-running-requests") == "64"
    assert _value(argv, "--page-size") == "64"
    assert _value(argv, "--kv-cache-dtype") == "bf16"
    assert "--disable-radix-cache" in argv
    # Decode has no radix cache to turn off: the engine forces it off already.
    assert "--disable-radix-cache" not in render_argv(spec, "decode")


def test_served_model_name() -> None:
    spec = make({"model": {"servedModelName": "dsv3"}})
    assert _value(render_argv(spec, "decode"), "--served-model-name") == "dsv3"


def test_extra_args_come_last_verbatim() -> None:
    extra = ["--trust-remote-code", "--cuda-graph-max-bs-decode", "128", '--json-model-override-args={"a": 1}']
    argv = render_argv(make({"engine": {"extraArgs": extra}}), "decode")
    assert argv[-len(extra):] == extra


def test_render_is_deterministic() -> None:
    spec = _load("deepseek-v3.yaml")
    assert render_argv(spec, "prefill", dist_init_addr="h") == render_argv(spec, "prefill", dist_init_addr="h")


def test_template_has_placeholders_only_where_values_vary() -> None:
    single = render_template(make(), "decode")
    assert PLACEHOLDERS["node_rank"] not in single and PLACEHOLDERS["dist_init_addr"] not in single
    assert PLACEHOLDERS["port"] in single


def test_fill_placeholders_replaces_whole_tokens_only() -> None:
    template = ["--port", "{port}", "--json-model-override-args", '{"port": "{port}"}']
    assert fill_placeholders(template, {"port": 1}) == ["--port", "1", "--json-model-override-args",
                                                       '{"port": "{port}"}']
    with pytest.raises(ValueError, match="port"):
        fill_placeholders(template, {})


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_renders_both_roles(name: str) -> None:
    spec = _load(name)
    for role in ("prefill", "decode"):
        argv = render_argv(spec, role, dist_init_addr="leader")
        assert _value(argv, "--disaggregation-mode") == role
        assert not any(token in PLACEHOLDERS.values() for token in argv)

