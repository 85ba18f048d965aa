"""SGLang 0.5.23's Prometheus series, under the same names and labels, fed by the simulator.

The role-switch controller and the router read these names on real engines; serving them
unchanged lets the same queries run against a simulated fleet. Each simulator keeps its own
registry so that several can share one process (tests, benchmarks).
"""

from __future__ import annotations

import os

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

# SGLang exports from a multiprocess registry, which has no `*_created` series; match it.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated

Metric = TypeVar("Metric", Counter, Gauge, Histogram)

# SGLang's default buckets (observability/metrics_collector.py).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = TTFT_BUCKETS + (800,)


def env_bool(name: str, default: bool, env: dict[str, str] | None = None) -> bool:
    """An SGLang boolean environment variable, parsed as `environ.py:143-150` (EnvBool) parses it."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'{name}: "{value}" is not a valid boolean value')


def device_timer_enabled(env: dict[str, str] | None = None) -> bool:
    """Whether forward passes are timed: `SGLANG_ENABLE_METRICS_DEVICE_TIMER`, default off
    (`environ.py:479`); without it `sglang:forward_execution_seconds_total` has no sample
    (`managers/scheduler_components/metrics_reporter.py:325-341`)."""
    return env_bool("SGLANG_ENABLE_METRICS_DEVICE_TIMER", False, env)


class EngineMetrics:
    """The scheduler gauges and the tokenizer counters/histograms of one engine.

    Scheduler series carry `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`; with
    `--enable-pd-role-switch` their engine_type is `dynamic` so a role flip keeps one series.
    Tokenizer series carry `model_name, engine_type` with the start-up role.
    """

    def __init__(self, model_name: str, startup_role: str, role_switch: bool,
                 device_timer: bool | None = None) -> None:
        self.device_timer = device_timer_enabled() if device_timer is None else device_timer
        self.registry = CollectorRegistry(auto_describe=True)
        engine_type = {"prefill": "prefill", "decode": "decode"}.get(startup_role, "unified")
        self.scheduler_labels = {
            "model_name": model_name,
            "engine_type": "dynamic" if role_switch else engine_type,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.tokenizer_labels = {"model_name": model_name, "engine_type": engine_type}
        s_names = list(self.scheduler_labels)
        t_names = list(self.tokenizer_labels)
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, s_names, registry=r)

        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_paused_reqs = gauge("num_paused_reqs", "The number of paused requests.")
        self.gen_throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.num_used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        self.kv_used_tokens = gauge("kv_used_tokens", "KV tokens held by requests.")
        self.kv_available_tokens = gauge("kv_available_tokens", "KV tokens free for new requests.")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.utilization = gauge("utilization", "Fraction of wall time spent in forward passes.")
        self.num_prefill_bootstrap_queue_reqs = gauge(
            "num_prefill_bootstrap_queue_reqs", "Prefill requests waiting for their decode peer.")
        self.num_prefill_inflight_queue_reqs = gauge(
            "num_prefill_inflight_queue_reqs", "Prefill requests whose KV is being sent.")
        self.num_decode_prealloc_queue_reqs = gauge(
            "num_decode_prealloc_queue_reqs", "Decode requests waiting for KV slots.")
        self.num_decode_transfer_queue_reqs = gauge(
            "num_decode_transfer_queue_reqs", "Decode requests waiting for their KV to arrive.")
        self.pending_prealloc_token_usage = gauge(
            "pending_prealloc_token_usage", "Token usage of requests waiting in the prealloc queue.")
        self.kv_transfer_latency_ms = gauge("kv_transfer_latency_ms", "Latency of the last KV transfer (ms).")
        self.kv_transfer_speed_gb_s = gauge("kv_transfer_speed_gb_s", "Speed of the last KV transfer (GB/s).")

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"sglang:{name}", doc, s_names + list(extra), registry=r)

        self.realtime_tokens_total = counter(
            "realtime_tokens", "Tokens processed; mode: prefill_compute, prefill_cache, decode.", ("mode",))
        self.forward_execution_seconds_total = counter(
            "forward_execution_seconds", "Time the GPU is busy in forward passes.", ("category",))
        self.num_bootstrap_failed_reqs_total = counter(
            "num_bootstrap_failed_reqs", "Requests whose bootstrap with the peer failed.")
        self.num_transfer_failed_reqs_total = counter(
            "num_transfer_failed_reqs", "Requests whose KV transfer failed.")
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            self.realtime_tokens_total.labels(**self.scheduler_labels, mode=mode)

        def t_counter(name: str, doc: str, extra: tuple[str, ...] = ("is_streaming",)) -> Counter:
            return Counter(f"sglang:{name}", doc, t_names + list(extra), registry=r)

        self.prompt_tokens_total = t_counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens_total = t_counter("generation_tokens", "Number of generation tokens processed.")
        self.num_requests_total = t_counter("num_requests", "Number of requests processed.")
        self.num_aborted_requests_total = t_counter("num_aborted_requests", "Number of requests aborted.", ())
        self.time_to_first_token = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            t_names + ["is_streaming"], buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            t_names, buckets=ITL_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "sglang:request_time_per_output_token_seconds", "Per-request TPOT in seconds.",
            t_names + ["is_streaming"], buckets=ITL_BUCKETS, registry=r)
        self.e2e_request_latency = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
            t_names + ["is_streaming"], buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
            s_names, buckets=TTFT_BUCKETS, registry=r)

    # ---- helpers that keep the label plumbing in one place

    def s(self, metric: Metric) -> Metric:
        """A labelled child of a scheduler metric."""
        return metric.labels(**self.scheduler_labels)

    def t(self, metric: Metric, streaming: bool | None = None) -> Metric:
        if streaming is None:
            return metric.labels(**self.tokenizer_labels)
        return metric.labels(**self.tokenizer_labels, is_streaming=str(streaming).lower())

    def record_forward(self, category: str, seconds: float) -> None:
        """One timed forward pass, recorded only when the device timer is on (as SGLang does)."""
        if self.device_timer:
            self.forward_execution_seconds_total.labels(**self.scheduler_labels, category=category).inc(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
