"""OpenAI-style requests as a client sends them through the router, checked as they arrive.

The end-to-end tests judge latency per token and completeness of every answer, so a
streaming request records when each token arrived, and an error chunk in the stream (which
arrives with HTTP 200) fails the request instead of passing as a short answer.
"""

from __future__ import annotations

from typing import Any

import json
import time

import httpx


def _request(chat: bool, model: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    if chat:
        return "/v1/chat/completions", {"model": model, "max_tokens": max_tokens,
                                        "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {"model": model, "max_tokens": max_tokens, "prompt": prompt}


def stream_completion(url: str, *, model: str, prompt: str, max_tokens: int, chat: bool = False,
                      timeout: float = 120, headers: dict[str, str] | None = None) -> tuple[float, list[float], str]:
    """One streaming request: (time to first token, arrival time of each token, text)."""
    path, body = _request(chat, model, prompt, max_tokens)
    body["stream"] = True
    start = time.monotonic()
    arrivals: list[float] = []
    text = ""
    with httpx.stream("POST", url + path, json=body, timeout=timeout, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                piece = choice["delta"].get("content") if chat else choice["text"]
                if piece:
                    arrivals.append(time.monotonic())
                    text += piece
    assert arrivals, f"no token arrived from {url}{path}"
    return arrivals[0] - start, arrivals, text


def complete(url: str, *, model: str, prompt: str, max_tokens: int, chat: bool = False,
             timeout: float = 120, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """One non-streaming request; the response body."""
    path, body = _request(chat, model, prompt, max_tokens)
    resp = httpx.post(url + path, json=body, timeout=timeout, headers=headers)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer
