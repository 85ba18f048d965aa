"""How the controller reads an engine's `/metrics` and `/v1/loads` into the policy's InstanceMetrics.

The inputs are shaped as SGLang 0.5.23 serves them (paths relative to `sglang/srt/`): a leader's
`/metrics` holds one series per local scheduler process, and `/v1/loads` one entry per DP rank.
"""

from __future__ import annotations

import threading
import time

import pytest

from hybridserving.controller.engines import (
    Engines,
    EngineSample,
    Scrape,
    busy_fraction,
    instance_metrics,
    waiting_queue_reqs,
)
from hybridserving.controller.switching import Instance, policy_model
from hybridserving.core.fleet import role_capacity
from support.fleets import fleet

FORWARD = "sglang:forward_execution_seconds_total"


def forward_page(busy: dict[tuple[int, int | None], dict[str, float]]) -> str:
    """A `/metrics` page with the forward timer of each (tp_rank, dp_rank) scheduler, by category."""
    lines = [f"# TYPE {FORWARD} counter"]
    for (tp, dp), categories in busy.items():
        for category, seconds in categories.items():
            dp_label = "" if dp is None else f',dp_rank="{dp}"'
            lines.append(f'{FORWARD}{{category="{category}"{dp_label},engine_type="decode",model_name="m",'
                         f'moe_ep_rank="0",pp_rank="0",tp_rank="{tp}"}} {seconds}')
    return "\n".join(lines) + "\n"


def test_a_tp8_engine_is_as_busy_as_one_of_its_gpus():
    # Every TP rank times the same pass into its own series (managers/scheduler_components/
    # metrics_reporter.py:325-339, labels observability/metrics_collector.py:1374-1399): summing
    # them read a TP-8 engine eight times too busy.
    before = Scrape.parse(forward_page({(tp, None): {"decode": 10.0} for tp in range(8)}), 0.0)
    after = Scrape.parse(forward_page({(tp, None): {"decode": 10.5} for tp in range(8)}), 1.0)
    assert after.forward_ranks == 8
    assert busy_fraction(after, before) == pytest.approx(0.5)


