"""BackgroundServer: real uvicorn on a loopback port inside the test's event loop."""

from __future__ import annotations

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
