"""The role-switch loop (controller/switching.py `run`): each fleet ticks on its own, so a fleet whose
API calls hang or whose ticks fail never holds the others back."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from hybridserving.controller import switching
from hybridserving.controller.kube import KubeError
from hybridserving.controller.switching import TickReport
from hybridserving.core.liveness import FailingPasses

INTERVAL = 0.02


class Ticks:
    """A SwitchController stand-in: counts ticks; one fleet hangs, one fails, the rest are healthy."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.release = threading.Event()
        self.forgotten: list[str] = []

    def tick(self, namespace: str, name: str) -> TickReport:
        self.count[name] += 1
        if name == "hanging":
            self.release.wait(10)  # an apiserver or engine that does not answer
        if name == "failing":
            raise KubeError(500, "injected")
        return TickReport()

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten.append(name)


def run_for(ticks: Ticks, fleets: list[str], seconds: float,
            failing: dict[tuple[str, str], FailingPasses] | None = None) -> None:
    async def scenario() -> None:
        loop = asyncio.create_task(switching.run(
            None,  # type: ignore[arg-type]
            lambda: [("ns", f) for f in fleets], interval=INTERVAL, controller=ticks,  # type: ignore[arg-type]
            failing=failing))
        await asyncio.sleep(seconds)
        ticks.release.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(scenario())


def test_a_hanging_fleet_and_a_failing_one_do_not_stall_the_others() -> None:
    ticks = Ticks()
    run_for(ticks, ["hanging", "failing", "healthy", "also-healthy"], seconds=1.0)
    assert ticks.count["hanging"] == 1
    # About 50 intervals passed: the healthy fleets kept their pace.
    assert ticks.count["healthy"] >= 10 and ticks.count["also-healthy"] >= 10, ticks.count
    # The failing one retried, backing off (2, 4, 8 … intervals): far fewer ticks.
    assert 2 <= ticks.count["failing"] <= 8, ticks.count


def test_a_fleet_that_leaves_stops_ticking_and_is_forgotten() -> None:
    ticks = Ticks()
    fleets = ["a", "b"]

    async def scenario() -> None:
        loop = asyncio.create_task(switching.run(
            None,  # type: ignore[arg-type]
            lambda: [("ns", f) for f in fleets], interval=INTERVAL, controller=ticks))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        fleets.remove("b")
        await asyncio.sleep(0.1)
        left = ticks.count["b"]
        await asyncio.sleep(0.3)
        assert ticks.count["b"] == left and ticks.count["a"] > left
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(scenario())
    assert ticks.forgotten == ["b"]


def test_the_fleets_whose_ticks_are_failing_are_kept_for_status_until_a_tick_succeeds_or_they_leave() -> None:
    ticks = Ticks()
    failing: dict[tuple[str, str], FailingPasses] = {("ns", "recovered"): FailingPasses(0.0, 9, "old")}
    run_for(ticks, ["failing", "healthy", "recovered"], seconds=0.5, failing=failing)
    assert set(failing) == {("ns", "failing")}, "a tick that succeeds ends its fleet's streak"
    streak = failing[("ns", "failing")]
    assert streak.work == "role-switch tick" and streak.passes == ticks.count["failing"] >= 2
    assert streak.error == "500: injected"
    fleets = ["failing"]

    async def leave() -> None:
        loop = asyncio.create_task(switching.run(
            None, lambda: [("ns", f) for f in fleets], interval=INTERVAL,  # type: ignore[arg-type]
            controller=Ticks(), failing=failing))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        fleets.clear()
        await asyncio.sleep(0.1)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(leave())
    assert ("ns", "failing") not in failing, "a fleet that left is forgotten"