def test_attention_dp_ranks_without_work_count_as_idle_gpus():
    # A DP-attention rank without requests runs the pass as "idle" (model_executor/runner/
    # eager_runner.py:460): its GPU did no work, so the instance is half busy.
    before = Scrape.parse(forward_page({(tp, tp // 2): {"extend": 0.0, "idle": 0.0} for tp in range(4)}), 0.0)
    after = Scrape.parse(forward_page({
        (0, 0): {"extend": 0.8, "idle": 0.0}, (1, 0): {"extend": 0.8, "idle": 0.0},
        (2, 1): {"extend": 0.0, "idle": 0.8}, (3, 1): {"extend": 0.0, "idle": 0.8},
    }), 1.0)
    assert busy_fraction(after, before) == pytest.approx(0.4)


def test_a_rank_whose_first_pass_falls_between_two_scrapes_counts_from_zero():
    before = Scrape.parse(forward_page({(0, None): {"decode": 1.0}}), 0.0)
    after = Scrape.parse(forward_page({(0, None): {"decode": 1.2}, (1, None): {"decode": 0.2}}), 1.0)
    assert busy_fraction(after, before) == pytest.approx(0.2)


def entry(rank: int, **fields: object) -> dict:
    disagg = fields.pop("disaggregation", {})
    queues = fields.pop("queues", {})
    return {"dp_rank": rank, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0,
            "max_total_num_tokens": 1000, "token_usage": 0.0, **fields,
            "disaggregation": {"mode": "decode", "decode_prealloc_queue_reqs": 0, **disagg},
            "queues": {"waiting": 0, "paused": 0, **queues}}


def test_every_dp_rank_of_v1_loads_counts():
    # One entry per DP rank (managers/load_snapshot.py:516), each with its own queues and pool
    # (managers/scheduler_components/load_inquirer.py:109-255).
    loads = {"loads": [
        entry(0, num_running_reqs=5, token_usage=0.9, disaggregation={"decode_prealloc_queue_reqs": 2}),
        entry(1, num_running_reqs=3, token_usage=0.1, num_waiting_reqs=1, disaggregation={
            "decode_prealloc_queue_reqs": 1}),
    ]}
    m = instance_metrics("decode", loads, None, None)
    assert (m.running_reqs, m.prealloc_queue_reqs) == (8, 3)
    assert m.kv_usage == pytest.approx(0.5)


def test_kv_usage_weights_each_rank_by_its_pool():
    loads = {"loads": [entry(0, token_usage=1.0, max_total_num_tokens=3000), entry(1, token_usage=0.0)]}
    assert instance_metrics("decode", loads, None, None).kv_usage == pytest.approx(0.75)


def test_prefill_queue_requests_are_those_of_the_queue_whose_tokens_are_counted():
    # num_waiting_reqs counts the bootstrap queue too (load_inquirer.py:116-119, 141), whose prompts
    # num_waiting_uncached_tokens leaves out (lines 82-107): two requests of 4000 tokens waiting
    # behind three still bootstrapping are two prompts of 4000, not five of 1600.
    loads = {"loads": [
        entry(0, num_waiting_reqs=3, num_waiting_uncached_tokens=4000, queues={"waiting": 1},
              disaggregation={"mode": "prefill", "prefill_bootstrap_queue_reqs": 2}),
        entry(1, num_waiting_reqs=2, num_waiting_uncached_tokens=4000, queues={"waiting": 1},
              disaggregation={"mode": "prefill", "prefill_bootstrap_queue_reqs": 1}),
    ]}
    m = instance_metrics("prefill", loads, None, None)
    assert (m.prefill_queue_reqs, m.prefill_queue_tokens) == (2, 8000)


def test_without_the_queues_section_the_pd_queues_come_off_the_waiting_count():
    load = {"num_waiting_reqs": 7, "disaggregation": {"prefill_bootstrap_queue_reqs": 3}}
    assert waiting_queue_reqs(load) == 4
    decode = {"num_waiting_reqs": 6, "disaggregation": {"decode_prealloc_queue_reqs": 2,
                                                        "decode_transfer_queue_reqs": 3,
                                                        "decode_retracted_queue_reqs": 1}}
    assert waiting_queue_reqs(decode) == 0


def test_without_v1_loads_the_gauges_of_every_dp_group_stand_in():
    # The gauges come from the first attention-TP rank of each DP group
    # (observability/metrics_collector.py:1361-1367): counts add up, usages average.
    labels = 'engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0"'
    page = "\n".join([
        "# TYPE sglang:token_usage gauge",
        f'sglang:token_usage{{dp_rank="0",{labels},tp_rank="0"}} 0.8',
        f'sglang:token_usage{{dp_rank="1",{labels},tp_rank="4"}} 0.4',
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{dp_rank="0",{labels},tp_rank="0"}} 6',
        f'sglang:num_running_reqs{{dp_rank="1",{labels},tp_rank="4"}} 2',
    ]) + "\n"
    m = instance_metrics("decode", None, Scrape.parse(page, 0.0), None)
    assert m.running_reqs == 8 and m.kv_usage == pytest.approx(0.6)


def test_with_priority_scheduling_a_queue_gauge_is_read_once_not_again_per_priority():
    # The total goes under priority="" and the same requests again under each priority
    # (observability/metrics_collector.py:1417-1429): 3 running, not 6.
    labels = 'engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    page = "\n".join([
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{{labels},priority=""}} 3',
        f'sglang:num_running_reqs{{{labels},priority="0"}} 1',
        f'sglang:num_running_reqs{{{labels},priority="5"}} 2',
        "# TYPE sglang:num_requests_total counter",
        f'sglang:num_requests_total{{{labels},is_streaming="false",priority=""}} 4',
        f'sglang:num_requests_total{{{labels},is_streaming="false",priority="5"}} 6',
    ]) + "\n"
    scrape = Scrape.parse(page, 0.0)
    assert instance_metrics("decode", None, scrape, None).running_reqs == 3
    # A request counts once, under its own priority (managers/tokenizer_manager.py:3230-3233).
    assert scrape.get("sglang:num_requests_total") == 10


