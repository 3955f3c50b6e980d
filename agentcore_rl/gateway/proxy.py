"""Proxy mode: the inference server renders; the gateway records what it fed the model.

The agent's request goes upstream with the backend's capture flags (:mod:`.backends`); the
answer (whole, or SSE event by event) comes back with the token ids and logprobs stripped
unless the agent asked for logprobs. The record is committed before the answer's last byte.
"""

from __future__ import annotations

from typing import Final

from starlette.types import Send

from agentcore_rl.gateway.backends import Backend, Capture, synthesize_sse
from agentcore_rl.gateway.call import (
    SSE_HEADERS,
    Call,
    Refuse,
    down_message,
    error_body,
    passed_on,
    respond,
    send_sse,
)
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
        endpoint = call.endpoint
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
        target = pool.target("/chat/completions" if endpoint != "completions" else "/completions")
        try:
            if stream and self.backend.streams:
                call.gate.live.add(versions)
                async with pool.stream(target, payload) as response:
                    del payload
                    status = response.status
                    if status == 200:
                        await self._relay(send, response, call, capture, keep_logprobs)
                        return
                    content = await response.read()
            else:  # the whole answer in one wake-up
                status, content = await pool.fetch(target, payload)
                del payload
        finally:
            call.gate.live.discard(versions)
        if status != 200:
            raise passed_on(status, content)
        data = self._whole(content, call, capture, keep_logprobs)
        del content
        call.commit(200)
        if stream:  # the upstream could not stream with capture on: the whole answer
            await send_sse(send, synthesize_sse(data, endpoint, call.include_usage))
        else:
            await respond(send, 200, dumps(data))

    def _whole(
        self, content: bytes, call: Call, capture: Capture, keep_logprobs: bool
    ) -> dict[str, object]:
        try:
            data = loads(content)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise Refuse(502, "upstream answered with invalid JSON", "upstream_invalid")
        try:
            self.backend.take(data, capture, keep_logprobs, call.endpoint)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            message = f"upstream sent a malformed answer: {exc!r}"
            raise Refuse(502, message, "upstream_invalid") from None
        failed = self._fill(call, capture)
        if failed:
            raise Refuse(502, *failed)
        return data

    def _fill(self, call: Call, capture: Capture) -> tuple[str, str] | None:
        """The record's arrays from the capture, and where each version's tokens start;
        -> (what is wrong, its kind) when the upstream's answer falls short."""
        missing = capture.missing(self.backend.name)
        if missing:
            return missing, "upstream_missing_token_ids"
        try:
            capture.fill(call.record)
        except (ValueError, TypeError, OverflowError) as exc:
            return f"the upstream sent {exc}", "upstream_invalid"
        if len(call.versions.starts) > 1 and call.record.completions:
            call.record.completions[0].versions = call.versions.starts
        return None

    async def _relay(
        self,
        send: Send,
        content: UpstreamResponse,
        call: Call,
        capture: Capture,
        keep_logprobs: bool,
    ) -> None:
        """Forward the upstream's SSE events as they arrive, capturing and stripping each.

        The first event goes out alone, as soon as it is read (time to first byte); after
        it, whatever arrived in one read goes out in one write: under load the upstream's
        one-write-per-event stream coalesces, and so do the gateway's writes.
        """
        started = False
        # What arrived after the last complete event, joined once an event ends in it.
        unread: list[bytes] = []
        newline = False  # whether the last piece ended with a newline
        held: list[bytes] = []  # events before the first chunk (none from vLLM)
        take, endpoint = self.backend.take, call.endpoint
        try:
            async for piece in content:
                ends = b"\n\n" in piece or (newline and piece[:1] == b"\n")
                newline = piece[-1:] == b"\n"
                unread.append(piece)
                if not ends:
                    continue
                pending = unread[0] if len(unread) == 1 else b"".join(unread)
                cut = pending.rfind(b"\n\n")
                events = pending[: cut + 2]
                unread = [pending[cut + 2 :]] if cut + 2 < len(pending) else []
                del pending
                out, held = held, []
                done = False
                for event in events.split(b"\n\n"):
                    if not event:
                        continue
                    if event.startswith(_DONE):
                        done = True
                        continue
                    if event.startswith(b"data:"):
                        with memoryview(event) as view:
                            data = loads(view[5:])
                        take(data, capture, keep_logprobs, endpoint)
                        out.append(b"data: ")
                        out.append(dumps(data))
                    else:
                        out.append(event)
                    out.append(b"\n\n")
                    if not started and (capture.prompt is not None or capture.finish):
                        # vLLM sends the prompt ids on the first chunk: refuse before any byte
                        if capture.prompt is None:
                            what = capture.missing(self.backend.name) or "no prompt token ids"
                            raise Refuse(502, what, "upstream_missing_token_ids")
                        started = True
                        await send(
                            {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
                        )
                        first, out = b"".join(out), []
                        await send({"type": "http.response.body", "body": first, "more_body": True})
                if not started:
                    if not done:
                        held = out
                        continue
                    missing = capture.missing(self.backend.name)  # a stream without chunks
                    if missing:
                        raise Refuse(502, missing, "upstream_missing_token_ids")
                    started = True
                    await send(
                        {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
                    )
                if done:
                    await self._end_stream(send, out, capture, call)
                    return
                if out:
                    await send(
                        {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                    )
        except (UpstreamError, ValueError, TypeError, KeyError, AttributeError) as exc:
            if isinstance(exc, UpstreamError):
                message = down_message(call.upstream.base, exc)
            else:
                message = f"upstream sent an invalid stream event: {exc}"
            if not started:
                raise Refuse(502, message, "upstream_unavailable") from None
            call.commit(502, message)  # the headers are out: end the stream with an error event
            tail = b"data: " + error_body(502, message, "upstream_unavailable") + b"\n\n"
            await send({"type": "http.response.body", "body": tail})
            return
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await self._end_stream(send, [*held, *unread], capture, call)

    async def _end_stream(self, send: Send, out: list[bytes], capture: Capture, call: Call) -> None:
        failed = self._fill(call, capture)
        if failed:
            call.commit(502, failed[0])
            tail = b"data: " + error_body(502, *failed) + b"\n\n"
        else:
            call.commit(200)  # before the last byte: an envelope never overtakes its last record
            tail = _DONE + b"\n\n"
        await send({"type": "http.response.body", "body": b"".join(out) + tail})
