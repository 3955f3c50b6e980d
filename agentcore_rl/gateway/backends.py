"""How each inference server is asked for token ids and logprobs (docs/gateway.md): proxy mode
(:meth:`Backend.prepare`, :meth:`Backend.take`: capture flags on, ids stripped from the answer)
and linear mode (:meth:`Backend.request`, :meth:`Backend.read`: token-in, token-out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agentcore_rl.trace import CallRecord, Completion, ids_array, logprob_array

__all__ = ["CHAT", "COMPLETIONS", "Backend", "Capture", "Served", "backend_named"]

CHAT: Final = "chat.completions"
COMPLETIONS: Final = "completions"

# The chat request's fields linear mode serves itself: the conversation, the answer's form,
# the budget, bookkeeping.
_OWN: Final = frozenset[str]().union(
    ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"),
    ("stream", "stream_options", "n", "logprobs", "top_logprobs"),
    ("max_tokens", "max_completion_tokens", "stop_token_ids"),
    ("model", "user", "metadata", "store"),
)
# The sampling fields linear mode forwards (the agent's name -> the server's): sampling,
# penalties, stopping, vLLM's own.
_VLLM_FIELDS: Final = {
    name: name
    for name in frozenset[str]().union(
        ("temperature", "top_p", "top_k", "min_p", "seed", "logit_bias"),
        ("presence_penalty", "frequency_penalty", "repetition_penalty"),
        ("stop", "min_tokens", "ignore_eos", "include_stop_str_in_output"),
        ("allowed_token_ids", "bad_words"),
    )
}
_SGLANG_FIELDS: Final = {
    **{k: k for k in _VLLM_FIELDS if k not in ("allowed_token_ids", "bad_words")},
    "seed": "sampling_seed",
    "min_tokens": "min_new_tokens",
    "include_stop_str_in_output": "no_stop_trim",
}


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


@dataclass(slots=True)
class Served:
    """A token-in answer: ids, a logprob per generated id, why it ended, maybe texts and tops."""

    prompt_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    stop_reason: str | None = None  # the stop string that ended it
    tokens: list[str] | None = None
    top: list[dict[str, float]] | None = None


def _top(body: Mapping[str, Any]) -> int:
    """How many alternatives per token the agent asked for (0: none)."""
    top = body.get("top_logprobs")
    if not body.get("logprobs") or top is None:
        return 0
    if type(top) is not int or not 0 <= top <= 20:
        raise ValueError("top_logprobs must be an integer in 0..20")
    return top


class Backend:
    """One kind of inference server (see the module doc)."""

    name = "?"
    #: Proxy mode: the capture flags, whether the upstream can stream with them on, and what
    #: to check when it returns no ids.
    flags: Mapping[str, bool] = {}
    streams = True
    hint = ""
    #: Linear mode: the token-in route, and the sampling fields forwarded (see ``_OWN``).
    path = "?"
    fields: Mapping[str, str] = {}

    def prepare(self, body: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], bool]:
        """Add the capture flags to ``body`` (a copy); -> (body, agent asked for logprobs)."""
        body.update(self.flags)
        if not self.streams:  # asked whole: the gateway streams the answer to the agent
            body.pop("stream", None)
            body.pop("stream_options", None)
        asked = body.get("logprobs")
        keep = bool(asked) if endpoint == CHAT else asked is not None
        if not keep:  # completions: 0, the sampled token's logprob only
            body["logprobs"] = True if endpoint == CHAT else 0
        return body, keep

    def _tokens(self, choice: dict[str, Any], endpoint: str) -> tuple[Any, list[Any], Any]:
        """A choice's token ids, logprobs (floats) and stop string, its capture fields popped."""
        raise NotImplementedError

    def take(
        self, data: dict[str, Any], capture: Capture, keep_logprobs: bool, endpoint: str
    ) -> None:
        """Read ids and logprobs from an answer or a chunk, stripping them in place."""
        prompt = data.pop("prompt_token_ids", None)  # vLLM chat: at the root
        if capture.prompt is None:  # the first prompt ids seen
            capture.prompt = prompt
        for ch in data.get("choices") or ():
            prompt = ch.pop("prompt_token_ids", None)  # per choice
            if capture.prompt is None:
                capture.prompt = prompt
            i, finish = int(ch.get("index", 0)), ch.get("finish_reason")
            ids, logprobs, stop = self._tokens(ch, endpoint)
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

    def check(self, body: dict[str, Any], stop_ids: Iterable[int]) -> None:
        """Refuse (ValueError) a request linear mode cannot serve as asked, before any work;
        ``stop_token_ids`` become the agent's and ``stop_ids``."""
        for name in body:
            if name not in _OWN and name not in self.fields:
                raise ValueError(
                    f"linear history cannot forward {name!r} to {self.name} (it forwards "
                    f"{', '.join(sorted(self.fields))})"
                )
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise ValueError("linear history serves tool_choice 'auto' (or 'none') only")
        if body.get("n", 1) not in (1, None):
            raise ValueError("linear history follows one choice: n must be 1")
        _top(body)
        extra = body.get("stop_token_ids") or []
        if not isinstance(extra, list) or not all(type(i) is int for i in extra):
            raise ValueError("stop_token_ids must be a list of token ids")
        body["stop_token_ids"] = sorted({*stop_ids, *extra})

    def _sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The agent's sampling fields under the server's names."""
        return {self.fields[k]: v for k, v in body.items() if k in self.fields and v is not None}

    def request(
        self, prompt_ids: list[int], body: Mapping[str, Any], budget: int
    ) -> dict[str, Any]:
        """The token-in request for ``prompt_ids``: the agent's sampling (:meth:`check`ed),
        ``budget`` tokens."""
        raise NotImplementedError

    def read(self, data: Mapping[str, Any]) -> Served:
        """The token-in answer's ids and logprobs (ValueError/KeyError/TypeError when malformed)."""
        raise NotImplementedError


