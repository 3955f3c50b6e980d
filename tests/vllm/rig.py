"""The gateway in front of the session's vLLM, on real uvicorn, and an agent's calls through
the real OpenAI SDK."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from openai import AsyncOpenAI

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.gateway.render.mode import RenderMode
from agentcore_rl.local.background import BackgroundServer
from tests.vllm.conftest import MODEL, VLLMServer

ADMIN = "vllm-test-admin"


@dataclass
class Rig:
    server: VLLMServer
    gateway: RolloutGateway
    url: str

    def llm(self, sid: str) -> AsyncOpenAI:
        """The agent's OpenAI client for session ``sid``."""
        return AsyncOpenAI(
            base_url=RolloutGateway.session_base_url(self.url, sid), api_key="x", max_retries=0
        )


@contextlib.asynccontextmanager
async def gateway_on(
    server: VLLMServer, *, linear: bool = False, **options: Any
) -> AsyncIterator[Rig]:
    """A gateway (proxy mode, or linear history with the model's own template) on uvicorn."""
    render = RenderMode.load(server.model_dir) if linear else None
    gateway = RolloutGateway(server.base_url, admin_token=ADMIN, render=render, **options)
    async with BackgroundServer(gateway) as front:
        yield Rig(server, gateway, front.url)


async def ask(
    llm: AsyncOpenAI, messages: list[Any], *, stream: bool, **options: Any
) -> tuple[str, str | None, list[float] | None]:
    """One chat call as an agent makes it -> (text, finish reason, logprobs when asked)."""
    if not stream:
        reply = await llm.chat.completions.create(model=MODEL, messages=messages, **options)
        choice = reply.choices[0]
        logprobs = None
        if choice.logprobs is not None and choice.logprobs.content is not None:
            logprobs = [entry.logprob for entry in choice.logprobs.content]
        return choice.message.content or "", choice.finish_reason, logprobs
    text: list[str] = []
    finish = None
    seen: list[float] = []
    chunks = await llm.chat.completions.create(
        model=MODEL, messages=messages, stream=True, **options
    )
    async for chunk in chunks:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            if choice.logprobs is not None and choice.logprobs.content:
                seen.extend(entry.logprob for entry in choice.logprobs.content)
            finish = choice.finish_reason or finish
    return "".join(text), finish, seen or None


async def vllm_prompt_ids(
    server: VLLMServer, messages: list[Any], tools: list[Any] | None = None
) -> list[int]:
    """The prompt ids vLLM's own chat endpoint renders for ``messages`` (and ``tools``)."""
    async with httpx.AsyncClient(base_url=server.root, timeout=60) as http:
        answer = await http.post(
            "/tokenize",
            json={
                "model": MODEL,
                "messages": messages,
                "tools": tools or None,
                "add_generation_prompt": True,
            },
        )
        answer.raise_for_status()
        tokens: list[int] = answer.json()["tokens"]
        return tokens


async def assert_logprobs_are_vllms(server: VLLMServer, record: Any) -> None:
    """The record's logprobs are the served model's for its ids: vLLM scores the whole
    sequence afresh (``prompt_logprobs``), equal to bf16 noise. For the dialects whose answer
    carries no logprobs, the independent check that the recorded ones are vLLM's."""
    (completion,) = record.completions
    prompt, ids = record.prompt_ids.tolist(), completion.token_ids.tolist()
    async with httpx.AsyncClient(base_url=server.root, timeout=60) as http:
        answer = await http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": prompt + ids, "max_tokens": 1, "prompt_logprobs": 0},
        )
        answer.raise_for_status()
    entries = answer.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    scored = [entry[str(token)]["logprob"] for entry, token in zip(entries, ids, strict=True)]
    recorded = completion.logprobs.tolist()
    assert len(recorded) == len(ids)
    assert all(abs(a - b) < 0.1 for a, b in zip(recorded, scored, strict=True)), (recorded, scored)
