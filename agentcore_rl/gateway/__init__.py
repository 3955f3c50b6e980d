"""The token-capturing rollout gateway: every model call an agent makes, filed under its rollout
(docs/gateway.md).

Example::

    from agentcore_rl.gateway import RolloutGateway

    gateway = RolloutGateway("http://127.0.0.1:8000/v1")
    async with gateway:
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from agentcore_rl._extras import require
from agentcore_rl.errors import GatewayError, TraceLostError
from agentcore_rl.trace import CallRecord, Completion, SessionTrace, dump_trace, load_trace

if TYPE_CHECKING:
    from agentcore_rl.gateway.gateway import ADMIN_TOKEN_ENV, RolloutGateway
    from agentcore_rl.gateway.render.mode import RenderMode
    from agentcore_rl.gateway.sessions import DirectorySink, GatewayOptions, TraceSink

# Imported on first use (PEP 562): a trainer that only reads traces (``agentcore_rl.trace``)
# needs neither Starlette nor uvicorn, which the gateway app does.
_LAZY: dict[str, str] = {
    "ADMIN_TOKEN_ENV": "agentcore_rl.gateway.gateway",
    "DirectorySink": "agentcore_rl.gateway.sessions",
    "GatewayOptions": "agentcore_rl.gateway.sessions",
    "TraceSink": "agentcore_rl.gateway.sessions",
    "RolloutGateway": "agentcore_rl.gateway.gateway",
    "RenderMode": "agentcore_rl.gateway.render.mode",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentcore_rl.gateway' has no attribute {name!r}")
    require("gateway", "agentcore_rl.gateway", "starlette", "orjson")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ADMIN_TOKEN_ENV",
    "CallRecord",
    "Completion",
    "DirectorySink",
    "GatewayError",
    "GatewayOptions",
    "RenderMode",
    "RolloutGateway",
    "SessionTrace",
    "TraceLostError",
    "TraceSink",
    "dump_trace",
    "load_trace",
]
