"""Limits shared by many trainer processes on a Ray cluster (extra ``[ray]``).

Example::

    from agentcore_rl.distributed import shared_limits

    async with shared_limits("acr-math", tps=25, sessions=500) as limits:
        async with AsyncRolloutClient(..., rate_limiter=limits.rate,
                                      session_limiter=limits.sessions) as client:
            ...
"""

from agentcore_rl.distributed.limits import (
    DEFAULT_NAMESPACE,
    LimitsActor,
    LimitsConfig,
    SharedLimits,
    shared_limits,
)

__all__ = ["DEFAULT_NAMESPACE", "LimitsActor", "LimitsConfig", "SharedLimits", "shared_limits"]
