"""The gateway's rendering mode (``--history linear``): the template renders (:mod:`.template`),
the history stays linear (:mod:`.linear`), the server is called token-in (:mod:`..backends`)
and the parsers (:mod:`.parsers`) make the answer. See docs/gateway.md."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from contextlib import aclosing
from typing import Any, Final

from starlette.types import Send

from agentcore_rl.edge import Refusal
from agentcore_rl.errors import GatewayInputError
from agentcore_rl.gateway.backends import Backend, Served, backend_named
from agentcore_rl.gateway.call import Call
from agentcore_rl.gateway.render.linear import LinearHistory
from agentcore_rl.gateway.render.parsers import (
    parse_completion,
    reasoning_parser_named,
    tool_parser_named,
)
from agentcore_rl.gateway.render.template import ChatTemplate
from agentcore_rl.trace import Completion, ids_array, logprob_array

__all__ = ["RenderMode"]

log = logging.getLogger("agentcore_rl.gateway")


class RenderMode:
    """Rendering with linear history, for :class:`~agentcore_rl.gateway.RolloutGateway`.

    ``tool_call_parser``/``reasoning_parser``: vLLM's names; ``forks`` counts the requests
    rendered afresh in a session that had turns.

    Example::

        mode = RenderMode.load(directory, tool_call_parser="llama3_json")
    """

    def __init__(
        self,
        template: ChatTemplate,
        *,
        backend: str = "vllm",
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        self.template = template
        self.backend = backend_named(backend)
        self.tools = tool_parser_named(tool_call_parser)
        self.reasoning = reasoning_parser_named(reasoning_parser)
        self.parser_names = (tool_call_parser, reasoning_parser)
        self.stop_ids = template.stop_ids()
        self.forks = 0

    def __repr__(self) -> str:
        return (
            f"RenderMode({self.template.source!r}, backend={self.backend.name!r}, "
            f"tools={self.parser_names[0]!r}, reasoning={self.parser_names[1]!r})"
        )

    @classmethod
    def load(cls, directory: str | os.PathLike[str], **options: Any) -> RenderMode:
        """A rendering mode on the tokenizer directory ``directory`` (see the class doc)."""
        return cls(ChatTemplate.load(directory), **options)

    async def serve(self, call: Call, send: Send) -> None:
        """Serve one chat call token-in; commit its record before the answer's last byte."""
        body, record = call.body, call.record
        if call.session.render is None:
            call.session.render = LinearHistory()
        history: LinearHistory = call.session.render
        messages, tools, kwargs = self._conversation(body)
        try:  # every field forwarded or refused before any work; a template that refuses
            _check(self.backend, body, self.stop_ids)
            plan = history.plan(self.template, messages, tools=tools, kwargs=kwargs)
        except GatewayInputError as exc:  # RenderError included
            raise Refusal(400, str(exc), "invalid_request") from None
        if plan.fork is not None:
            self.forks += 1
            log.info("session %s forks: %s", call.session.session_id, plan.fork)
        record.prompt_ids = prompt = plan.prompt_ids
        served = await self._generate(call, prompt.tolist())
        ids = served.token_ids
        stopped = bool(ids) and ids[-1] in self.stop_ids
        shown = ids[:-1] if stopped else ids
        text, cut = self._text(shown, served, body)
        completion = ids_array(ids)
        # the answer's and its calls' ids: one call of one session, whatever its length
        which = f"{call.session.session_id}:{record.index}:".encode() + completion.tobytes()
        seed = hashlib.sha256(which).hexdigest()[:16]
        message = parse_completion(text, self.reasoning, self.tools, seed)
        finish = served.finish_reason or "stop"
        if message.get("tool_calls"):
            finish = "tool_calls"
        # A turn cut off (length, a stop string) is closed in the history as the template
        # closes a turn, so the next request extends it (linear.py).
        history.remember(plan, message, prompt, completion, stopped=stopped)
        record.completions = [
            Completion(
                *(0, completion, logprob_array(served.logprobs), finish),
                stop_string=cut,
                versions=call.versions.recorded(),
            )
        ]
        record.usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        logprobs = self._logprobs(shown, served, body) if body.get("logprobs") else None
        answer = {
            "id": f"chatcmpl-{seed}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                    "stop_reason": cut or served.stop_reason,  # vLLM's: the stop string
                }
            ],
            "usage": record.usage,
        }
        await call.answer(send, answer)

    def _text(
        self, ids: list[int], served: Served, body: Mapping[str, Any]
    ) -> tuple[str, str | None]:
        """The text as the server's chat endpoint gives it; -> (text, the stop string that cut
        it when the cut falls inside the served ids' text). The server names the stop string
        it stopped on, found where it looked: ending past the first ``min_tokens`` tokens."""
        text = self.template.decode(ids)
        stop = served.stop_reason
        if not stop:
            return text, None
        least = int(body.get("min_tokens") or 0)
        start = len(self.template.decode(ids[:least])) - len(stop) + 1 if least else 0
        at = text.find(stop, max(start, 0))
        if at < 0:
            return text, None
        end = at + len(stop) if body.get("include_stop_str_in_output") else at
        return text[:end], stop if end < len(text) else None

    def _logprobs(self, ids: list[int], served: Served, body: Mapping[str, Any]) -> Any:
        top = body.get("top_logprobs") or 0
        tokens = served.tokens if len(served.tokens or ()) >= len(ids) else None
        tops = served.top or []
        content = []
        for n, logprob in enumerate(served.logprobs[: len(ids)]):
            token = str(tokens[n]) if tokens else self.template.decode([ids[n]])
            row = (tops[n] if n < len(tops) else None) or {}
            alternatives = sorted(row.items(), key=lambda kv: -kv[1])
            content.append(
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode())}
                        for t, lp in alternatives[:top]
                    ],
                }
            )
        return {"content": content}

    async def _generate(self, call: Call, prompt_ids: list[int]) -> Served:
        """The completion of ``prompt_ids``, token-in, through the backend's exchange (a
        ``suspend`` cuts it, the resume continues it; ``call.versions`` marks each span)."""
        whole = Served(prompt_ids, [], [], None, tokens=[], top=[])
        pieces = self.backend.generate(
            call.gate, call.upstream, call.versions, prompt_ids, call.body
        )
        async with aclosing(pieces):
            async for piece in pieces:
                whole.extend(piece)
        return whole

    @staticmethod
    def _conversation(body: Mapping[str, Any]) -> tuple[list[Any], list[Any] | None, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Refusal(400, "messages must be a non-empty list", "invalid_request")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise Refusal(400, "every message must be an object with a role", "invalid_request")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise Refusal(400, "tools must be a list", "invalid_request")
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise Refusal(400, "chat_template_kwargs must be an object", "invalid_request")
        return messages, tools or None, kwargs


# The chat request's fields linear mode serves itself: the conversation, the answer's form,
# the budget, bookkeeping.
_OWN: Final = frozenset[str]().union(
    ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"),
    ("stream", "stream_options", "n", "logprobs", "top_logprobs"),
    ("max_tokens", "max_completion_tokens", "stop_token_ids"),
    ("model", "user", "metadata", "store"),
)


def _check(backend: Backend, body: dict[str, Any], stop_ids: Iterable[int]) -> None:
    """Refuse (``GatewayInputError``) a request linear mode cannot serve as asked through
    ``backend``, before any work; ``stop_token_ids`` become the agent's and ``stop_ids``."""
    for name in body:
        if name not in _OWN and name not in backend.fields:
            raise GatewayInputError(
                f"linear history cannot forward {name!r} to {backend.name} (it forwards "
                f"{', '.join(sorted(backend.fields))})"
            )
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise GatewayInputError("linear history serves tool_choice 'auto' (or 'none') only")
    if body.get("n", 1) not in (1, None):
        raise GatewayInputError("linear history follows one choice: n must be 1")
    top = body.get("top_logprobs")
    if body.get("logprobs") and top is not None and (type(top) is not int or not 0 <= top <= 20):
        raise GatewayInputError("top_logprobs must be an integer in 0..20")
    extra = body.get("stop_token_ids") or []
    if not isinstance(extra, list) or not all(type(i) is int for i in extra):
        raise GatewayInputError("stop_token_ids must be a list of token ids")
    body["stop_token_ids"] = sorted({*stop_ids, *extra})
