"""How each inference server is asked for token ids and logprobs (docs/gateway.md): proxy mode's
capture flags (:attr:`Backend.flags`, read by :mod:`.proxy`) and linear mode's token-in,
token-out exchange (:meth:`Backend.token_in`; :attr:`Backend.fields` are what it forwards)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentcore_rl.edge import Refusal
from agentcore_rl.gateway.jsonio import dumps, loads
from agentcore_rl.gateway.upstream import UpstreamPool, UpstreamTarget

log = logging.getLogger("agentcore_rl.gateway")

__all__ = ["CHAT", "COMPLETIONS", "Backend", "Served", "backend_named", "passed_on"]

CHAT: Final = "chat.completions"
COMPLETIONS: Final = "completions"

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
class Served:
    """A token-in answer: ids, a logprob per generated id, why it ended, maybe texts and tops."""

    prompt_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    stop_reason: str | None = None  # the stop string that ended it
    tokens: list[str] | None = None
    top: list[dict[str, float]] | None = None
    #: The upstream's own record of which weights sampled each token: ``(first token index,
    #: weight version label)``, None when it keeps none.
    spans: list[tuple[int, str]] | None = None


def passed_on(status: int, content: bytes) -> Refusal:
    """An upstream's answer other than 200, for the agent."""
    text = content[:500].decode("utf-8", "replace")
    message = f"upstream answered HTTP {status}: {text}"
    return Refusal(status, message, "upstream", passed_on=content)


def _top(body: Mapping[str, Any]) -> int:
    """How many alternatives per token the agent asked for (0: none; checked by linear mode)."""
    return int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0


