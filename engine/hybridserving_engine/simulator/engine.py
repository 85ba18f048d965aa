"""The simulated scheduler: SGLang's queues, KV pool and forward loop, timed by the performance model.

One forward loop per instance runs one prefill batch or one decode step at a time, sleeping for
the duration `PerformanceModel` gives, so latency grows with load the way it does on a GPU: a
prefill batch delays every running decode on a unified instance, a decode step slows as batch and
resident context grow, and a full KV pool holds new decode requests in the prealloc queue until a
running request finishes. The queues are SGLang's PD queues (prefill: bootstrap → waiting →
inflight; decode: prealloc → transfer → running), so `/v1/loads` and `/metrics` report them
under SGLang's names.

Simplifications, all deliberate: no tokenizer (see `count_tokens`), no prefix cache, no chunked
prefill, no retraction (a decode request reserves KV for its prompt and its whole output when it
is admitted), every request generates exactly its maximum number of tokens.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hybridserving.core.perfmodel import PerformanceModel

from hybridserving_engine.simulator.bootstrap import FAKE_BOOTSTRAP_HOST, BootstrapServer, HandoffError, KvReceiver
from hybridserving_engine.simulator.faults import Faults
from hybridserving_engine.simulator.metrics import EngineMetrics

log = logging.getLogger("hybridserving.simulator")

# When the forward loop falls this far behind its schedule (an overloaded CPU), it stops trying
# to catch up and restarts its clock, rather than running a burst of zero-length steps.
_MAX_LAG_S = 0.25


def count_tokens(text: str) -> int:
    """Tokens of a text without a tokenizer: one per 4 bytes of UTF-8, at least one.

    Close to what BPE tokenizers give on English text, and exact enough for a simulator whose
    timings depend on token counts only.
    """
    return max(1, math.ceil(len(text.encode()) / 4))


class RequestError(Exception):
    """A request the engine refuses or cannot finish; carries the HTTP status SGLang answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(eq=False)
class SimRequest:
    """One generation request as the scheduler sees it."""

    prompt_tokens: int
    max_new_tokens: int
    streaming: bool
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    arrival: float = field(default_factory=time.monotonic)
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    generated: int = 0
    kv_reserved: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    prefilled: asyncio.Event = field(default_factory=asyncio.Event)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def peer_handoff(self) -> bool:
        """Whether this request really meets a peer (health checks use SGLang's fake host)."""
        return self.bootstrap_room is not None and self.bootstrap_host not in (None, FAKE_BOOTSTRAP_HOST)


