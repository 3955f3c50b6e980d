"""SigV4 for the lean request path, with botocore's own signer classes.

The canonical request, string to sign and ``Authorization`` header are botocore's
(:class:`botocore.auth.SigV4Auth`, or :class:`~botocore.auth.S3SigV4Auth` for S3). What is
saved per request is what botocore recomputes although it does not change: the signer
object (rebuilt only when the frozen credentials change), the derived signing key (four
HMACs, fixed per secret key and day), the second selection of the headers to sign, and
the request preparation botocore runs only to read back a body that is already bytes.

Credentials come from the generic client's credential object, so the chain, expiry and
refresh are botocore's: ``get_frozen_credentials()`` refreshes before expiry.

Example::

    signer = LeanSigner(credentials, signing_name="s3", region="us-west-2", s3=True)
    headers = await signer.sign("GET", url, {"User-Agent": ua}, b"")
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import botocore.auth
from botocore.auth import SIGNED_HEADERS_BLACKLIST, S3SigV4Auth, SigV4Auth
from botocore.exceptions import NoCredentialsError

__all__ = [
    "CachedKeyS3SigV4Auth",
    "CachedKeySigV4Auth",
    "LeanSigner",
    "SignableHeaders",
    "SignableRequest",
]

#: Signing keys kept per signer: one per day is used; two cover a request made across midnight.
_KEYS_KEPT: Final = 2


class SignableHeaders:
    """The part of botocore's ``HTTPHeaders`` that SigV4 signing uses, on a plain dict.

    ``HTTPHeaders`` is an ``email.message.Message``: every lookup and assignment goes
    through the email package's header policy (about 10 sanitising calls per header per
    request). Names are case-insensitive here as there; botocore deletes a signing header
    before setting it, so replacing on assignment (instead of appending) is the same.
    """

    __slots__ = ("_items",)

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._items = {name.lower(): (name, value) for name, value in headers.items()}

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()][1]

    def __setitem__(self, name: str, value: str) -> None:
        self._items[name.lower()] = (name, value)

    def __delitem__(self, name: str) -> None:
        self._items.pop(name.lower(), None)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items.values())

    def items(self) -> list[tuple[str, str]]:
        """All headers, with their names as given."""
        return list(self._items.values())


class _Selected(dict[str, str]):
    """The headers to sign, by lower-cased name (what ``canonical_headers`` reads)."""

    def get_all(self, name: str) -> list[str]:
        return [self[name]]


class SignableRequest:
    """What botocore's SigV4 signers read from a request, and nothing more.

    botocore's ``AWSRequest`` prepares the whole request (URL, headers, body) each time the
    signer reads its ``body``; ours is bytes from the start and its headers a plain dict.
    """

    __slots__ = ("body", "context", "headers", "method", "params", "selected", "url")

    def __init__(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> None:
        self.method = method
        self.url = url
        self.headers = SignableHeaders(headers)
        self.body = body
        self.params: dict[str, str] = {}  # the query is in the URL
        self.context: dict[str, Any] = {}
        self.selected: _Selected | None = None


class _CachedKeyMixin:
    """Keeps botocore's ``signature()`` result but derives the signing key once per day."""

    credentials: Any
    _region_name: str
    _service_name: str

    def _signing_key(self, day: str) -> bytes:
        keys: dict[str, bytes] = self.__dict__.setdefault("_keys", {})
        key = keys.get(day)
        if key is None:
            # The same four HMACs as botocore's SigV4Auth.signature, in the same order.
            sign: Any = SigV4Auth._sign  # type: ignore[attr-defined]
            k_date = sign(self, f"AWS4{self.credentials.secret_key}".encode(), day)
            k_region = sign(self, k_date, self._region_name)
            k_service = sign(self, k_region, self._service_name)
            key = sign(self, k_service, "aws4_request")
            assert isinstance(key, bytes)
            if len(keys) >= _KEYS_KEPT:
                keys.clear()
            keys[day] = key
        return key

    def headers_to_sign(self, request: Any) -> Any:
        """botocore's selection, computed once per request (``add_auth`` asks twice, for
        the canonical request and for the Authorization header, with no change between),
        the host read from the URL once per origin."""
        if not isinstance(request, SignableRequest):
            return super().headers_to_sign(request)  # type: ignore[misc]
        selected = request.selected
        if selected is None:
            selected = _Selected()
            for lname, (_, value) in request.headers._items.items():
                if lname not in SIGNED_HEADERS_BLACKLIST:
                    selected[lname] = value
            if "host" not in selected:
                hosts: dict[str, str] = self.__dict__.setdefault("_hosts", {})
                url = request.url
                slash = url.find("/", url.find("//") + 2)
                origin = url if slash < 0 else url[:slash]
                host = hosts.get(origin)
                if host is None:
                    # botocore's own rule (default ports dropped, IPv6 bracketed).
                    host = hosts[origin] = botocore.auth._host_from_url(request.url)  # type: ignore[attr-defined]
                selected["host"] = host
            request.selected = selected
        return selected

    def signature(self, string_to_sign: str, request: Any) -> str:
        """botocore's signature, with the derived key reused within a day."""
        key = self._signing_key(request.context["timestamp"][0:8])
        sign: Any = SigV4Auth._sign  # type: ignore[attr-defined]
        sig: str = sign(self, key, string_to_sign, hex=True)
        return sig


class CachedKeySigV4Auth(_CachedKeyMixin, SigV4Auth):
    """botocore's ``SigV4Auth`` with the derived signing key cached per day."""


class CachedKeyS3SigV4Auth(_CachedKeyMixin, S3SigV4Auth):
    """botocore's ``S3SigV4Auth`` with the derived signing key cached per day."""


class LeanSigner:
    """Signs lean requests for one service and region with the generic client's credentials.

    ``credentials`` is botocore's (or aiobotocore's) credential object; ``None`` means the
    chain found none, and signing raises botocore's ``NoCredentialsError`` as the generic
    client would.

    Example::

        signer = LeanSigner(creds, signing_name="bedrock-agentcore", region="us-west-2")
        headers = await signer.sign("POST", url, {"Content-Type": "application/json"}, body)
    """

    def __init__(
        self, credentials: Any, *, signing_name: str, region: str, s3: bool = False
    ) -> None:
        self.signing_name = signing_name
        self.region = region
        self._credentials = credentials
        self._auth_class: type[SigV4Auth] = CachedKeyS3SigV4Auth if s3 else CachedKeySigV4Auth
        self._frozen: Any = None
        self._auth: SigV4Auth | None = None

    def __repr__(self) -> str:
        return f"LeanSigner(signing_name={self.signing_name!r}, region={self.region!r})"

    async def _current_auth(self) -> SigV4Auth:
        if self._credentials is None:
            raise NoCredentialsError()
        frozen = self._credentials.get_frozen_credentials()
        if not isinstance(frozen, tuple):  # aiobotocore's credentials refresh asynchronously
            frozen = await frozen
        if self._auth is None or frozen != self._frozen:
            # New credentials (first use, or a refresh): a new signer, so a new derived key.
            self._frozen = frozen
            self._auth = self._auth_class(frozen, self.signing_name, self.region)
        return self._auth

    async def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> list[tuple[str, str]]:
        """Sign one request; return all its headers, the signing ones included.

        Example::

            headers = await signer.sign("GET", "https://b.s3.amazonaws.com/k", {}, b"")
        """
        auth: Any = await self._current_auth()
        request = SignableRequest(method, url, headers, body)
        auth.add_auth(request)
        return request.headers.items()
