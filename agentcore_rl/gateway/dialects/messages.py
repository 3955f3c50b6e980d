"""Anthropic Messages (``POST /v1/messages``: the ``anthropic`` SDK's ``messages.create`` and
``messages.stream``). A request's ``system``, its turns' content blocks (text, ``tool_use``,
``tool_result``, ``thinking``) and its tools become a chat request; the chat answer becomes a
``message`` (thinking, text and ``tool_use`` blocks, ``stop_reason``, ``usage``) or the SSE
events the SDK's stream accumulator reads (``message_start``, ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta``, ``message_stop``), each under its ``event:`` line.

Example::

    client = Anthropic(base_url=f"{gateway}/sessions/{sid}", api_key="unused")
    client.messages.create(model="policy", max_tokens=512, messages=[...], tools=[...])
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from agentcore_rl.gateway.dialects.codec import (
    BlockEncoder,
    Dialect,
    Encoder,
    Headers,
    Route,
    assistant,
    chat_call,
    chat_tool,
    first_choice,
    invalid,
    need,
    reasoning,
    sse,
    stream_usage,
    tokens,
    tool_input,
)
from agentcore_rl.gateway.jsonio import dumps
from agentcore_rl.gateway.sessions import Session

__all__ = ["MESSAGES_DIALECT", "MessagesDialect"]

_SAMPLING: Final = ("temperature", "top_p", "top_k")
# Read and not served: who calls, its service tier, its thinking budget (whether and how long
# the policy reasons is its chat template's and max_tokens' to decide)
_IGNORED: Final = ("metadata", "service_tier", "thinking")
_FIELDS: Final = frozenset(
    ("model", "messages", "max_tokens", "system", "tools", "tool_choice", "stop_sequences")
).union(("stream", *_SAMPLING, *_IGNORED))
_CHOICES: Final = {"auto": "auto", "any": "required", "none": "none"}
_STOPS: Final = {"length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ERRORS: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
# Content blocks by the turn that may hold them (documents, images... are refused by name).
_USER: Final = ("text", "tool_result")
_ASSISTANT: Final = ("text", "thinking", "redacted_thinking", "tool_use")


def _string(block: Mapping[str, Any], key: str, at: str) -> str:
    value: str = need(block.get(key), str, f"{at}.{key}")
    return value


def _blocks(content: Any, at: str, kinds: tuple[str, ...]) -> list[tuple[str, str, Any]]:
    """The content blocks of ``content`` (a list) -> (type, where, block), each type one of
    ``kinds``."""
    if not isinstance(content, list):
        raise invalid(f"{at}: must be a string or a list of content blocks")
    out = []
    for j, block in enumerate(content):
        where = f"{at}.{j}"
        if not isinstance(block, dict):
            raise invalid(f"{where}: must be a content block (an object with a type)")
        kind = block.get("type")
        if kind not in kinds:
            raise invalid(
                f"{where}.type: {kind!r} blocks are not supported here (this turn takes "
                f"{', '.join(k for k in kinds if k != 'redacted_thinking')} blocks)"
            )
        out.append((kind, where, block))
    return out


def _text(content: Any, at: str) -> str:
    """A string, or text blocks joined by newlines (``system``, a tool's result)."""
    if isinstance(content, str):
        return content
    return "\n".join(_string(b, "text", where) for _, where, b in _blocks(content, at, ("text",)))


def _user(content: Any, at: str) -> list[dict[str, Any]]:
    """A user turn: a tool message per ``tool_result``, in order, then the text."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out, texts = [], []
    for kind, where, block in _blocks(content, at, _USER):
        if kind == "text":
            texts.append(_string(block, "text", where))
        else:
            result = _text(block.get("content", ""), where + ".content")
            call = _string(block, "tool_use_id", where)
            out.append({"role": "tool", "tool_call_id": call, "content": result})
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: Any, at: str) -> dict[str, Any]:
    """An assistant turn: its text, ``thinking`` as ``reasoning_content``, ``tool_use`` blocks
    as tool calls (arguments as a JSON string, as chat has them)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, thoughts, calls = [], [], []
    for kind, where, block in _blocks(content, at, _ASSISTANT):
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thoughts.append(_string(block, "thinking", where))
        elif kind == "tool_use":
            arguments = need(block.get("input", {}), dict, f"{where}.input")
            # json's spacing, as the gateway's tool-call parsers write a call's arguments
            name = _string(block, "name", where)
            calls.append(chat_call(_string(block, "id", where), name, json.dumps(arguments)))
    return assistant(texts, thoughts, calls)


def _tool(tool: Any, at: str) -> dict[str, Any]:
    """A client tool (``name``, ``description``, ``input_schema``) as a chat function tool."""
    need(tool, dict, at)
    if tool.get("type", "custom") not in ("custom", None):
        raise invalid(f"{at}.type: server tool {tool.get('type')!r} is not supported")
    schema = need(tool.get("input_schema"), dict, f"{at}.input_schema")
    return chat_tool(_string(tool, "name", at), tool.get("description"), schema)


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        chat["tool_choice"] = {
            "type": "function",
            "function": {"name": _string(choice, "name", "tool_choice")},
        }
    elif kind in _CHOICES:
        chat["tool_choice"] = _CHOICES[kind]
    else:
        raise invalid("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _conversation(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages: ``system`` first, then each turn's (``system`` turns too)."""
    out = []
    system = _text(body.get("system") or "", "system")
    if system:
        out.append({"role": "system", "content": system})
    for i, turn in enumerate(need(body["messages"], list, "messages")):
        at = f"messages.{i}"
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ("user", "assistant", "system"):
            raise invalid(f"{at}.role: must be 'user', 'assistant' or 'system'")
        content = turn.get("content")
        if role == "user":
            out += _user(content, at + ".content")
        elif role == "assistant":
            out.append(_assistant(content, at + ".content"))
        else:
            out.append({"role": "system", "content": _text(content, at + ".content")})
    return out


_DELTA: Final = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
    b'"delta":{"type":"%s":%s}}\n\n'
)
_PIECES: Final = {"reasoning": b'thinking_delta","thinking', "text": b'text_delta","text'}


class _MessageEncoder(BlockEncoder):
    """One answer as a ``message``, or its events: content blocks open as the chat deltas
    change kind (thinking, text, each tool call), the stop and usage come at the end."""

    def _ending(self, calls: bool) -> dict[str, Any]:
        if calls and self.finish != "length":  # a named tool_choice finishes "stop"
            return {"stop_reason": "tool_use", "stop_sequence": None}
        if self.finish == "stop" and isinstance(self.stop, str):
            return {"stop_reason": "stop_sequence", "stop_sequence": self.stop}
        return {"stop_reason": _STOPS.get(self.finish or "", "end_turn"), "stop_sequence": None}

    def _usage(self) -> dict[str, int]:
        prompt, completion = tokens(self.usage)
        return {"input_tokens": prompt, "output_tokens": completion}

    @staticmethod
    def _head(answer: Mapping[str, Any]) -> dict[str, Any]:
        name = str(answer.get("id") or "")
        return {
            "id": "msg_" + name.removeprefix("chatcmpl-"),
            "type": "message",
            "role": "assistant",
            "model": answer.get("model") or "",
        }

    def whole(self, answer: dict[str, Any]) -> bytes:
        choice, message = first_choice(answer)
        content: list[dict[str, Any]] = []
        thought = reasoning(message)
        if thought:
            content.append({"type": "thinking", "thinking": thought, "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = tool_input(function.get("arguments"))
            use = {"type": "tool_use", "id": call.get("id"), "name": function.get("name")}
            content.append({**use, "input": arguments})
        self.finish, self.stop = choice.get("finish_reason"), choice.get("stop_reason")
        self.usage = answer.get("usage")
        ending, usage = self._ending(bool(message.get("tool_calls"))), self._usage()
        return dumps({**self._head(answer), "content": content, **ending, "usage": usage})

    def begin(self, chunk: Mapping[str, Any]) -> bytes:
        # The input tokens are known at the end (the usage chunk): message_delta's usage,
        # which the SDK's accumulator takes over message_start's.
        usage = {"input_tokens": 0, "output_tokens": 0}
        message = {**self._head(chunk), "content": [], "stop_reason": None, "stop_sequence": None}
        return sse(
            "message_start", {"type": "message_start", "message": {**message, "usage": usage}}
        )

    def open(self, kind: str | int, call: Mapping[str, Any] | None) -> bytes:
        if kind == "reasoning":
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            block = {"type": "text", "text": ""}
        else:
            name = ((call or {}).get("function") or {}).get("name")
            block = {"type": "tool_use", "id": (call or {}).get("id"), "name": name, "input": {}}
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return sse("content_block_start", start)

    def piece(self, kind: str | int, text: str, choice: Mapping[str, Any]) -> bytes:
        # written from a template, as a stream's deltas are most of its work
        name = _PIECES[kind] if isinstance(kind, str) else b'input_json_delta","partial_json'
        return _DELTA % (self.index, name, dumps(text))

    def close(self) -> bytes:
        return sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def end(self) -> bytes:
        out = self.wind_up()
        event = {"type": "message_delta", "delta": self._ending(bool(self.calls))}
        out += sse("message_delta", {**event, "usage": self._usage()})
        return out + sse("message_stop", {"type": "message_stop"})

    def fail(self, status: int, message: str, kind: str) -> bytes:
        return b"event: error\ndata: " + _error_body(status, message) + b"\n\n"


def _error_body(status: int, message: str) -> bytes:
    kind = _ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return dumps({"type": "error", "error": {"type": kind, "message": message}})


class MessagesDialect(Dialect):
    """``/v1/messages`` (see the module doc)."""

    name = "messages"

    def decode(self, body: dict[str, Any], route: Route, session: Session | None) -> dict[str, Any]:
        for name in body:
            if name not in _FIELDS:
                raise invalid(f"{name}: Extra inputs are not permitted")
        for name in ("model", "max_tokens", "messages"):  # the API requires all three
            if name not in body:
                raise invalid(f"{name}: Field required")
        if not isinstance(body["model"], str):
            raise invalid("model: must be a string")
        tokens = body["max_tokens"]
        if type(tokens) is not int or tokens < 1:
            raise invalid("max_tokens: must be an integer of at least 1")
        chat: dict[str, Any] = {"model": body["model"], "messages": _conversation(body)}
        chat["max_tokens"] = tokens
        chat.update((name, body[name]) for name in _SAMPLING if name in body)
        stops = body.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise invalid("stop_sequences: must be a list of strings")
            chat["stop"] = stops
        if body.get("tools") is not None:
            tools = need(body["tools"], list, "tools")
            chat["tools"] = [_tool(tool, f"tools.{i}") for i, tool in enumerate(tools)]
        if body.get("tool_choice") is not None:
            _tool_choice(body["tool_choice"], chat)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise invalid("stream: must be a boolean")
        if stream:  # the usage chunk: message_delta's usage
            stream_usage(chat)
        return chat

    def encoder(
        self, body: Mapping[str, Any], chat: Mapping[str, Any], session: Session
    ) -> Encoder:
        return _MessageEncoder()

    def error(
        self, status: int, message: str, kind: str, upstream: bytes | None
    ) -> tuple[bytes, Headers]:
        return _error_body(status, message), []


MESSAGES_DIALECT: Final = MessagesDialect()
