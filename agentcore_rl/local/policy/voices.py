"""The stand-in's voices: what it says and how it tokenizes. The server speaks through the
:class:`Voice` protocol and knows no voice by its type.

:class:`ScriptVoice` (the default) and :class:`PlayVoice` (a policy function of yours) use
a fake tokenizer: a stable id per word, punctuation mark or space run. Its fake chat template
renders ``<tools>..<end>``, then ``<role> text <end>`` per message and ``<assistant>``; an
assistant message renders exactly as the completion that produced it, so a conversation's
prompts extend each other token for token. :class:`TemplateVoice` uses a real tokenizer and
chat template (the ``render`` extra), token-in too.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from agentcore_rl.edge import Refusal
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.policy.word_problems import evaluate_arithmetic, solve_word_problem

__all__ = ["PlayFunction", "PlayVoice", "Said", "ScriptVoice", "TemplateVoice", "Voice"]

#: A user's policy: ``play(messages, tools, seed=, temperature=)`` -> the answer's text, a
#: list of tool calls (``{"name": ..., "arguments": {...}}``) or a whole assistant message.
#: ``seed`` is the request's (a fresh random one without), plus the choice's index.
PlayFunction = Callable[..., "str | list[dict[str, Any]] | dict[str, Any]"]
Answer = tuple[dict[str, Any], str]  # an assistant message and its finish reason

_TOKEN_IN: Final = "token-in needs a tokenizer (voice=TemplateVoice(tokenizer))"
# The fake vocabulary's size, like a small real tokenizer's; ids below 100 are its special
# tokens.
_VOCAB_SIZE, _FIRST_ORDINARY_ID = 32_000, 100
_ROLE_IDS: Final = {"system": 1, "user": 2, "assistant": 3, "tool": 4, "developer": 1}
_OTHER_ROLE_ID, _TOOLS_ID, _END_ID = 5, 6, 7
_TOKEN_RE: Final = re.compile(r"\w+|[^\w\s]|\s+")
_NUMBER_RE: Final = re.compile(r"-?\d+(?:\.\d+)?")
_STEP_RE: Final = re.compile(r'"step":\s*(\d+)')


@dataclass
class Said:
    """One choice: its tokens (ids, logprobs, texts), why it ended (and the stop string that
    ended it), the chat message or completion text they spell, and, when paced, which weight
    version made which tokens."""

    ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    finish: str
    stop_reason: str | None = None
    message: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    weight_versions: list[dict[str, Any]] | None = None


class Voice(Protocol):
    """A tokenizer, a chat template and what to answer: the stand-in's whole model.

    ``say`` answers choice ``index`` of a chat request (``chat``) or of a completion whose
    prompt is ``prompt_ids``, honouring the request's sampling fields it knows; a request it
    cannot answer is a :class:`~agentcore_rl.edge.Refusal`. ``by_token``: its answers stream
    one chunk per token (else in one chunk, as parsed reasoning and calls do not cut).
    """

    by_token: bool

    def render(self, body: Mapping[str, Any]) -> list[int]:
        """A chat request's prompt ids."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def say(
        self, body: Mapping[str, Any], prompt_ids: list[int], index: int, chat: bool
    ) -> Said: ...


def _logprob(salt: str, position: int, token_id: int) -> float:
    """A deterministic logprob in (-5, 0] for one sampled token."""
    digest = hashlib.blake2b(f"{salt}:{position}:{token_id}".encode(), digest_size=4)
    return -round(int.from_bytes(digest.digest(), "big") % 100_000 / 20_000, 6)


def _fake_tokens(text: str) -> list[tuple[str, int]]:
    """(piece, id) per word, punctuation mark or space run, by a stable hash (not Python's
    salted ``hash``), so the same text always gives the same ids."""
    span = _VOCAB_SIZE - _FIRST_ORDINARY_ID
    out = []
    for piece in _TOKEN_RE.findall(text):
        digest = hashlib.blake2b(piece.encode(), digest_size=4).digest()
        out.append((piece, _FIRST_ORDINARY_ID + int.from_bytes(digest, "big") % span))
    return out


