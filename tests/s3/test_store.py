"""ResultStore against moto's server: round trips, missing keys, listing, retries, errors."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ClientError, EndpointConnectionError

from agentcore_rl.errors import StorageError
from agentcore_rl.s3 import AWS_USER_AGENT, ResultStore, is_transient_s3_error
from tests.conftest import FAST_RETRY, fill_bucket


async def test_put_get_head_list(store: ResultStore, bucket: str) -> None:
    await store.put_json(bucket, "exp/q-1/s1.json", {"rewards": [1.0]})
    await store.put_json(bucket, "exp/q-2/s2.json", {"rewards": [0.0]})
    assert await store.get_json(bucket, "exp/q-1/s1.json") == {"rewards": [1.0]}
    assert await store.head(bucket, "exp/q-1/s1.json")
    assert not await store.head(bucket, "exp/q-1/missing.json")
    assert await store.get_json(bucket, "exp/q-1/missing.json") is None
    assert sorted(await store.list_keys(bucket, "exp/")) == ["exp/q-1/s1.json", "exp/q-2/s2.json"]
    assert await store.list_keys(bucket, "exp/", start_after="exp/q-1/s1.json") == [
        "exp/q-2/s2.json"
    ]
    assert store.request_counts["PutObject"] == 2


async def test_list_follows_pages(store: ResultStore, bucket: str) -> None:
    fill_bucket(bucket, {f"p/{i:05d}.json": b"{}" for i in range(1005)})
    before = store.request_counts["ListObjectsV2"]
    keys = await store.list_keys(bucket, "p/")
    assert len(keys) == 1005
    assert store.request_counts["ListObjectsV2"] - before == 2


async def test_missing_bucket_is_a_storage_error(store: ResultStore) -> None:
    with pytest.raises(StorageError, match="NoSuchBucket") as info:
        await store.put_json("no-such-bucket-here", "k.json", {})
    assert info.value.operation == "PutObject"
    assert info.value.code == "NoSuchBucket"


async def test_non_json_object_is_reported(store: ResultStore, bucket: str) -> None:
    await store.put_bytes(bucket, "list.json", b"[1, 2]")
    await store.put_bytes(bucket, "junk.json", b"{nope")
    with pytest.raises(StorageError, match="not an object"):
        await store.get_json(bucket, "list.json")
    with pytest.raises(StorageError, match="not valid JSON"):
        await store.get_json(bucket, "junk.json")


async def test_unreachable_endpoint_retries_then_fails() -> None:
    # Port 9 on loopback (discard) has no listener: every attempt is refused.
    async with ResultStore(endpoint_url="http://127.0.0.1:9", retry=FAST_RETRY) as dead:
        with pytest.raises(StorageError, match="EndpointConnectionError"):
            await dead.head("bkt", "k.json")
        assert dead.request_counts["HeadObject"] == FAST_RETRY.attempts


async def test_closed_store_refuses_and_close_is_idempotent(s3_endpoint: str) -> None:
    s = ResultStore(endpoint_url=s3_endpoint)
    await s.aclose()
    await s.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await s.head("bkt", "k")


def test_transient_classification() -> None:
    def client_error(code: str, status: int) -> ClientError:
        response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(cast("Any", response), "Op")

    assert is_transient_s3_error(client_error("SlowDown", 503))
    assert is_transient_s3_error(client_error("Whatever", 500))
    assert not is_transient_s3_error(client_error("AccessDenied", 403))
    assert not is_transient_s3_error(client_error("NoSuchBucket", 404))
    assert is_transient_s3_error(EndpointConnectionError(endpoint_url="http://x"))
    assert not is_transient_s3_error(ValueError())


async def test_missing_bucket_on_get_is_an_error_not_a_missing_key(store: ResultStore) -> None:
    # A result "not written yet" and a bucket that is gone must not look alike to a reader.
    with pytest.raises(StorageError, match="NoSuchBucket"):
        await store.get_json("no-such-bucket-here", "exp/q-1/s.json")
    assert not await store.head("no-such-bucket-here", "exp/q-1/s.json")


async def test_requests_carry_the_fixed_user_agent(s3_endpoint: str) -> None:
    core = get_session()
    sent: list[str] = []

    def record(request: Any, **_: Any) -> None:
        sent.append(request.headers["User-Agent"].decode())

    core.register("before-send.s3", record)
    async with ResultStore(endpoint_url=s3_endpoint, session=core) as store:
        await store.ensure_bucket("user-agent")
        await store.put_json("user-agent", "k.json", {"a": 1})
        assert await store.get_json("user-agent", "k.json") == {"a": 1}
    # The session's own extra, if any, follows ours.
    assert [ua[: len(AWS_USER_AGENT)] for ua in sent] == [AWS_USER_AGENT] * 3
