"""The token-capturing rollout gateway: every model call an agent makes, filed under its rollout.

See ``docs/gateway.md``. The pieces: :class:`RolloutGateway` (the ASGI app and the trainer's
API), :class:`CallRecord` / :class:`SessionTrace` (what is captured, with
:func:`dump_trace` / :func:`load_trace`), :class:`DirectorySink` (where expired sessions go),
:class:`RenderMode` (linear history: the gateway renders and calls the server token-in; the
``render`` extra) and :class:`TraceLostError`.

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

if TYPE_CHECKING:
    from agentcore_rl.errors import GatewayError, TraceLostError
    from agentcore_rl.gateway.app import ADMIN_TOKEN_ENV, DEFAULT_SESSION_TTL, RolloutGateway
    from agentcore_rl.gateway.record import (
        CallRecord,
        Completion,
        DirectorySink,
        SessionTrace,
        TraceSink,
        dump_trace,
        load_trace,
        trace_key,
    )
    from agentcore_rl.gateway.render.mode import RenderMode

# Imported on first use (PEP 562): a trainer that only reads traces (``record``) needs
# neither Starlette nor uvicorn, which the gateway app does.
_MODULES: dict[str, tuple[str, ...]] = {
    "agentcore_rl.gateway.app": ("ADMIN_TOKEN_ENV", "DEFAULT_SESSION_TTL", "RolloutGateway"),
    "agentcore_rl.errors": ("GatewayError", "TraceLostError"),
    "agentcore_rl.gateway.record": (
        "CallRecord",
        "Completion",
        "DirectorySink",
        "SessionTrace",
        "TraceSink",
        "dump_trace",
        "load_trace",
        "trace_key",
    ),
    "agentcore_rl.gateway.render.mode": ("RenderMode",),
}
_LAZY: dict[str, str] = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentcore_rl.gateway' has no attribute {name!r}")
    if module == "agentcore_rl.gateway.app":
        require("gateway", "agentcore_rl.gateway", "starlette", "orjson")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ADMIN_TOKEN_ENV",
    "DEFAULT_SESSION_TTL",
    "CallRecord",
    "Completion",
    "DirectorySink",
    "GatewayError",
    "RenderMode",
    "RolloutGateway",
    "SessionTrace",
    "TraceLostError",
    "TraceSink",
    "dump_trace",
    "load_trace",
    "trace_key",
]
