"""Every refused invocation: its status code, its message, its field, and nothing written."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import InvalidPayloadError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.options import RequestLimits

from .helpers import rollout_payload, served, session_headers

LIMIT = 4096


@pytest.fixture
async def calls() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def bucket() -> str:
    # Refused invocations never reach S3, so most tests need no real bucket (and no client).
    return "allowed-bucket"


@pytest.fixture
async def http(
    s3_endpoint: str, bucket: str, calls: list[dict[str, Any]]
) -> AsyncIterator[httpx.AsyncClient]:
    app = AgentCoreRLApp(
        store=ResultStore(endpoint_url=s3_endpoint),
        limits=RequestLimits(max_body_bytes=LIMIT, allowed_buckets=[bucket, "other-ok"]),
    )

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload)
        return {}

    # In-process ASGI keeps these many small cases fast; the 413 cases also run over
    # real uvicorn below, where Content-Length and chunking come from a real HTTP stack.
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        yield client
    await app.aclose()


def with_rollout(bucket: str, **changes: Any) -> dict[str, Any]:
    payload = rollout_payload(bucket)
    payload[protocol.ROLLOUT_FIELD].update(changes)
    return payload


async def expect(
    response: httpx.Response, status: int, *fragments: str, field: str | None = None
) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "field"}
    for fragment in fragments:
        assert fragment in body["error"], body
    assert body["field"] == field


async def test_body_not_json(http: httpx.AsyncClient, calls: list[Any]) -> None:
    response = await http.post("/invocations", content=b"{not json")
    await expect(response, 400, "request body is not valid JSON")
    assert calls == []


async def test_body_not_utf8(http: httpx.AsyncClient) -> None:
    response = await http.post("/invocations", content=b'{"a": "\xff\xfe\xfa"}')
    await expect(response, 400, "not valid JSON")


async def test_empty_body(http: httpx.AsyncClient) -> None:
    await expect(await http.post("/invocations", content=b""), 400, "not valid JSON")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
async def test_body_with_nan(http: httpx.AsyncClient, constant: str) -> None:
    response = await http.post("/invocations", content=f'{{"x": {constant}}}'.encode())
    await expect(response, 400, f"{constant} is not valid JSON")


@pytest.mark.parametrize(
    ("body", "kind"),
    [(b"[1, 2]", "array"), (b'"text"', "string"), (b"3", "number"), (b"null", "null")],
)
async def test_body_not_an_object(http: httpx.AsyncClient, body: bytes, kind: str) -> None:
    response = await http.post("/invocations", content=body)
    await expect(response, 400, f"must be a JSON object, got a JSON {kind}")


async def test_body_too_large_by_content_length(http: httpx.AsyncClient, bucket: str) -> None:
    payload = rollout_payload(bucket, filler="x" * LIMIT)
    response = await http.post("/invocations", json=payload)
    await expect(response, 413, "the limit is 4096 bytes", "max_body_bytes")


async def test_body_too_large_while_streaming(http: httpx.AsyncClient, calls: list[Any]) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        # A chunked body declares no Content-Length: the limit must hold while reading.
        yield b'{"filler": "'
        for _ in range(10):
            yield b"x" * 1024
        yield b'"}'

    response = await http.post("/invocations", content=chunks())
    assert "content-length" not in response.request.headers
    await expect(response, 413, "the limit is 4096 bytes")
    assert calls == []


async def test_body_too_large_over_real_http(s3_endpoint: str) -> None:
    app = AgentCoreRLApp(
        store=ResultStore(endpoint_url=s3_endpoint), limits=RequestLimits(max_body_bytes=LIMIT)
    )

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("a refused body must not reach the handler")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1024

    async with served(app) as client:
        declared = await client.post("/invocations", content=b"x" * (LIMIT + 1))
        await expect(declared, 413, f"is {LIMIT + 1} bytes; the limit is {LIMIT} bytes")
        streamed = await client.post("/invocations", content=chunks())
        assert streamed.request.headers["transfer-encoding"] == "chunked"
        await expect(streamed, 413, f"the limit is {LIMIT} bytes")
        ok = await client.post("/invocations", content=b"[]")
        await expect(ok, 400, "got a JSON array")  # the connection still works


async def test_rollout_block_not_an_object(http: httpx.AsyncClient) -> None:
    response = await http.post("/invocations", json={"_rollout": "exp/q-1"})
    await expect(response, 400, "_rollout must be a JSON object, got str", field="_rollout")


@pytest.mark.parametrize("name", [protocol.EXP_ID, protocol.INPUT_ID, protocol.S3_BUCKET])
async def test_rollout_block_missing_field(http: httpx.AsyncClient, bucket: str, name: str) -> None:
    payload = rollout_payload(bucket)
    del payload[protocol.ROLLOUT_FIELD][name]
    response = await http.post("/invocations", json=payload)
    await expect(response, 400, f"_rollout.{name} is required", field=f"_rollout.{name}")


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"exp_id": "a/b"}, "_rollout.exp_id", "contains character '/'"),
        ({"exp_id": ".."}, "_rollout.exp_id", "must start with a letter or digit"),
        ({"input_id": "../../etc"}, "_rollout.input_id", "contains character '/'"),
        ({"input_id": "q\n1"}, "_rollout.input_id", "contains character '\\n'"),
        ({"input_id": "q 1"}, "_rollout.input_id", "contains character ' '"),
        ({"input_id": "q" * 201}, "_rollout.input_id", "the limit is 200"),
        ({"input_id": ""}, "_rollout.input_id", "must not be empty"),
        ({"exp_id": 7}, "_rollout.exp_id", "must be a string, got int"),
        ({"s3_bucket": "Bad_Bucket"}, "_rollout.s3_bucket", "not a valid S3 bucket name"),
        ({"base_url": 5}, "_rollout.base_url", "base_url must be a string"),
    ],
)
async def test_rollout_block_bad_field(
    http: httpx.AsyncClient,
    bucket: str,
    calls: list[Any],
    changes: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    response = await http.post("/invocations", json=with_rollout(bucket, **changes))
    await expect(response, 400, fragment, field=field)
    assert calls == []


@pytest.mark.parametrize(
    ("session_id", "fragment"),
    [
        ("a/b", "letters, digits and hyphens"),
        ("..", "letters, digits and hyphens"),
        ("-leading", "letters, digits and hyphens"),
        ("x" * 257, "the limit is 256"),
    ],
)
async def test_bad_session_header(
    http: httpx.AsyncClient, bucket: str, session_id: str, fragment: str
) -> None:
    response = await http.post(
        "/invocations", json=rollout_payload(bucket), headers=session_headers(session_id)
    )
    await expect(response, 400, protocol.SESSION_ID_HEADER, fragment, field="session_id")


async def test_bucket_not_allowed(
    http: httpx.AsyncClient, store: ResultStore, calls: list[Any]
) -> None:
    await store.ensure_bucket("not-allowed")
    response = await http.post("/invocations", json=rollout_payload("not-allowed"))
    await expect(
        response,
        403,
        "bucket 'not-allowed' is not in this server's allow-list",
        "AGENTCORE_RL_ALLOWED_BUCKETS",
        field="_rollout.s3_bucket",
    )
    assert calls == []
    assert await store.list_keys("not-allowed", "") == []


async def test_allow_list_from_environment(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = "env-allowed"
    await store.ensure_bucket(bucket)
    monkeypatch.setenv("AGENTCORE_RL_ALLOWED_BUCKETS", f" {bucket} , other-bucket ")
    app = AgentCoreRLApp(store=store)
    assert app.allowed_buckets == frozenset({bucket, "other-bucket"})

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return {}

    async with served(app) as client:
        refused = await client.post("/invocations", json=rollout_payload("elsewhere"))
        await expect(
            refused,
            403,
            "'elsewhere' is not in this server's allow-list",
            field="_rollout.s3_bucket",
        )
        accepted = await client.post("/invocations", json=rollout_payload(bucket))
        assert accepted.status_code == 200


async def test_no_entrypoint_registered(store: ResultStore) -> None:
    async with served(AgentCoreRLApp(store=store)) as client:
        response = await client.post("/invocations", json={})
    await expect(response, 500, "no entrypoint is registered")


async def test_wrong_method(http: httpx.AsyncClient) -> None:
    assert (await http.get("/invocations")).status_code == 405


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_payload_validator(s3_endpoint: str, kind: str) -> None:
    app = AgentCoreRLApp(store=ResultStore(endpoint_url=s3_endpoint))
    calls: list[dict[str, Any]] = []

    def check(payload: dict[str, Any]) -> None:
        if payload.get("crash"):
            raise RuntimeError("validator bug")
        if not isinstance(payload.get("prompt"), str):
            raise InvalidPayloadError("prompt must be a string", field="prompt")

    async def acheck(payload: dict[str, Any]) -> None:
        check(payload)

    app.payload_validator(check if kind == "sync" else acheck)

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload)
        return {}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        refused = await http.post("/invocations", json={"prompt": 3})
        await expect(refused, 400, "prompt must be a string", field="prompt")
        crashed = await http.post("/invocations", json={"prompt": "x", "crash": True})
        await expect(crashed, 500, "payload validator failed: validator bug")
        accepted = await http.post("/invocations", json={"prompt": "x"})
        assert accepted.status_code == 200
    await app.aclose()
    assert calls == [{"prompt": "x"}]


async def test_plain_entrypoint_refusing_payload(s3_endpoint: str) -> None:
    app = AgentCoreRLApp(store=ResultStore(endpoint_url=s3_endpoint))

    @app.entrypoint
    def echo(payload: dict[str, Any]) -> dict[str, Any]:
        raise InvalidPayloadError("too many items", status_code=413, field="items")

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        response = await http.post("/invocations", json={"items": []})
    await expect(response, 413, "too many items", field="items")
    await app.aclose()


@pytest.mark.parametrize(
    ("number", "shown"),
    [
        ("1e400", "number 1e400"),
        ("-1E+400", "number -1E+400"),
        ("1" + "0" * 400 + ".5", "number 100000"),  # no exponent, still beyond a double
    ],
)
async def test_number_out_of_float_range(
    http: httpx.AsyncClient, bucket: str, calls: list[Any], number: str, shown: str
) -> None:
    # Anywhere in the payload, however deep: Python would read it as infinity, and the
    # handler's good result would become a result_not_json_serializable envelope later.
    body = json.dumps(rollout_payload(bucket, data={"rows": [[1.5, "PLACEHOLDER"]]}))
    body = body.replace('"PLACEHOLDER"', number)
    response = await http.post("/invocations", content=body.encode())
    await expect(response, 400, shown, "out of range for a 64-bit float")
    assert calls == []


async def test_large_finite_numbers_accepted(http: httpx.AsyncClient) -> None:
    # No _rollout block: the fixture's store is never closed, so nothing may reach S3.
    body = '{"prompt": [1e308, -2.5e-320, 1e400000]}'
    # 1e400000 is refused; the finite extremes alone are fine.
    await expect(await http.post("/invocations", content=body.encode()), 400, "1e400000")
    body = body.replace(", 1e400000", "")
    assert (await http.post("/invocations", content=body.encode())).status_code == 200


def nested(depth: int) -> str:
    """A JSON object whose ``x`` holds arrays nested ``depth`` levels deep in all."""
    return '{"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


async def test_nesting_deeper_than_the_limit(s3_endpoint: str) -> None:
    app = AgentCoreRLApp(
        store=ResultStore(endpoint_url=s3_endpoint), limits=RequestLimits(max_json_depth=5)
    )
    accepted: list[Any] = []

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        accepted.append(payload)
        return {}

    async with served(app) as client:
        ok = await client.post("/invocations", content=nested(5).encode())
        assert ok.status_code == 200, ok.text
        deep = await client.post("/invocations", content=nested(6).encode())
        await expect(deep, 400, "deeper than 5 levels", "max_json_depth")
        # Deep enough to exhaust Python's recursion in the JSON decoder itself: still 400.
        abyss = await client.post("/invocations", content=nested(100_000).encode())
        await expect(abyss, 400, "deeper than 5 levels")
    assert len(accepted) == 1


async def test_default_depth_limit(http: httpx.AsyncClient) -> None:
    assert (await http.post("/invocations", content=nested(100).encode())).status_code == 200
    response = await http.post("/invocations", content=nested(101).encode())
    await expect(response, 400, "deeper than 100 levels")


async def test_client_disconnecting_mid_body_is_not_an_error(
    s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = AgentCoreRLApp(store=ResultStore(endpoint_url=s3_endpoint))

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("a body that never arrived must not reach the handler")

    caplog.set_level(logging.DEBUG, logger="agentcore_rl")
    async with BackgroundServer(app) as server:
        _reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(
            b"POST /invocations HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"prompt": "half a bo'
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        for _ in range(500):  # bounded: the server notices the close within a few loops
            if any("disconnected" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.01)
    server_records = [r for r in caplog.records if r.name.startswith("agentcore_rl")]
    assert [r.levelname for r in server_records if "disconnected" in r.getMessage()] == ["INFO"]
    assert not [r for r in server_records if r.levelno >= logging.WARNING], server_records
