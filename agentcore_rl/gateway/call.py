"""The seam between the gateway and its two modes: one model call, and how an agent is answered.

The app admits a call (session, policy gate, sampling overrides, the record begun) and hands
it to a :class:`Mode`: proxy mode (:mod:`.proxy`, the server renders) or linear mode
(:mod:`.render.mode`, the gateway renders and calls the server token-in). A mode reads the
call, talks to ``call.upstream`` and answers the agent through ``send`` (:func:`respond`,
:func:`send_sse`, or :class:`Refuse` for an OpenAI-style error); it commits the record
(:meth:`Call.commit`) before the answer's last byte. What happens on commit (the version at
the end, statistics, the session's order) is the app's ``on_commit``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from starlette.types import Send

from agentcore_rl.gateway.policy_gate import PolicyGate, Versions
from agentcore_rl.gateway.record import CallRecord, Session
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool

__all__ = [
    "SSE_HEADERS",
    "Call",
    "Mode",
    "Refuse",
    "down_message",
    "error_body",
    "passed_on",
    "respond",
    "send_sse",
]

SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON_TYPE: Final = (b"content-type", b"application/json")


class Refuse(Exception):
    """Answer the agent with ``status`` and an OpenAI-style JSON error, or ``body``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        headers: Sequence[Any] = (),
        body: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = list(headers)
        self.body = error_body(status, message, kind) if body is None else body


def passed_on(status: int, content: bytes) -> Refuse:
    """An upstream's answer other than 200, for the agent as it is."""
    text = content[:500].decode("utf-8", "replace")
    return Refuse(status, f"upstream answered HTTP {status}: {text}", "upstream", body=content)


def error_body(status: int, message: str, kind: str) -> bytes:
    """The OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


async def respond(send: Send, status: int, body: bytes, headers: Sequence[Any] = ()) -> None:
    """Send a whole JSON response."""
    # A content-length spares the server its chunked framing (a copy of the body).
    length = (b"content-length", str(len(body)).encode())
    await send(
        {"type": "http.response.start", "status": status, "headers": [_JSON_TYPE, length, *headers]}
    )
    await send({"type": "http.response.body", "body": body})


async def send_sse(send: Send, body: bytes) -> None:
    """A whole SSE stream in one piece."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": body})


def down_message(base: str, exc: BaseException) -> str:
    """Say that the upstream at ``base`` failed, and how."""
    what = str(exc) if isinstance(exc, UpstreamError) else f"{type(exc).__name__}: {exc}"
    return f"upstream {base} failed: {what}".rstrip(": ")


@dataclass(slots=True, eq=False)
class Call:
    """One admitted model call: the agent's request (``raw`` as sent, ``body`` parsed with
    the session's overrides applied), its session and record, the upstream that serves it;
    ``gate`` (pauses, the current version) and ``versions``, where each policy version's
    tokens start in its completion (a ``suspend`` pause can come in the middle)."""

    session: Session
    endpoint: str  # "chat.completions" or "completions"
    raw: bytes
    body: dict[str, Any]
    record: CallRecord
    upstream: UpstreamPool
    on_commit: Callable[[Call], None]
    gate: PolicyGate
    versions: Versions
    forked: bool = False  # linear mode: rendered afresh although the session had turns
    committed: bool = False

    @property
    def stream(self) -> bool:
        """Whether the agent asked for an SSE stream."""
        return bool(self.body.get("stream"))

    @property
    def include_usage(self) -> bool:
        """Whether the agent asked for a usage chunk at the end of its stream."""
        options = self.body.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))

    def commit(self, status: int, error: str | None = None) -> None:
        """File the record with its outcome (once; before the answer's last byte)."""
        if self.committed:
            return
        self.committed = True
        self.record.status, self.record.error = status, error
        self.on_commit(self)


class Mode(Protocol):
    """How calls are served (see the module doc)."""

    async def serve(self, call: Call, send: Send) -> None:
        """Answer ``call`` through ``send``, committing its record before the last byte;
        raise :class:`Refuse` to answer with an error."""
