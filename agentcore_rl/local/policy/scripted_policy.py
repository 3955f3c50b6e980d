"""The stand-in policy server: :class:`ScriptedPolicy`, the ASGI adapter between the OpenAI
routes (:mod:`.openai_wire`) and a :class:`~agentcore_rl.local.policy.voices.Voice`, with
vLLM's weight-sync routes, and :class:`Serving`, how it serves whatever the voice says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentcore_rl.edge import Refusal, read_body
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.keywords import check_config_types, check_numbers, checked, checked_init
from agentcore_rl.local.policy import openai_wire as wire
from agentcore_rl.local.policy.voices import Said, ScriptVoice, Voice

__all__ = ["DEFAULT_POLICY_MODEL", "ScriptedPolicy", "Serving"]

#: The model name the stand-in reports (any requested name is accepted and echoed).
DEFAULT_POLICY_MODEL: Final = "scripted-policy"
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
_TOKEN_IDS: Final = ("always", "requested", "never")


@checked_init
@dataclass(frozen=True, kw_only=True)
class Serving:
    """How the stand-in serves whatever its voice says.

    ``model`` is the name it reports. ``token_ids``: vLLM's token ids in every answer
    (``"always"``), when asked (``"requested"``: ``return_token_ids``) or ``"never"``.
    ``latency`` seconds are waited per request. ``token_rate`` (tokens per second, 0: at
    once) paces generation under vLLM's weight-sync routes. ``keep_answers``: how many
    answers ``ScriptedPolicy.answers`` keeps.

    Example::

        ScriptedPolicy(accuracy=1.0, serving=Serving(token_ids="requested", keep_answers=100))
    """

    model: str = DEFAULT_POLICY_MODEL
    token_ids: Literal["always", "requested", "never"] = "always"
    latency: float = 0.0
    token_rate: float = 0.0
    keep_answers: int = 0

    def __post_init__(self) -> None:
        check_numbers(self, "latency", "token_rate", at_least=0, finite=True)
        check_numbers(self, "keep_answers", at_least=0, integer=True)
        if self.token_ids not in _TOKEN_IDS:
            raise ConfigurationError(f"Serving.token_ids must be one of {_TOKEN_IDS}")


DEFAULT_SERVING: Final = Serving()
_MOVED: Final = {
    **{name: f"serving=Serving({name}=...)" for name in Serving.__dataclass_fields__},
    **{
        name: f"voice=TemplateVoice(tokenizer, {name}=...)"
        for name in ("tokenizer", "tool_call_parser", "reasoning_parser", "tool_rounds")
    },
    "play": "voice=PlayVoice(play)",
}


async def _body(request: Request) -> Mapping[str, Any]:
    raw = await read_body(request.receive, request.scope["headers"], limit=_MAX_BODY_BYTES)
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refusal(400, "request body is not valid JSON") from None
    if not isinstance(body, Mapping):
        raise Refusal(400, "request body must be a JSON object")
    return body


class ScriptedPolicy:
    """A STAND-IN for vLLM/SGLang as an ASGI app (serve it with uvicorn or BackgroundServer),
    not a language model.

    It speaks enough of the OpenAI API for the OpenAI SDK and agents written against vLLM:
    chat (with tool calls) and text completions, streamed or not, ``/v1/models``, vLLM's
    capture fields, and with a real template token-in (``/v1/completions`` with token ids,
    SGLang's ``/generate``). What it says is its ``voice``'s: by default
    ``ScriptVoice(accuracy=accuracy, seed=seed)``, the math solver;
    :class:`~agentcore_rl.local.policy.voices.PlayVoice` plays a function of yours,
    :class:`~agentcore_rl.local.policy.voices.TemplateVoice` a real chat template.
    ``serving`` (:class:`Serving`) says how it serves; ``sleep`` is injectable.

    ``requests`` counts completion requests, bad ones included; ``last_request`` is the last
    body; ``answers`` keeps the last ``keep_answers`` ``(prompt_ids, [(token_ids, logprobs)
    per choice])``. With a ``token_rate``, vLLM's weight-sync routes act on the generation
    (``/pause?mode=keep|abort``, ``/resume``, ``/abort_requests``,
    ``/update_weight_version``): a kept request waits for the resume, an aborted one answers
    its tokens so far (``finish_reason`` ``"abort"``), and each choice says which version
    made which tokens (``weight_versions``; ``made`` keeps them all, ``tokens_made`` counts).

    Example::

        policy = ScriptedPolicy(accuracy=0.7, serving=Serving(latency=0.05))
        async with BackgroundServer(policy) as server:
            base_url = server.url + "/v1"      # give this to agents as _rollout.base_url
    """

    @checked(moved=_MOVED)
    def __init__(
        self,
        voice: Voice | None = None,
        *,
        accuracy: float = 0.8,
        seed: int = 0,
        serving: Serving = DEFAULT_SERVING,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        check_config_types(("serving", serving, Serving))
        if voice is not None and (accuracy, seed) != (0.8, 0):
            raise ConfigurationError("accuracy and seed are the default voice's: give either")
        self.voice = voice if voice is not None else ScriptVoice(accuracy=accuracy, seed=seed)
        self.serving = serving
        self.model = serving.model
        self.answers: list[tuple[list[int], list[tuple[list[int], list[float]]]]] = []
        self.requests = 0
        self.last_request: Any = None  # the last body served (what the gateway forwarded)
        self._sleep = sleep
        self.weight_version = "0"
        self._paused = False
        self._changed = asyncio.Event()  # set (and replaced) at each pause, resume or abort
        self._aborted: set[str] = set()
        # paced completions as made: (prompt ids, token ids, each token's weight version)
        self.made: list[tuple[list[int], list[int], list[str]]] = []
        self.tokens_made = 0  # so far, the ones being made included
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", partial(self._serve, kind="chat"), methods=["POST"]),
                Route("/v1/completions", partial(self._serve, kind="text"), methods=["POST"]),
                Route("/generate", partial(self._serve, kind="generate"), methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/pause", self._pause, methods=["POST"]),
                Route("/resume", self._resume, methods=["POST"]),
                Route("/abort_requests", self._abort, methods=["POST"]),
                Route("/update_weight_version", self._set_version, methods=["POST"]),
            ],
            exception_handlers={Refusal: wire.refused},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def _with_ids(self, body: Mapping[str, Any]) -> bool:
        wanted = self.serving.token_ids
        return wanted == "always" or (wanted == "requested" and bool(body.get("return_token_ids")))

    def _say(self, body: Mapping[str, Any], kind: str) -> tuple[list[int], list[Said]]:
        """The prompt's ids and each choice the voice says, remembered."""
        given = body.get("input_ids" if kind == "generate" else "prompt")
        if kind == "chat":
            wire.check_chat(body)
            given = self.voice.render(body)
        elif kind == "text" and isinstance(given, str) and given:
            given = self.voice.encode(given)
        if not wire.is_ids(given):
            field = "input_ids" if kind == "generate" else "prompt"
            also = " string or" if kind == "text" else ""
            raise Refusal(400, f"{field} must be a non-empty{also} list of token ids", field=field)
        prompt_ids = given
        if kind == "generate":  # SGLang's: token ids in, its own sampling parameters
            body = {"max_tokens": (body.get("sampling_params") or {}).get("max_new_tokens")}
        n = 1 if kind == "generate" else wire.choices_wanted(body)
        said = [self.voice.say(body, prompt_ids, i, kind == "chat") for i in range(n)]
        if self.serving.keep_answers:  # the same lists: a paced cut shows here too
            self.answers.append((prompt_ids, [(one.ids, one.logprobs) for one in said]))
            del self.answers[: -self.serving.keep_answers]
        return prompt_ids, said

    async def _serve(self, request: Request, kind: str) -> Response:
        """Count, parse and answer a request; pace and stream the answer when asked."""
        self.requests += 1
        body = self.last_request = await _body(request)
        prompt_ids, said = self._say(body, kind)
        if self.serving.latency:
            await self._sleep(self.serving.latency)
        if kind == "generate":
            return JSONResponse(wire.generate_answer(body, prompt_ids, said[0]))
        if self.serving.token_rate:
            await self._pace(prompt_ids, said[0], f"cmpl-{body.get('request_id')}-0")
        answer = wire.answer(
            body, kind == "chat", prompt_ids, said, self.model, self._with_ids(body)
        )
        if not body.get("stream"):
            return JSONResponse(answer)
        options = body.get("stream_options")
        usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
        stream = wire.sse(answer, said, usage, self.voice.by_token)
        return StreamingResponse(stream, media_type="text/event-stream")

    async def _pace(self, prompt_ids: list[int], one: Said, request_id: str) -> None:
        """Make ``one``'s tokens at ``token_rate``, as a kept pause and an abort leave them:
        cut at an abort, each span labelled with the weight version that made it."""
        rate, made, spans = self.serving.token_rate, 0, list[dict[str, Any]]()
        step = max(1, round(rate * 0.05))  # tokens per wake-up: 20 a second
        while made < len(one.ids):
            await self._sleep(step / rate)
            while self._paused and not self._aborted & {request_id, "*"}:
                await self._changed.wait()
            if self._aborted & {request_id, "*"}:
                one.finish = "abort"
                break
            end = min(len(one.ids), made + step)
            if spans and spans[-1]["version"] == self.weight_version:
                spans[-1]["end"] = end
            else:
                spans.append({"version": self.weight_version, "start": made, "end": end})
            self.tokens_made += end - made
            made = end
        self._aborted.discard(request_id)
        del one.ids[made:], one.logprobs[made:], one.tokens[made:]
        one.text, one.weight_versions = self.voice.decode(one.ids), spans
        versions = [s["version"] for s in spans for _ in range(s["end"] - s["start"])]
        self.made.append((prompt_ids, list(one.ids), versions))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _pause(self, request: Request) -> JSONResponse:
        mode = request.query_params.get("mode", "abort")
        if mode not in ("keep", "abort"):
            raise Refusal(400, f"pause mode {mode!r}: the stand-in keeps or aborts")
        self._paused = True
        if mode == "abort":
            self._aborted.add("*")
        self._notify()
        return JSONResponse({"status": "paused"})

    async def _resume(self, request: Request) -> JSONResponse:
        self._paused = False
        self._aborted.discard("*")
        self._notify()
        return JSONResponse({"status": "resumed"})

    async def _abort(self, request: Request) -> JSONResponse:
        ids = (await _body(request)).get("request_ids") or ["*"]
        self._aborted.update(ids)
        self._notify()
        return JSONResponse({"status": "aborted", "aborted": len(ids)})

    async def _set_version(self, request: Request) -> JSONResponse:
        version = (await _body(request)).get("new_version")
        if version is None:
            raise Refusal(400, "new_version is missing", field="new_version")
        self.weight_version = str(version)
        return JSONResponse({"success": True, "new_version": self.weight_version})

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "stand_in": True})

    async def _models(self, request: Request) -> JSONResponse:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": wire.FINGERPRINT}
        return JSONResponse({"object": "list", "data": [model]})
