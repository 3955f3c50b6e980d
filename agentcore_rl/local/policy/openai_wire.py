"""The wire shapes the stand-in speaks, as vLLM writes them: a request's checks, chat and text
completion answers with vLLM's capture fields (``prompt_token_ids``, ``token_ids``), their SSE
stream, errors in OpenAI's shape, and SGLang's ``/generate`` answer. Pure: what to say is the
voice's (:class:`~agentcore_rl.local.policy.voices.Said`)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from itertools import accumulate
from typing import Any, Final, TypeGuard

from starlette.requests import Request
from starlette.responses import JSONResponse

from agentcore_rl.edge import Refusal
from agentcore_rl.local.policy.voices import Said

__all__ = [
    "FINGERPRINT",
    "answer",
    "check_chat",
    "choices_wanted",
    "generate_answer",
    "is_ids",
    "refused",
    "sse",
]

#: Marks every answer, so nobody mistakes the stand-in for a real model.
FINGERPRINT: Final = "agentcore-rl-scripted-stand-in"
_MAX_CHOICES: Final = 16


def refused(request: Request, exc: Exception) -> JSONResponse:
    """A refusal in OpenAI's error shape, as vLLM answers (a Starlette exception handler)."""
    assert isinstance(exc, Refusal)
    error = {"message": exc.message, "type": "invalid_request_error", "param": exc.field}
    return JSONResponse({"error": {**error, "code": None}}, status_code=exc.status)


def is_ids(value: object) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    )


def check_chat(body: Mapping[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refusal(400, "messages must be a non-empty list", field="messages")
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise Refusal(400, "every message must be an object with a string role", field="messages")
    if not isinstance(body.get("tools") or [], list):
        raise Refusal(400, "tools must be a list", field="tools")


def choices_wanted(body: Mapping[str, Any]) -> int:
    n = body.get("n", 1) or 1
    if not isinstance(n, int) or not 1 <= n <= _MAX_CHOICES:
        raise Refusal(400, f"n must be an integer from 1 to {_MAX_CHOICES}", field="n")
    return n


def _logprobs(one: Said, chat: bool, asked: object) -> dict[str, Any] | None:
    """A choice's ``logprobs``: chat's per-token entries, or the completion's lists, where the
    sampled token comes first among made-up runners-up (vLLM: the top ``asked``)."""
    if (not asked) if chat else (asked is None or asked is False):
        return None
    pairs = list(zip(one.tokens, one.logprobs, strict=True))
    if chat:
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in pairs
            ]
        }
    top = asked if isinstance(asked, int) else 0
    alternatives = [{t: lp, **{f"<alt{j}>": lp - j for j in range(1, top)}} for t, lp in pairs]
    return {
        "tokens": one.tokens,
        "token_logprobs": one.logprobs,
        "top_logprobs": alternatives if top else None,
        "text_offset": [0, *accumulate(len(t) for t in one.tokens)][:-1],
    }


def answer(
    body: Mapping[str, Any],
    chat: bool,
    prompt_ids: list[int],
    said: list[Said],
    model: str,
    with_ids: bool,
) -> dict[str, Any]:
    """The chat or text completion answer of ``said`` (its token ids ``with_ids``)."""
    choices = []
    for i, one in enumerate(said):
        choice = {"index": i, **({"message": one.message} if chat else {"text": one.text})}
        choice["logprobs"] = _logprobs(one, chat, body.get("logprobs"))
        choice["finish_reason"], choice["stop_reason"] = one.finish, one.stop_reason
        if with_ids:
            choice["token_ids"] = one.ids
            if not chat:
                choice["prompt_token_ids"] = prompt_ids
        if one.weight_versions is not None:
            choice["weight_versions"] = one.weight_versions
        choices.append(choice)
    completion_tokens = sum(len(one.ids) for one in said)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode())
    response = {
        "id": ("chatcmpl-" if chat else "cmpl-") + digest.hexdigest()[:24],
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": body["model"] if isinstance(body.get("model"), str) else model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
    }
    if chat and with_ids:
        response["prompt_token_ids"] = prompt_ids
    return response


def generate_answer(body: Mapping[str, Any], prompt_ids: list[int], one: Said) -> dict[str, Any]:
    """SGLang's ``/generate`` answer."""
    reason: dict[str, Any] = {"type": one.finish}
    if one.finish == "stop":
        reason["matched"] = one.ids[-1]
    meta: dict[str, Any] = {
        "id": hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:24],
        "finish_reason": reason,
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(one.ids),
        "cached_tokens": 0,
    }
    if body.get("return_logprob"):
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(one.logprobs, one.ids, strict=True)
        ]
    return {"text": one.text, "output_ids": one.ids, "meta_info": meta}


async def sse(
    response: dict[str, Any], said: list[Said], usage: bool, by_token: bool
) -> AsyncIterator[str]:
    """An answer as vLLM streams it: a role chunk (with the prompt ids), one chunk per token
    when ``by_token`` (else, and for tool calls, one chunk), the finish reason, usage, DONE."""
    chat = response["object"] == "chat.completion"
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return "data: " + json.dumps({**head, "choices": choices, **extra}) + "\n\n"

    for choice, one in zip(response["choices"], said, strict=True):
        index = choice["index"]
        if chat:
            extra = {}
            if "prompt_token_ids" in response and index == 0:
                extra["prompt_token_ids"] = response["prompt_token_ids"]
            role = {"index": index, "delta": {"role": "assistant", "content": ""}}
            yield event([{**role, "logprobs": None, "finish_reason": None}], **extra)
            message = choice["message"]
            calls = message.get("tool_calls")
            if calls or not by_token:  # one delta carrying all its tokens
                delta = {k: v for k, v in message.items() if k != "role"}
                if calls:
                    delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
                yield event(
                    [{**{k: v for k, v in choice.items() if k != "message"}, "delta": delta}]
                )
                continue
        elif not by_token:  # the whole text in one chunk
            yield event([choice])
            continue
        logprobs, ids = choice["logprobs"], choice.get("token_ids")
        for pos, piece in enumerate(one.tokens):
            out: dict[str, Any] = {"index": index}
            out.update({"delta": {"content": piece}} if chat else {"text": piece})
            # a slice of each list: chat's "content", completions' "tokens", "token_logprobs"...
            out["logprobs"] = logprobs and {
                k: v[pos : pos + 1] if isinstance(v, list) else v for k, v in logprobs.items()
            }
            if pos == 0 and "prompt_token_ids" in choice:  # completions: the prompt's ids
                out["prompt_token_ids"] = choice["prompt_token_ids"]
            out["finish_reason"] = choice["finish_reason"] if pos == len(one.tokens) - 1 else None
            if ids is not None:
                out["token_ids"] = ids[pos : pos + 1]
            yield event([out])
    if usage:
        yield event([], usage=response["usage"])
    yield "data: [DONE]\n\n"
