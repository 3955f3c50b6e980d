"""RetryPolicy.run: the first try outside tenacity, the later ones on the policy's waits."""

from __future__ import annotations

import pytest

from agentcore_rl.retry import RetryPolicy


class Flaky(Exception):
    pass


async def test_run_waits_as_the_policy_says_and_raises_the_last_error() -> None:
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    policy = RetryPolicy(attempts=4, initial=0.1, maximum=0.3, jitter=0.0, sleep=record)
    tries: list[int] = []

    async def always_fails(number: int) -> None:
        tries.append(number)
        raise Flaky(number)

    with pytest.raises(Flaky, match="4"):
        await policy.run(always_fails, lambda exc: isinstance(exc, Flaky))
    assert tries == [1, 2, 3, 4]
    assert delays == pytest.approx([0.1, 0.2, 0.3])


async def test_run_returns_the_first_success_and_does_not_retry_the_rest() -> None:
    policy = RetryPolicy(attempts=3, initial=0.0, maximum=0.0, jitter=0.0)

    async def second_time(number: int) -> int:
        if number == 1:
            raise Flaky
        return number

    assert await policy.run(second_time, lambda exc: isinstance(exc, Flaky)) == 2

    async def refused(number: int) -> int:
        raise ValueError(number)

    with pytest.raises(ValueError, match="1"):
        await policy.run(refused, lambda exc: isinstance(exc, Flaky))
