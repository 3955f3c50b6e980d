"""Ray actors for the distributed tests: a call counter (the runtime's view) and workers.

A worker drives rollouts the way the rollout client does, through the two protocols only:
a session slot, an invocation token, the rollout, a stop-call token (low priority), the
slot back. Imported by Ray's worker processes (the test puts the repository on their
PYTHONPATH), so it holds no test functions.
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import ray

from agentcore_rl.client.bucket import Priority
from agentcore_rl.distributed import shared_limits


@ray.remote(num_cpus=0)
class CallCounter:
    """What the runtime would see: call times and live sessions."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.live = 0
        self.max_live = 0

    def call(self, at: float) -> None:
        self.calls.append(at)

    def opened(self) -> None:
        self.live += 1
        self.max_live = max(self.max_live, self.live)

    def closed(self) -> None:
        self.live -= 1

    def report(self) -> dict[str, Any]:
        return {"calls": list(self.calls), "live": self.live, "max_live": self.max_live}


@ray.remote(num_cpus=0)
class Worker:
    """One trainer process with its own view of the shared limits."""

    def __init__(self) -> None:
        self.started = 0

    def progress(self) -> int:
        return self.started

    async def run(
        self,
        name: str,
        settings: dict[str, Any],
        counter: Any,
        rollouts: int,
        hold: tuple[float, float],
        seed: int,
    ) -> dict[str, Any]:
        rng = random.Random(seed)
        done = 0

        async def rollout(limits: Any) -> None:
            nonlocal done
            await limits.sessions.acquire()
            try:
                await limits.rate.acquire(Priority.INVOKE)
                # Stamped here: CLOCK_MONOTONIC is one clock for every process on a host.
                await counter.call.remote(time.monotonic())
                await counter.opened.remote()
                self.started += 1
                await anyio.sleep(rng.uniform(*hold))
                await limits.rate.acquire(Priority.STOP)
                await counter.call.remote(time.monotonic())
                # Acknowledged before the slot goes back, so no other worker's session can
                # be counted as opened before this one is counted as closed.
                await counter.closed.remote()
            finally:
                limits.sessions.release()
            done += 1

        async with shared_limits(name, **settings) as limits:
            async with anyio.create_task_group() as tg:
                for _ in range(rollouts):
                    tg.start_soon(rollout, limits)
            return {
                "done": done,
                "actor_calls": limits.actor_calls,
                "rate": dict(limits.rate.stats),
                "sessions": dict(limits.sessions.stats),
            }