def requests_page(tokens: float, requests: float) -> str:
    """The tokenizer's counters of finished requests, streamed and not (metrics_collector.py:1860-1943)."""
    labels = 'engine_type="decode",model_name="m"'
    return "\n".join([
        "# TYPE sglang:generation_tokens_total counter",
        f'sglang:generation_tokens_total{{{labels},is_streaming="false"}} {tokens / 2}',
        f'sglang:generation_tokens_total{{{labels},is_streaming="true"}} {tokens / 2}',
        "# TYPE sglang:num_requests_total counter",
        f'sglang:num_requests_total{{{labels},is_streaming="false"}} {requests / 2}',
        f'sglang:num_requests_total{{{labels},is_streaming="true"}} {requests / 2}',
    ]) + "\n"


def test_the_mean_output_length_is_of_the_requests_that_finished_between_two_scrapes():
    before = Scrape.parse(requests_page(10_000, 40), 0.0)
    after = Scrape.parse(requests_page(13_000, 50), 1.0)
    assert instance_metrics("decode", None, after, before).output_tokens_per_request == pytest.approx(300)
    assert instance_metrics("prefill", None, after, before).output_tokens_per_request is None
    assert instance_metrics("decode", None, after, None).output_tokens_per_request is None
    assert instance_metrics("decode", None, after, after).output_tokens_per_request is None, "none finished"
    # Relaunched between the scrapes, its counters start again from 0: no mean can be told.
    restarted = Scrape.parse(requests_page(600, 2), 2.0)
    assert instance_metrics("decode", None, restarted, after).output_tokens_per_request is None


def test_the_policys_kv_capacity_is_every_attention_dp_ranks_pool():
    # /server_info's max_total_num_tokens is one DP rank's pool (managers/data_parallel_controller.py:821);
    # with attention DP every rank has its own.
    hs = fleet(decode={"replicas": 2, "layout": {"tp": 8, "attnDp": 8}})
    decode = Instance(obj={"metadata": {"name": "fleet-2"}, "spec": {"role": "decode"}}, pods=[],
                      sample=EngineSample(server_info={"max_total_num_tokens": 100_000}))
    assert policy_model(hs.spec, {"fleet-2": decode}).kv_capacity_tokens == 800_000
    single = fleet(decode={"replicas": 2, "layout": {"tp": 8}})
    assert policy_model(single.spec, {"fleet-2": decode}).kv_capacity_tokens == 100_000


def test_the_policy_times_the_fleet_on_its_declared_gpu():
    """An H200 prefills at 1,979 dense FP8 TFLOPS against a B300's 4,500 and reads HBM at 4.8 TB/s
    against 8: timed as the calibration B300, an H200 fleet's prefill pressure is projected 2.3× too
    low. A fleet that names no GPU model is timed as the H200 its memory defaults to."""
    info = EngineSample(server_info={"max_total_num_tokens": 500_000})
    decode = Instance(obj={"metadata": {"name": "fleet-2"}, "spec": {"role": "decode"}}, pods=[], sample=info)
    models = {gpu: policy_model(fleet(hardware={"gpuType": gpu} if gpu else {}).spec, {"fleet-2": decode})
              for gpu in ("B300", "H200", "H20", None)}
    assert [models[g].gpu for g in ("B300", "H200", "H20", None)] == ["B300", "H200", "H20", "H200"]
    compute = models["B300"].prefill_chunk_compute_seconds(8192)
    assert models["H200"].prefill_chunk_compute_seconds(8192) == pytest.approx(compute * 4500 / 1979)
    assert models["H20"].prefill_chunk_compute_seconds(8192) == pytest.approx(compute * 4500 / 296)
    assert models["H200"].decode_per_request_s == pytest.approx(models["B300"].decode_per_request_s * 8.0 / 4.8)
    assert models[None] == models["H200"]
    assert {m.kv_capacity_tokens for m in models.values()} == {500_000}, "the engine's own pool, whatever the GPU"


