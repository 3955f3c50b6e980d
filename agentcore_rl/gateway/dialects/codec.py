"""What an agent-facing dialect is (docs/gateway.md, "Agent dialects"): each translates one
call of its API into the gateway's one conversation model, an OpenAI chat-completions request
(messages, tools, sampling), and the chat answer back into its own shape, whole or streamed.
The modes (proxy, linear) serve chat requests and know no dialect; the records keep the
translated request, the dialect named in ``endpoint``.

A codec is a :class:`Dialect` (decode a request, render an error) and, per call, an
:class:`Encoder` (encode the answer, or the chat chunks of a stream as they arrive)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentcore_rl.gateway.jsonio import Invalid, dumps, loads
from agentcore_rl.gateway.sessions import Session

__all__ = [
    "JSON_TYPE",
    "SSE_HEADERS",
    "Dialect",
    "Encoder",
    "Headers",
    "Route",
    "assistant",
    "chat_call",
    "chat_tool",
    "chunks_of",
    "first_choice",
    "invalid",
    "need",
    "reasoning",
    "sse",
    "stream_usage",
    "tokens",
    "tool_input",
]

SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
JSON_TYPE: Final = (b"content-type", b"application/json")
Headers = Sequence[tuple[bytes, bytes]]


class Encoder:
    """One call's answer in its dialect: :meth:`whole`, or a stream (:meth:`chunk` for each
    chat chunk as it arrives, then :meth:`end`, or :meth:`fail` once the headers are out)."""

    headers: Headers = [JSON_TYPE]
    stream_headers: Headers = SSE_HEADERS

    def whole(self, answer: dict[str, Any]) -> bytes:
        """The whole answer from a chat completion."""
        raise NotImplementedError

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        """The stream's bytes for one ``chat.completion.chunk`` (maybe none yet)."""
        raise NotImplementedError

    def end(self) -> bytes:
        """The stream's last bytes, after its last chunk."""
        raise NotImplementedError

    def fail(self, status: int, message: str, kind: str) -> bytes:
        """An error event that ends a stream whose headers are out."""
        raise NotImplementedError


