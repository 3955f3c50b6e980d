"""BackgroundServer: real uvicorn on a loopback port inside the test's event loop."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentcore_rl.local.background import BackgroundServer


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


async def test_a_connection_is_kept_between_answers() -> None:
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
