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
from array import array
from collections.abc import Mapping
from typing import Any, Final

from agentcore_rl.gateway.jsonio import loads
from agentcore_rl.gateway.record import Completion, ids_array, logprob_array

__all__ = ["Backend", "Capture", "SGLangBackend", "VLLMBackend", "backend_named", "synthesize_sse"]

CHAT: Final = "chat.completions"
COMPLETIONS: Final = "completions"


class Capture:
    """Token ids and logprobs gathered from one answer (or its stream of chunks).

    The pieces are gathered in plain lists (ids, logprobs or a whole answer's logprob
    entries) and turned into one exact-size typed array per choice only when read
    (:meth:`completions`, :attr:`prompt_ids`): the gateway reads them after the answer's
    last byte is out, so the conversion is off the agent's path, and a stream's arrays are
    not regrown event by event (that reallocated them about fifty times per answer and,
    with 64 concurrent streams, scattered these long-lived arrays among freed blocks).

    Example::

        capture = Capture("chat.completions")
        backend.take_response(answer, capture, keep_logprobs=False, endpoint=capture.endpoint)
        capture.missing("vllm") or capture.completions()
    """

    __slots__ = (
        "_prompt",
        "_prompt_ids",
        "choices",
        "endpoint",
        "ids_seen",
        "parts",
        "usage",
    )

    def __init__(self, endpoint: str = CHAT) -> None:
        self.endpoint = endpoint
        self._prompt: Any = None  # the prompt ids as the upstream sent them, until read
        self._prompt_ids: array[int] | None = None
        self.choices: dict[int, Completion] = {}
        self.ids_seen: set[int] = set()
        self.usage: dict[str, Any] | None = None
        # choice index -> (token ids, logprobs or chat's logprob entries), not joined yet
        self.parts: dict[int, tuple[list[Any], list[Any]]] = {}

    @property
    def has_prompt(self) -> bool:
        """Whether the prompt ids arrived."""
        return self._prompt is not None or self._prompt_ids is not None

    def set_prompt(self, ids: Any) -> None:
        """Keep the first prompt ids seen."""
        if not self.has_prompt:
            self._prompt = ids

    def parse(self, content: bytes, offset: int = 0) -> Any:
        """``content[offset:]`` parsed (``ValueError`` when it is not JSON)."""
        if offset:
            with memoryview(content) as view:
                return loads(view[offset:])
        return loads(content)

    def pack_prompt(self) -> None:
        """Turn the prompt ids into their array now (a stream would hold the int list to its
        end: ~40 KB per 1,000-token prompt, 2.5 MB of small objects at 64 streams)."""
        if self._prompt is not None:
            self._prompt_ids, self._prompt = ids_array(self._prompt), None

    @property
    def prompt_ids(self) -> array[int] | None:
        """The prompt ids as an array (None when none arrived)."""
        if self._prompt is not None:
            self._prompt_ids, self._prompt = ids_array(self._prompt), None
        return self._prompt_ids

    def _join(self) -> None:
        for index, (ids, logprobs) in self.parts.items():
            completion = self.choice(index)
            if completion.token_ids:
                ids = [*completion.token_ids, *ids]
            completion.token_ids = ids_array(ids)
            values = _logprobs(logprobs)
            if completion.logprobs:
                values = [*completion.logprobs, *values]
            completion.logprobs = logprob_array(values)
        self.parts.clear()

    def choice(self, index: int) -> Completion:
        """The completion of choice ``index`` (created on first sight)."""
        found = self.choices.get(index)
        if found is None:
            found = self.choices[index] = Completion(index=index)
        return found

    def completions(self) -> list[Completion]:
        """The choices in index order (raises ValueError on malformed ids or logprobs)."""
        if self.parts:
            try:
                self._join()
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"malformed token ids or logprobs: {exc!r}") from None
        return [self.choices[i] for i in sorted(self.choices)]

    def missing(self, backend: str) -> str | None:
        """What the upstream failed to return, in words, or None when nothing is missing."""
        what = []
        if not self.has_prompt:
            what.append("prompt token ids")
        if any(i not in self.ids_seen for i in self.choices):
            what.append("completion token ids")
        elif any(self._count(i, 0) != self._count(i, 1) for i in self.choices):
            what.append("one logprob per completion token")
        if not what:
            return None
        hint = (
            "is it vLLM >= 0.10.2 (which returns them for return_token_ids=true)?"
            if backend == "vllm"
            else "does this SGLang accept return_prompt_token_ids and return_meta_info?"
        )
        return f"the {backend} upstream returned no {' and no '.join(what)}; {hint}"

    def _count(self, index: int, which: int) -> int:
        """How many ids (``which`` 0) or logprobs (1) choice ``index`` has, joined or not."""
        completion = self.choices[index]
        done = len(completion.token_ids if which == 0 else completion.logprobs)
        parts = self.parts.get(index)
        return done + (len(parts[which]) if parts else 0)


