"""What a transport is: the way the client reaches agents (ACR or plain HTTP).

A transport sends one invocation for a session id and returns the agent's JSON answer, or
stops a session. It classifies failures: :class:`RetryableError` (throttling, 5xx,
connection errors; ``throttled`` for 429 / ThrottlingException) is retried by the client
with the same session id; any other failure is an
:class:`~agentcore_rl.errors.InvocationError` carrying the server's message.

Example::

    class MyTransport:
        name = "mine"
        stop_after_result = False
        async def invoke(self, session_id, payload): ...
        async def stop(self, session_id): ...
        async def aclose(self): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agentcore_rl.errors import InvocationError

__all__ = ["RetryableError", "Transport"]


class RetryableError(InvocationError):
    """A failure worth retrying with the same session id (internal to the client).

    The client retries it and, when the attempts run out, raises an ``InvocationError``
    that wraps the last one.

    Example::

        raise RetryableError("HTTP 503: shutting down", session_id=sid, status_code=503)
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        status_code: int | None = None,
        throttled: bool = False,
    ) -> None:
        super().__init__(message, session_id=session_id, status_code=status_code)
        self.throttled = throttled


class Transport(Protocol):
    """The client's view of the agents.

    ``stop_after_result`` says whether a finished session still holds resources worth
    freeing with a stop call (an ACR microVM does; an HTTP server's finished task does not).

    Example::

        answer = await transport.invoke(session_id, {"prompt": "hi", "_rollout": {...}})
    """

    name: str
    stop_after_result: bool

    async def invoke(self, session_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Send one invocation; return the JSON object the agent answered.

        Example::

            answer = await transport.invoke(sid, payload)   # {"status": "processing", ...}
        """
        ...

    async def stop(self, session_id: str) -> bool:
        """Stop the session; True when something was running.

        Example::

            await transport.stop(sid)
        """
        ...

    async def aclose(self) -> None:
        """Release connections. Idempotent.

        Example::

            await transport.aclose()
        """
        ...
