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
    path, body = backend.request([151644, 872], {"temperature": 1.0}, stop_ids=[151645])
    served = backend.read(answer_json)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Served", "TokenInBackend", "token_in_backend"]

# The agent's sampling fields each server takes under the same name.
_SAMPLING: Final = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "min_tokens",
    "ignore_eos",
)


@dataclass(slots=True)
class Served:
    """What the server fed and generated: ids, one logprob per generated id, the reason."""

    prompt_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    usage: dict[str, Any] | None = None


def _max_tokens(body: Mapping[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens") or default
    return int(value)


class TokenInBackend:
    """One server's token-in protocol (see the module doc)."""

    name = "?"
    path = "?"

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


class VLLMTokenIn(TokenInBackend):
    """vLLM's ``/v1/completions`` with a token-id prompt."""

    name = "vllm"
    path = "/completions"

    def request(
        self,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        *,
        stop_ids: Iterable[int],
        default_max_tokens: int = 4096,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
        if "seed" in body:
            out["seed"] = body["seed"]
        out.update(
            model=body.get("model"),
            prompt=prompt_ids,
            max_tokens=_max_tokens(body, default_max_tokens),
            n=1,
            logprobs=0,
            return_token_ids=True,
            skip_special_tokens=False,
            stop_token_ids=sorted(stop_ids),
            stream=False,
        )
        return out

    def read(self, data: Mapping[str, Any]) -> Served:
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ValueError("no token_ids (is it vLLM >= 0.10.2, given return_token_ids?)")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return Served(
            prompt_ids=choice.get("prompt_token_ids"),
            token_ids=[int(i) for i in ids],
            logprobs=[float(x) for x in logprobs],
            finish_reason=choice.get("finish_reason"),
            usage=data.get("usage"),
        )


class SGLangTokenIn(TokenInBackend):
    """SGLang's native ``/generate`` with ``input_ids``."""

    name = "sglang"
    path = "/generate"

    def request(
        self,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        *,
        stop_ids: Iterable[int],
        default_max_tokens: int = 4096,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
        if body.get("seed") is not None:
            params["sampling_seed"] = body["seed"]
        params.update(
            max_new_tokens=_max_tokens(body, default_max_tokens),
            stop_token_ids=sorted(stop_ids),
            skip_special_tokens=False,
        )
        return {
            "input_ids": prompt_ids,
            "sampling_params": params,
            "return_logprob": True,
            "stream": False,
        }

    def read(self, data: Mapping[str, Any]) -> Served:
        meta = data["meta_info"]
        entries = meta.get("output_token_logprobs")
        if entries is None:
            raise ValueError("no meta_info.output_token_logprobs (was return_logprob honoured?)")
        finish = meta.get("finish_reason")
        reason = finish.get("type") if isinstance(finish, Mapping) else finish
        usage = {
            "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
        }
        return Served(
            prompt_ids=None,
            token_ids=[int(e[1]) for e in entries],
            logprobs=[float(e[0]) for e in entries],
            finish_reason=reason,
            usage=usage,
        )


_BACKENDS: Final[dict[str, type[TokenInBackend]]] = {"vllm": VLLMTokenIn, "sglang": SGLangTokenIn}


def token_in_backend(name: str) -> TokenInBackend:
    """The token-in protocol called ``name`` (``vllm`` or ``sglang``)."""
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}") from None
