"""A virtual clock for tests: ``sleep`` waits until the test advances time."""

from __future__ import annotations

import asyncio


class FakeClock:
    """Monotonic time that moves only when told; ``sleep`` parks until then."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        if delay <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + delay, fut))
        await fut

    def advance(self, seconds: float) -> None:
        self.now += seconds
        still = []
        for deadline, fut in self._sleepers:
            if deadline <= self.now + 1e-9:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((deadline, fut))
        self._sleepers = still


async def settle(rounds: int = 20) -> None:
    """Let every ready task run (a bounded number of loop iterations, no waiting)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
