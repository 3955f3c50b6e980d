"""A scripted OpenAI-compatible server: a STAND-IN for vLLM/SGLang, not a language model.

It speaks enough of the OpenAI API for the OpenAI SDK and agents written against vLLM: chat
(with OpenAI tool calls) and text completions, streamed (SSE) or not, ``/v1/models``, and
vLLM's capture fields (``prompt_token_ids``, ``token_ids``, ``logprobs``), in one of two
voices: a fake tokenizer (:class:`_ScriptVoice`), or with ``tokenizer=DIR`` a real chat
template (:class:`TemplateVoice`).

It answers the first user message with a pattern-based solver (:mod:`.policy_solver`):
offered tools, it first calls the first one with the arithmetic expression, then answers
``"The answer is N."``. With probability ``1 - accuracy`` it slips or skips the tool,
decided by a stable hash of (``seed``, problem, the request's ``seed``, choice index).
Given a :data:`PlayFunction` (``play=``) it says what that function says instead.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate
from typing import Any, Final, Literal, TypeGuard

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentcore_rl.edge import Refusal, read_body
from agentcore_rl.local.policy_solver import (
    evaluate_arithmetic,
    fake_token_ids,
    fake_tokens,
    solve_word_problem,
)

__all__ = ["DEFAULT_POLICY_MODEL", "PlayFunction", "ScriptedPolicy"]

#: The model name the stand-in reports (any requested name is accepted and echoed).
DEFAULT_POLICY_MODEL: Final = "scripted-policy"
#: Marks every response, so nobody mistakes the stand-in for a real model.
_FINGERPRINT: Final = "agentcore-rl-scripted-stand-in"
_MAX_CHOICES: Final = 16
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
# The fake chat template's special tokens (ids below 100 are reserved by the tokenizer).
_ROLE_IDS: Final = {"system": 1, "user": 2, "assistant": 3, "tool": 4, "developer": 1}
_OTHER_ROLE_ID: Final = 5
_TOOLS_ID: Final = 6
_END_ID: Final = 7
_STEP_RE: Final = re.compile(r'"step":\s*(\d+)')
_NUMBER_RE: Final = re.compile(r"-?\d+(?:\.\d+)?")

_TOKEN_IN: Final = "token-in needs a tokenizer (ScriptedPolicy(tokenizer=))"

TokenIdsMode = Literal["always", "requested", "never"]
#: A user's policy: ``play(messages, tools, seed=, temperature=)`` -> the answer's text, a
#: list of tool calls (``{"name": ..., "arguments": {...}}``) or a whole assistant message.
#: ``seed`` is the request's (a fresh random one without), plus the choice's index.
PlayFunction = Callable[..., "str | list[dict[str, Any]] | dict[str, Any]"]


@dataclass(frozen=True)
class _Draw:
    """The per-(problem, sample) dice: whether to be right, how to be wrong, by how much."""

    correct: bool
    skip_tool: bool
    slip: int

    @classmethod
    def roll(cls, key: str, accuracy: float) -> _Draw:
        digest = hashlib.sha256(key.encode()).digest()
        unit = int.from_bytes(digest[:8], "big") / 2**64
        slip = 1 + digest[9] % 5
        return cls(
            correct=unit < accuracy,
            skip_tool=digest[8] % 2 == 0,
            slip=-slip if digest[10] % 2 else slip,
        )


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _assistant_text(message: Mapping[str, Any]) -> str:
    """An assistant turn's generated text: its content, then each tool call as tagged JSON."""
    parts = [_text_of(message)]
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {} if isinstance(call, Mapping) else {}
        payload = {"name": function.get("name"), "arguments": function.get("arguments")}
        parts.append("<tool_call>" + json.dumps(payload, sort_keys=True) + "</tool_call>")
    return "".join(parts)


def _logprob(salt: str, position: int, token_id: int) -> float:
    """A deterministic logprob in (-5, 0] for one sampled token."""
    digest = hashlib.blake2b(f"{salt}:{position}:{token_id}".encode(), digest_size=4)
    return -round(int.from_bytes(digest.digest(), "big") % 100_000 / 20_000, 6)


