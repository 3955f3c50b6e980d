"""The gateway's errors, defined in :mod:`agentcore_rl.errors` (re-exported here).

Example::

    try:
        trace = await gateway.finish_session(sid)
    except TraceLostError as exc:
        print(exc.session_id, exc)
"""

from __future__ import annotations

from agentcore_rl.errors import GatewayError, TraceLostError

__all__ = ["GatewayError", "TraceLostError"]
