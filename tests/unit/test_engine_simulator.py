"""The SGLang simulator: 0.5.23 response shapes, metric names, role-switch refusals, PD hand-over."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import subprocess
import time
from dataclasses import dataclass

import aiohttp
import pytest

from hybridserving_engine.simulator.args import FlagError, SimulatorOptions, parse_server_args
from hybridserving_engine.simulator.engine import SimRequest, count_tokens
from hybridserving_engine.simulator.faults import Faults
from hybridserving_engine.simulator.process import SimulatorProcess, free_port, simulator_env
from hybridserving_engine.simulator import server as simulator_server
from hybridserving_engine.simulator.server import SimulatorServer, main

from hybridserving.api.profiles import PROFILES
from hybridserving.api.v1alpha1 import HardwareSpec, LayoutSpec, RoleSpec
from hybridserving.contract import inflight_requests
from hybridserving.core.capacity import instance_capacity
from hybridserving.controller.engines import Scrape, busy_fraction, instance_metrics
from prometheus_client.parser import text_string_to_metric_families

from support.scrape import metric_sum


def samples(text: str, name: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def options(time_scale: float = 0.01, faults: str = "") -> SimulatorOptions:
    return SimulatorOptions(profile="glm-5.2", time_scale=time_scale, startup_seconds=0.0, faults=faults)


def make_server(*flags: str, time_scale: float = 0.01, faults: str = "") -> SimulatorServer:
    """A server of GLM-5.2 on one node of 8 H200s unless `flags` say otherwise: its weights need them."""
    argv = ["--model-path", "zai-org/GLM-5.2-FP8", "--served-model-name", "glm-5.2", "--host", "127.0.0.1",
            "--port", str(free_port()), "--tp-size", "8", *flags]
    return SimulatorServer(parse_server_args(argv), options(time_scale, faults), argv)


def http_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


def pd_flags(role: str, bootstrap_port: int, *extra: str) -> list[str]:
    return ["--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(bootstrap_port), "--enable-metrics",
            *extra]


def run(coro_fn, *servers: SimulatorServer):
    """Start `servers`, run `coro_fn(session, *urls)`, stop them."""

    async def main():
        for s in servers:
            await s.start()
        try:
            async with aiohttp.ClientSession() as session:
                return await coro_fn(session, *(f"http://127.0.0.1:{s.args.port}" for s in servers))
        finally:
            for s in servers:
                await s.stop()

    return asyncio.run(main())


# ------------------------------------------------------------------ flags


def test_flags_sglang_does_not_know_exit_2_as_sglang_serve_does():
    # argparse in `sglang serve` (server_args.py prepare_server_args): unknown and ambiguous flags exit 2.
    for bad in (["--no-such-flag", "1"], ["--cuda-graph-max-bs", "8"], ["--prefill-round-robin-balance"]):
        with pytest.raises(SystemExit) as exited:
            parse_server_args(["--model-path", "m", *bad])
        assert exited.value.code == 2, bad


def resolved_info(*flags: str, gpu: str = "H200", profile: str = "glm-5.2") -> dict:
    argv = ["--model-path", "m", "--host", "127.0.0.1", "--port", str(free_port()), "--tp-size", "8", *flags]
    opts = SimulatorOptions(profile=profile, time_scale=0.01, startup_seconds=0.0, faults="", gpu_type=gpu)
    return SimulatorServer(parse_server_args(argv), opts, argv).server_info_dict()


def test_the_simulator_runs_at_its_gpus_speed_on_the_pool_its_memory_holds():
    """The timings of the GPU the simulator stands in for (the operator's policy projects with the
    same ones, `controller.switching.policy_model`), and the pool SGLang sizes from that GPU's memory,
    which is the operator's figure for the same role (`core.capacity`); `--max-total-tokens` only
    lowers it (`mem_cache/kv_cache_configurator.py:3096-3106`)."""
    def server(gpu: str, *flags: str) -> SimulatorServer:
        argv = ["--model-path", "m", "--host", "127.0.0.1", "--port", str(free_port()), "--tp-size", "8",
                "--disaggregation-mode", "decode", "--kv-cache-dtype", "fp8_e4m3", *flags]
        opts = SimulatorOptions(profile="glm-5.2", time_scale=0.01, startup_seconds=0.0, faults="", gpu_type=gpu)
        return SimulatorServer(parse_server_args(argv), opts, argv)

    b300, h200 = server("B300").perf, server("H200").perf
    assert (b300.gpu, h200.gpu) == ("B300", "H200")
    compute = b300.prefill_chunk_compute_seconds(8192)
    assert h200.prefill_chunk_compute_seconds(8192) == pytest.approx(compute * 4500 / 1979)
    planned = {gpu: instance_capacity(PROFILES["glm-5.2"], RoleSpec(layout=LayoutSpec(tp=8)),
                                      HardwareSpec(gpu_type=gpu)).tokens for gpu in ("B300", "H200")}
    assert (b300.kv_capacity_tokens, h200.kv_capacity_tokens) == (planned["B300"], planned["H200"])
    assert 800_000 < h200.kv_capacity_tokens < 850_000 < 4_000_000 < b300.kv_capacity_tokens
    assert server("H200", "--max-total-tokens", "400000").perf.kv_capacity_tokens == 400_000
    assert server("H200", "--max-total-tokens", "5000000").perf.kv_capacity_tokens == planned["H200"]
    with pytest.raises(FlagError, match="unknown simulated GPU type 'A100'"):
        server("A100")


def test_a_layout_whose_weights_leave_no_pool_does_not_start():
    """SGLang stops at start-up when the static fraction holds no KV after the weights
    (`model_executor/pool_configurator.py:94-99`): GLM-5.2's 750 GB on fewer than 8 H200s."""
    with pytest.raises(FlagError, match=r"Not enough memory\. Please try to increase --mem-fraction-static\. "
                                        r"Current value: mem_fraction_static=0\.\d+ \(the weights take 174\.6 GiB"):
        resolved_info("--tp-size", "4")
    argv = ["--model-path", "m", "--port", str(free_port()), "--tp-size", "4"]
    assert main(argv) == 1
    assert resolved_info("--tp-size", "8")["max_total_num_tokens"] > 0


def test_a_page_size_below_one_is_refused_at_start():
    # SGLang divides by it (arg_groups/validation_hook.py:244); the pool is whole pages of it.
    with pytest.raises(FlagError, match="--page-size must be at least 1, got -64"):
        resolved_info("--tp-size", "8", "--page-size", "-64", profile="deepseek-v3")


def test_a_hybrid_models_state_pool_caps_its_running_requests_and_its_pages_hold_tokens_only():
    """SGLang keeps linear-attention states in a pool of their own, sized at start-up before the pages
    get the rest, and caps running requests by its slots (`mem_cache/kv_cache_configurator.py:3133-3150`):
    Kimi K3 on 8 H200s, a decode server, holds 797 states of 276 MiB, fewer than the 2,048 its pages
    alone would let run. A request's pages are its tokens; its state is not among them."""
    argv = ["--model-path", "m", "--host", "127.0.0.1", "--port", str(free_port()), "--tp-size", "8",
            "--disaggregation-mode", "decode", "--kv-cache-dtype", "fp8_e4m3"]
    opts = SimulatorOptions(profile="kimi-k3", time_scale=0.01, startup_seconds=0.0, faults="", gpu_type="H200")
    server = SimulatorServer(parse_server_args(argv), opts, argv)
    planned = instance_capacity(PROFILES["kimi-k3"], RoleSpec(layout=LayoutSpec(tp=8)), HardwareSpec(gpu_type="H200"))
    assert planned.running_cap == planned.state_slots == 797
    assert server.perf.kv_capacity_tokens == planned.tokens
    assert [load["max_running_requests"] for load in server.engine.loads()] == [797]
    assert server.engine._kv_need(SimRequest(prompt_tokens=1000, max_new_tokens=24, streaming=False)) == 1024


def test_simulator_serves_sglangs_resolved_values():
    # EAGLE without --max-running-requests: 48 (arg_groups/speculative_hook.py:1086-1094).
    eagle = resolved_info("--disaggregation-mode", "decode", "--tp-size", "8", "--attn-dp-size", "8",
                          "--speculative-algorithm", "EAGLE")
    assert eagle["max_running_requests"] == 48
    # DSA forces page size 64 whatever --page-size says (arg_groups/model_overrides/deepseek_v2.py:162-173);
    # chunked prefill is divided by attention DP (arg_groups/parallel_hook.py:331) after the 8192 an
    # H200 gets (arg_groups/memory_hook.py:146-157).
    assert eagle["page_size"] == 64 and eagle["chunked_prefill_size"] == 8192 // 8
    assert resolved_info("--page-size", "1")["page_size"] == 64
    # The static memory fraction is computed per role (arg_groups/memory_hook.py:281-343).
    assert resolved_info("--disaggregation-mode", "decode", "--tp-size", "8")["mem_fraction_static"] == 0.929
    # Kimi K3 with DCP: cutedsl_mla decode, trtllm_mla prefill, page size 64 (model_overrides/kimi_k3.py:84-94).
    k3 = resolved_info("--disaggregation-mode", "decode", "--tp-size", "8", "--dcp-size", "8", gpu="B300",
                       profile="kimi-k3")
    assert (k3["decode_attention_backend"], k3["prefill_attention_backend"], k3["page_size"]) == (
        "cutedsl_mla", "trtllm_mla", 64)


