"""Token-in, token-out requests to an inference server: the prompt as token ids, the
completion's ids and logprobs back.

- ``vllm``: ``POST {base}/completions`` (base ``http://host:8000/v1``) with ``prompt`` a list
  of token ids, ``return_token_ids: true`` (``choices[0].prompt_token_ids`` and
  ``choices[0].token_ids`` come back) and ``logprobs: 0`` (the sampled token's logprob in
  ``choices[0].logprobs.token_logprobs``), as vLLM's ``CompletionRequest`` /
  ``CompletionResponseChoice`` define them (``vllm/entrypoints/openai/completion/protocol.py``).
- ``sglang``: ``POST {base}/generate`` (base ``http://host:30000``, the server root) with
  ``input_ids``, ``sampling_params`` and ``return_logprob: true``; the answer's
  ``meta_info.output_token_logprobs`` holds ``[logprob, token_id, text]`` per generated token
  and ``meta_info.finish_reason.type`` the reason (``GenerateReqInput`` in
  ``python/sglang/srt/managers/io_struct.py``).

Example::

    backend = token_in_backend("vllm")
    body = backend.request([151644, 872], {"temperature": 1.0}, stop_ids=[151645])
    served = backend.read(answer_json)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Served", "TokenInBackend", "token_in_backend"]

# The chat request's fields linear mode serves itself: the conversation, the answer's form.
_OWN: Final = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "stop_token_ids",
        "user",
        "metadata",
        "store",
    }
)
# The sampling fields each server takes: the agent's name -> the server's.
_VLLM: Final = {
    name: name
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "stop",
        "seed",
        "logit_bias",
        "min_tokens",
        "ignore_eos",
        "include_stop_str_in_output",
        "allowed_token_ids",
        "bad_words",
    )
}
_SGLANG: Final = {
    **{k: k for k in _VLLM if k not in ("allowed_token_ids", "bad_words")},
    "seed": "sampling_seed",
    "min_tokens": "min_new_tokens",
    "include_stop_str_in_output": "no_stop_trim",
}


@dataclass(slots=True)
class Served:
    """What the server fed and generated: ids, one logprob per generated id, the reason,
    and, when asked, each token's text and its top alternatives."""

    prompt_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    stop_reason: str | None = None  # the stop string that ended it
    tokens: list[str] | None = None
    top: list[dict[str, float]] | None = None


def _max_tokens(body: Mapping[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens") or default
    return int(value)


def _top(body: Mapping[str, Any]) -> int:
    """How many alternatives per token the agent asked for (0: none, or no logprobs)."""
    top = body.get("top_logprobs")
    if not body.get("logprobs") or top is None:
        return 0
    if type(top) is not int or not 0 <= top <= 20:
        raise ValueError("top_logprobs must be an integer in 0..20")
    return top


class TokenInBackend:
    """One server's token-in protocol (see the module doc)."""

    name = "?"
    path = "?"
    fields: Mapping[str, str] = {}

    def sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The agent's sampling fields under the server's names; ``ValueError`` naming a
        field this server does not take (never dropped in silence)."""
        for name in body:
            if name not in _OWN and name not in self.fields:
                raise ValueError(
                    f"linear history cannot forward {name!r} to {self.name} (it forwards "
                    f"{', '.join(sorted(self.fields))})"
                )
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise ValueError("linear history serves tool_choice 'auto' (or 'none') only")
        _top(body)
        return {self.fields[k]: v for k, v in body.items() if k in self.fields and v is not None}

    def request(
        self,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        *,
        stop_ids: Iterable[int],
        default_max_tokens: int = 4096,
    ) -> dict[str, Any]:
        """The request body for ``prompt_ids`` with the agent's sampling fields."""
        raise NotImplementedError

    def read(self, data: Mapping[str, Any]) -> Served:
        """The served ids and logprobs (ValueError/KeyError/TypeError when malformed)."""
        raise NotImplementedError


def _stop_ids(body: Mapping[str, Any], stop_ids: Iterable[int]) -> list[int]:
    extra = body.get("stop_token_ids") or []
    if not isinstance(extra, list) or not all(type(i) is int for i in extra):
        raise ValueError("stop_token_ids must be a list of token ids")
    return sorted({*stop_ids, *extra})


class VLLMTokenIn(TokenInBackend):
    """vLLM's ``/v1/completions`` with a token-id prompt."""

    name = "vllm"
    path = "/completions"
    fields = _VLLM

    def request(
        self,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        *,
        stop_ids: Iterable[int],
        default_max_tokens: int = 4096,
    ) -> dict[str, Any]:
        out = self.sampling(body)
        out.update(
            model=body.get("model"),
            prompt=prompt_ids,
            max_tokens=_max_tokens(body, default_max_tokens),
            n=1,
            logprobs=_top(body),
            return_token_ids=True,
            skip_special_tokens=False,
            stop_token_ids=_stop_ids(body, stop_ids),
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


class SGLangTokenIn(TokenInBackend):
    """SGLang's native ``/generate`` with ``input_ids``."""

    name = "sglang"
    path = "/generate"
    fields = _SGLANG

    def request(
        self,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        *,
        stop_ids: Iterable[int],
        default_max_tokens: int = 4096,
    ) -> dict[str, Any]:
        params = self.sampling(body)
        params.update(
            max_new_tokens=_max_tokens(body, default_max_tokens),
            stop_token_ids=_stop_ids(body, stop_ids),
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


_BACKENDS: Final[dict[str, type[TokenInBackend]]] = {"vllm": VLLMTokenIn, "sglang": SGLangTokenIn}


def token_in_backend(name: str) -> TokenInBackend:
    """The token-in protocol called ``name`` (``vllm`` or ``sglang``)."""
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}") from None
