"""What a client checks when entered (and ``agentcore-rl eval`` before its first rollout):
one cheap call per service it was given, each failure one line naming the service."""

from __future__ import annotations

import os
from typing import Any, Final

import anyio

from agentcore_rl import protocol
from agentcore_rl.errors import GatewayError, InvocationError, StorageError
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.s3 import ResultStore

__all__ = ["check_agents", "check_bucket", "check_gateway", "check_runtime"]

#: Seconds a service has to answer a check once connected (connecting has
#: ``Timeouts.check``): a service that needs longer is not ready for a run.
_ANSWER_SECONDS: Final = 5.0
#: Fail fast when S3 is unreachable: a check makes one attempt and never backs off.
_QUICK_S3_RETRY: Final = RetryPolicy(attempts=1)
# Key parts start with a letter or digit: listing this prefix proves the bucket readable.
_PREFLIGHT_PREFIX: Final = ".agentcore-rl-preflight/"


async def check_bucket(
    bucket: str, endpoint_url: str | None, region: str | None, session: Any, within: float
) -> None:
    """``session``: an aiobotocore session to share (its loaded service models are most of a
    client's CPU)."""
    store = ResultStore(
        endpoint_url=endpoint_url,
        region_name=region,
        session=session,
        retry=_QUICK_S3_RETRY,
        connect_timeout=within,
    )
    where = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS S3"
    async with store:
        try:
            with anyio.fail_after(_ANSWER_SECONDS):
                await store.list_keys(bucket, _PREFLIGHT_PREFIX)
        except TimeoutError:
            raise StorageError(
                f"cannot use S3 bucket {bucket!r} at {where}: no answer within "
                f"{_ANSWER_SECONDS:g} s",
                operation="ListObjectsV2",
                bucket=bucket,
            ) from None
        except StorageError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise StorageError(
                f"cannot use S3 bucket {bucket!r} at {where}: {exc.code}: {cause}",
                operation=exc.operation,
                bucket=bucket,
                code=exc.code,
            ) from exc


async def check_agents(urls: list[str], within: float) -> None:
    # lazy: httpx is the client extra; the runtime check needs only aiobotocore
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(_ANSWER_SECONDS, connect=within)) as http:
        for url in urls:
            try:
                response = await http.get(url + protocol.PING_PATH)
            except httpx.HTTPError as exc:
                raise InvocationError(
                    f"cannot reach the agent at {url}: {type(exc).__name__}: {exc}"
                ) from None
            if response.status_code >= 500:
                raise InvocationError(
                    f"the agent at {url} is unhealthy: HTTP {response.status_code}",
                    status_code=response.status_code,
                )


async def check_runtime(arn: str, endpoint_url: str | None, session: Any, within: float) -> None:
    """A ``StopRuntimeSession`` of an unused session."""
    # lazy: only the runtime check talks to AWS
    from aiobotocore.config import AioConfig
    from botocore.exceptions import BotoCoreError, ClientError

    region = protocol.parse_runtime_arn(arn).region
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE")
    where = endpoint or f"AgentCore in {region}"
    session_id = protocol.new_session_id()
    config = AioConfig(
        connect_timeout=within, read_timeout=_ANSWER_SECONDS, retries={"total_max_attempts": 1}
    )
    try:
        async with session.create_client(
            "bedrock-agentcore", region_name=region, endpoint_url=endpoint, config=config
        ) as client:
            await client.stop_runtime_session(agentRuntimeArn=arn, runtimeSessionId=session_id)
    except ClientError as exc:
        error: Any = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", "")) or str(exc)
        looked_for_session = session_id in message or "session" in message.lower()
        if code == "ResourceNotFoundException" and looked_for_session:
            return  # the runtime is there
        if code in ("ThrottlingException", "ServiceQuotaExceededException"):
            return  # the runtime's own quota answered: it is there
        if code == "ResourceNotFoundException":
            raise InvocationError(
                f"the AgentCore endpoint {where} does not serve runtime {arn}: {message}",
                status_code=404,
            ) from None
        raise InvocationError(
            f"the AgentCore endpoint {where} refuses runtime {arn}: {code}: {message}"
        ) from None
    except BotoCoreError as exc:  # endpoint down, no credentials, a timeout
        raise InvocationError(
            f"cannot reach the AgentCore endpoint {where}: {type(exc).__name__}: {exc}"
        ) from None


async def check_gateway(url: str, token: str | None, within: float) -> None:
    # lazy: as above (the client extra)
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(_ANSWER_SECONDS, connect=within)) as http:
        try:
            health = await http.get(url + "/health")
            if health.status_code != 200 or "gateway_id" not in _json(health):
                raise GatewayError(
                    f"{url} is not a rollout gateway: GET /health answered HTTP "
                    f"{health.status_code} (start one with agentcore-rl gateway)"
                )
            stats = await http.get(
                url + "/admin/stats",
                headers={"authorization": f"Bearer {token}"} if token else {},
            )
        except httpx.HTTPError as exc:
            raise GatewayError(
                f"cannot reach the gateway at {url}: {type(exc).__name__}: {exc}"
            ) from None
    if stats.status_code == 401:
        raise GatewayError(f"the gateway at {url} refuses the admin token (--gateway-admin-token)")
    if stats.status_code == 403:
        raise GatewayError(
            f"the gateway at {url} has its admin routes off: start it with --admin-token"
        )
    if stats.status_code != 200:
        raise GatewayError(
            f"the gateway at {url} answered HTTP {stats.status_code} on its admin routes"
        )


def _json(response: Any) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
