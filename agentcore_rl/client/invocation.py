"""Sending one invocation: retries, the agent's answer, and whether a failure left a session.

Example::

    try:
        await send_invocation(transport, fut, body, retry=retry, limiter=limiter,
                              counters=counters)
    except BaseException as exc:
        if may_have_started(exc):
            stopper.schedule(fut.session_id)
        raise
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.liveness import DEFAULT_UNREACHABLE_AFTER
from agentcore_rl.client.retry import with_retries
from agentcore_rl.client.stats import ClientCounters
from agentcore_rl.client.transports.base import NotConnectedError, Transport
from agentcore_rl.errors import AgentUnreachableError, InvocationError
from agentcore_rl.ratelimit import RateLimiter
from agentcore_rl.retry import RetryPolicy

__all__ = ["as_repeat", "check_answer", "may_have_started", "send_invocation"]

logger = logging.getLogger(__name__)


async def send_invocation(
    transport: Transport,
    fut: RolloutFuture,
    body: Mapping[str, Any],
    *,
    retry: RetryPolicy,
    limiter: RateLimiter,
    counters: ClientCounters,
    unreachable_after: float = DEFAULT_UNREACHABLE_AFTER,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Send ``body`` for ``fut``'s session (with retries, each paced by ``limiter``) and
    check the answer (see :func:`check_answer`). Counts ``invocations`` and retries.

    While no attempt has connected, failed attempts are retried for ``unreachable_after``
    seconds (by ``clock``) at most, each on another agent if the transport has one
    (``reassign``); then :class:`AgentUnreachableError`: nothing was started."""

    sent = 0
    reached = False
    first_failure: float | None = None

    async def send() -> dict[str, Any]:
        nonlocal sent, reached, first_failure
        counters.invocations += 1
        sent += 1
        # A retry may follow an answer that was lost after the agent ran the rollout:
        # marked, the agent checks for an earlier run before running it again.
        try:
            answer = await transport.invoke(fut.session_id, body if sent == 1 else as_repeat(body))
        except NotConnectedError as exc:
            if reached:
                raise
            now = clock()
            if first_failure is None:
                first_failure = now
            if now - first_failure >= unreachable_after:
                raise _unreachable(fut, sent, now - first_failure, exc) from exc
            reassign = getattr(transport, "reassign", None)
            if reassign is not None:
                reassign(fut.session_id)
            raise
        except BaseException:
            reached = True  # the request may have reached the agent
            raise
        reached = True
        return answer

    try:
        answer = await with_retries(
            send,
            retry=retry,
            limiter=limiter,
            counters=counters,
            what=f"invoking session {fut.session_id}",
        )
    except InvocationError as exc:
        cause = exc.__cause__
        if not reached and isinstance(cause, NotConnectedError):
            spent = 0.0 if first_failure is None else clock() - first_failure
            raise _unreachable(fut, sent, spent, cause) from cause
        raise
    check_answer(answer, fut)


def _unreachable(
    fut: RolloutFuture, attempts: int, spent: float, exc: NotConnectedError
) -> AgentUnreachableError:
    return AgentUnreachableError(
        f"invoking session {fut.session_id}: no connection to the agent in {attempts} "
        f"attempt{'s' if attempts > 1 else ''} over {spent:.1f} s ({exc}); nothing was "
        "started. Is the agent running at that address?",
        session_id=fut.session_id,
    )


def as_repeat(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with ``_rollout.repeat: true``: a re-send of an invocation that may have
    run (a retry after a lost answer, a resumed run's re-invoke)."""
    block = body.get(protocol.ROLLOUT_FIELD)
    rollout = dict(block) if isinstance(block, Mapping) else {}
    rollout[protocol.REPEAT] = True
    return {**body, protocol.ROLLOUT_FIELD: rollout}


def check_answer(answer: Mapping[str, Any], fut: RolloutFuture) -> None:
    """Raise ``InvocationError`` unless the agent accepted the rollout; point ``fut`` at
    the bucket and key the agent says it writes to (with a warning when they differ)."""
    if answer.get(protocol.STATUS) != protocol.STATUS_PROCESSING:
        raise InvocationError(
            f"the agent answered {str(answer)[:200]} instead of "
            f'{{"{protocol.STATUS}": "{protocol.STATUS_PROCESSING}", ...}}: is its handler '
            "a rollout entrypoint (@app.rollout_entrypoint)?",
            session_id=fut.session_id,
        )
    key = answer.get(protocol.RESULT_KEY)
    bucket = answer.get(protocol.S3_BUCKET)
    if (key, bucket) != (fut.result_key, fut.s3_bucket):
        # The agent decides where it writes; follow it, but say so.
        logger.warning(
            "agent writes session %s to s3://%s/%s, not s3://%s/%s",
            fut.session_id,
            bucket,
            key,
            fut.s3_bucket,
            fut.result_key,
        )
        if isinstance(key, str) and isinstance(bucket, str):
            fut.result_key, fut.s3_bucket = key, bucket


def may_have_started(exc: BaseException) -> bool:
    """Whether the agent may run the session despite ``exc``: yes unless it clearly refused
    (an ``InvocationError`` with a status below 500) or was never reached."""
    if isinstance(exc, AgentUnreachableError):
        return False
    status = getattr(exc, "status_code", None)
    return not isinstance(exc, InvocationError) or status is None or status >= 500
