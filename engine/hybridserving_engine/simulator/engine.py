"""The simulated scheduler: SGLang's queues, KV pool and forward loop, timed by the performance model.

One forward loop per instance runs one prefill batch or one decode step at a time, sleeping for
the duration `PerformanceModel` gives, so latency grows with load the way it does on a GPU: a
prefill batch delays every running decode on a unified instance, a decode step slows as batch and
resident context grow, and a full KV pool holds new decode requests in the prealloc queue until a
running request finishes. The queues are SGLang's PD queues (prefill: bootstrap → waiting →
inflight; decode: prealloc → transfer → running), so `/v1/loads` and `/metrics` report them
under SGLang's names.

With several DP ranks (attention DP or replicas) each request goes to one rank as SGLang's
DataParallelController sends it, and each rank admits against its own share of the KV pool and
its own running-request cap and reports its own `/v1/loads` entry; one forward loop still runs
the passes of all of them, as DP-attention ranks run in lockstep.

Prefill is chunked as SGLang chunks it: each rank's pass extends at most `chunked_prefill_size`
tokens, and a prompt longer than what is left of that is cut; its remainder continues first in
the rank's next passes, held as the rank's chunked request, out of the waiting queue and not yet
running, so `/v1/loads` shows it only by its uncomputed tokens, as SGLang's does.

Simplifications, all deliberate: no tokenizer (see `count_tokens`), no prefix cache, no
retraction (a request reserves KV for its prompt, and on decode its whole output, when it is
admitted, not chunk by chunk), every request generates exactly its maximum number of tokens.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Iterable
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


class InvalidRequest(Exception):
    """A request the tokenizer manager refuses with ValueError before any scheduler sees it
    (`managers/tokenizer_manager.py:1333-1378`, `managers/io_struct.py:444-455`): HTTP 400."""


class RequestAborted(Exception):
    """A request the scheduler aborts with an HTTP status, SGLang's `FINISH_ABORT(message,
    status_code)` (`managers/schedule_batch.py:332-345`): it ends a stream, and is the answer of
    a request that does not stream."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SwitchAnswer:
    """The scheduler's `PdRoleSwitchReqOutput` (`managers/io_struct.py`), less the role asked for."""

    success: bool
    message: str
    safe_to_restore: bool
    old_role: str
    """The role the scheduler had when it took the call, which a call queued behind a switch sees."""


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
    dp_rank: int = 0
    arrival: float = field(default_factory=time.monotonic)
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    generated: int = 0
    kv_reserved: int = 0
    prefix_len: int = 0
    """Prompt tokens computed before the chunk in flight (SGLang's `prefix_len`, which
    `num_waiting_uncached_tokens` subtracts: `load_inquirer.py:104-106`)."""
    extend_end: int = 0
    """Prompt tokens computed once the chunk in flight is done."""
    first_token_at: float | None = None
    last_token_at: float | None = None
    ttft_observed: bool = False
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
        dp_ranks: int = 1,
        follow_bootstrap_room: bool = False,
        max_running_requests: int | None = None,
        attn_dp_size: int = 1,
        chunked_prefill_size: int | None = None,
        reserved_tokens: int = 0,
        sized_running_cap: int | None = None,
    ) -> None:
        self.role = role
        self.perf = perf
        self.metrics = metrics
        self.faults = faults
        self.role_switch_enabled = role_switch_enabled
        self.transfer_backend = transfer_backend
        self.context_length = context_length
        self.reserved_tokens = reserved_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.bootstrap = bootstrap
        self.receiver = receiver
        self.dp_ranks = dp_ranks
        self.follow_bootstrap_room = follow_bootstrap_room
        self.max_running_requests = max_running_requests
        """`--max-running-requests` as resolved at start-up (None: unset), for the whole instance."""
        self.sized_running_cap = sized_running_cap
        """Most requests one DP rank runs as its pools were sized (`capacity.InstanceCapacity.running_cap`:
        the request cap, a hybrid model's state slots), None where only the KV pool bounds them."""
        self.attn_dp_size = attn_dp_size
        # Chunking is off for a size of 0 or less (managers/scheduler.py:1372-1373).
        self.chunked_prefill_size = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else None
        """Prompt tokens one rank extends per prefill pass (per attention-DP rank once resolved)."""
        self.chunked: list[SimRequest | None] = [None] * dp_ranks
        """Each rank's request in the middle of a chunked prefill (SGLang's `chunked_req`)."""
        self.has_decode_graphs = role == "decode"
        self.healthy = True
        self._scheduler_free = asyncio.Event()
        """Clear while a role switch holds the scheduler: requests and health checks wait for it."""
        self._scheduler_free.set()
        self._switch_queue = asyncio.Lock()
        """The tokenizer's FIFO of `/pd_role_switch` calls (`managers/communicator.py:41-57`)."""
        self._resumed = asyncio.Event()
        """Clear while `/pause_generation` holds new requests at the tokenizer."""
        self._resumed.set()
        self._held: set[SimRequest] = set()
        """Requests the tokenizer has taken but not yet sent to the scheduler (a pause or a switch holds them)."""
        self.kv_used = [0] * dp_ranks
        self.active: dict[SimRequest, asyncio.Task[None]] = {}
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prealloc: deque[SimRequest] = deque()
        self.bootstrap_queue: set[SimRequest] = set()
        self.inflight: set[SimRequest] = set()
        self.transfer: set[SimRequest] = set()
        self.forward_batch: list[SimRequest] = []
        self.forward_ct = 0
        """Forward passes started, as the scheduler counts them in `run_batch` (`managers/scheduler.py:4621`)."""
        self.has_current_batch = False
        """Whether the scheduler's last round took a batch (`cur_batch_for_debug is not None`,
        `managers/scheduler.py:2044`): what arms its watchdog, with the forward count."""
        self.started_at = time.monotonic()
        self.generated_window: deque[tuple[float, int]] = deque()
        """(time, DP rank) of each token generated in the last few seconds."""
        self.last_transfer = [(0.0, 0.0)] * dp_ranks
        """(latency ms, GiB/s) of each DP rank's last KV transfer as a prefill sent it (see `_observe_transfer`)."""
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        """Set while the scheduler makes progress: cleared by the `stall_scheduler` fault."""
        self.apply_faults()
        self._clock = 0.0
        self._round_robin = 0
        self._fake_bootstrap_room = 0
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

    async def submit(self, req: SimRequest) -> None:
        """Admit a request and start serving it; its output arrives on `req.events`.

        A request sent while the engine switches role waits for the switch to end and is then
        served in the new role: SGLang's scheduler runs the switch inside its request dispatch, one
        thread (`disaggregation/role_switch.py:123-166`), and takes what arrived meanwhile from its
        socket once the new role's event loop starts (`managers/scheduler.py:2224-2270`)."""
        self._held.add(req)
        try:
            # A pause holds new requests at the tokenizer, before the scheduler sees them, so no
            # queue of `/v1/loads` counts them (`managers/tokenizer_manager.py:938-939`).
            await self._resumed.wait()
            await self._scheduler_free.wait()
        finally:
            self._held.discard(req)
        if not self.healthy:
            raise RequestAborted(503, "engine is unhealthy after a failed role switch; restart required")
        if req.bootstrap_room is None and self.transfer_backend == "fake":
            # The tokenizer numbers the rooms of the fake backend (managers/tokenizer_manager.py:1576-1582).
            req.bootstrap_room, self._fake_bootstrap_room = self._fake_bootstrap_room, self._fake_bootstrap_room + 1
        if self.role != "null" and req.bootstrap_room is None:
            raise RequestAborted(400, "Invalid request: Disaggregated request received without bootstrap room id. "
                                      f"req.rid={req.rid!r}")  # managers/scheduler.py:3048-3059
        if self._kv_need(req) > self.rank_kv_capacity:
            raise RequestAborted(400, f"request needs more KV than the pool holds ({self.rank_kv_capacity})")
        req.dp_rank = self._dispatch(req)
        self.active[req] = asyncio.create_task(self._serve(req))

    def check_lengths(self, prompt_tokens: int, max_new_tokens: int | None) -> None:
        """The tokenizer manager's length checks (`managers/tokenizer_manager.py:1333-1378`, without
        `--allow-auto-truncate`): the prompt, with the slots EAGLE reserves for its drafts, must be
        shorter than the context, and with it the tokens asked for must fit; a request that names
        no maximum is not checked against it."""
        input_tokens = prompt_tokens + self.reserved_tokens
        if input_tokens >= self.context_length:
            raise InvalidRequest(f"The input ({input_tokens} tokens) is longer than the model's context length "
                                 f"({self.context_length} tokens).")
        if max_new_tokens is not None and max_new_tokens + input_tokens > self.context_length:
            raise InvalidRequest(
                f"Requested token count exceeds the model's maximum context length of {self.context_length} "
                f"tokens. You requested a total of {max_new_tokens + input_tokens} tokens: {input_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit.")

    @property
    def rank_kv_capacity(self) -> int:
        """One DP rank's KV pool: an even share of the instance's (each rank has its own pool)."""
        return self.perf.kv_capacity_tokens // self.dp_ranks

    @property
    def rank_max_running_requests(self) -> int:
        """One DP rank's running-request cap, as SGLang sizes it from the rank's finished KV pool
        (`mem_cache/kv_cache_configurator.py:3119-3150`): the requested cap split over the
        attention-DP ranks (DP replicas each take it whole), else 512 per context length of pool
        held between 2048 and 4096; at most half the pool's tokens either way, and at most what a
        hybrid model's state pool holds. This, not `/server_info`'s `max_running_requests` (the
        flag, None when unset), is what the scheduler admits against and what `/v1/loads` reports
        (`load_inquirer.py:242`)."""
        pool = self.rank_kv_capacity
        if self.max_running_requests is not None:
            wanted = max(1, self.max_running_requests // self.attn_dp_size)
        else:
            wanted = max(min(int(pool / self.context_length * 512), 4096), 2048)
        cap = min(wanted, pool // 2)
        return cap if self.sized_running_cap is None else min(cap, self.sized_running_cap)

    def _dispatch(self, req: SimRequest) -> int:
        """The DP rank SGLang's DataParallelController sends `req` to: the bootstrap room's rank
        under follow_bootstrap_room, the next rank otherwise
        (`managers/data_parallel_controller.py:880-910`)."""
        if self.follow_bootstrap_room and req.bootstrap_room is not None:
            return req.bootstrap_room % self.dp_ranks
        rank = self._round_robin
        self._round_robin = (rank + 1) % self.dp_ranks
        return rank

    def knows(self, rid: str) -> bool:
        """Whether the tokenizer holds a request of this rid (`rid_to_state`), sent to the scheduler or held."""
        return any(req.rid == rid for req in (*self.active, *self._held))

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """The scheduler's `abort_request` (`managers/scheduler.py:5675-5810`): every request it has
        whose rid starts with `rid`, or all of them. Those the tokenizer still holds are not its to
        abort: they run once sent."""
        for req, task in list(self.active.items()):
            if abort_all or req.rid.startswith(rid):
                task.cancel()

    def pause(self, mode: str) -> None:
        """`/pause_generation`: "abort" aborts every request, after which SGLang's scheduler runs
        on to an idle round (`managers/tokenizer_manager.py:2267-2280`); "retract" drops the
        current batch (`managers/scheduler.py:5881-5882`); "in_place" leaves it as it is
        (lines 5821-5830), still arming the watchdog."""
        if mode == "abort":
            self.abort(abort_all=True)
        if mode != "in_place":
            self.has_current_batch = False
        self._resumed.clear()

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def apply_faults(self) -> None:
        """Take up a change of `faults`: a stalled scheduler stops where it is, a released one goes on."""
        if self.faults.stall_scheduler:
            self._progress.clear()
        else:
            self._progress.set()
            self._wake.set()

    def responds(self) -> bool:
        """Whether a request sent now would get output from the scheduler, which is all SGLang's
        `/health` waits for (`entrypoints/http_server.py:776-785`): not from a stalled scheduler,
        nor while paused (the tokenizer holds new requests until it continues,
        `managers/tokenizer_manager.py:938-939`), nor while a role switch holds the scheduler, nor
        after a failed rebuild."""
        return self.healthy and not self.paused and not self.faults.stall_scheduler and self._scheduler_free.is_set()

    def resume(self) -> None:
        """Continue after `/pause_generation`."""
        self._resumed.set()
        self._wake.set()

    def is_idle(self) -> bool:
        """Idle as the scheduler sees it (`is_fully_idle`): requests a pause or a switch holds
        before the scheduler do not count."""
        return not self.active

    def has_requests(self) -> bool:
        """Whether any request is still to be answered, held before the scheduler or in it: what
        SGLang's SIGTERM drain waits for (`rid_to_state`, `managers/tokenizer_manager.py:3508-3545`)."""
        return bool(self.active or self._held)

    async def scheduler_answers(self) -> None:
        """Return once the scheduler would answer a control request (`get_internal_state` through
        `managers/communicator.py:41-57`, no time limit): not while a switch or a stall holds it."""
        await self._scheduler_free.wait()
        await self._progress.wait()

    def _kv_need(self, req: SimRequest) -> int:
        """Pages a request holds: its tokens only, since a hybrid model's linear-attention state has a
        pool of its own, which caps running requests instead (`rank_max_running_requests`)."""
        if self.role == "prefill":
            return req.prompt_tokens
        return req.prompt_tokens + req.max_new_tokens

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
            self.metrics.inc(counter, req.dp_rank)
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
        entered = time.monotonic()
        seconds = self.perf.transfer_seconds(req.prompt_tokens) * self.faults.slow_factor
        await asyncio.sleep(seconds)
        await self._progress.wait()  # the scheduler polls the transfer's end
        self.inflight.discard(req)
        if req.peer_handoff:  # health checks' fake host is skipped (disaggregation/prefill.py:1249-1250)
            self._observe_transfer(req, time.monotonic() - entered)
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
                assert req.bootstrap_host is not None and req.bootstrap_room is not None, "a peer hand-off has both"
                await self.receiver.receive(req.bootstrap_host, req.bootstrap_port or 8998, req.bootstrap_room,
                                            req.prompt_tokens)
            await self._progress.wait()  # the scheduler polls the transfer's end
        finally:
            self.transfer.discard(req)
        # The prefill's first token travels with the KV; decode emits it and continues.
        self._emit_first_output(req)
        if req.generated >= req.max_new_tokens:
            self._finish(req, "length")
            return
        self.running.append(req)
        self._wake.set()
        await req.finished.wait()

    def _admit_prealloc(self) -> None:
        """Reserve KV for queued decode requests, first come first served on each DP rank."""
        blocked: set[int] = set()
        for req in list(self.prealloc):
            rank = req.dp_rank
            if len(blocked) == self.dp_ranks:
                return
            if rank in blocked:
                continue
            need = self._kv_need(req)
            admitted = sum(1 for r in (*self.transfer, *self.running) if r.dp_rank == rank)
            if self.kv_used[rank] + need > self.rank_kv_capacity or admitted >= self.rank_max_running_requests:
                blocked.add(rank)
                continue
            self.prealloc.remove(req)
            self._reserve(req, need)
            req.admitted.set()

    def _reserve(self, req: SimRequest, tokens: int) -> None:
        req.kv_reserved = tokens
        self.kv_used[req.dp_rank] += tokens

    def _release(self, req: SimRequest) -> None:
        if req.kv_reserved:
            self.kv_used[req.dp_rank] -= req.kv_reserved
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
        if self.chunked[req.dp_rank] is req:
            self.chunked[req.dp_rank] = None
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
            # A stalled scheduler takes no new round: an idle one stays without a batch, a busy
            # one keeps the batch it last took.
            await self._progress.wait()
            if self.paused:
                # A paused scheduler skips its rounds before taking a batch, so the last one stays
                # its current batch (`managers/scheduler.py:2034-2036`).
                self._wake.clear()
                busy = False
                continue
            batch = self._take_prefill_batch()
            self.has_current_batch = bool(batch or self.running)
            if batch:
                await self._run_prefill(batch, busy)
                busy = True
            elif self.running:
                await self._run_decode_step(busy)
                busy = True
            else:
                self._wake.clear()
                self.forward_batch = []
                busy = False

    def _take_prefill_batch(self) -> list[SimRequest]:
        """The next prefill pass; each request's chunk runs from its `prefix_len` to its `extend_end`.

        On each rank, as SGLang's PrefillAdder fills it: the rank's chunked request first, for
        as much of its rest as the chunk budget takes, no longer chunked once that is all of it
        (`managers/scheduler.py:4176-4184`, `managers/schedule_policy.py:1140-1222`); then waiting
        requests while budget is left (lines 1353-1354), the one that does not fit whole cut to
        what is left and held as the rank's chunked request (lines 1352-1381,
        `managers/scheduler.py:4324-4327`).
        """
        batch: list[SimRequest] = []
        tokens = 0
        budget: list[int | None] = [self.chunked_prefill_size] * self.dp_ranks
        for rank, chunked in enumerate(self.chunked):
            if chunked is None:
                continue
            chunked.prefix_len = chunked.extend_end
            chunk = self._chunk(chunked.prompt_tokens - chunked.prefix_len, budget, rank)
            chunked.extend_end = chunked.prefix_len + chunk
            if chunked.extend_end == chunked.prompt_tokens:
                self.chunked[rank] = None
            batch.append(chunked)
            tokens += chunk
        blocked: set[int] = set()
        for req in list(self.waiting):
            rank = req.dp_rank
            if len(blocked) == self.dp_ranks:
                break
            if rank in blocked:
                continue
            left = budget[rank]
            if left is not None and left <= 0:
                blocked.add(rank)
                continue
            if batch and tokens + (req.prompt_tokens if left is None else min(req.prompt_tokens, left)) > (
                    self.max_prefill_tokens):
                break
            need = self._kv_need(req)
            if self.kv_used[rank] + need > self.rank_kv_capacity or (
                    self.role == "null"
                    and sum(1 for r in (*self.running, *batch) if r.dp_rank == rank) >= self.rank_max_running_requests):
                blocked.add(rank)
                continue
            self.waiting.remove(req)
            self._reserve(req, need)
            chunk = self._chunk(req.prompt_tokens, budget, rank)
            req.prefix_len, req.extend_end = 0, chunk
            if chunk < req.prompt_tokens:
                self.chunked[rank] = req
            batch.append(req)
            tokens += chunk
        return batch

    @staticmethod
    def _chunk(tokens: int, budget: list[int | None], rank: int) -> int:
        """The part of `tokens` rank `rank`'s chunk budget takes (all without chunking); spends it."""
        left = budget[rank]
        if left is None:
            return tokens
        chunk = min(tokens, left)
        budget[rank] = left - chunk
        return chunk

    async def _advance(self, seconds: float, continuing: bool) -> None:
        """Sleep one forward pass on a schedule that does not accumulate the event loop's lateness."""
        self.forward_ct += 1
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = self._clock if continuing and now - self._clock < _MAX_LAG_S else now
        self._clock = start + seconds
        await asyncio.sleep(max(0.0, self._clock - loop.time()))
        await self._progress.wait()  # a stalled scheduler never finishes the pass

    async def _run_prefill(self, batch: list[SimRequest], continuing: bool) -> None:
        seconds = self.perf.prefill_batch_seconds(
            [(r.extend_end - r.prefix_len, r.prefix_len) for r in batch]) * self.faults.slow_factor
        now = time.monotonic()
        m = self.metrics
        for req in batch:
            if req.prefix_len == 0:
                m.observe(m.queue_time, req.dp_rank, now - req.arrival)
        self.forward_batch = batch
        await self._advance(seconds, continuing)
        m.record_forward("extend", seconds, {r.dp_rank for r in batch})
        for req in batch:
            m.inc(m.realtime_tokens_total, req.dp_rank, req.extend_end - req.prefix_len, mode="prefill_compute")
        for req in batch:
            if req not in self.active or self.chunked[req.dp_rank] is req:
                continue
            if self.role == "prefill":
                req.prefilled.set()
                continue
            self._emit_first_output(req)
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
        m.record_forward("decode", seconds, {r.dp_rank for r in self.running})
        for req in self.running:
            m.inc(m.realtime_tokens_total, req.dp_rank, mode="decode")
        for req in list(self.running):
            self._emit_token(req)
            if req.generated >= req.max_new_tokens:
                self.running.remove(req)
                self._finish(req, "length")

    # ------------------------------------------------------------------ output and accounting

    def _emit_first_output(self, req: SimRequest) -> None:
        """A request that asks for no tokens gets none, yet its one output still counts as its
        first: SGLang skips sampling for it (`Req.is_prefill_only`, `managers/schedule_batch.py:
        1501-1506`; a dummy id, `managers/tp_worker.py:742-751`), `check_finished` ends it at
        length 0 (lines 2038-2042) so the output stops before the dummy
        (`output_ids_through_stop`), and the tokenizer manager observes TTFT on that output all the
        same (`managers/tokenizer_manager.py:3235-3246`)."""
        if req.max_new_tokens > 0:
            self._emit_token(req)
        elif not req.ttft_observed:
            self._observe_ttft(req, time.monotonic())

    def _observe_ttft(self, req: SimRequest, now: float) -> None:
        """A PD prefill never observes TTFT (`managers/tokenizer_manager.py:3235-3246`)."""
        if self.role != "prefill":
            req.ttft_observed = True
            self.metrics.t(self.metrics.time_to_first_token, req.streaming).observe(now - req.arrival)

    def _emit_token(self, req: SimRequest) -> None:
        """The tokenizer manager's latency histograms as SGLang keeps them
        (`managers/tokenizer_manager.py:3235-3258`): an inter-token latency follows only an
        observed TTFT, so a PD prefill, which observes none, never observes one either."""
        now = time.monotonic()
        m = self.metrics
        if req.first_token_at is None:
            req.first_token_at = now
        if not req.ttft_observed:
            self._observe_ttft(req, now)
        else:
            assert req.last_token_at is not None, "a token followed the first one"
            m.t(m.inter_token_latency).observe(now - req.last_token_at)
        req.last_token_at = now
        req.generated += 1
        self.generated_window.append((now, req.dp_rank))
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
        # Neither on a PD prefill nor for an abort, whose decode was cut short (lines 3276-3284).
        if (reason in ("stop", "length") and self.role != "prefill" and req.generated > 1
                and req.first_token_at is not None):
            m.t(m.time_per_output_token, req.streaming).observe((now - req.first_token_at) / (req.generated - 1))
        req.events.put_nowait(("finish", reason))
        req.finished.set()

    def _observe_transfer(self, req: SimRequest, latency_s: float) -> None:
        """SGLang's `compute_and_observe_kv_transfer_metrics` (`observability/req_time_stats.py:954-998`)
        for a request whose KV a PD prefill has sent: the time from its entry into the inflight queue
        to the poll that saw the transfer end (lines 967-975; NIXL times the same span from its first
        chunk), its KV in MiB and the speed in GiB/s; nothing when no time passed (line 977). Its only
        caller is the prefill's inflight queue (`disaggregation/prefill.py:1243-1262`), which also keeps
        the last latency and speed for `/v1/loads`; a decode's stay 0."""
        if latency_s <= 0:
            return
        total_mb = req.prompt_tokens * self.perf.kv_wire_bytes_per_token / (1024 * 1024)
        speed_gb_s = total_mb / 1024 / latency_s
        self.last_transfer[req.dp_rank] = (latency_s * 1000, speed_gb_s)
        self.metrics.observe_kv_transfer(req.dp_rank, latency_s * 1000, total_mb, speed_gb_s)

    # ------------------------------------------------------------------ load reporting

    def gen_throughput(self, dp_rank: int | None = None) -> float:
        """Tokens per second over the last 5 s, of one DP rank or (None) of all."""
        now = time.monotonic()
        while self.generated_window and now - self.generated_window[0][0] > 5.0:
            self.generated_window.popleft()
        return sum(1 for _, rank in self.generated_window if dp_rank in (None, rank)) / 5.0

    def utilization(self) -> float:
        """`sglang:utilization` as 0.5.23 sets it: -1 on prefill; on other roles it would be running
        requests over `max_running_requests_under_SLO`, which nothing sets, so it stays 0
        (`managers/scheduler_components/metrics_reporter.py:1303-1315`). It is no measure of load."""
        return -1.0 if self.role == "prefill" else 0.0

    def loads(self) -> list[dict[str, Any]]:
        """`/v1/loads` entries, one per DP rank: each scheduler publishes its own LoadSnapshot
        (`managers/load_snapshot.py:516`, `managers/scheduler_components/load_inquirer.py:109-255`)."""
        return [self._load(rank) for rank in range(self.dp_ranks)]

    def _load(self, rank: int) -> dict[str, Any]:
        def mine(reqs: Iterable[SimRequest]) -> list[SimRequest]:
            return [r for r in reqs if r.dp_rank == rank]

        def seqlen(reqs: Iterable[SimRequest]) -> int:
            return sum(r.prompt_tokens + r.generated for r in reqs)

        waiting, prealloc, transfer = mine(self.waiting), mine(self.prealloc), mine(self.transfer)
        chunked = self.chunked[rank]
        bootstrap, inflight = mine(self.bootstrap_queue), mine(self.inflight)
        # Which queues count as waiting, and whose tokens are pending or still to arrive, by role
        # (load_inquirer.py:114-141): a prefill's bootstrap queue waits too; a decode's prealloc
        # and transfer queues wait, and their KV has not arrived.
        queued, pending, awaiting = waiting, waiting, []
        if self.role == "prefill":
            queued = pending = [*waiting, *bootstrap]
        elif self.role == "decode":
            queued, pending, awaiting = [*waiting, *prealloc, *transfer], prealloc, [*prealloc, *transfer]
        cap = self.rank_kv_capacity
        used = self.kv_used[rank]
        total = used + seqlen(pending)
        transfer_ms, transfer_speed = self.last_transfer[rank]
        return {
            "timestamp": time.time(),
            "dp_rank": rank,
            # The running batch, which a prefill never fills (metrics_reporter.py:854-855).
            "num_running_reqs": len(mine(self.running)),
            "num_waiting_reqs": len(queued),
            # The waiting queue's prompts and the rest of the chunked request's: not the bootstrap
            # queue's, none on decode (load_inquirer.py:82-107).
            "num_waiting_uncached_tokens": 0 if self.role == "decode" else (
                seqlen(waiting) + (chunked.prompt_tokens - chunked.prefix_len if chunked else 0)),
            "num_used_tokens": used,
            "num_total_tokens": total,
            "num_active_tokens": max(0, total - seqlen(awaiting)),
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cap,
            "max_running_requests": self.rank_max_running_requests,
            "token_usage": round(used / cap, 4),
            "gen_throughput": round(self.gen_throughput(rank), 2),
            "cache_hit_rate": 0.0,
            "utilization": self.utilization(),
            "total_prefill_uncached_tokens": 0,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": cap},
            "disaggregation": {
                "mode": self.role,
                "prefill_bootstrap_queue_reqs": len(bootstrap),
                "prefill_inflight_queue_reqs": len(inflight),
                "decode_prealloc_queue_reqs": len(prealloc),
                "decode_transfer_queue_reqs": len(transfer),
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": transfer_speed,
                "kv_transfer_latency_ms": transfer_ms,
            },
            "queues": {
                "waiting": len(waiting),
                "grammar": 0,
                # Never raised in 0.5.23: the reporter copies and resets a count nothing adds to
                # (`managers/scheduler_components/metrics_reporter.py:875-876, 1102-1103`).
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        }

    def refresh_gauges(self) -> None:
        """Bring each DP rank's scheduler gauges up to date (SGLang updates them every log interval)."""
        m = self.metrics
        cap = self.rank_kv_capacity
        for load in self.loads():
            rank = load["dp_rank"]
            disagg, queues = load["disaggregation"], load["queues"]
            used = load["num_used_tokens"]
            # A prefill reports the batch in its forward pass, 0 once idle (metrics_reporter.py:850-858, 1485-1512).
            running = len([r for r in self.forward_batch if r.dp_rank == rank]) if self.role == "prefill" else (
                load["num_running_reqs"])
            m.set(m.num_running_reqs, rank, running)
            m.set(m.num_queue_reqs, rank, queues["waiting"])
            m.set(m.num_paused_reqs, rank, queues["paused"], pid=m.pid)
            m.set(m.gen_throughput, rank, load["gen_throughput"])
            # Rounded as the scheduler rounds it (scheduler_components/pool_stats_observer.py:155);
            # /v1/loads keeps four places (load_inquirer.py:243).
            m.set(m.token_usage, rank, round(used / cap, 2))
            m.set(m.num_used_tokens, rank, used)
            m.set(m.kv_used_tokens, rank, used)
            m.set(m.kv_available_tokens, rank, cap - used)
            m.set(m.max_total_num_tokens, rank, cap)
            m.set(m.utilization, rank, self.utilization())
            m.set(m.num_prefill_bootstrap_queue_reqs, rank, disagg["prefill_bootstrap_queue_reqs"])
            m.set(m.num_prefill_inflight_queue_reqs, rank, disagg["prefill_inflight_queue_reqs"])
            m.set(m.num_decode_prealloc_queue_reqs, rank, disagg["decode_prealloc_queue_reqs"])
            m.set(m.num_decode_transfer_queue_reqs, rank, disagg["decode_transfer_queue_reqs"])
            m.set(m.pending_prealloc_token_usage, rank,
                  sum(self._kv_need(r) for r in self.prealloc if r.dp_rank == rank) / cap)

    # ------------------------------------------------------------------ role switch

    async def switch_role(self, new_role: str, decode_cuda_graph_memory_gb: float | None,
                          prepare_only: bool = False) -> SwitchAnswer:
        """SGLang's `/pd_role_switch`.

        The tokenizer refuses a server without the flag itself (`managers/tokenizer_control_mixin.py:926-933`)
        and queues every other call, one at a time in arrival order, for the scheduler, which checks
        its preconditions in its order (`disaggregation/role_switch.py:43-112`, `_reject_reason`). A
        second call sent during a switch therefore waits for it and is then judged on the role it
        left: the same role is a success. Its "another role switch is already in progress" cannot
        be reached over HTTP, so it is not modelled. `prepare_only` runs the checks and switches
        nothing (lines 113-121)."""
        if not self.role_switch_enabled:
            return SwitchAnswer(False, "--enable-pd-role-switch is not set on this server", True, self.role)
        async with self._switch_queue:
            old_role = self.role
            success, message, safe = await self._switch_role(new_role, decode_cuda_graph_memory_gb, prepare_only)
            return SwitchAnswer(success, message, safe, old_role)

    async def _switch_role(self, new_role: str, decode_cuda_graph_memory_gb: float | None,
                           prepare_only: bool) -> tuple[bool, str, bool]:
        checks = (
            (not self.healthy, False, "instance is unhealthy after a failed role switch; restart required"),
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
        if prepare_only:
            return True, "ready", True
        self._scheduler_free.clear()
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
            self._scheduler_free.set()
