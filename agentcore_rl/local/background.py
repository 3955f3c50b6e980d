"""Run an ASGI app under real uvicorn on a loopback port, inside the current event loop
(signals are left to the embedding program).

Its one task (uvicorn's ``serve``) is owned by the server object and always awaited by
``aclose()``, not by a task group: test fixtures enter a server in one task and leave it
in another, which an anyio task group forbids.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from types import TracebackType
from typing import Any

import uvicorn

__all__ = ["BackgroundServer", "bound_socket"]

_STARTUP_TIMEOUT = 10.0  # seconds


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) for uvicorn's ``sockets=``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it a keep-alive answer written in two parts waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without signal capture: several can share one process and one loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class BackgroundServer:
    """uvicorn serving ``app`` on ``host`` (loopback) and a free port, as an asyncio task.

    The socket is bound first, so ``url`` is known at once and no two servers race for a
    port. ``aclose()`` shuts down gracefully and, after ``shutdown_timeout`` seconds, stops
    waiting for open connections (uvicorn's ``force_exit``; a lifespan shutdown under way
    is still waited for).

    Example::

        server = await BackgroundServer(app, port=0).start()
        print(server.url)          # http://127.0.0.1:54321
        await server.aclose()
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        shutdown_timeout: float = 10.0,
        **uvicorn_options: Any,
    ) -> None:
        self.host = host
        self.port = port
        self.shutdown_timeout = shutdown_timeout
        options = {"lifespan": "auto", **uvicorn_options}
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, **options)
        self._server = _EmbeddedUvicorn(config)
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (known once started)."""
        return f"http://{self.host}:{self.port}"

    def request_exit(self) -> None:
        """Ask uvicorn to shut down without waiting for it (``aclose()`` waits); lets an
        owner of several servers stop them together."""
        self._server.should_exit = True

    async def start(self) -> BackgroundServer:
        """Bind, start uvicorn and wait until it accepts connections."""
        if self._task is not None:
            return self
        sock = bound_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._socket = sock
        self._task = asyncio.create_task(
            self._server.serve(sockets=[sock]), name=f"uvicorn {self.url}"
        )
        # uvicorn has no "started" event; its flag flips within a few loop iterations.
        deadline = asyncio.get_running_loop().time() + _STARTUP_TIMEOUT
        while not self._server.started:
            if self._task.done():
                await self._task  # startup failed: surface uvicorn's exception
                raise RuntimeError(f"uvicorn on {self.url} exited during startup")
            if asyncio.get_running_loop().time() > deadline:
                await self.aclose()
                raise TimeoutError(f"uvicorn on {self.url} did not start in {_STARTUP_TIMEOUT} s")
            await asyncio.sleep(0.005)
        return self

    async def aclose(self) -> None:
        """Shut down gracefully and wait until uvicorn has returned; idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        self.request_exit()
        try:
            done, _ = await asyncio.wait({task}, timeout=self.shutdown_timeout)
            if not done:
                # Connections still open: uvicorn stops waiting for them.
                self._server.force_exit = True
            await task
        finally:
            if self._socket is not None:
                self._socket.close()

    async def __aenter__(self) -> BackgroundServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
