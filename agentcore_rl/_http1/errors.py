"""What the shared HTTP/1.1 client raises: one base class, so a caller that only needs
"the server failed" catches :class:`HttpError`, and one class per failure its callers tell
apart (aiobotocore raises different botocore exceptions for each).

Example::

    try:
        status, headers, body = await pool.send(request)
    except HttpTimeoutError as exc:
        retry_later = not exc.connect
"""

from __future__ import annotations

__all__ = ["HttpClosedError", "HttpConnectError", "HttpError", "HttpTimeoutError"]


class HttpError(Exception):
    """The server could not be reached, broke off, went silent or spoke no HTTP."""


class HttpConnectError(HttpError, ConnectionError):
    """The connection did not open (refused, unknown host, TLS handshake): the cause is
    the socket's or TLS's own error (``__cause__``)."""


class HttpClosedError(HttpError, ConnectionError):
    """The connection closed before the whole answer arrived, or the answer was not HTTP."""


class HttpTimeoutError(HttpError, TimeoutError):
    """No answer byte for the read timeout; ``connect``: the connection did not open in
    the connect timeout."""

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
