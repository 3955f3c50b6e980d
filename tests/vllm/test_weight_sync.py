"""Weight sync without draining, against a real vLLM: a generation suspended mid-way (or still
queued), the weights replaced by a second random model, resumed; then every token's version in
the record, the trajectory and the rows is checked against the weights that sampled it.

The two models tell their tokens apart: the second one ends most of its steps at
``<|im_end|>`` (``tests/vllm/model.py``), so an ordinary token's logprob is about -14 under
it against about -12 under the first. Forbidding the end (``min_tokens``) keeps the
generation going; each token's logprob then says which weights sampled it.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import httpx
import pytest
from openai import AsyncOpenAI

from agentcore_rl import build_trajectory
from agentcore_rl.training import trajectory_rows
from tests.vllm.conftest import VLLMServer
from tests.vllm.rig import ask, gateway_on

pytestmark = pytest.mark.timeout(600)

# Tokens per call: the pause lands after the first few dozen; a machine that finishes the call
# before the pause arrives gets a longer one (the model's context is 4,096).
_LENGTHS = (400, 1200, 3600)
_OLD_OR_NEW = -13.0  # between the two models' logprobs of an ordinary token
_HEAD = 24  # tokens vLLM has made before the pause (its counter moves every step)


async def _metric(http: httpx.AsyncClient, name: str) -> float:
    text = (await http.get("/metrics")).text
    return sum(float(x) for x in re.findall(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M))


def _sent(gateway: Any) -> bool:
    """Whether the call's token-in request is on its way to vLLM."""
    return any(gateway.gate.token_in.values())


async def _load(http: httpx.AsyncClient, directory: Any) -> None:
    """Replace the served weights in place (vLLM's reload through ``/collective_rpc``) and drop
    the prefix cache, whose blocks the old weights computed."""
    loaded = await http.post(
        "/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}},
    )
    loaded.raise_for_status()
    (await http.post("/reset_prefix_cache")).raise_for_status()


async def _suspended_call(
    server: VLLMServer, http: httpx.AsyncClient, *, linear: bool, kind: str, length: int
) -> tuple[Any, Any] | None:
    """One call of ``length`` tokens with a suspend, a weight swap and a resume in its middle ->
    (the agent's answer, the session's trace); None when the call ended before the pause came
    (a machine fast enough to finish it while the test was asking for the pause)."""
    messages: Any = [{"role": "user", "content": "Tell me a long story."}]
    answer: list[Any] = []
    async with gateway_on(server, linear=linear) as rig:
        gateway, llm = rig.gateway, rig.llm("s")

        async def agent(llm: AsyncOpenAI = llm) -> None:
            options = {"max_tokens": length, "extra_body": {"min_tokens": length}}
            answer.append(await ask(llm, messages, stream=kind == "stream", **options))

        try:
            if kind == "queued":  # sent, and waiting in vLLM's queue when the suspend comes
                (await http.post("/pause?mode=keep")).raise_for_status()
            made = await _metric(http, "generation_tokens_total")
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent)
                with anyio.fail_after(240):  # a paused vLLM's metrics stand still: the gateway's
                    while not (  # noqa: ASYNC110
                        (gateway.gate.in_flight == 1 and _sent(gateway))
                        if kind == "queued"
                        else await _metric(http, "generation_tokens_total") - made >= _HEAD
                    ):
                        await anyio.sleep(0.01)
                async with gateway.paused("suspend"):
                    if gateway.gate.in_flight == 0:  # already whole: nothing to cut
                        return None
                    await _load(http, server.other_model_dir)
                    gateway.set_policy_version(1)
            await llm.close()
            trace = await gateway.finish_session("s")
        finally:
            await http.post("/resume")
            await _load(http, server.model_dir)  # the next tests' weights
        stats = gateway.stats["linear_versions" if linear else "proxy_versions"]
        assert stats == {server.base_url: "upstream"}
    ((_, finish, _),) = answer
    assert finish == "length"  # one ordinary, whole completion: no error, no cut
    return answer[0], trace


def _new_weights_sampled(trace: Any) -> bool:
    """Whether the second model sampled any of the call's tokens (none: vLLM had made them all
    before the pause, while the gateway was still relaying them)."""
    ((completion,),) = (record.completions for record in trace.records)
    return any(lp <= _OLD_OR_NEW for lp in completion.logprobs.tolist())


@pytest.mark.parametrize("kind", ["plain", "stream", "queued"])
@pytest.mark.parametrize("linear", [True, False], ids=["linear", "proxy"])
async def test_every_token_carries_the_version_of_the_weights_that_sampled_it(
    vllm_server: VLLMServer, linear: bool, kind: str
) -> None:
    async with httpx.AsyncClient(base_url=vllm_server.root, timeout=120) as http:
        for length in _LENGTHS:  # a longer call where the machine outran the pause
            done = await _suspended_call(vllm_server, http, linear=linear, kind=kind, length=length)
            if done is not None and _new_weights_sampled(done[1]):
                break
        else:
            pytest.fail(f"every call ended before the pause reached vLLM (up to {length} tokens)")
    _, trace = done
    (record,) = trace.records
    assert record.ok, record.error
    assert (record.policy_version_start, record.policy_version_end) == (0, 1)
    (completion,) = record.completions
    logprobs = completion.logprobs.tolist()
    assert len(logprobs) == length
    truth = [0 if lp > _OLD_OR_NEW else 1 for lp in logprobs]
    cut = truth.index(1)
    assert truth == [0] * cut + [1] * (length - cut)
    assert (cut == 0) == (kind == "queued")
    (segment,) = build_trajectory(trace).segments
    generated = [v for v, m in zip(segment.policy_versions, segment.loss_mask, strict=True) if m]
    (row,) = trajectory_rows(
        build_trajectory(trace), exp_id="e", group_id="g", session_id="s", reward=1.0
    )
    in_row = [v for v, m in zip(row.response_versions, row.loss_mask, strict=True) if m]
    assert generated == in_row
    # vLLM's own spans, in both modes (proxy mode generates vLLM's rendering token-in): every
    # token exact
    assert completion.versions == ([(0, 1)] if cut == 0 else [(0, 0), (cut, 1)])
    assert generated == truth
