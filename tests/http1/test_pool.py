"""The shared HTTP/1.1 pool against raw loopback servers: reuse and the pool's bound,
whole and streamed bodies, the one retry of a dropped kept connection, bodies ended by the
connection or cut short, silence, bad HTTP, a closed pool, a refused connection, uvloop."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rl._http1 import (
    HttpClosedError,
    HttpConnectError,
    HttpTimeoutError,
    Pool,
)

from .loopback import answer, echo_target, loopback


def _get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: h\r\n\r\n".encode()


async def test_connections_are_reused_bounded_and_bodies_come_whole_or_in_pieces() -> None:
    async with loopback(echo_target) as (origin, counts):
        pool = Pool(origin, limit=2)
        answers = await asyncio.gather(*(pool.send(_get(f"/{i}")) for i in range(6)))
        assert [body for _, _, body in answers] == [f"/{i}".encode() for i in range(6)]
        assert {status for status, _, _ in answers} == {200}
        assert (b"x-seen", b"yes") in answers[0][1]
        async with pool.stream(_get("/streamed")) as response:
            assert (response.status, await response.read()) == (200, b"/streamed")
        pool.close()
    assert len(counts) <= 2
    assert sum(counts) == 7


async def test_a_chunked_stream_pauses_for_a_slow_reader() -> None:
    pieces = [b"x" * 40_000, b"y" * 40_000, b"z"]

    async def chunked(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in pieces) + b"0\r\n\r\n"
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)
        return True

    async with loopback(chunked) as (origin, counts):
        pool = Pool(origin)
        async with pool.stream(_get("/")) as response:
            assert b"".join([piece async for piece in response]) == b"".join(pieces)
        assert (await pool.send(_get("/")))[2] == b"".join(pieces)
        pool.close()
    assert counts == [2]


async def test_a_kept_connection_closed_by_the_server_is_retried_once() -> None:
    async def once(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        w.write(answer(b"ok"))
        await w.drain()
        return False  # closes after each answer without saying so

    async with loopback(once) as (origin, counts):
        pool = Pool(origin, limit=1)
        assert (await pool.send(_get("/")))[::2] == (200, b"ok")
        await asyncio.sleep(0)  # let the close arrive (or not: the retry covers both)
        assert (await pool.send(_get("/")))[::2] == (200, b"ok")
        pool.close()
    assert counts == [1, 1]


async def test_bodies_ended_by_the_connection_and_cut_short_bodies() -> None:
    async def ends(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        if n == 0:
            w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        else:
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
        return False

    async with loopback(ends) as (origin, _):
        pool = Pool(origin)
        assert (await pool.send(_get("/")))[2] == b"until the end"
        with pytest.raises(HttpClosedError, match="closed the connection"):
            await pool.send(_get("/"))
        pool.close()


async def test_silence_bad_http_a_closed_pool_and_a_refused_connection() -> None:
    async def bad(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        if n == 0:
            await r.read(1)  # silent until the client gives up
            return False
        w.write(b"NOT HTTP\r\n\r\n")
        return False

    async with loopback(bad) as (origin, _):
        pool = Pool(origin, read_timeout=0.05, sweep_interval=0.01)
        with pytest.raises(HttpTimeoutError, match=r"no answer from .* for 0\.05 s") as caught:
            await pool.send(_get("/"))
        assert not caught.value.connect
        with pytest.raises(HttpClosedError, match="invalid HTTP"):
            await pool.send(_get("/"))
        pool.close()
        with pytest.raises(HttpClosedError, match="is closed"):
            await pool.send(_get("/"))
    with pytest.raises(HttpConnectError, match="cannot connect") as refused:
        await Pool(origin).send(_get("/"))
    assert isinstance(refused.value.__cause__, ConnectionRefusedError)
    with pytest.raises(ValueError, match="origin"):
        Pool("ftp://127.0.0.1")


def test_the_pool_runs_on_uvloop() -> None:
    """uvloop's transports are not asyncio's classes (Ray's async actors run on uvloop)."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> list[bytes]:
        async with loopback(echo_target) as (origin, _):
            pool = Pool(origin, limit=1)
            try:
                return [(await pool.send(_get(f"/{i}")))[2] for i in range(2)]
            finally:
                pool.close()

    assert uvloop.run(main()) == [b"/0", b"/1"]