class Dialect:
    """One agent-facing API (see the module doc). ``name`` is the record's ``endpoint``;
    ``text`` marks the one dialect served as text completions rather than chat."""

    name = "?"
    text = False

    def decode(self, body: dict[str, Any], route: Route, session: Session | None) -> dict[str, Any]:
        """The chat request for ``body`` (:class:`Invalid` names what is wrong: a 400)."""
        raise NotImplementedError

    def encoder(
        self, body: Mapping[str, Any], chat: Mapping[str, Any], session: Session
    ) -> Encoder:
        """The encoder of one call's answer (``body`` as the agent sent it, ``chat`` decoded)."""
        raise NotImplementedError

    def error(
        self, status: int, message: str, kind: str, upstream: bytes | None
    ) -> tuple[bytes, Headers]:
        """A refusal's body and headers in this dialect's error shape (``upstream``: the
        upstream's own error body, when it is the upstream's answer passed on)."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Route:
    """What a session route names: the dialect, whether the route itself asks for a stream
    (Converse's ``converse-stream``), the model in the path."""

    dialect: Dialect
    stream: bool | None = None
    model: str | None = None


def chunks_of(answer: Mapping[str, Any], text: bool = False) -> list[dict[str, Any]]:
    """A whole chat (or text) completion as the chunks of a stream: one per choice, then the
    usage; what a mode that answers whole feeds a stream's :class:`Encoder`."""
    head = {
        "id": answer.get("id", ""),
        "object": "text_completion" if text else "chat.completion.chunk",
        "created": answer.get("created", 0),
        "model": answer.get("model", ""),
    }
    chunks: list[dict[str, Any]] = []
    for ch in answer.get("choices") or ():
        if text:
            choice = {"index": ch.get("index", 0), "text": ch.get("text", "")}
        else:
            message = dict(ch.get("message") or {})
            calls = [dict(call, index=i) for i, call in enumerate(message.get("tool_calls") or ())]
            if calls:
                message["tool_calls"] = calls
            choice = {"index": ch.get("index", 0), "delta": message}
        choice["logprobs"] = ch.get("logprobs")
        choice["finish_reason"] = ch.get("finish_reason")
        if "stop_reason" in ch:  # vLLM's: the stop string that ended it
            choice["stop_reason"] = ch["stop_reason"]
        chunks.append({**head, "choices": [choice]})
    if answer.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    return chunks


def tool_input(arguments: Any) -> Any:
    """A chat tool call's JSON ``arguments`` as the object the Anthropic and Bedrock answers
    carry as its ``input`` (none: ``{}``; text that is not JSON: as the model wrote it)."""
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def invalid(message: str) -> Invalid:
    """A request the dialect cannot translate (a 400 naming the field)."""
    return Invalid(message)


_KINDS: Final[dict[type, str]] = {dict: "an object", list: "a list", str: "a string"}


def need(value: Any, kind: type, where: str) -> Any:
    """``value`` when it is a ``kind`` (dict, list or str), else the 400 naming ``where``."""
    if not isinstance(value, kind):
        raise invalid(f"{where}: must be {_KINDS[kind]}")
    return value


# The chat request's side: what each dialect's turns and tools become.


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A chat assistant message's tool call."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_tool(name: str, description: Any, parameters: Any) -> dict[str, Any]:
    """A chat function tool (``description`` None: none)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def assistant(texts: list[str], thoughts: list[str], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat assistant message from a turn's text, reasoning and tool calls: no content when
    it only calls tools, as a chat agent echoes such an answer."""
    message: dict[str, Any] = {"role": "assistant"}
    if texts or not calls:
        message["content"] = "".join(texts)
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def stream_usage(chat: dict[str, Any]) -> None:
    """Ask for a stream whose last chunk carries the usage (every dialect's stream ends with it)."""
    chat.update(stream=True, stream_options={"include_usage": True})


# The answer's side.


def first_choice(answer: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """A whole chat answer's first choice and its message."""
    choice = (answer.get("choices") or [{}])[0]
    return choice, choice.get("message") or {}


def reasoning(message: Mapping[str, Any]) -> Any:
    """A message's or delta's reasoning (vLLM's ``reasoning_content``, or ``reasoning``)."""
    return message.get("reasoning_content") or message.get("reasoning")


def tokens(usage: Any) -> tuple[int, int]:
    """A chat usage's prompt and completion tokens (0 when missing)."""
    usage = usage if isinstance(usage, Mapping) else {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def sse(name: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event under its ``event:`` line."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


class BlockEncoder(Encoder):
    """The stream of a dialect whose answer is a list of content blocks (reasoning, text, each
    tool call), in the chat answer's order: a block opens when the deltas change kind, takes
    their pieces, and closes when the next opens or the stream ends. A subclass writes the
    bytes: :meth:`begin`, :meth:`open`, :meth:`piece`, :meth:`close`, and its :meth:`end`
    (after :meth:`wind_up`). ``kind`` is the open block's: ``"reasoning"``, ``"text"`` or a tool
    call's chat index; ``index`` its place among the answer's blocks."""

    def __init__(self) -> None:
        self.begun = False
        self.kind: str | int | None = None
        self.index = -1
        self.calls: dict[int, Mapping[str, Any]] = {}  # the tool calls begun (first delta)
        self.finish: str | None = None
        self.stop: Any = None  # the stop string that ended it (vLLM's ``stop_reason``)
        self.usage: Any = None

    def begin(self, chunk: Mapping[str, Any]) -> bytes:
        """The stream's first bytes (``chunk``: the first, or {} when none came)."""
        return b""

    def open(self, kind: str | int, call: Mapping[str, Any] | None) -> bytes:
        """Open a block (``call``: a tool call's first delta, with its id and name)."""
        raise NotImplementedError

    def piece(self, kind: str | int, text: str, choice: Mapping[str, Any]) -> bytes:
        """A piece of the open block: its reasoning, text, or tool call arguments."""
        raise NotImplementedError

    def close(self) -> bytes:
        """Close the open block."""
        raise NotImplementedError

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = b"" if self.begun else self._begin(chunk)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            thought = reasoning(delta)
            if thought:
                out += self._enter("reasoning") + self.piece("reasoning", thought, choice)
            if delta.get("content"):
                out += self._enter("text") + self.piece("text", delta["content"], choice)
            for call in delta.get("tool_calls") or ():
                index = call.get("index", 0)
                if index not in self.calls:  # a call begins
                    self.calls[index] = call
                    out += self._enter(index, call)
                arguments = (call.get("function") or {}).get("arguments")
                if arguments:
                    if self.kind != index:
                        raise ValueError("a tool call's arguments came after the next block began")
                    out += self.piece(index, arguments, choice)
            self.finish = choice.get("finish_reason") or self.finish
            self.stop = choice.get("stop_reason", self.stop)
        return out

    def _begin(self, chunk: Mapping[str, Any]) -> bytes:
        self.begun = True
        return self.begin(chunk)

    def _enter(self, kind: str | int, call: Mapping[str, Any] | None = None) -> bytes:
        if self.kind == kind:
            return b""
        out = self.wind_up()
        self.kind, self.index = kind, self.index + 1
        return out + self.open(kind, call)

    def wind_up(self) -> bytes:
        """The stream's beginning if it has none yet, and the open block's close."""
        out = b"" if self.begun else self._begin({})
        if self.kind is not None:
            out += self.close()
            self.kind = None
        return out