def test_each_rank_sizes_its_running_cap_from_its_pool_and_server_info_keeps_the_flag():
    # mem_cache/kv_cache_configurator.py:3119-3131: unset, 512 per context length (131072) of the
    # rank's pool, held to 2048..4096; set, the flag split over attention-DP ranks; at most half the
    # pool either way. /v1/loads reports it (load_inquirer.py:242); /server_info's top level is the
    # resolved flag (utils/common.py:3584-3593).
    def sized(*flags: str) -> tuple[list[int], int | None]:
        argv = ["--model-path", "m", "--host", "127.0.0.1", "--port", str(free_port()), "--tp-size", "8", *flags]
        # B300: its pool (3.9 M tokens) holds each --max-total-tokens below.
        opts = SimulatorOptions(profile="glm-5.2", time_scale=0.01, startup_seconds=0.0, faults="", gpu_type="B300")
        server = SimulatorServer(parse_server_args(argv), opts, argv)
        return [load["max_running_requests"] for load in server.engine.loads()], server.server_info_dict()[
            "max_running_requests"]

    assert sized("--max-total-tokens", "1000000") == ([3906], None)
    assert sized("--max-total-tokens", "200000") == ([2048], None)
    # The capped pool is whole pages of 64 again (lines 3212-3226): 3000 -> 2944 tokens.
    assert sized("--max-total-tokens", "3000") == ([1472], None)
    assert sized("--tp-size", "8", "--attn-dp-size", "4", "--max-running-requests", "64",
                 "--max-total-tokens", "400") == ([16] * 4, 64)
    # The flag caps each DP rank's pool, as each rank's scheduler applies it (lines 3096-3106): 200
    # is 192 tokens on each of the four ranks, not 200 shared by them.
    assert sized("--tp-size", "8", "--attn-dp-size", "4", "--max-running-requests", "512",
                 "--max-total-tokens", "200") == ([96] * 4, 512)
    # Less than a page leaves no pool: SGLang stops at start (model_executor/pool_configurator.py:94-99).
    with pytest.raises(FlagError, match=r"Not enough memory.*--max-total-tokens 20 is less than one page of 64"):
        sized("--max-total-tokens", "20")
    assert main(["--model-path", "m", "--port", str(free_port()), "--tp-size", "8", "--max-total-tokens", "20"]) == 1


def test_a_long_prompt_is_prefilled_in_chunks_out_of_the_waiting_queue_and_continues_first():
    # managers/schedule_policy.py:1140-1222 and 1352-1381, managers/scheduler.py:4176-4184, 4324-4327:
    # each pass extends at most chunked_prefill_size tokens; the cut prompt leaves the waiting queue
    # and goes first in the next passes; /v1/loads shows it only by its rest (load_inquirer.py:104-106).
    engine = make_server("--chunked-prefill-size", "1000").engine
    long, short = SimRequest(prompt_tokens=3500, max_new_tokens=1, streaming=False), SimRequest(
        prompt_tokens=300, max_new_tokens=1, streaming=False)
    engine.waiting.extend([long, short])
    passes, rests = [], []
    while engine.waiting or engine.chunked[0] is not None:
        passes.append([(r.prompt_tokens, r.prefix_len, r.extend_end) for r in engine._take_prefill_batch()])
        load = engine.loads()[0]
        rests.append((load["num_waiting_reqs"], load["num_waiting_uncached_tokens"]))
    assert passes == [[(3500, 0, 1000)], [(3500, 1000, 2000)], [(3500, 2000, 3000)],
                      [(3500, 3000, 3500), (300, 0, 300)]]
    assert rests == [(1, 300 + 3500), (1, 300 + 2500), (1, 300 + 1500), (0, 0)]


def test_simulator_refuses_blackwell_backends_on_hopper():
    # arg_groups/overrides.py:1210-1213, 1243-1246: trtllm_mla / cutedsl_mla raise off SM100.
    with pytest.raises(FlagError, match="Blackwell"):
        resolved_info("--disaggregation-mode", "decode", "--tp-size", "8", "--dcp-size", "8", gpu="H200",
                      profile="kimi-k3")


def test_simulator_refuses_a_kv_dtype_the_attention_backend_cannot_read():
    # arg_groups/overrides.py:541-544: DeepSeek DSA (GLM-5.2 here) takes bf16 or fp8_e4m3 only.
    with pytest.raises(FlagError, match="DeepSeek DSA only supports"):
        make_server("--kv-cache-dtype", "fp8_e5m2")
    # arg_groups/overrides.py:1262-1270: on Hopper's fa3, DeepSeek V3 runs fp8_e5m2 on triton instead.
    from hybridserving_engine.simulator.args import resolve_server_args

    args = parse_server_args(["--model-path", "m", "--kv-cache-dtype", "fp8_e5m2"])
    opts = SimulatorOptions(profile="deepseek-v3", time_scale=0.01, startup_seconds=0.0, faults="", gpu_type="H200")
    assert resolve_server_args(args, opts).attention_backend == "triton"


def test_a_prefill_with_another_kv_cache_dtype_kills_the_decode_server(monkeypatch):
    # disaggregation/common/conn.py:1319-1334: checked when decode first asks the prefill's bootstrap server;
    # the RuntimeError is not caught (disaggregation/decode.py:1200), the scheduler dies and SIGQUITs its
    # server (managers/scheduler.py:6369-6372), which SIGKILLs its process tree and itself
    # (managers/tokenizer_manager.py:4072-4081, utils/common.py:2548-2552).
    exits: list[str] = []
    monkeypatch.setattr(simulator_server, "kill_process", lambda: exits.append("killed"))
    bootstrap = free_port()
    # GLM-5.2 is a DSA model: both page sizes resolve to 64 and agree; the KV dtypes do not.
    prefill = make_server(*pd_flags("prefill", bootstrap), "--page-size", "1", "--kv-cache-dtype", "fp8_e4m3")
    decode = make_server(*pd_flags("decode", bootstrap), "--page-size", "16", "--kv-cache-dtype", "bf16")

    async def check(session, prefill_url, decode_url):
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": bootstrap, "bootstrap_room": 7}
        async with session.post(decode_url + "/generate", json=body) as r:
            answer = await r.text()
        return r.status, answer

    status, answer = run(check, prefill, decode)
    assert status != 200 and "KV cache dtype mismatch" in answer
    assert exits == ["killed"], "the decode server is killed"


@pytest.mark.parametrize("decode, prefill, message", [
    # disaggregation/common/conn.py:1411-1421
    ({"dcp_size": 8}, {"attn_cp_size": 8, "pp_size": 1}, "PD decode DCP currently requires prefill attention CP=1"),
    # disaggregation/common/conn.py:1516-1518
    ({"pp_size": 2}, {"attn_cp_size": 1, "pp_size": 1}, "Decode pp size (2) should be equal to prefill pp size (1)"),
])
def test_decode_dies_on_a_prefill_whose_parallel_layout_it_cannot_take(decode, prefill, message):
    from hybridserving_engine.simulator.bootstrap import HandoffError, KvReceiver

    died: list[str] = []
    receiver = KvReceiver(1.0, on_incompatible=died.append, **decode)
    with pytest.raises(HandoffError, match=re.escape(message)):
        receiver._check_layout({"page_size": 1, "kv_cache_dtype": "auto", **prefill})
    assert died and message in died[0]
    KvReceiver(1.0, dcp_size=8, pp_size=2)._check_layout({"attn_cp_size": 1, "pp_size": 2})  # agrees: no error
    KvReceiver(1.0, pp_size=1)._check_layout({"attn_cp_size": 1, "pp_size": 4})  # decode pp 1 takes any


@pytest.mark.parametrize("flag, value", [("--load-balance-method", "bogus"), ("--cuda-graph-max-bs-decode", "many")])
def test_a_value_sglangs_parser_refuses_makes_the_simulator_exit_2_as_well(flag, value):
    # The value table is the wheel parser's (contract.sglang_flag_values): modelled or not, a flag
    # takes what SGLang takes.
    with pytest.raises(SystemExit) as exited:
        parse_server_args(["--model-path", "m", flag, value])
    assert exited.value.code == 2


def test_unknown_sglang_flags_are_ignored_with_a_note(caplog):
    with caplog.at_level(logging.INFO, logger="hybridserving.simulator"):
        args = parse_server_args(["--model-path", "m", "--tp-size", "8", "--cuda-graph-max-bs-decode", "64",
                                  "--enable-hierarchical-cache"])
    assert args.tp_size == 8 and args.served_model_name == "m"
    assert "--cuda-graph-max-bs-decode" in caplog.text and "--enable-hierarchical-cache" in caplog.text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "fake"], "fake"),
        (["--dcp-size", "2", "--tp-size", "8", "--enable-prefill-cp"], "--enable-prefill-cp"),
        (["--disaggregation-mode", "decode", "--enable-pd-role-switch", "--tp-size", "8", "--dcp-size", "2"],
         "--dcp-size > 1"),
        (["--tp-size", "8", "--dcp-size", "3"], "must divide"),
        # entrypoints/http_server.py:258-261: each tokenizer worker asserts there is no API key.
        (["--tokenizer-worker-num", "2", "--api-key", "k"], "multi-tokenizer mode"),
    ],
)
def test_layouts_sglang_refuses_at_start_up_are_refused(argv, message):
    with pytest.raises(FlagError, match=re.escape(message)):
        parse_server_args(["--model-path", "m", *argv])


