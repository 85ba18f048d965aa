"""Request traces: readers for the public formats and the synthetic workloads of the benchmark.

A trace is three aligned arrays (arrival seconds from the start, prompt tokens, output tokens)
plus the prompt tokens a prefix cache can skip. Load is varied the way the literature does it:
by dividing arrival times by a rate scale, which keeps the burst structure of real traffic.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Trace:
    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    cached_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not (len(self.prompt_tokens) == len(self.output_tokens) == len(self.cached_tokens) == n):
            raise ValueError("trace arrays must have the same length")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("arrivals must be sorted")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def rate(self) -> float:
        """Mean requests per second at the trace's own timestamps."""
        return len(self) / self.duration_s if self.duration_s > 0 else 0.0

    def scaled(self, rate_scale: float) -> Trace:
        """The same requests arriving `rate_scale` times faster."""
        if rate_scale <= 0:
            raise ValueError("rate_scale must be positive")
        return Trace(
            f"{self.name}×{rate_scale:g}",
            self.arrival_s / rate_scale,
            self.prompt_tokens,
            self.output_tokens,
            self.cached_tokens,
        )

    def at_load(self, load: float, seed: int = 0, jitter_s: float = 2.0) -> Trace:
        """The same traffic `load` times as dense on the same clock: phases, think times and
        segment lengths keep their duration, so they keep their length relative to switch,
        cooldown and launch times (dividing timestamps would shrink them).

        Copy c of each request (c = 0, 1, ...) is kept when c + u < load for a uniform u drawn
        once per copy and request, so a higher load keeps every request a lower one keeps;
        copies after the first arrive up to `jitter_s` later. Load < 1 thins the trace.
        """
        if load <= 0:
            raise ValueError("load must be positive")
        arrivals, keeps = [], []
        for c in range(int(math.ceil(load))):
            rng = np.random.default_rng([seed, c])
            keep = c + rng.uniform(size=len(self)) < load
            shift = rng.uniform(0.0, jitter_s, size=len(self)) if c else np.zeros(len(self))
            arrivals.append((self.arrival_s + shift)[keep])
            keeps.append(keep)
        arrival = np.concatenate(arrivals)

        def pick(column: np.ndarray) -> np.ndarray:
            return np.concatenate([column[k] for k in keeps])

        order = np.argsort(arrival, kind="stable")
        return Trace(
            f"{self.name}@{load:g}",
            arrival[order],
            pick(self.prompt_tokens)[order],
            pick(self.output_tokens)[order],
            pick(self.cached_tokens)[order],
        )

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in [start_s, end_s), re-based to start at 0."""
        keep = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        return Trace(
            self.name,
            self.arrival_s[keep] - start_s,
            self.prompt_tokens[keep],
            self.output_tokens[keep],
            self.cached_tokens[keep],
        )


def make_trace(
    name: str, arrival_s: ArrayLike, prompt_tokens: ArrayLike, output_tokens: ArrayLike,
    cached_tokens: ArrayLike | None = None,
) -> Trace:
    """Sort by arrival and normalise dtypes; prompts and outputs are at least one token."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    prompt = np.maximum(np.asarray(prompt_tokens, dtype=np.int64)[order], 1)
    output = np.maximum(np.asarray(output_tokens, dtype=np.int64)[order], 1)
    cached = (
        np.zeros_like(prompt)
        if cached_tokens is None
        else np.minimum(np.asarray(cached_tokens, dtype=np.int64)[order], prompt - 1)
    )
    start = arrival[order][0] if len(arrival) else 0.0
    return Trace(name, arrival[order] - start, prompt, output, np.maximum(cached, 0))


