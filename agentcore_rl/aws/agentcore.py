"""The lean AgentCore Runtime data plane: InvokeAgentRuntime and StopRuntimeSession for
one runtime ARN, without botocore's per-request machinery.

Built from a generic aiobotocore ``bedrock-agentcore`` client: the endpoint comes from its
ruleset (so ``endpoint_url`` and ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE`` apply), requests
are signed with botocore's ``SigV4Auth`` on its credentials, and error answers raise the
exceptions it raises (``ThrottlingException``, ``ValidationException``... with the same
``response``). The URLs, which depend only on the ARN and qualifier, are built once.

Example::

    runtime = await LeanAgentCore.create(generic_client, arn)
    answer = await runtime.invoke(session_id, b'{"prompt": "hi"}')   # the agent's bytes
    await runtime.stop(session_id)
    await runtime.aclose()
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

from botocore.utils import percent_encode, percent_encode_sequence

from agentcore_rl.aws.http import LeanHttp, LeanUnsupported, join_url
from agentcore_rl.aws.signing import LeanSigner

__all__ = ["LeanAgentCore"]

#: The header that carries the session id on both operations.
SESSION_HEADER: Final = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
_JSON: Final = "application/json"


class LeanAgentCore:
    """Invoke and stop sessions of one AgentCore runtime on a generic client's settings.

    ``client`` is an open aiobotocore ``bedrock-agentcore`` client; it must outlive this
    object (its parser and exception classes serve the error answers).

    Example::

        runtime = await LeanAgentCore.create(client, arn, qualifier="DEFAULT")
        try:
            body = await runtime.invoke(sid, json.dumps(payload).encode())
        finally:
            await runtime.aclose()
    """

    def __init__(
        self,
        client: Any,
        http: LeanHttp,
        signer: LeanSigner,
        *,
        endpoint_url: str,
        agent_runtime_arn: str,
        qualifier: str | None = None,
    ) -> None:
        self.agent_runtime_arn = agent_runtime_arn
        self.qualifier = qualifier
        self.endpoint_url = endpoint_url
        self._client = client
        self._http = http
        self._signer = signer
        # botocore encodes the ARN as a (non-greedy) URI label: every ":" and "/" escaped.
        base = join_url(endpoint_url, f"/runtimes/{percent_encode(agent_runtime_arn)}")
        query = "" if qualifier is None else "?" + percent_encode_sequence({"qualifier": qualifier})
        self.invoke_url = f"{base}/invocations{query}"
        self.stop_url = f"{base}/stopruntimesession{query}"

    def __repr__(self) -> str:
        return f"LeanAgentCore(agent_runtime_arn={self.agent_runtime_arn!r})"

    @classmethod
    async def create(
        cls, client: Any, agent_runtime_arn: str, *, qualifier: str | None = None
    ) -> LeanAgentCore:
        """A lean runtime client on ``client``'s settings; ``LeanUnsupported`` if the
        client signs with something other than SigV4.

        Example::

            runtime = await LeanAgentCore.create(client, arn)
        """
        model = client.meta.service_model.operation_model("InvokeAgentRuntime")
        endpoint = client._ruleset_resolver.construct_endpoint(
            model, {"agentRuntimeArn": agent_runtime_arn}, {}
        )
        if not hasattr(endpoint, "url"):
            endpoint = await endpoint
        request_signer = client._request_signer
        name, region = request_signer.signing_name, request_signer.region_name
        schemes = endpoint.properties.get("authSchemes")
        if schemes:
            scheme = schemes[0]
            if scheme.get("name") != "sigv4":
                raise LeanUnsupported(f"auth scheme {scheme.get('name')!r}")
            name = scheme.get("signingName", name)
            region = scheme.get("signingRegion", region)
        elif request_signer.signature_version != "v4":
            raise LeanUnsupported(f"signature version {request_signer.signature_version!r}")
        signer = LeanSigner(request_signer._credentials, signing_name=name, region=region)
        http = LeanHttp.from_client(client)
        await http.warm(endpoint.url)
        return cls(
            client,
            http,
            signer,
            endpoint_url=endpoint.url,
            agent_runtime_arn=agent_runtime_arn,
            qualifier=qualifier,
        )

    async def aclose(self) -> None:
        """Release what the runtime client holds (the pool is the generic client's).
        Idempotent.

        Example::

            await runtime.aclose()
        """
        await self._http.aclose()

    async def _post(self, operation: str, url: str, headers: dict[str, str], body: bytes) -> bytes:
        signed = await self._signer.sign("POST", url, headers, body)
        status, response_headers, answer = await self._http.send("POST", url, signed, body)
        if status >= 300:
            await self._http.raise_error(self._client, operation, status, response_headers, answer)
        return answer

    async def invoke(
        self, session_id: str, payload: bytes, *, content_type: str = _JSON, accept: str = _JSON
    ) -> bytes:
        """``InvokeAgentRuntime``: send ``payload``; return the agent's answer body, whole.

        Raises what the generic client raises: ``ClientError`` subclasses for error answers,
        botocore's connection and timeout errors for transport failures.

        Example::

            body = await runtime.invoke(sid, b'{"prompt": "hi"}')
        """
        headers = {SESSION_HEADER: session_id, "Content-Type": content_type, "Accept": accept}
        return await self._post("InvokeAgentRuntime", self.invoke_url, headers, payload)

    async def stop(self, session_id: str) -> None:
        """``StopRuntimeSession``, with a fresh idempotency token as botocore sends.

        Example::

            await runtime.stop(sid)
        """
        body = json.dumps({"clientToken": str(uuid.uuid4())}).encode()
        headers = {SESSION_HEADER: session_id, "Content-Type": _JSON}
        await self._post("StopRuntimeSession", self.stop_url, headers, body)
