"""Weight-sync pauses: held calls, drained in-flight calls, 429 in reject mode, admin routes."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from agentcore_rl.gateway import GatewayOptions
from agentcore_rl.gateway.upstream import UpstreamError
from agentcore_rl.local.policy import ScriptedPolicy, Serving, TemplateVoice
from agentcore_rl.trajectory import build_trajectory
from tests.gateway.helpers import ADMIN, Latch, chat, served, wait_until
from tests.gateway.template_rig import RENDER_MISSING, tokenizer_dir

QUESTION: Any = [{"role": "user", "content": "What is 2 + 2?"}]


async def _ask(llm: Any, stream: bool) -> None:
    await chat(llm, QUESTION, stream=stream)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_pause_drains_in_flight_calls_holds_new_ones_then_resumes(stream: bool) -> None:
    latch = Latch()
    policy = ScriptedPolicy(
        accuracy=1.0,
        serving=Serving(token_ids="requested", latency=1.0, keep_answers=10),
        sleep=latch.sleep,
    )
    async with served(policy) as stack, anyio.create_task_group() as tg:
        gateway = stack.gateway
        llm = stack.llm("p1")
        llm2 = stack.llm("p2")
        tg.start_soon(_ask, llm, stream)  # in flight: the policy holds it
        await wait_until(lambda: latch.waiting == 1)

        inside = anyio.Event()
        leave = anyio.Event()

        async def trainer() -> None:
            async with gateway.paused():
                assert gateway.gate.in_flight == 0
                gateway.set_policy_version(2)
                inside.set()
                await leave.wait()

        tg.start_soon(trainer)
        await wait_until(lambda: gateway.gate.paused == "hold")
        assert not inside.is_set()  # the in-flight call has not drained yet
        tg.start_soon(_ask, llm2, stream)  # held at the gateway
        latch.release()
        with anyio.fail_after(5):
            await inside.wait()
        assert policy.requests == 1  # the held call never reached the policy
        leave.set()
        await wait_until(lambda: policy.requests == 2)
        await wait_until(lambda: gateway.gate.in_flight == 0)
        first = await gateway.finish_session("p1")
        second = await gateway.finish_session("p2")
    # closed once the task group has seen both agents through: the gateway counts a call out
    # when it has sent the answer, which can be before the agent has read it
    await llm.close()
    await llm2.close()
    assert [(r.policy_version_start, r.policy_version_end) for r in first.records] == [(0, 0)]
    assert [(r.policy_version_start, r.policy_version_end) for r in second.records] == [(2, 2)]


async def test_reject_mode_answers_429_with_retry_after() -> None:
    async with (
        served(options=GatewayOptions(retry_after=3.0)) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        body = {"model": "m", "messages": QUESTION}
        async with stack.gateway.paused("reject"):
            refused = await http.post("/sessions/r1/v1/chat/completions", json=body)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        assert "paused" in refused.json()["error"]["message"]
        ok = await http.post("/sessions/r1/v1/chat/completions", json=body)
        assert ok.status_code == 200


async def test_admin_routes_need_the_token_and_drive_versions_and_pauses() -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        auth = {"authorization": f"Bearer {ADMIN}"}
        assert (await http.post("/admin/policy_version", json={"version": 4})).status_code == 401
        wrong = await http.post("/admin/pause", json={}, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        # a session id in the bearer slot is not an admin token
        as_session = await http.get("/admin/stats", headers={"authorization": "Bearer sess-1"})
        assert as_session.status_code == 401

        set_version = await http.post("/admin/policy_version", json={"version": 4}, headers=auth)
        assert set_version.json() == {"policy_version": 4}
        assert (await http.post("/admin/pause", json={"mode": "reject"}, headers=auth)).json()[
            "paused"
        ] == "reject"
        assert (await http.post("/admin/pause", json={}, headers=auth)).status_code == 409
        body = {"model": "m", "messages": QUESTION}
        held = await http.post("/sessions/a1/v1/chat/completions", json=body)
        assert held.status_code == 429
        await http.post("/admin/resume", headers=auth)
        opened = await http.post(
            "/admin/sessions",
            json={"session_id": "a1", "exp_id": "e", "input_id": "i"},
            headers={"x-admin-token": ADMIN},
        )
        assert opened.status_code == 204
        assert (await http.post("/sessions/a1/v1/chat/completions", json=body)).status_code == 200
        in_url = await http.get(f"/admin/sessions/a1/trace?token={ADMIN}")
        assert (in_url.status_code, in_url.json()["error"]["type"]) == (400, "token_in_url")
        peek = await http.get("/admin/sessions/a1/trace", headers={"x-admin-token": ADMIN})
        assert [r["policy_version_start"] for r in peek.json()["records"]] == [4]
        finished = await http.post("/admin/sessions/a1/finish?format=json", headers=auth)
        assert finished.json()["input_id"] == "i"
        again = await http.post("/admin/sessions/a1/finish", headers=auth)
        assert again.status_code == 410
        assert again.json()["error"]["type"] == "trace_lost"
        stats = await http.get("/admin/stats", headers=auth)
        assert stats.json()["calls"] == 1  # a refused (429) call is no model call


class _BrokenSink:
    """A trace sink with a bug: whatever it raises is the gateway's fault, not the trainer's."""

    async def save(self, trace: Any) -> None:
        raise ValueError("a bug in the sink")

    async def load(self, session_id: str) -> Any:
        raise RuntimeError("a bug in the sink")


async def test_admin_errors_answer_by_meaning_and_a_handler_bug_is_a_500() -> None:
    async with (
        served(sink=_BrokenSink()) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        auth = {"x-admin-token": ADMIN}
        # A ValueError or RuntimeError from inside is neither the trainer's 400 nor a 409.
        bug = await http.post("/admin/sessions/never-seen/finish", headers=auth)
        assert (bug.status_code, bug.json()["error"]["type"]) == (500, "internal")
        bad = await http.post("/admin/policy_version", json={"version": "4"}, headers=auth)
        assert (bad.status_code, bad.json()["error"]["type"]) == (400, "invalid_request")
        mode = await http.post("/admin/pause", json={"mode": "nap"}, headers=auth)
        assert mode.status_code == 400
        in_url = await http.get(f"/admin/stats?token={ADMIN}")
        assert in_url.status_code == 400


async def test_admin_routes_are_off_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTCORE_RL_GATEWAY_ADMIN_TOKEN", raising=False)
    async with served(admin_token=None) as stack, httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.get("/admin/stats")
        assert response.status_code == 403
        assert "admin token" in response.json()["error"]["message"]
        assert (await http.get("/health")).json()["status"] == "ok"


class Ticks:
    """An injectable ``sleep`` for a paced stand-in: each wake-up waits for a tick the test
    hands out (``release(n)``, or ``run()`` for all from then on)."""

    def __init__(self) -> None:
        self.taken = 0
        self._free = anyio.Semaphore(0)
        self._running = False

    async def sleep(self, _: float) -> None:
        if not self._running:
            await self._free.acquire()
        self.taken += 1

    def release(self, n: int) -> None:
        for _ in range(n):
            self._free.release()

    def run(self) -> None:
        self._running = True
        self.release(1000)


@pytest.mark.skipif(RENDER_MISSING is not None, reason=RENDER_MISSING or "")
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_suspend_returns_at_once_and_the_generation_goes_on_with_two_versions(
    stream: bool,
) -> None:
    from agentcore_rl.gateway.render.mode import RenderMode

    directory = str(tokenizer_dir("qwen2.5"))
    ticks = Ticks()
    # 20 tokens a second: one token per wake-up, so each tick is one token.
    policy = ScriptedPolicy(
        TemplateVoice(directory),
        serving=Serving(token_ids="requested", token_rate=20.0),
        sleep=ticks.sleep,
    )
    render = RenderMode.load(directory)
    async with served(policy, render=render) as stack, anyio.create_task_group() as tg:
        gateway = stack.gateway
        llm = stack.llm("s1")
        got: list[Any] = []

        async def agent() -> None:
            reply = await chat(
                llm, QUESTION, stream=stream, max_tokens=60, extra_body={"min_tokens": 40}
            )
            got.append(reply)

        tg.start_soon(agent)
        ticks.release(7)
        await wait_until(lambda: ticks.taken == 7)
        async with gateway.paused("suspend"):  # entered while the call runs
            assert gateway.gate.in_flight == 1
            gateway.set_policy_version(5)
            assert policy.weight_version == "0"
        assert policy.weight_version.startswith("5-")  # told before the upstream resumed
        ticks.run()
        await wait_until(lambda: bool(got))
        await llm.close()
        trace = await gateway.finish_session("s1")
    (record,) = trace.records
    assert record.ok, record.error
    assert (record.policy_version_start, record.policy_version_end) == (0, 5)
    (completion,) = record.completions
    assert len(completion.token_ids) == 41  # min_tokens, then the end token
    assert completion.versions == [(0, 0), (7, 5)]  # seven tokens before the pause
    assert gateway.stats["straddled_calls"] == trace.straddled_calls == 1
    (segment,) = build_trajectory(trace).segments
    generated = [v for v, m in zip(segment.policy_versions, segment.loss_mask, strict=True) if m]
    assert generated == [0] * 7 + [5] * 34
    assert got[0][1] == "stop"


async def test_suspend_refuses_an_upstream_without_the_pause_routes() -> None:
    async with served() as stack:
        routes = stack.policy.app.routes
        routes[:] = [r for r in routes if getattr(r, "path", None) != "/pause"]
        with pytest.raises(UpstreamError, match="VLLM_SERVER_DEV_MODE"):
            async with stack.gateway.paused("suspend"):
                pass
        assert stack.gateway.gate.paused is None  # not left paused


@pytest.mark.skipif(RENDER_MISSING is not None, reason=RENDER_MISSING or "")
@pytest.mark.parametrize(
    ("linear", "stream"),
    [(True, False), (True, True), (False, True)],
    ids=["linear-plain", "linear-stream", "proxy-stream"],
)
async def test_a_call_that_has_no_token_yet_when_the_weights_change_is_the_new_version(
    linear: bool, stream: bool
) -> None:
    # Sent, queued, nothing generated when the suspend comes: every token it gets is sampled
    # by the new weights, and linear mode's record, trajectory and versions say so; a proxied
    # stream cannot tell a queued call from tokens in transit: its tokens are unknown (-1).
    from agentcore_rl.gateway.render.mode import RenderMode

    directory = str(tokenizer_dir("qwen2.5"))
    ticks = Ticks()
    policy = ScriptedPolicy(
        TemplateVoice(directory),
        serving=Serving(token_ids="requested", token_rate=20.0),
        sleep=ticks.sleep,
    )
    options: dict[str, Any] = {"render": RenderMode.load(directory)} if linear else {}
    async with served(policy, **options) as stack, anyio.create_task_group() as tg:
        gateway = stack.gateway
        llm = stack.llm("s1")
        got: list[Any] = []

        async def agent() -> None:
            reply = await chat(
                llm, QUESTION, stream=stream, max_tokens=30, extra_body={"min_tokens": 20}
            )
            got.append(reply)

        tg.start_soon(agent)
        await wait_until(lambda: policy.requests == 1)
        async with gateway.paused("suspend"):
            gateway.set_policy_version(3)
        ticks.run()
        await wait_until(lambda: bool(got))
        await llm.close()
        trace = await gateway.finish_session("s1")
    (record,) = trace.records
    assert record.ok, record.error
    (completion,) = record.completions
    assert ticks.taken >= len(completion.token_ids) > 0
    version = 3 if linear else -1
    assert completion.versions == [(0, version)]
    (segment,) = build_trajectory(trace).segments
    generated = [v for v, m in zip(segment.policy_versions, segment.loss_mask, strict=True) if m]
    assert generated == [version] * len(completion.token_ids)
