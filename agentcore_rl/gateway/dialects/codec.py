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

from agentcore_rl.gateway.jsonio import Invalid, loads
from agentcore_rl.gateway.sessions import Session

__all__ = [
    "JSON_TYPE",
    "SSE_HEADERS",
    "Dialect",
    "Encoder",
    "Headers",
    "Route",
    "chunks_of",
    "invalid",
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
