"""The seam between the gateway and its two modes, proxy (:mod:`.proxy`) and linear
(:mod:`.render.mode`): one admitted :class:`Call`, and how an agent is answered. A mode's
``serve(call, send)`` answers (or raises :class:`Refuse`), committing the record before the
answer's last byte."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from starlette.types import Send

from agentcore_rl.gateway.backends import synthesize_sse
from agentcore_rl.gateway.jsonio import dumps
from agentcore_rl.gateway.policy_gate import PolicyGate, Versions
from agentcore_rl.gateway.record import CallRecord, Session
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool

__all__ = [
    "JSON_TYPE",
    "SSE_HEADERS",
    "Call",
    "Refuse",
    "down_message",
    "error_body",
    "passed_on",
    "respond",
]

SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
JSON_TYPE: Final = (b"content-type", b"application/json")


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
        self.headers = list(headers)
        self.body = error_body(status, message, kind) if body is None else body


def passed_on(status: int, content: bytes) -> Refuse:
    """An upstream's answer other than 200, for the agent as it is."""
    text = content[:500].decode("utf-8", "replace")
    return Refuse(status, f"upstream answered HTTP {status}: {text}", "upstream", body=content)


def error_body(status: int, message: str, kind: str) -> bytes:
    """The OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


async def respond(
    send: Send, status: int, body: bytes, headers: Sequence[Any] = (JSON_TYPE,)
) -> None:
    """Send a whole response (with a content-length: no chunked framing)."""
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [*headers, length]})
    await send({"type": "http.response.body", "body": body})


def down_message(base: str, exc: UpstreamError) -> str:
    """Say that the upstream at ``base`` failed, and how."""
    return f"upstream {base} failed: {exc}".rstrip(": ")


@dataclass(slots=True, eq=False)
class Call:
    """One admitted model call: ``raw`` as sent, ``body`` with the session's overrides, and
    ``versions``: where each policy version's tokens start (a ``suspend`` can cut in)."""

    session: Session
    endpoint: str  # "chat.completions" or "completions"
    raw: bytes
    body: dict[str, Any]
    record: CallRecord
    upstream: UpstreamPool
    on_commit: Callable[[Call], None]
    gate: PolicyGate
    versions: Versions
    committed: bool = False

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def commit(self, status: int, error: str | None = None) -> None:
        """File the record with its outcome (once; before the answer's last byte)."""
        if self.committed:
            return
        self.committed = True
        self.record.status, self.record.error = status, error
        self.on_commit(self)

    async def answer(self, send: Send, data: dict[str, Any]) -> None:
        """Commit the record, then send the whole answer (one SSE piece when streaming)."""
        self.commit(200)
        if self.stream:
            options = self.body.get("stream_options")
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            sse = synthesize_sse(data, self.endpoint, usage)
            await respond(send, 200, sse, SSE_HEADERS)
        else:
            await respond(send, 200, dumps(data))
