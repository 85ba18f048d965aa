"""Waiting on a real cluster or engine: poll until a condition holds, fail with what was seen.

Controllers converge instead of answering, so every integration and end-to-end check is
"eventually". A failure must say what the last observation was (a value or the exception a
read raised), or a timeout in CI is a riddle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
             interval: float = 0.5) -> Any:
    """The first truthy value of `check`; reads that raise count as "not yet" until the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - a read may fail while things converge
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)