def fake_token_ids(text: str) -> list[int]:
    """The fake tokenizer's ids of ``text``."""
    return [token_id for _, token_id in _fake_tokens(text)]


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return content if isinstance(content, str) else ""


def _assistant_text(message: Mapping[str, Any]) -> str:
    """An assistant turn's generated text: its content, then each tool call as tagged JSON."""
    parts = [_text_of(message)]
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {} if isinstance(call, Mapping) else {}
        payload = {"name": function.get("name"), "arguments": function.get("arguments")}
        parts.append("<tool_call>" + json.dumps(payload, sort_keys=True) + "</tool_call>")
    return "".join(parts)


def _say(text: str) -> Answer:
    return {"role": "assistant", "content": text}, "stop"


def _call(calls: list[tuple[str, object, object]]) -> Answer:
    """A message calling each ``(id, function name, arguments)``."""
    made = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]
    return {"role": "assistant", "content": None, "tool_calls": made}, "tool_calls"


class _FakeVoice:
    """The fake tokenizer and chat template; a subclass decides what to answer."""

    by_token = True

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._pieces: dict[int, str] = {}  # each id said so far -> its text (at most the vocab)

    def render(self, body: Mapping[str, Any]) -> list[int]:
        ids: list[int] = []
        if tools := body.get("tools"):
            ids += [_TOOLS_ID, *fake_token_ids(json.dumps(list(tools), sort_keys=True)), _END_ID]
        for message in body["messages"]:
            role = message.get("role")
            text = _assistant_text(message) if role == "assistant" else _text_of(message)
            ids += [_ROLE_IDS.get(str(role), _OTHER_ROLE_ID), *fake_token_ids(text), _END_ID]
        return [*ids, _ROLE_IDS["assistant"]]

    def encode(self, text: str) -> list[int]:
        return fake_token_ids(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self._pieces.get(i, "") for i in ids)

    def say(self, body: Mapping[str, Any], prompt_ids: list[int], index: int, chat: bool) -> Said:
        prompt = body.get("prompt")
        if chat:
            messages, tools = body["messages"], body.get("tools") or []
        elif isinstance(prompt, str):
            messages, tools = [{"role": "user", "content": prompt}], []
        else:
            raise Refusal(400, _TOKEN_IN, field="prompt")
        message, finish = self.answer(index, messages, tools, body)
        text = _assistant_text(message)
        tokens = _fake_tokens(text)
        self._pieces.update((i, piece) for piece, i in tokens)
        ids = [i for _, i in tokens]
        logprobs = [_logprob(f"{self.seed}:{index}", pos, i) for pos, i in enumerate(ids)]
        pieces = [piece for piece, _ in tokens]
        return Said(ids, logprobs, pieces, finish, message=message, text=text)

    def answer(
        self, index: int, messages: list[Any], tools: list[Any], body: Mapping[str, Any]
    ) -> Answer:
        raise NotImplementedError


