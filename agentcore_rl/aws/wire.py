"""The lean AWS path's connections: the shared HTTP/1.1 pool
(:class:`agentcore_rl._http1.Pool`) with a signed request's shape and the generic client's
settings.

A request's head (its signed headers, ``Host`` as signed) and body go out as one write;
settings come from the generic client's aiohttp session (pool size, connect and read
timeouts, TLS context, keep-alive time, see :func:`pool_settings`). Failures are the
pool's :class:`~agentcore_rl._http1.HttpError`\\ s, which
:func:`agentcore_rl.aws.http.transport_error` turns into what aiobotocore raises for the
same aiohttp failure.

Example::

    pool = WirePool("http://127.0.0.1:9000", limit=64, connect_timeout=10, read_timeout=60)
    status, headers, body = await pool.request("GET", "/bucket/key", [("X-Amz-Date", d)], b"")
    pool.close()
"""

from __future__ import annotations

import ssl as ssl_module
from typing import Any

from agentcore_rl._http1 import DEFAULT_KEEPALIVE, Pool
from agentcore_rl.errors import ConfigurationError

__all__ = ["WirePool", "pool_settings"]


class WirePool:
    """Keep-alive connections to one origin (``scheme://host[:port]``), at most ``limit``
    open at once. Keyword arguments are :class:`~agentcore_rl._http1.Pool`'s
    (``host_header``: the ``Host`` value that was signed).

    Example::

        pool = WirePool("https://s3.us-west-2.amazonaws.com", limit=64)
        status, headers, body = await pool.request("GET", "/b/k", headers, b"")
    """

    __slots__ = ("_host_line", "_pool", "origin")

    def __init__(self, origin: str, **settings: Any) -> None:
        try:
            self._pool = Pool(origin, **settings)
        except ValueError as exc:
            raise ConfigurationError(f"WirePool: {exc}") from None
        self.origin = origin
        self._host_line = f"Host: {self._pool.host_header}\r\n"

    def __repr__(self) -> str:
        return f"WirePool({self.origin!r})"

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send one request (``target``: path and query, already encoded); return the
        status, the raw headers and the whole body.

        Example::

            status, headers, body = await pool.request("POST", "/x", [("A", "b")], b"{}")
        """
        parts = [method, " ", target, " HTTP/1.1\r\n", self._host_line]
        for name, value in headers:
            parts += (name, ": ", value, "\r\n")
        if body or method != "GET":
            parts += ("Content-Length: ", str(len(body)), "\r\n")
        parts.append("\r\n")
        data = "".join(parts).encode("latin-1")
        return await self._pool.send(data + body if body else data)

    def close(self) -> None:
        """Close the idle connections (those in use close when their request ends)."""
        self._pool.close()


def pool_settings(http_session: Any, ssl_context: Any = None) -> dict[str, Any]:
    """A :class:`WirePool`'s settings from aiobotocore's HTTP session (``AIOHTTPSession``):
    pool size, connect and read timeouts, keep-alive time; ``ssl_context`` is the TLS
    context of its aiohttp connector (for ``https`` origins).

    Example::

        pool = WirePool(origin, **pool_settings(client._endpoint.http_session))
    """
    timeout = http_session._timeout
    connector_args = getattr(http_session, "_connector_args", None) or {}
    keepalive = connector_args.get("keepalive_timeout")
    if not isinstance(ssl_context, ssl_module.SSLContext | bool):
        ssl_context = None
    return {
        "limit": http_session._max_pool_connections or 1024,
        "connect_timeout": timeout.sock_connect or timeout.connect,
        "read_timeout": timeout.sock_read,
        "keepalive": keepalive if isinstance(keepalive, int | float) else DEFAULT_KEEPALIVE,
        "ssl_context": ssl_context,
    }