def _logprobs(items: list[Any]) -> list[Any]:
    """Chat's logprob entries as their floats (completions' items are floats already)."""
    if items and type(items[0]) is dict:  # JSON objects parse to dicts (the hot path)
        return [float(e["logprob"]) for e in items]
    return items


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
        root_prompt = data.pop("prompt_token_ids", None)
        if root_prompt is not None:
            capture.set_prompt(root_prompt)
        self._choices(data, capture, keep_logprobs, endpoint, entries=True)
        usage = data.get("usage")
        if isinstance(usage, dict):
            capture.usage = usage

    def take_chunk(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        # A chunk's logprob entries become floats at once: kept to the stream's end, the
        # entry dicts of 64 concurrent streams cost the gateway about 6 MB.
        root_prompt = data.pop("prompt_token_ids", None)
        if root_prompt is not None:
            capture.set_prompt(root_prompt)
        self._choices(data, capture, keep_logprobs, endpoint, entries=False)
        usage = data.get("usage")
        if isinstance(usage, dict):
            capture.usage = usage

    @staticmethod
    def _choices(
        data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str, entries: bool
    ) -> None:
        # Once per stream event: plain dict operations, no helper calls on the way.
        key = "content" if endpoint == CHAT else "token_logprobs"
        every = capture.parts
        for ch in data.get("choices") or ():
            index = ch.get("index", 0)
            if type(index) is not int:
                index = int(index)
            parts = every.get(index)
            if parts is None:
                capture.choice(index)
                parts = every[index] = ([], [])
            if "prompt_token_ids" in ch:  # completions: per choice
                prompt = ch.pop("prompt_token_ids")
                if prompt is not None:
                    capture.set_prompt(prompt)
            ids = ch.pop("token_ids", None)
            if ids is not None:
                parts[0].extend(ids)
                capture.ids_seen.add(index)
            logprobs = ch.get("logprobs")
            if logprobs:
                items = logprobs.get(key) if type(logprobs) is dict else None
                if items:
                    # a whole answer's entries are read after it is out; a chunk's now
                    parts[1].extend(items if entries else _logprobs(items))
            if not keep_logprobs:
                ch["logprobs"] = None
            finish = ch.get("finish_reason")
            if finish is not None:
                capture.choices[index].finish_reason = finish


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
            completion = capture.choice(int(ch.get("index", 0)))
            prompt = ch.pop("prompt_token_ids", None)
            if prompt is not None:
                capture.set_prompt(prompt)
            meta = ch.pop("meta_info", None)
            entries = meta.get("output_token_logprobs") if isinstance(meta, Mapping) else None
            if entries is not None:
                capture.ids_seen.add(completion.index)
                completion.token_ids = ids_array(int(e[1]) for e in entries)
                completion.logprobs = logprob_array(float(e[0]) for e in entries)
            if not keep_logprobs:
                ch["logprobs"] = None
            completion.finish_reason = ch.get("finish_reason")
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
