"""A local stand-in for AgentCore Runtime's data plane, in front of ordinary agent servers:
the real (aio)botocore client works against it unchanged (docs/local.md says what it emulates
and what not)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import unquote

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from agentcore_rl import protocol
from agentcore_rl.edge import Refusal, read_body
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.protocol import (
    INVOCATIONS_PATH,
    REQUEST_ID_HEADER,
    SESSION_ID_HEADER,
    STOP_SESSION_PATH,
    is_acr_session_id,
    new_session_id,
    parse_runtime_arn,
)
from agentcore_rl.ratelimit import TokenBucket

__all__ = [
    "DEFAULT_AGENT_RUNTIME_ARN",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_RUNTIME_TIMEOUT",
    "LocalAgentCoreRuntime",
]

logger = logging.getLogger(__name__)

#: The ARN a local runtime answers to unless told otherwise (its region is the client's).
DEFAULT_AGENT_RUNTIME_ARN: Final = (
    "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/local-agent"
)
#: ACR's payload limit.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 100_000_000
#: Forwarding timeouts; the read timeout is ACR's 15-minute limit on a synchronous request.
DEFAULT_RUNTIME_TIMEOUT: Final = httpx.Timeout(connect=5.0, read=900.0, write=60.0, pool=60.0)

# botocore's REST-JSON parser reads the error code from this header, the request id from
# the other.
_ERROR_TYPE_HEADER: Final = "x-amzn-ErrorType"
_AWS_REQUEST_ID_HEADER: Final = "x-amzn-RequestId"
_INVOKE: Final = "invocations"
_STOP: Final = "stopruntimesession"
# Error codes with their HTTP status, as in botocore's bedrock-agentcore service model
# (UnknownOperationException is what AWS REST services answer for a path of no operation).
_VALIDATION: Final = "ValidationException"
_NOT_FOUND: Final = "ResourceNotFoundException"
_RUNTIME_CLIENT_ERROR: Final = "RuntimeClientError"
_THROTTLING: Final = "ThrottlingException"
_INTERNAL: Final = "InternalServerException"
_UNKNOWN_OPERATION: Final = "UnknownOperationException"
_ERROR_STATUS: Final = {
    _VALIDATION: 400,
    _NOT_FOUND: 404,
    _RUNTIME_CLIENT_ERROR: 424,
    _THROTTLING: 429,
    _INTERNAL: 500,
    _UNKNOWN_OPERATION: 404,
}
_MAX_AGENT_MESSAGE: Final = 1000
# A StopRuntimeSession body holds only a client token.
_MAX_STOP_BODY_BYTES: Final = 64 * 1024
# Completed stops remembered by client token, so that botocore's retry of a stop whose
# answer was lost gets the same 200 instead of "session not found".
_STOP_TOKEN_MEMORY: Final = 4096
# Request headers passed through to the agent besides the session and request ids.
_FORWARDED_HEADERS: Final = (
    "content-type",
    "accept",
    "x-amzn-bedrock-agentcore-runtime-user-id",
    "x-amzn-trace-id",
    "traceparent",
    "tracestate",
    "baggage",
)
# Below uvicorn's default keep-alive (5 s), the agents' in a local stack.
_KEEPALIVE_EXPIRY: Final = 2.0


def parse_runtime_path(raw_path: bytes) -> tuple[str, str] | None:
    """``(arn, operation)`` of a raw path ``/runtimes/{arn}/{operation}``, else ``None``.

    botocore percent-encodes the whole ARN into one segment, so the raw path is split first
    and the ARN decoded afterwards; an unencoded ARN works too.
    """
    parts = raw_path.split(b"/")
    if len(parts) < 4 or parts[0] or parts[1] != b"runtimes":
        return None
    encoded_arn = b"/".join(parts[2:-1])
    if not encoded_arn:
        return None
    # latin-1 maps bytes 1:1, so decoding cannot fail; unquote then yields UTF-8 text.
    return unquote(encoded_arn.decode("latin-1")), parts[-1].decode("latin-1")


class _Refusal(Refusal):
    """A refusal under an AWS error code (its ``kind``), and the validation ``reason``."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        reason: str = "FieldValidationFailed",
        field: str | None = None,
        session_id: str | None = None,
    ) -> None:
        headers = {SESSION_ID_HEADER: session_id} if session_id is not None else None
        super().__init__(_ERROR_STATUS[code], message, code, headers, field=field)
        self.reason = reason


