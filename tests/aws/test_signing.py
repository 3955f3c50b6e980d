"""The lean requests are the generic client's requests: same URL, same signed headers,
same canonical request, hence the same ``Authorization`` header; and each lean signature
verifies with botocore's own ``SigV4Auth``/``S3SigV4Auth`` on the request as received.

Both clients send to a recording server on loopback at one frozen instant (botocore's
signing clock is the one thing replaced).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from agentcore_rl.aws import LeanAgentCore, LeanS3
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.protocol import new_session_id
from tests.aws.conftest import GENERIC_CONFIG

ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/signed-agent"
FROZEN = datetime.datetime(2026, 11, 30, 12, 0, 0)
LIST_ANSWER = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
    b"<IsTruncated>false</IsTruncated><KeyCount>0</KeyCount></ListBucketResult>"
)


class Recorder:
    """Records each request as received (raw path, query, headers, body) and answers it
    the way the operation expects."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        body = await request.body()
        self.requests.append(
            {
                "method": scope["method"],
                "path": scope["raw_path"].decode(),
                "query": scope["query_string"].decode(),
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body,
            }
        )
        response: Response
        if "list-type=2" in self.requests[-1]["query"]:
            response = Response(LIST_ANSWER, media_type="application/xml")
        elif scope["method"] == "GET":
            response = Response(b"{}", media_type="application/octet-stream")
        else:
            response = JSONResponse({})
        await response(scope, receive, send)

    def take(self) -> dict[str, Any]:
        [request] = self.requests
        self.requests.clear()
        return request


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's signers read the time from ``botocore.auth.get_current_datetime``."""
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: FROZEN)


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    app = Recorder()
    async with BackgroundServer(app) as server:
        yield app, server.url


def signed_part(request: dict[str, Any]) -> dict[str, Any]:
    """What SigV4 covers: method, path, query, the signed headers, the body, and the result."""
    auth = request["headers"]["authorization"]
    names = auth.split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    return {
        "method": request["method"],
        "path": request["path"],
        "query": sorted(request["query"].split("&")),
        "signed": {name: request["headers"][name] for name in names},
        "body": request["body"],
        "authorization": auth,
    }


def botocore_signature(request: dict[str, Any], *, service: str, s3: bool) -> str:
    """Sign the request as received with botocore's own signer; return its Authorization."""
    part = signed_part(request)
    url = f"http://{part['signed']['host']}{request['path']}"
    if request["query"]:
        url += "?" + request["query"]
    headers = {k: v for k, v in part["signed"].items() if k != "host"}
    aws_request = AWSRequest(method=request["method"], url=url, headers=headers)
    aws_request.data = request["body"]
    credentials = ReadOnlyCredentials("testing", "testing", "testing")
    auth_class = S3SigV4Auth if s3 else SigV4Auth
    auth_class(credentials, service, "us-west-2").add_auth(aws_request)
    return str(aws_request.headers["Authorization"])


@pytest.mark.usefixtures("frozen_clock")
async def test_s3_requests_sign_exactly_as_botocore(recorder: tuple[Recorder, str]) -> None:
    app, url = recorder
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            get_session().create_client(
                "s3", region_name="us-west-2", endpoint_url=url, config=GENERIC_CONFIG
            )
        )
        lean = await LeanS3.create(client)
        stack.push_async_callback(lean.aclose)
        for key in ("exp/plain.json", "exp/a b+c/é~%.json"):
            await lean.get_object("bench-bucket", key)
            lean_request = app.take()
            response = await client.get_object(Bucket="bench-bucket", Key=key)
            async with response["Body"] as stream:
                await stream.read()
            assert signed_part(lean_request) == signed_part(app.take())
            assert lean_request["headers"]["authorization"] == botocore_signature(
                lean_request, service="s3", s3=True
            )
        for options, params in (
            ({"start_after": "exp/a b"}, {"StartAfter": "exp/a b"}),
            ({"token": "t+/=", "max_keys": 7}, {"ContinuationToken": "t+/=", "MaxKeys": 7}),
        ):
            await lean.list_objects_v2("bench-bucket", "exp/", **options)
            lean_request = app.take()
            await client.list_objects_v2(Bucket="bench-bucket", Prefix="exp/", **params)
            assert signed_part(lean_request) == signed_part(app.take())
            assert lean_request["headers"]["authorization"] == botocore_signature(
                lean_request, service="s3", s3=True
            )


@pytest.mark.usefixtures("frozen_clock")
async def test_agentcore_requests_sign_exactly_as_botocore(recorder: tuple[Recorder, str]) -> None:
    app, url = recorder
    sid = new_session_id()
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            get_session().create_client(
                "bedrock-agentcore",
                region_name="us-west-2",
                endpoint_url=url,
                config=GENERIC_CONFIG,
            )
        )
        lean = await LeanAgentCore.create(client, ARN, qualifier="DEFAULT")
        stack.push_async_callback(lean.aclose)
        payload = json.dumps({"prompt": "2+2", "_rollout": {"exp_id": "e"}}).encode()
        await lean.invoke(sid, payload)
        lean_request = app.take()
        response = await client.invoke_agent_runtime(
            agentRuntimeArn=ARN,
            runtimeSessionId=sid,
            payload=payload,
            qualifier="DEFAULT",
            contentType="application/json",
            accept="application/json",
        )
        async with response["response"] as stream:
            await stream.read()
        assert signed_part(lean_request) == signed_part(app.take())
        assert lean_request["headers"]["authorization"] == botocore_signature(
            lean_request, service="bedrock-agentcore", s3=False
        )
        # A stop's body carries a fresh idempotency token, so the signatures differ; the
        # generic client signs the same request the same way when given the lean token.
        await lean.stop(sid)
        lean_request = app.take()
        token = json.loads(lean_request["body"])["clientToken"]
        await client.stop_runtime_session(
            agentRuntimeArn=ARN, runtimeSessionId=sid, qualifier="DEFAULT", clientToken=token
        )
        assert signed_part(lean_request) == signed_part(app.take())
        assert lean_request["headers"]["authorization"] == botocore_signature(
            lean_request, service="bedrock-agentcore", s3=False
        )


async def test_a_credentials_refresh_reaches_the_lean_signer(
    recorder: tuple[Recorder, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, url = recorder
    async with get_session().create_client(
        "s3", region_name="us-west-2", endpoint_url=url, config=GENERIC_CONFIG
    ) as client:
        lean = await LeanS3.create(client)
        try:
            await lean.get_object("bench-bucket", "k")
            assert "Credential=testing/" in app.take()["headers"]["authorization"]
            # What a refresh does to botocore's credential object: new frozen values.
            credentials = client._request_signer._credentials  # type: ignore[attr-defined]
            credentials.access_key, credentials.secret_key = "rotated", "rotated-secret"
            await lean.get_object("bench-bucket", "k")
            assert "Credential=rotated/" in app.take()["headers"]["authorization"]
        finally:
            await lean.aclose()
