"""``RolloutGateway``: the token-capturing gateway as an ASGI app and an async context manager.
Agents' calls are admitted by :mod:`.admission` and filed in :mod:`.sessions`; the session
routes are hand-written ASGI (they sit on every model call), the admin routes an ordinary
Starlette app (:mod:`.admin`)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio
from starlette.types import Receive, Scope, Send

from agentcore_rl.edge import Refusal
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.gateway.admin import GATEWAY_ID_HEADER, admin_app
from agentcore_rl.gateway.admission import Admission, bearer_session
from agentcore_rl.gateway.backends import backend_named
from agentcore_rl.gateway.call import render, respond
from agentcore_rl.gateway.dialects import PATHS, route_for
from agentcore_rl.gateway.dialects.chat import CHAT_DIALECT
from agentcore_rl.gateway.jsonio import Invalid, check_version
from agentcore_rl.gateway.policy_gate import PauseMode, PolicyGate
from agentcore_rl.gateway.proxy import ProxyMode
from agentcore_rl.gateway.sessions import GatewayOptions, Sessions, TraceSink, check_session_id
from agentcore_rl.gateway.upstream import UpstreamPool, checked_url
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.trace import SessionTrace

if TYPE_CHECKING:
    from agentcore_rl.gateway.render.mode import RenderMode

__all__ = ["ADMIN_TOKEN_ENV", "GATEWAY_ID_HEADER", "MOVED_KEYWORDS", "RolloutGateway"]

#: The environment variable the ``agentcore-rl gateway`` command reads for the admin token.
ADMIN_TOKEN_ENV: Final = "AGENTCORE_RL_GATEWAY_ADMIN_TOKEN"
#: Where the limits the constructor took as keywords live now (named by the TypeError).
MOVED_KEYWORDS: Final = {
    name: f"options=GatewayOptions({name}=...)" for name in GatewayOptions.__dataclass_fields__
}
_DEFAULTS: Final = GatewayOptions()


class RolloutGateway:
    """The token-capturing gateway as an ASGI app and an async context manager.

    The options are the ``agentcore-rl gateway`` command's (docs/gateway.md): ``upstreams``
    (OpenAI base URLs), ``backend`` (``vllm`` or ``sglang``), ``model`` (pinned upstream),
    ``admin_token`` (None: the admin routes answer 403), ``sink`` (where expired sessions'
    traces go), ``render`` (a :class:`~agentcore_rl.gateway.render.mode.RenderMode` serves chat
    calls with linear history), ``options`` (:class:`GatewayOptions`: the limits), ``clock``.
    Served by uvicorn its lifespan enters it; mounted, enter it yourself.

    Example::

        gateway = RolloutGateway(["http://gpu1:8000/v1", "http://gpu2:8000/v1"], model="qwen")
        async with gateway:
            gateway.set_policy_version(3)
            async with gateway.paused():
                ...                           # swap weights: no call is running
    """

    @checked(moved=MOVED_KEYWORDS)
    def __init__(
        self,
        upstreams: str | Sequence[str],
        *,
        backend: str = "vllm",
        model: str | None = None,
        admin_token: str | None = None,
        sink: TraceSink | None = None,
        render: RenderMode | None = None,
        options: GatewayOptions = _DEFAULTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_config_types(("options", options, GatewayOptions))
        urls = [upstreams] if isinstance(upstreams, str) else list(upstreams)
        if not urls:
            raise ConfigurationError("at least one upstream URL is needed")
        self.upstreams = [checked_url(u.rstrip("/")) for u in urls]
        self.backend = backend_named(backend)
        self.render, self.model, self.admin_token = render, model, admin_token or None
        self.options, self.sink = options, sink
        self.gateway_id = uuid.uuid4().hex
        self.gate = PolicyGate()
        self.sessions = Sessions(self.gateway_id, options, sink, clock)
        # every call that ``render`` does not serve goes through the proxy mode
        modes = (ProxyMode(self.backend), render)
        self.calls = Admission(options, self.sessions, self.gate, modes, model, clock)
        self._stack: contextlib.AsyncExitStack | None = None
        self._admin = admin_app(self)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> RolloutGateway:
        if self._stack is not None:
            raise RuntimeError("the gateway is already running")
        async with contextlib.AsyncExitStack() as stack:
            self.calls.pools = [UpstreamPool(url) for url in self.upstreams]
            for pool in self.calls.pools:
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
        self.calls.pools = []

    @property
    def running(self) -> bool:
        """Whether the gateway is entered (serving calls)."""
        return self._stack is not None

    async def _sweep_forever(self) -> None:
        while True:
            await anyio.sleep(min(60.0, self.options.session_ttl / 4))
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
            await self.calls.drive("/pause?mode=keep")
            for pool in self.calls.pools:  # token-in calls: cut there, continued after the resume
                running = self.gate.token_in.get(pool.base)
                if running:
                    await self.calls.drive(
                        "/abort_requests", {"request_ids": sorted(running)}, [pool]
                    )
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
                await self.calls.drive("/update_weight_version", version)
            finally:
                self.gate.resume()  # the tokens from here on are the new version's
                await self.calls.drive("/resume")

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
        self.sessions.open(session_id, exp_id, input_id, sampling)

    def peek_session(self, session_id: str) -> SessionTrace:
        """The records of a live session so far, without finishing it."""
        return self.sessions.peek(session_id)

    async def finish_session(self, session_id: str) -> SessionTrace:
        """Release a session and return its trace (waiting, bounded, for calls in flight).

        Raises :class:`TraceLostError` when the gateway has no record of the session (it
        restarted, or the session expired with no sink to keep it).

        Example::

            trace = await gateway.finish_session(sid)
        """
        return await self.sessions.finish(session_id)

    async def expire_idle(self) -> int:
        """Persist and release sessions idle for longer than the TTL, forget sessions ended
        longer ago than that; -> how many sessions expired."""
        return await self.sessions.expire_idle()

    @property
    def stats(self) -> dict[str, Any]:
        """What ``GET /admin/stats`` answers: the counters, live sessions, calls in flight."""
        live: dict[str, Any] = {
            "live_sessions": len(self.sessions.live),
            "in_flight": self.gate.in_flight,
            # per upstream: whose spans proxy mode's token versions are (docs/gateway.md)
            "proxy_versions": dict(self.backend.sources),
        }
        if self.render is not None:  # requests that did not extend their history
            live["linear_forks"] = self.render.forks
            live["linear_versions"] = dict(self.render.backend.sources)
        counts = {**self.calls.counts, **self.sessions.counts}
        return {**counts, **live, "policy_version": self.gate.version}

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
        dialect = CHAT_DIALECT if route is None else route.dialect
        try:
            sid = bearer_session(scope) if sid is None else sid
            check_session_id(sid)
            if route is not None:
                await self.calls.call(scope, receive, send, sid, route)
            elif rest == "v1/models" and scope["method"] == "GET":
                await self.calls.models(send, sid)
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
