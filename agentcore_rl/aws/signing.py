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

from collections.abc import Mapping
from typing import Any, Final

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import NoCredentialsError

__all__ = ["CachedKeyS3SigV4Auth", "CachedKeySigV4Auth", "LeanSigner", "SignableRequest"]

#: Signing keys kept per signer: one per day is used; two cover a request made across midnight.
_KEYS_KEPT: Final = 2


class SignableRequest(AWSRequest):  # type: ignore[misc]
    """An ``AWSRequest`` whose body is already the bytes to send.

    botocore's ``AWSRequest.body`` prepares the whole request (URL, headers, body) each time
    the signer reads it; ours is bytes from the start, so it is returned as is.
    """

    @property
    def body(self) -> bytes:
        """The request body (bytes, possibly empty)."""
        data: bytes = self.data or b""
        return data


class _CachedKeyMixin:
    """Keeps botocore's ``signature()`` result but derives the signing key once per day."""

    credentials: Any
    _region_name: str
    _service_name: str
    _keys: dict[str, bytes]

    def _signing_key(self, day: str) -> bytes:
        keys = self.__dict__.setdefault("_keys", {})
        key: bytes | None = keys.get(day)
        if key is None:
            # The same four HMACs as botocore's SigV4Auth.signature, in the same order.
            sign = SigV4Auth._sign
            k_date = sign(self, f"AWS4{self.credentials.secret_key}".encode(), day)
            k_region = sign(self, k_date, self._region_name)
            k_service = sign(self, k_region, self._service_name)
            key = sign(self, k_service, "aws4_request")
            if len(keys) >= _KEYS_KEPT:
                keys.clear()
            keys[day] = key
        return key

    def headers_to_sign(self, request: Any) -> Any:
        """botocore's selection, computed once per request: ``add_auth`` asks twice (for
        the canonical request and for the Authorization header) with no change between."""
        selected = request.context.get("lean_headers_to_sign")
        if selected is None:
            selected = super().headers_to_sign(request)  # type: ignore[misc]
            request.context["lean_headers_to_sign"] = selected
        return selected

    def signature(self, string_to_sign: str, request: Any) -> str:
        """botocore's signature, with the derived key reused within a day."""
        key = self._signing_key(request.context["timestamp"][0:8])
        sig: str = SigV4Auth._sign(self, key, string_to_sign, hex=True)
        return sig


class CachedKeySigV4Auth(_CachedKeyMixin, SigV4Auth):  # type: ignore[misc]
    """botocore's ``SigV4Auth`` with the derived signing key cached per day."""


class CachedKeyS3SigV4Auth(_CachedKeyMixin, S3SigV4Auth):  # type: ignore[misc]
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
        auth = await self._current_auth()
        request = SignableRequest(method=method, url=url, headers=headers, data=body)
        auth.add_auth(request)
        return list(request.headers.items())
