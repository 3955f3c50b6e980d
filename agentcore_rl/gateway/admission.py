"""Admitting an agent's model call: its session id, its body within the limits, decoded by its
dialect, through the policy gate, filed under its session with a record begun, then handed to
a mode (:mod:`.call`)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from agentcore_rl.edge import Refusal, read_body
from agentcore_rl.gateway.call import Call, down_message, respond
from agentcore_rl.gateway.dialects.codec import Dialect, Route
from agentcore_rl.gateway.jsonio import dumps, parse_object
from agentcore_rl.gateway.policy_gate import PolicyGate, Versions
from agentcore_rl.gateway.proxy import ProxyMode
from agentcore_rl.gateway.sessions import GatewayOptions, Session, Sessions
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool
from agentcore_rl.trace import CallRecord

if TYPE_CHECKING:
    from agentcore_rl.gateway.render.mode import RenderMode

__all__ = ["Admission", "bearer_session"]


def bearer_session(scope: Scope) -> str:
    """The session id an agent sends as its API key (OpenAI's bearer, Anthropic's
    ``x-api-key``)."""
    for name, value in scope["headers"]:
        header: str = value.decode("latin-1")
        if name == b"authorization":
            scheme, _, token = header.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and header.strip():
            return header.strip()
    raise Refusal(
        401,
        "no session id: call /sessions/{session_id}/v1/... or send "
        "'Authorization: Bearer <session id>'",
        "missing_session_id",
    )


class Admission:
    """The agents' side of the gateway: each call admitted (or refused) and served by its
    mode (``render`` for chat when set, else ``proxy``) on its session's upstream; ``pools``
    while the gateway is entered."""

    def __init__(
        self,
        options: GatewayOptions,
        sessions: Sessions,
        gate: PolicyGate,
        modes: tuple[ProxyMode, RenderMode | None],
        model: str | None,
        clock: Callable[[], float],
    ) -> None:
        self.options, self.sessions, self.gate = options, sessions, gate
        self.proxy, self.render = modes
        self.model, self._clock = model, clock
        self.pools: list[UpstreamPool] = []
        # straddled_calls: a weight update came in the middle of the call
        self.counts = dict.fromkeys(("calls", "failed_calls", "straddled_calls"), 0)

    def pool_for(self, sid: str) -> UpstreamPool:
        """A session's upstream: a hash of its id (its prefix cache is reused turn after turn)."""
        return self.pools[zlib.crc32(sid.encode()) % len(self.pools)]

    async def drive(
        self, path: str, body: dict[str, Any] | None = None, pools: list[UpstreamPool] | None = None
    ) -> None:
        """A control call to each upstream's root (vLLM's ``VLLM_SERVER_DEV_MODE`` routes)."""
        for pool in self.pools if pools is None else pools:
            try:
                status, content = await pool.fetch(
                    pool.target(path, root=True), None if body is None else dumps(body)
                )
            except UpstreamError as exc:
                raise UpstreamError(down_message(pool.base, exc)) from None
            if status != 200:
                raise UpstreamError(
                    f"{pool.base} answered {path} with HTTP {status} "
                    f"({content[:200].decode('utf-8', 'replace')}); a suspend needs vLLM >= 0.32 "
                    "started with VLLM_SERVER_DEV_MODE=1 (or pause with mode hold)"
                )

    async def models(self, send: Send, sid: str) -> None:
        pool = self.pool_for(sid)
        try:
            status, content = await pool.fetch(pool.target("/models", "GET"), None)
        except UpstreamError as exc:
            raise Refusal(502, down_message(pool.base, exc), "upstream_unavailable") from None
        await respond(send, status, content)

    async def call(
        self, scope: Scope, receive: Receive, send: Send, sid: str, route: Route
    ) -> None:
        if not self.pools:
            raise Refusal(503, "the gateway is not started (enter it or serve it)", "not_ready")
        if scope["method"] != "POST":
            raise Refusal(405, f"{scope['path']} takes POST", "method_not_allowed")
        options = self.options
        raw = await read_body(
            receive, scope["headers"], limit=options.max_body_bytes, within=options.body_timeout
        )
        body = parse_object(raw)
        chat = route.dialect.decode(body, route, self.sessions.live.get(sid))
        version = await self.gate.enter()
        if version is None:  # a reject pause
            retry = {"retry-after": str(max(1, round(options.retry_after)))}
            why = f"the gateway is paused for a weight update; retry in {options.retry_after}s"
            raise Refusal(429, why, "paused", retry)
        try:  # after the gate: a 429 opens no session, a call held across a finish is refused
            await self._serve(
                send, self.sessions.admit(sid), route.dialect, raw, body, chat, version
            )
        finally:
            self.gate.exit()

    async def _serve(
        self,
        send: Send,
        session: Session,
        dialect: Dialect,
        raw: bytes,
        body: dict[str, Any],
        chat: dict[str, Any],
        version: int,
    ) -> None:
        """Begin the record, hand the call to its mode, commit it if the mode did not. The
        record keeps the request as chat (``raw`` for a chat agent), the dialect named."""
        start = self._clock()
        request = raw if chat is body else dumps(chat)
        overrides = dict(session.sampling or {})
        if self.model:
            overrides["model"] = self.model
        chat.update(overrides)
        pool = self.pool_for(session.session_id)
        record = CallRecord(
            session_id=session.session_id,
            index=session.call_started(start),
            endpoint=dialect.name,
            exp_id=session.exp_id,
            input_id=session.input_id,
            policy_version_start=version,
            request_body=request,
            overrides=overrides or None,
            started_at=time.time(),
            stream=bool(chat.get("stream")),
            upstream=pool.base,
        )

        def on_commit(call: Call) -> None:
            record.policy_version_end = self.gate.version
            record.latency_s = self._clock() - start
            self.counts["calls"] += 1
            self.counts["straddled_calls"] += record.straddled
            self.counts["failed_calls"] += not record.ok
            session.call_ended(record, self._clock())

        encoder = dialect.encoder(body, chat, session)
        call = Call(
            *(session, dialect, encoder, raw, chat, record, pool, on_commit),
            gate=self.gate,
            versions=Versions(version, self.gate.resumes),
        )
        render = self.render if not dialect.text else None
        mode: RenderMode | ProxyMode = render or self.proxy
        try:
            await mode.serve(call, send)
        except Refusal as refuse:
            call.commit(refuse.status, refuse.message)
            raise
        except UpstreamError as exc:
            if call.committed:
                raise
            message = down_message(pool.base, exc)
            call.commit(502, message)
            raise Refusal(502, message, "upstream_unavailable") from None
        except BaseException as exc:
            call.commit(499, f"call abandoned: {type(exc).__name__}: {exc}")
            raise
