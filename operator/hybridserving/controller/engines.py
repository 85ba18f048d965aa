"""The operator's only door to engines and launchers: short-timeout HTTP reads (and nothing else).

The role-switch controller reads, on each instance's leader pod:

* the engine (SGLang or its simulator, `http://<podIP>:<spec.ports.http>`): `/v1/loads` (is it
  drained?), `/ready` (serving; `/health` would run a generation and take a second or more),
  `/model_info` (the live `disaggregation_mode`: `/server_info`'s top level keeps the start-up
  role after a switch), `/server_info` (one DP rank's KV pool, and the simulator's time scale),
  `/metrics` (the `sglang:` series the policy reads);
* the launcher (`http://<podIP>:<launcher port>`): `/status` (the step and outcome of a switch).

The reconcile reads, on pods whose node-cache fill step runs, the step's progress on the same
launcher port (`contract.WEIGHTS_PROGRESS_PATH`; the launcher starts only once the step is done).

Every call has a short timeout and returns None instead of raising: an engine that does not answer
is an observation, not an error. `instance_metrics` turns two scrapes and the `/v1/loads` entries
of every DP rank into the policy's `InstanceMetrics` (utilisation and latency percentiles from
counter and histogram deltas).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hybridserving.contract import WEIGHTS_PROGRESS_PATH, bearer, inflight_requests
from hybridserving.core.policy import InstanceMetrics
from hybridserving.core.weights import FillProgress

TIMEOUT_S = 2.0
FORWARD_SECONDS = "sglang:forward_execution_seconds_total"
# Categories of `sglang:forward_execution_seconds_total` that are not work for a request
# (`model_executor/runner/eager_runner.py:460`: DP-attention ranks run "idle" passes).
IDLE_CATEGORIES = frozenset({"idle"})
GENERATION_TOKENS = "sglang:generation_tokens_total"
FINISHED_REQUESTS = "sglang:num_requests_total"
LAUNCHER_PORT = 8080  # the launcher's default (HYBRIDSERVING_LAUNCHER_PORT)


@dataclass
class Scrape:
    """One `/metrics` read: gauge and counter sums over their series by name (the forward timer's
    by category), histogram buckets by name.

    A leader's page has a series per local scheduler process of every scheduler metric, told
    apart by `tp_rank`, `pp_rank` and, with several DP ranks, `dp_rank`
    (`observability/metrics_collector.py:1374-1399`): the forward timer on every one of them
    (`managers/scheduler_components/metrics_reporter.py:325-339`), the gauges on the first
    attention-TP rank of each DP group (`observability/metrics_collector.py:1361-1367`).

    With `--enable-priority-scheduling` a scheduler's queue gauges hold the total under
    `priority=""` and, beside it, the same requests once more per priority
    (`observability/metrics_collector.py:1417-1429`): only the total is read. The tokenizer's
    counters and histograms with a priority label are no such breakdown: each request counts once,
    under its own priority (`managers/tokenizer_manager.py:3230-3233`), so those all add up.
    """

    at: float
    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    series: dict[str, int] = field(default_factory=dict)
    """How many series each entry of `values` adds up."""
    forward_ranks: int = 1
    """Scheduler processes with a forward-timer series, whatever its categories."""

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        out = cls(at)
        ranks: set[tuple[tuple[str, str], ...]] = set()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.type == "gauge" and sample.labels.get("priority"):
                    continue
                name = sample.name
                if name.endswith("_bucket") and "le" in sample.labels:
                    le = float(sample.labels["le"])
                    hist = out.buckets.setdefault(name[: -len("_bucket")], {})
                    hist[le] = hist.get(le, 0.0) + sample.value
                    continue
                key = name
                if name == FORWARD_SECONDS:
                    key = f"{name}:{sample.labels.get('category', '')}"
                    ranks.add(tuple(sorted((k, v) for k, v in sample.labels.items() if k != "category")))
                out.values[key] = out.values.get(key, 0.0) + sample.value
                out.series[key] = out.series.get(key, 0) + 1
        out.forward_ranks = max(1, len(ranks))
        return out

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)

    def mean(self, name: str) -> float:
        """The mean over the series of a per-DP-rank ratio (0 without one)."""
        return self.values.get(name, 0.0) / self.series.get(name, 1)


def histogram_quantile(q: float, now: Mapping[float, float], before: Mapping[float, float] | None) -> float | None:
    """The q-quantile of the observations between two reads of a cumulative histogram (None: none)."""
    delta = {le: v - (before or {}).get(le, 0.0) for le, v in now.items()}
    total = delta.get(math.inf, max(delta.values(), default=0.0))
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in sorted(delta):
        count = delta[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            width = count - below
            return lower + (le - lower) * ((rank - below) / width if width > 0 else 1.0)
        lower, below = le, count
    return lower


def instance_metrics(role: str, loads: Mapping[str, Any] | None, scrape: Scrape | None,
                     previous: Scrape | None) -> InstanceMetrics:
    """The policy's view of one engine from `/v1/loads` and two consecutive `/metrics` reads.

    `/v1/loads` has an entry per DP rank (`managers/load_snapshot.py:516`), each rank with its own
    queues and KV pool (`managers/scheduler_components/load_inquirer.py:109-255`): the counts add
    up; the KV usage is the pool-weighted mean, so that usage times the instance's capacity stays
    the tokens all ranks hold (a rank that fills first shows as its prealloc queue, which is
    counted). Without an answer from `/v1/loads`, the scheduler gauges stand in, one series per
    DP group.
    """
    entries: list[Mapping[str, Any]] = list((loads or {}).get("loads") or [])
    m = scrape or Scrape(time.time())

    def p90(name: str) -> float | None:
        if scrape is None or name not in scrape.buckets:
            return None
        return histogram_quantile(0.9, scrape.buckets[name], previous.buckets.get(name) if previous else None)

    def total(key: str, section: str | None = None) -> int:
        return sum(int(((e.get(section) or {}) if section else e).get(key) or 0) for e in entries)

    if entries:
        weights = [float(e.get("max_total_num_tokens") or 0) for e in entries]
        if not all(weights):
            weights = [1.0] * len(entries)
        usage = [float(e.get("token_usage") or 0) for e in entries]
        kv_usage = sum(w * u for w, u in zip(weights, usage, strict=True)) / sum(weights)
        queue_reqs = sum(waiting_queue_reqs(e) for e in entries)
        queue_tokens = total("num_waiting_uncached_tokens")
        prealloc = total("decode_prealloc_queue_reqs", "disaggregation")
        running = total("num_running_reqs")
    else:
        kv_usage = m.mean("sglang:token_usage")
        queue_reqs = int(m.get("sglang:num_queue_reqs"))
        queue_tokens = 0
        prealloc = int(m.get("sglang:num_decode_prealloc_queue_reqs"))
        running = int(m.get("sglang:num_running_reqs"))
    return InstanceMetrics(
        role=role,  # type: ignore[arg-type]
        prefill_queue_reqs=queue_reqs,
        prefill_queue_tokens=queue_tokens,
        utilization=busy_fraction(scrape, previous),
        kv_usage=kv_usage,
        prealloc_queue_reqs=prealloc,
        running_reqs=running,
        tpot_p90_s=p90("sglang:request_time_per_output_token_seconds"),
        output_tokens_per_request=output_length(scrape, previous) if role == "decode" else None,
    )


def output_length(scrape: Scrape | None, previous: Scrape | None) -> float | None:
    """The mean output length of the requests that finished between two scrapes: the tokens they
    generated over their number (`observability/metrics_collector.py:2110,2136`, counted when a
    request finishes). None when none finished, or when a counter went back (the engine restarted
    between the scrapes: its counters start again from 0)."""
    if scrape is None or previous is None:
        return None
    requests = scrape.get(FINISHED_REQUESTS) - previous.get(FINISHED_REQUESTS)
    tokens = scrape.get(GENERATION_TOKENS) - previous.get(GENERATION_TOKENS)
    if requests <= 0 or tokens < 0:
        return None
    return tokens / requests


def waiting_queue_reqs(load: Mapping[str, Any]) -> int:
    """Requests in one DP rank's waiting queue: the queue whose prompts `num_waiting_uncached_tokens`
    counts (`managers/scheduler_components/load_inquirer.py:82-107`), so that tokens over requests
    is a mean prompt. `queues.waiting` is that queue (line 219); `num_waiting_reqs` also counts a
    prefill's bootstrap queue and a decode's prealloc, transfer and retracted queues (lines 114-141),
    which hold no tokens of it, so without the queues section those come off it."""
    queues = load.get("queues") or {}
    if "waiting" in queues:
        return int(queues["waiting"] or 0)
    disagg = load.get("disaggregation") or {}
    other = sum(int(disagg.get(k) or 0) for k in ("prefill_bootstrap_queue_reqs", "decode_prealloc_queue_reqs",
                                                  "decode_transfer_queue_reqs", "decode_retracted_queue_reqs"))
    return max(0, int(load.get("num_waiting_reqs") or 0) - other)


def busy_fraction(scrape: Scrape | None, previous: Scrape | None) -> float:
    """The share of the interval between two scrapes that the GPUs spent in forward passes: the mean
    over the scheduler processes on the leader's page.

    Read from `sglang:forward_execution_seconds_total`, summed over every category that does
    work (extend, decode, and with speculative decoding target_verify and the draft passes:
    `model_executor/runner/eager_runner.py:344-350`, `speculative/eagle_draft_cuda_graph_runner.py:748`).
    Every scheduler process (TP rank, PP stage, DP group) times its own passes into its own series
    (`managers/scheduler_components/metrics_reporter.py:325-339`, labels
    `observability/metrics_collector.py:1374-1399`), so the sum counts each pass once per rank:
    it is divided by the ranks, which are the GPUs the instance computes on. A DP-attention rank
    without work runs the pass as "idle", so it counts as a rank that was not busy; a DP replica
    that has never run a pass has no series yet and is not counted. SGLang records the timer
    only with `SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`, which the operator sets on engine pods;
    `sglang:utilization` is no substitute (-1 on prefill, 0 elsewhere:
    `managers/scheduler_components/metrics_reporter.py:1303-1315`). 0 when either scrape lacks it.
    """
    if scrape is None or previous is None or scrape.at <= previous.at:
        return 0.0
    prefix = FORWARD_SECONDS + ":"

    def busy(s: Scrape) -> float | None:
        keys = [k for k in s.values if k.startswith(prefix) and k[len(prefix):] not in IDLE_CATEGORIES]
        return sum(s.values[k] for k in keys) if keys else None

    now, before = busy(scrape), busy(previous)
    if now is None:
        return 0.0
    seconds = (now - (before or 0.0)) / scrape.forward_ranks
    return max(0.0, min(1.0, seconds / (scrape.at - previous.at)))


@dataclass
class EngineSample:
    """What one leader's engine and launcher said this tick (None where they did not answer)."""

    loads: dict[str, Any] | None = None
    healthy: bool | None = None
    server_info: dict[str, Any] | None = None
    model_info: dict[str, Any] | None = None
    launcher: dict[str, Any] | None = None
    scrape: Scrape | None = None

    @property
    def inflight(self) -> int | None:
        return None if self.loads is None else inflight_requests(self.loads)

    @property
    def max_running_requests(self) -> int | None:
        """The requests the engine runs at once, from `/v1/loads`: its DP ranks' caps summed, each
        the one its scheduler sized from its KV pool (`mem_cache/kv_cache_configurator.py:3119-3131`,
        reported at `managers/scheduler_components/load_inquirer.py:242`). `/server_info`'s
        `max_running_requests` is only the flag as resolved (`utils/common.py:3589`), None when
        unset, while the sized cap is 2048 to 4096 per rank then. None without an answer."""
        caps = [int(e.get("max_running_requests") or 0) for e in (self.loads or {}).get("loads") or []]
        return sum(caps) if caps and all(caps) else None

    @property
    def role(self) -> str | None:
        """The live role, from `/model_info` (`entrypoints/http_server.py:834-836`)."""
        return (self.model_info or {}).get("disaggregation_mode")


