"""uvicorn answering in one write per loop step, as production front ends do.

uvicorn writes a response's head when the app sends ``http.response.start`` and its body
with ``http.response.body``: two ``send`` calls, so two TCP segments on loopback, and a
client idle between calls is woken twice per answer (each wakeup costs it more CPU than
parsing the answer; measured on a 2-core VM: 1.6 reads per exchange). AWS's front ends,
and the HTTP servers users put in front of agents, answer a small response in one
segment. The local stack's stand-ins for AWS services (the AgentCore Runtime, the
embedded S3) use :data:`OneWriteHttpProtocol` so that what a client pays on loopback is
what it would pay against the real service. Agent servers keep uvicorn's own behaviour:
that is what an agent served by ``app.run()`` does.

Two parts, both needed: :data:`OneWriteHttpProtocol` is uvicorn's own protocol
(httptools' when installed, else h11's) with its transport wrapped, so writes made during
one loop step are joined and sent at the end of that step, before anything else is
closed or written; :class:`HeadWithBody` is an ASGI middleware that holds a response's
head until its first body message, so that both are written in the same step even when
the app produces them in different ones (a proxied stream, a WSGI app answering from its
thread pool).

Example::

    config = uvicorn.Config(HeadWithBody(app), http=OneWriteHttpProtocol)
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

__all__ = ["HeadWithBody", "OneWriteHttpProtocol", "OneWriteTransport"]


class OneWriteTransport:
    """A transport whose writes of one loop step go out as one ``write``; everything else
    is the wrapped transport's.

    Example::

        proxy = OneWriteTransport(transport, loop)
        proxy.write(head)
        proxy.write(body)        # both leave together, at the end of this step
    """

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def __repr__(self) -> str:
        return f"OneWriteTransport({self._transport!r})"

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; the step's queued writes are sent together when it ends."""
        pending = self._pending
        if pending is None:
            self._pending = [bytes(data)]
            self._loop.call_soon(self.flush)
        else:
            pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        """Queue every item of ``lines``."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Send what is queued now (idempotent)."""
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        """Send what is queued, then end the write side."""
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        """Send what is queued, then close (as the transport's own close drains)."""
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        """Bytes queued here and in the transport (for flow control)."""
        queued = sum(map(len, self._pending or ()))
        return queued + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        # is_closing, abort, pause_reading, get_extra_info, set_protocol...: the
        # transport's own (abort drops what is queued, as the transport's abort does).
        return getattr(self._transport, name)


def _connection_made(self: Any, transport: asyncio.Transport) -> None:
    loop = asyncio.get_running_loop()
    AutoHTTPProtocol.connection_made(self, OneWriteTransport(transport, loop))  # type: ignore[arg-type]


#: uvicorn's HTTP protocol (``uvicorn.Config(http=...)``) answering in one write per step.
OneWriteHttpProtocol: type[asyncio.Protocol] = type(
    "OneWriteHttpProtocol", (AutoHTTPProtocol,), {"connection_made": _connection_made}
)


class HeadWithBody:
    """ASGI middleware: an HTTP response's head is sent with its first body message (one
    write with :data:`OneWriteHttpProtocol`); other scopes pass through.

    Example::

        app = HeadWithBody(LocalAgentCoreRuntime(targets))
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __repr__(self) -> str:
        return f"HeadWithBody({self.app!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None

        async def send_joined(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                held = message
                return
            if held is not None:
                head, held = held, None
                await send(head)
            await send(message)

        await self.app(scope, receive, send_joined)
