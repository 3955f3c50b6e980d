"""The token-capturing rollout gateway: every model call an agent makes, filed under its rollout.

See ``docs/gateway.md``. The pieces: :class:`RolloutGateway` (the ASGI app and the trainer's
API), :class:`CallRecord` / :class:`SessionTrace` (what is captured, with
:func:`dump_trace` / :func:`load_trace`), :class:`DirectorySink` (where expired sessions go)
and :class:`TraceLostError`.

Example::

    from agentcore_rl.gateway import RolloutGateway

    gateway = RolloutGateway("http://127.0.0.1:8000/v1")
    async with gateway:
        ...
"""

from agentcore_rl.gateway.app import ADMIN_TOKEN_ENV, DEFAULT_SESSION_TTL, RolloutGateway
from agentcore_rl.gateway.errors import GatewayError, TraceLostError
from agentcore_rl.gateway.record import (
    CallRecord,
    Completion,
    SessionTrace,
    dump_trace,
    load_trace,
    trace_key,
)
from agentcore_rl.gateway.sessions import DirectorySink, TraceSink

__all__ = [
    "ADMIN_TOKEN_ENV",
    "DEFAULT_SESSION_TTL",
    "CallRecord",
    "Completion",
    "DirectorySink",
    "GatewayError",
    "RolloutGateway",
    "SessionTrace",
    "TraceLostError",
    "TraceSink",
    "dump_trace",
    "load_trace",
    "trace_key",
]
