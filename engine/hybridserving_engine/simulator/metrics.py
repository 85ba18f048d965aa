"""SGLang 0.5.23's Prometheus series, under the same names and labels, fed by the simulator.

The role-switch controller and the router read these names on real engines; serving them
unchanged lets the same queries run against a simulated fleet. Each simulator keeps its own
registry so that several can share one process (tests, benchmarks).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

# SGLang exports from a multiprocess registry, which has no `*_created` series; match it.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated

Metric = TypeVar("Metric", Counter, Gauge, Histogram)

# SGLang's default buckets (observability/metrics_collector.py:1965-2041 for the tokenizer's
# histograms, 837-884 for the scheduler's queue time).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
QUEUE_BUCKETS = (0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50,
                 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800,
                 2000, 2500, 3000)
# The KV-transfer histograms a PD prefill observes (observability/metrics_collector.py:637-648, 694-699).
KV_TRANSFER_SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
KV_TRANSFER_LATENCY_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
KV_TRANSFER_SIZE_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)


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


@dataclass(frozen=True)
class SchedulerRank:
    """One scheduler process of the leader node, as its metric labels place it."""

    tp_rank: int
    pp_rank: int = 0
    moe_ep_rank: int = 0
    dp_rank: int | None = None
    """None without a DP controller (one DP rank), and then the series carry no dp_rank label."""
    logs_stats: bool = True
    """Attention-TP and attention-CP rank 0 of its DP group: the rank that sets the scheduler gauges."""
    attn_cp_rank: int = 0
    """On a PD prefill only attention-CP rank 0 sends KV by default (`disaggregation/common/conn.py:432-440`);
    the other CP ranks observe no KV-transfer metrics (`disaggregation/prefill.py:1251-1253`)."""

    @property
    def dp_group(self) -> int:
        return self.dp_rank or 0


def local_schedulers(*, tp: int, pp: int = 1, dp: int = 1, attn_dp: int = 1, attn_cp: int = 1, ep: int = 1,
                     nnodes: int = 1) -> list[SchedulerRank]:
    """The scheduler processes node 0 starts, each of which has a metrics collector.

    Every scheduler process builds a collector labelled with its own ranks when metrics are on
    (`observability/metrics_collector.py:1374-1399`), and the processes of a node share one
    Prometheus multiprocess directory, so the leader's `/metrics` has one series per local
    scheduler. Node 0 runs PP stages and TP ranks from 0 (`entrypoints/engine.py:2061-2075`, the
    same split per DP replica in `managers/data_parallel_controller.py:426-442, 695-712`); a process's
    attention and MoE ranks follow from its TP rank (`runtime_context.py:82-133`), its dp_rank
    is the attention-DP group or the replica, set only when there is more than one
    (`managers/data_parallel_controller.py:717-724`, `entrypoints/engine.py:910-955`).
    """
    nnodes_per_pp_rank = max(nnodes // pp, 1)
    pp_per_node = max(pp // nnodes, 1)
    tp_per_node = tp // nnodes_per_pp_rank
    attn_tp = max(tp // (attn_dp * attn_cp), 1)
    moe_ep_width = max(tp // ep, 1)
    dp_ranks = dp * attn_dp
    out = []
    for replica in range(dp):
        for pp_rank in range(pp_per_node):
            for tp_rank in range(tp_per_node):
                group = tp_rank // (attn_tp * attn_cp) if attn_dp > 1 else replica
                cp_rank = (tp_rank // attn_tp) % attn_cp
                out.append(SchedulerRank(
                    tp_rank=tp_rank, pp_rank=pp_rank, moe_ep_rank=tp_rank // moe_ep_width,
                    dp_rank=group if dp_ranks > 1 else None, attn_cp_rank=cp_rank,
                    logs_stats=tp_rank % attn_tp == 0 and cp_rank == 0,
                ))
    return out


class EngineMetrics:
    """The scheduler series and the tokenizer counters/histograms of one engine.

    Scheduler series carry `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank` (and
    `dp_rank` with more than one DP rank); with `--enable-pd-role-switch` their engine_type is
    `dynamic` so a role flip keeps one series. The forward-pass timer runs on every scheduler
    (`managers/scheduler_components/metrics_reporter.py:325-339`), so its counter has a series
    per local scheduler; everything else is set by the stats-logging rank of each DP group only
    (`observability/metrics_collector.py:1361-1367`; with PP, the simulator's first stage), so a
    DP group whose logging rank is on another node has no series here. The KV-transfer histograms
    are the exception: every scheduler that sent a request's KV observes them (`observe_kv_transfer`).
    Tokenizer series carry `model_name, engine_type` with the start-up role.
    """

    def __init__(self, model_name: str, startup_role: str, role_switch: bool,
                 schedulers: Sequence[SchedulerRank] = (SchedulerRank(0),), attention_dp: bool = False,
                 device_timer: bool | None = None) -> None:
        self.device_timer = device_timer_enabled() if device_timer is None else device_timer
        self.registry = CollectorRegistry(auto_describe=True)
        engine_type = {"prefill": "prefill", "decode": "decode"}.get(startup_role, "unified")
        common = {"model_name": model_name, "engine_type": "dynamic" if role_switch else engine_type}
        self.attention_dp = attention_dp
        self.schedulers = [(s, self._labels(common, s)) for s in schedulers]
        self.stats_labels = {s.dp_group: labels for s, labels in self.schedulers if s.logs_stats and s.pp_rank == 0}
        self.tokenizer_labels = {"model_name": model_name, "engine_type": engine_type}
        s_names = list(self.schedulers[0][1])
        t_names = list(self.tokenizer_labels)
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, s_names, registry=r)

        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        # SGLang serves /metrics from prometheus_client's multiprocess files (utils/common.py:2843-2849)
        # and leaves this gauge, unlike the other scheduler gauges here ("mostrecent"), in the default
        # mode "all" (observability/metrics_collector.py:573-577), which keeps a series per writing
        # process and names it with a `pid` label; the simulator's one process stands in for them.
        self.pid = str(os.getpid())
        self.num_paused_reqs = Gauge("sglang:num_paused_reqs", "The number of paused requests by async weight sync.",
                                     s_names + ["pid"], registry=r)
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

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(f"sglang:{name}", doc, s_names, buckets=buckets, registry=r)

        self.kv_transfer_speed_gb_s = histogram(
            "kv_transfer_speed_gb_s", "Histogram of KV cache transfer speed in GB/s.", KV_TRANSFER_SPEED_BUCKETS)
        self.kv_transfer_latency_ms = histogram(
            "kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.", KV_TRANSFER_LATENCY_BUCKETS)
        self.kv_transfer_total_mb = histogram(
            "kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.", KV_TRANSFER_SIZE_BUCKETS)

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
            s_names, buckets=QUEUE_BUCKETS, registry=r)

    # ---- helpers that keep the label plumbing in one place

    @staticmethod
    def _labels(common: dict[str, str], rank: SchedulerRank) -> dict[str, str]:
        labels = {**common, "tp_rank": str(rank.tp_rank), "pp_rank": str(rank.pp_rank),
                  "moe_ep_rank": str(rank.moe_ep_rank)}
        if rank.dp_rank is not None:
            labels["dp_rank"] = str(rank.dp_rank)
        return labels

    def inc(self, metric: Counter, dp_rank: int, amount: float = 1.0, **extra: str) -> None:
        """Count on DP rank `dp_rank`'s logging scheduler (nothing here when it is on another node)."""
        if (labels := self.stats_labels.get(dp_rank)) is not None:
            metric.labels(**labels, **extra).inc(amount)

    def set(self, metric: Gauge, dp_rank: int, value: float, **extra: str) -> None:
        if (labels := self.stats_labels.get(dp_rank)) is not None:
            metric.labels(**labels, **extra).set(value)

    def observe(self, metric: Histogram, dp_rank: int, value: float) -> None:
        if (labels := self.stats_labels.get(dp_rank)) is not None:
            metric.labels(**labels).observe(value)

    def t(self, metric: Metric, streaming: bool | None = None) -> Metric:
        if streaming is None:
            return metric.labels(**self.tokenizer_labels)
        return metric.labels(**self.tokenizer_labels, is_streaming=str(streaming).lower())

    def record_forward(self, category: str, seconds: float, working: Collection[int]) -> None:
        """One timed forward pass, on every local scheduler of the DP groups `working` had work in.

        Recorded only when the device timer is on, as SGLang does. With attention DP the other
        groups run the same pass without work, timed as "idle"
        (`model_executor/runner/eager_runner.py:460`); DP replicas run nothing.
        """
        if not self.device_timer:
            return
        for rank, labels in self.schedulers:
            if rank.dp_group in working:
                self.forward_execution_seconds_total.labels(**labels, category=category).inc(seconds)
            elif self.attention_dp:
                self.forward_execution_seconds_total.labels(**labels, category="idle").inc(seconds)

    def observe_kv_transfer(self, dp_rank: int, latency_ms: float, total_mb: float, speed_gb_s: float) -> None:
        """One KV transfer a PD prefill finished, on every local scheduler of DP group `dp_rank` that sent
        part of it: each rank's scheduler holds the request and a collector, which it hands to the
        request's time stats whenever metrics are on (`managers/scheduler.py:3086-3087`,
        `observability/metrics_collector.py:1374-1399`), not only the stats-logging rank."""
        for rank, labels in self.schedulers:
            if rank.dp_group == dp_rank and rank.attn_cp_rank == 0:
                self.kv_transfer_latency_ms.labels(**labels).observe(latency_ms)
                self.kv_transfer_total_mb.labels(**labels).observe(total_mb)
                self.kv_transfer_speed_gb_s.labels(**labels).observe(speed_gb_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
