"""The HTTP edge the four servers share (the agent server, the gateway, the local runtime, the
stand-in policy): a request body read within a byte limit, a time limit and a budget of bytes in
flight, and :class:`Refusal`, the one answer-other-than-success a server decides at its edge.
Each server renders a refusal in its callers' error shape (its own JSON, OpenAI's, Anthropic's,
AWS's); a refusal never leaves the server that raised it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import anyio

__all__ = ["BodyBudget", "Refusal", "read_body"]


class Refusal(Exception):
    """Answer ``status`` with ``message``: ``kind`` is a machine-readable word (an AWS error
    code at the runtime), ``field`` the request field at fault, ``headers`` extra answer
    headers, ``passed_on`` another server's own answer body to relay as it is.

    Example::

        raise Refusal(413, "request body is larger than 1024 bytes", "request_too_large")
    """

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request",
        headers: Mapping[str, str] | None = None,
        *,
        field: str | None = None,
        passed_on: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.headers = dict(headers or {})
        self.field, self.passed_on = field, passed_on


class BodyBudget:
    """Request-body bytes held by all requests being received (one event loop, no lock);
    a body that does not fit is refused with 503 and ``Retry-After``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def reserve(self, size: int) -> None:
        if self.in_flight + size > self.limit:
            raise Refusal(
                503,
                f"the server holds {self.in_flight} bytes of request bodies and this one does "
                f"not fit its budget of {self.limit} bytes (max_inflight_body_bytes); retry "
                "shortly",
                "overloaded",
                {"retry-after": "1"},
            )
        self.in_flight += size

    def release(self, size: int) -> None:
        self.in_flight = max(0, self.in_flight - size)


def _declared(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit():
                shown = value[:40].decode("latin-1")
                raise Refusal(400, f"Content-Length {shown!r} is not a number", field="payload")
            return int(value)
    return None


async def read_body(
    receive: Any,
    headers: Iterable[tuple[bytes, bytes]],
    *,
    limit: int,
    within: float | None = None,
    budget: BodyBudget | None = None,
    field: str | None = None,
    setting: str = "max_body_bytes",
) -> bytes:
    """The body from an ASGI ``receive``: 413 past ``limit`` bytes (a declared length before
    reading; ``setting`` names the limit's knob), 408 when not all there within ``within``
    seconds, 400 when the client leaves; with a ``budget``, the bytes are held in it until the
    caller releases ``len(body)``.

    Example::

        body = await read_body(receive, scope["headers"], limit=1 << 20, within=60.0)
    """

    def too_large(detail: str) -> Refusal:
        why = f"request body {detail}; the limit is {limit} bytes ({setting})"
        return Refusal(413, why, "request_too_large", field=field)

    declared = _declared(headers)
    if declared is not None and declared > limit:
        raise too_large(f"is {declared} bytes")
    reserved = 0
    if budget is not None and declared:
        budget.reserve(declared)
        reserved = declared
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(within) if within is not None else contextlib.nullcontext():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    why = "the client disconnected before sending its body"
                    raise Refusal(400, why, "client_disconnected")
                chunk = message.get("body", b"")
                if size + len(chunk) > limit:
                    raise too_large(f"exceeds {size} + {len(chunk)} bytes")
                size += len(chunk)
                if budget is not None and size > reserved:
                    budget.reserve(size - reserved)
                    reserved = size
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        why = f"request body not received within {within:g} seconds"
        if budget is not None:
            budget.release(reserved)
        raise Refusal(408, why, "request_timeout") from None
    except BaseException:
        if budget is not None:
            budget.release(reserved)
        raise
    if budget is not None:
        budget.release(reserved - size)  # shorter than declared
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
