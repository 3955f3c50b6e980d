"""What the lean AWS clients share: settings taken from a generic client, one httpx pool,
and failures turned into the exceptions botocore raises.

A lean client is built FROM a generic aiobotocore client, which stays the source of truth:
its resolved region and endpoint (``endpoint_url``, ``AWS_ENDPOINT_URL_*``, the endpoint
ruleset), its credentials, user agent, timeouts, pool size and TLS verification. Error
answers go through that client's own response parser and exception classes, so callers
see the same ``ClientError`` subclasses, codes and ``response`` dicts as from the generic
path, and their retry decisions do not change.

Example::

    http = LeanHttp.from_client(generic_client)
    status, headers, body = await http.send("GET", url, signed_headers, b"")
    if status >= 300:
        await http.raise_error(generic_client, "GetObject", status, headers, body)
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Sequence
from typing import Any, Final, NoReturn

import httpx
from botocore.exceptions import (
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
)

__all__ = ["LeanHttp", "LeanUnsupported", "join_url", "sdk_headers"]

#: What aiobotocore asks for: bodies are returned exactly as stored, never decoded.
_IDENTITY: Final = "identity"


class LeanUnsupported(Exception):
    """The generic client is set up in a way the lean path does not reproduce (a proxy,
    an auth scheme other than SigV4...): use the generic client instead."""


def sdk_headers() -> dict[str, str]:
    """The per-request headers botocore adds besides the signed ones (not signed either).

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


def _verify_setting(client: Any) -> bool | ssl.SSLContext:
    """TLS verification as the generic client does it: on, off, or a CA bundle path."""
    verify = getattr(getattr(client, "_endpoint", None), "http_session", None)
    verify = getattr(verify, "_verify", True)
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return bool(verify)


def _proxy_for(client: Any, url: str) -> str | None:
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    proxies = getattr(session, "_proxy_config", None)
    if proxies is None:
        return None
    proxy: str | None = proxies.proxy_url_for(url)
    return proxy


class LeanHttp:
    """One httpx connection pool, sized and timed like the generic client's, plus the
    mapping of transport failures and error answers to botocore's exceptions.

    Example::

        http = LeanHttp.from_client(client)
        try:
            status, headers, body = await http.send("GET", url, headers, b"")
        finally:
            await http.aclose()
    """

    def __init__(
        self,
        *,
        user_agent: str,
        max_connections: int,
        connect_timeout: float,
        read_timeout: float,
        verify: bool | ssl.SSLContext = True,
    ) -> None:
        self.user_agent = user_agent
        self._http = httpx.AsyncClient(
            # The library queues requests on its own limits; a request waiting for a pooled
            # connection waits as long as it takes, as with aiobotocore's pool.
            timeout=httpx.Timeout(
                connect=connect_timeout, read=read_timeout, write=read_timeout, pool=None
            ),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            verify=verify,
            # botocore reads its own settings (proxies, CA bundle); httpx must not add its
            # environment's (netrc credentials, other proxy variables) on top.
            trust_env=False,
        )

    def __repr__(self) -> str:
        return f"LeanHttp(user_agent={self.user_agent!r})"

    @classmethod
    def from_client(cls, client: Any, endpoint_urls: Sequence[str] = ()) -> LeanHttp:
        """Settings from a generic aiobotocore client; ``LeanUnsupported`` if it goes
        through a proxy for any of ``endpoint_urls`` (the lean pool does not).

        Example::

            http = LeanHttp.from_client(client, [client.meta.endpoint_url])
        """
        for url in endpoint_urls:
            if _proxy_for(client, url):
                raise LeanUnsupported(f"{url} is reached through a proxy")
        config = client.meta.config
        return cls(
            # Built once: botocore rebuilds this string (about 30 to_string calls) per request.
            user_agent=client._user_agent_creator.to_string(),
            max_connections=config.max_pool_connections,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            verify=_verify_setting(client),
        )

    async def send(
        self, method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> tuple[int, httpx.Headers, bytes]:
        """Send one signed request; return status, headers and the whole body, undecoded.

        Transport failures raise botocore's exceptions, as aiobotocore's session does:
        ``EndpointConnectionError``, ``ConnectTimeoutError``, ``ReadTimeoutError``,
        ``HTTPClientError``.

        Example::

            status, headers, body = await http.send("POST", url, headers, payload)
        """
        request = self._http.build_request(method, url, headers=headers, content=body)
        try:
            response = await self._http.send(request, stream=True)
            try:
                chunks = [chunk async for chunk in response.aiter_raw()]
            finally:
                await response.aclose()
        except httpx.ConnectTimeout as exc:
            raise ConnectTimeoutError(endpoint_url=url, error=exc) from exc
        except httpx.ConnectError as exc:
            raise EndpointConnectionError(endpoint_url=url, error=exc) from exc
        except httpx.TimeoutException as exc:
            raise ReadTimeoutError(endpoint_url=url, error=exc) from exc
        except httpx.TransportError as exc:
            raise HTTPClientError(error=exc) from exc
        content = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return response.status_code, response.headers, content

    async def aclose(self) -> None:
        """Close the pool. Idempotent.

        Example::

            await http.aclose()
        """
        await self._http.aclose()

    def base_headers(self) -> dict[str, str]:
        """The unsigned headers every request carries.

        Example::

            headers = http.base_headers() | {"Content-Type": "application/json"}
        """
        return {"User-Agent": self.user_agent, "Accept-Encoding": _IDENTITY, **sdk_headers()}

    @staticmethod
    async def raise_error(
        client: Any, operation: str, status: int, headers: httpx.Headers, body: bytes
    ) -> NoReturn:
        """Parse an error answer with the generic client's parser and raise the exception
        class it would raise (a ``ClientError`` subclass with the same ``response``).

        Example::

            await LeanHttp.raise_error(client, "GetObject", 404, headers, body)
        """
        model = client.meta.service_model.operation_model(operation)
        response = {
            # aiobotocore hands its parser lower-cased header names, as here.
            "headers": {k.lower(): v for k, v in headers.multi_items()},
            "status_code": status,
            "body": body,
            "context": {"operation_name": operation},
        }
        parsed = client._response_parser.parse(response, model.output_shape)
        if not isinstance(parsed, dict):  # aiobotocore's parsers are coroutines
            parsed = await parsed
        code = parsed.get("Error", {}).get("Code")
        raise client.exceptions.from_code(code)(parsed, operation)
