"""The AgentCore Runtime data plane as botocore sees it: paths, ARNs and error responses.

The local runtime (:mod:`agentcore_rl.local.runtime`) answers the real ``bedrock-agentcore``
client, so its errors must parse exactly as botocore's REST-JSON parser expects: the HTTP
status of the modelled error, the error code in the ``x-amzn-ErrorType`` header (which the
parser prefers over the body), and a JSON body carrying ``message`` plus the error's other
modelled members (``reason`` and ``fieldList`` for ``ValidationException``).

Example::

    from agentcore_rl.local.runtime_wire import VALIDATION, acr_error

    response = acr_error(VALIDATION, "runtimeSessionId is too short", request_id="r-1")
    response.status_code                      # 400
    response.headers["x-amzn-ErrorType"]      # "ValidationException"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

from starlette.responses import JSONResponse

from agentcore_rl.errors import ConfigurationError

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
    "arn_region",
    "parse_runtime_path",
    "validate_runtime_arn",
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

# arn:<partition>:bedrock-agentcore:<region>:<account>:runtime/<runtime id>
_ARN_PATTERN: Final = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):bedrock-agentcore:(?P<region>[a-z]{2}(-[a-z0-9]+)+):"
    r"(?P<account>\d{12}):runtime/(?P<name>[A-Za-z0-9][A-Za-z0-9_-]{0,99})"
)


def validate_runtime_arn(arn: object) -> str:
    """Return ``arn`` if it is an AgentCore Runtime ARN, else raise ``ConfigurationError``.

    Example::

        validate_runtime_arn("arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/demo")
    """
    if not isinstance(arn, str) or _ARN_PATTERN.fullmatch(arn) is None:
        raise ConfigurationError(
            f"{arn!r} is not an AgentCore Runtime ARN; expected "
            "arn:aws:bedrock-agentcore:<region>:<12-digit account>:runtime/<name>"
        )
    return arn


def arn_region(arn: str) -> str:
    """The region field of an AgentCore Runtime ARN (the client must use this region).

    Example::

        arn_region("arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/demo")  # us-west-2
    """
    match = _ARN_PATTERN.fullmatch(validate_runtime_arn(arn))
    assert match is not None
    return match["region"]


def parse_runtime_path(raw_path: bytes) -> tuple[str, str] | None:
    """Split a raw request path ``/runtimes/{arn}/{operation}`` into ``(arn, operation)``.

    botocore percent-encodes the whole ARN into one segment (``/`` becomes ``%2F``), so the
    raw, undecoded path is split first and the ARN decoded afterwards. A client that sends
    the ARN unencoded still works: everything between ``runtimes`` and the last segment is
    the ARN. ``None`` when the path has no such shape.

    Example::

        parse_runtime_path(b"/runtimes/arn%3Aaws%3A...%3Aruntime%2Fdemo/invocations")
        # ("arn:aws:...:runtime/demo", "invocations")
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

    Example::

        acr_error(THROTTLING, "Rate exceeded", request_id=rid)   # 429
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
