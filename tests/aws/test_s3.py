"""LeanS3 against moto's server, side by side with the generic aiobotocore client."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ClientError, EndpointConnectionError

from agentcore_rl.aws import LeanS3
from agentcore_rl.aws.s3 import parse_list_page
from tests.aws.conftest import GENERIC_CONFIG

#: Keys that need every kind of encoding: spaces, plus, percent, XML specials, non-ASCII.
ODD_KEYS = ["exp/plain.json", "exp/a b+c.json", "exp/%41~x.json", "exp/é&<x>'\".json"]


async def test_get_object_returns_the_stored_bytes(
    s3_client: Any, lean_s3: LeanS3, s3_bucket: str
) -> None:
    for key in ODD_KEYS:
        await s3_client.put_object(Bucket=s3_bucket, Key=key, Body=key.encode() + b"\x00\xff")
    for key in ODD_KEYS:
        assert await lean_s3.get_object(s3_bucket, key) == key.encode() + b"\x00\xff"


async def test_stored_content_encoding_is_not_decoded(
    s3_client: Any, lean_s3: LeanS3, s3_bucket: str
) -> None:
    # Bytes come back as stored, as from botocore, whatever the object's Content-Encoding.
    await s3_client.put_object(
        Bucket=s3_bucket, Key="gz", Body=b"not really gzip", ContentEncoding="gzip"
    )
    assert await lean_s3.get_object(s3_bucket, "gz") == b"not really gzip"


async def errors_of(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as exc_info:
        await call
    response = exc_info.value.response
    return {
        "class": type(exc_info.value).__name__,
        "error": response["Error"],
        "status": response["ResponseMetadata"]["HTTPStatusCode"],
        "operation": exc_info.value.operation_name,
    }


async def test_missing_key_and_bucket_raise_what_botocore_raises(
    s3_client: Any, lean_s3: LeanS3, s3_bucket: str
) -> None:
    for bucket, key in ((s3_bucket, "exp/missing"), ("no-such-lean-bucket", "k")):
        lean = await errors_of(lean_s3.get_object(bucket, key))
        generic = await errors_of(s3_client.get_object(Bucket=bucket, Key=key))
        assert lean == generic
    assert lean["error"]["Code"] == "NoSuchBucket"
    lean = await errors_of(lean_s3.list_objects_v2("no-such-lean-bucket", "exp/"))
    generic = await errors_of(s3_client.list_objects_v2(Bucket="no-such-lean-bucket"))
    assert lean == generic


async def test_list_returns_keys_in_order_decoded(
    s3_client: Any, lean_s3: LeanS3, s3_bucket: str
) -> None:
    for key in [*ODD_KEYS, "other/x"]:
        await s3_client.put_object(Bucket=s3_bucket, Key=key, Body=b"{}")
    page = await lean_s3.list_objects_v2(s3_bucket, "exp/")
    assert page.keys == sorted(ODD_KEYS)
    assert page.next_token is None
    after = await lean_s3.list_objects_v2(s3_bucket, "exp/", start_after="exp/a b+c.json")
    assert after.keys == [k for k in sorted(ODD_KEYS) if k > "exp/a b+c.json"]


async def test_list_pages_follow_the_continuation_token(
    s3_client: Any, lean_s3: LeanS3, s3_bucket: str
) -> None:
    keys = [f"exp/{i:02d}" for i in range(7)]
    for key in keys:
        await s3_client.put_object(Bucket=s3_bucket, Key=key, Body=b"{}")
    seen: list[str] = []
    page = await lean_s3.list_objects_v2(s3_bucket, "exp/", max_keys=3)
    for _ in range(5):  # bounded: 7 keys in pages of 3
        seen += page.keys
        if page.next_token is None:
            break
        page = await lean_s3.list_objects_v2(s3_bucket, "exp/", token=page.next_token, max_keys=3)
    assert seen == keys


async def test_endpoint_comes_from_aws_endpoint_url_s3(
    s3_endpoint: str, s3_bucket: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await s3_client.put_object(Bucket=s3_bucket, Key="k", Body=b"env")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    async with get_session().create_client("s3", config=GENERIC_CONFIG) as client:
        reader = await LeanS3.create(client)
        try:
            assert await reader.get_object(s3_bucket, "k") == b"env"
        finally:
            await reader.aclose()


async def test_unreachable_endpoint_raises_botocores_connection_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    async with get_session().create_client("s3", endpoint_url=url, config=GENERIC_CONFIG) as c:
        reader = await LeanS3.create(c)
        try:
            with pytest.raises(EndpointConnectionError):
                await reader.get_object("some-bucket", "k")
        finally:
            await reader.aclose()


def test_list_parser_reads_keys_and_token() -> None:
    body = (
        b"<ListBucketResult><IsTruncated>true</IsTruncated><EncodingType>url</EncodingType>"
        b"<Contents><Key>a%20b%2Bc</Key><Size>1</Size></Contents>"
        b"<Contents><Key>d</Key></Contents>"
        b"<NextContinuationToken>t&amp;1</NextContinuationToken></ListBucketResult>"
    )
    page = parse_list_page(body)
    assert page.keys == ["a b+c", "d"]
    assert page.next_token == "t&1"
    last = parse_list_page(b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>")
    assert (last.keys, last.next_token) == ([], None)
