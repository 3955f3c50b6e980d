"""The OpenAI Responses API (``/v1/responses``), as ``client.responses.create`` and the OpenAI
Agents SDK call it: ``input`` items and ``instructions`` become chat messages, function tools
chat tools; the answer becomes a ``Response`` (reasoning, message and ``function_call`` items)
or its SSE events, sequence-numbered as the service sends them. ``previous_response_id``
continues a conversation the session holds (each response's conversation, kept by reference in
``Session.dialect`` until the session ends); ``store: false`` keeps none."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

from agentcore_rl.gateway.dialects.chat import error_body
from agentcore_rl.gateway.dialects.codec import (
    BlockEncoder,
    Dialect,
    Encoder,
    Headers,
    Route,
    chat_call,
    chunks_of,
    invalid,
    need,
    sse,
    stream_usage,
    tokens,
)
from agentcore_rl.gateway.jsonio import dumps
from agentcore_rl.gateway.sessions import Session

__all__ = ["RESPONSES_DIALECT", "ResponsesDialect"]

_KEPT: Final = "responses"  # the session's responses by id: the conversation each ended
_LOGPROBS: Final = "message.output_text.logprobs"
# Fields passed on under chat's name: sampling, and chat's own fields sent in ``extra_body``.
_PASSED: Final = {"max_output_tokens": "max_tokens"} | {
    k: k
    for k in (
        *("model", "temperature", "top_p", "seed", "stop", "top_k", "min_p"),
        *("presence_penalty", "frequency_penalty", "parallel_tool_calls"),
    )
}
# Refused unless empty or false: the service's own state and features.
_REFUSED: Final = ("background", "conversation", "prompt", "max_tool_calls", "context_management")
# What decoding reads, and what has no effect here (no hosted state, caching or tiers).
_FIELDS: Final = {
    *(*_PASSED, *_REFUSED, "input", "instructions", "tools", "tool_choice", "stream", "text"),
    *("previous_response_id", "include", "top_logprobs", "reasoning", "store", "metadata"),
    *("user", "safety_identifier", "service_tier", "truncation", "stream_options"),
    *("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"),
}
_DELTAS: Final = {
    "message": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "function_call": "response.function_call_arguments.delta",
}
_ITEMS: Final = {"reasoning": "reasoning", "text": "message"}  # the others: function calls
_TEXT_PARTS: Final = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of text parts (images and files refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            what = "images are not supported" if kind == "input_image" else "expected text parts"
            raise invalid(f"{where}[{j}] of type {kind!r}: {what}")
        texts.append(part["text"])
    return "".join(texts)


def _assistant(messages: list[dict[str, Any]], fresh: bool) -> dict[str, Any]:
    """The assistant message an output item belongs to: the last one, unless ``fresh``."""
    if fresh or not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant"})
    return messages[-1]


def _messages(items: Any, messages: list[dict[str, Any]]) -> None:
    """Append ``input``'s items as chat messages: one assistant message per response's items."""
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return
    if not isinstance(items, list):
        raise invalid("input must be a string or a list of items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role must be user, assistant, system or developer")
            text = _text(item.get("content"), f"{where}.content")
            if role != "assistant":
                messages.append(
                    {"role": "system" if role == "developer" else role, "content": text}
                )
                continue
            last = _assistant(messages, fresh=False)
            if "content" in last or "tool_calls" in last:  # a new answer, not its reasoning's
                last = _assistant(messages, fresh=True)
            last["content"] = text
        elif kind == "function_call":
            name, arguments, call_id = (item.get(k) for k in ("name", "arguments", "call_id"))
            if not all(isinstance(v, str) for v in (name, arguments, call_id)):
                raise invalid(f"{where}: a function_call needs string name, arguments, call_id")
            call = chat_call(str(call_id), str(name), str(arguments))
            _assistant(messages, fresh=False).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise invalid(f"{where}.call_id must be a string")
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            _assistant(messages, fresh=True)["reasoning_content"] = _text(parts, f"{where}.content")
        else:
            raise invalid(f"{where}.type {kind!r} is not supported (messages, function calls)")


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(need(tools, list, "tools")):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise invalid(f"tools[{i}].type {kind!r} is not supported: function tools only")
        need(tool.get("name"), str, f"tools[{i}].name")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid(f"tool_choice {str(choice)[:80]!r}: auto, none, required or a function")


class ResponsesDialect(Dialect):
    """``/v1/responses`` (see the module doc)."""

    name = "responses"

    def decode(self, body: dict[str, Any], route: Route, session: Session | None) -> dict[str, Any]:
        for key in body:
            if key not in _FIELDS or (key in _REFUSED and body[key]):
                raise invalid(f"{key} is not supported by the gateway's Responses API")
        reasoning = body.get("reasoning")
        if not isinstance(reasoning, dict | None):
            raise invalid("reasoning must be an object")
        if reasoning and any(v is not None for k, v in reasoning.items() if k != "summary"):
            raise invalid("reasoning: the model's reasoning effort cannot be set here")
        messages: list[dict[str, Any]] = []
        if body.get("instructions") is not None:
            messages.append(
                {"role": "system", "content": _text(body["instructions"], "instructions")}
            )
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise invalid("previous_response_id must be a string")
            kept = session.dialect.get(_KEPT, {}) if session is not None else {}
            if previous not in kept:
                raise invalid(
                    f"previous_response_id {str(previous)[:80]!r}: no such response in this session"
                )
            messages += kept[previous]
        _messages(body.get("input", []), messages)
        if not messages:
            raise invalid("input: the request has no input")
        chat: dict[str, Any] = {"messages": messages}
        chat.update((to, body[key]) for key, to in _PASSED.items() if body.get(key) is not None)
        if body.get("tools"):
            chat["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if _LOGPROBS in need(body.get("include") or [], list, "include"):
            chat["logprobs"] = True
            if body.get("top_logprobs"):
                chat["top_logprobs"] = body["top_logprobs"]
        text = body.get("text")
        form = text.get("format") if isinstance(text, dict) else None
        form = form if isinstance(form, dict) else {"type": form}
        kind = form.get("type")
        if kind == "json_schema":
            schema = {k: v for k, v in form.items() if k != "type"}
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif kind == "json_object":
            chat["response_format"] = {"type": kind}
        elif kind not in (None, "text"):
            raise invalid("text.format must be text, json_schema or json_object")
        if body.get("stream"):
            stream_usage(chat)
        return chat

    def encoder(
        self, body: Mapping[str, Any], chat: Mapping[str, Any], session: Session
    ) -> Encoder:
        return _ResponseEncoder(body, chat, session)

    def error(
        self, status: int, message: str, kind: str, upstream: bytes | None
    ) -> tuple[bytes, Headers]:
        return error_body(status, message, kind), []


class _ResponseEncoder(BlockEncoder):
    """A ``Response`` from the chat answer; streamed, its events as the chat chunks come."""

    def __init__(self, body: Mapping[str, Any], chat: Mapping[str, Any], session: Session) -> None:
        super().__init__()
        self.hex = uuid.uuid4().hex
        self.body, self.session = body, session
        self.history = chat["messages"][1 if body.get("instructions") is not None else 0 :]
        text = body.get("text")
        text = text if isinstance(text, dict) else {}
        self.response: dict[str, Any] = {
            "id": "resp_" + self.hex,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "model": chat.get("model", ""),
            "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "store": body.get("store", True),
            "temperature": body.get("temperature"),
            "text": {"format": {"type": "text"}, **text},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "usage": None,
        }
        self.output: list[dict[str, Any]] = self.response["output"]
        self.seq = 0  # the stream's next sequence number
        self.item: dict[str, Any] = {}  # the output item being streamed
        self.prefix = b""  # the streamed item's delta events up to the delta
        self.pieces: list[str] = []  # its text so far
        self.logprobs: list[Any] = []

    def _item(self, kind: str, **call: str) -> dict[str, Any]:
        """A new output item (``reasoning``, ``message``, ``function_call``) at the end; its
        text comes when it closes."""
        n = len(self.output)
        if kind == "reasoning":
            content = {"type": "reasoning_text", "text": ""}
            item = {"id": f"rs_{self.hex}_{n}", "type": kind, "summary": [], "content": [content]}
        elif kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {"id": f"msg_{self.hex}_{n}", "type": kind, "role": "assistant"}
            item["content"] = [part]
        else:
            item = {"id": f"fc_{self.hex}_{n}", "type": kind, **call, "arguments": ""}
        self.output.append(item)
        return item

    def whole(self, answer: dict[str, Any]) -> bytes:
        # the answer as its one-chunk stream: the same items, the events unsent
        for chunk in chunks_of(answer):
            self.chunk(chunk)
        self.end()
        return dumps(self.response)

    def _complete(self, model: Any, finish: str | None, usage: Any) -> None:
        """Finish the response (status, usage, its items' status) and keep its conversation."""
        response = self.response
        if model:
            response["model"] = model
        status = "incomplete" if finish == "length" else "completed"
        response["status"] = status
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        for item in self.output:
            item["status"] = status
        if isinstance(usage, dict):
            prompt, completion = tokens(usage)
            response["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }
        if self.body.get("store") is not False:
            answered: list[dict[str, Any]] = []
            _messages(self.output, answered)
            kept = self.session.dialect.setdefault(_KEPT, {})
            kept[response["id"]] = [*self.history, *answered]

    # ------------------------------------------------------------------ stream
    def _event(self, kind: str, **fields: Any) -> bytes:
        fields["type"], fields["sequence_number"] = kind, self.seq
        self.seq += 1
        return sse(kind, fields)

    def begin(self, chunk: Mapping[str, Any]) -> bytes:
        self.response["model"] = chunk.get("model") or self.response["model"]
        created = self._event("response.created", response=self.response)
        return created + self._event("response.in_progress", response=self.response)

    def open(self, kind: str | int, call: Mapping[str, Any] | None) -> bytes:
        """Start an item (and its content part). Its deltas are written from a prefix made
        here: a token's event costs one string's dump."""
        named = {}
        if call is not None:
            function = call.get("function") or {}
            named = {"call_id": call.get("id") or "", "name": function.get("name") or ""}
        name = _ITEMS.get(kind, "function_call") if isinstance(kind, str) else "function_call"
        item = self.item = self._item(name, **named)
        self.pieces, self.logprobs = [], []
        at = {"output_index": len(self.output) - 1, "item_id": item["id"]}
        added = {**item, "status": "in_progress"}
        if name != "function_call":
            added["content"] = []
        out = self._event("response.output_item.added", output_index=at["output_index"], item=added)
        if name != "function_call":
            at["content_index"] = 0
            part = dict(item["content"][0])
            out += self._event("response.content_part.added", **at, part=part)
        delta = _DELTAS[name]
        head = dumps({"type": delta, **at})[:-1]
        self.prefix = b"event: " + delta.encode() + b"\ndata: " + head + b',"delta":'
        return out

    def piece(self, kind: str | int, text: str, choice: Mapping[str, Any]) -> bytes:
        self.pieces.append(text)
        tail = b""
        if kind == "text":
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            self.logprobs += logprobs
            tail = b',"logprobs":' + dumps(logprobs)
        number = str(self.seq).encode()
        self.seq += 1
        return self.prefix + dumps(text) + tail + b',"sequence_number":' + number + b"}\n\n"

    def close(self) -> bytes:
        """The events that finish the item being streamed."""
        item = self.item
        at = {"output_index": len(self.output) - 1, "item_id": item["id"]}
        item["status"] = "incomplete" if self.finish == "length" else "completed"
        text = "".join(self.pieces)
        if item["type"] == "function_call":
            item["arguments"] = text
            out = self._event("response.function_call_arguments.done", **at, arguments=text)
        else:
            part = item["content"][0]
            part["text"], at["content_index"] = text, 0
            if item["type"] == "message":
                part["logprobs"] = self.logprobs
                out = self._event(
                    "response.output_text.done", **at, text=text, logprobs=self.logprobs
                )
            else:
                out = self._event("response.reasoning_text.done", **at, text=text)
            out += self._event("response.content_part.done", **at, part=part)
        return out + self._event(
            "response.output_item.done", output_index=at["output_index"], item=item
        )

    def end(self) -> bytes:
        out = self.wind_up()
        if not self.calls and all(item["type"] != "message" for item in self.output):
            out += self._enter("text") + self.wind_up()  # a turn has its message
        self._complete(None, self.finish, self.usage)
        done = self.response["status"] == "completed"
        kind = "response.completed" if done else "response.incomplete"
        return out + self._event(kind, response=self.response)

    def fail(self, status: int, message: str, kind: str) -> bytes:
        self.response["status"] = "failed"
        self.response["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", response=self.response)


RESPONSES_DIALECT: Final = ResponsesDialect()