class SimulatedEngine:
    """The scheduler state of one simulated SGLang instance (leader rank)."""

    def __init__(
        self,
        *,
        role: str,
        perf: PerformanceModel,
        metrics: EngineMetrics,
        faults: Faults,
        role_switch_enabled: bool,
        transfer_backend: str,
        context_length: int,
        max_prefill_tokens: int,
        bootstrap: BootstrapServer | None,
        receiver: KvReceiver,
    ) -> None:
        self.role = role
        self.perf = perf
        self.metrics = metrics
        self.faults = faults
        self.role_switch_enabled = role_switch_enabled
        self.transfer_backend = transfer_backend
        self.context_length = context_length
        self.max_prefill_tokens = max_prefill_tokens
        self.bootstrap = bootstrap
        self.receiver = receiver
        self.has_decode_graphs = role == "decode"
        self.healthy = True
        self.switch_in_progress = False
        self.paused = False
        self.kv_used = 0
        self.active: dict[SimRequest, asyncio.Task[None]] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prealloc: deque[SimRequest] = deque()
        self.bootstrap_queue: set[SimRequest] = set()
        self.inflight: set[SimRequest] = set()
        self.transfer: set[SimRequest] = set()
        self.started_at = time.monotonic()
        self.generated_window: deque[tuple[float, int]] = deque()
        self.last_transfer_ms = 0.0
        self._wake = asyncio.Event()
        self._clock = 0.0
        self._loop_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._forward_loop(), name="simulator-forward-loop")

    async def stop(self) -> None:
        for task in list(self.active.values()):
            task.cancel()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    # ------------------------------------------------------------------ requests

    def submit(self, req: SimRequest) -> None:
        """Admit a request and start serving it; its output arrives on `req.events`."""
        if not self.healthy:
            raise RequestError(503, "engine is unhealthy after a failed role switch; restart required")
        if self.switch_in_progress:
            raise RequestError(503, "engine is switching role")
        if self.role != "null" and req.bootstrap_room is None:
            raise RequestError(400, "Disaggregated request received without bootstrap room id.")
        if req.prompt_tokens + req.max_new_tokens > self.context_length:
            raise RequestError(
                400,
                f"Requested token count exceeds the model's maximum context length of {self.context_length} "
                f"tokens. You requested a total of {req.prompt_tokens + req.max_new_tokens} tokens: "
                f"{req.prompt_tokens} tokens from the input messages and {req.max_new_tokens} tokens for the "
                "completion.",
            )
        if self._kv_need(req) > self.perf.kv_capacity_tokens:
            raise RequestError(400, f"request needs more KV than the pool holds ({self.perf.kv_capacity_tokens})")
        self.active[req] = asyncio.create_task(self._serve(req))

    def abort_all(self) -> int:
        tasks = list(self.active.values())
        for task in tasks:
            task.cancel()
        return len(tasks)

    def resume(self) -> None:
        """Continue after `/pause_generation`."""
        self.paused = False
        self._wake.set()

    def is_idle(self) -> bool:
        return not self.active

    def _kv_need(self, req: SimRequest) -> int:
        if self.role == "prefill":
            return self.perf.request_kv_tokens(req.prompt_tokens)
        return self.perf.request_kv_tokens(req.prompt_tokens + req.max_new_tokens)

    def _request_latency(self, prompt_tokens: int) -> float:
        """The part of a request's TTFT that does not occupy the GPUs (per the performance model)."""
        return self.perf.prefill_seconds(prompt_tokens) - self.perf.prefill_batch_seconds([(prompt_tokens, 0)])

    async def _serve(self, req: SimRequest) -> None:
        try:
            if self.role == "decode":
                await self._serve_decode(req)
            else:
                await asyncio.sleep(self._request_latency(req.prompt_tokens))
                if self.role == "prefill":
                    await self._serve_prefill(req)
                else:
                    self.waiting.append(req)
                    self._wake.set()
                    await req.finished.wait()
        except HandoffError as e:
            log.warning("simulator request %s failed its hand-over: %s", req.rid, e)
            counter = self.metrics.num_bootstrap_failed_reqs_total if self.role == "prefill" else (
                self.metrics.num_transfer_failed_reqs_total)
            self.metrics.s(counter).inc()
            req.events.put_nowait(("error", 500, str(e)))
            req.finish_reason = "error"
        except asyncio.CancelledError:
            if req.finish_reason is None:
                self._finish(req, "abort")
        finally:
            self._forget(req)

    async def _serve_prefill(self, req: SimRequest) -> None:
        if req.peer_handoff:
            self.bootstrap_queue.add(req)
            try:
                assert self.bootstrap is not None and req.bootstrap_room is not None
                await self.bootstrap.wait_for_decode(req.bootstrap_room)
            finally:
                self.bootstrap_queue.discard(req)
        self.waiting.append(req)
        self._wake.set()
        await req.prefilled.wait()
        self.inflight.add(req)
        seconds = self.perf.transfer_seconds(req.prompt_tokens) * self.faults.slow_factor
        await asyncio.sleep(seconds)
        self.inflight.discard(req)
        self._record_transfer(req.prompt_tokens, seconds)
        if req.peer_handoff and self.bootstrap is not None:
            assert req.bootstrap_room is not None, "a peer hand-off has a room"
            self.bootstrap.publish(req.bootstrap_room, {"room": req.bootstrap_room, "tokens": req.prompt_tokens,
                                                       "transfer_seconds": seconds})
        self._release(req)
        self._emit_token(req)
        self._finish(req, "length")

    async def _serve_decode(self, req: SimRequest) -> None:
        self.prealloc.append(req)
        self._admit_prealloc()
        await req.admitted.wait()
        self.transfer.add(req)
        try:
            if req.peer_handoff and self.transfer_backend != "fake":
                started = time.monotonic()
                assert req.bootstrap_host is not None and req.bootstrap_room is not None, "a peer hand-off has both"
                await self.receiver.receive(req.bootstrap_host, req.bootstrap_port or 8998, req.bootstrap_room,
                                            req.prompt_tokens)
                self._record_transfer(req.prompt_tokens, time.monotonic() - started)
        finally:
            self.transfer.discard(req)
        # The prefill's first token travels with the KV; decode emits it and continues.
        self._emit_token(req)
        if req.generated >= req.max_new_tokens:
            self._finish(req, "length")
            return
        self.running.append(req)
        self._wake.set()
        await req.finished.wait()

    def _admit_prealloc(self) -> None:
        """Reserve KV for queued decode requests, first come first served."""
        cap = self.perf.kv_capacity_tokens
        limit = self.perf.max_running_requests
        while self.prealloc:
            req = self.prealloc[0]
            need = self._kv_need(req)
            if self.kv_used + need > cap or len(self.transfer) + len(self.running) >= limit:
                return
            self.prealloc.popleft()
            self._reserve(req, need)
            req.admitted.set()

    def _reserve(self, req: SimRequest, tokens: int) -> None:
        req.kv_reserved = tokens
        self.kv_used += tokens

    def _release(self, req: SimRequest) -> None:
        if req.kv_reserved:
            self.kv_used -= req.kv_reserved
            req.kv_reserved = 0
            if self.prealloc:
                self._admit_prealloc()

    def _forget(self, req: SimRequest) -> None:
        self.active.pop(req, None)
        for queue in (self.waiting, self.prealloc):
            if req in queue:
                queue.remove(req)
        if req in self.running:
            self.running.remove(req)
        for group in (self.bootstrap_queue, self.inflight, self.transfer):
            group.discard(req)
        if self.role == "prefill" and req.peer_handoff and self.bootstrap is not None:
            assert req.bootstrap_room is not None, "a peer hand-off has a room"
            self.bootstrap.fail(req.bootstrap_room, f"prefill request {req.rid} ended before its KV was sent")
        self._release(req)

    # ------------------------------------------------------------------ the forward loop

    async def _forward_loop(self) -> None:
        busy = False
        while True:
            if not busy:
                await self._wake.wait()
            if self.paused:
                self._wake.clear()
                busy = False
                continue
            batch = self._take_prefill_batch()
            if batch:
                await self._run_prefill(batch, busy)
                busy = True
            elif self.running:
                await self._run_decode_step(busy)
                busy = True
            else:
                self._wake.clear()
                busy = False

    def _take_prefill_batch(self) -> list[SimRequest]:
        batch: list[SimRequest] = []
        tokens = 0
        cap = self.perf.kv_capacity_tokens
        while self.waiting:
            req = self.waiting[0]
            need = self._kv_need(req)
            if batch and tokens + req.prompt_tokens > self.max_prefill_tokens:
                break
            if self.kv_used + need > cap:
                break
            if self.role == "null" and len(self.running) + len(batch) >= self.perf.max_running_requests:
                break
            self.waiting.popleft()
            self._reserve(req, need)
            batch.append(req)
            tokens += req.prompt_tokens
        return batch

    async def _advance(self, seconds: float, continuing: bool) -> None:
        """Sleep one forward pass on a schedule that does not accumulate the event loop's lateness."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = self._clock if continuing and now - self._clock < _MAX_LAG_S else now
        self._clock = start + seconds
        await asyncio.sleep(max(0.0, self._clock - loop.time()))

    async def _run_prefill(self, batch: list[SimRequest], continuing: bool) -> None:
        seconds = self.perf.prefill_batch_seconds([(r.prompt_tokens, 0) for r in batch]) * self.faults.slow_factor
        now = time.monotonic()
        for req in batch:
            self.metrics.s(self.metrics.queue_time).observe(now - req.arrival)
        await self._advance(seconds, continuing)
        m = self.metrics
        m.record_forward("extend", seconds)
        m.realtime_tokens_total.labels(**m.scheduler_labels, mode="prefill_compute").inc(
            sum(r.prompt_tokens for r in batch))
        for req in batch:
            if req not in self.active:
                continue
            if self.role == "prefill":
                req.prefilled.set()
                continue
            self._emit_token(req)
            if req.generated >= req.max_new_tokens:
                self._finish(req, "length")
            else:
                self.running.append(req)

    async def _run_decode_step(self, continuing: bool) -> None:
        batch = len(self.running)
        resident = sum(r.prompt_tokens + r.generated for r in self.running)
        seconds = self.perf.decode_step_seconds(batch, resident) * self.faults.slow_factor
        await self._advance(seconds, continuing)
        m = self.metrics
        m.record_forward("decode", seconds)
        m.realtime_tokens_total.labels(**m.scheduler_labels, mode="decode").inc(len(self.running))
        for req in list(self.running):
            self._emit_token(req)
            if req.generated >= req.max_new_tokens:
                self.running.remove(req)
                self._finish(req, "length")

    # ------------------------------------------------------------------ output and accounting

    def _emit_token(self, req: SimRequest) -> None:
        now = time.monotonic()
        m = self.metrics
        if req.first_token_at is None:
            req.first_token_at = now
            m.t(m.time_to_first_token, req.streaming).observe(now - req.arrival)
        else:
            assert req.last_token_at is not None, "a token followed the first one"
            m.t(m.inter_token_latency).observe(now - req.last_token_at)
        req.last_token_at = now
        req.generated += 1
        self.generated_window.append((now, 1))
        req.events.put_nowait(("token", req.generated))

    def _finish(self, req: SimRequest, reason: str) -> None:
        if req.finish_reason is not None:
            return
        req.finish_reason = reason
        self._release(req)
        now = time.monotonic()
        m = self.metrics
        if reason == "abort":
            m.t(m.num_aborted_requests_total).inc()
        m.t(m.e2e_request_latency, req.streaming).observe(now - req.arrival)
        m.t(m.prompt_tokens_total, req.streaming).inc(req.prompt_tokens)
        m.t(m.generation_tokens_total, req.streaming).inc(req.generated)
        m.t(m.num_requests_total, req.streaming).inc()
        if req.generated > 1 and req.first_token_at is not None:
            m.t(m.time_per_output_token, req.streaming).observe((now - req.first_token_at) / (req.generated - 1))
        req.events.put_nowait(("finish", reason))
        req.finished.set()

    def _record_transfer(self, tokens: int, seconds: float) -> None:
        self.last_transfer_ms = seconds * 1000
        m = self.metrics
        m.s(m.kv_transfer_latency_ms).set(self.last_transfer_ms)
        if seconds > 0:
            m.s(m.kv_transfer_speed_gb_s).set(tokens * self.perf.kv_wire_bytes_per_token / seconds / 1e9)

    # ------------------------------------------------------------------ load reporting

    def gen_throughput(self) -> float:
        now = time.monotonic()
        while self.generated_window and now - self.generated_window[0][0] > 5.0:
            self.generated_window.popleft()
        return sum(n for _, n in self.generated_window) / 5.0

    def utilization(self) -> float:
        """`sglang:utilization` as 0.5.23 sets it: -1 on prefill; on other roles it would be running
        requests over `max_running_requests_under_SLO`, which nothing sets, so it stays 0
        (`managers/scheduler_components/metrics_reporter.py:1303-1315`). It is no measure of load."""
        return -1.0 if self.role == "prefill" else 0.0

    def load(self) -> dict[str, Any]:
        """One DP rank's entry of `/v1/loads` (SGLang's LoadSnapshot, all sections)."""
        cap = self.perf.kv_capacity_tokens
        num_total = sum(r.prompt_tokens + r.generated for r in self.running)
        pending = sum(r.prompt_tokens for r in self.transfer)
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(self.running) + len(self.inflight),
            "num_waiting_reqs": len(self.waiting),
            "num_waiting_uncached_tokens": sum(r.prompt_tokens for r in self.waiting),
            "num_used_tokens": self.kv_used,
            "num_total_tokens": num_total + pending,
            "num_active_tokens": num_total,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cap,
            "max_running_requests": self.perf.max_running_requests,
            "token_usage": round(self.kv_used / cap, 6),
            "gen_throughput": self.gen_throughput(),
            "cache_hit_rate": 0.0,
            "utilization": self.utilization(),
            "total_prefill_uncached_tokens": 0,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": cap},
            "disaggregation": {
                "mode": self.role,
                "prefill_bootstrap_queue_reqs": len(self.bootstrap_queue),
                "prefill_inflight_queue_reqs": len(self.inflight),
                "decode_prealloc_queue_reqs": len(self.prealloc),
                "decode_transfer_queue_reqs": len(self.transfer),
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": self.last_transfer_ms,
            },
            "queues": {
                "waiting": len(self.waiting),
                "grammar": 0,
                "paused": len(self.active) if self.paused else 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        }

    def refresh_gauges(self) -> None:
        """Bring the scheduler gauges up to date (SGLang updates them every log interval)."""
        m = self.metrics
        cap = self.perf.kv_capacity_tokens
        m.s(m.num_running_reqs).set(len(self.running) + len(self.inflight))
        m.s(m.num_queue_reqs).set(len(self.waiting))
        m.s(m.num_paused_reqs).set(len(self.active) if self.paused else 0)
        m.s(m.gen_throughput).set(self.gen_throughput())
        m.s(m.token_usage).set(self.kv_used / cap)
        m.s(m.num_used_tokens).set(self.kv_used)
        m.s(m.kv_used_tokens).set(self.kv_used)
        m.s(m.kv_available_tokens).set(cap - self.kv_used)
        m.s(m.max_total_num_tokens).set(cap)
        m.s(m.utilization).set(self.utilization())
        m.s(m.num_prefill_bootstrap_queue_reqs).set(len(self.bootstrap_queue))
        m.s(m.num_prefill_inflight_queue_reqs).set(len(self.inflight))
        m.s(m.num_decode_prealloc_queue_reqs).set(len(self.prealloc))
        m.s(m.num_decode_transfer_queue_reqs).set(len(self.transfer))
        m.s(m.pending_prealloc_token_usage).set(sum(self._kv_need(r) for r in self.prealloc) / cap)

    # ------------------------------------------------------------------ role switch

    async def switch_role(self, new_role: str, decode_cuda_graph_memory_gb: float | None) -> tuple[bool, str, bool]:
        """SGLang's `/pd_role_switch` preconditions, in its order; returns (success, message, safe_to_restore)."""
        checks = (
            (not self.role_switch_enabled, True, "--enable-pd-role-switch is not set on this server"),
            (not self.healthy, False, "instance is unhealthy after a failed role switch; restart required"),
            (self.switch_in_progress, False, "another role switch is already in progress"),
            (new_role not in ("prefill", "decode"), True, f"invalid new_role={new_role!r}"),
            (self.role == "null", True, "instance is not running in PD disaggregation mode"),
            (self.transfer_backend not in ("mooncake", "mooncake_tcp", "mori", "ascend"), True,
             f"transfer backend {self.transfer_backend!r} does not support runtime role switch"),
        )
        for failed, safe, message in checks:
            if failed:
                return False, message, safe
        if new_role == self.role:
            return True, "already in target role", False
        if not self.is_idle():
            return False, "instance is not idle; drain all requests before switching", True
        if new_role == "decode" and not self.has_decode_graphs:
            if decode_cuda_graph_memory_gb is None:
                return False, "decode_cuda_graph_memory_gb is required before capturing decode graphs", True
            if decode_cuda_graph_memory_gb < 0:
                return False, "decode_cuda_graph_memory_gb must be non-negative", True
        if self.faults.refuse_switch:
            return False, "simulator fault: role switch refused", True
        self.switch_in_progress = True
        try:
            await asyncio.sleep(self.perf.switch_seconds("in-place") * self.faults.slow_factor)
            if self.faults.fail_rebuild:
                self.healthy = False
                return False, "role switch failed; instance unhealthy, restart required: simulator fault", False
            old, self.role = self.role, new_role
            self.has_decode_graphs = self.has_decode_graphs or new_role == "decode"
            log.info("simulator PD role switch succeeded: %s -> %s", old, new_role)
            return True, "ok", False
        finally:
            self.switch_in_progress = False
