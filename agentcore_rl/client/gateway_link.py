"""How the client reaches a rollout gateway: in this process, or over its admin HTTP routes.

A link opens a session before its rollout is invoked (so its records carry the exp_id and
input_id) and finishes it when the envelope has arrived, returning the session's trace.
:class:`InProcessGateway` calls a :class:`~agentcore_rl.gateway.RolloutGateway` running on
the client's event loop; :class:`RemoteGateway` talks to one in another process
(``agentcore-rl gateway``) with its admin token.

Example::

    link = RemoteGateway("http://gw:9000", admin_token="s3cret")
    gateway_id = await link.open(sid, exp_id="e1", input_id="q-1")
    trace = await link.finish(sid)          # TraceLostError when the gateway lost it
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

from agentcore_rl.client.config import GATEWAY_TOKEN_ENV, GatewayConfig
from agentcore_rl.errors import GatewayError, TraceLostError

if TYPE_CHECKING:
    import httpx

    from agentcore_rl.gateway.app import RolloutGateway
    from agentcore_rl.gateway.record import SessionTrace

__all__ = [
    "GATEWAY_TOKEN_ENV",
    "GatewayLink",
    "InProcessGateway",
    "RemoteGateway",
    "gateway_link",
    "session_base_url",
]

# The gateway's header naming its process on ``POST /admin/sessions`` (gateway.app).
_GATEWAY_ID_HEADER: Final = "x-gateway-id"


def session_base_url(gateway_url: str, session_id: str) -> str:
    """The OpenAI ``base_url`` of one session at a gateway (``.../sessions/{sid}/v1``)."""
    return f"{gateway_url.rstrip('/')}/sessions/{session_id}/v1"


class GatewayLink(Protocol):
    """What the client needs of a gateway: its URL for agents, open, finish, close."""

    url: str

    async def open(self, session_id: str, *, exp_id: str | None, input_id: str) -> str | None:
        """Register the session; -> the id of the gateway process holding it."""

    async def finish(self, session_id: str) -> SessionTrace:
        """Release the session; -> its trace (``TraceLostError`` when it is gone)."""

    async def aclose(self) -> None:
        """Release the link's connections."""


class InProcessGateway:
    """A :class:`RolloutGateway` running on the client's event loop, which agents reach
    at ``url`` (where it is served).
    """

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

    def __init__(self, url: str, admin_token: str, *, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._token = admin_token
        # finish waits (bounded, 30 s by default) for the session's calls still in flight.
        self._timeout = timeout
        self._http: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"RemoteGateway({self.url!r})"

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # lazy: httpx is the client extra; a RemoteGateway never called needs none
            import httpx

            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers={"authorization": f"Bearer {self._token}"},
                timeout=httpx.Timeout(self._timeout, connect=10.0),
                transport=httpx.AsyncHTTPTransport(retries=2),  # connection failures only
            )
        return self._http

    async def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        # lazy: as in _client
        import httpx

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
        # lazy: the gateway package stays unloaded until a trace is read
        from agentcore_rl.gateway.record import load_trace

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
    """The link for the client's ``gateway=`` option (None: no gateway)."""
    if config is None:
        return None
    if config.app is not None:
        return InProcessGateway(config.app, config.url)
    assert config.admin_token is not None  # GatewayConfig checked it
    return RemoteGateway(config.url, config.admin_token)
