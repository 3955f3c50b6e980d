"""The library's own small HTTP/1.1 client (asyncio protocols, httptools' parser, a
keep-alive pool per origin), shared by the lean AWS path (:mod:`agentcore_rl.aws.wire`)
and the gateway's upstream calls (:mod:`agentcore_rl.gateway.upstream`); each adapts its
errors and request shapes. Not public API. Needs httptools (the ``client`` and ``gateway``
extras): importing this package does not import it, making a :class:`Pool` does.

Example::

    pool = Pool("http://127.0.0.1:8000", limit=64, read_timeout=60)
    status, headers, body = await pool.send(request_bytes)
"""

from agentcore_rl._http1.connection import Response
from agentcore_rl._http1.errors import (
    HttpClosedError,
    HttpConnectError,
    HttpError,
    HttpTimeoutError,
)
from agentcore_rl._http1.pool import DEFAULT_KEEPALIVE, Pool

__all__ = [
    "DEFAULT_KEEPALIVE",
    "HttpClosedError",
    "HttpConnectError",
    "HttpError",
    "HttpTimeoutError",
    "Pool",
    "Response",
]
