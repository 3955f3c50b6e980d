"""How each inference server is asked for token ids and logprobs, and how they are read back.

A backend adds its capture flags to the request, then takes the ids and logprobs out of the
answer (non-streaming, or one SSE chunk at a time) and strips what the agent did not ask
for, so the agent receives a plain OpenAI answer.

- ``vllm`` (>= 0.10.2): ``return_token_ids: true`` gives ``prompt_token_ids`` (chat: at the
  root; completions: on each choice) and ``token_ids`` on each choice or streamed chunk;
  ``logprobs`` gives ``choices[i].logprobs.content[j].logprob`` (chat) or
  ``choices[i].logprobs.token_logprobs`` (completions).
- ``sglang``: ``return_prompt_token_ids`` and ``return_meta_info`` give
  ``choices[i].prompt_token_ids`` and ``choices[i].meta_info.output_token_logprobs``
  (``[logprob, token_id, text]`` per token). SGLang refuses these flags when streaming, so
  the gateway asks it without streaming and streams the answer to the agent itself.

Example::

    backend = backend_named("vllm")
    upstream_body, keep_logprobs = backend.prepare(dict(body), "chat.completions")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from agentcore_rl.gateway.jsonio import loads
from agentcore_rl.gateway.record import CallRecord, Completion, ids_array, logprob_array

__all__ = ["Backend", "Capture", "SGLangBackend", "VLLMBackend", "backend_named", "synthesize_sse"]

CHAT: Final = "chat.completions"
COMPLETIONS: Final = "completions"


class Capture:
    """Token ids and logprobs gathered from one answer (or its stream of chunks), turned
    into the record's arrays by :meth:`fill`.

    Example::

        capture = Capture("chat.completions")
        backend.take_response(answer, capture, keep_logprobs=False, endpoint=capture.endpoint)
        capture.missing("vllm") or capture.fill(record)
    """

    __slots__ = ("endpoint", "finish", "ids", "logprobs", "prompt", "stop", "usage")

    def __init__(self, endpoint: str = CHAT) -> None:
        self.endpoint = endpoint
        self.prompt: Any = None  # the first prompt ids seen, as the upstream sent them
        self.usage: dict[str, Any] | None = None
        # per choice index: token ids, logprobs, finish reason, the stop string it ended on
        self.ids: dict[int, list[Any]] = {}
        self.logprobs: dict[int, list[Any]] = {}
        self.finish: dict[int, str | None] = {}
        self.stop: dict[int, str] = {}

    def set_prompt(self, ids: Any) -> None:
        """Keep the first prompt ids seen."""
        if self.prompt is None:
            self.prompt = ids

    def parse(self, content: bytes, offset: int = 0) -> Any:
        """``content[offset:]`` parsed (``ValueError`` when it is not JSON)."""
        if offset:
            with memoryview(content) as view:
                return loads(view[offset:])
        return loads(content)

    def take(self, index: int, ids: Any, logprobs: list[Any], finish: Any, stop: Any) -> None:
        """One choice's (part of) token ids and logprobs (chat entries or floats)."""
        if ids is not None:
            self.ids.setdefault(index, []).extend(ids)
        if logprobs and type(logprobs[0]) is dict:
            logprobs = [float(e["logprob"]) for e in logprobs]
        self.logprobs.setdefault(index, []).extend(logprobs)
        if finish is not None or index not in self.finish:
            self.finish[index] = finish
        if type(stop) is str:
            self.stop[index] = stop

    def fill(self, record: CallRecord) -> None:
        """Put the captured ids and logprobs into ``record`` (``ValueError``/``TypeError``/
        ``OverflowError`` when the upstream sent something else than ids and numbers)."""
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

    def missing(self, backend: str) -> str | None:
        """What the upstream failed to return, in words, or None when nothing is missing."""
        what = []
        if self.prompt is None:
            what.append("prompt token ids")
        if any(i not in self.ids for i in self.finish):
            what.append("completion token ids")
        elif any(len(self.ids[i]) != len(self.logprobs[i]) for i in self.finish):
            what.append("one logprob per completion token")
        if not what:
            return None
        hint = (
            "is it vLLM >= 0.10.2 (which returns them for return_token_ids=true)?"
            if backend == "vllm"
            else "does this SGLang accept return_prompt_token_ids and return_meta_info?"
        )
        return f"the {backend} upstream returned no {' and no '.join(what)}; {hint}"