def read_azure_csv(path: str | Path, limit: int | None = None) -> Trace:
    """Azure LLM inference trace 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock times)."""
    times, prompts, outputs = [], [], []
    with open(path, newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            if limit is not None and i >= limit:
                break
            times.append(_parse_azure_time(row["TIMESTAMP"]))
            prompts.append(_tokens(int(row["ContextTokens"]), "ContextTokens", i + 2))
            outputs.append(_tokens(int(row["GeneratedTokens"]), "GeneratedTokens", i + 2))
    return make_trace(Path(path).stem, times, prompts, outputs)


def _tokens(value: object, field: str, line: int) -> int:
    """A token count as a trace gives it: a whole number, 0 or more (`make_trace` counts at least
    one). A quoted number, a boolean or a negative count is a broken record, not one to round
    into shape."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"line {line}: {field} {value!r} is not a whole number of tokens (0 or more)")
    return value


def _parse_azure_time(text: str) -> float:
    """Seconds since the epoch; the files carry 7 fractional digits, which datetime does not take."""
    head, _, frac = text.strip().partition(".")
    whole = datetime.fromisoformat(head).timestamp()
    return whole + (float("0." + frac) if frac else 0.0)


def read_mooncake_jsonl(path: str | Path, limit: int | None = None) -> Trace:
    """Mooncake trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids` of 512-token blocks).

    The cached part of a prompt is its leading run of blocks already seen earlier in the trace:
    what a fleet-wide prefix cache (Mooncake's store) would let prefill skip.
    """
    times, prompts, outputs, cached = [], [], [], []
    seen: set[int] = set()
    with open(path) as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            blocks = rec.get("hash_ids", [])
            if not isinstance(blocks, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in blocks):
                raise ValueError(f"line {i + 1}: hash_ids {blocks!r} is not a list of block hashes (whole numbers)")
            hits = 0
            for block in blocks:
                if block not in seen:
                    break
                hits += 1
            seen.update(blocks)
            stamp = rec["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
                raise ValueError(f"line {i + 1}: timestamp {stamp!r} is not a finite number of milliseconds")
            times.append(stamp / 1000.0)
            prompts.append(_tokens(rec["input_length"], "input_length", i + 1))
            outputs.append(_tokens(rec["output_length"], "output_length", i + 1))
            cached.append(hits * MOONCAKE_BLOCK_TOKENS)
    return make_trace(Path(path).stem, times, prompts, outputs, cached)


def fold(trace: Trace, window_s: float, offset_s: float = 0.0) -> Trace:
    """Overlay consecutive `window_s` windows of a trace into one window (arrival mod window).

    Raises the rate by duration / window while keeping real lengths and real burst structure;
    `offset_s` rotates the windows so two folds of the same hour do not line up.
    """
    t = np.mod(trace.arrival_s + offset_s, window_s)
    return make_trace(f"{trace.name}/fold", t, trace.prompt_tokens, trace.output_tokens, trace.cached_tokens)


def mix_shift(code: Trace, conv: Trace, segment_s: float = 600.0, segments: int = 6) -> Trace:
    """Azure code (prefill-heavy) and conversation (decode-heavy) traffic, alternating by segment.

    Each segment is one of the two real hours folded into `segment_s` (rotated differently per
    segment), so the fleet sees the mix swing from prefill-heavy to decode-heavy and back, at a
    load where those swings matter and for long enough that a switch can pay off.
    """
    arrivals, prompts, outputs = [], [], []
    for i in range(segments):
        source = code if i % 2 == 0 else conv
        part = fold(source, segment_s, offset_s=i * segment_s / segments)
        arrivals.append(part.arrival_s + i * segment_s)
        prompts.append(part.prompt_tokens)
        outputs.append(part.output_tokens)
    return make_trace("mix-shift", np.concatenate(arrivals), np.concatenate(prompts), np.concatenate(outputs))


def diurnal(
    code: Trace,
    conv: Trace,
    duration_s: float = 3600.0,
    peak_rate: float = 6.0,
    trough_fraction: float = 0.3,
    seed: int = 0,
) -> Trace:
    """A day compressed into `duration_s`: the rate swings trough → peak → trough and the mix with it.

    Daytime traffic is coding-heavy, evening traffic chat-heavy (the two Azure services), so the
    prefill:decode ratio moves with the load. Lengths are drawn from the real traces.
    """
    rng = np.random.default_rng(seed)

    def phase(t: np.ndarray) -> np.ndarray:
        """0 at the ends of the day, 1 mid-day."""
        return 0.5 - 0.5 * np.cos(2 * np.pi * t / duration_s)

    # Thinned Poisson process with rate peak·(trough + (1 - trough)·phase).
    n_max = rng.poisson(peak_rate * duration_s)
    t = np.sort(rng.uniform(0, duration_s, n_max))
    keep = rng.uniform(size=n_max) < trough_fraction + (1 - trough_fraction) * phase(t)
    t = t[keep]
    # Code share peaks (0.9) in the first half of the day, chat (0.9) in the second.
    code_share = 0.5 + 0.4 * np.sin(2 * np.pi * t / duration_s)
    from_code = rng.uniform(size=len(t)) < code_share
    ci = rng.integers(0, len(code), len(t))
    vi = rng.integers(0, len(conv), len(t))
    prompt = np.where(from_code, code.prompt_tokens[ci], conv.prompt_tokens[vi])
    output = np.where(from_code, code.output_tokens[ci], conv.output_tokens[vi])
    return make_trace("diurnal", t, prompt, output)


def agentic_sessions(
    sessions: int = 48,
    context_tokens: int = 100_000,
    duration_s: float = 3600.0,
    waves: int = 3,
    seed: int = 0,
) -> Trace:
    """Long-context agent sessions arriving in waves: each turn re-sends the growing context.

    A session starts with most of its context (a repository, a document set) and adds a few
    thousand tokens per turn (tool results) until it reaches `context_tokens`; between turns the
    agent runs tools. All but the new tokens are a prefix-cache hit. Sessions start in `waves`
    bursts, so prefill demand spikes when a wave opens and decode KV fills as it proceeds.
    """
    rng = np.random.default_rng(seed)
    times, prompts, outputs, cached = [], [], [], []
    wave_gap = duration_s / waves
    for s in range(sessions):
        t = (s % waves) * wave_gap + rng.uniform(0, 60.0)
        ctx = int(context_tokens * rng.uniform(0.5, 0.8))
        prev = 0
        while ctx <= context_tokens and t < duration_s:
            out = int(rng.integers(100, 800))
            times.append(t)
            prompts.append(ctx)
            outputs.append(out)
            cached.append(prev)
            prev = ctx + out
            ctx = prev + int(rng.integers(1000, 6000))
            t += rng.exponential(15.0) + 5.0
    return make_trace("agentic", times, prompts, outputs, cached)
