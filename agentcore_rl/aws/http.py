"""What the lean AWS clients share: sending with the generic client's HTTP settings and
turning error answers into the exceptions botocore raises.

A lean client is built FROM a generic aiobotocore client, which stays the source of truth:
its resolved region and endpoint (``endpoint_url``, ``AWS_ENDPOINT_URL_*``, the endpoint
ruleset), its credentials and user agent, and its HTTP settings: pool size, connect and
read timeouts, TLS verification and proxies. Requests go out through one keep-alive pool
per origin (:class:`~agentcore_rl.aws.wire.WirePool`, with those settings); an origin
reached through a proxy, or a client whose HTTP session is not aiobotocore's aiohttp one,
is sent through that session instead. Transport failures raise what aiobotocore raises for
them (``EndpointConnectionError``, ``ConnectionClosedError``, ``ReadTimeoutError``...).
Error answers go through the generic client's response parser and exception classes, so
callers see the same ``ClientError`` subclasses, codes and ``response`` dicts as from the
generic path, and their retry decisions do not change.

(Measured on loopback, CPU per request: httpx about 1.7 ms, aiohttp 0.26 ms, the
pool of :mod:`agentcore_rl._http1` a fraction of aiohttp's.)

Example::

    http = LeanHttp.from_client(generic_client)
    status, headers, body = await http.send("GET", url, signed_headers, b"")
    if status >= 300:
        await http.raise_error(generic_client, "GetObject", status, headers, body)
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final, NoReturn

import aiohttp
import botocore.auth
from aiohttp import http_exceptions
from botocore.awsrequest import AWSPreparedRequest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
)
from yarl import URL

from agentcore_rl._http1 import HttpClosedError, HttpConnectError, HttpTimeoutError
from agentcore_rl.aws.wire import WirePool, pool_settings

__all__ = ["LeanHttp", "LeanUnsupported", "join_url", "sdk_headers", "transport_error"]

#: What aiobotocore asks for: bodies are returned exactly as stored, never decoded.
_IDENTITY: Final = "identity"


class LeanUnsupported(Exception):
    """The generic client is set up in a way the lean path does not reproduce (an auth
    scheme other than SigV4, a bucket in another region...): use the generic client."""


def sdk_headers() -> dict[str, str]:
    """The per-request headers botocore adds after signing (so they are not signed).

    Example::

        headers = {"User-Agent": ua, **sdk_headers()}
    """
    # One attempt per request: the library's own retry policies resend, as a new request.
    return {"amz-sdk-invocation-id": str(uuid.uuid4()), "amz-sdk-request": "attempt=1"}


def join_url(endpoint_url: str, path: str) -> str:
    """``endpoint_url`` (which may carry a path, e.g. a path-style bucket) joined with an
    operation's ``path`` as botocore joins them.

    Example::

        join_url("http://127.0.0.1:5000/bucket", "/key")   # "http://127.0.0.1:5000/bucket/key"
    """
    base = endpoint_url.split("?", 1)[0]
    scheme_end = base.find("//") + 2
    slash = base.find("/", scheme_end)
    base_path = "" if slash < 0 else base[slash:]
    origin = base if slash < 0 else base[:slash]
    if not path or path == "/":
        return origin + (base_path or "/")
    if base_path.endswith("/") and path.startswith("/"):
        return origin + base_path[:-1] + path
    return origin + base_path + path


def transport_error(exc: BaseException, url: str, proxy_url: str | None) -> Exception:
    """The botocore exception aiobotocore raises for an aiohttp failure ``exc`` (so retry
    decisions keyed on botocore's classes see the same thing on both paths).

    Example::

        raise transport_error(exc, url, None) from exc
    """
    if isinstance(exc, HttpConnectError):
        # The socket's or TLS's own error is the cause: aiohttp's ClientConnectorError (or
        # its SSL subclasses) for the same failure.
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return SSLError(endpoint_url=url, error=cause)
        return EndpointConnectionError(endpoint_url=url, error=cause)
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return SSLError(endpoint_url=url, error=exc)
    if isinstance(exc, HttpTimeoutError):
        if exc.connect:
            return ConnectTimeoutError(endpoint_url=url, error=exc)
        return ReadTimeoutError(endpoint_url=url, error=exc)
    if isinstance(exc, HttpClosedError):
        return ConnectionClosedError(error=exc, endpoint_url=url)
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return EndpointConnectionError(endpoint_url=url, error=exc)
    if isinstance(exc, aiohttp.ClientSSLError):
        return SSLError(endpoint_url=url, error=exc)
    if isinstance(exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        return ProxyConnectionError(proxy_url=proxy_url or "", error=exc)
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientPayloadError
        | http_exceptions.BadStatusLine,
    ):
        return ConnectionClosedError(error=exc, endpoint_url=url)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        if str(exc).lower().startswith("connect"):
            return ConnectTimeoutError(endpoint_url=url, error=exc)
        return ReadTimeoutError(endpoint_url=url, error=exc)
    if isinstance(exc, aiohttp.ClientConnectionError | socket.gaierror):
        return EndpointConnectionError(endpoint_url=url, error=exc)
    if isinstance(exc, asyncio.TimeoutError):
        return ReadTimeoutError(endpoint_url=url, error=exc)
    return HTTPClientError(error=exc)


def _origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``: what proxy settings and connections depend on."""
    slash = url.find("/", url.find("//") + 2)
    return url if slash < 0 else url[:slash]


class _Origin:
    """What is fixed per scheme, host and port: the proxy settings and either the lean
    connection pool or (through a proxy, or without httptools) the aiohttp session
    aiobotocore keeps for that proxy."""

    __slots__ = ("name", "proxy_headers", "proxy_url", "session", "wire")

    def __init__(
        self,
        name: str,
        proxy_url: str | None,
        proxy_headers: Any,
        session: Any,
        wire: WirePool | None,
    ) -> None:
        self.name = name
        self.proxy_url = proxy_url
        self.proxy_headers = proxy_headers or None
        self.session = session
        self.wire = wire


class LeanHttp:
    """Sends signed requests through a generic client's HTTP session.

    Example::

        http = LeanHttp.from_client(client)
        status, headers, body = await http.send("GET", url, headers, b"")
    """

    def __init__(self, http_session: Any, *, user_agent: str) -> None:
        self.user_agent = user_agent
        self._session = http_session
        # aiobotocore's aiohttp session (one per proxy) is used directly when there is one:
        # its send() re-reads the proxy environment, copies the headers into a new
        # multidict, parses the URL again and wraps the answer, on every request.
        self._direct = hasattr(http_session, "_get_session") and hasattr(
            http_session, "_proxy_config"
        )
        self._origins: dict[str, _Origin] = {}

    def __repr__(self) -> str:
        return f"LeanHttp(user_agent={self.user_agent!r})"

    @classmethod
    def from_client(cls, client: Any) -> LeanHttp:
        """The HTTP session and user agent of a generic aiobotocore client.

        Example::

            http = LeanHttp.from_client(client)
        """
        # Built once: botocore rebuilds this string (about 30 to_string calls) per request.
        user_agent = client._user_agent_creator.to_string()
        return cls(client._endpoint.http_session, user_agent=user_agent)

    async def warm(self, url: str) -> None:
        """Set up ``url``'s origin now (for https or a proxy, the aiohttp session, whose
        TLS context costs tens of milliseconds of CPU), so that the first request does not
        wait for it.

        Example::

            await http.warm(endpoint_url)
        """
        if self._direct:
            await self._origin(url)

    async def _origin(self, url: str) -> _Origin:
        name = _origin_of(url)
        origin = self._origins.get(name)
        if origin is None:
            config = self._session._proxy_config
            proxy_url = config.proxy_url_for(url)
            session: Any = None
            wire: WirePool | None = None
            if proxy_url is None:
                # Proxies (and their TLS settings) stay aiohttp's; everything else goes out
                # through a pool with the session's size, timeouts and TLS context. (For
                # plain http no aiohttp session is opened: its TLS context costs tens of
                # milliseconds of CPU and would serve nothing.)
                ssl_context = None
                if name.startswith("https:"):
                    session = await self._session._get_session(None)
                    ssl_context = getattr(session.connector, "_ssl", None)
                host = botocore.auth._host_from_url(name)  # type: ignore[attr-defined]
                try:
                    settings = pool_settings(self._session, ssl_context)
                    wire = WirePool(name, **settings, host_header=host)
                except ImportError:  # no httptools (it comes with the `client` extra)
                    wire = None
            if wire is None and session is None:
                session = await self._session._get_session(proxy_url)
            origin = _Origin(name, proxy_url, config.proxy_headers_for(url), session, wire)
            self._origins[name] = origin
        return origin

    async def send(
        self,
        method: str,
        url: str | URL,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Send one signed request; return status, headers (lower-cased names; only for
        an error answer, else empty) and the whole body, undecoded. Transport failures
        raise what aiobotocore raises.

        Example::

            status, headers, body = await http.send("POST", url, headers, payload)
        """
        all_headers = dict(headers)
        all_headers["User-Agent"] = self.user_agent
        all_headers["Accept-Encoding"] = _IDENTITY
        all_headers["amz-sdk-invocation-id"] = str(uuid.uuid4())
        all_headers["amz-sdk-request"] = "attempt=1"
        text = str(url)
        if not self._direct:
            request = AWSPreparedRequest(method, text, all_headers, body, False)  # type: ignore[arg-type]
            response = await self._session.send(request)
            content: bytes = await response.content
            return response.status_code, response.headers, content
        origin = self._origins.get(_origin_of(text))
        if origin is None:
            origin = await self._origin(text)
        wire = origin.wire
        if wire is not None:
            path = text[len(origin.name) :] or "/"
            all_headers.pop("Host", None)  # the pool sends the signed host
            try:
                code, raw, content = await wire.request(
                    method, path, list(all_headers.items()), body
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise transport_error(exc, text, None) from exc
            if code < 300:
                return code, {}, content
            return code, {k.decode().lower(): v.decode() for k, v in raw}, content
        target = url if isinstance(url, URL) else URL(url, encoded=True)
        try:
            async with origin.session.request(
                method,
                target,
                headers=all_headers,
                data=body or None,
                proxy=origin.proxy_url,
                proxy_headers=origin.proxy_headers,
            ) as response:
                content = await response.read()
                status: int = response.status
                if status < 300:
                    return status, {}, content
                found = {
                    k.decode("utf-8").lower(): v.decode("utf-8") for k, v in response.raw_headers
                }
                return status, found, content
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise transport_error(exc, text, origin.proxy_url) from exc

    async def aclose(self) -> None:
        """Close the lean connection pools (the aiohttp ones are the generic client's,
        closed with it). Idempotent.

        Example::

            await http.aclose()
        """
        for origin in self._origins.values():
            if origin.wire is not None:
                origin.wire.close()

    @staticmethod
    async def raise_error(
        client: Any, operation: str, status: int, headers: Mapping[str, str], body: bytes
    ) -> NoReturn:
        """Parse an error answer with the generic client's parser and raise the exception
        class it would raise (a ``ClientError`` subclass with the same ``response``).

        Example::

            await LeanHttp.raise_error(client, "GetObject", 404, headers, body)
        """
        model = client.meta.service_model.operation_model(operation)
        response = {
            "headers": headers,
            "status_code": status,
            "body": body,
            "context": {"operation_name": operation},
        }
        parsed = client._response_parser.parse(response, model.output_shape)
        if not isinstance(parsed, dict):  # aiobotocore's parsers are coroutines
            parsed = await parsed
        code = parsed.get("Error", {}).get("Code")
        raise client.exceptions.from_code(code)(parsed, operation)