class Backend:
    """The capture protocol of one kind of inference server (see the module doc)."""

    name = "?"
    #: Whether the upstream can stream while returning token ids.
    streams = True

    def prepare(self, body: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], bool]:
        """Add the capture flags to ``body`` (a copy); -> (body, agent asked for logprobs)."""
        raise NotImplementedError

    def take_response(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        """Read ids and logprobs from a whole answer, stripping the capture fields in place."""
        raise NotImplementedError

    def take_chunk(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        """Read ids and logprobs from one streamed chunk, stripping the capture fields."""
        raise NotImplementedError


class VLLMBackend(Backend):
    """vLLM >= 0.10.2 with ``return_token_ids``."""

    name = "vllm"

    def prepare(self, body: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], bool]:
        body["return_token_ids"] = True
        if endpoint == CHAT:
            keep = bool(body.get("logprobs"))
            if not keep:
                body["logprobs"] = True
        else:
            keep = body.get("logprobs") is not None
            if not keep:
                body["logprobs"] = 0  # the sampled token's logprob only
        return body, keep

    def take_response(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        self.take_chunk(data, capture, keep_logprobs, endpoint)

    def take_chunk(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        # Once per stream event: plain dict operations.
        root_prompt = data.pop("prompt_token_ids", None)
        if root_prompt is not None:  # chat: at the root
            capture.set_prompt(root_prompt)
        key = "content" if endpoint == CHAT else "token_logprobs"
        for ch in data.get("choices") or ():
            prompt = ch.pop("prompt_token_ids", None)
            if prompt is not None:  # completions: per choice
                capture.set_prompt(prompt)
            logprobs = ch.get("logprobs")
            items = logprobs.get(key) if type(logprobs) is dict else None
            # vLLM names the stop string that cut the text inside the last token
            capture.take(
                int(ch.get("index", 0)),
                ch.pop("token_ids", None),
                items or [],
                ch.get("finish_reason"),
                ch.get("stop_reason"),
            )
            if not keep_logprobs:
                ch["logprobs"] = None
        usage = data.get("usage")
        if isinstance(usage, dict):
            capture.usage = usage


class SGLangBackend(Backend):
    """SGLang's OpenAI server with ``return_prompt_token_ids`` and ``return_meta_info``."""

    name = "sglang"
    streams = False

    def prepare(self, body: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], bool]:
        body["return_prompt_token_ids"] = True
        body["return_meta_info"] = True
        body.pop("stream", None)
        body.pop("stream_options", None)
        keep = bool(body.get("logprobs"))
        if not keep:
            body["logprobs"] = True if endpoint == CHAT else 0
        return body, keep

    def take_response(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        root_prompt = data.pop("prompt_token_ids", None)
        if root_prompt is not None:
            capture.set_prompt(root_prompt)
        for ch in data.get("choices") or ():
            prompt = ch.pop("prompt_token_ids", None)
            if prompt is not None:
                capture.set_prompt(prompt)
            meta = ch.pop("meta_info", None)
            entries = meta.get("output_token_logprobs") if isinstance(meta, Mapping) else None
            capture.take(
                int(ch.get("index", 0)),
                None if entries is None else [e[1] for e in entries],
                [] if entries is None else [float(e[0]) for e in entries],
                ch.get("finish_reason"),
                None,
            )
            if not keep_logprobs:
                ch["logprobs"] = None
        usage = data.get("usage")
        if isinstance(usage, dict):
            capture.usage = usage

    def take_chunk(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        raise NotImplementedError("SGLang is asked without streaming")


_BACKENDS: Final[dict[str, type[Backend]]] = {"vllm": VLLMBackend, "sglang": SGLangBackend}


def backend_named(name: str) -> Backend:
    """The backend called ``name`` (``vllm`` or ``sglang``)."""
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}") from None


def synthesize_sse(data: Mapping[str, Any], endpoint: str, include_usage: bool) -> bytes:
    """A whole (already stripped) answer as an OpenAI SSE stream: one chunk per choice.

    Used when the upstream cannot stream with capture on (SGLang): the agent still gets a
    valid stream, in one piece.
    """
    head = {
        "id": data.get("id", ""),
        "object": "chat.completion.chunk" if endpoint == CHAT else "text_completion",
        "created": data.get("created", 0),
        "model": data.get("model", ""),
    }
    parts = []
    for ch in data.get("choices") or ():
        if endpoint == CHAT:
            message = dict(ch.get("message") or {})
            for i, call in enumerate(message.get("tool_calls") or ()):
                call.setdefault("index", i)
            choice = {"index": ch.get("index", 0), "delta": message}
        else:
            choice = {"index": ch.get("index", 0), "text": ch.get("text", "")}
        choice["logprobs"] = ch.get("logprobs")
        choice["finish_reason"] = ch.get("finish_reason")
        parts.append({**head, "choices": [choice]})
    if include_usage and data.get("usage") is not None:
        parts.append({**head, "choices": [], "usage": data["usage"]})
    out = b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in parts)
    return out + b"data: [DONE]\n\n"
