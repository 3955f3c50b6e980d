"""Linear mode on a long conversation and on a stop string vLLM does not stop on, against a
real vLLM: 30 turns are one segment whose every new part is what vLLM's own rendering of the
whole conversation puts after the last answer; with ``min_tokens`` and a stop string inside
the first ``min_tokens`` tokens, the agent gets the text proxy mode passes on."""

from __future__ import annotations

from typing import Any

import pytest

from agentcore_rl import build_trajectory
from tests.vllm.conftest import VLLMServer
from tests.vllm.model import IM_END
from tests.vllm.rig import ask, gateway_on, vllm_prompt_ids

pytestmark = pytest.mark.timeout(600)  # the first test of a session also waits for vLLM

TURNS = 30


async def test_a_long_conversation_is_one_segment_rendered_as_vllm_renders_it(
    vllm_server: VLLMServer,
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Count the waves."}]
    async with gateway_on(vllm_server, linear=True) as rig:
        llm = rig.llm("long")
        for turn in range(TURNS):  # short answers: some end with <|im_end|>, some are cut
            text, _, _ = await ask(llm, messages, stream=turn % 2 == 1, max_tokens=4, seed=turn)
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"Wave {turn + 2}?"},
            ]
        await llm.close()
        trace = await rig.gateway.finish_session("long")
        assert rig.gateway.stats["linear_forks"] == 0
    records = trace.records
    assert len(records) == TURNS
    assert all(r.ok for r in records), [r.error for r in records]
    trajectory = build_trajectory(trace)
    assert (len(trajectory.segments), trajectory.splits) == (1, 0)
    # the last call's new part (after the served ids and the end-of-turn closing a cut-off
    # answer) is what vLLM's rendering of the whole conversation puts after the last answer
    last, before = records[-1], records[-2]
    kept = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
    prompt = last.prompt_ids.tolist()
    assert prompt[: len(kept)] == kept
    new = prompt[len(kept) :]
    if kept[-1] != IM_END:
        assert new[0] == IM_END
        new = new[1:]
    whole = await vllm_prompt_ids(vllm_server, messages[:-2])
    ends = [i for i, token in enumerate(whole) if token == IM_END]
    assert new == whole[ends[-2] + 1 :]


async def test_a_stop_string_inside_min_tokens_gives_the_text_proxy_mode_gives(
    vllm_server: VLLMServer,
) -> None:
    """vLLM stops on a stop string only where it ends past the first ``min_tokens`` tokens;
    linear mode must not cut the text at an earlier occurrence."""
    messages: list[Any] = [{"role": "user", "content": "Describe the weather."}]
    options: Any = {"max_tokens": 24, "temperature": 0.0, "extra_body": {"min_tokens": 12}}
    async with gateway_on(vllm_server) as proxy:
        llm = proxy.llm("free")
        free, _, _ = await ask(llm, messages, stream=False, **options)
        await llm.close()
        early = free[: len(free) // 4].strip()[-1:]  # a character of the first tokens' text
        assert early, free
        options["stop"] = [early]
        llm = proxy.llm("proxy")
        want = await ask(llm, messages, stream=False, **options)
        await llm.close()
    async with gateway_on(vllm_server, linear=True) as rig:
        llm = rig.llm("linear")
        got = await ask(llm, messages, stream=False, **options)
        await llm.close()
    assert early in want[0]  # vLLM did not stop on it inside the first min_tokens tokens
    assert got[:2] == want[:2]
