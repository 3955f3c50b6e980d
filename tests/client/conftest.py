"""Fixtures for client tests: a real agent server on loopback (uvicorn) writing to moto."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentcore_rl.client import (
    AsyncRolloutClient,
    Limits,
    Retries,
    RetryPolicy,
    Timeouts,
    WatcherConfig,
)
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import SpoolConfig
from tests.client.agents import Recorder, make_agent
from tests.conftest import FAST_RETRY


async def no_sleep(_: float) -> None:
    """Retries go round at once in tests."""


#: Quick polling and quick retries: tests check behaviour, not pacing.
FAST_WATCH = WatcherConfig(min_interval=0.01, max_interval=0.05, error_backoff=0.01)
QUICK_RETRY = RetryPolicy(attempts=3, initial=0.0, maximum=0.0, jitter=0.0, sleep=no_sleep)


def fast_limits(**options: Any) -> Limits:
    """Limits for tests: a token bucket nobody waits on, unless a test says otherwise."""
    return Limits(**{"tps": 1000.0, **options})


def quick_retries(**options: Any) -> Retries:
    """Retries for tests: each call retried at once, unless a test says otherwise."""
    return Retries(**{"call": QUICK_RETRY, **options})


def short_timeouts(**options: Any) -> Timeouts:
    """Timeouts for tests: closing gives up on stop calls after 5 s."""
    return Timeouts(**{"close": 5.0, **options})


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def agent_url(s3_endpoint: str, recorder: Recorder, tmp_path: Path) -> AsyncIterator[str]:
    """A real agent server (AgentCoreRLApp under uvicorn) on a loopback port."""
    agent_store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    await agent_store.__aenter__()  # connect now: the first result is not written late
    app = make_agent(agent_store, recorder, spool=SpoolConfig(directory=tmp_path / "spool"))
    async with BackgroundServer(app) as server:
        yield server.url
    await agent_store.aclose()


ClientFactory = Callable[..., AsyncRolloutClient]


@pytest.fixture
async def make_client(
    agent_url: str, bucket: str, store: ResultStore
) -> AsyncIterator[ClientFactory]:
    """Build clients on the test agent and bucket; all are closed after the test. They
    share the test's (already connected) ResultStore, so the first poll is not late."""
    clients: list[AsyncRolloutClient] = []

    def factory(**options: Any) -> AsyncRolloutClient:
        settings: dict[str, Any] = {
            "agent_url": agent_url,
            "s3_bucket": bucket,
            "exp_id": "exp",
            "limits": fast_limits(),
            "store": store,
            "watcher": FAST_WATCH,
            "retries": quick_retries(),
            "timeouts": short_timeouts(),
        }
        settings.update(options)
        client = AsyncRolloutClient(**settings)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()
