"""The lean path's HTTP client against a raw HTTP/1.1 server on loopback: connections are
kept and reused, bounded by the pool size, a connection the server dropped as the request
went out is replaced, and a silent server ends in a read timeout (botocore's error)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from botocore.exceptions import ReadTimeoutError

from agentcore_rl.aws.http import transport_error
from agentcore_rl.aws.wire import WirePool, WireTimeoutError


class RawServer:
    """Answers ``GET /n`` with body ``n``; drops the connection without an answer on the
    ``drop_at``-th request of a connection; never answers ``GET /silent``."""

    def __init__(self, drop_at: int = 0) -> None:
        self.drop_at = drop_at
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                served += 1
                target = head.split(b" ", 2)[1]
                if served == self.drop_at or target == b"/silent":
                    if target == b"/silent":
                        await reader.read()  # until the client gives up
                    return
                body = target[1:]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest.fixture
async def raw_server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RawServer, str]]:
    app = RawServer(getattr(request, "param", 0))
    server = await asyncio.start_server(app.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield app, f"http://127.0.0.1:{port}"


async def test_connections_are_reused_and_bounded(raw_server: tuple[RawServer, str]) -> None:
    app, origin = raw_server
    pool = WirePool(origin, limit=2)
    try:
        answers = await asyncio.gather(*(pool.request("GET", f"/{i}", [], b"") for i in range(6)))
        assert [body for _, _, body in answers] == [str(i).encode() for i in range(6)]
        assert {status for status, _, _ in answers} == {200}
        assert app.connections <= 2
        await pool.request("GET", "/again", [], b"")
        assert app.connections <= 2
    finally:
        pool.close()


@pytest.mark.parametrize("raw_server", [2], indirect=True)
async def test_a_kept_connection_dropped_by_the_server_is_replaced(
    raw_server: tuple[RawServer, str],
) -> None:
    app, origin = raw_server
    pool = WirePool(origin, limit=1)
    try:
        assert (await pool.request("GET", "/a", [], b""))[2] == b"a"
        # The server drops the kept connection on the next request: a new one carries it.
        assert (await pool.request("GET", "/b", [], b""))[2] == b"b"
        assert app.connections == 2
    finally:
        pool.close()


async def test_a_silent_server_ends_in_a_read_timeout(raw_server: tuple[RawServer, str]) -> None:
    _, origin = raw_server
    pool = WirePool(origin, read_timeout=0.05, sweep_interval=0.01)
    try:
        with pytest.raises(WireTimeoutError) as caught:
            await pool.request("GET", "/silent", [], b"")
        assert isinstance(transport_error(caught.value, origin, None), ReadTimeoutError)
        assert (await pool.request("GET", "/ok", [], b""))[2] == b"ok"
    finally:
        pool.close()


def test_the_pool_runs_on_uvloop() -> None:
    """uvloop's transports are not asyncio's classes (Ray's async actors run on uvloop)."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> list[bytes]:
        app = RawServer()
        server = await asyncio.start_server(app.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            pool = WirePool(f"http://127.0.0.1:{port}", limit=1)
            try:
                return [(await pool.request("GET", f"/{i}", [], b""))[2] for i in range(2)]
            finally:
                pool.close()

    assert uvloop.run(main()) == [b"0", b"1"]
