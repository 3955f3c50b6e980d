"""RetryPolicy: how a transient failure is retried, for S3 requests and agent calls alike."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from agentcore_rl.keywords import check_numbers

__all__ = ["RetryPolicy"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """``attempts`` tries in all, with exponential backoff from ``initial`` seconds up to
    ``maximum``, plus up to ``jitter`` seconds (``sleep`` injectable for tests). The
    defaults suit calls to the agent runtime; S3's are :data:`agentcore_rl.s3.DEFAULT_S3_RETRY`.

    Example::

        RetryPolicy(attempts=3, initial=0.1)
    """

    attempts: int = 5
    initial: float = 0.5
    maximum: float = 10.0
    jitter: float = 0.5
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    def __post_init__(self) -> None:
        check_numbers(self, "attempts", at_least=1, integer=True)
        check_numbers(self, "initial", "maximum", "jitter", at_least=0)

    async def run(
        self,
        attempt: Callable[[int], Awaitable[T]],
        retryable: Callable[[BaseException], bool],
    ) -> T:
        """``attempt(1)``, ``attempt(2)``... until one returns, one raises what ``retryable``
        refuses, or the attempts run out (the last error is raised).

        The first attempt runs without tenacity: building its loop costs about 35 us of
        CPU, paid on every one of the client's requests although few are retried.
        """
        try:
            return await attempt(1)
        except Exception as exc:
            if self.attempts == 1 or not retryable(exc):
                raise
        # The wait after try 1, then tenacity for tries 2..attempts: its n-th wait
        # (initial * 2**(n-1)) is the policy's (n+1)-th, hence the doubled multiplier.
        await self.sleep(min(self.initial, self.maximum) + random.uniform(0, self.jitter))
        rest = AsyncRetrying(
            stop=stop_after_attempt(self.attempts - 1),
            wait=wait_exponential(multiplier=self.initial * 2, max=self.maximum)
            + wait_random(0, self.jitter),
            retry=retry_if_exception(retryable),
            sleep=self.sleep,
            reraise=True,
        )
        number = 1
        async for state in rest:
            with state:
                number += 1
                return await attempt(number)
        raise AssertionError("unreachable: tenacity either returns or raises")
