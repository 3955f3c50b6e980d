"""What makes one machine a whole stack: embedded S3, a local AgentCore Runtime stand-in, a
scripted policy server for demos and tests, and :class:`LocalStack` tying them together.

Its names are imported on first use: each part costs its imports only when used.

Example::

    from agentcore_rl.local import LocalStack

    async with LocalStack("examples.math_agent.agent:app") as stack:
        print(stack.agent_runtime_arn, stack.runtime_endpoint_url)
"""

import importlib
from typing import TYPE_CHECKING, Any

from agentcore_rl._extras import require

if TYPE_CHECKING:
    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.embedded_s3 import EmbeddedS3
    from agentcore_rl.local.policy import ScriptedPolicy
    from agentcore_rl.local.runtime import LocalAgentCoreRuntime
    from agentcore_rl.local.stack import LocalStack, running_stack

# What importing needs; the embedded S3 names the extra again for moto when it starts.
require("local", "agentcore_rl.local", "starlette", "uvicorn", "httpx")

_HOMES = {
    "BackgroundServer": "background",
    "EmbeddedS3": "embedded_s3",
    "LocalAgentCoreRuntime": "runtime",
    "LocalStack": "stack",
    "ScriptedPolicy": "policy",
    "running_stack": "stack",
}

__all__ = [
    "BackgroundServer",
    "EmbeddedS3",
    "LocalAgentCoreRuntime",
    "LocalStack",
    "ScriptedPolicy",
    "running_stack",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agentcore_rl.local' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentcore_rl.local.{home}"), name)
