"""The trainer side: drive rollouts on agent servers and collect their results from S3.

Example::

    from agentcore_rl.client import AsyncRolloutClient

    async with AsyncRolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                                  exp_id="e1") as client:
        result = await client.rollout({"prompt": "2+2?"})
"""

from agentcore_rl.client.batch import BatchItem
from agentcore_rl.client.client import AsyncRolloutClient, ClientState, run_batch
from agentcore_rl.client.config import RetryConfig
from agentcore_rl.client.faults import FaultConfig
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.groups import GroupFuture
from agentcore_rl.client.liveness import LivenessConfig
from agentcore_rl.client.stats import ClientStats
from agentcore_rl.client.sync import RolloutClient
from agentcore_rl.client.watcher import CompletionWatcher, WatcherConfig
from agentcore_rl.ratelimit import Priority, RateLimiter, TokenBucket
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.sessionlimit import LocalSessionLimiter, SessionLimiter

__all__ = [
    "AsyncRolloutClient",
    "BatchItem",
    "ClientState",
    "ClientStats",
    "CompletionWatcher",
    "FaultConfig",
    "GroupFuture",
    "LivenessConfig",
    "LocalSessionLimiter",
    "Priority",
    "RateLimiter",
    "RetryConfig",
    "RetryPolicy",
    "RolloutClient",
    "RolloutFuture",
    "SessionLimiter",
    "TokenBucket",
    "WatcherConfig",
    "run_batch",
]
