"""The lean S3 reader: GetObject and ListObjectsV2 without botocore's per-request machinery.

Built from a generic aiobotocore S3 client, it resolves each bucket's endpoint and auth
scheme once through that client's endpoint ruleset (so ``endpoint_url``,
``AWS_ENDPOINT_URL_S3``, path or virtual-host addressing, FIPS/dual-stack settings all
apply), signs with botocore's ``S3SigV4Auth`` and sends through the client's own connection
pool. Answers are read minimally: GetObject is its body; ListObjectsV2 is its keys and
continuation token. Error answers raise the exceptions the generic client raises (``NoSuchKey``,
``NoSuchBucket``, ``SlowDown``... with the same ``response``).

What the lean path does not reproduce it hands to the generic client, per bucket: an auth
scheme other than plain SigV4 (S3 Express, multi-region access points) and a bucket in
another region (botocore's redirect handling).

Example::

    reader = await LeanS3.create(generic_s3_client)
    body = await reader.get_object("rollouts", "exp/q-1/sid.json")
    page = await reader.list_objects_v2("rollouts", "exp/")
    await reader.aclose()
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote_plus

from botocore.exceptions import ClientError
from botocore.utils import percent_encode, percent_encode_sequence

from agentcore_rl.aws.http import LeanHttp, LeanUnsupported, join_url
from agentcore_rl.aws.signing import LeanSigner

__all__ = ["LeanS3", "ListPage"]

_KEY: Final = re.compile(rb"<Key>([^<]*)</Key>")
_TOKEN: Final = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
_TRUNCATED: Final = b"<IsTruncated>true</IsTruncated>"
_URL_ENCODED: Final = b"<EncodingType>url</EncodingType>"
# What S3 answers when the request went to the wrong region: botocore's redirector resends.
_REDIRECT_CODES: Final = frozenset({"PermanentRedirect", "AuthorizationHeaderMalformed"})
_REDIRECT_STATUS: Final = frozenset({301, 302, 307})


@dataclass(frozen=True)
class ListPage:
    """One ListObjectsV2 page: its keys in order and the token of the next page (``None``
    on the last page).

    Example::

        page = await reader.list_objects_v2("rollouts", "exp/")
        while page.next_token:
            page = await reader.list_objects_v2("rollouts", "exp/", token=page.next_token)
    """

    keys: list[str]
    next_token: str | None


@dataclass(frozen=True)
class _Route:
    """How one bucket is reached: its endpoint and signer, or ``None`` for the generic client."""

    base_url: str
    signer: LeanSigner | None


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8")
    return html.unescape(text) if "&" in text else text


def parse_list_page(body: bytes) -> ListPage:
    """Keys and continuation token of a ListObjectsV2 answer (``encoding-type=url`` keys
    decoded when the answer says so, as botocore does).

    Example::

        parse_list_page(b"<ListBucketResult><Key>a</Key></ListBucketResult>").keys  # ["a"]
    """
    keys = [_text(k) for k in _KEY.findall(body)]
    if _URL_ENCODED in body:
        keys = [unquote_plus(k) for k in keys]
    token = None
    if _TRUNCATED in body:
        match = _TOKEN.search(body)
        token = _text(match.group(1)) if match else None
    return ListPage(keys, token)


class LeanS3:
    """GetObject and ListObjectsV2 on the generic client's settings, at a fraction of its CPU.

    ``client`` is an open aiobotocore S3 client; it must outlive this object, which uses it
    to resolve endpoints, parse error answers, and serve what the lean path does not.

    Example::

        async with session.create_client("s3", config=config) as client:
            reader = await LeanS3.create(client)
            try:
                data = await reader.get_object("rollouts", key)
            finally:
                await reader.aclose()
    """

    def __init__(self, client: Any, http: LeanHttp) -> None:
        self._client = client
        self._http = http
        self._credentials = client._request_signer._credentials
        self._routes: dict[str, _Route] = {}
        self._get_model = client.meta.service_model.operation_model("GetObject")
        self._signers: dict[tuple[str, str], LeanSigner] = {}

    def __repr__(self) -> str:
        return f"LeanS3(region={self._client.meta.region_name!r})"

    @classmethod
    async def create(cls, client: Any) -> LeanS3:
        """A lean reader on ``client``'s settings.

        Example::

            reader = await LeanS3.create(client)
        """
        http = LeanHttp.from_client(client)
        await http.warm(client.meta.endpoint_url)
        return cls(client, http)

    async def aclose(self) -> None:
        """Release what the reader holds (the pool is the generic client's). Idempotent.

        Example::

            await reader.aclose()
        """
        await self._http.aclose()

    async def _route(self, bucket: str) -> _Route:
        route = self._routes.get(bucket)
        if route is not None:
            return route
        # The ruleset's answer depends on the bucket, not the key or prefix (S3's ruleset
        # declares Key and Prefix but no rule reads them), so one resolution per bucket.
        endpoint = self._client._ruleset_resolver.construct_endpoint(
            self._get_model, {"Bucket": bucket}, {}
        )
        if not hasattr(endpoint, "url"):
            endpoint = await endpoint
        schemes = endpoint.properties.get("authSchemes") or [{}]
        scheme = schemes[0]
        signer = None
        if scheme.get("name") == "sigv4":
            name = scheme.get("signingName", "s3")
            region = scheme.get("signingRegion") or self._client.meta.region_name
            signer = self._signers.get((name, region))
            if signer is None:
                signer = LeanSigner(self._credentials, signing_name=name, region=region, s3=True)
                self._signers[(name, region)] = signer
        route = _Route(endpoint.url, signer)
        self._routes[bucket] = route
        return route

    async def _request(self, operation: str, bucket: str, url: str) -> bytes:
        route = await self._route(bucket)
        assert route.signer is not None
        signed = await route.signer.sign("GET", url, {}, b"")
        status, response_headers, body = await self._http.send("GET", url, signed, b"")
        if status >= 300:
            try:
                await self._http.raise_error(
                    self._client, operation, status, response_headers, body
                )
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if status in _REDIRECT_STATUS or code in _REDIRECT_CODES:
                    # Another region: from now on the generic client (and its redirector).
                    self._routes[bucket] = _Route(route.base_url, None)
                    raise LeanUnsupported(f"bucket {bucket} is in another region") from exc
                raise
        return body

    async def get_object(self, bucket: str, key: str) -> bytes:
        """The object's body, as stored. Raises the generic client's ``ClientError``s.

        Example::

            body = await reader.get_object("rollouts", "exp/q-1/sid.json")
        """
        route = await self._route(bucket)
        if route.signer is not None:
            url = join_url(route.base_url, "/" + percent_encode(key, safe="/~"))
            try:
                return await self._request("GetObject", bucket, url)
            except LeanUnsupported:
                pass
        response = await self._client.get_object(Bucket=bucket, Key=key)
        async with response["Body"] as stream:
            data: bytes = await stream.read()
        return data

    async def list_objects_v2(
        self,
        bucket: str,
        prefix: str,
        *,
        start_after: str | None = None,
        token: str | None = None,
        max_keys: int | None = None,
    ) -> ListPage:
        """One page (up to ``max_keys``, by default S3's 1,000 keys) under ``prefix``,
        after ``start_after`` or from the continuation ``token`` of the previous page.

        Example::

            page = await reader.list_objects_v2("rollouts", "exp/", start_after="exp/a")
        """
        route = await self._route(bucket)
        if route.signer is not None:
            # botocore's order of query parameters; keys come back URL-encoded, as botocore
            # asks, so that any key survives XML.
            query: dict[str, str] = {"list-type": "2", "prefix": prefix}
            if token is not None:
                query["continuation-token"] = token
            if start_after is not None:
                query["start-after"] = start_after
            query["encoding-type"] = "url"
            if max_keys is not None:
                query["max-keys"] = str(max_keys)
            url = join_url(route.base_url, "/") + "?" + percent_encode_sequence(query)
            try:
                return parse_list_page(await self._request("ListObjectsV2", bucket, url))
            except LeanUnsupported:
                pass
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token is not None:
            params["ContinuationToken"] = token
        if start_after is not None:
            params["StartAfter"] = start_after
        if max_keys is not None:
            params["MaxKeys"] = max_keys
        page = await self._client.list_objects_v2(**params)
        keys = [item["Key"] for item in page.get("Contents", ())]
        return ListPage(
            keys, page.get("NextContinuationToken") if page.get("IsTruncated") else None
        )
