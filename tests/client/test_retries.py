"""Retries reuse the session id; throttling slows the token bucket. A small Starlette app
in front of the real agent server fails chosen attempts and records the session ids."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentcore_rl.client import Limits, Retries, RetryPolicy, TokenBucket
from agentcore_rl.errors import InvocationError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.protocol import INVOCATIONS_PATH, SESSION_ID_HEADER
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, quick_retries


@dataclass
class FlakyProxy:
    """Answers the first ``len(failures)`` invocations with those statuses, then forwards."""

    upstream: str
    failures: list[int] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    lose_answers: int = 0  # forward, then answer 502 as if the answer were lost
    retry_after: str | None = None  # sent with the injected failures
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self, http: httpx.AsyncClient) -> Starlette:

        async def invocations(request: Request) -> Response:
            self.seen.append(request.headers[SESSION_ID_HEADER])
            if self.failures:
                status = self.failures.pop(0)
                headers = None if self.retry_after is None else {"Retry-After": self.retry_after}
                return JSONResponse(
                    {"error": f"injected {status}"}, status_code=status, headers=headers
                )
            self.bodies.append(json.loads(await request.body()))
            upstream = await http.post(
                INVOCATIONS_PATH, content=await request.body(), headers=dict(request.headers)
            )
            if self.lose_answers:
                self.lose_answers -= 1
                return JSONResponse({"error": "answer lost"}, status_code=502)
            return Response(upstream.content, upstream.status_code, upstream.headers)

        return Starlette(routes=[Route(INVOCATIONS_PATH, invocations, methods=["POST"])])


@pytest.fixture
async def proxy(agent_url: str) -> AsyncIterator[tuple[FlakyProxy, str]]:
    flaky = FlakyProxy(agent_url)
    async with (
        httpx.AsyncClient(base_url=agent_url) as http,
        BackgroundServer(flaky.app(http)) as server,
    ):
        yield flaky, server.url


async def test_retry_after_503_reuses_the_session_id(
    make_client: ClientFactory, proxy: tuple[FlakyProxy, str], recorder: Recorder
) -> None:
    flaky, url = proxy
    flaky.failures = [503, 502]
    client = make_client(agent_url=url)
    fut = await client.invoke({"n": 1})
    assert flaky.seen == [fut.session_id] * 3
    assert (await asyncio.wait_for(fut, 10))["n"] == 1
    assert recorder.sessions == [fut.session_id]  # one rollout
    assert (client.stats.invocations, client.stats.retries) == (3, 2)


async def test_throttling_slows_the_bucket_and_backs_off(
    make_client: ClientFactory, proxy: tuple[FlakyProxy, str]
) -> None:
    flaky, url = proxy
    flaky.failures = [429, 429]
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    retry = RetryPolicy(attempts=4, initial=0.5, maximum=10.0, jitter=0.0, sleep=record)
    client = make_client(agent_url=url, retries=Retries(call=retry), limits=Limits(tps=100.0))
    fut = await client.invoke({"n": 2})
    assert len(set(flaky.seen)) == 1
    assert client.stats.throttles == 2
    assert isinstance(client.rate_limiter, TokenBucket)
    assert client.rate_limiter.rate < 100.0  # cut, recovering over time
    assert delays == sorted(delays)
    assert delays[0] > 0
    assert len(delays) == 2
    await asyncio.wait_for(fut, 10)


async def test_retries_are_bounded(
    make_client: ClientFactory, proxy: tuple[FlakyProxy, str], recorder: Recorder
) -> None:
    flaky, url = proxy
    flaky.failures = [500] * 10
    client = make_client(agent_url=url, retries=quick_retries(rollouts=0))
    with pytest.raises(InvocationError, match=r"after 3 attempts.*injected 500") as info:
        await client.invoke({"n": 1})
    assert info.value.status_code == 500
    assert len(flaky.seen) == 3
    assert recorder.sessions == []


async def test_an_invocation_never_accepted_counts_its_sessions(
    make_client: ClientFactory, proxy: tuple[FlakyProxy, str]
) -> None:
    """Refused in three sessions: the error says so (eval's results line copies it), and the
    summary's short reason keeps the cause rather than the session id."""
    from agentcore_rl.cli.summary import _short

    flaky, url = proxy
    flaky.failures = [500] * 9
    client = make_client(agent_url=url, retries=quick_retries(rollouts=2))
    with pytest.raises(InvocationError) as info:
        await client.invoke({"n": 1})
    assert getattr(info.value, "attempts", None) == 3
    assert len(flaky.seen) == 9
    short = _short(str(info.value))
    assert "injected 500" in short, short
    assert str(info.value.session_id) not in short


async def test_a_retry_after_a_lost_answer_is_marked_repeat_and_runs_once(
    make_client: ClientFactory, proxy: tuple[FlakyProxy, str], recorder: Recorder
) -> None:
    # The agent ran the first invocation; its answer was lost. The retry
    # carries _rollout.repeat, so the agent answers it without running the handler again.
    flaky, url = proxy
    flaky.lose_answers = 1
    client = make_client(agent_url=url)
    fut = await client.invoke({"n": 5})
    assert (await asyncio.wait_for(fut, 10))["n"] == 5
    assert [body["_rollout"].get("repeat") for body in flaky.bodies] == [None, True]
    assert recorder.sessions == [fut.session_id]  # the handler ran once


async def test_new_sessions_avoid_a_dead_url(
    make_client: ClientFactory, agent_url: str, recorder: Recorder
) -> None:
    # One of two URLs dead. The first session sent there fails over to a
    # new session; later sessions are not pinned to the dead URL while it cools down.
    dead = "http://127.0.0.1:9"
    client = make_client(agent_url=[dead, agent_url], retries=quick_retries(rollouts=1))
    futures = [await client.invoke({"n": n}) for n in range(20)]
    results = await asyncio.wait_for(asyncio.gather(*futures), 20)
    assert [r["n"] for r in results] == list(range(20))
    assert client.stats.invocation_errors == 0
    assert client.stats.rollout_retries <= 1
    assert len(recorder.sessions) == 20


async def test_overloaded_agent_is_a_pause_not_a_failure(
    make_client: ClientFactory, proxy: tuple[FlakyProxy, str], recorder: Recorder
) -> None:
    # More 503s with Retry-After than the retry policy has attempts (3): each is waited
    # out and sent again in the same session; the rollout is not failed nor re-run.
    flaky, url = proxy
    flaky.failures = [503] * 7
    flaky.retry_after = "0"
    client = make_client(agent_url=url, retries=quick_retries(rollouts=0))
    result = await asyncio.wait_for(client.rollout({"n": 4}), 20)
    assert result["n"] == 4
    assert len(set(flaky.seen)) == 1
    stats = client.stats
    assert (stats.throttles, stats.rollout_retries, stats.invocation_errors) == (7, 0, 0)
    assert recorder.sessions == [flaky.seen[0]]
