"""The AgentCore Runtime data plane as botocore sees it: paths, ARNs and error responses.

The local runtime (:mod:`agentcore_rl.local.runtime`) answers the real ``bedrock-agentcore``
client, so its errors must parse exactly as botocore's REST-JSON parser expects: the HTTP
status of the modelled error, the error code in the ``x-amzn-ErrorType`` header (which the
parser prefers over the body), and a JSON body carrying ``message`` plus the error's other
modelled members (``reason`` and ``fieldList`` for ``ValidationException``).

It also maps what an agent server answers (its error statuses, an unreachable agent) to
the error the runtime's caller gets.

Example::

    from agentcore_rl.local.runtime_wire import VALIDATION, acr_error

    response = acr_error(VALIDATION, "runtimeSessionId is too short", request_id="r-1")
    response.status_code                      # 400
    response.headers["x-amzn-ErrorType"]      # "ValidationException"
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

import httpx
from starlette.responses import JSONResponse, Response

from agentcore_rl.protocol import SESSION_ID_HEADER

__all__ = [
    "ACCESS_DENIED",
    "AWS_REQUEST_ID_HEADER",
    "ERROR_STATUS",
    "ERROR_TYPE_HEADER",
    "INTERNAL",
    "INVOKE_OPERATION",
    "NOT_FOUND",
    "REASON_CANNOT_PARSE",
    "REASON_FIELD_VALIDATION_FAILED",
    "RUNTIME_CLIENT_ERROR",
    "STOP_OPERATION",
    "THROTTLING",
    "UNKNOWN_OPERATION",
    "VALIDATION",
    "acr_error",
    "agent_failure",
    "agent_field",
    "agent_message",
    "agent_unreachable",
    "bad_session_id",
    "parse_client_token",
    "parse_runtime_path",
    "payload_too_large",
]

#: Header botocore's REST-JSON parser reads the error code from.
ERROR_TYPE_HEADER: Final = "x-amzn-ErrorType"
#: Header botocore copies into ``ResponseMetadata.RequestId``.
AWS_REQUEST_ID_HEADER: Final = "x-amzn-RequestId"

#: The last path segment of each data-plane operation (``/runtimes/{arn}/<segment>``).
INVOKE_OPERATION: Final = "invocations"
STOP_OPERATION: Final = "stopruntimesession"

# Error codes, as modelled in botocore's bedrock-agentcore service model.
VALIDATION: Final = "ValidationException"
ACCESS_DENIED: Final = "AccessDeniedException"
NOT_FOUND: Final = "ResourceNotFoundException"
RUNTIME_CLIENT_ERROR: Final = "RuntimeClientError"
THROTTLING: Final = "ThrottlingException"
INTERNAL: Final = "InternalServerException"
#: Not modelled; what AWS REST services answer for a path that names no operation.
UNKNOWN_OPERATION: Final = "UnknownOperationException"

#: HTTP status of each error code (from the service model's ``httpStatusCode``).
ERROR_STATUS: Final[Mapping[str, int]] = {
    VALIDATION: 400,
    ACCESS_DENIED: 403,
    NOT_FOUND: 404,
    RUNTIME_CLIENT_ERROR: 424,
    THROTTLING: 429,
    INTERNAL: 500,
    UNKNOWN_OPERATION: 404,
}

# ValidationException.reason values (ValidationExceptionReason in the service model).
REASON_CANNOT_PARSE: Final = "CannotParse"
REASON_FIELD_VALIDATION_FAILED: Final = "FieldValidationFailed"

_MAX_AGENT_MESSAGE: Final = 1000


def parse_runtime_path(raw_path: bytes) -> tuple[str, str] | None:
    """Split a raw request path ``/runtimes/{arn}/{operation}`` into ``(arn, operation)``.

    botocore percent-encodes the whole ARN into one segment (``/`` becomes ``%2F``), so the
    raw, undecoded path is split first and the ARN decoded afterwards. A client that sends
    the ARN unencoded still works: everything between ``runtimes`` and the last segment is
    the ARN. ``None`` when the path has no such shape.
    """
    parts = raw_path.split(b"/")
    if len(parts) < 4 or parts[0] or parts[1] != b"runtimes":
        return None
    encoded_arn = b"/".join(parts[2:-1])
    if not encoded_arn:
        return None
    # latin-1 maps bytes 1:1, so decoding cannot fail; unquote then yields UTF-8 text.
    return unquote(encoded_arn.decode("latin-1")), parts[-1].decode("latin-1")


def acr_error(
    code: str,
    message: str,
    *,
    request_id: str,
    reason: str | None = None,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error response exactly as botocore parses it into ``ClientError``.

    ``reason`` and ``field`` fill ``ValidationException``'s ``reason`` and ``fieldList``.
    """
    body: dict[str, Any] = {"message": message}
    if code == VALIDATION:
        body["reason"] = reason or REASON_FIELD_VALIDATION_FAILED
        if field is not None:
            body["fieldList"] = [{"name": field, "message": message}]
    all_headers = {ERROR_TYPE_HEADER: code, AWS_REQUEST_ID_HEADER: request_id}
    if headers:
        all_headers.update(headers)
    return JSONResponse(body, status_code=ERROR_STATUS[code], headers=all_headers)


