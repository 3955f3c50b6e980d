"""The gateway's errors (the lead moves them into :mod:`agentcore_rl.errors` when merging).

Example::

    try:
        trace = await gateway.finish_session(sid)
    except TraceLostError as exc:
        print(exc.session_id, exc)
"""

from __future__ import annotations

from agentcore_rl.errors import AgentCoreRLError

__all__ = ["GatewayError", "TraceLostError"]


class GatewayError(AgentCoreRLError):
    """The rollout gateway was misused or could not do its job (the message says which).

    Example::

        except GatewayError as exc:
            log.error("gateway: %s", exc)
    """


class TraceLostError(GatewayError):
    """A session's trace cannot be had: the gateway restarted, or it expired without a sink.

    A rollout whose trace is lost must not end as a success without tokens; the client turns
    this into the rollout's outcome.

    Example::

        raise TraceLostError("s-1", "the gateway has no record of it (restarted?)")
    """

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"trace of session {session_id!r} is lost: {reason}")
        self.session_id = session_id
        self.reason = reason
