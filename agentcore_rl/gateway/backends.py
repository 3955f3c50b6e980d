"""How each inference server is asked for token ids and logprobs (docs/gateway.md): proxy mode's
capture flags (:attr:`Backend.flags`, read by :mod:`.proxy`) and the token-in, token-out
exchange (:meth:`Backend.generate`: linear mode's, and proxy mode's on a vLLM that renders;
:attr:`Backend.fields` are what linear mode forwards)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Final

from agentcore_rl.edge import Refusal
from agentcore_rl.gateway.jsonio import dumps, loads
from agentcore_rl.gateway.policy_gate import PolicyGate, Versions
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
    entries: list[Any] | None = None  # vLLM's logprob entries as it sent them

    def extend(self, piece: Served) -> None:
        """Append the next piece of the same generation (its end is the whole's)."""
        self.prompt_ids = self.prompt_ids or piece.prompt_ids
        self.token_ids += piece.token_ids
        self.logprobs += piece.logprobs
        self.tokens = (
            None if self.tokens is None or piece.tokens is None else self.tokens + piece.tokens
        )
        self.top = None if self.top is None or piece.top is None else self.top + piece.top
        self.entries = (
            None if self.entries is None or piece.entries is None else self.entries + piece.entries
        )
        self.finish_reason, self.stop_reason = piece.finish_reason, piece.stop_reason
        self.spans = piece.spans or self.spans


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

    async def generate(
        self,
        gate: PolicyGate,
        pool: UpstreamPool,
        versions: Versions,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        *,
        rendered: dict[str, Any] | None = None,
    ) -> AsyncGenerator[Served, None]:
        """The completion of ``prompt_ids`` token-in, in pieces (as a stream's events arrive
        when ``rendered``, vLLM's rendering of a streamed call, asks to stream; else one per
        request), the last with the finish reason. A ``suspend`` cuts it (vLLM aborts) and the
        resume continues it from the tokens so far, ``versions`` marking each span: the
        upstream's own spans where it keeps them, else the gateway's. ``body``: the agent's
        sampling (linear mode's, :meth:`check`ed) when not ``rendered``."""
        sampling = body if rendered is None else rendered["sampling_params"]
        budget = int(sampling.get("max_completion_tokens") or sampling.get("max_tokens") or 4096)
        ids: list[int] = []
        spans: list[tuple[int, str]] | None = []
        running = gate.token_in.setdefault(pool.base, set())
        if gate.resumes != versions.since:  # sent after an update that came since it was admitted
            versions.start(0, gate.version)
        while True:
            resumes, start = gate.resumes, len(ids)
            least = int(sampling.get("min_tokens") or 0) - start  # a continuation's share
            rest = {**sampling, "min_tokens": least if least > 0 else None} if ids else sampling
            if rendered is not None:  # vLLM's own sampling, its budget what is left
                left = {"max_tokens": budget - start, "min_tokens": max(least, 0)}
                rest = {**rendered, "sampling_params": {**sampling, **left}}
            piece = None
            asked = self._exchange(pool, prompt_ids + ids, rest, budget - start, running)
            async with aclosing(asked) as pieces:
                async for each in pieces:
                    if each.finish_reason is not None:
                        piece = each
                    elif each.token_ids:
                        ids += each.token_ids
                        yield each
            if piece is None:
                raise Refusal(
                    502, "the upstream's stream ended before its generation", "upstream_invalid"
                )
            cut = (
                piece.finish_reason == "abort"
                and (gate.paused == "suspend" or gate.resumes != resumes)
                and len(ids) + len(piece.token_ids) < budget
            )
            if gate.resumes != resumes and not cut:  # it waited out the pause in the queue
                versions.start(start, gate.version)
            if spans is not None and piece.spans is not None:
                spans += [(start + at, label) for at, label in piece.spans]
            else:
                spans = None
            ids += piece.token_ids
            if not cut:
                if spans is not None:
                    versions.adopt(spans, gate.labels)
                yield piece
                return
            piece.finish_reason = piece.stop_reason = None
            yield piece
            await gate.flowing()
            versions.start(len(ids), gate.version)

    async def _exchange(
        self,
        pool: UpstreamPool,
        prompt_ids: list[int],
        body: Mapping[str, Any],
        budget: int,
        running: set[str],
    ) -> AsyncGenerator[Served, None]:
        """One request's generation from ``prompt_ids`` (``body``: the agent's sampling, or
        vLLM's rendered request; ``budget`` tokens), one piece per read of a stream; while it
        runs, its id at the server is in ``running`` (what a suspend aborts)."""
        target, request, engine_id = self._request(pool, prompt_ids, body, budget)
        running.add(engine_id)
        try:
            async with pool.stream(target, dumps(request)) as response:
                if response.status != 200:
                    status, content = response.status, await response.read()
                elif request.get("stream"):
                    async for events in response.events():
                        yield self._checked(pool, prompt_ids, events, stream=True)
                    return
                else:
                    served = self._checked(pool, prompt_ids, [await response.read()])
                    served.finish_reason = served.finish_reason or "stop"
                    yield served
                    return
        finally:
            running.discard(engine_id)
        if not self._refused(pool, target, status):
            raise passed_on(status, content)
        async with aclosing(self._exchange(pool, prompt_ids, body, budget, running)) as again:
            async for piece in again:
                yield piece

    def _checked(
        self, pool: UpstreamPool, prompt_ids: list[int], raw: list[Any], *, stream: bool = False
    ) -> Served:
        """One piece from the answer (or a read's stream events: those with a choice), checked."""
        try:
            datas = [loads(r) for r in raw]
            for data in datas:
                if "error" in data:  # a stream's failure after its 200
                    raise ValueError(data["error"])
            pieces = [self._read(d) for d in datas if not stream or d.get("choices")]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            why = f"the {self.name} upstream sent a malformed answer: {exc!r}"
            raise Refusal(502, why, "upstream_invalid") from None
        served = pieces[0] if pieces else Served(None, [], [], None, tokens=[], top=[], entries=[])
        for piece in pieces[1:]:
            served.extend(piece)
        if served.prompt_ids is not None and list(served.prompt_ids) != prompt_ids:
            raise Refusal(
                502, "the upstream fed the model other ids than sent", "upstream_mismatch"
            )
        if len(served.logprobs) != len(served.token_ids):
            raise Refusal(502, "the upstream sent no logprob per token", "upstream_invalid")
        if served.finish_reason is not None:
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
        rid = uuid.uuid4().hex
        target = pool.target("/inference/v1/generate", root=True)
        if "sampling_params" in body:  # vLLM's rendering: its sampling, the logprobs recorded
            sampling = dict(body["sampling_params"])
            asked = sampling.get("logprobs") is not None  # the agent's: their texts too
            sampling["logprobs"] = sampling.get("logprobs") or 0
            mode = "text" if asked else "tokens"
            request = {**body, "request_id": rid, "token_ids": prompt_ids, "output_mode": mode}
            request.update(sampling_params=sampling, return_token_ids=True, stream_options=None)
            return target, request, f"generate-tokens-{rid}"
        sampling = self._sampling(body)
        top = _top(body)
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
            entries = served.entries = logprobs["content"] or []
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
