"""The agent server's defaults, environment variable names and listening-host rule.

Example::

    from agentcore_rl.server.settings import DEFAULT_SHUTDOWN_GRACE, default_host

    app = AgentCoreRLApp(shutdown_grace=2 * DEFAULT_SHUTDOWN_GRACE)
    app.run(host=default_host())
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from agentcore_rl.server.parsing import ALLOWED_BUCKETS_ENV

__all__ = [
    "ALLOWED_BUCKETS_ENV",
    "DEFAULT_GIL_SWITCH_INTERVAL",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_SYNC_WORKERS",
    "DEFAULT_SHUTDOWN_GRACE",
    "DEFAULT_STOP_WAIT",
    "HOST_ENV",
    "SPOOL_DIR_ENV",
    "default_host",
]

#: ACR accepts payloads up to 100 MB; so does the server unless told otherwise.
DEFAULT_MAX_BODY_BYTES: Final = 100 * 1024 * 1024
#: Seconds running rollouts get to finish at shutdown before they are cancelled.
DEFAULT_SHUTDOWN_GRACE: Final = 20.0
#: Worker threads for sync handlers (more than anyio's default of 40, since rollout
#: handlers mostly wait on a model server).
DEFAULT_MAX_SYNC_WORKERS: Final = 64
#: Seconds a stop request waits for the stopped rollouts' envelopes to be written.
DEFAULT_STOP_WAIT: Final = 5.0

#: Seconds between GIL hand-offs set at startup. Python's default (5 ms) lets two threads
#: that burn CPU hold the event loop off the GIL long enough that /ping answers take
#: 100+ ms; 1 ms keeps them near 10 ms (see benchmarks/server.py).
DEFAULT_GIL_SWITCH_INTERVAL: Final = 0.001

#: Directory for envelopes S3 refused (default: a fresh temporary directory per app).
SPOOL_DIR_ENV: Final = "AGENTCORE_RL_SPOOL_DIR"
#: Interface :meth:`AgentCoreRLApp.run` listens on when no host is passed.
HOST_ENV: Final = "AGENTCORE_RL_HOST"


def default_host() -> str:
    """``$AGENTCORE_RL_HOST``, else ``0.0.0.0`` inside a container, else ``127.0.0.1``.

    A container is recognised by ``DOCKER_CONTAINER`` in the environment (AWS's AgentCore
    starter Dockerfiles set it), ``/.dockerenv`` or ``/run/.containerenv``. Outside one,
    the server only listens on loopback so a laptop does not expose the agent.

    Example::

        uvicorn.run(app, host=default_host(), port=8080)
    """
    host = os.environ.get(HOST_ENV, "").strip()
    if host:
        return host
    in_container = bool(os.environ.get("DOCKER_CONTAINER")) or any(
        Path(p).exists() for p in ("/.dockerenv", "/run/.containerenv")
    )
    return "0.0.0.0" if in_container else "127.0.0.1"
