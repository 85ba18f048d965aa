"""The work queue's contract: one pass per key at a time, and a growing back-off for a key whose
passes keep failing, by raising or by ending with errors (so an apiserver that refuses the fleet's
writes is not hammered, and a fleet degraded for another reason is not slowed)."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from hybridserving.controller.queue import (
    FAILURE_BACKOFF_MAX_SECONDS,
    FAILURE_BACKOFF_SECONDS,
    Key,
    Pass,
    WorkQueue,
)


def test_a_key_whose_passes_keep_failing_is_retried_ever_later_and_a_success_resets_it() -> None:
    # A pass that raises (its status write refused) and one that ends with errors in status (a
    # create refused) are failures alike; the requeue a failed pass asks for does not shorten it.
    outcomes = iter(["raise", "errors", "raise", "ok", "errors"])
    retries: list[float] = []

    async def work(key: Key) -> Pass:
        outcome = next(outcomes, "done")
        if outcome == "done":
            return Pass(None)  # nothing more to retry
        if outcome == "raise":
            raise RuntimeError("the apiserver refused the status write")
        return Pass(1.0, failed=outcome == "errors")

    async def scenario() -> None:
        queue = WorkQueue(work, workers=1)
        queue.add_after = lambda key, delay: (retries.append(delay), queue.add(key))  # type: ignore[method-assign]
        queue.start()
        queue.add(("ns", "fleet"))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(retries) == 5:
                break
        await queue.stop()

    asyncio.run(scenario())
    assert retries == [FAILURE_BACKOFF_SECONDS, 2 * FAILURE_BACKOFF_SECONDS, 4 * FAILURE_BACKOFF_SECONDS,
                       1.0, FAILURE_BACKOFF_SECONDS], "doubling while failing; a pass that returns resets it"
    assert WorkQueue.failure_backoff(30) == FAILURE_BACKOFF_MAX_SECONDS


def test_the_depth_counts_only_fleets_waiting_for_a_worker_that_runs() -> None:
    """A standby queues every fleet its watches report and starts its workers only once it leads:
    its depth said all its fleets were waiting, for as long as it stood by."""
    passes: list[Key] = []
    may_end = asyncio.Event()

    async def work(key: Key) -> Pass:
        passes.append(key)
        await may_end.wait()
        return Pass(None)

    def depth() -> float | None:
        return REGISTRY.get_sample_value("hybridserving_queue_depth")

    async def scenario() -> None:
        queue = WorkQueue(work, workers=1)
        for name in ("a", "b", "c"):
            queue.add(("ns", name))
        assert depth() == 0, "standing by: nothing waits for a worker"
        queue.start()
        await asyncio.sleep(0.01)
        assert passes == [("ns", "a")] and depth() == 2
        await queue.stop()
        assert depth() == 0

    asyncio.run(scenario())
