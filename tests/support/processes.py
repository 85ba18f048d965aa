"""Whether a local process still runs, as the tests that kill containers and engines ask it."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """A zombie is not alive: it holds no port or memory, only an entry until its reaper waits on it,
    and a reaper outside the test (the machine's init) waits when it will."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
