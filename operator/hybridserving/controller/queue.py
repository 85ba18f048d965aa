"""A coalescing work queue: one reconcile at a time per HybridServing, any number of triggers.

Events on a HybridServing and on every child funnel into one key per HybridServing. A key
that is queued twice runs once; a key triggered while it runs runs again right after, so no
change is missed and no two passes over one fleet ever overlap (the controller-runtime
work-queue contract). Different fleets reconcile in parallel on a few workers.

A pass that fails, by raising or by ending with errors it reported in status, is retried on one
growing back-off per key; a pass that succeeds resets it. A trigger added with `early=False` does
not cut that back-off short: the fleet runs when its back-off is due (at once when the pass under
way succeeds), so a failing pass whose own writes come back as events does not run back to back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hybridserving.controller import metrics

Key = tuple[str, str]  # (namespace, name)

log = logging.getLogger("hybridserving.controller")

# A failed pass is retried after this, doubling with each failure in a row up to the cap
# (controller-runtime's per-item exponential rate limiter); a pass that succeeds resets it.
FAILURE_BACKOFF_SECONDS = 5.0
FAILURE_BACKOFF_MAX_SECONDS = 300.0


@dataclass(frozen=True)
class Pass:
    """How a pass over one key ended: when to look again (None: only on the next event), and whether
    it failed (an action or a status write refused), which puts the key on the failure back-off."""

    requeue_after: float | None
    failed: bool = False


class WorkQueue:
    def __init__(self, work: Callable[[Key], Awaitable[Pass]], workers: int = 4) -> None:
        self._work = work
        self._workers = workers
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._deferred: set[Key] = set()  # triggered with early=False while running after a failure
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[Key, int] = {}
        self.known: set[Key] = set()

    def add(self, key: Key, *, early: bool = True) -> None:
        """Reconcile `key` soon (once, however many times it is added meanwhile).

        `early=False`: when the last pass over `key` failed, it runs when its back-off is due (or
        right after the pass under way, if that one succeeds), not sooner."""
        self.known.add(key)
        if not early and self._failures.get(key):
            if key in self._running:
                self._deferred.add(key)
                return
            if key in self._timers:
                return  # the back-off's timer brings it
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)
            self._publish_depth()

    def add_after(self, key: Key, delay: float) -> None:
        """Reconcile `key` after `delay` seconds unless an earlier trigger comes first."""
        loop = asyncio.get_running_loop()
        timer = self._timers.get(key)
        if timer is not None and timer.when() <= loop.time() + delay:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def forget(self, key: Key) -> None:
        self.known.discard(key)
        self._failures.pop(key, None)
        self._deferred.discard(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _failed(self, key: Key) -> int:
        """Count one more failed pass of `key` in a row; the count."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        return failures

    @staticmethod
    def failure_backoff(failures: int) -> float:
        """Seconds before retrying a key whose last `failures` passes raised."""
        return min(FAILURE_BACKOFF_MAX_SECONDS, FAILURE_BACKOFF_SECONDS * 2.0 ** (failures - 1))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"reconcile-{i}") for i in range(self._workers)]
        self._publish_depth()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._publish_depth()
        for timer in self._timers.values():
            timer.cancel()

    def _publish_depth(self) -> None:
        """The fleets waiting for a worker; 0 while none runs. A standby (--leader-elect) queues
        every fleet its watches report and starts its workers only once it leads (handlers.act):
        its depth would be the number of fleets, waiting for nothing that is late."""
        metrics.QUEUE_DEPTH.set(len(self._queued) if self._tasks else 0)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._publish_depth()
            self._running.add(key)
            delay: float | None = None
            try:
                done = await self._work(key)
                if done.failed:
                    delay = self.failure_backoff(self._failed(key))
                else:
                    self._failures.pop(key, None)
                    delay = done.requeue_after
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one fleet's failure must not stop the others
                failures = self._failed(key)
                delay = self.failure_backoff(failures)
                log.exception("reconcile of %s/%s failed (%d in a row); retrying in %.0fs", *key, failures, delay)
            finally:
                self._running.discard(key)
            deferred = key in self._deferred
            self._deferred.discard(key)
            if key in self._dirty or (deferred and key not in self._failures):
                self._dirty.discard(key)
                self.add(key)
            elif delay is not None and key in self.known:
                self.add_after(key, delay)
