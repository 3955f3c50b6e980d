"""The client joined to the gateway, end to end: the math agent (real uvicorn, the real OpenAI
SDK) calls the stand-in policy through a gateway on real uvicorn; results and traces go to
moto S3. Each rollout's trace comes with its outcome and is kept beside its result."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from openai import AsyncOpenAI

from agentcore_rl import (
    AsyncRolloutClient,
    AwsConfig,
    ConfigurationError,
    GatewayConfig,
    GroupRules,
    Retries,
    RolloutClient,
    RolloutGateway,
    StaleGroupError,
    Timeouts,
    TraceLostError,
    build_trajectory,
)
from agentcore_rl.client.config import GATEWAY_TOKEN_ENV
from agentcore_rl.client.traces import RemoteGateway
from agentcore_rl.gateway import ADMIN_TOKEN_ENV, dump_trace
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.local.stack import LocalStack, StackS3
from agentcore_rl.protocol import ROLLOUT_FIELD, result_key, trace_key
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import ShutdownConfig
from agentcore_rl.training import group_rows
from agentcore_rl.trajectory import Trajectory
from tests.conftest import FAST_RETRY
from tests.gateway.helpers import ADMIN, Latch, wait_until

_buckets = itertools.count()
PROBLEM = {
    "prompt": "Maya has 12 apples. She buys 5 more apples. She eats 3. How many apples are left?",
    "answer": "14",
}


class Swappable:
    """One URL, a gateway behind it that the test can replace: a restart without a port race."""

    def __init__(self, gateway: RolloutGateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the gateways are entered by the test
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await self.gateway(scope, receive, send)


@dataclass
class Rig:
    stack: LocalStack
    policy: ScriptedPolicy
    gateway: RolloutGateway
    front: Swappable
    url: str
    store: ResultStore

    def client(self, **options: Any) -> AsyncRolloutClient:
        assert self.stack.s3_endpoint_url is not None
        options.setdefault("gateway", GatewayConfig(url=self.url, admin_token=ADMIN))
        options.setdefault("agent_url", self.stack.agent_urls)
        return AsyncRolloutClient(
            s3_bucket=self.stack.bucket,
            exp_id="join",
            aws=AwsConfig(s3_endpoint_url=self.stack.s3_endpoint_url),
            rollout={"model_id": self.policy.model},
            timeouts=Timeouts(rollout=60),
            **options,
        )


@contextlib.asynccontextmanager
async def _rig(s3_endpoint: str, policy: ScriptedPolicy | None = None) -> AsyncIterator[Rig]:
    policy = policy or ScriptedPolicy(
        accuracy=1.0, serving=Serving(token_ids="requested", keep_answers=100)
    )
    stack = LocalStack(
        "examples.math_agent.agent:app",
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket=f"join-{next(_buckets)}"),
        policy=policy,
        tps=None,
    )
    async with stack:
        assert stack.policy_base_url is not None
        gateway = RolloutGateway(stack.policy_base_url, admin_token=ADMIN)
        front = Swappable(gateway)
        async with gateway, BackgroundServer(front) as server:
            store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
            async with store:
                yield Rig(stack, policy, gateway, front, server.url, store)


@pytest.mark.parametrize("where", ["remote", "in_process"])
async def test_the_outcome_carries_the_trace_and_s3_keeps_it(s3_endpoint: str, where: str) -> None:
    async with _rig(s3_endpoint) as rig:
        options: dict[str, Any] = {}
        if where == "in_process":
            options["gateway"] = GatewayConfig(url=rig.url, app=rig.gateway)
        async with rig.client(**options) as client:
            assert client.gateway_url == rig.url
            fut = await client.invoke(PROBLEM, input_id="q-1")
            result = await fut
            assert rig.gateway.stats["live_sessions"] == 0  # finished at the gateway, not left open

        # The agent built its OpenAI client from _rollout: the session's gateway URL and id.
        block = result["payload"][ROLLOUT_FIELD]
        assert block["base_url"] == f"{rig.url}/sessions/{fut.session_id}/v1"
        assert block["api_key"] == fut.session_id
        assert result["rewards"] == [1.0]

        trace = client.trace_of(fut)
        assert trace is fut.trace
        assert (trace.session_id, trace.exp_id, trace.input_id) == (fut.session_id, "join", "q-1")
        assert len(trace.records) == 2  # the calculator turn and the answer
        for record, (prompt_ids, choices) in zip(trace.records, rig.policy.answers, strict=True):
            assert record.ok, record.error
            assert record.prompt_ids.tolist() == prompt_ids
            assert record.completions[0].token_ids.tolist() == choices[0][0]
            assert record.completions[0].logprobs.tolist() == choices[0][1]

        key = trace_key(result_key("join", "q-1", fut.session_id))
        assert key == fut.result_key.removesuffix(".json") + ".trace.json.gz"
        kept = await rig.store.get_trace(rig.stack.bucket, key)
        assert kept is not None
        assert dump_trace(kept) == dump_trace(trace)

        trajectory = build_trajectory(kept, reward=result["rewards"][0])
        assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)
        assert trajectory.generated_tokens == sum(len(c[0][0]) for _, c in rig.policy.answers)


async def test_every_batch_item_carries_its_trace(s3_endpoint: str) -> None:
    async with _rig(s3_endpoint) as rig:
        async with rig.client() as client:
            items = [item async for item in client.run_batch([PROBLEM] * 4)]
        assert all(item.success for item in items), items
        for item in items:
            assert item.trace is not None
            assert item.trace.session_id == item.session_id
            assert item.trace.input_id == item.input_id
            assert len(item.trace.records) == 2
            assert item.trace.tokens_captured > 0
        assert rig.gateway.stats["live_sessions"] == 0


async def test_a_group_through_the_gateway_gives_rows_with_token_ids(s3_endpoint: str) -> None:
    async with _rig(s3_endpoint) as rig:
        rig.gateway.set_policy_version(3)
        async with rig.client() as client:
            client.set_policy_version(3)
            group = await (
                await client.invoke_group(PROBLEM, rules=GroupRules(n=3), input_id="g-1")
            )
            plain = await client.invoke(PROBLEM, input_id="q-1")
            await plain
        assert plain.trajectory is not None
        assert plain.trace is not None
        assert plain.trajectory.session_id == plain.session_id
        assert plain.trajectory.reward == 1.0

    assert len(group.members) == 3
    for member in group.members:
        trajectory = member.trajectory
        assert isinstance(trajectory, Trajectory), member
        assert trajectory.session_id == member.session_id
        assert trajectory.reward == member.reward == 1.0
        assert trajectory.generated_tokens > 0
    rows = group_rows(group)  # require_tokens: every kept member has its tokens
    assert len(rows) == 3
    for row, member in zip(rows, group.members, strict=True):
        (segment,) = member.trajectory.segments  # the calculator turn merged into the answer
        assert (row.group_id, row.session_id) == ("g-1", member.session_id)
        assert row.prompt_ids
        assert row.response_ids
        assert [*row.prompt_ids, *row.response_ids] == segment.token_ids.tolist()
        assert sum(row.loss_mask) == segment.generated_tokens
        assert len(row.logprobs or ()) == len(row.loss_mask) == len(row.response_ids)
        assert row.policy_versions == [3]


async def test_the_sync_client_gives_traces_too(s3_endpoint: str) -> None:
    async with _rig(s3_endpoint) as rig:
        assert rig.stack.s3_endpoint_url is not None

        def run() -> Any:
            with RolloutClient(
                agent_url=rig.stack.agent_urls,
                s3_bucket=rig.stack.bucket,
                exp_id="sync",
                aws=AwsConfig(s3_endpoint_url=rig.stack.s3_endpoint_url),
                gateway=GatewayConfig(url=rig.url, admin_token=ADMIN),
                timeouts=Timeouts(rollout=60),
            ) as client:
                fut = client.invoke(PROBLEM, input_id="q-s")
                fut.result(timeout=60)
                return client.trace_of(fut)

        trace = await anyio.to_thread.run_sync(run)
        assert (trace.exp_id, trace.input_id, len(trace.records)) == ("sync", "q-s", 2)


async def test_a_gateway_restarted_mid_rollout_ends_it_in_trace_lost(s3_endpoint: str) -> None:
    latch = Latch()
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=latch.sleep)
    async with _rig(s3_endpoint, policy) as rig:
        async with rig.client() as client:
            fut = await client.invoke(PROBLEM, input_id="q-r")
            await wait_until(lambda: latch.waiting == 1, 15)  # the first call is upstream
            # The gateway "restarts": a new process behind the same URL, with no sessions.
            restarted = RolloutGateway(rig.gateway.upstreams, admin_token=ADMIN)
            async with restarted:
                rig.front.gateway = restarted
                latch.release()  # the agent's next call reaches the new gateway
                with pytest.raises(TraceLostError, match="restarted") as caught:
                    await fut
        assert caught.value.session_id == fut.session_id
        assert caught.value.envelope is not None  # the agent's result is kept on the error
        assert caught.value.envelope["rewards"] == [1.0]
        assert fut.trace is None
        assert (client.stats.results, client.stats.traces_lost) == (0, 1)
        # Nothing was written as if the rollout had its tokens.
        key = trace_key(result_key("join", "q-r", fut.session_id))
        assert await rig.store.get_trace(rig.stack.bucket, key) is None


async def test_a_trace_the_gateway_no_longer_has_is_lost(s3_endpoint: str) -> None:
    async with _rig(s3_endpoint) as rig:
        link = RemoteGateway(rig.url, ADMIN)
        try:
            opened_at = await link.open("sess-gone", exp_id="join", input_id="q-g")
            assert opened_at == rig.gateway.gateway_id
            await link.finish("sess-gone")
            with pytest.raises(TraceLostError, match="ended already"):
                await link.finish("sess-gone")  # finished already: 410 from the gateway
        finally:
            await link.aclose()


async def test_a_cancelled_rollout_releases_its_gateway_session(s3_endpoint: str) -> None:
    latch = Latch()
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=latch.sleep)
    async with _rig(s3_endpoint, policy) as rig:
        async with rig.client() as client:
            fut = await client.invoke(PROBLEM, input_id="q-c")
            await wait_until(lambda: latch.waiting == 1, 15)
            assert rig.gateway.stats["live_sessions"] == 1
            fut.cancel()
            # Releasing waits (bounded) for the call in flight, which the latch holds.
            latch.release()
            await wait_until(lambda: rig.gateway.stats["live_sessions"] == 0, 15)
        assert fut.cancelled()
        await _all_stopped(rig, [fut.result_key])
        assert rig.gateway.stats["sessions_finished"] == 1


async def _all_stopped(rig: Rig, keys: list[str]) -> None:
    """Wait (bounded) for stopped rollouts' "cancelled" envelopes. An agent's next turn,
    sent before its stop arrived, meets a finished session: refused (410), it opens none."""
    with anyio.fail_after(15):
        for key in keys:
            envelope = None
            while envelope is None:
                await anyio.sleep(0.01)
                envelope = await rig.store.get_json(rig.stack.bucket, key)
            assert envelope["error_type"] == "cancelled"
    await wait_until(lambda: rig.gateway.stats["in_flight"] == 0, 15)
    assert rig.gateway.stats["live_sessions"] == 0
    assert rig.gateway.stats["late_calls"] <= len(keys)


async def test_a_stale_groups_stopped_members_release_their_gateway_sessions(
    s3_endpoint: str,
) -> None:
    latch = Latch()
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=latch.sleep)
    async with _rig(s3_endpoint, policy) as rig:
        async with rig.client() as client:
            group = await client.invoke_group(PROBLEM, rules=GroupRules(n=2), input_id="g-s")
            await wait_until(lambda: latch.waiting == 2, 15)
            assert client.advance_policy(1, max_staleness=0) == 1  # stops both members
            with pytest.raises(StaleGroupError):
                await group
            latch.release()
        await _all_stopped(rig, [result_key("join", "g-s", sid) for sid in group.session_ids])


async def test_an_unreachable_gateway_fails_the_invocation_before_the_agent_runs(
    s3_endpoint: str,
) -> None:
    async with _rig(s3_endpoint) as rig:
        # Entering checks the gateway first (preflight); without that, the invocation does.
        async with rig.client(
            gateway=GatewayConfig(url="http://127.0.0.1:9", admin_token=ADMIN), preflight=False
        ) as client:
            with pytest.raises(Exception, match="cannot reach the gateway"):
                await client.invoke(PROBLEM, input_id="q-u")
            assert client.in_flight == 0
        assert rig.policy.requests == 0


async def test_the_agent_may_use_the_session_id_as_its_api_key(s3_endpoint: str) -> None:
    # The reference toolkit's convention: base URL {gateway}/v1, the session id as API key.
    async with _rig(s3_endpoint) as rig:
        rig.gateway.open_session("sess-key", exp_id="join", input_id="q-k")
        async with AsyncOpenAI(base_url=rig.url + "/v1", api_key="sess-key") as llm:
            await llm.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "What is 2 + 2?"}]
            )
        trace = await rig.gateway.finish_session("sess-key")
        assert (trace.input_id, len(trace.records)) == ("q-k", 1)


async def test_gateway_options_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    common: dict[str, Any] = {"agent_url": "http://127.0.0.1:1", "s3_bucket": "bkt", "exp_id": "e"}
    monkeypatch.delenv(GATEWAY_TOKEN_ENV, raising=False)
    assert GATEWAY_TOKEN_ENV == ADMIN_TOKEN_ENV  # one variable on both sides
    with pytest.raises(ConfigurationError, match="admin token"):
        GatewayConfig(url="http://127.0.0.1:9000")
    with pytest.raises(ConfigurationError, match="not both"):
        AsyncRolloutClient(
            gateway=GatewayConfig(url="http://127.0.0.1:9000", admin_token="t"),
            rollout={"base_url": "http://127.0.0.1:8000/v1"},
            **common,
        )
    with pytest.raises(ConfigurationError, match="must be a GatewayConfig"):
        AsyncRolloutClient(gateway=RolloutGateway("http://127.0.0.1:8000/v1"), **common)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="http\\(s\\) URL"):
        GatewayConfig(url="127.0.0.1:9000", admin_token="t")
    assert "s3cret" not in repr(GatewayConfig(url="http://127.0.0.1:9000", admin_token="s3cret"))
    monkeypatch.setenv(GATEWAY_TOKEN_ENV, "from-env")  # read where the process starts only
    with pytest.raises(ConfigurationError, match="admin token"):
        GatewayConfig(url="http://127.0.0.1:9000")
    assert RolloutGateway("http://127.0.0.1:8000/v1").admin_token is None
    client = AsyncRolloutClient(
        gateway=GatewayConfig(url="http://127.0.0.1:9000", admin_token="t"), **common
    )
    assert client.gateway_url == "http://127.0.0.1:9000"
    await client.aclose()
    without = AsyncRolloutClient(**common)
    with pytest.raises(ConfigurationError, match="no gateway"):
        without.trace_of(None)  # type: ignore[arg-type]
    await without.aclose()


def _shutdown_once_agent(store: ResultStore, sessions: list[str]) -> Any:
    """An agent that asks the model through its gateway session, then ends its first
    rollout like a server shutting down (retryable) and answers the next one."""
    from agentcore_rl.server import AgentCoreRLApp, RequestContext

    app = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0.0))

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        sessions.append(context.session_id)
        block = payload[ROLLOUT_FIELD]
        async with AsyncOpenAI(base_url=block["base_url"], api_key=block["api_key"]) as llm:
            await llm.chat.completions.create(
                model=block["model_id"],
                messages=[{"role": "user", "content": f"attempt {len(sessions)}: 2 + 2?"}],
            )
        if len(sessions) == 1:
            return {
                "status_code": 503,
                "error_type": "cancelled",
                "stop_reason": "cancelled: the agent server is shutting down",
            }
        return {"rewards": [1.0]}

    return app


async def test_a_retried_rollout_runs_in_a_new_gateway_session(s3_endpoint: str) -> None:
    async with _rig(s3_endpoint) as rig:
        sessions: list[str] = []
        agent_store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
        async with (
            agent_store,
            BackgroundServer(_shutdown_once_agent(agent_store, sessions)) as srv,
        ):
            async with rig.client(agent_url=srv.url) as client:
                fut = await client.invoke(PROBLEM, input_id="q-t")
                result = await fut
            assert rig.gateway.stats["live_sessions"] == 0  # the given-up session was released too
        assert result["rewards"] == [1.0]
        assert (fut.attempts, client.stats.rollout_retries) == (2, 1)
        assert sessions == [*fut.previous_sessions, fut.session_id]
        # The rollout's trace is the final attempt's: its session, its one model call.
        trace = client.trace_of(fut)
        assert trace.session_id == fut.session_id
        assert len(trace.records) == 1
        assert trace.records[0].ok, trace.records[0].error
        kept = await rig.store.get_trace(
            rig.stack.bucket, trace_key(result_key("join", "q-t", fut.session_id))
        )
        assert kept is not None
        assert dump_trace(kept) == dump_trace(trace)
        given_up = trace_key(result_key("join", "q-t", fut.previous_sessions[0]))
        assert await rig.store.get_trace(rig.stack.bucket, given_up) is None


async def test_a_lost_trace_is_final_not_retried(s3_endpoint: str) -> None:
    latch = Latch()
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=latch.sleep)
    async with _rig(s3_endpoint, policy) as rig:
        async with rig.client(retries=Retries(rollouts=2)) as client:
            fut = await client.invoke(PROBLEM, input_id="q-f")
            await wait_until(lambda: latch.waiting == 1, 15)
            restarted = RolloutGateway(rig.gateway.upstreams, admin_token=ADMIN)
            async with restarted:
                rig.front.gateway = restarted
                latch.release()
                with pytest.raises(TraceLostError):
                    await fut
        # The agent's result exists: running the input again would make another one.
        assert (fut.attempts, fut.previous_sessions) == (1, [])
        assert (client.stats.rollout_retries, client.stats.traces_lost) == (0, 1)


async def test_a_groups_step_run_again_with_its_exp_id_gives_the_same_groups(
    s3_endpoint: str,
) -> None:
    # A restarted trainer, or one that runs a step again: the members' sessions (derived
    # from exp_id and input_id) ended in the first run, their results and traces in S3.
    async with _rig(s3_endpoint) as rig:
        payloads = [{**PROBLEM, ROLLOUT_FIELD: {"input_id": f"g-{i}"}} for i in range(2)]
        runs: list[list[Any]] = []
        for _ in range(2):
            async with rig.client() as client:
                groups = [g async for g in client.run_groups(payloads, rules=GroupRules(n=4))]
            assert rig.gateway.stats["live_sessions"] == 0
            runs.append([group_rows(g) for g in sorted(groups, key=lambda g: g.input_id)])
            if len(runs) == 1:
                requests = rig.policy.requests
        assert len(runs[0]) == 2
        assert runs[1] == runs[0]
        assert rig.policy.requests == requests  # nothing ran again
        assert rig.gateway.stats["sessions_finished"] == 8
        # Another prompt under a used input id is a new run meant: refused, saying so.
        other = [{**payloads[0], "prompt": "What is 2 + 2?"}]
        async with rig.client() as client:
            with pytest.raises(ConfigurationError, match="use a new exp_id"):
                async for _ in client.run_groups(other, rules=GroupRules(n=4)):
                    pass
        assert (rig.policy.requests, rig.gateway.stats["live_sessions"]) == (requests, 0)
