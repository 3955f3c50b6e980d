"""The stand-in policy's voice on a real tokenizer and chat template.

With ``ScriptedPolicy(tokenizer=DIR, ...)`` the stand-in behaves like an inference server
serving that model: it renders chat requests with the template (transformers, as vLLM does)
and answers in the template's own syntax, written by the same parsers the gateway reads with
(:mod:`agentcore_rl.gateway.render.parsers`): a reasoning block when a reasoning parser is
named, tool calls in the tool-call parser's syntax, then the template's stop token. It also
answers token-in, as vLLM's ``/v1/completions`` with a token-id prompt and SGLang's
``/generate`` with ``input_ids`` do.

What it says is scripted from the prompt's text, so a chat request and the same prompt as
ids get the same answer: while fewer than ``tool_rounds`` of its own calls appear in the
prompt (each call carries ``"step": k``), it calls the tool once more; then it answers with
the last number in the prompt (the tool's last result). Still not a language model.

Example::

    voice = TemplateVoice("/tmp/qwen3", tool_call_parser="hermes", reasoning_parser="qwen3")
    ids, logprobs, finish, stop_reason = voice.generate(voice.template.encode(prompt_text))
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from agentcore_rl.gateway.render.parsers import (
    ToolCall,
    parse_completion,
    reasoning_parser_named,
    tool_parser_named,
)
from agentcore_rl.gateway.render.template import ChatTemplate

__all__ = ["TemplateVoice"]

_STEP: Final = re.compile(r'"step":\s*(\d+)')
_NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?")


def _logprob(seed: int, position: int, token_id: int) -> float:
    digest = hashlib.blake2b(f"{seed}:{position}:{token_id}".encode(), digest_size=4)
    return -round(int.from_bytes(digest.digest(), "big") % 100_000 / 20_000, 6)


class TemplateVoice:
    """Renders, "decides" and writes completions in a real template's syntax (module doc)."""

    def __init__(
        self,
        tokenizer: str,
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        tool_rounds: int = 1,
        tool_name: str = "calculator",
        seed: int = 0,
    ) -> None:
        if tool_rounds < 0:
            raise ValueError(f"tool_rounds must be >= 0, got {tool_rounds}")
        self.template = ChatTemplate.load(tokenizer)
        self.tools = tool_parser_named(tool_call_parser)
        self.reasoning = reasoning_parser_named(reasoning_parser)
        self.tool_rounds = tool_rounds
        self.tool_name = tool_name
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

    def __repr__(self) -> str:
        return f"TemplateVoice({self.template.source!r})"

    def render(self, body: Mapping[str, Any]) -> list[int]:
        """A chat request's prompt ids (raises ``RenderError``)."""
        text = self.template.render(
            body["messages"],
            tools=body.get("tools") or None,
            kwargs=body.get("chat_template_kwargs"),
        )
        return self.template.encode(text)

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int | None = None,
        *,
        stop: Sequence[str] = (),
        logit_bias: Mapping[str, float] | None = None,
    ) -> tuple[list[int], list[float], str, str | None]:
        """-> (completion ids, their logprobs, finish reason, the stop string that ended it)
        for a prompt. As vLLM: a stop string ends the completion with the token that holds
        it; a ``logit_bias`` of -100 on the stop token means it never stops by itself."""
        text = self.template.decode(prompt_ids)
        steps = [int(s) for s in _STEP.findall(text)]
        done = max(steps, default=0)
        parts = []
        if done < self.tool_rounds and self.tools is not None:
            step = done + 1
            if self.reasoning is not None:
                parts.append(self.reasoning.format(f"Step {step}: I ask the {self.tool_name}."))
            call = ToolCall(self.tool_name, {"expression": f"{10 * step} + {step}", "step": step})
            parts.append(self.tools.format([call]))
            end_id = self._call_stop
        else:
            numbers = _NUMBER.findall(text[text.rfind('"step"') :] if steps else text)
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
        decode = self.template.tokenizer.decode
        for end in range(1, len(ids) + 1) if stop else ():
            text = decode(ids[:end], skip_special_tokens=True)
            found = [s for s in stop if s and s in text]
            if found:
                ids, reason, finish = ids[:end], min(found, key=text.find), "stop"
                break
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish, reason = ids[:max_tokens], "length", None
        return ids, [_logprob(self.seed, i, t) for i, t in enumerate(ids)], finish, reason

    def message(
        self, ids: list[int], call_seed: str, stop_reason: str | None = None
    ) -> dict[str, Any]:
        """The completion as an OpenAI assistant message, parsed as vLLM's parsers would
        (the text ends before the stop string that ended it)."""
        stopped = bool(ids) and ids[-1] in self._stops
        text = self.template.decode(ids[:-1] if stopped else ids)
        if stop_reason:
            text = text[: text.find(stop_reason)]
        return parse_completion(text, self.reasoning, self.tools, call_seed)

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each id's text (for logprob entries)."""
        convert: Callable[[list[int]], list[str]] = self.template.tokenizer.convert_ids_to_tokens
        return [str(t) for t in convert(ids)]