def _tool_argument_name(tool: Mapping[str, Any]) -> str:
    params = tool.get("function", {}).get("parameters") or {}
    required = params.get("required") or []
    if required:
        return str(required[0])
    props = params.get("properties") or {}
    return next(iter(props), "expression")


@dataclass
class _Said:
    """One choice as a voice says it: its tokens (ids, logprobs, texts), why it ended, and
    the chat message or completion text they spell."""

    ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    finish: str
    stop_reason: str | None = None
    message: dict[str, Any] = field(default_factory=dict)
    text: str = ""


class _ScriptVoice:
    """The default voice: a fake tokenizer and the pattern-based solver.

    The fake chat template renders ``<tools>..<end>``, then ``<role> text <end>`` per message
    and ``<assistant>``; an assistant message renders exactly as the completion that produced
    it, so a conversation's prompts extend each other token for token. Its completions
    stream token by token. Token-in requests need a real tokenizer."""

    def __init__(self, accuracy: float, seed: int, play: PlayFunction | None = None) -> None:
        self.accuracy = accuracy
        self.seed = seed
        self.play = play
        self._pieces: dict[int, str] = {}  # each id said so far -> its text (at most the vocab)

    def render(self, body: Mapping[str, Any]) -> list[int]:
        ids: list[int] = []
        if tools := body.get("tools"):
            ids.append(_TOOLS_ID)
            ids.extend(fake_token_ids(json.dumps(list(tools), sort_keys=True)))
            ids.append(_END_ID)
        for message in body["messages"]:
            role = message.get("role")
            ids.append(_ROLE_IDS.get(str(role), _OTHER_ROLE_ID))
            text = _assistant_text(message) if role == "assistant" else _text_of(message)
            ids.extend(fake_token_ids(text))
            ids.append(_END_ID)
        ids.append(_ROLE_IDS["assistant"])
        return ids

    def encode(self, text: str) -> list[int]:
        return fake_token_ids(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self._pieces.get(i, "") for i in ids)

    def say(self, body: Mapping[str, Any], prompt_ids: list[int], index: int, chat: bool) -> _Said:
        """Choice ``index`` of a chat request (``chat``), else of a string prompt's completion."""
        if chat:
            messages, tools = body["messages"], body.get("tools") or []
        elif isinstance(body["prompt"], str):
            messages, tools = [{"role": "user", "content": body["prompt"]}], []
        else:
            raise Refusal(400, _TOKEN_IN, field="prompt")
        if self.play is not None:
            message, finish = self._played(index, messages, tools, body)
        else:
            message, finish = self._choose(index, messages, tools, body.get("seed"))
        text = _assistant_text(message)
        tokens = fake_tokens(text)
        self._pieces.update((i, piece) for piece, i in tokens)
        ids = [i for _, i in tokens]
        logprobs = [_logprob(f"{self.seed}:{index}", pos, i) for pos, i in enumerate(ids)]
        pieces = [piece for piece, _ in tokens]
        return _Said(ids, logprobs, pieces, finish, message=message, text=text)

    def _played(
        self, index: int, messages: list[Any], tools: list[Any], body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], str]:
        """The user's function's answer as a message: a real model samples without a seed."""
        assert self.play is not None
        seed = body.get("seed")
        seed = seed if isinstance(seed, int) else random.randrange(2**31)
        temperature = body.get("temperature")
        said = self.play(
            messages,
            tools,
            seed=seed + index,
            temperature=float(temperature) if isinstance(temperature, int | float) else 1.0,
        )
        if isinstance(said, str):
            return _say(said)
        if isinstance(said, Mapping):
            message = {"role": "assistant", "content": said.get("content"), **said}
            return message, "tool_calls" if message.get("tool_calls") else "stop"
        if not isinstance(said, list) or not all(isinstance(c, Mapping) for c in said):
            raise TypeError(
                f"the policy function returned {type(said).__name__}: give a str, a list of "
                "tool calls or an assistant message dict"
            )
        calls = [
            {
                "id": f"call_{seed + index:x}_{i}",
                "type": "function",
                "function": {
                    "name": str(call.get("name", "")),
                    "arguments": json.dumps(call.get("arguments") or {}),
                },
            }
            for i, call in enumerate(said)
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def _choose(
        self, index: int, messages: list[Any], tools: list[Any], request_seed: object
    ) -> tuple[dict[str, Any], str]:
        problem = next((_text_of(m) for m in messages if m.get("role") == "user"), "")
        draw = _Draw.roll(f"{self.seed}\x00{request_seed}\x00{index}\x00{problem}", self.accuracy)
        expression = solve_word_problem(problem)
        last = messages[-1]
        function_tools = [t for t in tools if isinstance(t, Mapping) and "function" in t]

        if last.get("role") == "tool":
            # The tool answered: report its (last) number, or slip when copying it.
            value = _last_number(_text_of(last))
            if value is None:
                return _say("I could not read the tool's result.")
            return _say(_answer_text(value, draw))
        if expression is None:
            return _say("I am not sure how to solve this problem.")
        value = evaluate_arithmetic(expression)
        if function_tools and (draw.correct or not draw.skip_tool):
            tool = function_tools[0]
            name = str(tool["function"].get("name", "calculator"))
            arguments = json.dumps({_tool_argument_name(tool): expression})
            call_id = "call_" + hashlib.sha256(f"{index}{problem}".encode()).hexdigest()[:16]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
            return message, "tool_calls"
        return _say(_answer_text(value, draw))


class TemplateVoice:
    """The stand-in's voice on a real tokenizer and chat template.

    It renders chat requests with the template (transformers, as vLLM does) and answers in
    its syntax, written by the parsers the gateway reads with: a reasoning block when a
    reasoning parser is named, tool calls in the tool-call parser's syntax, the stop token.
    While fewer than ``tool_rounds`` of its own calls (each carries ``"step": k``) are in the
    prompt it calls the tool again; then it answers with the prompt's last number. The
    answer depends on the prompt's text only, so chat and token-in requests agree.
    """

    def __init__(
        self,
        tokenizer: str,
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        tool_rounds: int = 1,
        seed: int = 0,
    ) -> None:
        if tool_rounds < 0:
            raise ValueError(f"tool_rounds must be >= 0, got {tool_rounds}")
        # lazy: the render extra, only with a real template (--tokenizer)
        from agentcore_rl.gateway.render.parsers import reasoning_parser_named, tool_parser_named
        from agentcore_rl.gateway.render.template import ChatTemplate

        self.template = ChatTemplate.load(tokenizer)
        self.tools = tool_parser_named(tool_call_parser)
        self.reasoning = reasoning_parser_named(reasoning_parser)
        self.tool_rounds = tool_rounds
        self.seed = seed
        eos = self.template.tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise ValueError(f"the tokenizer in {tokenizer!r} names no EOS token")
        self.stop_id = eos
        self._call_stop = eos
        if self.tools is not None and self.tools.call_stop is not None:
            found = self.template.tokenizer.convert_tokens_to_ids(self.tools.call_stop)
            if isinstance(found, int):
                self._call_stop = found
        self._stops = self.template.stop_ids()

    def render(self, body: Mapping[str, Any]) -> list[int]:
        """A chat request's prompt ids."""
        # lazy: the render extra, only with a real template (--tokenizer)
        from agentcore_rl.gateway.render.template import RenderError

        try:
            text = self.template.render(
                body["messages"],
                tools=body.get("tools") or None,
                kwargs=body.get("chat_template_kwargs"),
            )
            return self.template.encode(text)
        except RenderError as exc:
            raise Refusal(400, str(exc), field="messages") from None

    def encode(self, text: str) -> list[int]:
        return self.template.encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.template.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int | None = None,
        *,
        stop: Sequence[str] = (),
        logit_bias: Mapping[str, float] | None = None,
        min_tokens: int = 0,
    ) -> tuple[list[int], list[float], str, str | None]:
        """-> (completion ids, logprobs, finish reason, the stop string that ended it), as vLLM:
        a stop string ends it with the token that holds it (one ending within the first
        ``min_tokens`` tokens does not); a ``logit_bias`` of -100 on the stop token means it
        never stops by itself; ``min_tokens`` repeats the answer before its end token."""
        text = self.template.decode(prompt_ids)
        steps = [int(s) for s in _STEP_RE.findall(text)]
        done = max(steps, default=0)
        parts = []
        if done < self.tool_rounds and self.tools is not None:
            from agentcore_rl.gateway.render.parsers import ToolCall

            step = done + 1
            if self.reasoning is not None:
                parts.append(self.reasoning.format(f"Step {step}: I ask the calculator."))
            call = ToolCall("calculator", {"expression": f"{10 * step} + {step}", "step": step})
            parts.append(self.tools.format([call]))
            end_id = self._call_stop
        else:
            numbers = _NUMBER_RE.findall(text[text.rfind('"step"') :] if steps else text)
            value = numbers[-1] if numbers else "unknown"
            if self.reasoning is not None:
                parts.append(self.reasoning.format("The tool has answered."))
            content = f"The answer is {value}."
            final = getattr(self.tools, "format_content", None)
            parts.append(final(content) if final is not None else content)
            end_id = self.stop_id
        ids = [*self.template.encode("".join(parts)), end_id]
        finish, reason = "stop", None
        if float((logit_bias or {}).get(str(end_id), 0)) <= -100:  # it cannot stop: it rambles
            ids, finish = ids[:-1] + self.template.encode(" and so on") * 16, "length"
        if finish == "stop" and 1 < len(ids) <= min_tokens:
            ids = [*(ids[:-1] * (min_tokens // (len(ids) - 1) + 1))[:min_tokens], ids[-1]]
        # vLLM looks for stop strings (in order) ending in each new token's text once
        # min_tokens are out
        for end in range(min_tokens + 1, len(ids) + 1) if stop else ():
            seen = len(self.decode(ids[: end - 1], skip_special_tokens=True))
            text = self.decode(ids[:end], skip_special_tokens=True)
            found = [s for s in stop if s and text.find(s, max(seen - len(s) + 1, 0)) >= 0]
            if found:
                ids, reason, finish = ids[:end], found[0], "stop"
                break
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish, reason = ids[:max_tokens], "length", None
        return ids, [_logprob(str(self.seed), i, t) for i, t in enumerate(ids)], finish, reason

    def say(self, body: Mapping[str, Any], prompt_ids: list[int], index: int, chat: bool) -> _Said:
        """The completion cut before its stop string; a chat one as vLLM's parsers read it."""
        from agentcore_rl.gateway.render.parsers import parse_completion

        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
        bias = body.get("logit_bias")
        ids, logprobs, finish, reason = self.generate(
            prompt_ids,
            (body.get("max_completion_tokens") if chat else None) or body.get("max_tokens"),
            stop=[s for s in stops if isinstance(s, str)],
            logit_bias=bias if isinstance(bias, Mapping) else None,
            min_tokens=int(body.get("min_tokens") or 0),
        )
        tokens = [str(t) for t in self.template.tokenizer.convert_ids_to_tokens(ids)]
        said = _Said(ids, logprobs, tokens, finish, reason)
        skip = not chat and bool(body.get("skip_special_tokens", True))
        text = self.decode(ids[:-1] if chat and ids and ids[-1] in self._stops else ids, skip)
        if reason:  # the occurrence that ends in the last token's text, as vLLM cuts
            before = len(self.decode(ids[:-1], skip)) - len(reason) + 1
            text = text[: text.find(reason, max(before, 0))]
        if not chat:
            said.text = text
            return said
        seed = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
        said.message = parse_completion(text, self.reasoning, self.tools, seed)
        if said.message.get("tool_calls"):
            said.finish = "tool_calls"
        return said


class ScriptedPolicy:
    """The stand-in policy server as an ASGI app (serve it with uvicorn/BackgroundServer).

    ``accuracy`` (0..1) is how often it answers correctly; ``seed`` makes runs reproducible;
    ``latency`` seconds are waited per request (``sleep`` is injectable). ``token_ids``:
    ``"always"``, ``"requested"`` (vLLM's ``return_token_ids``) or ``"never"``. ``requests``
    counts completion requests, bad ones included; ``answers`` keeps the last
    ``keep_answers`` ``(prompt_ids, [(token_ids, logprobs) per choice])``.
    ``tokenizer`` (with ``tool_call_parser``, ``reasoning_parser``, ``tool_rounds``): answer
    as that real chat template's model would, also token-in (``/v1/completions`` with token
    ids, SGLang's ``/generate``). There ``token_rate`` (tokens per second) paces token-in
    completions under vLLM's weight-sync routes (``/pause?mode=keep|abort``, ``/resume``,
    ``/abort_requests``, ``/update_weight_version``): a kept request waits for the resume, an
    aborted one answers its tokens so far (``finish_reason`` ``"abort"``), and each choice
    says which version made which tokens (``weight_versions``; ``made`` keeps them all).
    ``min_tokens`` is honoured by repeating the answer before its end token. ``play``: a
    :data:`PlayFunction` of yours says the answers (your task's voice) in the fake
    tokenizer's tokens; the math solver is the default.

    Example::

        policy = ScriptedPolicy(accuracy=0.7, latency=0.05)
        async with BackgroundServer(policy) as server:
            base_url = server.url + "/v1"      # give this to agents as _rollout.base_url
    """

    def __init__(
        self,
        *,
        accuracy: float = 0.8,
        seed: int = 0,
        latency: float = 0.0,
        model: str = DEFAULT_POLICY_MODEL,
        token_ids: TokenIdsMode = "always",
        keep_answers: int = 0,
        tokenizer: str | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        tool_rounds: int = 1,
        token_rate: float = 0.0,
        play: PlayFunction | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if play is not None and tokenizer is not None:
            raise ValueError("give play (your policy function) or tokenizer, not both")
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy must be between 0 and 1, got {accuracy}")
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency}")
        self.latency = latency
        self.model = model
        self.token_ids = token_ids
        self.keep_answers = keep_answers
        self.answers: list[tuple[list[int], list[tuple[list[int], list[float]]]]] = []
        self.requests = 0
        self.last_request: Any = None  # the last body served (what the gateway forwarded)
        self._sleep = sleep
        self.token_rate = token_rate
        self.weight_version = "0"
        self._paused = False
        self._changed = asyncio.Event()  # set (and replaced) at each pause, resume or abort
        self._aborted: set[str] = set()
        # paced completions as made: (prompt ids, token ids, each token's weight version)
        self.made: list[tuple[list[int], list[int], list[str]]] = []
        self.tokens_made = 0  # so far, the ones being made included
        self.voice: _ScriptVoice | TemplateVoice = (
            _ScriptVoice(accuracy, seed, play)
            if tokenizer is None  # else a real template: render and answer as that model would
            else TemplateVoice(
                tokenizer,
                tool_call_parser=tool_call_parser,
                reasoning_parser=reasoning_parser,
                tool_rounds=tool_rounds,
                seed=seed,
            )
        )
        self.app = Starlette(
            routes=[
                Route(
                    "/v1/chat/completions",
                    partial(
                        self._serve, answer=self.complete, chunk_object="chat.completion.chunk"
                    ),
                    methods=["POST"],
                ),
                Route(
                    "/v1/completions",
                    partial(self._serve, answer=self.complete_text, chunk_object="text_completion"),
                    methods=["POST"],
                ),
                Route("/generate", partial(self._serve, answer=self._generate), methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/pause", self._pause, methods=["POST"]),
                Route("/resume", self._resume, methods=["POST"]),
                Route("/abort_requests", self._abort, methods=["POST"]),
                Route("/update_weight_version", self._set_version, methods=["POST"]),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _pause(self, request: Request) -> JSONResponse:
        mode = request.query_params.get("mode", "abort")
        if mode not in ("keep", "abort"):
            return _error(Refusal(400, f"pause mode {mode!r}: the stand-in keeps or aborts"))
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
        ids = (await request.json()).get("request_ids") or ["*"]
        self._aborted.update(ids)
        self._notify()
        return JSONResponse({"status": "aborted", "aborted": len(ids)})

    async def _set_version(self, request: Request) -> JSONResponse:
        self.weight_version = str((await request.json())["new_version"])
        return JSONResponse({"success": True, "new_version": self.weight_version})

    async def _decode(self, choice: dict[str, Any], request_id: str) -> None:
        """Generate ``choice``'s tokens at ``token_rate``, as a kept pause and an abort leave
        them: cut at an abort, each span labelled with the weight version that made it."""
        ids = choice["token_ids"]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        spans: list[dict[str, Any]] = []
        step = max(1, round(self.token_rate * 0.05))  # tokens per wake-up: 20 a second
        made = 0
        while made < len(ids):
            await self._sleep(step / self.token_rate)
            while self._paused and not self._aborted & {request_id, "*"}:
                await self._changed.wait()
            if self._aborted & {request_id, "*"}:
                choice["finish_reason"] = "abort"
                break
            end = min(len(ids), made + step)
            if spans and spans[-1]["version"] == self.weight_version:
                spans[-1]["end"] = end
            else:
                spans.append({"version": self.weight_version, "start": made, "end": end})
            self.tokens_made += end - made
            made = end
        self._aborted.discard(request_id)
        del ids[made:], logprobs[made:]
        choice["weight_versions"] = spans
        versions = [s["version"] for s in spans for _ in range(s["end"] - s["start"])]
        self.made.append((choice.get("prompt_token_ids") or [], list(ids), versions))

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "stand_in": True})

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": _FINGERPRINT}
                ],
            }
        )

    def _generate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """SGLang's ``/generate`` with ``input_ids`` (a real template only)."""
        ids = body.get("input_ids")
        if not isinstance(self.voice, TemplateVoice):
            raise Refusal(400, _TOKEN_IN)
        if not _is_ids(ids):
            raise Refusal(400, "input_ids must be a non-empty list of token ids")
        params = body.get("sampling_params") or {}
        completion, logprobs, finish, _ = self.voice.generate(ids, params.get("max_new_tokens"))
        self._remember(ids, [(completion, logprobs)])
        reason: dict[str, Any] = {"type": finish}
        if finish == "stop":
            reason["matched"] = completion[-1]
        meta: dict[str, Any] = {
            "id": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:24],
            "finish_reason": reason,
            "prompt_tokens": len(ids),
            "completion_tokens": len(completion),
            "cached_tokens": 0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(logprobs, completion, strict=True)
            ]
        text = self.voice.decode(completion, skip_special_tokens=True)
        return {"text": text, "output_ids": completion, "meta_info": meta}

    async def _serve(
        self,
        request: Request,
        *,
        answer: Callable[[Mapping[str, Any]], dict[str, Any]],
        chunk_object: str = "",
    ) -> Response:
        """Count, parse and answer a request; pace and stream the answer when asked."""
        self.requests += 1
        try:
            body = self.last_request = await _body(request)
            response = answer(body)
        except Refusal as exc:
            return _error(exc)
        if self.latency:
            await self._sleep(self.latency)
        choice = (response.get("choices") or [{}])[0]  # /generate: no choices, never paced
        if self.token_rate and "token_ids" in choice:
            await self._decode(choice, f"cmpl-{body.get('request_id')}-0")
            choice["text"] = self.voice.decode(choice["token_ids"])
            response["usage"]["completion_tokens"] = len(choice["token_ids"])
        if not (body.get("stream") and chunk_object):
            return JSONResponse(response)
        options = body.get("stream_options")
        usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
        # A real template's answer streams in one chunk: parsed reasoning and calls do not cut
        # per token.
        by_token = isinstance(self.voice, _ScriptVoice)
        return StreamingResponse(
            _sse(response, chunk_object, usage, by_token),
            media_type="text/event-stream",
        )

    def _remember(self, prompt_ids: list[int], taken: list[tuple[list[int], list[float]]]) -> None:
        if self.keep_answers:
            self.answers.append((prompt_ids, taken))
            del self.answers[: -self.keep_answers]

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one chat-completions request body (what the HTTP route serves)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Refusal(400, "messages must be a non-empty list", field="messages")
        if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
            raise Refusal(
                400, "every message must be an object with a string role", field="messages"
            )
        if not isinstance(body.get("tools") or [], list):
            raise Refusal(400, "tools must be a list", field="tools")
        prompt_ids = self.voice.render(body)
        said = [self.voice.say(body, prompt_ids, i, True) for i in range(_choices_wanted(body))]
        choices = []
        for i, one in enumerate(said):
            choice = {"index": i, "message": one.message, "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "content": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(one.tokens, one.logprobs, strict=True)
                    ]
                }
            choices.append(choice)
        return self._envelope(body, "chat.completion", prompt_ids, choices, said)

    def complete_text(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one ``/v1/completions`` request body (a string or token-id ``prompt``)."""
        prompt = body.get("prompt")
        prompt_ids = self.voice.encode(prompt) if isinstance(prompt, str) and prompt else prompt
        if not _is_ids(prompt_ids):
            raise Refusal(
                400, "prompt must be a non-empty string or list of token ids", field="prompt"
            )
        said = [self.voice.say(body, prompt_ids, i, False) for i in range(_choices_wanted(body))]
        top = body.get("logprobs")
        alternatives = top if isinstance(top, int) else 0
        choices = []
        for i, one in enumerate(said):
            choice: dict[str, Any] = {"index": i, "text": one.text, "logprobs": None}
            if top is not None and top is not False:
                choice["logprobs"] = {
                    "tokens": one.tokens,
                    "token_logprobs": one.logprobs,
                    # the sampled token first, then made-up runners-up (vLLM: the top ``top``)
                    "top_logprobs": [
                        {t: lp, **{f"<alt{j}>": lp - j for j in range(1, alternatives)}}
                        for t, lp in zip(one.tokens, one.logprobs, strict=True)
                    ]
                    if alternatives
                    else None,
                    "text_offset": [0, *accumulate(len(t) for t in one.tokens)][:-1],
                }
            choices.append(choice)
        return self._envelope(body, "text_completion", prompt_ids, choices, said)

    def _envelope(
        self,
        body: Mapping[str, Any],
        kind: str,
        prompt_ids: list[int],
        choices: list[dict[str, Any]],
        said: list[_Said],
    ) -> dict[str, Any]:
        """The response around ``choices`` (remembered first), with what every choice says."""
        self._remember(prompt_ids, [(one.ids, one.logprobs) for one in said])
        wants_ids = self.token_ids == "always" or (
            self.token_ids == "requested" and bool(body.get("return_token_ids"))
        )
        for choice, one in zip(choices, said, strict=True):
            choice["finish_reason"], choice["stop_reason"] = one.finish, one.stop_reason
            if wants_ids:
                choice["token_ids"] = one.ids
                if kind == "text_completion":
                    choice["prompt_token_ids"] = prompt_ids
        model = body.get("model") if isinstance(body.get("model"), str) else self.model
        completion_tokens = sum(len(one.ids) for one in said)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode())
        response = {
            "id": ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + digest.hexdigest()[:24],
            "object": kind,
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": _FINGERPRINT,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }
        if kind == "chat.completion" and wants_ids:
            response["prompt_token_ids"] = prompt_ids
        return response


def _answer_text(value: int | float, draw: _Draw) -> str:
    if not draw.correct:
        value = value + draw.slip
    text = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
    return f"The answer is {text}."


async def _body(request: Request) -> Mapping[str, Any]:
    raw = await read_body(request.receive, request.scope["headers"], limit=_MAX_BODY_BYTES)
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refusal(400, "request body is not valid JSON") from None
    if not isinstance(body, Mapping):
        raise Refusal(400, "request body must be a JSON object")
    return body


def _is_ids(value: object) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    )


def _choices_wanted(body: Mapping[str, Any]) -> int:
    n = body.get("n", 1) or 1
    if not isinstance(n, int) or not 1 <= n <= _MAX_CHOICES:
        raise Refusal(400, f"n must be an integer from 1 to {_MAX_CHOICES}", field="n")
    return n


def _last_number(text: str) -> int | float | None:
    found = _NUMBER_RE.findall(text)
    if not found:
        return None
    number = float(found[-1])
    return int(number) if number.is_integer() else number


def _say(text: str) -> tuple[dict[str, Any], str]:
    return {"role": "assistant", "content": text}, "stop"


async def _sse(
    response: dict[str, Any],
    kind: str,
    usage: bool,
    by_token: bool,
) -> AsyncIterator[str]:
    """An answer as vLLM streams it: a role chunk (with the prompt ids), one chunk per token
    when ``by_token`` (else, and for tool calls, one chunk), the finish reason, usage, DONE."""
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = kind
    chat = kind == "chat.completion.chunk"

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return "data: " + json.dumps({**head, "choices": choices, **extra}) + "\n\n"

    for choice in response["choices"]:
        index = choice["index"]
        ids = choice.get("token_ids")
        logprobs = choice.get("logprobs")
        if chat:
            extra = {}
            if "prompt_token_ids" in response and index == 0:
                extra["prompt_token_ids"] = response["prompt_token_ids"]
            role = {"index": index, "delta": {"role": "assistant", "content": ""}}
            yield event([{**role, "logprobs": None, "finish_reason": None}], **extra)
            message = choice["message"]
            calls = message.get("tool_calls")
            if calls or not by_token:  # one delta carrying all its tokens
                delta = {k: v for k, v in message.items() if k != "role"}
                if calls:
                    delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
                yield event(
                    [{**{k: v for k, v in choice.items() if k != "message"}, "delta": delta}]
                )
                continue
        elif not by_token:  # the whole text in one chunk
            yield event([choice])
            continue
        text = (message.get("content") or "") if chat else choice["text"]
        pieces = [piece for piece, _ in fake_tokens(text)]
        for pos, piece in enumerate(pieces):
            out = {"index": index}
            out.update({"delta": {"content": piece}} if chat else {"text": piece})
            # a slice of each list: chat's "content", completions' "tokens", "token_logprobs"...
            out["logprobs"] = logprobs and {
                k: v[pos : pos + 1] if isinstance(v, list) else v for k, v in logprobs.items()
            }
            if pos == 0 and "prompt_token_ids" in choice:  # completions: the prompt's ids
                out["prompt_token_ids"] = choice["prompt_token_ids"]
            out["finish_reason"] = choice["finish_reason"] if pos == len(pieces) - 1 else None
            if ids is not None:
                out["token_ids"] = ids[pos : pos + 1]
            yield event([out])
    if usage:
        yield event([], usage=response["usage"])
    yield "data: [DONE]\n\n"


def _error(exc: Refusal) -> JSONResponse:
    """A refusal in OpenAI's error shape, as vLLM answers."""
    error = {"message": exc.message, "type": "invalid_request_error", "param": exc.field}
    return JSONResponse({"error": {**error, "code": None}}, status_code=exc.status)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentcore_rl.local.policy [--tokenizer DIR ...]``: serve the stand-in.

    Example::

        python -m agentcore_rl.local.policy --port 8000 --tokenizer /tmp/qwen3 \\
            --tool-call-parser hermes --reasoning-parser qwen3 --tool-rounds 3
    """
    # lazy: only the command line serves
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m agentcore_rl.local.policy",
        description="The scripted stand-in policy (not a language model) as an OpenAI server; "
        "with --tokenizer it renders that real chat template and also answers token-in "
        "(/v1/completions with token ids, /generate).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--accuracy", type=float, default=0.8)
    parser.add_argument("--tokenizer", metavar="DIR", help="a Hugging Face tokenizer directory")
    parser.add_argument("--tool-call-parser", help="the syntax of its tool calls (vLLM's names)")
    parser.add_argument("--reasoning-parser", help="the syntax of its reasoning (vLLM's names)")
    parser.add_argument("--tool-rounds", type=int, default=1, help="tool calls before answering")
    args = parser.parse_args(argv)
    try:
        policy = ScriptedPolicy(
            accuracy=args.accuracy,
            tokenizer=args.tokenizer,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            tool_rounds=args.tool_rounds,
        )
    except (ValueError, ImportError, OSError) as exc:
        parser.error(str(exc))
    print(
        f"scripted stand-in policy (not a language model) on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(policy, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