def test_deprecated_dp_attention_becomes_attention_dp_as_in_0_5_23():
    args = parse_server_args(["--model-path", "m", "--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"])
    assert (args.attn_dp_size, args.dp_size) == (8, 1)


def test_server_info_reports_dp_attention_whenever_attention_dp_runs():
    # server_args.py:332 (resolved_dict): the deprecated flag's field says whether the attention-DP
    # width is above one, whichever flag set it; `--enable-dp-attention` over one DP rank sets none
    # (arg_groups/parallel_hook.py:50-61).
    assert resolved_info("--tp-size", "8", "--attn-dp-size", "8")["enable_dp_attention"] is True
    assert resolved_info("--tp-size", "8", "--dp-size", "8", "--enable-dp-attention")["enable_dp_attention"] is True
    assert resolved_info("--tp-size", "8", "--enable-dp-attention")["enable_dp_attention"] is False
    assert resolved_info("--tp-size", "8", "--dp-size", "2")["enable_dp_attention"] is False


def test_token_count_is_one_per_four_bytes():
    assert count_tokens("abcd" * 250) == 250
    assert count_tokens("") == 1


# ------------------------------------------------------------------ shapes


def test_info_endpoints_have_sglang_0_5_23_shapes_and_say_simulator():
    server = make_server(*pd_flags("prefill", free_port()), "--tp-size", "8", "--max-running-requests", "64")

    async def check(session, url):
        async with session.get(url + "/server_info") as r:
            info = await r.json()
        for key, kind in [("model_path", str), ("served_model_name", str), ("tp_size", int), ("dp_size", int),
                          ("pp_size", int), ("disaggregation_mode", str), ("version", str),
                          ("max_running_requests", int), ("max_total_num_tokens", int), ("context_length", int),
                          ("internal_states", list), ("load_balance_method", str), ("launch_command", str)]:
            assert isinstance(info[key], kind), key
        assert info["version"] == "0.5.23" and info["simulator"] is True
        assert info["disaggregation_mode"] == "prefill" and info["load_balance_method"] == "follow_bootstrap_room"
        assert info["max_running_requests"] == 64
        async with session.get(url + "/get_server_info") as r:
            assert (await r.json())["tp_size"] == 8
        async with session.get(url + "/v1/models") as r:
            models = await r.json()
        assert models["object"] == "list"
        card = models["data"][0]
        assert card["id"] == "glm-5.2" and card["owned_by"] == "sglang" and card["object"] == "model"
        assert isinstance(card["max_model_len"], int)
        async with session.get(url + "/v1/loads", params={"include": "core,disagg,queues,memory"}) as r:
            loads = await r.json()
        assert set(loads) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
        load = loads["loads"][0]
        for key in ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens",
                    "max_running_requests", "token_usage", "gen_throughput", "utilization"):
            assert isinstance(load[key], (int, float)), key
        assert set(load["disaggregation"]) >= {"mode", "prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs",
                                               "decode_prealloc_queue_reqs", "decode_transfer_queue_reqs"}
        assert set(load["queues"]) == {"waiting", "grammar", "paused", "retracted", "prealloc_ready"}
        async with session.get(url + "/v1/loads", params={"include": "core"}) as r:
            assert "disaggregation" not in (await r.json())["loads"][0]
        # An unknown section: ValueError in to_dict (managers/load_snapshot.py:237-243) outside the
        # handler's try (entrypoints/v1_loads.py:141), a 500.
        async with session.get(url + "/v1/loads", params={"include": "bogus"}) as r:
            assert r.status == 500
        async with session.get(url + "/model_info") as r:
            assert (await r.json())["architectures"] == ["GlmMoeDsaForCausalLM"]
        for path in ("/health", "/health_generate", "/ready"):
            async with session.get(url + path) as r:
                assert r.status == 200, path
        # Like SGLang 0.5.23: no /version (smg would take a /version answer for vLLM) and no /get_load.
        for path in ("/version", "/get_load"):
            async with session.get(url + path) as r:
                assert r.status == 404, path

    run(check, server)


def test_metrics_carry_sglang_names_and_labels():
    server = make_server(*pd_flags("decode", free_port(), "--enable-pd-role-switch"))

    async def check(session, url):
        async with session.get(url + "/metrics") as r:
            text = await r.text()
        for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "kv_used_tokens", "kv_available_tokens",
                     "max_total_num_tokens", "num_prefill_bootstrap_queue_reqs", "num_prefill_inflight_queue_reqs",
                     "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs"):
            assert re.search(rf'^sglang:{name}\{{.*engine_type="dynamic".*tp_rank="0".*\}} ', text, re.M), name
        assert 'sglang:max_total_num_tokens{engine_type="dynamic",model_name="glm-5.2"' in text
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
            assert f"# TYPE sglang:{name} histogram" in text
        for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_total"):
            assert f"# TYPE sglang:{name} counter" in text
        assert "_created" not in text

    run(check, server)
    plain = make_server()
    run(lambda s, url: _status(s, url + "/metrics", 404), plain)


async def _status(session, url, expected):
    async with session.get(url) as r:
        assert r.status == expected


def test_unified_generate_streams_and_answers_openai_shapes():
    server = make_server("--enable-metrics")

    async def check(session, url):
        async with session.post(url + "/generate", json={"text": "abcd" * 40,
                                                         "sampling_params": {"max_new_tokens": 5}}) as r:
            body = await r.json()
        assert body["meta_info"]["prompt_tokens"] == 40 and body["meta_info"]["completion_tokens"] == 5
        assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
        chunks = []
        async with session.post(url + "/generate", json={"input_ids": [1, 2, 3], "stream": True,
                                                         "sampling_params": {"max_new_tokens": 3}}) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            async for line in r.content:
                if line.startswith(b"data: "):
                    chunks.append(line[6:].strip())
        assert chunks[-1] == b"[DONE]" and len(chunks) == 5
        async with session.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}) as r:
            done = await r.json()
        assert done["object"] == "text_completion" and done["usage"]["completion_tokens"] == 4
        async with session.post(url + "/v1/chat/completions",
                                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}) as r:
            chat = await r.json()
        assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
        assert chat["usage"]["completion_tokens"] == 2
        async with session.post(url + "/flush_cache") as r:
            assert r.status == 200

    run(check, server)


def test_generate_meta_info_names_its_retractions_as_sglang_does():
    # managers/tokenizer_manager.py:2507-2513: meta_info opens with the id, the finish reason, the
    # prompt's tokens, the weight version and num_retractions, streamed or not.
    server = make_server()

    async def check(session, url):
        async with session.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}) as r:
            answers = [await r.json()]
        async with session.post(url + "/generate", json={"text": "hi", "stream": True,
                                                         "sampling_params": {"max_new_tokens": 2}}) as r:
            answers += [json.loads(line[6:]) async for line in r.content if line.startswith(b"data: {")]
        for answer in answers:
            assert list(answer["meta_info"])[:5] == ["id", "finish_reason", "prompt_tokens", "weight_version",
                                                     "num_retractions"], answer
            assert answer["meta_info"]["num_retractions"] == 0

    run(check, server)


@pytest.mark.parametrize("flags, reserved", [
    ((), 0),
    (("--speculative-algorithm", "EAGLE"), 4),
    # A draft tree four wide: the DSA backend the profile resolves does not page one, triton does.
    (("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "4",
      "--speculative-num-draft-tokens", "6", "--attention-backend", "triton"), 8),
])
def test_eagle_counts_its_draft_slots_against_the_context(flags, reserved):
    # managers/tokenizer_manager.py:1333-1352 adds compute_num_reserved_tokens() (managers/utils.py:484-500:
    # max(topk * steps, draft tokens) under EAGLE, the auto shape 3/1/4 of speculative_hook.py:1430-1462)
    # to the prompt before comparing it with the context length.
    server = make_server("--context-length", "256", *flags)

    async def check(session, url):
        async with session.post(url + "/generate", json={"input_ids": [1] * (255 - reserved),
                                                         "sampling_params": {"max_new_tokens": 1}}) as r:
            assert r.status == 200, await r.text()
        async with session.post(url + "/generate", json={"input_ids": [1] * (256 - reserved)}) as r:
            assert (r.status, await r.json()) == (400, {"error": {"message": "The input (256 tokens) is longer "
                                                                             "than the model's context length "
                                                                             "(256 tokens)."}})
        async with session.post(url + "/v1/completions", json={"prompt": [1] * 8, "max_tokens": 249}) as r:
            total = 8 + reserved + 249
            assert r.status == (400 if total > 256 else 200), await r.text()
            if total > 256:
                assert f"You requested a total of {total} tokens: {8 + reserved} tokens" in (await r.json())["message"]

    run(check, server)


