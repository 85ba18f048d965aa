"""A discrete-event simulator of a PD-disaggregated fleet whose instances can change role.

N identical instances, each prefill or decode. A request arrives, queues on the prefill
instance with the least queued work, is prefilled in token-budget batches (long prompts in
chunks), waits for KV slots on a decode instance (the prealloc queue: when decode KV is full this
is the latency cliff), has its KV transferred, and joins the decode instance's continuous batch.
Timings come from `core.perfmodel`, the same model the HTTP engine simulator uses.

Decode is simulated per batch change, not per step: between two changes the batch is fixed and
each step adds one token per request to the resident context, so the time of k steps has a
closed form. That is what lets an hour of a 32-instance fleet run in seconds.

A controller ticks every `tick_s`, sees per-instance metrics (as the operator would scrape them)
and may start role switches: the instance stops taking work, drains, pays the switch time, and
serves in its new role.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from hybridserving.core.perfmodel import PerformanceModel
from hybridserving.api.v1alpha1 import Role
from hybridserving.core.policy import Decision, InstanceMetrics, InstanceState, ScaleAction
from hybridserving.fleetsim.traces import Trace

_ARRIVAL, _PREFILL_DONE, _TRANSFER_DONE, _DECODE_DONE, _SWITCH_DONE, _TICK = range(6)
_METRIC_WINDOW_S = 60.0


class Controller(Protocol):
    """Decides role switches from what the operator can observe."""

    name: str

    def tick(
        self, now: float, fleet: Sequence[InstanceState], metrics: dict[str, InstanceMetrics]
    ) -> Sequence[Decision | ScaleAction]: ...


@dataclass(frozen=True)
class FleetConfig:
    instances: int
    initial_prefill: int
    model: PerformanceModel
    prefill_token_budget: int = 16384
    """Tokens per prefill forward pass (SGLang's chunked-prefill size)."""
    tick_s: float = 5.0
    in_place: bool = True
    """Whether switches are in place (seconds) or relaunches (the model's restart time)."""
    gpus_per_instance: int = 8
    initial_decode: int | None = None
    """Decode instances at the start (default: every slot not prefill). Slots beyond
    `initial_prefill + initial_decode` start down: a scaler may launch them."""
    launch_s: float | None = None
    """Pod start plus weight load of a new instance (default: the model's launch time)."""


@dataclass
class SimResult:
    """Per-request latencies and a timeline of the fleet's split."""

    policy: str
    trace: str
    instances: int
    gpus_per_instance: int
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    switches: int
    drain_s: float
    switch_s: float
    timeline_t: np.ndarray
    timeline_prefill: np.ndarray
    timeline_decode: np.ndarray
    decisions: list[tuple[float, Decision | ScaleAction]] = field(default_factory=list)
    timeline_provisioned: np.ndarray | None = None
    """Instances holding GPUs (launching, serving, draining, switching) at each tick."""
    gpu_hours: float = 0.0
    scale_ups: int = 0
    scale_downs: int = 0

    def meets(self, ttft_slo_s: float, tpot_slo_s: float) -> np.ndarray:
        """Per request: met both limits (an unfinished request meets neither)."""
        return (self.ttft_s <= ttft_slo_s) & (self.tpot_s <= tpot_slo_s)

    def attainment(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        return float(self.meets(ttft_slo_s, tpot_slo_s).mean()) if len(self.ttft_s) else 1.0


class _Instance:
    __slots__ = (
        "idx", "name", "role", "phase", "target", "last_switch_at", "pinned", "in_place",
        "queue", "queue_tokens", "busy", "pass_items", "busy_log",
        "running", "steps", "t0", "batch", "resident", "reserved", "inbound", "inbound_tokens", "version",
        "tpot_log", "drain_started", "removing", "done_log",
    )  # fmt: skip

    def __init__(self, idx: int, role: Role, in_place: bool) -> None:
        self.idx = idx
        self.name = f"i{idx:03d}"
        self.role: Role = role
        self.phase = "serving"
        self.target: Role | None = None
        self.last_switch_at: float | None = None
        self.pinned = False
        self.in_place = in_place
        # prefill
        self.queue: deque[int] = deque()
        self.queue_tokens = 0
        self.busy = False
        self.pass_items: list[tuple[int, int]] = []
        self.busy_log: deque[tuple[float, float]] = deque()
        # decode
        self.running: list[tuple[int, int]] = []
        self.steps = 0
        self.t0 = 0.0
        self.batch = 0
        self.resident = 0
        self.reserved = 0
        self.inbound = 0
        self.inbound_tokens = 0  # prompts allocated for KV on its way here
        self.version = 0
        self.tpot_log: deque[tuple[float, float]] = deque()
        self.drain_started = 0.0
        self.removing = False
        self.done_log: deque[tuple[float, int]] = deque()
        """(time, output tokens) of finished requests: SGLang's generation-token and request counters."""

    def copy(self) -> _Instance:
        twin = copy.copy(self)
        twin.queue = deque(self.queue)
        twin.pass_items = list(self.pass_items)
        twin.busy_log = deque(self.busy_log)
        twin.running = list(self.running)
        twin.tpot_log = deque(self.tpot_log)
        twin.done_log = deque(self.done_log)
        return twin

    def state(self) -> InstanceState:
        return InstanceState(
            name=self.name,
            role=self.role,
            phase=self.phase,  # type: ignore[arg-type]
            target_role=self.target,
            last_switch_at=self.last_switch_at,
            pinned=self.pinned,
            in_place=self.in_place,
        )


def _p90(log: deque[tuple[float, float]], now: float) -> float | None:
    while log and log[0][0] < now - _METRIC_WINDOW_S:
        log.popleft()
    if not log:
        return None
    values = sorted(v for _, v in log)
    return values[min(len(values) - 1, int(0.9 * len(values)))]


def _mean_output(log: deque[tuple[float, int]], now: float) -> float | None:
    """Δ generation tokens / Δ finished requests over the metric window (None: none finished)."""
    while log and log[0][0] < now - _METRIC_WINDOW_S:
        log.popleft()
    return sum(o for _, o in log) / len(log) if log else None


class FleetSimulator:
    def __init__(self, config: FleetConfig, controller: Controller | None = None, pinned: Sequence[str] = ()) -> None:
        decode = config.instances - config.initial_prefill if config.initial_decode is None else config.initial_decode
        if config.initial_prefill < 1 or decode < 1 or config.initial_prefill + decode > config.instances:
            raise ValueError("need at least one prefill and one decode instance, within `instances` slots")
        self.cfg = config
        self.model = config.model
        self.controller = controller
        self.launch_s = config.model.launch_seconds() if config.launch_s is None else config.launch_s
        self.instances = [
            _Instance(i, "prefill" if i < config.initial_prefill else "decode", config.in_place)
            for i in range(config.instances)
        ]
        for inst in self.instances[config.initial_prefill + decode :]:
            inst.phase = "down"
        for inst in self.instances:
            inst.pinned = inst.name in pinned
        m = self.model
        self._step_fixed = (m.decode_base_s + m.decode_dcp_comm_s) * m.time_scale
        self._step_per_req = m.decode_per_request_s * m.time_scale
        self._step_per_tok = m.decode_per_context_token_s * m.time_scale
        self._latency = m.request_latency_s * m.time_scale

    # ------------------------------------------------------------------ public

    def run(self, trace: Trace, policy_name: str = "static") -> SimResult:
        self.start(trace)
        self.advance(math.inf)
        return self.result(policy_name)

    def start(self, trace: Trace) -> None:
        """Load `trace` and schedule the first tick; `advance` then runs it piece by piece."""
        n = len(trace)
        self.trace = trace
        self.arrival = trace.arrival_s
        self.prompt = trace.prompt_tokens.tolist()
        self.output = trace.output_tokens.tolist()
        self.cached = trace.cached_tokens.tolist()
        self.need = [self.model.request_kv_tokens(p + o) for p, o in zip(self.prompt, self.output, strict=True)]
        self.progress = [0] * n
        self.ttft = np.full(n, np.inf)
        self.tpot = np.full(n, np.inf)
        self.first_token = [0.0] * n
        self.pending: deque[int] = deque()
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.switches = 0
        self.scale_ups = 0
        self.scale_downs = 0
        self.drain_total = 0.0
        self.switch_total = 0.0
        self.decisions: list[tuple[float, Decision | ScaleAction]] = []
        self.tl_t: list[float] = []
        self.tl_p: list[int] = []
        self.tl_d: list[int] = []
        self.tl_up: list[int] = []
        self.arrivals = trace.arrival_s.tolist()
        self.next_arrival = 0
        self.end = (self.arrivals[-1] if self.arrivals else 0.0) + 1.0
        self.now = 0.0
        self._push(0.0, _TICK, 0, 0)

    def advance(self, until: float) -> None:
        """Process every arrival and event up to time `until` (inclusive)."""
        events = self.events
        arrivals = self.arrivals
        n = len(arrivals)
        while events or self.next_arrival < n:
            nxt = self.next_arrival
            if nxt < n and (not events or arrivals[nxt] <= events[0][0]):
                if arrivals[nxt] > until:
                    break
                self.now = arrivals[nxt]
                self._arrive(arrivals[nxt], nxt)
                self.next_arrival = nxt + 1
                continue
            if events[0][0] > until:
                break
            t, _, kind, a, b = heapq.heappop(events)
            self.now = t
            if kind == _PREFILL_DONE:
                self._prefill_done(t, self.instances[a])
            elif kind == _TRANSFER_DONE:
                self._transfer_done(t, self.instances[a], b)
            elif kind == _DECODE_DONE:
                inst = self.instances[a]
                if b == inst.version:
                    self._decode_advance(t, inst)
                    self._admit(t)
                    self._decode_schedule(inst)
                    self._maybe_drained(t, inst)
            elif kind == _SWITCH_DONE:
                self._switch_done(t, self.instances[a])
            elif kind == _TICK:
                self.tl_t.append(t)
                self.tl_p.append(sum(1 for i in self.instances if i.role == "prefill" and i.phase == "serving"))
                self.tl_d.append(sum(1 for i in self.instances if i.role == "decode" and i.phase == "serving"))
                self.tl_up.append(sum(1 for i in self.instances if i.phase != "down"))
                if self.controller is not None:
                    self._control(t)
                if self.next_arrival < n or t < self.end or self._busy():
                    self._push(t + self.cfg.tick_s, _TICK, 0, 0)

    def result(self, policy_name: str) -> SimResult:
        up = np.asarray(self.tl_up, dtype=float)
        return SimResult(
            policy=policy_name,
            trace=self.trace.name,
            instances=self.cfg.instances,
            gpus_per_instance=self.cfg.gpus_per_instance,
            arrival_s=self.trace.arrival_s,
            ttft_s=self.ttft,
            tpot_s=self.tpot,
            switches=self.switches,
            drain_s=self.drain_total,
            switch_s=self.switch_total,
            timeline_t=np.asarray(self.tl_t),
            timeline_prefill=np.asarray(self.tl_p),
            timeline_decode=np.asarray(self.tl_d),
            decisions=self.decisions,
            timeline_provisioned=up,
            gpu_hours=float(up.sum()) * self.cfg.tick_s * self.cfg.gpus_per_instance / 3600.0,
            scale_ups=self.scale_ups,
            scale_downs=self.scale_downs,
        )

    def fork(self) -> FleetSimulator:
        """An independent copy of a started simulation (the trace's arrays are shared, read-only)."""
        twin = copy.copy(self)
        twin.progress = list(self.progress)
        twin.ttft = self.ttft.copy()
        twin.tpot = self.tpot.copy()
        twin.first_token = list(self.first_token)
        twin.pending = deque(self.pending)
        twin.events = list(self.events)
        twin.decisions = list(self.decisions)
        twin.tl_t, twin.tl_p, twin.tl_d, twin.tl_up = (
            list(self.tl_t),
            list(self.tl_p),
            list(self.tl_d),
            list(self.tl_up),
        )
        twin.instances = [i.copy() for i in self.instances]
        return twin

    def relabel(self, t: float, prefill: int) -> None:
        """Make `prefill` of the serving instances prefill and the rest decode, instantly and for free.

        The hindsight oracle's switch: an instance takes new work of its new role at once and
        finishes the work of its old role alongside (no drain, no rebuild, no interference),
        which is more than any real switch offers, so schedules of these bound every policy.
        """
        serving = [i for i in self.instances if i.phase == "serving"]
        have = [i for i in serving if i.role == "prefill"]
        if len(have) > prefill:
            for inst in sorted(have, key=lambda i: (i.queue_tokens, i.idx))[: len(have) - prefill]:
                inst.role = "decode"
            self._admit(t)
        elif len(have) < prefill:
            decoders = [i for i in serving if i.role == "decode"]
            for inst in sorted(decoders, key=lambda i: (i.reserved, i.idx))[: prefill - len(have)]:
                inst.role = "prefill"

    # ------------------------------------------------------------------ events

    def _push(self, t: float, kind: int, a: int, b: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def _busy(self) -> bool:
        return bool(self.pending) or any(
            i.queue or i.busy or i.batch or i.inbound or i.phase not in ("serving", "down") for i in self.instances
        )

    def _arrive(self, t: float, r: int) -> None:
        best = None
        best_load = 0
        for inst in self.instances:
            if inst.role == "prefill" and inst.phase == "serving":
                load = inst.queue_tokens
                if best is None or load < best_load:
                    best, best_load = inst, load
        if best is None:  # every prefill instance is draining: queue on the least loaded one
            best = min(
                (i for i in self.instances if i.role == "prefill" and i.phase != "down"), key=lambda i: i.queue_tokens
            )
        best.queue.append(r)
        best.queue_tokens += self.prompt[r] - self.cached[r]
        if not best.busy:
            self._start_pass(t, best)

    def _start_pass(self, t: float, inst: _Instance) -> None:
        budget = self.cfg.prefill_token_budget
        chunks: list[tuple[int, int]] = []
        items: list[tuple[int, int]] = []
        for r in inst.queue:
            remaining = self.prompt[r] - self.cached[r] - self.progress[r]
            take = remaining if remaining <= budget else budget
            chunks.append((take, self.cached[r] + self.progress[r]))
            items.append((r, take))
            budget -= take
            if budget <= 0:
                break
        duration = self.model.prefill_batch_seconds(chunks)
        inst.busy = True
        inst.pass_items = items
        # Utilisation counts compute only: the fixed per-pass overhead shrinks relative to the
        # work as batches grow, so counting it would make a lightly loaded role look busy.
        inst.busy_log.append((t + duration, duration - self.model.prefill_step_overhead_s * self.model.time_scale))
        self._push(t + duration, _PREFILL_DONE, inst.idx, 0)

    def _prefill_done(self, t: float, inst: _Instance) -> None:
        inst.busy = False
        for r, take in inst.pass_items:
            self.progress[r] += take
            inst.queue_tokens -= take
            if self.progress[r] + self.cached[r] >= self.prompt[r]:
                inst.queue.popleft()
                self.pending.append(r)
        inst.pass_items = []
        self._admit(t)
        if inst.queue:
            self._start_pass(t, inst)
        else:
            self._maybe_drained(t, inst)

    def _admit(self, t: float) -> None:
        """Move requests from the prealloc queue to decode instances with free KV, in order."""
        pending = self.pending
        if not pending:
            return
        cap = self.model.kv_capacity_tokens
        max_running = self.model.max_running_requests
        decoders = [i for i in self.instances if i.role == "decode" and i.phase == "serving"]
        while pending:
            r = pending[0]
            need = self.need[r]
            best = None
            best_free = -1
            for inst in decoders:
                free = cap - inst.reserved
                if free >= need and inst.batch + inst.inbound < max_running and free > best_free:
                    best, best_free = inst, free
            if best is None:
                return
            pending.popleft()
            best.reserved += need
            best.inbound += 1
            best.inbound_tokens += self.prompt[r]
            self._push(t + self.model.transfer_seconds(self.prompt[r]), _TRANSFER_DONE, best.idx, r)

    def _transfer_done(self, t: float, inst: _Instance, r: int) -> None:
        inst.inbound -= 1
        inst.inbound_tokens -= self.prompt[r]
        # Decode starts stepping when the KV lands; the first token reaches the user a fixed
        # latency later, which TTFT carries and TPOT (the pace of the following tokens) does not.
        self.first_token[r] = t
        self.ttft[r] = t + self._latency - self.arrival[r]
        self._decode_advance(t, inst)
        if inst.batch == 0:
            inst.t0 = t
        out = self.output[r]
        if out <= 1:
            self.tpot[r] = 0.0
            inst.reserved -= self.need[r]
            inst.tpot_log.append((t, 0.0))
            inst.done_log.append((t, out))
        else:
            heapq.heappush(inst.running, (inst.steps + out - 1, r))
            inst.batch += 1
            inst.resident += self.prompt[r]
        self._decode_schedule(inst)
        self._maybe_drained(t, inst)

    # ------------------------------------------------------------------ decode closed form

    def _steps_time(self, inst: _Instance, k: int) -> float:
        s0 = self._step_fixed + self._step_per_req * inst.batch + self._step_per_tok * inst.resident
        g = self._step_per_tok * inst.batch
        return k * s0 + g * k * (k - 1) / 2

    def _decode_advance(self, t: float, inst: _Instance) -> None:
        """Run the batch up to time t: finish the requests whose last token falls before it."""
        running = inst.running
        while inst.batch:
            k = running[0][0] - inst.steps
            dt = self._steps_time(inst, k)
            if inst.t0 + dt <= t + 1e-12:
                inst.steps += k
                inst.resident += inst.batch * k
                inst.t0 += dt
                while running and running[0][0] == inst.steps:
                    _, r = heapq.heappop(running)
                    out = self.output[r]
                    self.tpot[r] = (inst.t0 - self.first_token[r]) / (out - 1)
                    inst.tpot_log.append((inst.t0, self.tpot[r]))
                    inst.done_log.append((inst.t0, out))
                    inst.batch -= 1
                    inst.resident -= self.prompt[r] + out - 1
                    inst.reserved -= self.need[r]
                continue
            # Partial: the whole steps that fit before t.
            s0 = self._step_fixed + self._step_per_req * inst.batch + self._step_per_tok * inst.resident
            g = self._step_per_tok * inst.batch
            room = t - inst.t0
            if g > 0:
                b = s0 - g / 2
                whole = int((-b + math.sqrt(b * b + 2 * g * room)) / g)
            else:
                whole = int(room / s0)
            whole = max(0, min(whole, k - 1))
            if whole:
                inst.t0 += self._steps_time(inst, whole)
                inst.steps += whole
                inst.resident += inst.batch * whole
            return

    def _decode_schedule(self, inst: _Instance) -> None:
        inst.version += 1
        if inst.batch:
            k = inst.running[0][0] - inst.steps
            self._push(inst.t0 + self._steps_time(inst, k), _DECODE_DONE, inst.idx, inst.version)

    # ------------------------------------------------------------------ switching

    def _maybe_drained(self, t: float, inst: _Instance) -> None:
        if inst.phase != "draining":
            return
        if inst.role == "prefill" and (inst.queue or inst.busy):
            return
        if inst.role == "decode" and (inst.batch or inst.inbound):
            return
        self.drain_total += t - inst.drain_started
        if inst.removing:
            inst.phase = "down"
            inst.removing = False
            inst.last_switch_at = t
            return
        inst.phase = "switching"
        cost = self.model.switch_seconds("in-place" if inst.in_place else "relaunch")
        self.switch_total += cost
        self._push(t + cost, _SWITCH_DONE, inst.idx, 0)

    def _switch_done(self, t: float, inst: _Instance) -> None:
        assert inst.target is not None
        inst.role = inst.target
        inst.target = None
        inst.phase = "serving"
        inst.last_switch_at = t
        inst.steps = inst.batch = inst.resident = inst.reserved = 0
        inst.running = []
        inst.t0 = t
        inst.tpot_log.clear()
        if inst.role == "decode":
            self._admit(t)

    def _apply(self, t: float, decision: Decision | ScaleAction) -> None:
        if isinstance(decision, ScaleAction):
            self._scale(t, decision)
            return
        inst = next(i for i in self.instances if i.name == decision.instance)
        if inst.phase != "serving" or inst.role != decision.from_role:
            raise ValueError(f"cannot switch {inst.name}: {inst.phase} {inst.role}")
        inst.phase = "draining"
        inst.target = decision.to_role
        inst.drain_started = t
        self.switches += 1
        self.decisions.append((t, decision))
        self._maybe_drained(t, inst)

    def _scale(self, t: float, action: ScaleAction) -> None:
        """Launch a down slot into a role (pod start + weight load), or drain one and take it down."""
        inst = next(i for i in self.instances if i.name == action.instance)
        if action.kind == "add":
            if inst.phase != "down":
                raise ValueError(f"cannot launch {inst.name}: it is {inst.phase}")
            inst.role = action.role
            inst.phase = "switching"
            inst.target = action.role
            inst.steps = inst.batch = inst.resident = inst.reserved = 0
            self.scale_ups += 1
            self._push(t + self.launch_s * self.model.time_scale, _SWITCH_DONE, inst.idx, 0)
        else:
            if inst.phase != "serving" or inst.role != action.role:
                raise ValueError(f"cannot remove {inst.name}: {inst.phase} {inst.role}")
            inst.phase = "draining"
            inst.target = None
            inst.removing = True
            inst.drain_started = t
            self.scale_downs += 1
            self._maybe_drained(t, inst)
        self.decisions.append((t, action))

    # ------------------------------------------------------------------ control

    def metrics(self, t: float) -> dict[str, InstanceMetrics]:
        """What the operator would scrape from each engine at time t."""
        out: dict[str, InstanceMetrics] = {}
        n_decode = sum(1 for i in self.instances if i.role == "decode" and i.phase == "serving") or 1
        prealloc_each = len(self.pending) / n_decode
        cap = self.model.kv_capacity_tokens
        for inst in self.instances:
            if inst.phase == "down":
                continue
            if inst.role == "prefill":
                log = inst.busy_log
                while log and log[0][0] < t - self.cfg.tick_s * 2:
                    log.popleft()
                window = self.cfg.tick_s * 2
                busy = sum(min(d, window, max(0.0, end - (t - window))) for end, d in log)
                out[inst.name] = InstanceMetrics(
                    role="prefill",
                    prefill_queue_reqs=len(inst.queue),
                    prefill_queue_tokens=inst.queue_tokens,
                    utilization=min(1.0, busy / window),
                    running_reqs=len(inst.pass_items),
                )
            else:
                self._decode_advance(t, inst)
                out[inst.name] = InstanceMetrics(
                    role="decode",
                    # What SGLang's token usage counts: the KV slots held now (each running request's
                    # prompt and the tokens generated so far, and the prompts on their way), not
                    # the whole output the admission here reserves, which no engine knows ahead.
                    kv_usage=(inst.resident + inst.inbound_tokens) / cap,
                    prealloc_queue_reqs=int(math.ceil(prealloc_each)) if inst.phase == "serving" else 0,
                    running_reqs=inst.batch + inst.inbound,
                    tpot_p90_s=_p90(inst.tpot_log, t),
                    output_tokens_per_request=_mean_output(inst.done_log, t),
                )
        return out

    def _control(self, t: float) -> None:
        assert self.controller is not None, "only a controlled fleet is ticked"
        fleet = [i.state() for i in self.instances]
        for decision in self.controller.tick(t, fleet, self.metrics(t)):
            self._apply(t, decision)