def _aws_answer(refusal: Refusal, request_id: str) -> JSONResponse:
    """A refusal exactly as botocore parses it into ``ClientError`` (the edge's own refusals,
    a body too large or too slow, are validation errors)."""
    code = refusal.kind if refusal.kind in _ERROR_STATUS else _VALIDATION
    body: dict[str, Any] = {"message": refusal.message}
    if code == _VALIDATION:
        body["reason"] = getattr(refusal, "reason", "FieldValidationFailed")
        if refusal.field is not None:
            body["fieldList"] = [{"name": refusal.field, "message": refusal.message}]
    headers = {**refusal.headers, _ERROR_TYPE_HEADER: code, _AWS_REQUEST_ID_HEADER: request_id}
    return JSONResponse(body, status_code=_ERROR_STATUS[code], headers=headers)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _agent_message(status: int, body: bytes) -> str:
    """The agent's own error text: its JSON body's ``error``/``message``/``detail``, or the body."""
    text = body.decode("utf-8", errors="replace").strip()
    data = _json_object(body) or {}
    text = next(
        (data[k] for k in ("error", "message", "detail") if isinstance(data.get(k), str)), text
    )
    return text[:_MAX_AGENT_MESSAGE] or f"HTTP {status} with an empty body"


def _check_session_id(session_id: str | None) -> str:
    if session_id is None:
        raise _Refusal(
            _VALIDATION,
            f"runtimeSessionId is required (header {SESSION_ID_HEADER})",
            field="runtimeSessionId",
        )
    if not is_acr_session_id(session_id):
        raise _Refusal(
            _VALIDATION,
            f"runtimeSessionId {session_id[:60]!r} (length {len(session_id)}) is invalid: it "
            "must be 33-256 letters, digits and single hyphens, starting and ending with a "
            "letter or digit",
            field="runtimeSessionId",
        )
    return session_id


def _agent_unreachable(url: str, exc: httpx.HTTPError, session_id: str) -> _Refusal:
    logger.warning("agent at %s unreachable: %s: %s", url, type(exc).__name__, exc)
    what = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "is unreachable"
    return _Refusal(
        _RUNTIME_CLIENT_ERROR,
        f"the agent at {url} {what} ({type(exc).__name__}: {exc})",
        session_id=session_id,
    )


def _agent_failure(url: str, status: int, body: bytes, session_id: str) -> _Refusal:
    """An agent's 4xx is the caller's fault (``ValidationException``), a 429 stays a throttle,
    anything else is the agent failing (``RuntimeClientError``)."""
    message = _agent_message(status, body)
    if 400 <= status < 500 and status != 429:
        field = (_json_object(body) or {}).get("field")
        return _Refusal(
            _VALIDATION,
            f"the agent rejected the request (HTTP {status}): {message}",
            field=field if isinstance(field, str) else "payload",
            session_id=session_id,
        )
    return _Refusal(
        _THROTTLING if status == 429 else _RUNTIME_CLIENT_ERROR,
        f"Received error ({status}) from the agent at {url}: {message}",
        session_id=session_id,
    )


