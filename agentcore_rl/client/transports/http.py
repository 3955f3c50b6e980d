"""HTTP transport: httpx straight to one or more agent servers.

For local runs and self-hosted fleets. Each session id maps to one URL by a stable hash,
so a retried invocation and the stop call reach the server that runs the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from agentcore_rl import protocol
from agentcore_rl.client.transports.transport import (
    NotConnectedError,
    RetryableError,
    StopUnsupportedError,
    json_object_answer,
    session_state,
)
from agentcore_rl.errors import ConfigurationError, InvocationError
from agentcore_rl.protocol import INVOCATIONS_PATH, SESSION_ID_HEADER, STOP_SESSION_PATH

__all__ = ["DEFAULT_MAX_CONNECTIONS", "HttpTransport", "error_message"]

logger = logging.getLogger(__name__)

#: Requests in flight at once (an invocation is answered at once, so few are needed).
DEFAULT_MAX_CONNECTIONS: Final = 16
#: Seconds for read/write of one call (invocations answer at once: "processing").
HTTP_TIMEOUT: Final = 60.0
#: Sessions whose server is remembered (older ones fall back to the hash of their id).
MAX_PINNED_SESSIONS: Final = 200_000


def error_message(response: httpx.Response) -> str:
    detail: Any = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        detail = body.get("error") or body.get("message") or body.get("Message")
        field = body.get("field")
        if detail and field:
            detail = f"{detail} (field {field})"
    if not detail:
        detail = response.text[:500] or response.reason_phrase
    return f"HTTP {response.status_code}: {detail}"


def retry_after(response: httpx.Response) -> float | None:
    """Seconds, capped at a minute (agent servers do not use the HTTP-date form)."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.0), 60.0) if seconds == seconds else None


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"agent_url {url!r} is not an http(s) URL like http://127.0.0.1:8080"
        )
    return url.rstrip("/")