def test_pd_server_refuses_a_request_without_bootstrap_room_unless_its_backend_is_fake():
    # managers/scheduler.py:3048-3059: aborted with 400, which /generate answers as a ValueError
    # (managers/tokenizer_manager.py:1916-1918, entrypoints/http_server.py:988-990, 2246-2250); the
    # tokenizer numbers the rooms of the fake backend itself (tokenizer_manager.py:1576-1582).
    server = make_server(*pd_flags("decode", free_port()))
    fake = make_server(*pd_flags("decode", free_port()), "--disaggregation-transfer-backend", "fake")

    async def check(session, url, fake_url):
        async with session.post(url + "/generate", json={"text": "hi"}) as r:
            assert r.status == 400
            message = (await r.json())["error"]["message"]
            assert message.startswith("Invalid request: Disaggregated request received without bootstrap room id.")
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        async with session.post(fake_url + "/generate", json=body) as r:
            assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 2
        # SGLang's health check path: fake bootstrap host, no peer needed.
        async with session.post(url + "/generate", json={"input_ids": [0], "bootstrap_host": "2.2.2.2",
                                                         "bootstrap_room": 0,
                                                         "sampling_params": {"max_new_tokens": 1}}) as r:
            assert r.status == 200

    run(check, server, fake)


# ------------------------------------------------------------------ PD hand-over


def test_prefill_and_decode_instances_hand_over_kv_by_bootstrap_room():
    bootstrap = free_port()
    prefill = make_server(*pd_flags("prefill", bootstrap), "--tp-size", "8")
    # KV for one request only (prompt 250 + 8 output tokens; five pages of 64): the second waits in
    # the prealloc queue.
    decode = make_server(*pd_flags("decode", free_port()), "--tp-size", "8", "--max-total-tokens", "320")

    async def pair(session, p_url, d_url, room):
        body = {"text": "abcd" * 250, "sampling_params": {"max_new_tokens": 8}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": bootstrap, "bootstrap_room": room}
        p_task = session.post(p_url + "/generate", json=body)
        d_task = session.post(d_url + "/generate", json=body)
        p_resp, d_resp = await asyncio.gather(p_task, d_task)
        return await p_resp.json(), await d_resp.json()

    async def check(session, p_url, d_url):
        first = asyncio.create_task(pair(session, p_url, d_url, 11))
        second = asyncio.create_task(pair(session, p_url, d_url, 12))
        queued = 0
        while not (first.done() and second.done()):
            async with session.get(d_url + "/v1/loads") as r:
                load = (await r.json())["loads"][0]
            disagg = load["disaggregation"]
            queued = max(queued, disagg["decode_prealloc_queue_reqs"])
            # A decode's waiting requests are its prealloc and transfer queues, none of them prompt
            # tokens to compute (scheduler_components/load_inquirer.py:84-85, 121-141).
            assert load["num_waiting_reqs"] == (disagg["decode_prealloc_queue_reqs"]
                                                + disagg["decode_transfer_queue_reqs"])
            assert load["num_waiting_uncached_tokens"] == 0
            await asyncio.sleep(0.005)
        for p_body, d_body in (first.result(), second.result()):
            assert p_body["meta_info"]["completion_tokens"] == 1
            assert d_body["meta_info"]["completion_tokens"] == 8
        assert queued == 1
        async with session.get(p_url + "/metrics") as r:
            p_metrics = await r.text()
        async with session.get(d_url + "/metrics") as r:
            d_metrics = await r.text()
        # The latency histograms are the decode's: a PD prefill observes no TTFT, so no
        # inter-token latency, and no TPOT (managers/tokenizer_manager.py:3235-3247, 3276-3284).
        for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                     "request_time_per_output_token_seconds"):
            assert metric_sum(p_metrics, f"sglang:{hist}_count") == 0, hist
        assert metric_sum(d_metrics, "sglang:time_to_first_token_seconds_count") == 2
        assert metric_sum(d_metrics, "sglang:request_time_per_output_token_seconds_count") == 2
        assert metric_sum(d_metrics, "sglang:inter_token_latency_seconds_count") > 0
        realtime = "sglang:realtime_tokens_total"
        assert metric_sum(p_metrics, realtime, mode="prefill_compute") == 500
        assert metric_sum(p_metrics, realtime, mode="decode") == 0
        assert metric_sum(d_metrics, realtime, mode="prefill_compute") == 0
        assert metric_sum(d_metrics, realtime, mode="decode") == 14
        # Only the prefill times the KV it sent, once per request on each of its 8 schedulers, and
        # keeps the last latency for /v1/loads: disaggregation/prefill.py:1243-1262 is the only caller
        # of compute_and_observe_kv_transfer_metrics (observability/req_time_stats.py:954-998).
        mib = 250 * prefill.perf.kv_wire_bytes_per_token / 2**20
        assert metric_sum(p_metrics, "sglang:kv_transfer_latency_ms_count") == 2 * 8
        assert metric_sum(p_metrics, "sglang:kv_transfer_total_mb_sum") == pytest.approx(2 * 8 * mib)
        assert metric_sum(p_metrics, "sglang:kv_transfer_speed_gb_s_count") == 2 * 8
        for hist in ("latency_ms", "total_mb", "speed_gb_s"):
            assert not samples(d_metrics, f"sglang:kv_transfer_{hist}_count"), hist
        for url, sent in ((p_url, True), (d_url, False)):
            async with session.get(url + "/v1/loads") as r:
                disagg = (await r.json())["loads"][0]["disaggregation"]
            assert (disagg["kv_transfer_latency_ms"] > 0, disagg["kv_transfer_speed_gb_s"] > 0) == (sent, sent)
        async with session.get(f"http://127.0.0.1:{bootstrap}/route", params={
                "prefill_dp_rank": "-1", "prefill_cp_rank": "-1", "target_tp_rank": "-1",
                "target_pp_rank": "-1"}) as r:
            layout = await r.json()
        assert layout["attn_tp_size"] == 8 and layout["follow_bootstrap_room"] is True

    run(check, prefill, decode)


