"""Retrying one call to the agent runtime, paced by the rate limiter.

Example::

    answer = await with_retries(lambda: transport.invoke(sid, body), retry=RetryPolicy(),
                                limiter=bucket, counters=counters, what=f"invoking {sid}")
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from agentcore_rl.client.stats import ClientCounters
from agentcore_rl.client.transports.base import RetryableError
from agentcore_rl.errors import InvocationError
from agentcore_rl.ratelimit import Priority, RateLimiter
from agentcore_rl.retry import RetryPolicy

__all__ = ["with_retries"]

T = TypeVar("T")


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    retry: RetryPolicy,
    limiter: RateLimiter,
    counters: ClientCounters,
    what: str,
    priority: int = Priority.INVOKE,
) -> T:
    """Run ``call``; on :class:`RetryableError` wait, take a token and try again.

    The caller has taken the first attempt's token. A throttle answer is reported to the
    limiter (which slows down), and so is the final success. An answer with
    ``retry_after`` (an overloaded server) is a pause: waited out (``retry.sleep``),
    counted as a throttle and sent again without using up an attempt. When the attempts
    run out, raise ``InvocationError`` naming ``what``.
    """
    attempts = 0

    async def attempt(number: int) -> T:
        nonlocal attempts
        attempts = number
        if number > 1:
            counters.retries += 1
            await limiter.acquire(priority)
        while True:
            try:
                answer = await call()
            except RetryableError as exc:
                if exc.throttled or exc.retry_after is not None:
                    counters.throttles += 1
                    limiter.on_throttle()
                if exc.retry_after is None:
                    raise
                await retry.sleep(exc.retry_after)
                await limiter.acquire(priority)
                continue
            limiter.on_success()
            return answer

    try:
        return await retry.run(attempt, _is_retryable)
    except RetryableError as exc:
        raise InvocationError(
            f"{what} failed after {attempts} attempt{'s' if attempts > 1 else ''}: {exc}",
            session_id=exc.session_id,
            status_code=exc.status_code,
        ) from exc


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, RetryableError)
