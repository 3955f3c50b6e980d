"""The lean path's adapter of the shared HTTP/1.1 pool: a signed request's head (the
signed Host, Content-Length only where botocore sends one) in one exchange, and the pool's
failures raised as the botocore exceptions aiobotocore raises for them."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    SSLError,
)

from agentcore_rl._http1 import HttpClosedError, HttpConnectError, HttpTimeoutError
from agentcore_rl.aws.http import transport_error
from agentcore_rl.aws.wire import WirePool
from agentcore_rl.errors import ConfigurationError
from tests.http1.loopback import answer, loopback


async def test_a_request_goes_out_with_the_signed_host_and_its_length() -> None:
    heads: list[bytes] = []

    async def record(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        heads.append(h)
        w.write(answer(b"body", b"x-amz-request-id: r1\r\n"))
        return True

    async with loopback(record) as (origin, counts):
        pool = WirePool(origin, limit=4, host_header="signed.example")
        status, headers, body = await pool.request("GET", "/b/k?x=1", [("X-Amz-Date", "d")], b"")
        assert (status, body) == (200, b"body")
        assert (b"x-amz-request-id", b"r1") in headers
        await pool.request("PUT", "/b/k", [], b"payload")
        pool.close()
    assert heads[0] == b"GET /b/k?x=1 HTTP/1.1\r\nHost: signed.example\r\nX-Amz-Date: d\r\n\r\n"
    assert b"Content-Length: 7\r\n" in heads[1]
    assert counts == [2]
    with pytest.raises(ConfigurationError, match="origin"):
        WirePool("http://127.0.0.1:1/path")


def test_the_pools_failures_are_botocores() -> None:
    url = "http://127.0.0.1:1/x"
    cases = [
        (HttpTimeoutError("slow"), ReadTimeoutError),
        (HttpTimeoutError("slow", connect=True), ConnectTimeoutError),
        (HttpClosedError("cut"), ConnectionClosedError),
    ]
    for cause, expected in [
        (ConnectionRefusedError("refused"), EndpointConnectionError),
        (ssl.SSLCertVerificationError("bad cert"), SSLError),
    ]:
        connect = HttpConnectError("cannot connect")
        connect.__cause__ = cause
        cases.append((connect, expected))
    for error, expected in cases:
        assert isinstance(transport_error(error, url, None), expected), error
