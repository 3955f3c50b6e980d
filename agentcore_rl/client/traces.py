"""Gateway links, and each rollout's token trace joined to its outcome and kept in S3
(docs/client.md, "Through a rollout gateway")."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

import httpx

from agentcore_rl import protocol
from agentcore_rl.client.config import GatewayConfig
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.errors import (
    AgentCoreRLError,
    ConfigurationError,
    GatewayError,
    InvalidRolloutConfig,
    TraceLostError,
)
from agentcore_rl.s3 import ResultStore
from agentcore_rl.trace import SessionTrace, load_trace

if TYPE_CHECKING:
    from agentcore_rl.gateway.gateway import RolloutGateway

__all__ = [
    "API_KEY",
    "GatewayLink",
    "InProcessGateway",
    "RemoteGateway",
    "TraceJoiner",
    "gateway_link",
]

logger = logging.getLogger(__name__)

#: The ``_rollout`` field carrying the session id as the agent's OpenAI API key.
API_KEY: Final = "api_key"


# The gateway's header naming its process on ``POST /admin/sessions`` (gateway.gateway).
_GATEWAY_ID_HEADER: Final = "x-gateway-id"


class GatewayLink(Protocol):
    """What the client needs of a gateway: ``open`` answers the id of the gateway process
    holding the session, ``finish`` its trace (``TraceLostError`` when it is gone)."""

    url: str

    async def open(self, session_id: str, *, exp_id: str | None, input_id: str) -> str | None: ...

    async def finish(self, session_id: str) -> SessionTrace: ...

    async def aclose(self) -> None: ...


class InProcessGateway:
    """A :class:`RolloutGateway` running on the client's event loop, served at ``url``."""

    def __init__(self, gateway: RolloutGateway, url: str) -> None:
        self.gateway = gateway
        self.url = url.rstrip("/")

    def __repr__(self) -> str:
        return f"InProcessGateway({self.gateway!r}, url={self.url!r})"

    async def open(self, session_id: str, *, exp_id: str | None, input_id: str) -> str | None:
        if not self.gateway.running:
            raise GatewayError(
                f"the in-process gateway is not running: enter it (async with gateway) or "
                f"serve it before invoking rollouts through it ({self.url})"
            )
        self.gateway.open_session(session_id, exp_id=exp_id, input_id=input_id)
        return self.gateway.gateway_id

    async def finish(self, session_id: str) -> SessionTrace:
        return await self.gateway.finish_session(session_id)

    async def aclose(self) -> None:
        """Nothing to release: the gateway belongs to whoever made it."""


