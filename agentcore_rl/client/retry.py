"""Retrying one call to the agent runtime, paced by the token bucket.

Example::

    answer = await with_retries(lambda: transport.invoke(sid, body), retry=RetryConfig(),
                                bucket=bucket, counters=counters, what=f"invoking {sid}")
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from agentcore_rl.client.bucket import Priority, TokenBucket
from agentcore_rl.client.config import RetryConfig
from agentcore_rl.client.transports.base import RetryableError
from agentcore_rl.errors import InvocationError

__all__ = ["with_retries"]

T = TypeVar("T")


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    retry: RetryConfig,
    bucket: TokenBucket,
    counters: Counter[str],
    what: str,
    priority: int = Priority.INVOKE,
) -> T:
    """Run ``call``; on :class:`RetryableError` wait, take a token and try again.

    The caller has taken the first attempt's token. A throttle answer also slows the
    bucket down. When the attempts run out, raise ``InvocationError`` naming ``what``.

    Example::

        await with_retries(lambda: transport.stop(sid), retry=cfg, bucket=bucket,
                           counters=counters, what=f"stopping {sid}", priority=Priority.STOP)
    """
    attempts = 0
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(retry.attempts),
            wait=wait_exponential(multiplier=retry.initial, max=retry.maximum)
            + wait_random(0, retry.jitter),
            retry=retry_if_exception_type(RetryableError),
            sleep=retry.sleep,
            reraise=True,
        ):
            with attempt:
                attempts += 1
                if attempts > 1:
                    counters["retries"] += 1
                    await bucket.acquire(priority)
                try:
                    return await call()
                except RetryableError as exc:
                    if exc.throttled:
                        counters["throttles"] += 1
                        bucket.on_throttle()
                    raise
    except RetryableError as exc:
        raise InvocationError(
            f"{what} failed after {attempts} attempt{'s' if attempts > 1 else ''}: {exc}",
            session_id=exc.session_id,
            status_code=exc.status_code,
        ) from exc
    raise AssertionError("unreachable: tenacity either returns or raises")
