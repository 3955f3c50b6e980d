"""The seam between the gateway and its two modes: one model call, with what serving it needs.

The app admits a call (session, policy gate, sampling overrides, the record begun) and hands
it to a :class:`Mode`: proxy mode (:mod:`.proxy`, the server renders) or linear mode
(:mod:`.render.mode`, the gateway renders and calls the server token-in). A mode reads the
call, talks to ``call.upstream`` and answers the agent through ``send``; it commits the
record (:meth:`Call.commit`) before the answer's last byte. It never sees the app: what
happens on commit (the version at the end, statistics, the session's order) is the app's
``on_commit``.

Example::

    class EchoMode:
        async def serve(self, call: Call, send: Send) -> None:
            call.commit(200)
            await respond(send, 200, call.raw)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.types import Send

from agentcore_rl.gateway.policy_gate import PolicyGate, Versions
from agentcore_rl.gateway.record import CallRecord
from agentcore_rl.gateway.sessions import Session
from agentcore_rl.gateway.upstream import UpstreamPool

__all__ = ["Call", "Mode"]


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
    clock: Callable[[], float]  # monotonic seconds
    wall: Callable[[], float]  # seconds since the epoch
    on_commit: Callable[[Call], None]
    gate: PolicyGate = field(default_factory=PolicyGate)
    versions: Versions = field(default_factory=lambda: Versions(0))
    forked: bool = False  # linear mode: rendered afresh although the session had turns
    committed: bool = False

    @property
    def stream(self) -> bool:
        """Whether the agent asked for an SSE stream."""
        return bool(self.body.get("stream"))

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
        raise :class:`~agentcore_rl.gateway.answers.Refuse` to answer with an error."""
