"""RetryPolicy: how a transient failure is retried, for S3 requests and agent calls alike."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from agentcore_rl.errors import ConfigurationError

__all__ = ["RetryPolicy"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """``attempts`` tries in all, with exponential backoff from ``initial`` seconds up to
    ``maximum``, plus up to ``jitter`` seconds. ``sleep`` is injectable so tests need not
    wait. The defaults suit calls to the agent runtime; S3 requests default to
    :data:`agentcore_rl.s3.DEFAULT_S3_RETRY`.

    Example::

        RetryPolicy(attempts=3, initial=0.1)
    """

    attempts: int = 5
    initial: float = 0.5
    maximum: float = 10.0
    jitter: float = 0.5
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if min(self.initial, self.maximum, self.jitter) < 0:
            raise ConfigurationError("RetryPolicy delays must be >= 0")

    async def run(
        self,
        attempt: Callable[[int], Awaitable[T]],
        retryable: Callable[[BaseException], bool],
    ) -> T:
        """``attempt(1)``, then ``attempt(2)``... until one returns, one raises what
        ``retryable`` refuses, or the attempts run out (the last error is raised). The wait
        after try ``n`` is ``initial * 2**(n-1)`` up to ``maximum``, plus the jitter.
        """
        number = 1
        while True:
            try:
                return await attempt(number)
            except Exception as exc:
                if number >= self.attempts or not retryable(exc):
                    raise
            backoff = min(self.initial * 2 ** (number - 1), self.maximum)
            await self.sleep(backoff + random.uniform(0, self.jitter))
            number += 1
