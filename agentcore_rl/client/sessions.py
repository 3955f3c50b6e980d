"""The session ids of one client: which ids it accepts, and which its pending rollouts hold.

The agent runs one rollout per session and result key, so a second rollout on an id that a
pending rollout of the same client holds would not start anything new: the client refuses it
instead of handing out two futures for one session.

Example::

    sessions = PendingSessions(acr=True)
    sid = sessions.check(protocol.new_session_id())
    with sessions.reserving(sid):
        ...  # the invocation is on the wire; a second check(sid) raises meanwhile
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from agentcore_rl import protocol
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig

__all__ = ["PendingSessions", "check_session_id_format"]


def check_session_id_format(session_id: object, *, acr: bool) -> str:
    """Return ``session_id`` if it is a valid session id (for AgentCore Runtime when
    ``acr``: 33-256 letters, digits and hyphens), else raise ``InvalidRolloutConfig``."""
    sid = protocol.validate_session_id(session_id, name="session_id")
    if acr and not protocol.is_acr_session_id(sid):
        raise InvalidRolloutConfig(
            f"session_id {sid!r} is {len(sid)} characters long; AgentCore Runtime needs "
            f"{protocol.ACR_MIN_SESSION_ID_LENGTH}-{protocol.MAX_SESSION_ID_LENGTH} "
            "(protocol.new_session_id() makes one)",
            field="session_id",
        )
    return sid


class PendingSessions:
    """The session ids in use: ``live`` (accepted, no outcome yet, with their futures) and
    ``reserved`` (an invocation or attach on its way into ``live``).
    """

    def __init__(self, *, acr: bool) -> None:
        self.acr = acr
        self.live: dict[str, RolloutFuture] = {}
        self.reserved: set[str] = set()

    def __repr__(self) -> str:
        return f"PendingSessions(live={len(self.live)}, reserved={len(self.reserved)})"

    def check(self, session_id: object) -> str:
        """Return ``session_id`` if a new rollout may use it, else raise.

        ``InvalidRolloutConfig`` for an invalid id (see :func:`check_session_id_format`),
        ``ConfigurationError`` when a pending rollout already holds it."""
        sid = check_session_id_format(session_id, acr=self.acr)
        if sid in self.live or sid in self.reserved:
            raise ConfigurationError(
                f"session_id {sid!r} belongs to a rollout of this client that has no outcome "
                "yet; wait for it (or cancel it) before reusing the id"
            )
        return sid

    @contextlib.contextmanager
    def reserving(self, session_id: str) -> Iterator[None]:
        """Hold ``session_id`` (so :meth:`check` refuses it) for the ``with`` block."""
        self.reserved.add(session_id)
        try:
            yield
        finally:
            self.reserved.discard(session_id)
