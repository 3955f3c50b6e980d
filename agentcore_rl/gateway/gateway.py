"""``RolloutGateway``: admits each model call (session, policy gate, record) and hands it to
a mode (:mod:`.call`). The session routes are hand-written ASGI (they sit on every model call);
the admin routes are an ordinary Starlette app (:mod:`.admin`)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio
from starlette.types import Receive, Scope, Send

from agentcore_rl.edge import Refusal, read_body
from agentcore_rl.errors import ConfigurationError, TraceLostError
from agentcore_rl.gateway.admin import GATEWAY_ID_HEADER, admin_app
from agentcore_rl.gateway.backends import backend_named
from agentcore_rl.gateway.call import Call, down_message, render, respond
from agentcore_rl.gateway.dialects import PATHS, route_for
from agentcore_rl.gateway.dialects.chat import CHAT_DIALECT
from agentcore_rl.gateway.dialects.codec import Dialect
from agentcore_rl.gateway.dialects.codec import Route as DialectRoute
from agentcore_rl.gateway.jsonio import Invalid, check_value, check_version, dumps, parse_object
from agentcore_rl.gateway.policy_gate import PauseMode, PolicyGate, Versions
from agentcore_rl.gateway.proxy import ProxyMode
from agentcore_rl.gateway.record import CallRecord, Session, SessionTrace, TraceSink
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool, checked_url

if TYPE_CHECKING:
    from agentcore_rl.gateway.render.mode import RenderMode

__all__ = ["ADMIN_TOKEN_ENV", "DEFAULT_SESSION_TTL", "GATEWAY_ID_HEADER", "RolloutGateway"]

log = logging.getLogger("agentcore_rl.gateway")

#: Environment variable read for the admin token when none is passed.
ADMIN_TOKEN_ENV: Final = "AGENTCORE_RL_GATEWAY_ADMIN_TOKEN"
#: AgentCore Runtime's longest session (8 hours): a session idle this long has ended.
DEFAULT_SESSION_TTL: Final = 8 * 3600.0
_SESSION_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")


def _check_session_id(sid: object) -> None:
    if not isinstance(sid, str) or not _SESSION_ID_RE.fullmatch(sid):
        raise Invalid(
            f"malformed session id {str(sid)[:80]!r}: expected 1-256 characters of letters, "
            "digits and . _ : - (starting with a letter or digit)"
        )


class RolloutGateway:
    """The token-capturing gateway as an ASGI app and an async context manager.

    The options are the ``agentcore-rl gateway`` command's (docs/gateway.md); ``render``: a
    :class:`~agentcore_rl.gateway.render.mode.RenderMode` serves chat calls with linear
    history. Served by uvicorn its lifespan enters it; mounted, enter it yourself.

    Example::

        gateway = RolloutGateway(["http://gpu1:8000/v1", "http://gpu2:8000/v1"], model="qwen")
        async with gateway:
            gateway.set_policy_version(3)
            async with gateway.paused():
                ...                           # swap weights: no call is running
    """

    def __init__(
        self,
        upstreams: str | Sequence[str],
        *,
        backend: str = "vllm",
        model: str | None = None,
        admin_token: str | None = None,
        session_ttl: float = DEFAULT_SESSION_TTL,
        sink: TraceSink | None = None,
        require_open: bool = False,
        max_body_bytes: int = 32 * 1024 * 1024,
        body_timeout: float = 60.0,
        finish_wait: float = 30.0,
        retry_after: float = 1.0,
        render: RenderMode | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        urls = [upstreams] if isinstance(upstreams, str) else list(upstreams)
        if not urls:
            raise ConfigurationError("at least one upstream URL is needed")
        if session_ttl <= 0:
            raise ConfigurationError(f"session_ttl must be > 0 seconds, got {session_ttl}")
        if not body_timeout > 0:
            raise ConfigurationError(f"body_timeout must be > 0 seconds, got {body_timeout}")
        self.upstreams = [checked_url(u.rstrip("/")) for u in urls]
        self.backend = backend_named(backend)
        self.proxy = ProxyMode(self.backend)  # every call that ``render`` does not serve
        self.render = render
        self.model = model
        self.admin_token = admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None
        self.session_ttl = session_ttl
        self.sink = sink
        self.require_open = require_open
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.finish_wait = finish_wait
        self.gateway_id = uuid.uuid4().hex
        self.gate = PolicyGate()
        self.retry_after = retry_after
        # straddled_calls: a weight update came in the middle of the call
        # late_calls: an agent's calls for a session already finished or expired, refused
        counters = ["calls", "failed_calls", "late_calls", "sessions_finished", "sessions_expired"]
        self._counts = dict.fromkeys([*counters, "expired_lost", "straddled_calls"], 0)
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        # Ended sessions (finished or expired) -> when, oldest first: closed to agents' calls
        # for the session TTL, then forgotten by the sweeper.
        self._ended: dict[str, float] = {}
        self._upstreams: list[UpstreamPool] = []  # while entered
        self._stack: contextlib.AsyncExitStack | None = None
        self._admin = admin_app(self)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> RolloutGateway:
        if self._stack is not None:
            raise RuntimeError("the gateway is already running")
        async with contextlib.AsyncExitStack() as stack:
            self._upstreams = [UpstreamPool(url) for url in self.upstreams]
            for pool in self._upstreams:
                stack.push_async_callback(pool.aclose)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)  # runs first: stops the sweeper
            tg.start_soon(self._sweep_forever)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        self._upstreams = []

    @property
    def running(self) -> bool:
        """Whether the gateway is entered (serving calls)."""
        return self._stack is not None

    async def _sweep_forever(self) -> None:
        while True:
            await anyio.sleep(min(60.0, self.session_ttl / 4))
            await self.expire_idle()

    # ------------------------------------------------------------------ trainer API
    @property
    def policy_version(self) -> int:
        """The version stamped on calls that start now."""
        return self.gate.version

    def set_policy_version(self, version: int) -> None:
        """Stamp calls that start from now on with ``version``."""
        self.gate.version = check_version(version)

    @contextlib.asynccontextmanager
    async def paused(self, mode: PauseMode = "hold") -> AsyncIterator[None]:
        """Pause for a weight update; the block is where the weights may be pushed (``hold``,
        ``reject``, ``suspend``: docs/gateway.md, "Weight-sync recipe").

        Example::

            async with gateway.paused("suspend"):
                await trainer.push_weights()
                gateway.set_policy_version(step)
        """
        await self.pause(mode)
        try:
            yield
        finally:
            await self.resume()

    async def pause(self, mode: PauseMode = "hold") -> None:
        """The start of :meth:`paused` (for a trainer that pauses over HTTP or in steps)."""
        await self.gate.pause(mode)
        if mode != "suspend":
            return
        try:
            await self._drive("/pause?mode=keep")
            for pool in self._upstreams:  # token-in calls: cut there, continued after the resume
                running = self.gate.token_in.get(pool.base)
                if running:
                    await self._drive("/abort_requests", {"request_ids": sorted(running)}, [pool])
        except BaseException:
            await self.resume()
            raise

    async def resume(self) -> None:
        """The end of :meth:`paused`: calls flow again (after a suspend, the upstreams are
        told the new version through ``/update_weight_version``, then resume)."""
        if self.gate.paused != "suspend":
            self.gate.resume()
            return
        version = {"new_version": self.gate.label()}
        with anyio.CancelScope(shield=True):  # a cancelled trainer must not leave vLLM paused
            try:
                await self._drive("/update_weight_version", version)
            finally:
                self.gate.resume()  # the tokens from here on are the new version's
                await self._drive("/resume")

    async def _drive(
        self, path: str, body: dict[str, Any] | None = None, pools: list[UpstreamPool] | None = None
    ) -> None:
        """A control call to each upstream's root (vLLM's ``VLLM_SERVER_DEV_MODE`` routes)."""
        for pool in self._upstreams if pools is None else pools:
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

    def open_session(
        self,
        session_id: str,
        *,
        exp_id: str | None = None,
        input_id: str | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> None:
        """Register a session before its agent calls (ids for the records, sampling overrides).

        Example::

            gateway.open_session(sid, exp_id="e1", input_id="q7", sampling={"temperature": 1.0})
        """
        _check_session_id(session_id)
        for name, value in (("exp_id", exp_id), ("input_id", input_id)):
            if value is not None and not isinstance(value, str):
                raise Invalid(f"{name} must be a string, got {type(value).__name__}")
        check_value([exp_id, input_id], "exp_id and input_id")
        if sampling is not None and not isinstance(sampling, Mapping):
            raise Invalid("sampling must be an object")
        check_value(dict(sampling or {}), "sampling")
        self._ended.pop(session_id, None)  # the trainer's own: a fresh record set
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = Session(session_id, last_seen=self._clock())
        session.exp_id, session.input_id = exp_id, input_id
        session.sampling = dict(sampling) if sampling else None
        for record in session.records:  # calls that raced ahead of the registration
            record.exp_id, record.input_id = exp_id, input_id

    def peek_session(self, session_id: str) -> SessionTrace:
        """The records of a live session so far, without finishing it."""
        session = self._sessions.get(session_id)
        if session is None:
            raise TraceLostError(session_id, "this gateway has no live session by that id")
        return session.trace(self.gateway_id, complete=False)

    async def finish_session(self, session_id: str) -> SessionTrace:
        """Release a session and return its trace (waiting, bounded, for calls in flight).

        Raises :class:`TraceLostError` when the gateway has no record of the session (it
        restarted, or the session expired with no sink to keep it).

        Example::

            trace = await gateway.finish_session(sid)
        """
        session = self._sessions.get(session_id)
        if session is None:
            if self.sink is not None and _SESSION_ID_RE.fullmatch(session_id):
                saved = await self.sink.load(session_id)
                if saved is not None:
                    return saved
            if session_id in self._ended:
                why = "it ended already (finished: its trace was handed out, or expired)"
                raise TraceLostError(session_id, why)
            raise TraceLostError(
                session_id,
                f"gateway {self.gateway_id} has no record of it (it restarted, the session "
                "expired, or the agent's calls never reached this gateway)",
            )
        if session.in_flight:
            session.idle = anyio.Event()
            with anyio.move_on_after(self.finish_wait):
                await session.idle.wait()
            if session.in_flight:
                log.warning(
                    "session %s finished with %d call(s) still running; their records "
                    "will be missing",
                    session_id,
                    session.in_flight,
                )
        self._end(session_id)
        self._counts["sessions_finished"] += 1
        return session.trace(self.gateway_id)

    async def expire_idle(self) -> int:
        """Persist and release sessions idle for longer than the TTL, forget sessions ended
        longer ago than that; -> how many sessions expired."""
        now = self._clock()
        forgotten = list(
            itertools.takewhile(lambda e: now - e[1] > self.session_ttl, self._ended.items())
        )
        for sid, _ in forgotten:
            del self._ended[sid]
        stale = [
            s
            for s in self._sessions.values()
            if s.in_flight == 0 and now - s.last_seen > self.session_ttl
        ]
        for session in stale:
            trace = session.trace(self.gateway_id, complete=False)
            if self.sink is None:
                self._counts["expired_lost"] += 1
                log.warning(
                    "session %s expired after %.0fs idle with %d record(s) and no sink: "
                    "its trace is dropped (configure a sink to keep it)",
                    session.session_id,
                    self.session_ttl,
                    len(session.records),
                )
            else:
                try:
                    await self.sink.save(trace)
                except Exception:
                    log.exception("could not persist expired session %s", session.session_id)
                    continue  # kept in memory; the next sweep tries again
            self._end(session.session_id)
            self._counts["sessions_expired"] += 1
        return len(stale)

    def _end(self, sid: str) -> None:
        self._sessions.pop(sid, None)
        self._ended[sid] = self._clock()

    def _session_for(self, sid: str) -> Session:
        """The session an agent's admitted call is filed under: opened by its first call,
        refused once finished or expired (a late call: a retry, a stopped agent's next turn)."""
        session = self._sessions.get(sid)
        if session is not None:
            return session
        if sid in self._ended:
            self._counts["late_calls"] += 1
            why = f"session {sid!r} is finished (or expired): the call is not served"
            raise Refusal(410, why, "session_finished")
        if self.require_open:
            raise Refusal(
                404, f"unknown session {sid!r}: not opened by the client", "unknown_session"
            )
        self._sessions[sid] = Session(sid)
        return self._sessions[sid]

    @property
    def stats(self) -> dict[str, Any]:
        """What ``GET /admin/stats`` answers: the counters, live sessions, calls in flight."""
        live: dict[str, Any] = {
            "live_sessions": len(self._sessions),
            "in_flight": self.gate.in_flight,
        }
        if self.render is not None:  # requests that did not extend their history
            live["linear_forks"] = self.render.forks
            live["linear_versions"] = dict(self.render.backend.sources)
        return {**self._counts, **live, "policy_version": self.gate.version}

    @staticmethod
    def session_base_url(gateway_url: str, session_id: str) -> str:
        """The OpenAI ``base_url`` an agent uses for ``session_id`` (``.../sessions/{sid}/v1``)."""
        return f"{gateway_url.rstrip('/')}/sessions/{session_id}/v1"

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan: the admin app's
            await self._admin(scope, receive, send)
            return
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        sid: str | None
        if path.startswith("/sessions/"):
            sid, _, rest = path[len("/sessions/") :].partition("/")
        elif path.startswith("/v1/"):
            sid, rest = None, path[1:]
        else:
            await self._admin(scope, receive, send)
            return
        route = route_for(rest)
        dialect: Dialect = CHAT_DIALECT if route is None else route.dialect
        try:
            sid = self._bearer_session(scope) if sid is None else sid
            _check_session_id(sid)
            if route is not None:
                await self._agent_call(scope, receive, send, sid, route)
            elif rest == "v1/models" and scope["method"] == "GET":
                await self._models(send, sid)
            else:
                routes = ", ".join([*PATHS, "v1/models"])
                raise Refusal(404, f"no route {path} (sessions/{{id}}/: {routes})", "not_found")
        except Invalid as exc:  # the session id or the body (jsonio: the door)
            body, headers = render(Refusal(400, str(exc), "invalid_request"), dialect)
            await respond(send, 400, body, headers)
        except Refusal as refuse:
            body, headers = render(refuse, dialect)
            await respond(send, refuse.status, body, headers)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: object) -> AsyncIterator[None]:
        if self.running:  # entered already (``async with gateway``): theirs to close
            yield
            return
        async with self:
            yield

    @staticmethod
    def _bearer_session(scope: Scope) -> str:
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

    async def _models(self, send: Send, sid: str) -> None:
        pool = self._upstream_for(sid)
        try:
            status, content = await pool.fetch(pool.target("/models", "GET"), None)
        except UpstreamError as exc:
            raise Refusal(502, down_message(pool.base, exc), "upstream_unavailable") from None
        await respond(send, status, content)

    async def _agent_call(
        self, scope: Scope, receive: Receive, send: Send, sid: str, route: DialectRoute
    ) -> None:
        if not self.running:
            raise Refusal(503, "the gateway is not started (enter it or serve it)", "not_ready")
        if scope["method"] != "POST":
            raise Refusal(405, f"{scope['path']} takes POST", "method_not_allowed")
        raw = await read_body(
            receive, scope["headers"], limit=self.max_body_bytes, within=self.body_timeout
        )
        body = parse_object(raw)
        chat = route.dialect.decode(body, route, self._sessions.get(sid))
        version = await self.gate.enter()
        if version is None:  # a reject pause
            retry = {"retry-after": str(max(1, round(self.retry_after)))}
            why = f"the gateway is paused for a weight update; retry in {self.retry_after}s"
            raise Refusal(429, why, "paused", retry)
        try:  # after the gate: a 429 opens no session, a call held across a finish is refused
            await self._serve(send, self._session_for(sid), route.dialect, raw, body, chat, version)
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
        pool = self._upstream_for(session.session_id)
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
            self._counts["calls"] += 1
            self._counts["straddled_calls"] += record.straddled
            self._counts["failed_calls"] += not record.ok
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

    def _upstream_for(self, sid: str) -> UpstreamPool:
        return self._upstreams[zlib.crc32(sid.encode()) % len(self._upstreams)]