class Engines:
    """HTTP reads of engines and launchers, a few at a time, each bounded by `timeout`.

    Each call that reads several engines has threads of its own (`parallel` at most): one pool
    shared by every fleet let a fleet whose engines do not answer hold all its threads, and every
    other fleet's reads waited behind them. A long-lived pool, however large, has the same flaw:
    `fill_progress_many` returns at its budget and leaves the reads still out running to their own
    timeout, in threads no later call needs. A thread costs far less than the read it makes.
    """

    def __init__(self, timeout: float = TIMEOUT_S, parallel: int = 8) -> None:
        self.client = httpx.Client(timeout=timeout, trust_env=False)
        self.parallel = parallel

    def close(self) -> None:
        self.client.close()

    def _pool(self, tasks: int) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max(1, min(self.parallel, tasks)), thread_name_prefix="engines")

    def _get(self, url: str, params: Mapping[str, str] | None = None,
             api_key: str | None = None) -> httpx.Response | None:
        try:
            return self.client.get(url, params=params, headers=bearer(api_key))
        except httpx.HTTPError:
            return None

    def _json(self, url: str, params: Mapping[str, str] | None = None,
              api_key: str | None = None) -> dict[str, Any] | None:
        resp = self._get(url, params, api_key)
        if resp is None or resp.status_code != 200:
            return None
        try:
            data = resp.json()
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def loads(self, engine: str, api_key: str | None = None) -> dict[str, Any] | None:
        return self._json(engine + "/v1/loads", {"include": "core,disagg,queues"}, api_key)

    def health(self, engine: str) -> bool | None:
        """`/ready`: 200 once warmed up, while healthy and not paused (`managers/tokenizer_manager.py:728-734`)."""
        resp = self._get(engine + "/ready")
        return None if resp is None else resp.status_code == 200

    def model_info(self, engine: str, api_key: str | None = None) -> dict[str, Any] | None:
        return self._json(engine + "/model_info", api_key=api_key)

    def server_info(self, engine: str, api_key: str | None = None) -> dict[str, Any] | None:
        return self._json(engine + "/server_info", api_key=api_key)

    def metrics(self, engine: str) -> Scrape | None:
        resp = self._get(engine + "/metrics")
        if resp is None or resp.status_code != 200:
            return None
        try:
            return Scrape.parse(resp.text, time.time())
        except ValueError:
            return None

    def launcher_status(self, launcher: str) -> dict[str, Any] | None:
        return self._json(launcher + "/status")

    def sample(self, engine: str, launcher: str | None, *, switching: bool, scrape: bool,
               api_key: str | None = None) -> EngineSample:
        """The reads a tick needs: loads always; readiness and launcher status while switching; the
        live role while switching or when the policy runs (which is when role drift is looked for);
        `/metrics` and `/server_info` when the policy runs. `api_key` is the fleet's: SGLang lets
        `/ready` and `/metrics` through without it (`utils/auth.py:101-106`), not the others."""
        sample = EngineSample(loads=self.loads(engine, api_key))
        if switching or scrape:
            sample.model_info = self.model_info(engine, api_key)
        if switching:
            sample.healthy = self.health(engine)
            if launcher:
                sample.launcher = self.launcher_status(launcher)
        if scrape:
            sample.scrape = self.metrics(engine)
            if sample.server_info is None:
                sample.server_info = self.server_info(engine, api_key)
        return sample

    def sample_many(self, targets: Mapping[str, tuple[str, str | None, bool, bool]],
                    api_key: str | None = None) -> dict[str, EngineSample]:
        """`sample` for several instances of one fleet in parallel: name → (engine, launcher, switching,
        scrape)."""
        with self._pool(len(targets)) as pool:
            futures = {name: pool.submit(self.sample, t[0], t[1], switching=t[2], scrape=t[3], api_key=api_key)
                       for name, t in targets.items()}
            return {name: f.result() for name, f in futures.items()}

    def fill_progress(self, address: tuple[str, int]) -> FillProgress | None:
        """What a running fill step says of its download (None: no answer, or not its figures)."""
        doc = self._json(f"http://{address[0]}:{address[1]}{WEIGHTS_PROGRESS_PATH}")
        return None if doc is None else FillProgress.parse(doc)

    def fill_progress_many(self, targets: Mapping[str, tuple[str, int]],
                           budget: float = TIMEOUT_S) -> dict[str, FillProgress]:
        """`fill_progress` of several pods in parallel: pod name → address; the answers that came
        within `budget` seconds in all, so pods that do not answer delay a reconcile by that much at
        most, however many they are."""
        pool = self._pool(len(targets))
        futures = {name: pool.submit(self.fill_progress, address) for name, address in targets.items()}
        wait(futures.values(), timeout=budget)
        pool.shutdown(wait=False, cancel_futures=True)  # a read still out ends within its own timeout
        return {name: said for name, f in futures.items()
                if f.done() and not f.cancelled() and not f.exception() and (said := f.result()) is not None}