class ScriptVoice(_FakeVoice):
    """The default voice: the word-problem solver, right with probability ``accuracy``.

    Offered tools, it first calls the first one with the arithmetic expression, then answers
    ``"The answer is N."``; otherwise it answers at once. Wrong, it slips the number by 1..5
    or skips the tool, decided by a stable hash of (``seed``, problem, the request's
    ``seed``, choice index), so a run is reproducible.

    Example::

        policy = ScriptedPolicy(voice=ScriptVoice(accuracy=0.7, seed=3))
    """

    def __init__(self, *, accuracy: float = 0.8, seed: int = 0) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ConfigurationError(f"accuracy must be between 0 and 1, got {accuracy}")
        super().__init__(seed)
        self.accuracy = accuracy

    def answer(
        self, index: int, messages: list[Any], tools: list[Any], body: Mapping[str, Any]
    ) -> Answer:
        problem = next((_text_of(m) for m in messages if m.get("role") == "user"), "")
        key = f"{self.seed}\x00{body.get('seed')}\x00{index}\x00{problem}"
        dice = hashlib.sha256(key.encode()).digest()
        right = int.from_bytes(dice[:8], "big") / 2**64 < self.accuracy
        slip = 0 if right else (1 + dice[9] % 5) * (-1 if dice[10] % 2 else 1)
        if messages[-1].get("role") == "tool":
            # The tool answered: report its (last) number, or slip when copying it.
            found = _NUMBER_RE.findall(_text_of(messages[-1]))
            if not found:
                return _say("I could not read the tool's result.")
            return _say(_answer_text(float(found[-1]) + slip))
        expression = solve_word_problem(problem)
        if expression is None:
            return _say("I am not sure how to solve this problem.")
        functions = [t["function"] for t in tools if isinstance(t, Mapping) and "function" in t]
        if functions and (right or dice[8] % 2):  # wrong, half the time it skips the tool
            params = functions[0].get("parameters") or {}
            argument = next(
                iter(params.get("required") or params.get("properties") or ["expression"])
            )
            call_id = "call_" + hashlib.sha256(f"{index}{problem}".encode()).hexdigest()[:16]
            name = functions[0].get("name", "calculator")
            return _call([(call_id, name, {str(argument): expression})])
        return _say(_answer_text(evaluate_arithmetic(expression) + slip))


class PlayVoice(_FakeVoice):
    """Your :data:`PlayFunction` says the answers, in the fake tokenizer's tokens.

    Example::

        def play(messages, tools, *, seed, temperature):
            return messages[-1]["content"][::-1]

        policy = ScriptedPolicy(voice=PlayVoice(play))
    """

    def __init__(self, play: PlayFunction, *, seed: int = 0) -> None:
        super().__init__(seed)
        self.play = play

    def answer(
        self, index: int, messages: list[Any], tools: list[Any], body: Mapping[str, Any]
    ) -> Answer:
        # A real model samples afresh without a seed.
        seed = body.get("seed")
        seed = (seed if isinstance(seed, int) else random.randrange(2**31)) + index
        temperature = body.get("temperature")
        if not isinstance(temperature, int | float):
            temperature = 1.0
        said = self.play(messages, tools, seed=seed, temperature=float(temperature))
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
        named = ((str(c.get("name", "")), c.get("arguments") or {}) for c in said)
        return _call([(f"call_{seed:x}_{i}", *call) for i, call in enumerate(named)])


def _answer_text(value: int | float) -> str:
    text = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
    return f"The answer is {text}."


class TemplateVoice:
    """The stand-in's voice on a real tokenizer and chat template (``tokenizer``, a Hugging
    Face tokenizer directory).

    It renders chat requests with the template (transformers, as vLLM does) and answers in
    its syntax, written by the parsers the gateway reads with: a reasoning block when a
    reasoning parser is named, tool calls in the tool-call parser's syntax, the stop token.
    While fewer than ``tool_rounds`` of its own calls (each carries ``"step": k``) are in the
    prompt it calls the tool again; then it answers with the prompt's last number. The
    answer depends on the prompt's text only, so chat and token-in requests agree. Its
    answers stream in one chunk.

    Example::

        voice = TemplateVoice("/tmp/qwen3", tool_call_parser="hermes", tool_rounds=3)
        policy = ScriptedPolicy(voice, serving=Serving(token_ids="requested"))
    """

    by_token = False

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
            raise ConfigurationError(f"tool_rounds must be >= 0, got {tool_rounds}")
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
            raise ConfigurationError(f"the tokenizer in {tokenizer!r} names no EOS token")
        call_stop = self.tools and self.tools.call_stop
        found = call_stop and self.template.tokenizer.convert_tokens_to_ids(call_stop)
        self.stop_id, self._call_stop = eos, found if isinstance(found, int) else eos
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

    def say(self, body: Mapping[str, Any], prompt_ids: list[int], index: int, chat: bool) -> Said:
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
        said = Said(ids, logprobs, tokens, finish, reason)
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
