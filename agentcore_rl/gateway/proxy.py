"""Proxy mode: the inference server renders. On a vLLM with its scale-out routes a chat call goes
through :mod:`.scale_out` (rendered, generated token-in, derendered: every token's version
vLLM's own); elsewhere the gateway records what the server's chat (or completions) route fed
the model (the backend's capture flags, :mod:`.backends`, on the way up; its ids and logprobs,
captured and stripped, on the way down) and relays the answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.types import Send

from agentcore_rl.edge import Refusal
from agentcore_rl.gateway import scale_out
from agentcore_rl.gateway.backends import CHAT, COMPLETIONS, Backend, passed_on
from agentcore_rl.gateway.call import Call, down_message
from agentcore_rl.gateway.jsonio import dumps, loads
from agentcore_rl.gateway.policy_gate import UNKNOWN
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamResponse
from agentcore_rl.trace import CallRecord, Completion, ids_array, logprob_array

__all__ = ["Capture", "ProxyMode", "prepare", "take"]


@dataclass(slots=True)
class Capture:
    """Token ids and logprobs gathered from one answer (or its chunks), for :meth:`fill`; per
    choice index: token ids, logprobs, finish reason, the stop string it ended on."""

    prompt: Any = None  # the first prompt ids seen, as the upstream sent them
    usage: dict[str, Any] | None = None
    ids: dict[int, list[Any]] = field(default_factory=dict)
    logprobs: dict[int, list[Any]] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    stop: dict[int, str] = field(default_factory=dict)

    def fill(self, record: CallRecord) -> None:
        """Put the arrays into ``record`` (ValueError/TypeError/OverflowError: not numbers)."""
        record.usage = self.usage
        record.prompt_ids = ids_array(self.prompt)
        record.completions = [
            Completion(
                i,
                ids_array(self.ids.get(i, [])),
                logprob_array(self.logprobs[i]),
                self.finish[i],
                self.stop.get(i),
            )
            for i in sorted(self.finish)
        ]

    def missing(self, backend: Backend) -> str | None:
        """What the upstream failed to return, in words, or None."""
        what = []
        if self.prompt is None:
            what.append("prompt token ids")
        if any(i not in self.ids for i in self.finish):
            what.append("completion token ids")
        elif any(len(self.ids[i]) != len(self.logprobs[i]) for i in self.finish):
            what.append("one logprob per completion token")
        if not what:
            return None
        return f"the {backend.name} upstream returned no {' and no '.join(what)}; {backend.hint}"


def prepare(backend: Backend, body: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], bool]:
    """Add ``backend``'s capture flags to ``body`` (a copy); -> (body, agent asked for logprobs)."""
    body.update(backend.flags)
    if not backend.streams:  # asked whole: the gateway streams the answer to the agent
        body.pop("stream", None)
        body.pop("stream_options", None)
    asked = body.get("logprobs")
    keep = bool(asked) if endpoint == CHAT else asked is not None
    if not keep:  # completions: 0, the sampled token's logprob only
        body["logprobs"] = True if endpoint == CHAT else 0
    return body, keep


def _vllm_tokens(choice: dict[str, Any], endpoint: str) -> tuple[Any, list[Any], Any]:
    """A vLLM choice's token ids, logprobs (floats) and stop string, its capture fields popped."""
    logprobs = choice.get("logprobs")
    key = "content" if endpoint == CHAT else "token_logprobs"
    items = (logprobs.get(key) if type(logprobs) is dict else None) or []
    if items and type(items[0]) is dict:  # chat: entries
        items = [float(e["logprob"]) for e in items]
    # vLLM names the stop string that cut the text inside the last token
    return choice.pop("token_ids", None), items, choice.get("stop_reason")


def _sglang_tokens(choice: dict[str, Any], endpoint: str) -> tuple[Any, list[Any], Any]:
    """The same from SGLang's ``meta_info``."""
    meta = choice.pop("meta_info", None)
    entries = meta.get("output_token_logprobs") if isinstance(meta, Mapping) else None
    if entries is None:
        return None, [], None
    return [e[1] for e in entries], [float(e[0]) for e in entries], None


_TOKENS: Final = {"vllm": _vllm_tokens, "sglang": _sglang_tokens}


def take(
    backend: Backend, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
) -> None:
    """Read ids and logprobs from an answer or a chunk, stripping them in place."""
    tokens = _TOKENS[backend.name]
    prompt = data.pop("prompt_token_ids", None)  # vLLM chat: at the root
    if capture.prompt is None:  # the first prompt ids seen
        capture.prompt = prompt
    for ch in data.get("choices") or ():
        prompt = ch.pop("prompt_token_ids", None)  # per choice
        if capture.prompt is None:
            capture.prompt = prompt
        i, finish = int(ch.get("index", 0)), ch.get("finish_reason")
        ids, logprobs, stop = tokens(ch, endpoint)
        if ids is not None:
            capture.ids.setdefault(i, []).extend(ids)
        capture.logprobs.setdefault(i, []).extend(logprobs)
        if finish is not None or i not in capture.finish:
            capture.finish[i] = finish
        if type(stop) is str:
            capture.stop[i] = stop
        if not keep_logprobs:
            ch["logprobs"] = None
    usage = data.get("usage")
    if isinstance(usage, dict):
        capture.usage = usage


class ProxyMode:
    """Serve calls through an OpenAI-compatible server that returns token ids (``backend``)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def serve(self, call: Call, send: Send) -> None:
        """Serve ``call`` through vLLM's scale-out routes where it has them (one choice; a
        stream without stop strings, which only the chat route holds back), else forward it
        to the chat route, capture its ids, answer the agent (see the module doc)."""
        backend, body = self.backend, call.body
        if (
            backend.name == "vllm"
            and not call.text
            and body.get("n") in (None, 1)
            and not (call.stream and body.get("stop"))
            and backend.sources.get(call.upstream.base) != "gateway"
        ):
            rendered = await scale_out.render(call, backend)
            if rendered is not None:
                await scale_out.serve(call, send, backend, rendered)
                return
        endpoint = COMPLETIONS if call.text else CHAT
        stream = call.stream
        upstream_body, keep_logprobs = prepare(self.backend, dict(call.body), endpoint)
        payload = dumps(upstream_body)
        del upstream_body
        capture = Capture()
        # A stream's tokens are counted as they arrive: those before a suspend's resume are
        # the old version's; a whole answer's are all unknown when a resume comes during it.
        versions, resumes = call.versions, call.gate.resumes
        if resumes != versions.since:  # sent after an update that came since it was admitted
            versions.start(0, call.gate.version)
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
                if call.gate.resumes != resumes:
                    versions.start(0, UNKNOWN)
        finally:
            call.gate.live.discard(versions)
        if status != 200:
            raise passed_on(status, content)
        try:  # not JSON, not an object (an AttributeError), or malformed
            data = loads(content)
            del content
            take(self.backend, data, capture, keep_logprobs, endpoint)
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
        out: list[bytes] = []  # events not sent yet (held until a chunk carries token ids)
        backend, encoder = self.backend, call.encoder
        try:
            async for events in content.events():
                for event in events:
                    data = loads(event)
                    take(backend, data, capture, keep_logprobs, endpoint)
                    out.append(encoder.chunk(data))
                    if not started and (capture.prompt is not None or capture.finish):
                        started = await self._start(send, capture, call)
                        first, out = b"".join(out), []
                        await send({"type": "http.response.body", "body": first, "more_body": True})
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
