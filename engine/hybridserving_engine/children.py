"""What the launcher does for the engine's processes besides starting and stopping them: it copies
their output to its own with the fleet's key blanked out, and, as a container's PID 1, it reaps the
orphans SGLang leaves behind."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

REDACTED = b"<redacted>"
# A line is passed on whole so that the key is never split between two writes; one that grows past
# this without ending is passed on in pieces, cut where no part of the key can straddle the cut.
MAX_LINE = 1 << 20
_LINE_END = re.compile(rb"[\r\n]")


class Redactor:
    """Blanks `secret` out of a byte stream that arrives in arbitrary pieces."""

    def __init__(self, secret: str | None) -> None:
        self.secret = secret.encode() if secret else b""
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        """What of `pending + data` can be passed on now: up to the last line end (tqdm's progress
        bars end theirs with a carriage return), or most of an overlong line."""
        self.pending += data
        ends = [m.end() for m in _LINE_END.finditer(self.pending)]
        cut = ends[-1] if ends else 0
        if not cut and len(self.pending) > MAX_LINE:
            cut = len(self.pending)
            # Hold back a tail that could be the start of the key.
            for k in range(min(len(self.secret) - 1, cut), 0, -1):
                if self.pending.endswith(self.secret[:k]):
                    cut -= k
                    break
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return self._blank(out)

    def close(self) -> bytes:
        out, self.pending = self.pending, b""
        return self._blank(out)

    def _blank(self, data: bytes) -> bytes:
        return data.replace(self.secret, REDACTED) if self.secret else data


class Forwarder:
    """Copies one of the engine's output pipes to one of the launcher's own file descriptors.

    SGLang logs its `server_args` at INFO, `api_key` included (`entrypoints/engine.py:1185`; its
    `_server_args_for_logging`, lines 173-174, blanks only watermark secrets), so the engine cannot
    write to the container's log itself. A thread, not the event loop, does the copying: a slow log
    reader then stalls neither the launcher's HTTP nor, while the pipe has room, the engine.
    """

    def __init__(self, read_fd: int, write_fd: int, secret: str | None) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.redactor = Redactor(secret)
        self.thread = threading.Thread(target=self._run, name=f"engine-output-{write_fd}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self.read_fd, 65536):
                self._write(self.redactor.feed(chunk))
            self._write(self.redactor.close())
        finally:
            os.close(self.read_fd)

    def _write(self, data: bytes) -> None:
        """Pass `data` on; if the launcher's own output is gone, drop it, but keep reading: an engine
        whose pipe fills up stops at its next log line."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.write_fd, view):]
        except OSError:
            pass

    def join(self, timeout: float) -> bool:
        """Wait for the end of the output; False if a process outside the engine's process group
        still holds the pipe open (the thread then keeps copying what it writes)."""
        self.thread.join(timeout)
        return not self.thread.is_alive()


def reap_orphans(proc_root: Path = Path("/proc")) -> list[int]:
    """Reap this process's zombie children that lead no session of their own, and return their pids.

    As a container's PID 1 (the engine image's ENTRYPOINT) the launcher inherits every orphan, and
    SGLang leaves some: it SIGKILLs its process tree (`utils/common.py:2507-2564`, called from
    `managers/tokenizer_manager.py:3559, 4081`), and processes whose parent goes first are re-parented
    to PID 1, where they would stay zombies. The launcher starts every engine as the leader of a new
    session, and asyncio waits for that pid itself; a child that leads no session was therefore never
    started by the launcher, and reaping it takes no exit status that asyncio is waiting for.
    """
    me = os.getpid()
    reaped = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        state, ppid, _, session = stat.rpartition(")")[2].split()[:4]
        pid = int(entry.name)
        if state == "Z" and int(ppid) == me and int(session) != pid:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            reaped.append(pid)
    return reaped
