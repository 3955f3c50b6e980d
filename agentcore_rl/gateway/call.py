"""The seam between the gateway and its two modes, proxy (:mod:`.proxy`) and linear
(:mod:`.render.mode`): one admitted :class:`Call`, and how an agent is answered. A mode's
``serve(call, send)`` answers (or raises :class:`Refusal`), committing the record before the
answer's last byte."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import Send

from agentcore_rl.edge import Refusal
from agentcore_rl.gateway.dialects.codec import JSON_TYPE, Dialect, Encoder, chunks_of
from agentcore_rl.gateway.policy_gate import PolicyGate, Versions
from agentcore_rl.gateway.sessions import Session
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool
from agentcore_rl.trace import CallRecord

__all__ = ["Call", "down_message", "render", "respond"]


def render(refusal: Refusal, dialect: Dialect) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A refusal's body and headers in ``dialect``'s error shape."""
    body, headers = dialect.error(refusal.status, refusal.message, refusal.kind, refusal.passed_on)
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in refusal.headers.items()]
    return body, [JSON_TYPE, *headers, *extra]


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
    ``versions``: where each policy version's tokens start (a ``suspend`` can cut in);
    ``encoder`` writes the answer in the agent's dialect."""

    session: Session
    dialect: Dialect
    encoder: Encoder
    raw: bytes
    body: dict[str, Any]
    record: CallRecord
    upstream: UpstreamPool
    on_commit: Callable[[Call], None]
    gate: PolicyGate
    versions: Versions
    committed: bool = False

    @property
    def text(self) -> bool:
        """Whether the call is a text completion (``prompt``) rather than chat."""
        return self.dialect.text

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
        """Commit the record, then send the whole answer (in one piece when streaming)."""
        self.commit(200)
        encoder = self.encoder
        if self.stream:
            pieces = [encoder.chunk(chunk) for chunk in chunks_of(data, self.text)]
            await respond(send, 200, b"".join([*pieces, encoder.end()]), encoder.stream_headers)
        else:
            await respond(send, 200, encoder.whole(data), encoder.headers)