class _Runtime:
    """One runtime ARN: its agent servers, its TPS bucket and its session affinity."""

    def __init__(self, arn: str, agent_urls: Sequence[str], bucket: TokenBucket | None):
        self.arn = arn
        self.agent_urls = tuple(agent_urls)
        self.bucket = bucket
        self.sessions: dict[str, int] = {}
        self.load = [0] * len(self.agent_urls)
        self._cursor = 0
        self.stop_tokens: OrderedDict[str, None] = OrderedDict()

    def bind(self, session_id: str) -> tuple[int, bool]:
        """The agent index of a session, binding a new one; and whether it is new."""
        index = self.sessions.get(session_id)
        if index is not None:
            return index, False
        # Fewest live sessions wins; ties go round-robin so equal agents take turns.
        least = min(self.load)
        n = len(self.agent_urls)
        index = next(i for i in ((self._cursor + s) % n for s in range(n)) if self.load[i] == least)
        self._cursor = (index + 1) % n
        self.sessions[session_id] = index
        self.load[index] += 1
        return index, True

    def release(self, session_id: str) -> None:
        index = self.sessions.pop(session_id, None)
        if index is not None:
            self.load[index] -= 1


class _ProxiedResponse(Response):
    """Streams the agent's response body through, closing it whatever happens."""

    def __init__(self, upstream: httpx.Response, headers: Mapping[str, str]) -> None:
        super().__init__(status_code=200, headers=headers)
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.upstream.aiter_raw():
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.upstream.aclose()


