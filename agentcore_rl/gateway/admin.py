"""The gateway's health and admin routes, an ordinary Starlette app (docs/gateway.md, "The
trainer's API"): each a thin call of :class:`~agentcore_rl.gateway.RolloutGateway`'s trainer API,
its errors answered by meaning."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentcore_rl.errors import AlreadyPausedError, TraceLostError
from agentcore_rl.gateway.dialects.chat import error_body
from agentcore_rl.gateway.jsonio import Invalid, parse_object
from agentcore_rl.gateway.upstream import UpstreamError
from agentcore_rl.trace import dump_trace

__all__ = ["GATEWAY_ID_HEADER", "admin_app"]

log = logging.getLogger("agentcore_rl.gateway")

#: The header of ``POST /admin/sessions``'s answer naming the gateway process (its id).
GATEWAY_ID_HEADER: Final = "x-gateway-id"


def _error(status: int, message: str, kind: str) -> Response:
    return Response(error_body(status, message, kind), status, media_type="application/json")


def admin_app(gateway: Any) -> Starlette:
    """The health and admin routes of ``gateway``, a :class:`~agentcore_rl.gateway.RolloutGateway`
    (typed loosely: the gateway imports this module). Every ``/admin/`` route needs the admin
    token in a header (``Authorization: Bearer`` or ``X-Admin-Token``; never in the URL, which
    access logs write down). Errors answer by their meaning; any other exception is a bug of
    the gateway's: a 500, logged."""

    # A guarded handler gets the request and its JSON body ({} when empty); a dict it returns
    # is answered as JSON.
    def guarded(handler: Callable[[Request, dict[str, Any]], Any]) -> Callable[[Request], Any]:
        async def check(request: Request) -> Response:
            expected = gateway.admin_token
            if not expected:
                message = "admin routes are disabled: start the gateway with an admin token"
                return _error(403, message, "forbidden")
            if "token" in request.query_params:
                why = "the admin token goes in a header (X-Admin-Token or Authorization: Bearer)"
                return _error(400, f"{why}, never in the URL", "token_in_url")
            given = request.headers.get("x-admin-token") or ""
            auth = request.headers.get("authorization", "")
            if not given and auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return _error(401, "missing or wrong admin token", "unauthorized")
            try:
                raw = await request.body()
                answer = await handler(request, parse_object(raw) if raw else {})
            except TraceLostError as exc:  # finishing answers 410, a peek 404
                if request.method == "POST":
                    return _error(410, str(exc), "trace_lost")
                return _error(404, str(exc), "unknown_session")
            except Invalid as exc:  # the door (jsonio) and the trainer API's checks
                return _error(400, str(exc), "invalid_request")
            except AlreadyPausedError as exc:
                return _error(409, str(exc), "already_paused")
            except UpstreamError as exc:  # an upstream that cannot freeze its generations
                return _error(502, str(exc), "upstream_unavailable")
            except Exception:
                log.exception("admin route %s %s failed", request.method, request.url.path)
                return _error(500, "the gateway failed on this request (see its log)", "internal")
            return answer if isinstance(answer, Response) else JSONResponse(answer)

        return check

    async def health(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok" if gateway.running else "stopped",
                "gateway_id": gateway.gateway_id,
                "policy_version": gateway.policy_version,
                "paused": gateway.gate.paused,
            }
        )

    async def open_session(request: Request, data: dict[str, Any]) -> Response:
        gateway.open_session(
            data.get("session_id", ""),  # checked there
            exp_id=data.get("exp_id"),
            input_id=data.get("input_id"),
            sampling=data.get("sampling"),
        )
        # Which gateway process holds the session: a client compares it with the trace's.
        return Response(status_code=204, headers={GATEWAY_ID_HEADER: gateway.gateway_id})

    async def finish(request: Request, data: dict[str, Any]) -> Any:
        trace = await gateway.finish_session(request.path_params["sid"])
        if request.query_params.get("format") == "json":
            return trace.to_json()
        return Response(dump_trace(trace), media_type="application/gzip")

    async def peek(request: Request, data: dict[str, Any]) -> Any:
        return gateway.peek_session(request.path_params["sid"]).to_json()

    async def policy_version(request: Request, data: dict[str, Any]) -> Any:
        gateway.set_policy_version(data.get("version"))
        return {"policy_version": gateway.policy_version}

    async def pause(request: Request, data: dict[str, Any]) -> Any:
        await gateway.pause(data.get("mode", "hold"))
        return {"paused": gateway.gate.paused, "in_flight": gateway.gate.in_flight}

    async def resume(request: Request, data: dict[str, Any]) -> Any:
        await gateway.resume()
        return {"paused": None}

    async def stats(request: Request, data: dict[str, Any]) -> Any:
        return gateway.stats

    return Starlette(
        lifespan=gateway._lifespan,
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/admin/sessions", guarded(open_session), methods=["POST"]),
            Route("/admin/sessions/{sid}/finish", guarded(finish), methods=["POST"]),
            Route("/admin/sessions/{sid}/trace", guarded(peek), methods=["GET"]),
            Route("/admin/policy_version", guarded(policy_version), methods=["POST"]),
            Route("/admin/pause", guarded(pause), methods=["POST"]),
            Route("/admin/resume", guarded(resume), methods=["POST"]),
            Route("/admin/stats", guarded(stats), methods=["GET"]),
        ],
    )
