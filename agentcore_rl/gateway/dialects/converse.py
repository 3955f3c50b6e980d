"""Bedrock Converse (``model/{modelId}/converse`` and ``converse-stream``), as boto3's
``bedrock-runtime`` client and Strands' ``BedrockModel`` call it: content blocks to chat
messages and tools, the chat answer to Converse's JSON, or its stream to the AWS event-stream
binary framing botocore reads (``botocore/eventstream.py``; shapes from the ``bedrock-runtime``
service model). Errors carry ``x-amzn-errortype`` so botocore raises its typed exception."""

from __future__ import annotations

import functools
import json
import struct
import time
import zlib
from collections.abc import Mapping
from typing import Any, Final

from agentcore_rl.gateway.dialects.codec import (
    JSON_TYPE,
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
    stream_usage,
    tokens,
    tool_input,
)
from agentcore_rl.gateway.jsonio import dumps
from agentcore_rl.gateway.sessions import Session

__all__ = ["CONVERSE_DIALECT", "ConverseDialect", "event_message"]

# The request's fields; request tags, a latency tier and a service tier are accepted without
# effect on the answer.
_KNOWN: Final = {
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "additionalModelRequestFields",
    "requestMetadata",
    "performanceConfig",
    "serviceTier",
}
_SAMPLING: Final = {
    "maxTokens": "max_tokens",
    "temperature": "temperature",
    "topP": "top_p",
    "stopSequences": "stop",
}
_STOP: Final = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filtered",
}
# A status's exception as bedrock-runtime names it (the service model's error shapes; other
# 4xx: ValidationException, 5xx: InternalServerException), and in a stream's exception event
# (ConverseStreamOutput's members).
_ERRORS: Final = {
    403: "AccessDenied",
    404: "ResourceNotFound",
    408: "ModelTimeout",
    429: "Throttling",
    502: "ModelError",
    503: "ServiceUnavailable",
}
_STREAM_ERRORS: Final = {
    400: "validation",
    429: "throttling",
    502: "modelStreamError",
    503: "serviceUnavailable",
}
_MEDIA: Final = ("image", "document", "video", "audio")


_LENGTHS: Final = struct.Struct("!II")
_CRC: Final = struct.Struct("!I")


def _header(name: str, value: str) -> bytes:
    raw_name, raw = name.encode(), value.encode()
    return struct.pack("!B", len(raw_name)) + raw_name + struct.pack("!BH", 7, len(raw)) + raw