class LocalAgentCoreRuntime:
    """The ACR data plane (``InvokeAgentRuntime``, ``StopRuntimeSession``) as an ASGI app.

    ``runtimes`` maps each runtime ARN this stand-in answers to the base URLs of its agent
    servers. Each session id is bound to one of them on first sight (the one with the
    fewest live sessions, ties in turn) and stays there until ``StopRuntimeSession``.
    ``tps`` caps each runtime's requests per second, invoke and stop together, with a
    burst of ``burst`` (default: one second's worth); ``None`` switches the limit off.
    ``clock`` drives the limit (tests inject one). ``timeout`` bounds each forwarded call.

    One ``httpx.AsyncClient`` forwards every call; it is closed by the ASGI lifespan
    shutdown or by :meth:`aclose`.

    Example::

        runtime = LocalAgentCoreRuntime(
            {"arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/demo":
                ["http://127.0.0.1:8080", "http://127.0.0.1:8082"]},
            tps=25,
        )
        async with BackgroundServer(runtime) as server:
            os.environ["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE"] = server.url
    """

    def __init__(
        self,
        runtimes: Mapping[str, Sequence[str]],
        *,
        tps: float | None = protocol.DEFAULT_TPS,
        burst: float | None = None,
        timeout: httpx.Timeout | float = DEFAULT_RUNTIME_TIMEOUT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_connections: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not runtimes:
            raise ConfigurationError("a local runtime needs at least one runtime ARN")
        if max_payload_bytes < 1:
            raise ConfigurationError(f"max_payload_bytes must be >= 1, got {max_payload_bytes}")
        self._runtimes: dict[str, _Runtime] = {}
        for arn, urls in runtimes.items():
            parse_runtime_arn(arn)
            if isinstance(urls, str) or not urls:
                raise ConfigurationError(f"runtime {arn} needs a non-empty list of agent URLs")
            for url in urls:
                if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                    raise ConfigurationError(
                        f"agent URL {url!r} of runtime {arn} must start with http:// or https://"
                    )
            bucket = None if tps is None else TokenBucket(tps, burst, clock=clock)
            self._runtimes[arn] = _Runtime(arn, [url.rstrip("/") for url in urls], bucket)
        self.tps = tps
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.max_payload_bytes = max_payload_bytes
        self.max_connections = max_connections
        #: Outcomes so far: the operation name on success, else the error code.
        self.counts: Counter[str] = Counter()
        # Agent URLs that answered 404/405 to a stop (no stop route): not asked again.
        self._stop_unsupported: set[str] = set()
        self._http: httpx.AsyncClient | None = None

    def session_agent(self, arn: str, session_id: str) -> str | None:
        """The agent URL a live session is bound to; ``None`` if unknown or stopped."""
        runtime = self._runtimes[arn]
        index = runtime.sessions.get(session_id)
        return None if index is None else runtime.agent_urls[index]

    def live_sessions(self, arn: str) -> int:
        """How many sessions of a runtime are bound to an agent (invoked, not stopped)."""
        return len(self._runtimes[arn].sessions)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Every path is one of two operations, told apart by _route: no router in between.
        if scope["type"] == "http":
            response = await self._dispatch(Request(scope, receive))
            await response(scope, receive, send)
        elif scope["type"] == "lifespan":  # the forwarding client is closed at shutdown
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await self.aclose()
            await send({"type": "lifespan.shutdown.complete"})

    async def aclose(self) -> None:
        """Close the forwarding HTTP client. Idempotent."""
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # trust_env=False: a developer's HTTP(S)_PROXY must not capture loopback agents.
            # An idle connection is dropped before an agent's keep-alive (uvicorn's 5 s) ends
            # it: reusing one the agent is closing fails the invocation with a 424.
            self._http = httpx.AsyncClient(
                timeout=self.timeout,
                limits=httpx.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                    keepalive_expiry=_KEEPALIVE_EXPIRY,
                ),
                trust_env=False,
            )
        return self._http

    async def _dispatch(self, request: Request) -> Response:
        request_id = str(uuid.uuid4())
        try:
            response = await self._route(request, request_id)
        except Refusal as refusal:
            response = _aws_answer(refusal, request_id)
        except Exception:
            logger.exception("local AgentCore Runtime failed on %s", request.scope["path"])
            failed = _Refusal(_INTERNAL, "the local runtime failed; see its log")
            response = _aws_answer(failed, request_id)
        error = response.headers.get("x-amzn-errortype")
        if error is not None:
            self.counts[error] += 1
        return response

    async def _route(self, request: Request, request_id: str) -> Response:
        scope, method = request.scope, request.scope["method"]
        parsed = parse_runtime_path(scope.get("raw_path") or scope["path"].encode())
        if parsed is None or method != "POST" or parsed[1] not in (_INVOKE, _STOP):
            raise _Refusal(
                _UNKNOWN_OPERATION,
                f"{method} {scope['path']} is not an operation of this runtime; "
                "use POST /runtimes/{arn}/invocations or /runtimes/{arn}/stopruntimesession",
            )
        arn, operation = parsed
        runtime = self._runtimes.get(arn)
        if runtime is None:
            raise _Refusal(
                _NOT_FOUND,
                f"no agent runtime {arn}; this local runtime serves {', '.join(self._runtimes)}",
            )
        if runtime.bucket is not None and not runtime.bucket.try_acquire():
            raise _Refusal(
                _THROTTLING,
                f"Rate exceeded: runtime {arn} allows {self.tps:g} requests per second",
            )
        if operation == _INVOKE:
            return await self._invoke(request, runtime, request_id)
        return await self._stop(request, runtime, request_id)

    async def _invoke(self, request: Request, runtime: _Runtime, request_id: str) -> Response:
        # botocore always sends a session id (an idempotency token); a raw HTTP caller may not.
        session_id = _check_session_id(request.headers.get(SESSION_ID_HEADER, new_session_id()))
        payload = await _read_body(request, self.max_payload_bytes)
        if not payload:
            raise _Refusal(_VALIDATION, "payload must not be empty", field="payload")
        index, is_new = runtime.bind(session_id)
        url = runtime.agent_urls[index]
        headers = {k: v for k in _FORWARDED_HEADERS if (v := request.headers.get(k)) is not None}
        # identity: the body is passed through byte for byte, Content-Length included.
        headers |= {
            SESSION_ID_HEADER: session_id,
            REQUEST_ID_HEADER: request_id,
            "accept-encoding": "identity",
        }
        http = self._client()
        forward = http.build_request(
            "POST", url + INVOCATIONS_PATH, content=payload, headers=headers
        )
        try:
            upstream = await http.send(forward, stream=True)
        except httpx.HTTPError as exc:
            if is_new:
                runtime.release(session_id)
            raise _agent_unreachable(url, exc, session_id) from None
        if not 200 <= upstream.status_code < 300:
            try:
                body = await upstream.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await upstream.aclose()
            # A session no agent accepted holds no affinity: nothing runs there to stop.
            if is_new:
                runtime.release(session_id)
            raise _agent_failure(url, upstream.status_code, body, session_id)
        self.counts["InvokeAgentRuntime"] += 1
        out_headers = {
            SESSION_ID_HEADER: session_id,
            _AWS_REQUEST_ID_HEADER: request_id,
            "content-type": upstream.headers.get("content-type", "application/json"),
        }
        if "content-length" in upstream.headers:
            out_headers["content-length"] = upstream.headers["content-length"]
        return _ProxiedResponse(upstream, out_headers)

    async def _stop(self, request: Request, runtime: _Runtime, request_id: str) -> Response:
        session_id = _check_session_id(request.headers.get(SESSION_ID_HEADER))
        body = await _read_body(request, _MAX_STOP_BODY_BYTES)
        data = _json_object(body) if body.strip() else {}
        token = None if data is None else data.get("clientToken")
        if data is None or not (token is None or isinstance(token, str)):
            raise _Refusal(
                _VALIDATION,
                "the StopRuntimeSession body must be a JSON object with a string clientToken",
                reason="CannotParse",
            )
        if token is None or token not in runtime.stop_tokens:
            index = runtime.sessions.get(session_id)
            if index is None:
                raise _Refusal(
                    _NOT_FOUND,
                    f"session {session_id} is not live on runtime {runtime.arn} "
                    "(never invoked, or already stopped)",
                )
            url = runtime.agent_urls[index]
            if url in self._stop_unsupported or not await self._agent_stops(
                url, session_id, request_id
            ):
                self.counts["AgentStopUnsupported"] += 1
            runtime.release(session_id)
            if token is not None:
                runtime.stop_tokens[token] = None
                if len(runtime.stop_tokens) > _STOP_TOKEN_MEMORY:
                    runtime.stop_tokens.popitem(last=False)
        self.counts["StopRuntimeSession"] += 1
        return JSONResponse(
            {}, headers={SESSION_ID_HEADER: session_id, _AWS_REQUEST_ID_HEADER: request_id}
        )

    async def _agent_stops(self, url: str, session_id: str, request_id: str) -> bool:
        """Stop the session on its agent; ``False``: the agent has no stop route."""
        try:
            answer = await self._client().post(
                url + STOP_SESSION_PATH.format(session_id=session_id),
                headers={SESSION_ID_HEADER: session_id, REQUEST_ID_HEADER: request_id},
            )
        except httpx.HTTPError as exc:
            raise _agent_unreachable(url, exc, session_id) from None
        # 404/405: an agent without our stop extension; like ACR ending the microVM, the
        # session is over for the runtime either way.
        if answer.status_code in (404, 405):
            self._stop_unsupported.add(url)
            logger.info(
                "the agent at %s has no stop route (HTTP %d): its sessions are released "
                "without stopping their rollouts; counted as AgentStopUnsupported",
                url,
                answer.status_code,
            )
            return False
        if not 200 <= answer.status_code < 300:
            message = _agent_message(answer.status_code, answer.content)
            raise _Refusal(
                _RUNTIME_CLIENT_ERROR,
                f"the agent at {url} failed to stop session {session_id} "
                f"(HTTP {answer.status_code}): {message}",
                session_id=session_id,
            )
        return True


async def _read_body(request: Request, limit: int) -> bytes:
    return await read_body(
        request.receive,
        request.scope["headers"],
        limit=limit,
        field="payload",
        setting="max_payload_bytes",
    )