def agent_message(status: int, body: bytes) -> str:
    """The agent's own error text: ``error``/``message`` from a JSON body, else the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for name in ("error", "message", "detail"):
            if isinstance(data.get(name), str):
                text = data[name]
                break
    text = text[:_MAX_AGENT_MESSAGE] or f"HTTP {status} with an empty body"
    return text


def agent_field(body: bytes) -> str | None:
    """The ``field`` an agent's JSON error names, if any."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    field = data.get("field") if isinstance(data, dict) else None
    return field if isinstance(field, str) else None


def parse_client_token(body: bytes) -> tuple[bool, str | None]:
    """``(valid, clientToken)`` of a stop body; an empty body is valid and has no token."""
    if not body.strip():
        return True, None
    try:
        data: Any = json.loads(body)
    except ValueError:
        return False, None
    token = data.get("clientToken") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not (token is None or isinstance(token, str)):
        return False, None
    return True, token


def bad_session_id(session_id: str, request_id: str) -> Response:
    """``ValidationException`` for a session id outside ACR's rules."""
    return acr_error(
        VALIDATION,
        f"runtimeSessionId {session_id[:60]!r} (length {len(session_id)}) is invalid: it must "
        "be 33-256 letters, digits and single hyphens, starting and ending with a letter or digit",
        request_id=request_id,
        field="runtimeSessionId",
    )


def payload_too_large(size: int, limit: int, request_id: str) -> Response:
    """``ValidationException`` for a payload over the size limit."""
    return acr_error(
        VALIDATION,
        f"payload of {size} bytes exceeds the limit of {limit} bytes",
        request_id=request_id,
        field="payload",
    )


def agent_unreachable(url: str, exc: httpx.HTTPError, request_id: str, session_id: str) -> Response:
    """``RuntimeClientError`` for an agent that could not be reached or timed out."""
    what = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "is unreachable"
    return acr_error(
        RUNTIME_CLIENT_ERROR,
        f"the agent at {url} {what} ({type(exc).__name__}: {exc})",
        request_id=request_id,
        headers={SESSION_ID_HEADER: session_id},
    )


def agent_failure(url: str, status: int, body: bytes, request_id: str, session_id: str) -> Response:
    """Map an agent's error answer to the error ACR's caller gets.

    A 4xx means the agent refused this request (a bad payload, a bucket outside its
    allow-list): the caller's fault, so ``ValidationException`` with the agent's message.
    A 429 stays a throttle. Anything else means the agent failed: ``RuntimeClientError``.
    """
    message = agent_message(status, body)
    headers = {SESSION_ID_HEADER: session_id}
    if status == 429:
        code = THROTTLING
    elif 400 <= status < 500:
        return acr_error(
            VALIDATION,
            f"the agent rejected the request (HTTP {status}): {message}",
            request_id=request_id,
            field=agent_field(body) or "payload",
            headers=headers,
        )
    else:
        code = RUNTIME_CLIENT_ERROR
    return acr_error(
        code,
        f"Received error ({status}) from the agent at {url}: {message}",
        request_id=request_id,
        headers=headers,
    )
