"""BackgroundServer: real uvicorn on a loopback port inside the test's event loop."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.onewrite import OneWriteTransport


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "world"})


async def test_two_servers_share_a_loop_and_stop_cleanly() -> None:
    app = Starlette(routes=[Route("/", hello)])
    async with BackgroundServer(app) as one, BackgroundServer(app) as two:
        assert one.port != two.port
        async with httpx.AsyncClient() as http:
            for server in (one, two):
                response = await http.get(server.url + "/")
                assert response.json() == {"hello": "world"}
    await one.aclose()  # idempotent


class _Recorder(asyncio.Transport):
    """An asyncio transport that records what is written to it (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def close(self) -> None:
        self.events.append("close")

    def is_closing(self) -> bool:
        return "close" in self.events

    def get_write_buffer_size(self) -> int:
        return 0


async def test_a_steps_writes_leave_as_one_and_before_a_close() -> None:
    recorder = _Recorder()
    proxy = OneWriteTransport(recorder, asyncio.get_running_loop())
    proxy.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
    proxy.write(b"{}")
    assert recorder.writes == []
    assert proxy.get_write_buffer_size() == 40
    await asyncio.sleep(0)  # the step ends
    assert recorder.writes == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]
    proxy.write(b"last")
    proxy.close()  # flushes first, like the transport's own close
    assert recorder.events == ["write", "write", "close"]
    assert recorder.writes[-1] == b"last"
    await asyncio.sleep(0)
    assert len(recorder.writes) == 2  # the scheduled flush found nothing left


async def test_answers_arrive_whole_over_a_raw_socket() -> None:
    app = Starlette(routes=[Route("/", hello)])
    async with BackgroundServer(app) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        try:
            for _ in range(2):  # the connection is kept between answers
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await asyncio.wait_for(reader.readexactly(length), 5)
                assert head.startswith(b"HTTP/1.1 200")
                assert b"close" not in head.lower()
                assert body == b'{"hello":"world"}'
        finally:
            writer.close()
            await writer.wait_closed()
