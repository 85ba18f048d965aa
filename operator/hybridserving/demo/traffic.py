"""Client load for the demo: a fixed number of concurrent streams of one request shape.

A phase of short prompts with long answers loads decode; one of long prompts with short
answers loads prefill. Swinging between the two is the mix shift the role-switch controller
answers. Every request is streamed, so time to first token is measured as a client sees it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

# The simulator counts one prompt token per four bytes, as the engine's tokenizer roughly does.
BYTES_PER_TOKEN = 4


@dataclass
class PhaseResult:
    name: str
    sent: int = 0
    completed: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        p50 = f"{statistics.median(self.ttft) * 1000:.0f} ms" if self.ttft else "-"
        return f"{self.name}: {self.completed}/{self.sent} completed, {self.failed} failed, TTFT p50 {p50}"


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt_tokens: int, output_tokens: int,
               result: PhaseResult) -> None:
    body = {"model": model, "prompt": "x" * (prompt_tokens * BYTES_PER_TOKEN),
            "max_tokens": output_tokens, "stream": True, "ignore_eos": True}
    result.sent += 1
    started = time.monotonic()
    first = None
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise RuntimeError(str(chunk["error"])[:200])
                if first is None:
                    first = time.monotonic() - started
        if first is None:
            raise RuntimeError("the stream ended without a token")
        result.completed += 1
        result.ttft.append(first)
    except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError) as exc:
        result.failed += 1
        result.errors.append(str(exc) or type(exc).__name__)
        await asyncio.sleep(0.5)  # a client that backs off, not a hot loop against a failing router


async def run_phase(url: str, name: str, *, model: str, prompt_tokens: int, output_tokens: int,
                    concurrency: int, seconds: float, headers: dict[str, str] | None = None) -> PhaseResult:
    """Keep `concurrency` requests in flight for `seconds`, then let the last ones finish."""
    result = PhaseResult(name)
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=300)

    async def stream(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            await _one(session, url, model, prompt_tokens, output_tokens, result)

    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        await asyncio.gather(*(stream(session) for _ in range(concurrency)))
    return result
