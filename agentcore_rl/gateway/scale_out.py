"""Proxy mode on a vLLM that serves its scale-out routes (``--enable-scale-out``, vLLM >= 0.32):
vLLM renders the chat request (``/chat/completions/render``: the ids its chat route would feed),
the gateway generates from them token-in (:meth:`.backends.Backend.generate`, linear mode's
exchange: a suspend aborts it and the resume continues it, each token's version from vLLM's own
spans) and vLLM makes the answer (``/chat/completions/derender``: text, tool calls and reasoning
parsed as its chat route would), a stream's pieces as they arrive (see :func:`_stream`).
docs/gateway.md, "Weight-sync recipe"."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from starlette.types import Send

from agentcore_rl.edge import Refusal
from agentcore_rl.gateway.backends import Backend, Served, passed_on
from agentcore_rl.gateway.call import Call, down_message
from agentcore_rl.gateway.jsonio import dumps, loads
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool
from agentcore_rl.trace import Completion, ids_array, logprob_array

__all__ = ["render", "serve"]

log = logging.getLogger("agentcore_rl.gateway")


async def render(call: Call, backend: Backend) -> dict[str, Any] | None:
    """vLLM's rendering of ``call`` (a generate request); None where the upstream lacks the
    route (learnt on its first call, said once in the log; ``backend.sources`` keeps it)."""
    pool = call.upstream
    status, content = await pool.fetch(pool.target("/chat/completions/render"), dumps(call.body))
    if status in (403, 404, 405):
        if backend.sources.get(pool.base) != "gateway":
            backend.sources[pool.base] = "gateway"
            log.warning(
                "%s answered HTTP %d on /v1/chat/completions/render (vLLM >= 0.32 has it when "
                "started with --enable-scale-out): proxy mode calls its chat route there, each "
                "token's version the gateway's own (docs/gateway.md, Weight-sync recipe)",
                pool.base,
                status,
            )
        return None
    if status != 200:
        raise passed_on(status, content)
    backend.sources[pool.base] = "upstream"
    rendered = _parsed(content, "render")
    if not isinstance(rendered.get("token_ids"), list) or "sampling_params" not in rendered:
        raise Refusal(502, "the upstream rendered no generate request", "upstream_invalid")
    return rendered


async def serve(call: Call, send: Send, backend: Backend, rendered: dict[str, Any]) -> None:
    """Generate ``rendered`` (vLLM's rendering of ``call``) token-in and answer with vLLM's
    derendering, the record's ids and logprobs those vLLM fed and sampled."""
    prompt: list[int] = rendered["token_ids"]
    chat = _context(call.body)
    call.record.prompt_ids = ids_array(prompt)
    include = bool(rendered["sampling_params"].get("include_stop_str_in_output"))
    pieces = backend.generate(
        call.gate, call.upstream, call.versions, prompt, {}, rendered=rendered
    )
    whole = Served(prompt, [], [], None, entries=[])
    head = {"model": call.body.get("model"), "prompt_token_ids": prompt, "chat_request": chat}
    head["prompt_tokens"] = len(prompt)
    keep = bool(call.body.get("logprobs"))
    rid = str(rendered.get("request_id") or "chatcmpl")
    if not call.stream:
        async with aclosing(pieces):
            async for piece in pieces:
                whole.extend(piece)
        sent = _sent(rid, whole, include)
        alone = not sent["choices"][0]["token_ids"]  # the stop token alone: an empty answer
        if alone:  # vLLM derenders no answer without ids
            sent = _sent(rid, whole, True)
        answer = await _derender(call.upstream, {**head, "generate_response": sent})
        choice = answer["choices"][0]
        choice["logprobs"] = {"content": whole.entries} if keep else None
        if alone:
            choice["message"]["content"] = ""
        _cut(choice.get("message") or {}, whole.stop_reason, include)
        _fill(call, whole, choice.get("finish_reason"))
        answer["usage"] = call.record.usage
        await call.answer(send, answer)
        return
    await _stream(call, send, pieces, whole, rid, head, keep, include)


async def _stream(
    call: Call,
    send: Send,
    pieces: AsyncGenerator[Served, None],
    whole: Served,
    rid: str,
    head: dict[str, Any],
    keep: bool,
    include: bool,
) -> None:
    """Answer a streamed call: its pieces derendered (with the state vLLM hands back) and sent
    as they come, in batches of at least the square root of the tokens so far (vLLM's parser
    replays the whole answer on each derender call: a stream costs it work linear in its
    length, not quadratic); after the headers, a failure ends the stream with an error event."""
    encoder, state, started, finish = call.encoder, None, False, None
    batch = Served(None, [], [], None, entries=[])
    try:
        async with aclosing(pieces):
            async for piece in pieces:
                whole.extend(piece)
                batch.extend(piece)
                if batch.finish_reason is None and len(batch.token_ids) ** 2 < len(whole.token_ids):
                    continue
                piece, batch = batch, Served(None, [], [], None, entries=[])
                sent = _sent(rid, piece, include)
                body = {**head, "stream": True, "generate_chunk": sent, "stream_state": state}
                answer = await _derender(call.upstream, body)
                state, chunk = answer["stream_state"], answer["chunk"]
                for choice in chunk.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                    choice["logprobs"] = {"content": piece.entries} if keep else None
                out = encoder.chunk(chunk)
                if not started:
                    headers = encoder.stream_headers
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    started = True
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except (Refusal, UpstreamError) as exc:
        if not started:
            raise
        if isinstance(exc, UpstreamError):
            message, kind = down_message(call.upstream.base, exc), "upstream_unavailable"
        else:
            message, kind = exc.message, exc.kind
        call.commit(502, message)
        await send({"type": "http.response.body", "body": encoder.fail(502, message, kind)})
        return
    _fill(call, whole, finish)
    usage = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time())}
    usage.update(model=call.body.get("model") or "", choices=[], usage=call.record.usage)
    call.commit(200)  # before the last byte: an envelope never overtakes its last record
    tail = encoder.chunk(usage) + encoder.end()
    if not started:
        headers = encoder.stream_headers
        await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": tail})


