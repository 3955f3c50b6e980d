"""The gateway's admin routes (a Starlette app), for a trainer talking to a remote gateway.

Every ``/admin/...`` route needs the admin token (``Authorization: Bearer <token>``,
``X-Admin-Token: <token>`` or ``?token=<token>``); without a configured token they answer
403. Session ids never reach here: the proxy routes only serve ``/sessions/{sid}/v1/...``
and ``/v1/...``.

- ``GET  /health`` -> ``{"status": "ok", "gateway_id", "policy_version", "paused"}`` (no token)
- ``POST /admin/sessions`` ``{"session_id", "exp_id", "input_id", "sampling"}`` -> 204,
  with the gateway's id in the ``x-gateway-id`` header
- ``POST /admin/sessions/{sid}/finish`` -> the trace, gzip JSON (``application/gzip``), or
  JSON with ``?format=json``; 410 ``{"error": {"type": "trace_lost"}}`` when it is lost
- ``GET  /admin/sessions/{sid}/trace`` -> the live session's records so far (JSON)
- ``POST /admin/policy_version`` ``{"version": 8}``
- ``POST /admin/pause`` ``{"mode": "hold"|"reject"|"suspend"}`` -> returns when the weights
  may be pushed (in-flight calls drained, or, ``suspend``, frozen at the upstream)
- ``POST /admin/resume``
- ``GET  /admin/stats``
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentcore_rl.errors import TraceLostError
from agentcore_rl.gateway.jsonio import parse_object
from agentcore_rl.gateway.policy_gate import PauseMode, PolicyGate
from agentcore_rl.gateway.record import SessionTrace, dump_trace
from agentcore_rl.gateway.upstream import UpstreamError

__all__ = ["GATEWAY_ID_HEADER", "AdminTarget", "admin_app"]

#: The header of ``POST /admin/sessions``'s answer naming the gateway process (its id).
GATEWAY_ID_HEADER: Final = "x-gateway-id"

Handler = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


class AdminTarget(Protocol):
    """What the admin routes use of a gateway (:class:`~agentcore_rl.gateway.RolloutGateway`
    has it all); a protocol, so that this module does not import the gateway's."""

    admin_token: str | None
    gateway_id: str
    gate: PolicyGate
    stats: dict[str, int]

    @property
    def running(self) -> bool: ...

    @property
    def policy_version(self) -> int: ...

    @property
    def live_sessions(self) -> int: ...

    def set_policy_version(self, version: int) -> None: ...

    async def pause(self, mode: PauseMode = "hold") -> None: ...

    async def resume(self) -> None: ...

    def open_session(
        self,
        session_id: str,
        *,
        exp_id: str | None = None,
        input_id: str | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> None: ...

    def peek_session(self, session_id: str) -> SessionTrace: ...

    async def finish_session(self, session_id: str) -> SessionTrace: ...


def admin_app(gateway: AdminTarget) -> Starlette:
    """The admin routes of ``gateway`` (see the module doc)."""

    def guarded(handler: Handler) -> Handler:
        async def check(request: Request) -> Response:
            expected = gateway.admin_token
            if not expected:
                return _error(
                    403,
                    "admin routes are disabled: start the gateway with an admin token",
                    "forbidden",
                )
            given = request.headers.get("x-admin-token") or request.query_params.get("token") or ""
            auth = request.headers.get("authorization", "")
            if not given and auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return _error(401, "missing or wrong admin token", "unauthorized")
            return await handler(request)

        return check

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        return parse_object(raw) if raw else {}  # the agent routes' door (jsonio)

    async def health(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok" if gateway.running else "stopped",
                "gateway_id": gateway.gateway_id,
                "policy_version": gateway.policy_version,
                "paused": gateway.gate.paused,
            }
        )

    async def open_session(request: Request) -> Response:
        try:
            data = await body_of(request)
            sid = data.get("session_id")
            sampling = data.get("sampling")
            if not isinstance(sid, str):
                raise ValueError("session_id (a string) is required")
            gateway.open_session(
                sid, exp_id=data.get("exp_id"), input_id=data.get("input_id"), sampling=sampling
            )
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request")
        # Which gateway process holds the session: a client compares it with the trace's.
        return Response(status_code=204, headers={GATEWAY_ID_HEADER: gateway.gateway_id})

    async def finish(request: Request) -> Response:
        sid = request.path_params["sid"]
        try:
            trace = await gateway.finish_session(sid)
        except TraceLostError as exc:
            return _error(410, str(exc), "trace_lost")
        if request.query_params.get("format") == "json":
            return JSONResponse(trace.to_json())
        return Response(dump_trace(trace), media_type="application/gzip")

    async def peek(request: Request) -> Response:
        try:
            trace = gateway.peek_session(request.path_params["sid"])
        except TraceLostError as exc:
            return _error(404, str(exc), "unknown_session")
        return JSONResponse(trace.to_json())

    async def policy_version(request: Request) -> Response:
        try:
            version = (await body_of(request)).get("version")
            gateway.set_policy_version(version)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc), "invalid_request")
        return JSONResponse({"policy_version": gateway.policy_version})

    async def pause(request: Request) -> Response:
        try:
            mode = (await body_of(request)).get("mode", "hold")
            await gateway.pause(mode)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request")
        except RuntimeError as exc:
            return _error(409, str(exc), "already_paused")
        except UpstreamError as exc:  # an upstream that cannot freeze its generations
            return _error(502, str(exc), "upstream_unavailable")
        return JSONResponse({"paused": mode, "in_flight": gateway.gate.in_flight})

    async def resume(request: Request) -> Response:
        try:
            await gateway.resume()
        except UpstreamError as exc:
            return _error(502, str(exc), "upstream_unavailable")
        return JSONResponse({"paused": None})

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                **gateway.stats,
                "live_sessions": gateway.live_sessions,
                "in_flight": gateway.gate.in_flight,
                "policy_version": gateway.policy_version,
            }
        )

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/admin/sessions", guarded(open_session), methods=["POST"]),
            Route("/admin/sessions/{sid}/finish", guarded(finish), methods=["POST"]),
            Route("/admin/sessions/{sid}/trace", guarded(peek), methods=["GET"]),
            Route("/admin/policy_version", guarded(policy_version), methods=["POST"]),
            Route("/admin/pause", guarded(pause), methods=["POST"]),
            Route("/admin/resume", guarded(resume), methods=["POST"]),
            Route("/admin/stats", guarded(stats), methods=["GET"]),
        ]
    )
