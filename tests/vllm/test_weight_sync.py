"""Weight sync without draining, against a real vLLM: a long generation suspended mid-way, the
weights replaced by a second random model, resumed.

The two models tell their tokens apart: the second one ends most of its steps at
``<|im_end|>`` (``tests/vllm/model.py``), so an ordinary token's logprob is about -14 under
it against about -12 under the first. Forbidding the end (``min_tokens``) keeps the
generation going; each token's logprob then says which weights sampled it.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest
from openai import AsyncOpenAI

from agentcore_rl import build_trajectory
from agentcore_rl.gateway.policy_gate import PolicyGate
from tests.vllm.conftest import MODEL, VLLMServer
from tests.vllm.rig import ask, gateway_on

pytestmark = pytest.mark.timeout(600)

LENGTH = 1500  # seconds of generation: the pause lands long before its end
_OLD_OR_NEW = -13.0  # between the two models' logprobs of an ordinary token


def _tokens_out(gate: PolicyGate) -> bool:
    """Whether a proxied stream has tokens out (the gate counts them as they arrive)."""
    return any(versions.count() for versions in gate.live)


# A proxied stream is paused once its first tokens are out. A token-in request's tokens are
# not seen by the gateway until it ends (vLLM 0.32's `generation_tokens_total` counter moves
# every step, but counts every request's tokens together), so the pause comes after the time
# this machine takes for a tenth of the generation,
# timed just before (speeds differ tenfold between machines; a fixed head start either comes
# before the first token or after the last). On a loaded machine the pause can still reach
# vLLM after the last token (or the whole generation passes unseen): that run does not
# straddle, and runs again, with a shorter head start.
_PROBE = 100  # tokens timed; the head start is the time of LENGTH / 10 of them


async def _head_start(http: httpx.AsyncClient) -> float:
    """Seconds this machine takes, now, to generate a tenth of LENGTH tokens."""
    body = {"model": MODEL, "prompt": "Once", "max_tokens": _PROBE, "min_tokens": _PROBE}
    started = time.perf_counter()
    (await http.post("/v1/completions", json=body)).raise_for_status()
    return (time.perf_counter() - started) * LENGTH / 10 / _PROBE


async def _load(http: httpx.AsyncClient, directory: Any) -> None:
    """Replace the served weights in place (vLLM's reload through ``/collective_rpc``) and drop
    the prefix cache, whose blocks the old weights computed."""
    loaded = await http.post(
        "/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}},
    )
    loaded.raise_for_status()
    (await http.post("/reset_prefix_cache")).raise_for_status()


async def _prompt_logprobs(http: httpx.AsyncClient, ids: list[int]) -> list[float]:
    """The served model's logprob of each token of ``ids`` after the first (one fresh request)."""
    answer = await http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0},
    )
    answer.raise_for_status()
    entries = answer.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:], strict=True)]


_ATTEMPTS = 3  # a run whose generation ended before the pause took hold is run again


@pytest.mark.parametrize(
    ("linear", "stream"),
    [(True, False), (True, True), (False, True)],
    ids=["linear", "linear-stream", "proxy-stream"],
)
async def test_a_suspend_freezes_a_long_generation_that_goes_on_under_the_new_weights(
    vllm_server: VLLMServer, linear: bool, stream: bool
) -> None:
    messages: Any = [{"role": "user", "content": "Tell me a long story."}]
    http = httpx.AsyncClient(base_url=vllm_server.root, timeout=120)
    async with http, gateway_on(vllm_server, linear=linear) as rig:
        gateway, gate = rig.gateway, rig.gateway.gate
        head_start = await _head_start(http) if linear else 0.0
        try:
            for attempt in range(_ATTEMPTS):
                answer: list[Any] = []
                sid = f"suspended-{attempt}"
                llm = rig.llm(sid)

                async def agent(llm: AsyncOpenAI = llm, answer: list[Any] = answer) -> None:
                    answer.append(
                        await ask(
                            llm,
                            messages,
                            stream=stream,
                            max_tokens=LENGTH,
                            extra_body={"min_tokens": LENGTH},
                        )
                    )

                async with anyio.create_task_group() as tg:
                    tg.start_soon(agent)
                    # Running at vLLM, then some tokens out (see _PROBE).
                    with anyio.fail_after(240):
                        while not (answer or _tokens_out(gate) or any(gate.token_in.values())):  # noqa: ASYNC110
                            await anyio.sleep(0.01)
                    if linear:  # after a loaded run, a shorter head start
                        await anyio.sleep(head_start / 4**attempt)
                    async with gateway.paused("suspend"):
                        straddles = gate.in_flight == 1  # the call still running
                        if straddles:
                            await _load(http, vllm_server.other_model_dir)
                            gateway.set_policy_version(1)
                await llm.close()
                trace = await gateway.finish_session(sid)
                if straddles:
                    break
            else:
                pytest.fail(f"in {_ATTEMPTS} runs the generation ended before the pause")
            (record,) = trace.records
            served = [*record.prompt_ids.tolist(), *record.completions[0].token_ids.tolist()]
            new = await _prompt_logprobs(http, served)
        finally:
            await _load(http, vllm_server.model_dir)  # the next tests' weights
        assert gateway.stats["straddled_calls"] == 1

    ((_, finish, _),) = answer
    assert finish == "length"  # one ordinary, whole completion: no error, no cut
    assert record.ok, record.error
    assert (record.policy_version_start, record.policy_version_end) == (0, 1)
    (completion,) = record.completions
    ids, logprobs = completion.token_ids.tolist(), completion.logprobs.tolist()
    assert len(ids) == LENGTH
    assert completion.versions is not None
    (first, version0), (cut, version1) = completion.versions
    assert (first, version0, version1) == (0, 0, 1)
    assert 0 < cut < LENGTH
    # Each token carries the version whose weights sampled it.
    assert all(lp > _OLD_OR_NEW for lp in logprobs[:cut])
    assert all(lp < _OLD_OR_NEW for lp in logprobs[cut:])
    trajectory = build_trajectory(trace)
    (segment,) = trajectory.segments
    generated = [v for v, m in zip(segment.policy_versions, segment.loss_mask, strict=True) if m]
    assert generated == [0] * cut + [1] * (LENGTH - cut)
    # After the change the logprobs are the new model's: a fresh request to the new weights
    # gives the same, to bf16 noise (token-in: the continuation is computed afresh; proxy:
    # the output layer, where the two models differ, is the new one either way).
    fresh = new[len(record.prompt_ids) - 1 :]
    assert all(abs(a - b) < 0.1 for a, b in zip(logprobs[cut:], fresh[cut:], strict=True))
    assert all(abs(a - b) > 1.0 for a, b in zip(logprobs[:cut], fresh[:cut], strict=True))
