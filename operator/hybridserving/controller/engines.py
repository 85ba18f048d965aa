"""The operator's only door to engines and launchers: short-timeout HTTP reads (and nothing else).

The role-switch controller reads, on each instance's leader pod:

* the engine (SGLang or its simulator, `http://<podIP>:<spec.ports.http>`): `/v1/loads` (is it
  drained?), `/ready` (serving; `/health` would run a generation and take a second or more),
  `/model_info` (the live `disaggregation_mode`: `/server_info`'s top level keeps the start-up
  role after a switch), `/server_info` (the resolved running-request cap and KV pool, and the
  simulator's time scale), `/metrics` (the `sglang:` series the policy reads);
* the launcher (`http://<podIP>:<launcher port>`): `/status` (the step and outcome of a switch).

The reconcile reads, on pods whose node-cache fill step runs, the step's progress on the same
launcher port (`contract.WEIGHTS_PROGRESS_PATH`; the launcher starts only once the step is done).

Every call has a short timeout and returns None instead of raising: an engine that does not answer
is an observation, not an error. `instance_metrics` turns two scrapes into the policy's
`InstanceMetrics` (utilisation and latency percentiles from counter and histogram deltas).
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
LAUNCHER_PORT = 8080  # the launcher's default (HYBRIDSERVING_LAUNCHER_PORT)


@dataclass
class Scrape:
    """One `/metrics` read: gauge and counter sums by name, histogram buckets by name."""

    at: float
    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        out = cls(at)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if name.endswith("_bucket") and "le" in sample.labels:
                    le = float(sample.labels["le"])
                    hist = out.buckets.setdefault(name[: -len("_bucket")], {})
                    hist[le] = hist.get(le, 0.0) + sample.value
                    continue
                key = name
                if name == FORWARD_SECONDS:
                    key = f"{name}:{sample.labels.get('category', '')}"
                out.values[key] = out.values.get(key, 0.0) + sample.value
        return out

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)


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
    """The policy's view of one engine from `/v1/loads` and two consecutive `/metrics` reads."""
    load = ((loads or {}).get("loads") or [{}])[0]
    m = scrape or Scrape(time.time())
    utilization = busy_fraction(scrape, previous)

    def p90(name: str) -> float | None:
        if scrape is None or name not in scrape.buckets:
            return None
        return histogram_quantile(0.9, scrape.buckets[name], previous.buckets.get(name) if previous else None)

    disagg = load.get("disaggregation") or {}
    return InstanceMetrics(
        role=role,  # type: ignore[arg-type]
        prefill_queue_reqs=int(load.get("num_waiting_reqs", m.get("sglang:num_queue_reqs")) or 0),
        prefill_queue_tokens=int(load.get("num_waiting_uncached_tokens") or 0),
        utilization=utilization,
        kv_usage=float(load.get("token_usage", m.get("sglang:token_usage")) or 0.0),
        prealloc_queue_reqs=int(disagg.get("decode_prealloc_queue_reqs",
                                           m.get("sglang:num_decode_prealloc_queue_reqs")) or 0),
        running_reqs=int(load.get("num_running_reqs", m.get("sglang:num_running_reqs")) or 0),
        ttft_p90_s=p90("sglang:time_to_first_token_seconds"),
        tpot_p90_s=p90("sglang:request_time_per_output_token_seconds"),
    )


def busy_fraction(scrape: Scrape | None, previous: Scrape | None) -> float:
    """The share of the interval between two scrapes that the GPU spent in forward passes.

    Read from `sglang:forward_execution_seconds_total`, summed over every category that does
    work (extend, decode, and with speculative decoding target_verify and the draft passes:
    `model_executor/runner/eager_runner.py:344-350`, `speculative/eagle_draft_cuda_graph_runner.py:748`).
    SGLang records it only with `SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`, which the operator sets on
    engine pods; `sglang:utilization` is no substitute (-1 on prefill, 0 elsewhere:
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
    return max(0.0, min(1.0, (now - (before or 0.0)) / (scrape.at - previous.at)))


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
    def role(self) -> str | None:
        """The live role, from `/model_info` (`entrypoints/http_server.py:834-836`)."""
        return (self.model_info or {}).get("disaggregation_mode")


class Engines:
    """HTTP reads of engines and launchers, a few at a time, each bounded by `timeout`."""

    def __init__(self, timeout: float = TIMEOUT_S, parallel: int = 8) -> None:
        self.client = httpx.Client(timeout=timeout, trust_env=False)
        self.pool = ThreadPoolExecutor(parallel, thread_name_prefix="engines")

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()

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
        futures = {name: self.pool.submit(self.sample, t[0], t[1], switching=t[2], scrape=t[3], api_key=api_key)
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
        futures = {name: self.pool.submit(self.fill_progress, address) for name, address in targets.items()}
        wait(futures.values(), timeout=budget)
        return {name: said for name, f in futures.items()
                if f.done() and not f.exception() and (said := f.result()) is not None}
