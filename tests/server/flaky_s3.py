"""A thin HTTP front for the moto server that fails the first N PutObject calls with 503.

Real S3 answers ``503 SlowDown`` under load; moto never does. This front lets a test see
the server retry such a failure through the real aiobotocore client.
"""

from __future__ import annotations

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class FlakyS3:
    """ASGI app: forwards to ``upstream`` except for the first ``fail_puts`` object PUTs."""

    def __init__(self, upstream: str, *, fail_puts: int) -> None:
        self.upstream = upstream
        self.fail_puts = fail_puts
        self.failed = 0
        self._http = httpx.AsyncClient(base_url=upstream)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        body = await request.body()
        is_object_put = request.method == "PUT" and request.url.path.strip("/").count("/") >= 1
        if is_object_put and self.failed < self.fail_puts:
            self.failed += 1
            response = Response(SLOW_DOWN, status_code=503, media_type="application/xml")
        else:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            upstream = await self._http.request(
                request.method,
                request.url.path,
                params=request.url.query,
                headers=headers,
                content=body,
            )
            response = Response(
                upstream.content,
                status_code=upstream.status_code,
                headers={
                    k: v
                    for k, v in upstream.headers.items()
                    if k.lower() not in {"content-length", "transfer-encoding", "content-encoding"}
                },
            )
        await response(scope, receive, send)
