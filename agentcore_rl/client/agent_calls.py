"""The client's calls to its agents: invocations (with the call retries and the window in
which an agent may be unreachable) and session stops, each stop a task of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentcore_rl import protocol
from agentcore_rl.client.config import Retries
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.client.transports.transport import (
    NotConnectedError,
    RetryableError,
    StopUnsupportedError,
    Transport,
)
from agentcore_rl.errors import AgentUnreachableError, InvocationError
from agentcore_rl.ratelimit import Priority, RateLimiter

if TYPE_CHECKING:
    from agentcore_rl.client.service import Service

__all__ = ["AgentCalls", "as_repeat"]

logger = logging.getLogger(__name__)


class AgentCalls:
    """Every call one client makes to its agents, paced by its limiter and counted;
    ``unstopped``: the sessions whose stop failed or never ran (the client closed)."""

    def __init__(
        self,
        *,
        transport: Transport,
        limiter: RateLimiter,
        counters: ClientStats,
        retries: Retries,
        service: Service,
        unreachable_after: float,
    ) -> None:
        self.transport = transport
        self.limiter = limiter
        self.counters = counters
        self.retries = retries
        self.service = service
        self.unreachable_after = unreachable_after
        self.clock: Callable[[], float] = time.monotonic  # the unreachable window's
        self.unstopped: list[str] = []
        self._stopping: set[str] = set()
        # asyncio's: clearable, and made before the loop runs.
        self.idle = asyncio.Event()
        self.idle.set()

    async def invoke(self, sid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send ``body`` in session ``sid`` with the call retries. While no attempt
        connected, failed ones are retried for ``unreachable_after`` seconds at most, each
        on another agent if the transport has one; then ``AgentUnreachableError``."""
        reached = False
        first_failure: float | None = None
        sends = 0

        async def send() -> dict[str, Any]:
            nonlocal reached, first_failure, sends
            self.counters.invocations += 1
            sends += 1
            # A re-send may follow an answer lost after the agent ran it: marked, the agent
            # checks for an earlier run first.
            try:
                answer = await self.transport.invoke(sid, body if sends == 1 else as_repeat(body))
            except NotConnectedError as exc:
                if reached:
                    raise
                now = self.clock()
                first_failure = now if first_failure is None else first_failure
                if now - first_failure >= self.unreachable_after:
                    raise _unreachable(sid, sends, now - first_failure, exc) from exc
                reassign = getattr(self.transport, "reassign", None)
                if reassign is not None:
                    reassign(sid)
                raise
            except BaseException:
                reached = True  # the request may have reached the agent
                raise
            reached = True
            return answer

        try:
            answer: dict[str, Any] = await self.call(
                send, what=f"invoking session {sid}", priority=Priority.INVOKE
            )
            return answer
        except InvocationError as exc:
            cause = exc.__cause__
            if not reached and isinstance(cause, NotConnectedError):
                spent = 0.0 if first_failure is None else self.clock() - first_failure
                raise _unreachable(sid, sends, spent, cause) from cause
            raise

    async def call(self, send: Callable[[], Awaitable[Any]], *, what: str, priority: int) -> Any:
        """Run ``send`` (the caller took its first token); on :class:`RetryableError` wait,
        take a token and try again; when the attempts run out, ``InvocationError`` naming
        ``what``. ``retry_after`` (an overloaded server) is a pause, not an attempt."""
        policy = self.retries.call
        tries = 0

        async def attempt(number: int) -> Any:
            nonlocal tries
            tries = number
            if number > 1:
                self.counters.retries += 1
                await self.limiter.acquire(priority)
            while True:
                try:
                    answer = await send()
                except RetryableError as exc:
                    if exc.throttled or exc.retry_after is not None:
                        self.counters.throttles += 1
                        self.limiter.on_throttle()
                    if exc.retry_after is None:
                        raise
                    await policy.sleep(exc.retry_after)  # a pause, not a failed attempt
                    await self.limiter.acquire(priority)
                    continue
                self.limiter.on_success()
                return answer

        try:
            return await policy.run(attempt, lambda exc: isinstance(exc, RetryableError))
        except RetryableError as exc:
            raise InvocationError(
                f"{what} failed after {tries} attempt{'s' if tries > 1 else ''}: {exc}",
                session_id=exc.session_id,
                status_code=exc.status_code,
            ) from exc

    def stop_soon(self, session_id: str) -> None:
        """In a task of its own, behind every invocation; never blocks."""
        if session_id in self._stopping:
            return
        if not self.service.running:
            logger.warning("session %s not stopped: the client is closed", session_id)
            self.unstopped.append(session_id)
            return
        self._stopping.add(session_id)
        self.idle.clear()
        self.service.start_soon(self.stop, session_id, name=f"stop {session_id}")

    async def stop(self, session_id: str) -> None:
        stopped = False
        try:
            await self.limiter.acquire(Priority.STOP)
            await self.call(
                lambda: self.transport.stop(session_id),
                what=f"stopping session {session_id}",
                priority=Priority.STOP,
            )
            self.counters.stops += 1
            stopped = True
        except StopUnsupportedError:
            self.counters.stops_unsupported += 1  # the transport said so once, at INFO
            stopped = True
        except Exception as exc:
            self.counters.stop_failures += 1
            logger.warning("could not stop session %s: %s", session_id, exc)
        finally:
            self._stopping.discard(session_id)
            if not stopped:
                self.unstopped.append(session_id)
            if not self._stopping:
                self.idle.set()

    def report_unstopped(self, close_timeout: float) -> None:
        if self.unstopped:
            logger.warning(
                "%d session(s) could not be stopped (within %s s of closing, or their stop "
                "failed) and may still run: client.unstopped_sessions lists them, e.g. %s",
                len(self.unstopped),
                close_timeout,
                ", ".join(self.unstopped[:3]),
            )


def as_repeat(body: Mapping[str, Any]) -> dict[str, Any]:
    """``_rollout.repeat: true``: a re-send of an invocation that may have run."""
    block = body.get(protocol.ROLLOUT_FIELD)
    rollout = dict(block) if isinstance(block, Mapping) else {}
    rollout[protocol.REPEAT] = True
    return {**body, protocol.ROLLOUT_FIELD: rollout}


def _unreachable(
    sid: str, attempts: int, spent: float, exc: NotConnectedError
) -> AgentUnreachableError:
    return AgentUnreachableError(
        f"invoking session {sid}: no connection to the agent in {attempts} "
        f"attempt{'s' if attempts > 1 else ''} over {spent:.1f} s ({exc}); nothing was "
        "started. Is the agent running at that address?",
        session_id=sid,
    )
