"""A session's life at the gateway: opened, finished (or expired), and closed for good to the
agent's calls after that; only the trainer opens a finished id again."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.types import Receive, Scope, Send

from agentcore_rl.gateway import GatewayOptions, RolloutGateway, TraceLostError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from tests.gateway.helpers import ADMIN, Latch, chat, served, wait_until

QUESTION: Any = [{"role": "user", "content": "What is 2 + 2?"}]
# One agent dialect a line: (its route under /sessions/{sid}/, a request body of it).
DIALECTS = [
    pytest.param("v1/chat/completions", {"model": "m", "messages": QUESTION}, id="chat"),
    pytest.param("v1/completions", {"model": "m", "prompt": "2 + 2 ="}, id="completions"),
]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("route", "body"), DIALECTS)
async def test_a_call_for_a_finished_session_is_refused_and_opens_nothing(
    route: str, body: dict[str, Any]
) -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        gateway = stack.gateway
        assert (await http.post(f"/sessions/f1/{route}", json=body)).status_code == 200
        assert len((await gateway.finish_session("f1")).records) == 1
        late = await http.post(f"/sessions/f1/{route}", json=body)
        assert late.status_code == 410, late.text
        assert "finished" in late.text
        stats = gateway.stats
        assert (stats["live_sessions"], stats["late_calls"], stats["calls"]) == (0, 1, 1)
        assert stack.policy.requests == 1  # the late call never reached the policy
        # A second finish is a lost trace (410), not the late call's records.
        again = await http.post("/admin/sessions/f1/finish", headers={"x-admin-token": ADMIN})
        assert again.status_code == 410
        assert "ended already" in again.json()["error"]["message"]
        with pytest.raises(TraceLostError, match="ended already"):
            await gateway.finish_session("f1")
        assert (await http.get("/admin/stats", headers={"x-admin-token": ADMIN})).json()[
            "late_calls"
        ] == 1


async def test_the_trainer_may_open_a_finished_id_again_with_a_fresh_record_set() -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        gateway = stack.gateway
        gateway.open_session("r1", exp_id="e", input_id="first")
        async with stack.llm("r1") as llm:
            await chat(llm, QUESTION, stream=False)
            await gateway.finish_session("r1")
            opened = await http.post(
                "/admin/sessions",
                json={"session_id": "r1", "exp_id": "e", "input_id": "second"},
                headers={"x-admin-token": ADMIN},
            )
            assert opened.status_code == 204
            await chat(llm, QUESTION, stream=True)
        trace = await gateway.finish_session("r1")
    assert (trace.input_id, [r.stream for r in trace.records]) == ("second", [True])
    assert [r.index for r in trace.records] == [0]


async def test_expired_sessions_are_closed_and_ended_ids_are_forgotten_after_the_ttl() -> None:
    clock = _Clock()
    async with served(options=GatewayOptions(session_ttl=60.0), clock=clock) as stack:
        gateway = stack.gateway
        async with stack.llm("x1") as llm, stack.llm("x2") as llm2:
            await chat(llm, QUESTION, stream=False)
            clock.now += 61
            assert await gateway.expire_idle() == 1
            with pytest.raises(Exception, match="finished") as refused:
                await chat(llm, QUESTION, stream=False)  # expired: closed like a finished one
            assert getattr(refused.value, "status_code", None) == 410
            await chat(llm2, QUESTION, stream=False)
            await gateway.finish_session("x2")
            clock.now += 61  # x1 ended 122 s ago, x2 61 s ago: both forgotten
            assert await gateway.expire_idle() == 0
            await chat(llm, QUESTION, stream=False)  # a new session by that id, as at first
        assert gateway.stats["live_sessions"] == 1
        assert gateway.stats["late_calls"] == 1


class _BodiesSeen:
    """The gateway behind a counter of requests whose whole body it has read (after which
    a call reaches the policy gate without yielding)."""

    def __init__(self, gateway: RolloutGateway) -> None:
        self.gateway = gateway
        self.bodies = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Any:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body"):
                self.bodies += 1
            return message

        await self.gateway(scope, counted if scope["type"] == "http" else receive, send)


@contextlib.asynccontextmanager
async def _watched(**options: Any) -> AsyncIterator[tuple[ScriptedPolicy, _BodiesSeen, str]]:
    serving = {"serving": Serving(token_ids="requested")}
    policy = ScriptedPolicy(accuracy=1.0, **(serving | options.pop("policy", {})))
    async with BackgroundServer(policy) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1", admin_token=ADMIN, **options)
        front = _BodiesSeen(gateway)
        async with BackgroundServer(front) as server:
            yield policy, front, server.url


async def test_a_call_held_across_its_sessions_finish_leaves_no_session() -> None:
    async with (
        _watched() as (policy, front, url),
        httpx.AsyncClient(base_url=url) as http,
        anyio.create_task_group() as tg,
    ):
        gateway = front.gateway
        gateway.open_session("h1")
        answers: list[httpx.Response] = []

        async def agent() -> None:
            body = {"model": "m", "messages": QUESTION}
            answers.append(await http.post("/sessions/h1/v1/chat/completions", json=body))

        async with gateway.paused("hold"):
            tg.start_soon(agent)
            await wait_until(lambda: front.bodies == 1)  # read: held at the gate
            assert (await gateway.finish_session("h1")).records == []
        await wait_until(lambda: len(answers) == 1)
        assert answers[0].status_code == 410
        assert (gateway.stats["live_sessions"], gateway.stats["late_calls"]) == (0, 1)
        assert policy.requests == 0


async def test_a_call_that_outlives_finish_wait_leaves_no_session() -> None:
    latch = Latch()
    async with (
        _watched(
            options=GatewayOptions(finish_wait=0.0),
            policy={"serving": Serving(token_ids="requested", latency=1.0), "sleep": latch.sleep},
        ) as (
            policy,
            front,
            url,
        ),
        httpx.AsyncClient(base_url=url) as http,
        anyio.create_task_group() as tg,
    ):
        gateway = front.gateway
        answers: list[httpx.Response] = []

        async def agent() -> None:
            body = {"model": "m", "messages": QUESTION}
            answers.append(await http.post("/sessions/w1/v1/chat/completions", json=body))

        tg.start_soon(agent)
        await wait_until(lambda: latch.waiting == 1)  # upstream
        trace = await gateway.finish_session("w1")  # does not wait: its record is missing
        assert (trace.records, gateway.stats["live_sessions"]) == ([], 0)
        latch.release()
        await wait_until(lambda: len(answers) == 1)
        assert answers[0].status_code == 200  # admitted before the finish: served
        await wait_until(lambda: gateway.gate.in_flight == 0)
        assert gateway.stats["live_sessions"] == 0
        again = await http.post(
            "/sessions/w1/v1/chat/completions", json={"model": "m", "messages": QUESTION}
        )
        assert again.status_code == 410
        assert policy.requests == 1
