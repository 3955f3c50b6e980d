"""OpenAI chat and text completions: the gateway's own conversation model, so decoding checks
the one field a mode needs and encoding writes the answer and its SSE chunks as they are."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from agentcore_rl.gateway.dialects.codec import Dialect, Encoder, Headers, Route, invalid
from agentcore_rl.gateway.jsonio import dumps
from agentcore_rl.gateway.sessions import Session

__all__ = ["CHAT_DIALECT", "COMPLETIONS_DIALECT", "ChatDialect", "error_body"]

_DONE: Final = b"data: [DONE]\n\n"


def error_body(status: int, message: str, kind: str) -> bytes:
    """The OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


class _ChatEncoder(Encoder):
    def __init__(self, usage: bool) -> None:
        self.usage = usage  # stream_options.include_usage: the usage chunk is the agent's

    def whole(self, answer: dict[str, Any]) -> bytes:
        return dumps(answer)

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        if not self.usage and not chunk.get("choices") and "usage" in chunk:
            return b""
        return b"data: " + dumps(chunk) + b"\n\n"

    def end(self) -> bytes:
        return _DONE

    def fail(self, status: int, message: str, kind: str) -> bytes:
        return b"data: " + error_body(status, message, kind) + b"\n\n"


class ChatDialect(Dialect):
    """``/v1/chat/completions`` (``messages``) or ``/v1/completions`` (``prompt``)."""

    def __init__(self, name: str, needs: str, text: bool) -> None:
        self.name, self.needs, self.text = name, needs, text

    def decode(self, body: dict[str, Any], route: Route, session: Session | None) -> dict[str, Any]:
        if self.needs not in body:
            raise invalid(f"request body has no {self.needs!r}")
        return body

    def encoder(
        self, body: Mapping[str, Any], chat: Mapping[str, Any], session: Session
    ) -> Encoder:
        options = chat.get("stream_options")
        return _ChatEncoder(isinstance(options, dict) and bool(options.get("include_usage")))

    def error(
        self, status: int, message: str, kind: str, upstream: bytes | None
    ) -> tuple[bytes, Headers]:
        return (error_body(status, message, kind) if upstream is None else upstream), []


CHAT_DIALECT: Final = ChatDialect("chat.completions", "messages", text=False)
COMPLETIONS_DIALECT: Final = ChatDialect("completions", "prompt", text=True)