class VLLMBackend(Backend):
    """vLLM >= 0.10.2 (``return_token_ids``)."""

    name = "vllm"
    flags = {"return_token_ids": True}
    hint = "is it vLLM >= 0.10.2 (which returns them for return_token_ids=true)?"
    path = "/completions"
    fields = _VLLM_FIELDS

    def _tokens(self, choice: dict[str, Any], endpoint: str) -> tuple[Any, list[Any], Any]:
        logprobs = choice.get("logprobs")
        key = "content" if endpoint == CHAT else "token_logprobs"
        items = (logprobs.get(key) if type(logprobs) is dict else None) or []
        if items and type(items[0]) is dict:  # chat: entries
            items = [float(e["logprob"]) for e in items]
        # vLLM names the stop string that cut the text inside the last token
        return choice.pop("token_ids", None), items, choice.get("stop_reason")

    def request(
        self, prompt_ids: list[int], body: Mapping[str, Any], budget: int
    ) -> dict[str, Any]:
        out = self._sampling(body)
        out.update(
            model=body.get("model"),
            prompt=prompt_ids,
            max_tokens=budget,
            n=1,
            logprobs=_top(body),
            return_token_ids=True,
            skip_special_tokens=False,
            stop_token_ids=body["stop_token_ids"],
            stream=False,
        )
        return out

    def read(self, data: Mapping[str, Any]) -> Served:
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ValueError("no token_ids (is it vLLM >= 0.10.2, given return_token_ids?)")
        logprobs = choice.get("logprobs") or {}
        reason = choice.get("stop_reason")
        return Served(
            prompt_ids=choice.get("prompt_token_ids"),
            token_ids=[int(i) for i in ids],
            logprobs=[float(x) for x in logprobs.get("token_logprobs") or ()],
            finish_reason=choice.get("finish_reason"),
            stop_reason=reason if isinstance(reason, str) else None,
            tokens=logprobs.get("tokens"),
            top=logprobs.get("top_logprobs"),
        )


class SGLangBackend(Backend):
    """SGLang: its OpenAI server with ``return_meta_info``, and its native ``/generate``."""

    name = "sglang"
    flags = {"return_prompt_token_ids": True, "return_meta_info": True}
    streams = False
    hint = "does this SGLang accept return_prompt_token_ids and return_meta_info?"
    path = "/generate"
    fields = _SGLANG_FIELDS

    def _tokens(self, choice: dict[str, Any], endpoint: str) -> tuple[Any, list[Any], Any]:
        meta = choice.pop("meta_info", None)
        entries = meta.get("output_token_logprobs") if isinstance(meta, Mapping) else None
        if entries is None:
            return None, [], None
        return [e[1] for e in entries], [float(e[0]) for e in entries], None

    def request(
        self, prompt_ids: list[int], body: Mapping[str, Any], budget: int
    ) -> dict[str, Any]:
        params = self._sampling(body)
        params.update(
            max_new_tokens=budget,
            stop_token_ids=body["stop_token_ids"],
            skip_special_tokens=False,
        )
        out = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        top = _top(body)
        if top:
            out.update(top_logprobs_num=top, return_text_in_logprobs=True)
        return {**out, "stream": False}

    def read(self, data: Mapping[str, Any]) -> Served:
        meta = data["meta_info"]
        entries = meta.get("output_token_logprobs")
        if entries is None:
            raise ValueError("no meta_info.output_token_logprobs (was return_logprob honoured?)")
        finish = meta.get("finish_reason")
        reason = finish.get("type") if isinstance(finish, Mapping) else finish
        matched = finish.get("matched") if isinstance(finish, Mapping) else None
        tops = meta.get("output_top_logprobs")
        return Served(
            prompt_ids=None,
            token_ids=[int(e[1]) for e in entries],
            logprobs=[float(e[0]) for e in entries],
            finish_reason=reason,
            stop_reason=matched if isinstance(matched, str) else None,
            tokens=[e[2] for e in entries] if entries and entries[0][2] is not None else None,
            top=[{str(t[2]): float(t[0]) for t in row} for row in tops] if tops else None,
        )


_BACKENDS: Final[dict[str, type[Backend]]] = {"vllm": VLLMBackend, "sglang": SGLangBackend}


def backend_named(name: str) -> Backend:
    """The backend called ``name`` (``vllm`` or ``sglang``)."""
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}") from None
