"""The gateway's client for its inference servers: an aiohttp session per upstream, kept to
what a proxy needs (docs/gateway.md, "Where a call's time goes"). Every failure is one type,
:class:`UpstreamError`, which the gateway answers with a 502."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp.payload import BytesPayload
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from agentcore_rl.errors import UpstreamError

__all__ = ["UpstreamError", "UpstreamPool", "UpstreamResponse", "UpstreamTarget", "checked_url"]

# What a failed exchange raises inside aiohttp: its own errors, a socket's, a timeout.
_FAILURES: Final = (aiohttp.ClientError, OSError, asyncio.TimeoutError)
# aiohttp adds these to every request unless told not to; an inference server reads none.
_SKIP_HEADERS: Final = ("Accept", "Accept-Encoding", "User-Agent")
_JSON: Final = "application/json"
_HEADERS: Final = (
    CIMultiDictProxy(CIMultiDict({"Content-Type": _JSON})),
    CIMultiDictProxy[str](CIMultiDict()),
)
# Bodies larger than this make aiohttp warn (ResourceWarning) that sending them "might lock
# the event loop"; a socket write of them queues in the transport either way.
_LARGE: Final = 1 << 20


def _payload(body: bytes | None) -> bytes | BytesPayload | None:
    """``body`` as aiohttp sends it, without its large-body warning (an io.BytesIO instead
    would copy the body once more)."""
    if body is None or len(body) <= _LARGE:
        return body
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        return BytesPayload(body, content_type=_JSON)


def _failed(exc: BaseException) -> UpstreamError:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamError("cannot connect: no connection within the connect timeout")
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamError("no answer within the read timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError(f"cannot connect: {exc.os_error}")
    text = str(exc)
    return UpstreamError(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """One endpoint of the upstream: method, full URL and request headers, built once."""

    method: str
    url: URL
    headers: CIMultiDictProxy[str]


class UpstreamResponse:
    """A streamed answer: ``status``, then ``async for`` over its body's pieces as they
    arrive (or :meth:`read` for the rest at once)."""

    __slots__ = ("_response", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._response.content.iter_any():
                yield piece
        except _FAILURES as exc:
            raise _failed(exc) from exc

    async def events(self) -> AsyncIterator[list[memoryview]]:
        """The ``data:`` payloads of a server-sent event stream, as many as each read completes
        (under load the server's events coalesce in a read), up to ``[DONE]``."""
        unread: list[bytes] = []  # what arrived after the last complete event
        newline = False  # whether the last piece ended with a newline
        async for piece in self:
            ends = b"\n\n" in piece or (newline and piece[:1] == b"\n")
            newline = piece[-1:] == b"\n"
            unread.append(piece)
            if not ends:
                continue
            pending = unread[0] if len(unread) == 1 else b"".join(unread)
            cut = pending.rfind(b"\n\n") + 2
            events, unread = pending[:cut], [pending[cut:]] if cut < len(pending) else []
            del pending
            datas = [memoryview(e)[5:] for e in events.split(b"\n\n") if e.startswith(b"data:")]
            done = b"data: [DONE]" in events[-16:]
            if done:
                datas.pop()
            if datas:
                yield datas
            if done:
                return

    async def read(self) -> bytes:
        """The rest of the body."""
        try:
            return await self._response.read()
        except _FAILURES as exc:
            raise _failed(exc) from exc


def checked_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream must be an http(s) URL, got {url!r}")
    return url


class UpstreamPool:
    """Keep-alive connections to one upstream (``http(s)://host:port/base``), made on first use
    in the running event loop; ``read_timeout``: silence (no byte) that fails a call."""

    def __init__(self, base_url: str, *, read_timeout: float = 600.0) -> None:
        parts = urlsplit(checked_url(base_url))
        self.base = base_url
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._path = parts.path.rstrip("/")
        self._read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._targets: dict[tuple[str, str, bool], UpstreamTarget] = {}

    def target(self, path: str, method: str = "POST", *, root: bool = False) -> UpstreamTarget:
        """The method, URL and headers for ``path`` under the base (built once); ``root``:
        under the server's root instead (the base without its ``/v1``)."""
        key = (path, method, root)
        if key not in self._targets:
            under = self._path.removesuffix("/v1") if root else self._path
            url = URL(f"{self._origin}{under}{path}", encoded=True)
            self._targets[key] = UpstreamTarget(method, url, _HEADERS[method == "GET"])
        return self._targets[key]

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise UpstreamError("the upstream pool is closed")
        # A connection idle for 4 s is not reused: closed before a server's keep-alive of 5 s
        # closes it under a request. No total deadline (a long generation is fine).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0, keepalive_timeout=4.0),
            timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self._read_timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_HEADERS,
            auto_decompress=False,
        )
        return self._session

    async def fetch(self, target: UpstreamTarget, body: bytes | None) -> tuple[int, bytes]:
        """One whole exchange: -> (status, body). ``target`` from :meth:`target`."""
        async with self.stream(target, body) as response:
            return response.status, await response.read()

    @asynccontextmanager
    async def stream(
        self, target: UpstreamTarget, body: bytes | None
    ) -> AsyncIterator[UpstreamResponse]:
        """An exchange whose body is read as it arrives (the connection is released after)."""
        session = self._session or self._open()
        try:
            response = await session.request(
                target.method, target.url, data=_payload(body), headers=target.headers
            )
        except _FAILURES as exc:
            raise _failed(exc) from exc
        try:
            yield UpstreamResponse(response)
        finally:
            response.release()

    async def aclose(self) -> None:
        """Close the connections; calls after it fail with :class:`UpstreamError`. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()
