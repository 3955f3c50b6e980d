"""The trainer side: drive rollouts on agent servers and collect their results from S3.

Example::

    from agentcore_rl.client import AsyncRolloutClient, Limits

    async with AsyncRolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                                  exp_id="e1", limits=Limits(max_concurrent_sessions=8)) as client:
        result = await client.rollout({"prompt": "2+2?"})
"""

from agentcore_rl.client import _extra  # noqa: F401  (first: a missing extra is named)
from agentcore_rl.client.batch import BatchItem
from agentcore_rl.client.client import AsyncRolloutClient, ClientState
from agentcore_rl.client.config import (
    AwsConfig,
    GatewayConfig,
    InfraStop,
    Limits,
    Retries,
    Timeouts,
)
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.groups import GroupFuture
from agentcore_rl.client.liveness import LivenessConfig
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.client.sync import RolloutClient
from agentcore_rl.client.watcher import CompletionWatcher, WatcherConfig
from agentcore_rl.ratelimit import (
    LocalSessionLimiter,
    Priority,
    RateLimiter,
    SessionLimiter,
    TokenBucket,
)
from agentcore_rl.retry import RetryPolicy

__all__ = [
    "AsyncRolloutClient",
    "AwsConfig",
    "BatchItem",
    "ClientState",
    "ClientStats",
    "CompletionWatcher",
    "GatewayConfig",
    "GroupFuture",
    "InfraStop",
    "Limits",
    "LivenessConfig",
    "LocalSessionLimiter",
    "Priority",
    "RateLimiter",
    "Retries",
    "RetryPolicy",
    "RolloutClient",
    "RolloutFuture",
    "SessionLimiter",
    "Timeouts",
    "TokenBucket",
    "WatcherConfig",
]
