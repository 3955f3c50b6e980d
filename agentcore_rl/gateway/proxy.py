"""Proxy mode: the inference server renders; the gateway records what it fed the model (the
backend's capture flags, :mod:`.backends`) and strips the ids from the answer it relays."""

from __future__ import annotations

from typing import Final

from starlette.types import Send

from agentcore_rl.edge import Refusal
from agentcore_rl.gateway.backends import CHAT, COMPLETIONS, Backend, Capture
from agentcore_rl.gateway.call import Call, down_message, passed_on
from agentcore_rl.gateway.jsonio import dumps, loads
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamResponse

__all__ = ["ProxyMode"]

_DONE: Final = b"data: [DONE]"


class ProxyMode:
    """Serve calls through an OpenAI-compatible server that returns token ids (``backend``)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def serve(self, call: Call, send: Send) -> None:
        """Forward ``call`` upstream, capture its ids, answer the agent (see the module doc)."""
        endpoint = COMPLETIONS if call.text else CHAT
        stream = call.stream
        upstream_body, keep_logprobs = self.backend.prepare(dict(call.body), endpoint)
        payload = dumps(upstream_body)
        del upstream_body
        capture = Capture()
        # A stream's tokens are counted as they arrive: the resume after a suspend starts the
        # new version's span at the count (a whole answer's tokens keep the call's version).
        versions = call.versions
        versions.count = lambda: len(capture.ids.get(0, ()))
        pool = call.upstream
        target = pool.target("/completions" if call.text else "/chat/completions")
        try:
            if stream and self.backend.streams:
                call.gate.live.add(versions)
                async with pool.stream(target, payload) as response:
                    del payload
                    status = response.status
                    if status == 200:
                        await self._relay(send, response, call, capture, keep_logprobs, endpoint)
                        return
                    content = await response.read()
            else:  # the whole answer in one wake-up
                status, content = await pool.fetch(target, payload)
                del payload
        finally:
            call.gate.live.discard(versions)
        if status != 200:
            raise passed_on(status, content)
        try:  # not JSON, not an object (an AttributeError), or malformed
            data = loads(content)
            del content
            self.backend.take(data, capture, keep_logprobs, endpoint)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            message = f"upstream sent a malformed answer: {exc!r}"
            raise Refusal(502, message, "upstream_invalid") from None
        failed = self._fill(call, capture)
        if failed:
            raise Refusal(502, *failed)
        await call.answer(send, data)  # streamed too when the upstream cannot stream

    def _fill(self, call: Call, capture: Capture) -> tuple[str, str] | None:
        """The record's arrays from the capture, and where each version's tokens start;
        -> (what is wrong, its kind) when the upstream's answer falls short."""
        missing = capture.missing(self.backend)
        if missing:
            return missing, "upstream_missing_token_ids"
        try:
            capture.fill(call.record)
        except (ValueError, TypeError, OverflowError) as exc:
            return f"the upstream sent {exc}", "upstream_invalid"
        if call.record.completions:
            call.record.completions[0].versions = call.versions.recorded()
        return None

    async def _relay(
        self,
        send: Send,
        content: UpstreamResponse,
        call: Call,
        capture: Capture,
        keep_logprobs: bool,
        endpoint: str,
    ) -> None:
        """Forward the upstream's SSE events as they arrive, capturing and stripping each: the
        first event alone, as soon as it is read (time to first byte); after it, whatever
        arrived in one read in one write (under load the upstream's events coalesce)."""
        started = False
        unread: list[bytes] = []  # what arrived after the last complete event
        newline = False  # whether the last piece ended with a newline
        out: list[bytes] = []  # events not sent yet (held until a chunk carries token ids)
        done = False
        take, encoder = self.backend.take, call.encoder
        try:
            async for piece in content:
                ends = b"\n\n" in piece or (newline and piece[:1] == b"\n")
                newline = piece[-1:] == b"\n"
                unread.append(piece)
                if not ends:
                    continue
                pending = unread[0] if len(unread) == 1 else b"".join(unread)
                cut = pending.rfind(b"\n\n") + 2
                events, unread = pending[:cut], [pending[cut:]] if cut < len(pending) else []
                del pending
                for event in events.split(b"\n\n"):
                    if event.startswith(_DONE):
                        done = True
                    elif event.startswith(b"data:"):
                        with memoryview(event) as view:
                            data = loads(view[5:])
                        take(data, capture, keep_logprobs, endpoint)
                        out.append(encoder.chunk(data))
                    if not started and (capture.prompt is not None or capture.finish):
                        started = await self._start(send, capture, call)
                        first, out = b"".join(out), []
                        await send({"type": "http.response.body", "body": first, "more_body": True})
                if done:
                    break
                if started and out:
                    await send(
                        {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                    )
                    out = []
        except (UpstreamError, ValueError, TypeError, KeyError, AttributeError) as exc:
            if isinstance(exc, UpstreamError):
                message = down_message(call.upstream.base, exc)
            else:
                message = f"upstream sent an invalid stream event: {exc}"
            if not started:
                raise Refusal(502, message, "upstream_unavailable") from None
            call.commit(502, message)  # the headers are out: end the stream with an error event
            tail = encoder.fail(502, message, "upstream_unavailable")
            await send({"type": "http.response.body", "body": tail})
            return
        if not started:  # a stream without chunks
            await self._start(send, capture, call)
        await self._end_stream(send, out, capture, call)

    async def _start(self, send: Send, capture: Capture, call: Call) -> bool:
        # vLLM sends the prompt ids on the first chunk: without them, refuse before any byte
        if capture.prompt is None:
            what = capture.missing(self.backend) or "no prompt token ids"
            raise Refusal(502, what, "upstream_missing_token_ids")
        headers = call.encoder.stream_headers
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        return True

    async def _end_stream(self, send: Send, out: list[bytes], capture: Capture, call: Call) -> None:
        failed = self._fill(call, capture)
        if failed:
            call.commit(502, failed[0])
            tail = call.encoder.fail(502, *failed)
        else:
            call.commit(200)  # before the last byte: an envelope never overtakes its last record
            tail = call.encoder.end()
        await send({"type": "http.response.body", "body": b"".join(out) + tail})
