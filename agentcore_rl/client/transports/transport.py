"""What a transport is (the way the client reaches agents) and how it classifies failures:
:class:`RetryableError` is retried in the same session, anything else is an
:class:`~agentcore_rl.errors.InvocationError` carrying the server's message."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from agentcore_rl import protocol
from agentcore_rl.errors import InvocationError

__all__ = [
    "NotConnectedError",
    "RetryableError",
    "StopUnsupportedError",
    "Transport",
    "json_object_answer",
    "session_state",
]


class RetryableError(InvocationError):
    """A failure worth retrying with the same session id (internal to the client).

    The client retries it and, when the attempts run out, raises an ``InvocationError``
    that wraps the last one. One with ``retry_after`` (an overloaded server's 503 or a 429
    with ``Retry-After``) is a pause: waited out and sent again, using up no attempt.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        status_code: int | None = None,
        throttled: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id, status_code=status_code)
        self.throttled = throttled
        self.retry_after = retry_after


class NotConnectedError(RetryableError):
    """No connection to the agent could be made (refused, or the connect timed out): the
    request never left, so this attempt started nothing.
    """


class StopUnsupportedError(InvocationError):
    """The agent server has no stop route (an app without our stop extension answers 404):
    not a failure, so it is counted apart (``stops_unsupported``) and not retried.
    """


def json_object_answer(
    raw: bytes,
    *,
    source: str,
    session_id: str,
    status_code: int | None = None,
) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        status = "" if status_code is None else f" HTTP {status_code}"
        shown = raw[:200].decode(errors="replace")
        raise InvocationError(
            f"{source} answered{status} with a body that is not JSON: {shown!r}",
            session_id=session_id,
            status_code=status_code,
        ) from exc
    if not isinstance(body, dict):
        raise InvocationError(
            f"{source} answered JSON {type(body).__name__}, expected an object",
            session_id=session_id,
            status_code=status_code,
        )
    return body


class Transport(Protocol):
    """The client's view of the agents.

    ``stop_after_result`` says whether a finished session still holds resources worth
    freeing with a stop call (an ACR microVM does; an HTTP server's finished task does not).
    """

    name: str
    stop_after_result: bool

    async def invoke(self, session_id: str, payload: Mapping[str, Any]) -> dict[str, Any]: ...

    async def stop(self, session_id: str) -> bool:
        """True when something was running."""

    async def status(self, session_id: str) -> protocol.SessionState:
        """A restarted agent answers unknown."""

    async def aclose(self) -> None: ...


def session_state(
    answer: Mapping[str, Any], *, source: str, session_id: str
) -> protocol.SessionState:
    """``InvocationError`` without one (an agent server without the status route)."""
    try:
        return protocol.SessionState(answer.get(protocol.SESSION_STATE))
    except ValueError:
        raise InvocationError(
            f"{source} answered {str(answer)[:200]} to a status request", session_id=session_id
        ) from None
