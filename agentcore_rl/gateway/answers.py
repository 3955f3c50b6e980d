"""How the gateway answers an agent: OpenAI-style JSON errors and plain JSON responses.

Shared by the proxy path (:mod:`agentcore_rl.gateway.app`) and the rendering mode
(:mod:`agentcore_rl.gateway.render.mode`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from starlette.types import Send

from agentcore_rl.gateway.upstream import UpstreamError

__all__ = ["JSON_TYPE", "Refuse", "down_message", "error_body", "respond"]

JSON_TYPE: Final = (b"content-type", b"application/json")


class Refuse(Exception):
    """Answer the agent with ``status`` and an OpenAI-style JSON error."""

    def __init__(self, status: int, message: str, kind: str, headers: Sequence[Any] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = list(headers)


def error_body(status: int, message: str, kind: str) -> bytes:
    """The OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


async def respond(send: Send, status: int, body: bytes, headers: Sequence[Any] = ()) -> None:
    """Send a whole JSON response."""
    # A content-length spares the server its chunked framing (a copy of the body).
    length = (b"content-length", str(len(body)).encode())
    await send(
        {"type": "http.response.start", "status": status, "headers": [JSON_TYPE, length, *headers]}
    )
    await send({"type": "http.response.body", "body": body})


def down_message(base: str, exc: BaseException) -> str:
    """Say that the upstream at ``base`` failed, and how."""
    what = str(exc) if isinstance(exc, UpstreamError) else f"{type(exc).__name__}: {exc}"
    return f"upstream {base} failed: {what}".rstrip(": ")
