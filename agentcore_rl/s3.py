"""ResultStore: the only door to S3 in agentcore-rl (aiobotocore). botocore's own retries are
off: one :class:`RetryPolicy` governs every request; what outlasts it, or is not transient,
raises :class:`~agentcore_rl.errors.StorageError`. Requests are counted per operation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import platform
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import aiobotocore
import botocore
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from agentcore_rl.errors import StorageError
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.trace import SessionTrace, dump_trace, load_trace

__all__ = [
    "AWS_USER_AGENT",
    "DEFAULT_S3_RETRY",
    "ResultStore",
    "is_transient_s3_error",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)

# Error codes S3 (and S3-compatible stores) use for "try again later".
_TRANSIENT_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
# "The key is not there (yet)". NoSuchBucket is deliberately absent: a missing bucket is a
# fault to report, not a result still to come. HEAD answers carry no body, so a HEAD on a
# missing bucket is a bare 404 too and cannot be told apart (see ResultStore.head).
_MISSING_CODES: Final = frozenset({"NoSuchKey", "404", "NotFound"})


# HeadBucket's bare statuses, named as the S3 error codes other requests answer with.
_HEAD_BUCKET_CODES: Final = {404: "NoSuchBucket", 403: "AccessDenied", 301: "PermanentRedirect"}


#: The User-Agent of every AWS request agentcore-rl sends (botocore's ``user_agent`` option).
#: botocore otherwise rebuilds its own string twice per request from a dozen sanitised
#: parts (about 7% of the rollout client's CPU); a fixed one is built once.
AWS_USER_AGENT: Final = (
    f"agentcore-rl aiobotocore/{aiobotocore.__version__} "
    f"botocore/{botocore.__version__} Python/{platform.python_version()}"
)


#: Transient S3 failures: 5 tries, backoff 0.2 s doubling up to 5 s, plus up to 0.2 s.
DEFAULT_S3_RETRY: Final = RetryPolicy(attempts=5, initial=0.2, maximum=5.0, jitter=0.2)


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "")) or type(exc).__name__
    return type(exc).__name__


def _http_status(exc: ClientError) -> int:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status) if isinstance(status, int) else 0


def is_transient_s3_error(exc: BaseException) -> bool:
    """Throttling, 5xx, timeouts, dropped connections."""
    if isinstance(exc, ClientError):
        return _error_code(exc) in _TRANSIENT_CODES or _http_status(exc) >= 500
    return isinstance(exc, BotoConnectionError | HTTPClientError | asyncio.TimeoutError)


def _unreadable(bucket: str, key: str, problem: str, code: str) -> StorageError:
    return StorageError(
        f"s3://{bucket}/{key} {problem}", operation="GetObject", bucket=bucket, key=key, code=code
    )


async def _hold_client(context: Any) -> AsyncGenerator[Any, None]:
    async with context as client:
        yield client


async def _close(holder: AsyncGenerator[Any, None]) -> None:
    try:
        await holder.aclose()
    except Exception as exc:
        # Closing is best effort: the connections go with the process either way.
        logger.warning("closing an S3 client failed: %s: %s", type(exc).__name__, exc)


class ResultStore:
    """Async access to the S3 objects that carry rollout results.

    ``endpoint_url``: a non-AWS S3 (moto, MinIO; default: botocore's choice, which honours
    ``AWS_ENDPOINT_URL_S3``). ``max_pool_connections`` bounds the connections to S3, so
    hundreds of simultaneous writes queue instead of failing.

    Example::

        store = ResultStore(region_name="us-west-2")
        try:
            exists = await store.head("rollouts", "exp/q-1/sid.json")
        finally:
            await store.aclose()
    """

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        session: AioSession | None = None,
        retry: RetryPolicy = DEFAULT_S3_RETRY,
        max_pool_connections: int = 64,
        connect_timeout: float = 10.0,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.retry = retry
        self.request_counts: Counter[str] = Counter()
        #: The aiobotocore session its clients come from (a client's other AWS clients share it).
        self.session = session or _session_keeping_timestamps()
        # botocore's per-request extras cost CPU on every one of thousands of small requests:
        # parameters are already validated by protocol.py, and result envelopes are small
        # JSON that S3 does not require checksums for, so both are switched off.
        self._config = AioConfig(
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout,
            read_timeout=30.0,
            retries={"total_max_attempts": 1},
            parameter_validation=False,
            user_agent=AWS_USER_AGENT,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        # One client per event loop, each held open by a suspended async generator: asyncio
        # closes a loop's generators when it shuts the loop down (asyncio.run, anyio.run and
        # uvicorn all do), so a client is closed on its own loop even when nobody calls
        # aclose(), e.g. an app served by Starlette's TestClient without ``with``.
        self._clients: dict[asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[Any, None]]] = {}
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"ResultStore(endpoint_url={self.endpoint_url!r}, region_name={self.region_name!r})"

    async def __aenter__(self) -> ResultStore:
        await self._get_client()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the S3 clients, each on its own loop (one whose loop has stopped was closed
        when the loop shut down); a closed store refuses further requests."""
        self._closed = True
        current = asyncio.get_running_loop()
        entries, self._clients = self._clients, {}
        self._locks.clear()
        for loop, (_, holder) in entries.items():
            if loop is current:
                await _close(holder)
            elif loop.is_running() and not loop.is_closed():
                closing = asyncio.run_coroutine_threadsafe(_close(holder), loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(closing), 10.0)
                except asyncio.TimeoutError:
                    logger.warning("an S3 client on another event loop did not close in time")

    async def _get_client(self) -> Any:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is not None:
            return entry[0]
        if self._closed:
            raise RuntimeError("ResultStore is closed")
        # A closed loop has closed its generators, and with them its client.
        for stopped in [other for other in self._clients if other.is_closed()]:
            del self._clients[stopped]
            self._locks.pop(stopped, None)
        lock = self._locks.setdefault(loop, asyncio.Lock())
        async with lock:
            # Another task may have created the client while this one waited for the lock.
            entry = self._clients.get(loop)
            if entry is None:
                holder = _hold_client(
                    self.session.create_client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        region_name=self.region_name,
                        config=self._config,
                    )
                )
                entry = self._clients[loop] = (await holder.__anext__(), holder)
        return entry[0]

    async def _call(
        self,
        operation: str,
        bucket: str,
        key: str | None,
        request: Callable[[Any], Awaitable[T]],
        *,
        missing_ok: bool = False,
    ) -> T | None:
        client = await self._get_client()

        async def attempt(_: int) -> T:
            self.request_counts[operation] += 1
            return await request(client)

        try:
            return await self.retry.run(attempt, is_transient_s3_error)
        except (ClientError, BotoCoreError, asyncio.TimeoutError) as exc:
            code = _error_code(exc)
            if missing_ok and code in _MISSING_CODES:
                return None
            raise StorageError(
                f"S3 {operation} s3://{bucket}/{key or ''} failed: {code}: {exc}",
                operation=operation,
                bucket=bucket,
                key=key,
                code=code,
            ) from exc

    async def put_bytes(
        self, bucket: str, key: str, body: bytes, *, content_type: str = "application/json"
    ) -> None:
        await self._call(
            "PutObject",
            bucket,
            key,
            lambda s3: s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type),
        )

    async def put_json(self, bucket: str, key: str, obj: Mapping[str, Any]) -> None:
        await self.put_bytes(bucket, key, json.dumps(obj, allow_nan=False).encode())

    async def get_bytes(self, bucket: str, key: str) -> bytes | None:
        """``None`` when the key does not exist (a missing bucket raises)."""

        async def request(s3: Any) -> bytes:
            response = await s3.get_object(Bucket=bucket, Key=key)
            async with response["Body"] as stream:
                data: bytes = await stream.read()
            return data

        return await self._call("GetObject", bucket, key, request, missing_ok=True)

    async def get_json(self, bucket: str, key: str) -> dict[str, Any] | None:
        """``None`` when the key does not exist (a missing bucket raises)."""
        body = await self.get_bytes(bucket, key)
        if body is None:
            return None
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise _unreadable(bucket, key, f"is not valid JSON: {exc}", "InvalidJSON") from exc
        if not isinstance(value, dict):
            kind = type(value).__name__
            raise _unreadable(bucket, key, f"holds JSON {kind}, not an object", "InvalidJSON")
        return value

    async def put_trace(self, bucket: str, key: str, trace: SessionTrace) -> None:
        await self.put_bytes(bucket, key, dump_trace(trace), content_type="application/gzip")

    async def get_trace(self, bucket: str, key: str) -> SessionTrace | None:
        """``None`` when there is none."""
        blob = await self.get_bytes(bucket, key)
        if blob is None:
            return None
        try:
            return load_trace(blob)
        except (ValueError, KeyError, OSError, EOFError) as exc:  # gzip raises OSError/EOF
            problem = f"is not a readable trace: {type(exc).__name__}: {exc}"
            raise _unreadable(bucket, key, problem, "InvalidTrace") from exc

    async def head(self, bucket: str, key: str) -> bool:
        """S3 answers HEAD without a body, so a missing bucket also reads as ``False``."""
        found = await self._call(
            "HeadObject",
            bucket,
            key,
            lambda s3: s3.head_object(Bucket=bucket, Key=key),
            missing_ok=True,
        )
        return found is not None

    async def delete(self, bucket: str, key: str) -> None:
        await self._call(
            "DeleteObject", bucket, key, lambda s3: s3.delete_object(Bucket=bucket, Key=key)
        )

    async def head_bucket(self, bucket: str) -> None:
        """``StorageError`` unless the bucket exists and lets us in (HEAD answers carry no
        body: the code is derived from the status)."""

        async def request(s3: Any) -> None:
            try:
                await s3.head_bucket(Bucket=bucket)
            except ClientError as exc:
                named = _HEAD_BUCKET_CODES.get(_http_status(exc))
                if named is not None:
                    exc.response.setdefault("Error", {})["Code"] = named
                raise

        await self._call("HeadBucket", bucket, None, request)

    async def list_keys(
        self, bucket: str, prefix: str, *, start_after: str | None = None
    ) -> list[str]:
        return list(await self.list_etags(bucket, prefix, start_after=start_after))

    async def list_etags(
        self, bucket: str, prefix: str, *, start_after: str | None = None
    ) -> dict[str, str]:
        keys: dict[str, str] = {}
        token: str | None = None
        while True:
            # From the page token once there is one, else after ``start_after``.
            params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token is not None:
                params["ContinuationToken"] = token
            elif start_after is not None:
                params["StartAfter"] = start_after

            async def request(s3: Any, params: dict[str, Any] = params) -> Any:
                return await s3.list_objects_v2(**params)

            page = await self._call("ListObjectsV2", bucket, prefix, request)
            assert page is not None
            keys.update((obj["Key"], obj.get("ETag", "")) for obj in page.get("Contents", ()))
            if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                return keys
            token = page["NextContinuationToken"]

    async def ensure_bucket(self, bucket: str) -> None:

        async def request(s3: Any) -> None:
            params: dict[str, Any] = {"Bucket": bucket}
            region = s3.meta.region_name
            # us-east-1 is S3's default location and refuses an explicit constraint.
            if region and region != "us-east-1":
                params["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                await s3.create_bucket(**params)
            except ClientError as exc:
                if _error_code(exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    raise

        await self._call("CreateBucket", bucket, None, request)


def _session_keeping_timestamps() -> AioSession:
    """An aiobotocore session whose responses keep timestamps as the strings S3 sent.

    botocore parses every ``LastModified`` of a listing into a datetime, more than half the
    CPU of a 1,000-key LIST page; the store returns keys only, so it never reads one. A
    client's AgentCore Runtime calls share the session: their answers carry no timestamps.
    """
    core = get_session()
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    return core
