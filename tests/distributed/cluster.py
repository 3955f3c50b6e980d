"""What the Ray tests run: the stack (S3, agents, one local AgentCore Runtime) in the
test's event loop, and trainer workers as Ray actors, each with its own rollout client.

Imported by Ray's worker processes (the test puts the repository on their PYTHONPATH),
so it holds no test functions.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import ray
from starlette.types import Receive, Scope, Send

from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Timeouts, WatcherConfig
from agentcore_rl.distributed import shared_limits
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.options import ShutdownConfig

ARN = DEFAULT_AGENT_RUNTIME_ARN
FAST_WATCH = WatcherConfig(min_interval=0.05, max_interval=0.2)


@dataclass
class Agents:
    """What the agents saw: rollouts running at once (sessions the runtime holds for a
    running rollout), at most."""

    running: int = 0
    max_running: int = 0


@dataclass
class Stack:
    """The runtime's side: its URL and its own counters; call arrival times."""

    runtime: LocalAgentCoreRuntime
    url: str
    s3: str
    bucket: str
    agents: Agents
    arrivals: list[float] = field(default_factory=list)

    def endpoint(self) -> dict[str, str]:
        return {"endpoint_url": self.url, "s3_endpoint_url": self.s3, "s3_bucket": self.bucket}


class _Arrivals:
    """An ASGI wrapper noting when each call reaches the runtime."""

    def __init__(self, app: LocalAgentCoreRuntime, times: list[float]) -> None:
        self.app, self.times = app, times

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.times.append(time.monotonic())
        await self.app(scope, receive, send)


@asynccontextmanager
async def serve_stack(s3: str, bucket: str, tps: float) -> AsyncIterator[Stack]:
    """Two sleeping agents behind one local runtime that answers 429 beyond ``tps``."""
    agents = Agents()
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(ResultStore(endpoint_url=s3))
        urls = []
        for _ in range(2):
            app = AgentCoreRLApp(
                store=store, shutdown=ShutdownConfig(grace=0.0, cancel_timeout=1.0)
            )

            @app.rollout_entrypoint
            async def sleeper(payload: dict[str, Any]) -> dict[str, Any]:
                agents.running += 1
                agents.max_running = max(agents.max_running, agents.running)
                try:
                    await asyncio.sleep(float(payload["sleep"]))
                finally:
                    agents.running -= 1
                return {"rewards": [1.0]}

            server = await stack.enter_async_context(BackgroundServer(app))
            urls.append(server.url)
        runtime = LocalAgentCoreRuntime({ARN: urls}, tps=tps)
        arrivals: list[float] = []
        server = await stack.enter_async_context(BackgroundServer(_Arrivals(runtime, arrivals)))
        yield Stack(runtime, server.url, s3, bucket, agents, arrivals)


@ray.remote(num_cpus=0)
class Worker:
    """One trainer process: its own client on the shared limits."""

    def __init__(self) -> None:
        self.client: AsyncRolloutClient | None = None

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> int:
        return 0 if self.client is None else self.client.stats.invocations

    async def run(
        self, name: str, settings: dict[str, Any], endpoint: dict[str, str], sleeps: list[float]
    ) -> dict[str, Any]:
        ok = 0
        async with shared_limits(name, **settings) as limits:
            async with AsyncRolloutClient(
                agent_runtime_arn=ARN,
                exp_id=f"{name}-{id(self)}",
                rate_limiter=limits.rate,
                session_limiter=limits.sessions,
                watcher=FAST_WATCH,
                timeouts=Timeouts(close=30.0),
                aws=AwsConfig(
                    endpoint_url=endpoint["endpoint_url"],
                    s3_endpoint_url=endpoint["s3_endpoint_url"],
                ),
                s3_bucket=endpoint["s3_bucket"],
            ) as client:
                self.client = client
                async for item in client.run_batch([{"sleep": s} for s in sleeps]):
                    ok += item.success
            return {
                "ok": ok,
                "throttles": client.stats.throttles,
                "invocations": client.stats.invocations,
                "stops": client.stats.stops,
                "actor_calls": limits.actor_calls,
            }