class HttpTransport:
    """Invocations as ``POST {url}/invocations`` with the session header; stops as
    ``POST {url}/sessions/{session_id}/stop`` and status as ``GET {url}/sessions/{id}``
    (AgentCoreRLApp extensions). A new session goes to a server chosen by its id among
    those that have not refused a connection in the last ``cooldown`` seconds, and stays
    there. A stop delivered without an answer within ``stop_answer_timeout`` counts as
    done: the server cancels on receipt, then waits for the rollout to end.

    Example::

        transport = HttpTransport("http://127.0.0.1:8080", max_connections=512)
    """

    name = "http"
    #: A finished rollout on our server holds nothing; stopping it would be a no-op call.
    stop_after_result = False

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        cooldown: float = 10.0,
        stop_answer_timeout: float = 1.0,
    ) -> None:
        url_list = [urls] if isinstance(urls, str) else list(urls)
        if not url_list:
            raise ConfigurationError("agent_url needs at least one URL")
        self.urls = [_check_url(u) for u in url_list]
        self.cooldown = cooldown
        self.stop_answer_timeout = stop_answer_timeout
        self._unhealthy: dict[str, float] = {}  # url -> clock time it may be used again
        self._pins: OrderedDict[str, str] = OrderedDict()  # session id -> its server
        # Agent servers that answered 404 to a stop (no stop route): not asked again.
        self._stop_unsupported: set[str] = set()
        # httpcore's pool rescans its queue on every release: thousands of queued requests
        # cost quadratic CPU. Queue here instead, in an O(1) semaphore.
        self._limit = asyncio.Semaphore(max_connections)
        self._http = httpx.AsyncClient(
            # A refused connection fails at once; the connect timeout bounds a black hole.
            timeout=httpx.Timeout(HTTP_TIMEOUT, connect=10.0),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    def __repr__(self) -> str:
        return f"HttpTransport(urls={self.urls!r})"

    def url_for(self, session_id: str) -> str:
        """Stable: same id, same server."""
        pinned = self._pins.get(session_id)
        return pinned or self.urls[zlib.crc32(session_id.encode()) % len(self.urls)]

    def _assign(self, session_id: str) -> str:
        pinned = self._pins.get(session_id)
        if pinned is not None:
            return pinned
        now = time.monotonic()
        healthy = [url for url in self.urls if self._unhealthy.get(url, 0.0) <= now] or self.urls
        url = healthy[zlib.crc32(session_id.encode()) % len(healthy)]
        self._pins[session_id] = url
        if len(self._pins) > MAX_PINNED_SESSIONS:
            self._pins.popitem(last=False)
        return url

    async def _send(
        self, session_id: str, url: str, method: str = "POST", **kwargs: Any
    ) -> httpx.Response:
        try:
            async with self._limit:
                response = await self._http.request(method, url, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            base = next((u for u in self.urls if url.startswith(u)), None)
            if base is not None and len(self.urls) > 1:
                self._unhealthy[base] = time.monotonic() + self.cooldown
            raise NotConnectedError(
                f"{url}: {type(exc).__name__}: {exc or 'connection failed'}", session_id=session_id
            ) from exc
        except httpx.TransportError as exc:  # read errors and timeouts
            raise RetryableError(
                f"{url}: {type(exc).__name__}: {exc}", session_id=session_id
            ) from exc
        status = response.status_code
        if status == 429 or status >= 500:
            raise RetryableError(
                error_message(response),
                session_id=session_id,
                status_code=status,
                throttled=status == 429,
                retry_after=retry_after(response) if status in (429, 503) else None,
            )
        if status >= 400:
            raise InvocationError(
                f"{url}: {error_message(response)}", session_id=session_id, status_code=status
            )
        return response

    def reassign(self, session_id: str) -> None:
        """Move a session none of whose attempts connected to a server that has not refused
        a connection lately (nothing started on the old one, so nothing runs twice)."""
        self._pins.pop(session_id, None)
        self._assign(session_id)

    async def invoke(self, session_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        url = self._assign(session_id) + INVOCATIONS_PATH
        response = await self._send(
            session_id, url, json=payload, headers={SESSION_ID_HEADER: session_id}
        )
        return json_object_answer(
            response.content,
            source=url,
            session_id=session_id,
            status_code=response.status_code,
        )

    async def stop(self, session_id: str) -> bool:
        url = self.url_for(session_id)
        if url in self._stop_unsupported:
            raise StopUnsupportedError(f"{url} has no stop route", session_id=session_id)
        path = STOP_SESSION_PATH.format(session_id=session_id)
        try:
            response = await self._send(
                session_id,
                url + path,
                timeout=httpx.Timeout(HTTP_TIMEOUT, read=self.stop_answer_timeout),
            )
        except RetryableError as exc:
            if isinstance(exc.__cause__, httpx.ReadTimeout):
                return True  # delivered: the agent is cancelling it
            raise
        except InvocationError as exc:
            if exc.status_code not in (404, 405):
                raise
            self._stop_unsupported.add(url)
            logger.info(
                "the agent server at %s has no stop route (HTTP %d): its rollouts run to "
                "the end when stopped; counted as stops_unsupported, not as failures",
                url,
                exc.status_code,
            )
            raise StopUnsupportedError(
                f"{url} has no stop route", session_id=session_id, status_code=exc.status_code
            ) from None
        try:
            return bool(response.json().get("stopped", False))
        except (ValueError, AttributeError):
            return False

    async def status(self, session_id: str) -> protocol.SessionState:
        """``RetryableError`` when it cannot answer (not reached, a 5xx), ``InvocationError``
        for a 4xx (a server without the route is up)."""
        url = self.url_for(session_id) + protocol.SESSION_STATUS_PATH.format(session_id=session_id)
        headers = {SESSION_ID_HEADER: session_id}
        response = await self._send(session_id, url, "GET", headers=headers)
        answer = json_object_answer(response.content, source=url, session_id=session_id)
        return session_state(answer, source=url, session_id=session_id)

    async def aclose(self) -> None:
        await self._http.aclose()
