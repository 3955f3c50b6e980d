"""SigV4 for the lean request path: botocore's algorithm, with what does not change per
request worked out once.

The canonical request, string to sign and ``Authorization`` header are the ones botocore's
:class:`~botocore.auth.SigV4Auth` (or :class:`~botocore.auth.S3SigV4Auth` for S3) makes for
the same request at the same instant (a test checks them against botocore's signer). Kept
from botocore: its signer object per set of frozen credentials (rebuilt on a refresh), its
clock and timestamp format, its path normalisation (once per path), its host rule (once
per origin), its list of unsigned headers and its HMAC key derivation (once per day).
What is not paid per request any more: botocore's request object and ``HTTPHeaders`` (an
``email.message.Message``: about ten header-policy calls per header), the body read back
through the request preparation, the headers selected twice, and the logging calls.

Credentials come from the generic client's credential object, so the chain, expiry and
refresh are botocore's: ``get_frozen_credentials()`` refreshes before expiry.

Example::

    signer = LeanSigner(credentials, signing_name="s3", region="us-west-2", s3=True)
    headers = await signer.sign("GET", url, {"User-Agent": ua}, b"")
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

import botocore.auth
from botocore.auth import SIGNED_HEADERS_BLACKLIST, SIGV4_TIMESTAMP, S3SigV4Auth, SigV4Auth
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import NoCredentialsError

__all__ = ["CachedKeyS3SigV4Auth", "CachedKeySigV4Auth", "LeanSigner"]

#: Signing keys kept per signer: one per day is used; two cover a request made across midnight.
_KEYS_KEPT: Final = 2
#: Canonical paths kept per (non-S3) signer: a runtime has two (cleared when full).
_PATHS_KEPT: Final = 64
#: Headers SigV4 never signs (botocore's list).
_UNSIGNED: Final = tuple(SIGNED_HEADERS_BLACKLIST)
_EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()


def _trim(value: str) -> str:
    """SigV4's Trimall, as botocore's ``_header_value``."""
    return " ".join(value.split())


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
        self._s3 = s3
        self._paths: dict[str, str] = {}
        self._hosts: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"LeanSigner(signing_name={self.signing_name!r}, region={self.region!r})"

    async def _current_auth(self) -> SigV4Auth:
        credentials = self._credentials
        if credentials is None:
            raise NoCredentialsError()
        auth = self._auth
        if auth is not None and not isinstance(credentials, RefreshableCredentials):
            # Static keys: the frozen copy stays right while the three values do (checked
            # each time; no coroutine per request, which aiobotocore's getter is).
            frozen = self._frozen
            if (credentials.access_key, credentials.secret_key, credentials.token) == (
                frozen.access_key,
                frozen.secret_key,
                frozen.token,
            ):
                return auth
        frozen = credentials.get_frozen_credentials()
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
        # botocore's clock (a test freezes it there), botocore's timestamp format.
        now = botocore.auth.get_current_datetime()  # type: ignore[attr-defined]
        stamp = now.strftime(SIGV4_TIMESTAMP)
        day = stamp[0:8]
        path, query, host = self._split(auth, url)
        frozen = self._frozen
        payload = _EMPTY_SHA256 if not body else hashlib.sha256(body).hexdigest()
        out = list(headers.items())
        out.append(("X-Amz-Date", stamp))
        signing = {name.lower(): value for name, value in out}
        signing["host"] = host
        if frozen.token:
            out.append(("X-Amz-Security-Token", frozen.token))
            signing["x-amz-security-token"] = frozen.token
        if self._s3:
            out.append(("X-Amz-Content-SHA256", payload))
            signing["x-amz-content-sha256"] = payload
        for name in _UNSIGNED:
            signing.pop(name, None)
        names = sorted(signing)
        signed_headers = ";".join(names)
        canonical = "\n".join(
            (
                method,
                path,
                query,
                "".join(f"{name}:{_trim(signing[name])}\n" for name in names),
                signed_headers,
                payload,
            )
        )
        scope = f"{day}/{self.region}/{self.signing_name}/aws4_request"
        string_to_sign = (
            f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        )
        signature = hmac.new(
            auth._signing_key(day), string_to_sign.encode(), hashlib.sha256
        ).hexdigest()
        out.append(
            (
                "Authorization",
                f"AWS4-HMAC-SHA256 Credential={frozen.access_key}/{scope}, "
                f"SignedHeaders={signed_headers}, Signature={signature}",
            )
        )
        return out

    def _split(self, auth: Any, url: str) -> tuple[str, str, str]:
        """The canonical path, canonical query and signed host of ``url``."""
        base, _, query = url.partition("?")
        slash = base.find("/", base.find("//") + 2)
        origin, path = (base, "/") if slash < 0 else (base[:slash], base[slash:])
        host = self._hosts.get(origin)
        if host is None:
            # botocore's rule (default ports dropped, IPv6 bracketed), once per origin.
            host = self._hosts[origin] = botocore.auth._host_from_url(origin)  # type: ignore[attr-defined]
        if not self._s3:
            # SigV4 (not S3) normalises and encodes the path again: botocore's own code,
            # once per path (a runtime has two).
            canonical = self._paths.get(path)
            if canonical is None:
                if len(self._paths) >= _PATHS_KEPT:
                    self._paths.clear()
                canonical = self._paths[path] = auth._normalize_url_path(path)
            path = canonical
        if query:
            # botocore's _canonical_query_string_url: pairs sorted by encoded key, then value.
            pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
            query = "&".join(f"{key}={value}" for key, value in pairs)
        return path, query, host
