"""What makes one machine a whole stack: embedded S3, a local AgentCore Runtime stand-in, a
scripted policy server for demos and tests, and :class:`LocalStack` tying them together.

Example::

    from agentcore_rl.local import LocalStack

    async with LocalStack("examples.math_agent.agent:app") as stack:
        print(stack.agent_runtime_arn, stack.runtime_endpoint_url)
"""

from agentcore_rl.local import _extra  # noqa: F401  (first: a missing extra is named)
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.embedded_s3 import EmbeddedS3
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.runtime import LocalAgentCoreRuntime, run_local_runtime
from agentcore_rl.local.stack import LocalStack

__all__ = [
    "BackgroundServer",
    "EmbeddedS3",
    "LocalAgentCoreRuntime",
    "LocalStack",
    "ScriptedPolicy",
    "run_local_runtime",
]
