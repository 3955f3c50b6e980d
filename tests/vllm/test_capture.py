"""The gateway against a real vLLM: what it records is what vLLM fed the model and served.

Proxy mode (vLLM renders) and linear history (the gateway renders with the model's own
template and calls vLLM token-in), multi-turn, streamed and not, with the real OpenAI SDK as
the agent's client; then whole rollouts through ``AsyncRolloutClient`` and an agent server.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from agentcore_rl import AsyncRolloutClient, AwsConfig, GatewayConfig, Timeouts, build_trajectory
from agentcore_rl.local.stack import LocalStack, PolicyEndpoint, StackS3
from tests.vllm.conftest import MODEL, VLLMServer
from tests.vllm.rig import ADMIN, ask, gateway_on, vllm_prompt_ids

pytestmark = pytest.mark.timeout(300)


def _next_turn(messages: list[Any], text: str, turn: int) -> list[Any]:
    return [
        *messages,
        {"role": "assistant", "content": text},
        {"role": "user", "content": f"Go on with part {turn + 2}."},
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_proxy_mode_records_vllms_prompt_ids_and_the_served_tokens(
    vllm_server: VLLMServer, stream: bool
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
    asked: list[list[Any]] = []
    served: list[list[float] | None] = []
    async with gateway_on(vllm_server) as rig:
        llm = rig.llm("proxy-1")
        for turn in range(3):
            asked.append(messages)
            text, _, logprobs = await ask(
                llm, messages, stream=stream, max_tokens=24, seed=turn, logprobs=True
            )
            served.append(logprobs)
            messages = _next_turn(messages, text, turn)
        await llm.close()
        trace = await rig.gateway.finish_session("proxy-1")
    assert len(trace.records) == 3
    for record, sent, logprobs in zip(trace.records, asked, served, strict=True):
        assert record.ok, record.error
        assert record.prompt_ids.tolist() == await vllm_prompt_ids(vllm_server, sent)
        (completion,) = record.completions
        assert 0 < len(completion.token_ids) <= 24
        assert completion.logprobs.tolist() == logprobs  # exactly what vLLM served the agent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_linear_mode_extends_one_sequence_token_in(
    vllm_server: VLLMServer, stream: bool
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
    first_prompt = await vllm_prompt_ids(vllm_server, messages)
    async with gateway_on(vllm_server, linear=True) as rig:
        llm = rig.llm("linear-1")
        for turn in range(3):
            text, finish, _ = await ask(llm, messages, stream=stream, max_tokens=400, seed=turn)
            assert finish == "stop"  # the model ended its turn (<|im_end|>)
            messages = _next_turn(messages, text, turn)
        await llm.close()
        trace = await rig.gateway.finish_session("linear-1")
    records = trace.records
    assert all(r.ok for r in records), [r.error for r in records]
    assert records[0].prompt_ids.tolist() == first_prompt  # rendered as vLLM renders it
    for before, after in itertools.pairwise(records):
        kept = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
        assert after.prompt_ids.tolist()[: len(kept)] == kept
    trajectory = build_trajectory(trace)
    assert (len(trajectory.segments), trajectory.splits) == (1, 0)
    assert trajectory.generated_tokens == sum(len(r.completions[0].token_ids) for r in records)
    assert rig.gateway.stats["linear_forks"] == 0


async def test_a_rollout_through_the_client_and_an_agent_server_carries_its_trace(
    vllm_server: VLLMServer, s3_endpoint: str
) -> None:
    stack = LocalStack(
        "examples.math_agent.agent:app",
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket="vllm-rollouts"),
        policy=PolicyEndpoint(vllm_server.base_url, model=MODEL),
        tps=None,
    )
    problem = {"prompt": "Maya has 12 apples and eats 3. How many are left?", "answer": "9"}
    async with stack, gateway_on(vllm_server) as rig:
        client = AsyncRolloutClient(
            s3_bucket=stack.bucket,
            exp_id="vllm",
            aws=AwsConfig(s3_endpoint_url=s3_endpoint),
            agent_url=stack.agent_urls,
            gateway=GatewayConfig(url=rig.url, admin_token=ADMIN),
            rollout={"model_id": MODEL, "max_tokens": 32, "temperature": 1.0},
            timeouts=Timeouts(rollout=240),
        )
        async with client:
            fut = await client.invoke(problem, input_id="q-1")
            result = await fut
    assert result["rewards"] is not None
    trace = fut.trace
    assert trace is not None
    assert (trace.exp_id, trace.input_id) == ("vllm", "q-1")
    assert trace.records
    assert all(r.ok for r in trace.records)
    for record in trace.records:
        assert record.upstream == vllm_server.base_url
        assert record.prompt_ids.tolist() == await vllm_prompt_ids(
            vllm_server, record.messages, record.tools
        )
        assert len(record.completions[0].token_ids) == len(record.completions[0].logprobs)
    trajectory = fut.trajectory
    assert trajectory is not None
    assert trajectory.generated_tokens == sum(
        len(r.completions[0].token_ids) for r in trace.records
    )