class RemoteGateway:
    """A gateway in another process, driven through its admin routes with ``admin_token``."""

    def __init__(self, url: str, admin_token: str) -> None:
        self.url = url.rstrip("/")
        self._token = admin_token
        self._http: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"RemoteGateway({self.url!r})"

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers={"authorization": f"Bearer {self._token}"},
                # finish waits (bounded, 30 s by default) for the session's calls in flight.
                timeout=httpx.Timeout(120.0, connect=10.0),
                transport=httpx.AsyncHTTPTransport(retries=2),  # connection failures only
            )
        return self._http

    async def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._client().post(path, **kwargs)
        except httpx.HTTPError as exc:
            raise GatewayError(
                f"cannot reach the gateway at {self.url}: {type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _message(response: httpx.Response) -> str:
        try:
            return str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return response.text[:300]

    async def open(self, session_id: str, *, exp_id: str | None, input_id: str) -> str | None:
        response = await self._post(
            "/admin/sessions",
            json={"session_id": session_id, "exp_id": exp_id, "input_id": input_id},
        )
        if response.status_code != 204:
            raise GatewayError(
                f"the gateway at {self.url} refused to open session {session_id}: "
                f"HTTP {response.status_code}: {self._message(response)}"
            )
        gateway_id: str | None = response.headers.get(_GATEWAY_ID_HEADER)
        return gateway_id

    async def finish(self, session_id: str) -> SessionTrace:
        response = await self._post(f"/admin/sessions/{session_id}/finish")
        if response.status_code == 410:
            raise TraceLostError(session_id, f"{self.url}: {self._message(response)}")
        if response.status_code != 200:
            raise GatewayError(
                f"the gateway at {self.url} could not finish session {session_id}: "
                f"HTTP {response.status_code}: {self._message(response)}"
            )
        try:
            return load_trace(response.content)
        except (ValueError, KeyError, OSError, EOFError) as exc:
            raise GatewayError(
                f"the gateway at {self.url} sent an unreadable trace for {session_id}: {exc}"
            ) from exc

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()


def gateway_link(config: GatewayConfig | None) -> GatewayLink | None:
    if config is None:
        return None
    if not isinstance(config, GatewayConfig):
        raise ConfigurationError(
            f"gateway must be a GatewayConfig, got {type(config).__name__} "
            "(an in-process gateway: GatewayConfig(url=..., app=gateway))"
        )
    if config.app is not None:
        return InProcessGateway(config.app, config.url)
    assert config.admin_token is not None  # GatewayConfig checked it
    return RemoteGateway(config.url, config.admin_token)


class TraceJoiner:
    """Opens gateway sessions, finishes them when envelopes arrive, keeps the traces."""

    def __init__(self, link: GatewayLink, store: ResultStore) -> None:
        self.link = link
        self.store = store
        self._gateway_ids: dict[str, str | None] = {}  # sessions we owe a finish, by id

    async def open(self, fut: RolloutFuture, body: dict[str, Any]) -> None:
        sid = fut.session_id
        exp_id = _exp_id_of(fut)
        self._gateway_ids[sid] = await self.link.open(sid, exp_id=exp_id, input_id=fut.input_id)
        block = body[protocol.ROLLOUT_FIELD]
        # The session's OpenAI base_url (the gateway's RolloutGateway.session_base_url).
        block[protocol.BASE_URL] = f"{self.link.url}/sessions/{sid}/v1"
        block[API_KEY] = sid

    async def release(self, sid: str) -> None:
        """``sid`` ended without its trace (timeout, cancel...)."""
        self._gateway_ids.pop(sid, None)
        try:
            await self.link.finish(sid)
        except AgentCoreRLError as exc:
            logger.debug("releasing gateway session %s: %s", sid, exc)

    async def join(
        self, fut: RolloutFuture, envelope: dict[str, Any], *, kept: bool = False
    ) -> BaseException | None:
        """Fetch ``fut``'s trace (onto ``fut.trace``) and keep it beside its result; the
        error that leaves the rollout without one. An error envelope is its own outcome:
        its trace is a bonus, neither fetched with a retry nor kept. ``kept``: the result
        was in S3 before this process looked: its trace is read from beside it first (the
        gateway finished that session)."""
        failed = protocol.is_error_envelope(envelope)
        key = protocol.trace_key(fut.result_key)
        try:
            saved = await self.store.get_trace(fut.s3_bucket, key) if kept else None
            if saved is not None:
                fut.trace = saved
                return None
            fut.trace = await self._trace(fut)
        except AgentCoreRLError as exc:
            if failed:
                return None
            if isinstance(exc, TraceLostError) and exc.envelope is None:
                exc.envelope = dict(envelope)
            return exc
        if failed:
            return None
        try:
            # Durable before the outcome is known: attach(), eval --resume and offline
            # SFT read it from there.
            await self.store.put_trace(fut.s3_bucket, key, fut.trace)
        except AgentCoreRLError as exc:
            return exc
        return None

    async def _trace(self, fut: RolloutFuture) -> SessionTrace:
        """Or read the trace an earlier process kept."""
        sid = fut.session_id
        expected = self._gateway_ids.pop(sid, None)
        try:
            trace = await self.link.finish(sid)
        except TraceLostError:
            saved = await self.store.get_trace(fut.s3_bucket, protocol.trace_key(fut.result_key))
            if saved is None:
                raise
            return saved
        if expected is not None and trace.gateway_id and trace.gateway_id != expected:
            raise TraceLostError(
                sid,
                f"the gateway restarted during the rollout (the session was opened at "
                f"gateway {expected}, finished at {trace.gateway_id}): the calls before the "
                "restart were not captured",
            )
        if trace.input_id != fut.input_id:
            raise TraceLostError(
                sid,
                "the gateway that holds it never saw it opened (it restarted during the "
                f"rollout; input {trace.input_id!r}, expected {fut.input_id!r})",
            )
        return trace


def _exp_id_of(fut: RolloutFuture) -> str | None:
    try:
        return protocol.parse_result_key(fut.result_key)[0]
    except InvalidRolloutConfig:
        return None