def event_message(headers: bytes, payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (total and headers length, their CRC32), the
    headers, the payload, the CRC32 of all before it.

    Written here because the format is small and fixed, and no pure-Python encoder installs
    on this Python: ``smithy-aws-event-stream`` needs Python 3.12 or later, ``awscrt`` is a
    large native build; botocore has only the decoder. The tests read it with botocore's.

    Example::

        event_message(_header(":event-type", "messageStop"), b'{"stopReason":"end_turn"}')
    """
    head, crc = _head(headers, len(payload))
    return head + payload + _CRC.pack(zlib.crc32(payload, crc))


@functools.lru_cache(maxsize=4096)
def _head(headers: bytes, length: int) -> tuple[bytes, int]:
    """A message's bytes before a payload of ``length`` bytes, and their CRC32: the same for
    every such payload (a stream's deltas are mostly of a few lengths)."""
    prelude = _LENGTHS.pack(16 + len(headers) + length, len(headers))
    head = prelude + _CRC.pack(zlib.crc32(prelude)) + headers
    return head, zlib.crc32(head)


_EVENT_HEADERS: Final = {
    kind: _header(":event-type", kind)
    + _header(":content-type", "application/json")
    + _header(":message-type", "event")
    for kind in (
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    )
}


# A delta's JSON before and after its value (then the block's index), by the block's kind.
_PIECES: Final = {
    "text": (b'{"delta":{"text":', b""),
    "reasoning": (b'{"delta":{"reasoningContent":{"text":', b"}"),
    "call": (b'{"delta":{"toolUse":{"input":', b"}"),
}


def _event(kind: str, payload: Mapping[str, Any]) -> bytes:
    return event_message(_EVENT_HEADERS[kind], dumps(payload))


def _usage(usage: Mapping[str, Any] | None) -> dict[str, int]:
    prompt, completion = tokens(usage)
    return {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}


class _ConverseEncoder(BlockEncoder):
    headers: Headers = [JSON_TYPE]
    stream_headers: Headers = [(b"content-type", b"application/vnd.amazon.eventstream")]

    def __init__(self, stops: list[str]) -> None:
        super().__init__()
        self.stops = stops
        self.started = time.perf_counter()  # metrics.latencyMs: from the call's decoding
        self.tail = b""  # a delta's JSON after its value, for the open block

    def _latency(self) -> dict[str, int]:
        return {"latencyMs": round((time.perf_counter() - self.started) * 1000)}

    def _stop_reason(self, reason: Any, stop: Any) -> str:
        if reason == "stop" and stop in self.stops:
            return "stop_sequence"  # vLLM names the stop string it met
        return _STOP.get(str(reason), "end_turn")

    def whole(self, answer: dict[str, Any]) -> bytes:
        choice, message = first_choice(answer)
        content: list[dict[str, Any]] = []
        thought = reasoning(message)
        if thought:
            content.append({"reasoningContent": {"reasoningText": {"text": thought}}})
        if message.get("content"):
            content.append({"text": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            tool = {"toolUseId": call.get("id"), "name": function.get("name")}
            content.append({"toolUse": {**tool, "input": tool_input(function.get("arguments"))}})
        stop = self._stop_reason(choice.get("finish_reason"), choice.get("stop_reason"))
        return dumps(
            {
                "output": {"message": {"role": "assistant", "content": content or [{"text": ""}]}},
                "stopReason": stop,
                "usage": _usage(answer.get("usage")),
                "metrics": self._latency(),
            }
        )

    def begin(self, chunk: Mapping[str, Any]) -> bytes:
        return _event("messageStart", {"role": "assistant"})

    def open(self, kind: str | int, call: Mapping[str, Any] | None) -> bytes:
        self.tail = b'},"contentBlockIndex":%d}' % self.index
        if call is None:  # text and reasoning blocks start with their first delta
            return b""
        name = (call.get("function") or {}).get("name") or ""
        start = {"toolUse": {"toolUseId": call.get("id") or "", "name": name}}
        return _event("contentBlockStart", {"start": start, "contentBlockIndex": self.index})

    def piece(self, kind: str | int, text: str, choice: Mapping[str, Any]) -> bytes:
        # the most frequent event: its JSON written around the value's
        head, shut = _PIECES[kind if isinstance(kind, str) else "call"]
        payload = head + dumps(text) + shut + self.tail
        return event_message(_EVENT_HEADERS["contentBlockDelta"], payload)

    def close(self) -> bytes:
        return _event("contentBlockStop", {"contentBlockIndex": self.index})

    def end(self) -> bytes:
        out = self.wind_up()
        out += _event("messageStop", {"stopReason": self._stop_reason(self.finish, self.stop)})
        return out + _event("metadata", {"usage": _usage(self.usage), "metrics": self._latency()})

    def fail(self, status: int, message: str, kind: str) -> bytes:
        name = _STREAM_ERRORS.get(status, "internalServer") + "Exception"
        headers = (
            _header(":exception-type", name)
            + _header(":content-type", "application/json")
            + _header(":message-type", "exception")
        )
        return event_message(headers, dumps({"message": message}))


def _items(value: Any, where: str) -> list[Any]:
    items: list[Any] = need(value, list, where)
    return items


def _fields(value: Any, where: str) -> dict[str, Any]:
    fields: dict[str, Any] = need(value, dict, where)
    return fields


def _string(fields: Mapping[str, Any], name: str, where: str) -> str:
    value: str = need(fields.get(name), str, f"{where}.{name}")
    return value


def _text(block: Any, where: str) -> str | None:
    """A text block's text; None for a cache point (a hint without content); any other block
    is refused, naming it."""
    block = _fields(block, where)
    if "text" in block:
        return _string(block, "text", where)
    if "cachePoint" in block:
        return None
    kind = next(iter(block), "(empty)")
    if kind in _MEDIA:
        raise invalid(f"{where}.{kind}: {kind} blocks are not supported (text only)")
    raise invalid(f"{where}.{kind} is not supported")


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``toolResult`` block as a chat tool message: its text and JSON parts as one text
    (its ``status`` has no place in a chat template)."""
    result = _fields(block["toolResult"], where)
    parts = []
    for i, part in enumerate(_items(result.get("content", []), f"{where}.content")):
        if isinstance(part, dict) and "json" in part:
            parts.append(json.dumps(part["json"], ensure_ascii=False))
        else:
            parts.append(_text(part, f"{where}.content[{i}]") or "")
    call = _string(result, "toolUseId", where)
    return {"role": "tool", "tool_call_id": call, "content": "\n".join(parts)}


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    """One Converse message as chat messages (a user turn's tool results become tool
    messages, in their place among its text)."""
    message = _fields(message, where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise invalid(f"{where}.role must be 'user' or 'assistant'")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for i, block in enumerate(_items(message.get("content"), f"{where}.content")):
        at = f"{where}.content[{i}]"
        if isinstance(block, dict) and "toolResult" in block and role == "user":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, f"{at}.toolResult"))
        elif isinstance(block, dict) and "toolUse" in block and role == "assistant":
            use, at = _fields(block["toolUse"], f"{at}.toolUse"), f"{at}.toolUse"
            arguments = json.dumps(use.get("input", {}), ensure_ascii=False)
            name = _string(use, "name", at)
            calls.append(chat_call(_string(use, "toolUseId", at), name, arguments))
        elif isinstance(block, dict) and "reasoningContent" in block and role == "assistant":
            thought = _fields(block["reasoningContent"], f"{at}.reasoningContent")
            if "reasoningText" not in thought:
                raise invalid(f"{at}.reasoningContent: only reasoningText is supported")
            thoughts.append(str(_fields(thought["reasoningText"], at).get("text", "")))
        else:
            text = _text(block, at)
            if text is not None:
                texts.append(text)
    if role == "user":
        return [*out, {"role": "user", "content": "\n".join(texts)}] if texts or not out else out
    return [assistant(texts, thoughts, calls)]


def _tools(config: Any) -> dict[str, Any]:
    """``toolConfig`` as chat's ``tools`` and ``tool_choice``."""
    config = _fields(config, "toolConfig")
    tools = []
    for i, tool in enumerate(_items(config.get("tools"), "toolConfig.tools")):
        tool = _fields(tool, f"toolConfig.tools[{i}]")
        if "cachePoint" in tool:
            continue
        spec = _fields(tool.get("toolSpec"), f"toolConfig.tools[{i}].toolSpec")
        where = f"toolConfig.tools[{i}].toolSpec"
        schema = _fields(spec.get("inputSchema"), f"{where}.inputSchema")
        about = _string(spec, "description", where) if "description" in spec else None
        parameters = _fields(schema.get("json"), f"{where}.inputSchema.json")
        tools.append(chat_tool(_string(spec, "name", where), about, parameters))
    out: dict[str, Any] = {"tools": tools}
    if "toolChoice" in config:
        choice = _fields(config["toolChoice"], "toolConfig.toolChoice")
        if "auto" in choice:
            out["tool_choice"] = "auto"
        elif "any" in choice:
            out["tool_choice"] = "required"
        elif "tool" in choice:
            name = _string(
                _fields(choice["tool"], "toolConfig.toolChoice.tool"),
                "name",
                "toolConfig.toolChoice.tool",
            )
            out["tool_choice"] = {"type": "function", "function": {"name": name}}
        else:
            raise invalid("toolConfig.toolChoice must be one of auto, any, tool")
    return out


class ConverseDialect(Dialect):
    """``POST /sessions/{sid}/model/{modelId}/converse`` (and ``converse-stream``)."""

    name = "converse"

    def decode(self, body: dict[str, Any], route: Route, session: Session | None) -> dict[str, Any]:
        for field in body:
            if field not in _KNOWN:
                raise invalid(f"{field} is not supported")
        for field in _fields(
            body.get("additionalModelRequestFields", {}), "additionalModelRequestFields"
        ):
            raise invalid(f"additionalModelRequestFields.{field} is not supported")
        messages: list[dict[str, Any]] = []
        system = [
            _text(block, f"system[{i}]")
            for i, block in enumerate(_items(body.get("system", []), "system"))
        ]
        if any(text is not None for text in system):
            messages.append({"role": "system", "content": "\n".join(filter(None, system))})
        if "messages" not in body:
            raise invalid("request body has no 'messages'")
        for i, message in enumerate(_items(body["messages"], "messages")):
            messages += _message(message, f"messages[{i}]")
        chat: dict[str, Any] = {"model": route.model, "messages": messages}
        for field, value in _fields(body.get("inferenceConfig", {}), "inferenceConfig").items():
            if field not in _SAMPLING:
                raise invalid(f"inferenceConfig.{field} is not supported")
            chat[_SAMPLING[field]] = value
        if "toolConfig" in body:
            chat.update(_tools(body["toolConfig"]))
        if route.stream:
            stream_usage(chat)
        return chat

    def encoder(
        self, body: Mapping[str, Any], chat: Mapping[str, Any], session: Session
    ) -> Encoder:
        stops = chat.get("stop")
        return _ConverseEncoder(stops if isinstance(stops, list) else [])

    def error(
        self, status: int, message: str, kind: str, upstream: bytes | None
    ) -> tuple[bytes, Headers]:
        name = _ERRORS.get(status) or ("Validation" if status < 500 else "InternalServer")
        return dumps({"message": message}), [(b"x-amzn-errortype", f"{name}Exception:".encode())]


CONVERSE_DIALECT: Final = ConverseDialect()