def test_a_prefill_request_waiting_for_its_decode_peer_is_waiting_without_prompt_tokens():
    """The bootstrap queue counts in `num_waiting_reqs` (scheduler_components/load_inquirer.py:116-119,
    141) but its prompts are not in `num_waiting_uncached_tokens` (lines 82-107) nor in
    `queues.waiting` (line 219); a prefill's running batch stays empty (metrics_reporter.py:854-855).
    The operator divides those tokens by the waiting queue's requests alone."""
    server = make_server(*pd_flags("prefill", free_port()))

    async def check(session, url):
        stuck = asyncio.create_task(session.post(url + "/generate", json={
            "text": "abcd" * 100, "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 5}))
        await asyncio.sleep(0.1)
        async with session.get(url + "/v1/loads", params={"include": "core,disagg,queues"}) as r:
            loads = await r.json()
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        return loads

    loads = run(check, server)
    (load,) = loads["loads"]
    assert load["disaggregation"]["prefill_bootstrap_queue_reqs"] == 1 and load["num_waiting_reqs"] == 1
    assert load["queues"]["waiting"] == 0 and load["num_waiting_uncached_tokens"] == 0
    assert load["num_running_reqs"] == 0 and load["num_total_tokens"] == 100
    observed = instance_metrics("prefill", loads, None, None)
    assert (observed.prefill_queue_reqs, observed.prefill_queue_tokens, observed.running_reqs) == (0, 0, 0)


def test_every_tp_rank_times_its_forward_passes_and_the_busy_fraction_is_per_gpu(monkeypatch):
    """Each scheduler process has its own collector and device timer
    (observability/metrics_collector.py:1374-1399, metrics_reporter.py:325-339), so a TP-8 leader
    shows eight forward-timer series; the gauges come from the logging rank only (1361-1367)."""
    monkeypatch.setenv("SGLANG_ENABLE_METRICS_DEVICE_TIMER", "1")
    server = make_server("--enable-metrics", "--tp-size", "8")

    async def check(session, url):
        async with session.get(url + "/metrics") as r:
            before = await r.text()
        for _ in range(3):
            async with session.post(url + "/generate", json={"text": "abcd" * 400,
                                                             "sampling_params": {"max_new_tokens": 20}}) as r:
                assert r.status == 200
        async with session.get(url + "/metrics") as r:
            return before, await r.text()

    before, after = run(check, server)
    forward = "sglang:forward_execution_seconds_total"
    ranks = {s.labels["tp_rank"] for s in samples(after, forward)}
    assert ranks == {str(r) for r in range(8)}
    assert all("dp_rank" not in s.labels for s in samples(after, forward))
    assert {s.labels["tp_rank"] for s in samples(after, "sglang:num_running_reqs")} == {"0"}
    one_rank = sum(metric_sum(after, forward, tp_rank="0", category=c) - metric_sum(before, forward, tp_rank="0",
                                                                                      category=c)
                   for c in ("extend", "decode"))
    assert one_rank > 0
    busy = busy_fraction(Scrape.parse(after, 1000.0), Scrape.parse(before, 0.0))
    assert busy == pytest.approx(one_rank / 1000.0)


def test_attention_dp_ranks_each_report_their_own_load_and_time_idle_passes(monkeypatch):
    """/v1/loads has an entry per DP rank (managers/load_snapshot.py:516; runtime_context.py:207),
    `num_accelerators` counts one rank's (entrypoints/v1_loads.py:44-54), and a rank's pool and
    running cap are its own (scheduler_components/load_inquirer.py:241-242,
    model_executor/pool_configurator.py:956). DP-attention ranks without work run "idle" passes
    (model_executor/runner/eager_runner.py:460); every series carries dp_rank
    (observability/metrics_collector.py:1391-1392)."""
    monkeypatch.setenv("SGLANG_ENABLE_METRICS_DEVICE_TIMER", "1")
    server = make_server("--enable-metrics", "--tp-size", "8", "--attn-dp-size", "4", "--max-running-requests", "64",
                         time_scale=0.1)

    async def check(session, url):
        # Round robin (the default off prefill) sends them to DP ranks 0, 1 and 2.
        tasks = [asyncio.create_task(session.post(url + "/generate", json={
            "text": "abcd" * 100, "sampling_params": {"max_new_tokens": 400}})) for _ in range(3)]
        for _ in range(200):
            async with session.get(url + "/v1/loads") as r:
                loads = await r.json()
            if sum(load["num_running_reqs"] for load in loads["loads"]) == 3:
                break
            await asyncio.sleep(0.01)
        async with session.get(url + "/v1/loads", params={"dp_rank": "2"}) as r:
            one_rank = await r.json()
        async with session.get(url + "/metrics") as r:
            text = await r.text()
        async with session.get(url + "/server_info") as r:
            info = await r.json()
        async with session.post(url + "/pause_generation", json={"mode": "abort"}) as r:
            assert r.status == 200
        for task in tasks:
            (await task).release()
        return loads, one_rank, text, info

    loads, one_rank, text, info = run(check, server)
    assert loads["num_accelerators"] == 2
    entries = loads["loads"]
    assert [e["dp_rank"] for e in entries] == [0, 1, 2, 3]
    # dp_rank keeps that rank's entry (managers/tokenizer_control_mixin.py:1017-1026).
    assert [(e["dp_rank"], e["num_running_reqs"]) for e in one_rank["loads"]] == [(2, 1)]
    assert one_rank["num_accelerators"] == 2
    assert [e["num_running_reqs"] for e in entries] == [1, 1, 1, 0]
    assert {e["max_running_requests"] for e in entries} == {16}
    caps = {e["max_total_num_tokens"] for e in entries}
    assert len(caps) == 1 and entries[3]["num_used_tokens"] == 0 < entries[0]["num_used_tokens"]
    # /server_info gives one rank's pool (`managers/data_parallel_controller.py:821`), not the instance's.
    assert info["max_total_num_tokens"] == entries[0]["max_total_num_tokens"]
    assert entries[0]["token_usage"] == round(entries[0]["num_used_tokens"] / caps.pop(), 4)
    running = {s.labels["dp_rank"]: s.value for s in samples(text, "sglang:num_running_reqs")}
    assert running == {"0": 1, "1": 1, "2": 1, "3": 0}
    idle = {s.labels["tp_rank"] for s in samples(text, "sglang:forward_execution_seconds_total")
            if s.labels["category"] == "idle"}
    assert idle == {"6", "7"}, "DP rank 3 (TP ranks 6 and 7) had no work"
    observed = instance_metrics("decode", loads, Scrape.parse(text, 1.0), None)
    assert observed.running_reqs == 3
    assert observed.kv_usage == pytest.approx(sum(e["token_usage"] for e in entries) / 4)


# ------------------------------------------------------------------ role switch


async def _switch(session, url, new_role, **extra):
    async with session.post(url + "/pd_role_switch", json={"new_role": new_role, **extra}) as r:
        return r.status, await r.json()


def test_role_switch_refusals_carry_safe_to_restore():
    no_flag = make_server(*pd_flags("prefill", free_port()))
    nixl = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch",
                                 "--disaggregation-transfer-backend", "nixl"))
    busy = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"))

    async def check(session, no_flag_url, nixl_url, busy_url):
        status, body = await _switch(session, no_flag_url, "decode")
        assert status == 400 and body["safe_to_restore"] is True and "--enable-pd-role-switch" in body["message"]
        # The whole PdRoleSwitchReqOutput (entrypoints/http_server.py:1646-1649, utils/msgspec_utils.py:38-44).
        assert list(body) == ["rid", "http_worker_ipc", "success", "message", "old_role", "new_role", "safe_to_restore"]
        status, body = await _switch(session, nixl_url, "decode")
        assert status == 400 and body["safe_to_restore"] is True and "nixl" in body["message"]
        # A prefill request whose decode peer never comes sits in the bootstrap queue: not idle.
        stuck = asyncio.create_task(session.post(busy_url + "/generate", json={
            "text": "hi", "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 5}))
        await asyncio.sleep(0.1)
        status, body = await _switch(session, busy_url, "decode", decode_cuda_graph_memory_gb=1.0)
        assert status == 400 and body["safe_to_restore"] is True and "not idle" in body["message"]
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)

    run(check, no_flag, nixl, busy)


def test_a_prepare_only_role_switch_checks_and_switches_nothing():
    # disaggregation/role_switch.py:113-121: once every check passes, prepare_only answers "ready"
    # with safe_to_restore and tears nothing down; a check that fails refuses as without it. The
    # tokenizer manager says "ready" for any success of a prepare, the same role's too, and
    # records no new role (managers/tokenizer_control_mixin.py:944-958).
    server = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"))

    async def check(session, url):
        status, body = await _switch(session, url, "decode", decode_cuda_graph_memory_gb=1.0, prepare_only=True)
        assert (status, body) == (200, {"rid": None, "http_worker_ipc": None, "success": True, "message": "ready",
                                        "old_role": "prefill", "new_role": "decode", "safe_to_restore": True})
        assert server.engine.role == "prefill"
        async with session.get(url + "/model_info") as r:
            assert (await r.json())["disaggregation_mode"] == "prefill"
        status, body = await _switch(session, url, "decode", prepare_only=True)
        assert status == 400 and "decode_cuda_graph_memory_gb is required" in body["message"]
        status, body = await _switch(session, url, "prefill", prepare_only=True)
        assert status == 200 and (body["message"], body["safe_to_restore"]) == ("ready", False)
        status, body = await _switch(session, url, "decode", decode_cuda_graph_memory_gb=1.0)
        assert status == 200 and body["message"] == "ok" and server.engine.role == "decode"

    run(check, server)


@pytest.mark.slow
def test_what_arrives_during_a_role_switch_waits_for_it_and_a_failed_rebuild_breaks_the_instance(monkeypatch):
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2")  # an unhealthy engine's /health gives up after it
    flaky = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"), faults="fail_rebuild")
    good = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"))

    async def check(session, flaky_url, good_url):
        status, body = await _switch(session, good_url, "decode")
        assert status == 400 and body["safe_to_restore"] is True and "decode_cuda_graph_memory_gb" in body["message"]
        first = asyncio.create_task(_switch(session, good_url, "decode", decode_cuda_graph_memory_gb=1.0))
        await asyncio.sleep(0.02)  # in-place switch takes 12 s x 0.01
        # Sent during the switch: a second switch queues behind it in the tokenizer's FIFO
        # (managers/communicator.py:41-57) and finds the role it asks for, a success whose old role
        # is the new one; a request and a health check wait for the scheduler (role_switch.py:123-166)
        # and the request is served in the new role: a decode's output, not a prefill's one token.
        second = asyncio.create_task(_switch(session, good_url, "decode"))
        request = asyncio.create_task(session.post(good_url + "/generate", json={
            "input_ids": [0], "bootstrap_host": "2.2.2.2", "bootstrap_room": 0,
            "sampling_params": {"max_new_tokens": 3}}))
        health = asyncio.create_task(session.get(good_url + "/health"))
        # /server_info asks the scheduler for its internal states (entrypoints/http_server.py:876-878).
        info = asyncio.create_task(session.get(good_url + "/server_info"))
        await asyncio.sleep(0.02)
        assert not good.engine.responds() and not request.done()
        status, body = await first
        assert status == 200 and body == {"rid": None, "http_worker_ipc": None, "success": True, "message": "ok",
                                          "old_role": "prefill", "new_role": "decode", "safe_to_restore": False}
        status, body = await second
        assert status == 200 and body == {"rid": None, "http_worker_ipc": None, "success": True, "message": "ok",
                                          "old_role": "decode", "new_role": "decode", "safe_to_restore": False}
        async with await request as r:
            assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 3
        async with await health as r:
            assert r.status == 200
        async with await info as r:
            assert (await r.json())["internal_states"][0]["disaggregation_mode"] == "decode"
        # The live role is in /model_info and internal_states; /server_info's top level is the
        # start-up configuration (sglang/srt/entrypoints/http_server.py:834-836, 863-892).
        async with session.get(good_url + "/server_info") as r:
            info = await r.json()
            assert info["disaggregation_mode"] == "prefill"
            assert info["internal_states"][0]["disaggregation_mode"] == "decode"
        async with session.get(good_url + "/model_info") as r:
            assert (await r.json())["disaggregation_mode"] == "decode"

        status, body = await _switch(session, flaky_url, "decode", decode_cuda_graph_memory_gb=1.0)
        assert status == 400 and body["safe_to_restore"] is False and "restart required" in body["message"]
        # SGLang's HTTP layer does not read the scheduler's broken flag: /ready stays 200 until a
        # health check gets no output (disaggregation/role_switch.py:135, 184;
        # managers/tokenizer_manager.py:728-734; entrypoints/http_server.py:776-799).
        async with session.get(flaky_url + "/ready") as r:
            assert r.status == 200
        async with session.get(flaky_url + "/health") as r:
            assert r.status == 503
        async with session.get(flaky_url + "/ready") as r:
            assert r.status == 503
        status, body = await _switch(session, flaky_url, "decode", decode_cuda_graph_memory_gb=1.0)
        assert body["safe_to_restore"] is False and "unhealthy" in body["message"]

    run(check, flaky, good)


def test_fault_endpoint_slows_forward_passes_and_refuses_switches():
    server = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"))

    async def check(session, url):
        async with session.post(url + "/sim/faults", json={"refuse_switch": True, "slow": 3}) as r:
            faults = await r.json()
        assert faults["refuse_switch"] is True and faults["slow_factor"] == 3.0 and faults["simulator"] is True
        status, body = await _switch(session, url, "decode", decode_cuda_graph_memory_gb=1.0)
        assert status == 400 and body["safe_to_restore"] is True
        async with session.post(url + "/sim/faults", json={"no_such_fault": 1}) as r:
            assert r.status == 400

    run(check, server)


def test_the_scheduler_watchdog_kills_a_server_stalled_mid_batch_but_never_an_idle_one(monkeypatch, caplog):
    # utils/watchdog.py:133-163 with managers/scheduler_components/invariant_checker.py:494-527: armed
    # while the scheduler holds a batch (cur_batch_for_debug, managers/scheduler.py:2044), it fires once
    # the forward count (line 4621) has not moved for --watchdog-timeout; the soft one only reports; the
    # hard one waits 5 s (patched out here) and SIGQUITs the main process, which kills itself.
    kills: list[float] = []
    monkeypatch.setattr(simulator_server, "kill_process", lambda: kills.append(time.monotonic()))
    monkeypatch.setattr(simulator_server, "WATCHDOG_GRACE_S", 0.0)
    server = make_server("--watchdog-timeout", "0.4", "--soft-watchdog-timeout", "0.2", faults="stall_scheduler")
    assert (server.args.watchdog_timeout, server.args.soft_watchdog_timeout) == (0.4, 0.2)

    async def generate(session, url, tokens):
        async with session.post(url + "/generate", json={"input_ids": [1] * 16,
                                                         "sampling_params": {"max_new_tokens": tokens}}) as r:
            return r.status

    async def check(session, url):
        # A scheduler hung while idle holds no batch, and a request it never takes up arms nothing.
        waiting = asyncio.create_task(generate(session, url, 1))
        await asyncio.sleep(1.0)
        assert not kills and server.engine.forward_ct == 0 and not server.engine.has_current_batch
        async with session.post(url + "/sim/faults", json={"stall_scheduler": False}) as r:
            assert r.status == 200
        assert await asyncio.wait_for(waiting, 5) == 200
        long = asyncio.create_task(generate(session, url, 100000))
        while server.engine.forward_ct < 3:
            await asyncio.sleep(0.01)
        async with session.post(url + "/sim/faults", json={"stall_scheduler": True}) as r:
            assert r.status == 200
        stalled_at = time.monotonic()
        while not kills and time.monotonic() < stalled_at + 5:
            await asyncio.sleep(0.02)
        long.cancel()
        await asyncio.gather(long, return_exceptions=True)
        return stalled_at

    with caplog.at_level(logging.ERROR, logger="hybridserving.simulator"):
        stalled_at = run(check, server)
    assert len(kills) == 1 and 0.4 <= kills[0] - stalled_at <= 1.5, (kills, stalled_at)
    reports = [r.getMessage() for r in caplog.records if "watchdog timeout" in r.getMessage()]
    assert reports[0] == "Scheduler watchdog timeout (self.watchdog_timeout=0.2, self.soft=True)", reports
    assert "Scheduler watchdog timeout (self.watchdog_timeout=0.4, self.soft=False)" in reports


def test_a_pause_in_place_keeps_the_batch_that_arms_the_watchdog_and_an_abort_drops_it():
    # managers/scheduler.py:5817-5830 (in_place leaves cur_batch_for_debug), 5881-5882 (retract clears
    # it); abort never reaches the scheduler, which runs on to an idle round
    # (managers/tokenizer_manager.py:2267-2280).
    server = make_server()

    async def check(session, url):
        pending = asyncio.create_task(session.post(url + "/generate", json={
            "input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 100000}}))
        while server.engine.forward_ct < 3:
            await asyncio.sleep(0.01)
        for mode, armed in (("in_place", True), ("retract", False), ("abort", False)):
            async with session.post(url + "/continue_generation", json={}) as r:
                assert r.status == 200
            await asyncio.sleep(0.05)
            assert server.engine.has_current_batch
            async with session.post(url + "/pause_generation", json={"mode": mode}) as r:
                assert r.status == 200
            await asyncio.sleep(0.05)
            assert server.engine.has_current_batch is armed, mode
        (await pending).close()

    run(check, server)


def test_a_pause_holds_new_requests_before_the_scheduler_where_a_switch_and_sigterm_find_them():
    # managers/tokenizer_manager.py:938-939: the tokenizer holds a request sent while paused before
    # the scheduler sees it, so no queue of /v1/loads counts it and queues.paused stays 0, as always
    # in 0.5.23 (metrics_reporter.py:875-876, 1102-1103); the scheduler is idle (role_switch.py:73),
    # so a switch goes ahead and the request is served in the new role once generation continues.
    # SIGTERM's drain waits for it all the same (rid_to_state, tokenizer_manager.py:3508-3545).
    server = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"))

    async def check(session, url):
        async with session.post(url + "/pause_generation", json={"mode": "in_place"}) as r:
            assert r.status == 200
        held = asyncio.create_task(session.post(url + "/generate", json={
            "input_ids": [0], "bootstrap_host": "2.2.2.2", "bootstrap_room": 0,
            "sampling_params": {"max_new_tokens": 3}}))
        await asyncio.sleep(0.05)
        async with session.get(url + "/v1/loads", params={"include": "all"}) as r:
            loads = await r.json()
        assert inflight_requests(loads) == 0 and [load["queues"]["paused"] for load in loads["loads"]] == [0]
        status, body = await _switch(session, url, "decode", decode_cuda_graph_memory_gb=1.0)
        assert status == 200 and body["success"] is True
        shutting = asyncio.create_task(server.shut_down())
        await asyncio.sleep(0.5)
        assert not shutting.done() and not held.done()
        async with session.post(url + "/continue_generation", json={}) as r:
            assert r.status == 200
        async with await held as r:
            assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 3
        await asyncio.wait_for(shutting, 5)

    run(check, server)


@pytest.mark.slow
def test_a_stalled_scheduler_holds_its_requests_and_sigterm_after_a_failed_health_check_stops_at_once(monkeypatch):
    # managers/tokenizer_manager.py:3508-3524: SIGTERM waits for requests in flight unless the last
    # health check failed (server_status UnHealthy, entrypoints/http_server.py:798), then exits at once.
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")
    assert Faults.parse("stall_scheduler").stall_scheduler
    server = make_server(faults="stall_scheduler")

    async def generate(session, url):
        async with session.post(url + "/generate", json={"text": "abcd" * 40,
                                                         "sampling_params": {"max_new_tokens": 4}}) as r:
            return r.status, (await r.json())["meta_info"]["completion_tokens"]

    async def check(session, url):
        held = asyncio.create_task(generate(session, url))
        await asyncio.sleep(0.5)  # about 5 ms of work at time scale 0.01
        assert not held.done() and not server.engine.is_idle()
        async with session.post(url + "/sim/faults", json={"stall_scheduler": False}) as r:
            assert r.status == 200
        assert await asyncio.wait_for(held, 5) == (200, 4), "a released scheduler goes on"

        async with session.post(url + "/sim/faults", json={"stall_scheduler": True}) as r:
            assert r.status == 200
        stuck = asyncio.create_task(generate(session, url))
        while server.engine.is_idle():
            await asyncio.sleep(0.01)
        async with session.get(url + "/health") as r:
            assert r.status == 503
        await asyncio.wait_for(server.shut_down(), 1.0)
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)

    run(check, server)


@pytest.mark.slow
def test_sigterm_turns_health_503_and_serves_every_request_in_flight_before_stopping():
    # managers/tokenizer_manager.py:3508-3545, 4066-4070: SIGTERM sets gracefully_exit (/health,
    # /ping and /ready answer 503: entrypoints/http_server.py:717, 731-733, 2198), the watchdog
    # waits while rid_to_state holds requests, and generate_request refuses nothing meanwhile.
    server = make_server(time_scale=0.5)

    async def generate(session, url, tokens):
        async with session.post(url + "/generate", json={"text": "abcd" * 40,
                                                         "sampling_params": {"max_new_tokens": tokens}}) as r:
            return r.status, (await r.json())["meta_info"]["completion_tokens"]

    async def check(session, url):
        first = asyncio.create_task(generate(session, url, 60))
        while server.engine.is_idle():
            await asyncio.sleep(0.01)
        shutting = asyncio.create_task(server.shut_down())
        await asyncio.sleep(0.05)
        for path in ("/health", "/ping", "/ready"):
            async with session.get(url + path) as r:
                assert r.status == 503, path
        late = await generate(session, url, 2)
        assert not shutting.done(), "the server stopped with a request in flight"
        assert await first == (200, 60) and late == (200, 2)
        await shutting
        with pytest.raises(aiohttp.ClientError):
            await generate(session, url, 1)

    run(check, server)


def test_a_health_check_waiting_when_sigterm_comes_passes_and_the_drain_goes_on(monkeypatch):
    # entrypoints/http_server.py:731 looks at gracefully_exit on entry only; inside the loop
    # (lines 776-783) any output of the scheduler answers 200 and sets the status Up, so a check
    # under way at SIGTERM does not turn the server UnHealthy and stop it with work in flight.
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "3")
    server = make_server(time_scale=0.5)

    async def check(session, url):
        generating = asyncio.create_task(session.post(url + "/generate", json={
            "text": "abcd" * 40, "sampling_params": {"max_new_tokens": 60}}))
        while server.engine.is_idle():
            await asyncio.sleep(0.01)
        health = asyncio.create_task(session.get(url + "/health"))
        await asyncio.sleep(0.2)
        shutting = asyncio.create_task(server.shut_down())
        answer = await health
        assert answer.status == 200 and server.server_status is simulator_server.ServerStatus.UP
        assert not shutting.done(), "the server stopped with a request in flight"
        resp = await generating
        assert resp.status == 200 and (await resp.json())["meta_info"]["completion_tokens"] == 60
        await shutting

    run(check, server)


@dataclass
class TwoNodes:
    """Rank 0 and rank 1 of one instance, each on a host of its own, serving on one port."""

    leader: SimulatorProcess
    worker: subprocess.Popen
    port: int


@pytest.fixture
def two_nodes():
    """Start a two-node instance (rank 0 ready first); the worker's stderr is a text pipe."""
    started: list[TwoNodes] = []

    def start(*extra: str) -> TwoNodes:
        port = free_port()
        common = ["--model-path", "m", "--port", str(port), "--tp-size", "16", "--nnodes", "2",
                  "--dist-init-addr", f"127.0.0.1:{free_port()}", *extra]
        leader = SimulatorProcess([*common, "--host", "127.0.0.1", "--node-rank", "0"],
                                  env=simulator_env(time_scale=0.01)).wait_ready()
        worker = subprocess.Popen([*leader.proc.args[:3], *common, "--host", "127.0.0.2", "--node-rank", "1"],
                                  env=simulator_env(startup_seconds=0.3),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(TwoNodes(leader, worker, port))
        while "serving its health check" not in worker.stderr.readline():  # its schedulers are up
            assert worker.poll() is None
        return started[-1]

    yield start
    for nodes in started:
        nodes.leader.stop()
        if nodes.worker.poll() is None:
            nodes.worker.kill()
            nodes.worker.wait()


def test_worker_rank_serves_the_dummy_health_check_and_ignores_sigterm_until_rank_0_stops(two_nodes):
    # entrypoints/engine.py:1234-1284: once its schedulers are up a non-zero rank serves
    # launch_dummy_health_check_server (utils/common.py:3624-3664: /ping, /health, /health_generate,
    # no key) on its own --host:--port, logs SIGTERM and waits for rank 0's shutdown.
    nodes = two_nodes("--api-key", "k")
    worker_url = f"http://127.0.0.2:{nodes.port}"
    for path in ("/ping", "/health", "/health_generate"):
        assert http_status(worker_url + path) == 200, path
    for path in ("/ready", "/metrics", "/v1/loads"):
        assert http_status(worker_url + path) == 404, path
    nodes.worker.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    assert nodes.worker.poll() is None, "the worker rank stopped before rank 0"
    nodes.leader.stop()
    assert nodes.worker.wait(15) == 0


def test_worker_rank_exits_when_rank_0_stops_without_a_signal_of_its_own(two_nodes):
    # entrypoints/engine.py:1015-1026, 1287: a worker rank's main process blocks until its schedulers
    # exit, and they exit with rank 0's ShutdownReq broadcast (lines 1261-1263): a leader that stops, or
    # restarts, takes the worker's engine with it, SIGTERM or not.
    nodes = two_nodes()
    assert http_status(f"http://127.0.0.2:{nodes.port}/health") == 200
    nodes.leader.stop()
    try:
        _, log = nodes.worker.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        nodes.worker.kill()
        pytest.fail(f"the worker rank outlived rank 0:\n{nodes.worker.communicate()[1]}")
    assert nodes.worker.returncode == 0 and "rank 0 stopped" in log


def test_a_faults_file_is_read_at_every_start_and_adds_to_the_env_faults(tmp_path):
    path = tmp_path / "faults"
    env = {"HYBRIDSERVING_SIM_FAULTS": "slow=2", "HYBRIDSERVING_SIM_FAULTS_FILE": str(path)}
    assert SimulatorOptions.from_env(env).faults == "slow=2", "an absent file adds nothing"
    path.write_text("crash_on_start\n")
    assert Faults.parse(SimulatorOptions.from_env(env).faults) == Faults(crash_on_start=True, slow_factor=2.0)
    path.write_text("")
    assert not Faults.parse(SimulatorOptions.from_env(env).faults).crash_on_start, "emptied: the next start serves"


def test_generation_limits_are_read_and_refused_as_sglang_reads_them():
    # sampling/sampling_params.py:285-289 (a negative max_new_tokens), managers/io_struct.py:488-499
    # (empty input_ids without a session), entrypoints/openai/protocol.py:1214 (the first of
    # max_completion_tokens and max_tokens that is set and not 0).
    server = make_server()

    async def check(session, url):
        for body, said in (({"text": "hi", "sampling_params": {"max_new_tokens": -1}},
                            "max_new_tokens must be at least 0, got -1."),
                           ({"input_ids": []}, "input_ids cannot be empty.")):
            async with session.post(url + "/generate", json=body) as r:
                assert r.status == 400 and (await r.json())["error"]["message"] == said, body
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": None, "max_tokens": 3}
        async with session.post(url + "/v1/chat/completions", json=chat) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
        async with session.post(url + "/v1/chat/completions", json={**chat, "max_tokens": -2}) as r:
            assert r.status == 400 and "max_new_tokens must be at least 0, got -2." in (await r.json())["message"]

    run(check, server)


def test_a_request_for_no_tokens_is_prefilled_and_answered_with_none_its_ttft_observed():
    # managers/schedule_batch.py:1501-1506 (is_prefill_only), 2038-2042 (finished at length 0, the
    # dummy id of tp_worker.py:742-751 cut off), tokenizer_manager.py:3235-3246 (TTFT on that output);
    # a PD prefill answers its one token at length 0 (disaggregation/prefill.py:1225-1226).
    unified = make_server("--enable-metrics")

    async def check_unified(session, url):
        nothing = {"type": "length", "length": 0}
        async with session.post(url + "/generate", json={"text": "abcd" * 40,
                                                         "sampling_params": {"max_new_tokens": 0}}) as r:
            body = await r.json()
        assert r.status == 200 and body["text"] == "" and body["output_ids"] == []
        assert body["meta_info"]["completion_tokens"] == 0 and body["meta_info"]["finish_reason"] == nothing
        chunks = []
        async with session.post(url + "/generate", json={"input_ids": [1, 2, 3], "stream": True,
                                                         "sampling_params": {"max_new_tokens": 0}}) as r:
            async for line in r.content:
                if line.startswith(b"data: "):
                    chunks.append(line[6:].strip())
        assert chunks[-1] == b"[DONE]" and len(chunks) == 2, chunks
        assert json.loads(chunks[0])["meta_info"]["finish_reason"] == nothing
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0, "max_tokens": 0}
        async with session.post(url + "/v1/chat/completions", json=chat) as r:
            answer = await r.json()
        assert answer["usage"]["completion_tokens"] == 0 and answer["choices"][0]["finish_reason"] == "length"
        async with session.get(url + "/metrics") as r:
            metrics = await r.text()
        assert metric_sum(metrics, "sglang:time_to_first_token_seconds_count") == 3
        assert metric_sum(metrics, "sglang:inter_token_latency_seconds_count") == 0
        assert metric_sum(metrics, "sglang:generation_tokens_total") == 0

    run(check_unified, unified)

    bootstrap = free_port()
    prefill = make_server(*pd_flags("prefill", bootstrap))
    decode = make_server(*pd_flags("decode", free_port()))

    async def check_pd(session, p_url, d_url):
        body = {"text": "abcd" * 250, "sampling_params": {"max_new_tokens": 0}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": bootstrap, "bootstrap_room": 7}
        p_resp, d_resp = await asyncio.gather(session.post(p_url + "/generate", json=body),
                                              session.post(d_url + "/generate", json=body))
        p_body, d_body = await p_resp.json(), await d_resp.json()
        assert p_body["meta_info"]["completion_tokens"] == 1
        assert p_body["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert d_body["meta_info"]["completion_tokens"] == 0 and d_body["text"] == ""
        async with session.get(d_url + "/metrics") as r:
            assert metric_sum(await r.text(), "sglang:time_to_first_token_seconds_count") == 1

    run(check_pd, prefill, decode)


def test_a_role_switch_body_sglangs_types_refuse_is_a_validation_error_and_switches_nothing():
    # managers/io_struct.py:2265-2274: new_role is Literal["prefill", "decode", ""], taken as
    # written, and the graph memory a float; FastAPI refuses anything else before the handler, so
    # the answer is its validation error, without the handler's safe_to_restore.
    server = make_server(*pd_flags("prefill", free_port(), "--enable-pd-role-switch"))

    async def check(session, url):
        for body in ({"new_role": "Decode"}, {"new_role": "null"},
                     {"new_role": "decode", "decode_cuda_graph_memory_gb": "lots"}):
            async with session.post(url + "/pd_role_switch", json=body) as r:
                answer = await r.json()
            assert r.status == 400 and answer["type"] == "Bad Request" and "safe_to_restore" not in answer, body
        assert server.engine.role == "prefill"
        status, body = await _switch(session, url, "decode", decode_cuda_graph_memory_gb=1, unknown="ignored")
        assert status == 200 and body["new_role"] == "decode"

    run(check, server)


# ------------------------------------------------------------------ control


async def _loads(session, url) -> list:
    async with session.get(url + "/v1/loads") as r:
        return (await r.json())["loads"]


async def _running(session, url) -> int:
    return sum(load["num_running_reqs"] for load in await _loads(session, url))


def test_pause_and_continue_take_a_body_of_their_request_types():
    # entrypoints/http_server.py:1831-1854: `Annotated[PauseGenerationReqInput, Body()]` and
    # `ContinueGenerationReqInput`, msgspec Structs (managers/io_struct.py:1927-1955) whose mode is
    # Literal["abort", "retract", "in_place"]. No body is FastAPI's missing body; JSON's null and a
    # mode outside the Literal fail both branches of the schema SGLang gives pydantic
    # (utils/msgspec_utils.py:70-118); each is a 400 ErrorResponse (lines 635-692), before the handler.
    server = make_server()
    cited = {"/pause_generation": ("pause_generation", 1831), "/continue_generation": ("continue_generation", 1844)}

    async def check(session, url):
        for path, (function, line) in cited.items():
            where = f'/http_server.py", line {line}, in {function}\n    POST {path}'
            async with session.post(url + path) as r:
                body = await r.json()
            assert r.status == 400 and body["type"] == "Bad Request", body
            assert body["message"].startswith("1 validation error:\n  {'type': 'missing', 'loc': ('body',), 'msg': "
                                              "'Field required', 'input': None}\n\n  File "), body
            assert where in body["message"]
            async with session.post(url + path, data=b"null", headers={"Content-Type": "application/json"}) as r:
                body = await r.json()
            assert r.status == 400 and body["message"].startswith("2 validation errors:\n  {'type': 'is_instance_of'")
            assert "'loc': ('body', 'function-after[build_struct(), " in body["message"]
        async with session.post(url + "/pause_generation", json={"mode": "later"}) as r:
            body = await r.json()
        assert r.status == 400 and "'literal_error', 'loc': ('body', 'function-after[build_struct(), " \
            "PauseGenerationReqInput]', 'mode'), 'msg': \"Input should be 'abort', 'retract' or 'in_place'\"" \
            in body["message"]
        assert not server.engine.paused
        running = asyncio.create_task(session.post(url + "/generate", json={
            "input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 100000}}))
        while not await _running(session, url):
            await asyncio.sleep(0.01)
        # An empty object pauses with the default mode, "abort" (io_struct.py:1946).
        async with session.post(url + "/pause_generation", json={}) as r:
            assert r.status == 200 and await r.json() == {"message": "Generation paused successfully.", "status": "ok"}
        async with await running as r:
            assert (await r.json())["meta_info"]["finish_reason"]["type"] == "abort"
        assert server.engine.paused
        async with session.post(url + "/continue_generation", json={"torch_empty_cache": False}) as r:
            assert r.status == 200 and (await r.json())["message"] == "Generation continued successfully."
        assert not server.engine.paused

    run(check, server)


def test_abort_request_aborts_a_request_sglang_holds_by_rid_prefix_or_all_of_them():
    # entrypoints/http_server.py:1721-1731: an AbortReq body, 200 with no body. The tokenizer
    # manager ignores an empty rid without abort_all, and (one tokenizer worker) a rid it holds no
    # request of; the scheduler aborts every request whose rid starts with the one given
    # (managers/tokenizer_manager.py:2241-2260, managers/scheduler.py:5675-5810).
    server = make_server()

    async def start(session, url, rid):
        task = asyncio.create_task(session.post(url + "/generate", json={
            "rid": rid, "input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 100000}}))
        while not server.engine.knows(rid):
            await asyncio.sleep(0.01)
        return task

    async def abort(session, url, body):
        async with session.post(url + "/abort_request", json=body) as r:
            assert r.status == 200 and await r.read() == b"", body

    async def check(session, url):
        ab, abc, other = [await start(session, url, rid) for rid in ("ab", "abc", "other")]
        for body in ({"rid": "a"}, {}, {"rid": ""}, {"rid": None}, {"rid": "abcd"}):
            await abort(session, url, body)
        await asyncio.sleep(0.1)
        assert await _running(session, url) == 3, "no request of those rids: nothing aborted"
        await abort(session, url, {"rid": "ab"})
        for task in (ab, abc):
            async with await task as r:
                assert (await r.json())["meta_info"]["finish_reason"]["type"] == "abort"
        assert not other.done() and await _running(session, url) == 1
        async with session.post(url + "/abort_request", json={"rid": 5}) as r:
            body = await r.json()
        assert r.status == 400 and "in abort_request\n    POST /abort_request" in body["message"]
        assert "'type': 'string_type', 'loc': ('body', 'function-after[build_struct(), AbortReq]', 'rid')" in (
            body["message"])
        await abort(session, url, {"abort_all": True})
        async with await other as r:
            assert (await r.json())["meta_info"]["finish_reason"]["type"] == "abort"
        assert await _running(session, url) == 0

    run(check, server)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_client_has_gone_is_aborted(stream):
    # A stream's client is heard leaving at once (uvicorn's http.disconnect, Starlette cancelling
    # the stream), and generate_request aborts its request (managers/tokenizer_manager.py:958-966,
    # 3850-3874; entrypoints/http_server.py:977-981 would 2 s later). A request that does not stream
    # is looked at with each output, every SGLANG_FORCE_STREAM_INTERVAL (50) tokens
    # (managers/scheduler_components/output_streamer.py:474-477; tokenizer_manager.py:2061-2072).
    server = make_server()

    async def check(session, url):
        async with aiohttp.ClientSession() as client:
            generating = asyncio.create_task(client.post(url + "/generate", json={
                "input_ids": [1] * 16, "stream": stream, "sampling_params": {"max_new_tokens": 100000}}))
            while not await _running(session, url):
                await asyncio.sleep(0.01)
            if stream:
                await (await generating).content.readline()
        left = time.monotonic()
        while await _running(session, url):
            assert time.monotonic() - left < 6, "the request outlived its client"
            await asyncio.sleep(0.05)
        assert not server.engine.has_requests()
        generating.cancel()
        await asyncio.gather(generating, return_exceptions=True)

    run(check, server)


def test_a_request_without_output_whose_client_has_gone_is_aborted_after_the_wait_timeout():
    # managers/tokenizer_manager.py:1956-1974: with no output for SGLANG_REQUEST_STATE_WAIT_TIMEOUT
    # (4 s, environ.py:1679) the tokenizer manager looks whether the client is still there; here a
    # prefill request whose decode peer never comes waits in the bootstrap queue, counted as waiting
    # (scheduler_components/load_inquirer.py:116-119).
    server = make_server(*pd_flags("prefill", free_port()))

    async def waiting(session, url) -> int:
        return sum(load["num_waiting_reqs"] for load in await _loads(session, url))

    async def check(session, url):
        async with aiohttp.ClientSession() as client:
            generating = asyncio.create_task(client.post(url + "/generate", json={
                "text": "hi", "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 5}))
            while not await waiting(session, url):
                await asyncio.sleep(0.01)
            sent = time.monotonic()
        while await waiting(session, url):
            assert time.monotonic() - sent < 6, "the request outlived its client"
            await asyncio.sleep(0.05)
        assert time.monotonic() - sent >= 3.5, "aborted before the wait timeout"
        generating.cancel()
        await asyncio.gather(generating, return_exceptions=True)

    run(check, server)