class Backend:
    """One kind of inference server (see the module doc)."""

    name = "?"
    #: Proxy mode: the capture flags, whether the upstream can stream with them on, and what
    #: to check when it returns no ids.
    flags: Mapping[str, bool] = {}
    streams = True
    hint = ""
    #: Linear mode: the sampling fields forwarded (the agent's name -> the server's).
    fields: Mapping[str, str] = {}

    def __init__(self) -> None:
        #: upstream base URL -> whose spans a linear call's token versions are, learnt on its
        #: first call: ``upstream`` (the server's own), or ``gateway`` (docs/gateway.md).
        self.sources: dict[str, str] = {}

    def _sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The agent's sampling fields under the server's names."""
        return {self.fields[k]: v for k, v in body.items() if k in self.fields and v is not None}

    async def token_in(
        self,
        pool: UpstreamPool,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        budget: int,
        running: set[str],
    ) -> Served:
        """Generate from ``prompt_ids`` (the agent's sampling, :meth:`check`ed; ``budget``
        tokens); while it runs, its id at the server is in ``running`` (what a suspend aborts)."""
        target, request, engine_id = self._request(pool, prompt_ids, body, budget)
        running.add(engine_id)
        try:
            status, content = await pool.fetch(target, dumps(request))
        finally:
            running.discard(engine_id)
        if status != 200:
            if self._refused(pool, target, status):
                return await self.token_in(pool, prompt_ids, body, budget, running)
            raise passed_on(status, content)
        try:
            served = self._read(loads(content))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            why = f"the {self.name} upstream sent a malformed answer: {exc!r}"
            raise Refusal(502, why, "upstream_invalid") from None
        if served.prompt_ids is not None and list(served.prompt_ids) != prompt_ids:
            raise Refusal(
                502, "the upstream fed the model other ids than sent", "upstream_mismatch"
            )
        if len(served.logprobs) != len(served.token_ids):
            raise Refusal(502, "the upstream sent no logprob per token", "upstream_invalid")
        self.sources.setdefault(pool.base, "gateway" if served.spans is None else "upstream")
        return served

    def _refused(self, pool: UpstreamPool, target: UpstreamTarget, status: int) -> bool:
        """Whether ``target`` is a route the upstream lacks, with a fallback to retry on."""
        return False

    def _request(
        self, pool: UpstreamPool, prompt_ids: list[int], body: Mapping[str, Any], budget: int
    ) -> tuple[UpstreamTarget, dict[str, Any], str]:
        """-> (the route, the request, the request's id at the server) for :meth:`token_in`."""
        raise NotImplementedError

    def _read(self, data: Mapping[str, Any]) -> Served:
        """The token-in answer's ids and logprobs (ValueError/KeyError/TypeError when malformed)."""
        raise NotImplementedError


class VLLMBackend(Backend):
    """vLLM >= 0.10.2 (``return_token_ids``); linear mode calls vLLM >= 0.32's token-in route,
    which returns the weight version of every token, where it is on (``--enable-scale-out``)."""

    name = "vllm"
    flags = {"return_token_ids": True}
    hint = "is it vLLM >= 0.10.2 (which returns them for return_token_ids=true)?"
    fields = _VLLM_FIELDS

    def _refused(self, pool: UpstreamPool, target: UpstreamTarget, status: int) -> bool:
        if status not in (403, 404, 405) or not target.url.path.endswith("/v1/generate"):
            return False
        if self.sources.get(pool.base) == "gateway":  # a call beside the first one to learn it
            return True
        self.sources[pool.base] = "gateway"
        log.warning(
            "%s answered HTTP %d on /inference/v1/generate (vLLM >= 0.32 has it when started with "
            "--enable-scale-out): linear mode calls /v1/completions there, each token's version "
            "the gateway's own (docs/gateway.md, Weight-sync recipe)",
            pool.base,
            status,
        )
        return True

    def _request(
        self, pool: UpstreamPool, prompt_ids: list[int], body: Mapping[str, Any], budget: int
    ) -> tuple[UpstreamTarget, dict[str, Any], str]:
        sampling = self._sampling(body)
        top, rid = _top(body), uuid.uuid4().hex
        sampling.update(
            max_tokens=budget,
            n=1,
            logprobs=top,
            skip_special_tokens=False,
            stop_token_ids=body["stop_token_ids"],
        )
        if self.sources.get(pool.base) != "gateway":
            request = {
                "model": body.get("model"),
                "request_id": rid,
                "token_ids": prompt_ids,
                "sampling_params": sampling,
                "return_token_ids": True,
                "output_mode": "text" if body.get("logprobs") else "tokens",  # token texts
            }
            # the server's id: ``generate-tokens-{request_id}`` (scale_out/token_in_token_out)
            target = pool.target("/inference/v1/generate", root=True)
            return target, request, f"generate-tokens-{rid}"
        sampling.update(model=body.get("model"), prompt=prompt_ids, request_id=rid)
        sampling.update(return_token_ids=True, stream=False)
        # a completions request's only prompt is ``cmpl-{request_id}-0``
        # (``vllm/entrypoints/openai/completion/serving.py``)
        return pool.target("/completions"), sampling, f"cmpl-{rid}-0"

    def _read(self, data: Mapping[str, Any]) -> Served:
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ValueError("no token_ids (is it vLLM >= 0.10.2, given return_token_ids?)")
        logprobs = choice.get("logprobs") or {}
        reason = choice.get("stop_reason")
        served = Served(
            prompt_ids=data.get("prompt_token_ids", choice.get("prompt_token_ids")),
            token_ids=[int(i) for i in ids],
            logprobs=[float(x) for x in logprobs.get("token_logprobs") or ()],
            finish_reason=choice.get("finish_reason"),
            stop_reason=reason if isinstance(reason, str) else None,
            tokens=logprobs.get("tokens"),
            top=logprobs.get("top_logprobs"),
        )
        if "content" in logprobs:  # the token-in route: entries (texts with output_mode text)
            spans = choice.get("weight_versions")  # None: vLLM labelled none
            if spans is not None:
                served.spans = [(int(s["start"]), str(s["version"])) for s in spans]
            entries = logprobs["content"] or ()
            served.logprobs = [float(e["logprob"]) for e in entries]
            if all("token" in e for e in entries):
                served.tokens = [e["token"] for e in entries]
                served.top = [
                    {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
                ]
        return served


class SGLangBackend(Backend):
    """SGLang: its OpenAI server with ``return_meta_info``, and its native ``/generate``."""

    name = "sglang"
    flags = {"return_prompt_token_ids": True, "return_meta_info": True}
    streams = False
    hint = "does this SGLang accept return_prompt_token_ids and return_meta_info?"
    fields = _SGLANG_FIELDS

    def _request(
        self, pool: UpstreamPool, prompt_ids: list[int], body: Mapping[str, Any], budget: int
    ) -> tuple[UpstreamTarget, dict[str, Any], str]:
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
        return pool.target("/generate"), {**out, "stream": False}, ""

    def _read(self, data: Mapping[str, Any]) -> Served:
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
