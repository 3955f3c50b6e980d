"""ACR transport: AgentCore Runtime's data plane through one aiobotocore client
(docs/client.md, "Transports")."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, ReadTimeoutError
from botocore.exceptions import ConnectionError as BotoConnectionError

from agentcore_rl import protocol
from agentcore_rl.client.transports.transport import (
    RetryableError,
    json_object_answer,
    session_state,
)
from agentcore_rl.errors import InvocationError
from agentcore_rl.s3 import AWS_USER_AGENT

__all__ = ["AcrTransport"]


# Error codes (x-amzn-ErrorType) worth another try with the same session id.
_THROTTLED: Final = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})
_RETRYABLE: Final = frozenset(
    {"InternalServerException", "RetryableConflictException", "ConflictException"}
)


def _classify(exc: ClientError, session_id: str) -> InvocationError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    message = str(error.get("Message", "")) or str(exc)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    status = status if isinstance(status, int) else None
    text = f"{code or 'error'} (HTTP {status}): {message}"
    if code in _THROTTLED or status == 429:
        return RetryableError(text, session_id=session_id, status_code=status, throttled=True)
    # RuntimeClientError (424) is how ACR reports an agent container answering 5xx, e.g. a
    # server that is shutting down: worth retrying like any 5xx.
    if code in _RETRYABLE or code == "RuntimeClientError" or (status or 0) >= 500:
        return RetryableError(text, session_id=session_id, status_code=status)
    return InvocationError(text, session_id=session_id, status_code=status)


class AcrTransport:
    """Invoke and stop sessions of one AgentCore runtime."""

    name = "acr"
    #: A finished session keeps its microVM (and a slot of the active-session quota) until
    #: it is stopped or idles out, so it is worth a stop call.
    stop_after_result = True

    def __init__(
        self,
        agent_runtime_arn: str,
        *,
        endpoint_url: str | None = None,
        qualifier: str | None = None,
        session: AioSession | None = None,
        max_connections: int = 64,
    ) -> None:
        self.agent_runtime_arn = agent_runtime_arn
        self.region = protocol.parse_runtime_arn(agent_runtime_arn).region
        self.endpoint_url = endpoint_url
        self.qualifier = qualifier
        self._session = session or get_session()
        self._config = AioConfig(
            retries={"total_max_attempts": 1},
            # Session ids, ARNs and payloads are validated before they get here; botocore's
            # second check costs CPU on every invoke and stop.
            parameter_validation=False,
            user_agent=AWS_USER_AGENT,
            max_pool_connections=max_connections,
            connect_timeout=60.0,
            read_timeout=60.0,
        )
        self._limit = asyncio.Semaphore(max_connections)  # queue here, not in the pool
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"AcrTransport(agent_runtime_arn={self.agent_runtime_arn!r})"

    async def connect(self) -> None:
        """Create the aiobotocore client now rather than on the first call, which would
        otherwise wait for it (loading the service model and the TLS context costs a fifth
        of a second of CPU)."""
        await self._get_client()

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._closed:
                raise InvocationError("the ACR transport is closed")
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                client = await stack.enter_async_context(
                    self._session.create_client(
                        "bedrock-agentcore",
                        region_name=self.region,
                        endpoint_url=self.endpoint_url,
                        config=self._config,
                    )
                )
                self._client, self._stack = client, stack
        return self._client

    def _common(self, session_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {
            "agentRuntimeArn": self.agent_runtime_arn,
            "runtimeSessionId": session_id,
        }
        if self.qualifier is not None:
            params["qualifier"] = self.qualifier
        return params

    async def _call(self, session_id: str, operation: str, params: dict[str, Any]) -> Any:
        client = await self._get_client()
        try:
            async with self._limit:
                response = await getattr(client, operation)(**params)
                if "response" in response:
                    # The body streams; a rollout entrypoint's answer is small: read it all.
                    async with response["response"] as stream:
                        response["body"] = await stream.read()
                return response
        except ClientError as exc:
            raise _classify(exc, session_id) from exc
        except (BotoConnectionError, HTTPClientError, ReadTimeoutError, OSError) as exc:
            raise RetryableError(
                f"{operation}: {type(exc).__name__}: {exc}", session_id=session_id
            ) from exc
        except BotoCoreError as exc:
            raise InvocationError(
                f"{operation}: {type(exc).__name__}: {exc}", session_id=session_id
            ) from exc

    async def invoke(self, session_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        params = self._common(session_id)
        params.update(
            payload=json.dumps(payload).encode(),
            contentType="application/json",
            accept="application/json",
        )
        response = await self._call(session_id, "invoke_agent_runtime", params)
        raw: bytes = response.get("body", b"")
        return json_object_answer(raw, source="InvokeAgentRuntime", session_id=session_id)

    async def status(self, session_id: str) -> protocol.SessionState:
        """A control request: a microVM that restarted, or a new one, answers unknown."""
        answer = await self.invoke(session_id, protocol.status_request())
        return session_state(answer, source="InvokeAgentRuntime", session_id=session_id)

    async def stop(self, session_id: str) -> bool:
        """False when ACR no longer knows the session."""
        try:
            await self._call(session_id, "stop_runtime_session", self._common(session_id))
        except InvocationError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True

    async def aclose(self) -> None:
        self._closed = True
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()