def _context(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request as derendering reads it: its tools, choices and template arguments,
    and of the conversation only the tool calls made (a parser numbers its calls after them)."""
    calls = [
        m
        for m in body.get("messages") or ()
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
    ]
    return {**body, "messages": calls}


def _sent(rid: str, served: Served, include: bool) -> dict[str, Any]:
    """``served`` as a generate answer (or chunk) for derendering: a stop token that ended it
    left out of the text unless asked for, as vLLM's chat route leaves it out (its logprob
    stays in the answer, as there). The logprobs the agent asked for are vLLM's own entries
    (generated with their texts), not derendered: a parser's stream derenders none."""
    ids = served.token_ids
    stopped = served.finish_reason == "stop" and not isinstance(served.stop_reason, str)
    if stopped and not include and ids:
        ids = ids[:-1]
    choice = {
        "index": 0,
        "token_ids": ids,
        "finish_reason": served.finish_reason,
        "stop_reason": served.stop_reason,
    }
    return {"request_id": rid, "choices": [choice]}


def _cut(message: dict[str, Any], stop: Any, include: bool) -> None:
    """Cut a whole answer's text at the stop string that ended it, as vLLM's chat route does."""
    content = message.get("content")
    if isinstance(stop, str) and stop and isinstance(content, str):
        at = content.rfind(stop)
        if at >= 0:
            message["content"] = content[: at + len(stop) if include else at]


def _fill(call: Call, whole: Served, finish: Any) -> None:
    """The record's completion: every id vLLM sampled, its logprob and its version."""
    record, ids = call.record, whole.token_ids
    stop = whole.stop_reason if isinstance(whole.stop_reason, str) else None
    record.completions = [
        Completion(
            *(0, ids_array(ids), logprob_array(whole.logprobs), finish or whole.finish_reason),
            stop_string=stop,
            versions=call.versions.recorded(),
        )
    ]
    prompt = len(record.prompt_ids) if record.prompt_ids is not None else 0
    record.usage = {
        "prompt_tokens": prompt,
        "completion_tokens": len(ids),
        "total_tokens": prompt + len(ids),
    }


async def _derender(pool: UpstreamPool, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's answer (``choices``) or stream chunk (``chunk``, ``stream_state``) for ``body``."""
    status, content = await pool.fetch(pool.target("/chat/completions/derender"), dumps(body))
    if status != 200:
        raise passed_on(status, content)
    data = _parsed(content, "derender")
    part = data.get("chunk") if body.get("stream") else (data.get("choices") or [None])[0]
    if not isinstance(part, dict) or not isinstance(part.get("message", {}), dict):
        raise Refusal(502, "the upstream derendered no answer", "upstream_invalid")
    return data


def _parsed(content: bytes, route: str) -> dict[str, Any]:
    try:
        data = loads(content)
    except ValueError as exc:
        raise Refusal(
            502, f"the upstream's {route} is not JSON: {exc}", "upstream_invalid"
        ) from None
    if not isinstance(data, dict):
        raise Refusal(502, f"the upstream's {route} is not an object", "upstream_invalid")
    return data
