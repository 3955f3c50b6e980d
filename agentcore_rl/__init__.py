"""agentcore-rl: train and evaluate LLM agents with RL while they run as HTTP services.

Agent side: :class:`AgentCoreRLApp` turns an agent into a fire-and-forget rollout server
that writes each result to S3. Trainer side: :class:`AsyncRolloutClient` drives thousands
of rollouts and returns asyncio futures; :class:`RolloutClient` is its synchronous facade.

Example::

    from agentcore_rl import AgentCoreRLApp, AsyncRolloutClient

    app = AgentCoreRLApp()                      # in the agent's container

    @app.rollout_entrypoint
    async def solve(payload: dict) -> dict:
        return {"rewards": [1.0]}

    async with AsyncRolloutClient(agent_url="http://127.0.0.1:8080",   # in the trainer
                                  s3_bucket="rollouts", exp_id="e1") as client:
        result = await client.rollout({"prompt": "2+2?"})
"""

from agentcore_rl.client import (
    AsyncRolloutClient,
    BatchItem,
    ClientStats,
    RetryConfig,
    RolloutClient,
    RolloutFuture,
    TokenBucket,
    WatcherConfig,
)
from agentcore_rl.errors import (
    AgentCoreRLError,
    BucketNotAllowedError,
    ClientClosedError,
    ConfigurationError,
    InvalidPayloadError,
    InvalidRolloutConfig,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
)
from agentcore_rl.protocol import PingStatus, RolloutConfig
from agentcore_rl.ratelimit import RateLimiter
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.s3 import ResultStore, S3RetryPolicy
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from agentcore_rl.sessionlimit import LocalSessionLimiter, SessionLimiter

__version__ = "0.1.0"

__all__ = [
    "AgentCoreRLApp",
    "AgentCoreRLError",
    "AsyncRolloutClient",
    "BatchItem",
    "BucketNotAllowedError",
    "ClientClosedError",
    "ClientStats",
    "ConfigurationError",
    "InvalidPayloadError",
    "InvalidRolloutConfig",
    "InvocationError",
    "LocalSessionLimiter",
    "PingStatus",
    "RateLimiter",
    "RequestContext",
    "ResultStore",
    "RetryConfig",
    "RetryPolicy",
    "RolloutClient",
    "RolloutConfig",
    "RolloutError",
    "RolloutFuture",
    "RolloutTimeoutError",
    "S3RetryPolicy",
    "SessionLimiter",
    "StorageError",
    "TokenBucket",
    "WatcherConfig",
]