def test_before_any_engine_answers_the_policy_takes_the_capacity_models_pool():
    """Not the B300 measurement: a fleet on 141-GiB GPUs holds fewer tokens than one on 288-GiB ones."""
    for gpu in ("H200", "B300"):
        hs = fleet(hardware={"gpuType": gpu}, decode={"replicas": 2, "layout": {"tp": 8, "attnDp": 2}})
        assert policy_model(hs.spec, {}).kv_capacity_tokens == role_capacity(hs.spec, "decode").tokens
    h200, b300 = (policy_model(fleet(hardware={"gpuType": g}).spec, {}).kv_capacity_tokens for g in ("H200", "B300"))
    assert 0 < h200 < b300


def _instance(name: str, role: str, sample: EngineSample) -> Instance:
    return Instance(obj={"metadata": {"name": name}, "spec": {"role": role}}, pods=[], sample=sample)


def test_the_policys_running_cap_is_what_the_decode_schedulers_sized_not_the_flag():
    # /server_info's top level is the resolved server args (utils/common.py:3589): the flag, None when
    # unset. Each DP rank's scheduler sizes its own cap from its KV pool
    # (mem_cache/kv_cache_configurator.py:3119-3131) and reports it on /v1/loads (load_inquirer.py:242).
    hs = fleet(decode={"replicas": 2, "layout": {"tp": 8, "attnDp": 2}})
    info = {"max_running_requests": None, "max_total_num_tokens": 100_000}
    decode = _instance("fleet-2", "decode", EngineSample(server_info=info, loads={"loads": [
        {"dp_rank": 0, "max_running_requests": 2048}, {"dp_rank": 1, "max_running_requests": 2048}]}))
    prefill = _instance("fleet-1", "prefill", EngineSample(server_info=info, loads={"loads": [
        {"dp_rank": 0, "max_running_requests": 512}]}))
    assert policy_model(hs.spec, {"fleet-2": decode, "fleet-1": prefill}).max_running_requests == 4096
    assert policy_model(hs.spec, {"fleet-1": prefill}).max_running_requests == 512
    # Until an engine answers /v1/loads, the flag stands in; without one the model's default.
    flagged = _instance("fleet-2", "decode", EngineSample(server_info={**info, "max_running_requests": 64}))
    assert policy_model(hs.spec, {"fleet-2": flagged}).max_running_requests == 64
    bare = _instance("fleet-2", "decode", EngineSample(server_info=info))
    default = policy_model(hs.spec, {}).max_running_requests
    assert policy_model(hs.spec, {"fleet-2": bare}).max_running_requests == default


def test_a_sample_without_every_ranks_cap_has_none():
    assert EngineSample().max_running_requests is None
    assert EngineSample(loads={"loads": [{"max_running_requests": 8}, {}]}).max_running_requests is None
    assert EngineSample(loads={"loads": [{"max_running_requests": 8}, {"max_running_requests": 8}]}
                        ).max_running_requests == 16


def test_a_fleet_whose_engines_do_not_answer_delays_no_other_fleets_reads(monkeypatch) -> None:
    """Ticks of different fleets read through one `Engines`: one fleet's hanging reads must not
    hold the threads another fleet's reads need."""
    engines = Engines(parallel=8)
    release = threading.Event()

    def sample(self, engine, launcher, *, switching, scrape, api_key=None):
        if engine.startswith("http://hung"):
            release.wait(30)
        return EngineSample(loads={"engine": engine})

    monkeypatch.setattr(Engines, "sample", sample)
    hung = threading.Thread(target=engines.sample_many,
                            args=({f"a-{i}": (f"http://hung-{i}", None, False, True) for i in range(16)},))
    hung.start()
    try:
        time.sleep(0.2)  # fleet a's reads hold their threads
        started = time.monotonic()
        got = engines.sample_many({"b-0": ("http://answers", None, False, True)})
        assert time.monotonic() - started < 2.0
        assert got["b-0"].loads == {"engine": "http://answers"}
    finally:
        release.set()
        hung.join(10)
        engines.close()
