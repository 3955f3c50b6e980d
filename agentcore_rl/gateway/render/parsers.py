"""Reasoning and tool-call parsers by vLLM's names (docs/gateway.md): the completion decoded
with its special tokens, stop token cut off -> ``reasoning_content``, ``content``, ``tool_calls``.
Each also writes its syntax (``format``), which the stand-in policy answers in."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ReasoningParser",
    "ToolCall",
    "ToolParser",
    "parse_completion",
    "reasoning_parser_named",
    "tool_parser_named",
]

_P = TypeVar("_P")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (arguments as a JSON string)."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError("tool call arguments are not a JSON object")
    return value


class ReasoningParser:
    """Splits reasoning from content (see the module doc)."""

    def parse(self, text: str) -> tuple[str | None, str]:
        """-> (reasoning or None, content)."""
        raise NotImplementedError

    def format(self, reasoning: str) -> str:
        """The reasoning as the model writes it at the start of its completion."""
        raise NotImplementedError


class Qwen3Reasoning(ReasoningParser):
    """``<think>reasoning</think>content``; no ``</think>``: all content."""

    def parse(self, text: str) -> tuple[str | None, str]:
        if "</think>" not in text:
            return self._unclosed(text)
        reasoning, _, content = text.partition("</think>")
        reasoning = reasoning.split("<think>", 1)[-1]
        return reasoning.strip("\n"), content.lstrip("\n")

    def _unclosed(self, text: str) -> tuple[str | None, str]:
        return None, text

    def format(self, reasoning: str) -> str:
        return f"<think>\n{reasoning}\n</think>\n\n"


class DeepSeekR1Reasoning(Qwen3Reasoning):
    """The prompt opened ``<think>``: reasoning up to ``</think>`` (all of it without one)."""

    def _unclosed(self, text: str) -> tuple[str | None, str]:
        return text.removeprefix("<think>").strip("\n") or None, ""

    def format(self, reasoning: str) -> str:
        return f"{reasoning}\n</think>\n\n"


class ToolParser:
    """Finds tool calls in a completion's content (see the module doc)."""

    #: The token a model ends a turn of tool calls with, when not its EOS.
    call_stop: str | None = None
    #: Where the calls start: the content is what comes before.
    start = ""

    def call_id(self, seed: str) -> str:
        """A stable id for a parsed call (``call_`` and 24 hex digits)."""
        return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """-> (content without the calls, calls). Malformed calls stay content."""
        at = text.find(self.start)
        try:
            calls = self._calls(text[at:]) if at >= 0 else []
        except (ValueError, KeyError, TypeError, AttributeError):
            calls = []
        return (text[:at].rstrip("\n"), calls) if calls else (text, [])

    def _calls(self, text: str) -> list[ToolCall]:
        """The calls in ``text`` (which starts with :attr:`start`)."""
        raise NotImplementedError

    def format(self, calls: Sequence[ToolCall]) -> str:
        """The calls as the model writes them."""
        raise NotImplementedError


class HermesTools(ToolParser):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call."""

    start = "<tool_call>"
    _CALL: Final = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def _calls(self, text: str) -> list[ToolCall]:
        return [
            ToolCall(str(data["name"]), _arguments(data.get("arguments", {})))
            for data in map(json.loads, self._CALL.findall(text))
        ]

    def format(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n</tool_call>"
            for c in calls
        )


class Llama3JsonTools(ToolParser):
    """``{"name": ..., "parameters": {...}}`` (``; ``-separated), maybe after ``<|python_tag|>``."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :].lstrip()
        if not body.startswith("{"):
            return text, []
        decoder = json.JSONDecoder()
        calls, at = [], 0
        try:
            while at < len(body):
                data, end = decoder.raw_decode(body, at)
                arguments = data.get("parameters", data.get("arguments", {}))
                calls.append(ToolCall(str(data["name"]), _arguments(arguments)))
                at = end
                while at < len(body) and body[at] in "; \n":
                    at += 1
        except (ValueError, KeyError, TypeError, AttributeError):
            return text, []
        return "", calls

    def format(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False)
            for c in calls
        )


class DeepSeekV3Tools(ToolParser):
    """``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```
    <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``."""

    start = "<｜tool▁calls▁begin｜>"
    _CALL: Final = re.compile(
        r"<｜tool▁call▁begin｜>(?P<type>.*?)<｜tool▁sep｜>(?P<name>.*?)\n```json\n(?P<args>.*?)\n```"
        r"<｜tool▁call▁end｜>",
        re.DOTALL,
    )

    def _calls(self, text: str) -> list[ToolCall]:
        return [
            ToolCall(m["name"].strip(), _arguments(m["args"])) for m in self._CALL.finditer(text)
        ]

    def format(self, calls: Sequence[ToolCall]) -> str:
        inner = "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.name}\n```json\n"
            f"{json.dumps(c.arguments, ensure_ascii=False)}\n```<｜tool▁call▁end｜>"
            for c in calls
        )
        return f"{self.start}{inner}<｜tool▁calls▁end｜>"


class MistralTools(ToolParser):
    """``[TOOL_CALLS]name[ARGS]{...}`` per call (tokenizer v11 and later), or the older
    ``[TOOL_CALLS][{"name": ..., "arguments": ...}]``; call ids are 9 letters and digits."""

    start = "[TOOL_CALLS]"

    def call_id(self, seed: str) -> str:
        digest = hashlib.sha256(seed.encode()).hexdigest()
        return "".join(c for c in digest if c.isalnum())[:9]

    def _calls(self, text: str) -> list[ToolCall]:
        calls = []
        for part in text.split(self.start)[1:]:
            part = part.strip()
            if part.startswith("["):
                for item in json.loads(part):
                    calls.append(ToolCall(str(item["name"]), _arguments(item["arguments"])))
                continue
            name, sep, arguments = part.partition("[ARGS]")
            if not sep:
                raise ValueError("no [ARGS]")
            calls.append(ToolCall(name.split("[CALL_ID]")[0].strip(), _arguments(arguments)))
        return calls

    def format(self, calls: Sequence[ToolCall]) -> str:
        return "".join(
            f"{self.start}{c.name}[ARGS]{json.dumps(c.arguments, ensure_ascii=False)}"
            for c in calls
        )


class HarmonyReasoning(ReasoningParser):
    """gpt-oss (harmony): the ``analysis`` channel is the reasoning; what follows it (a
    ``commentary`` call or the ``final`` message) is left for the tool parser."""

    _OPEN: Final = "<|channel|>analysis<|message|>"

    def parse(self, text: str) -> tuple[str | None, str]:
        start = text.find(self._OPEN)
        if start < 0:
            return None, text
        body = text[start + len(self._OPEN) :]
        reasoning, _, rest = body.partition("<|end|>")
        return reasoning, rest

    def format(self, reasoning: str) -> str:
        return f"{self._OPEN}{reasoning}<|end|><|start|>assistant"


class HarmonyTools(ToolParser):
    """gpt-oss (harmony): ``<|channel|>commentary to=functions.NAME <|constrain|>json
    <|message|>{...}`` ends in ``<|call|>``; the ``final`` channel's message is the content."""

    call_stop = "<|call|>"
    _CALL: Final = re.compile(
        r"to=functions\.(?P<name>[\w.-]+).*?<\|message\|>(?P<args>.*?)(?:<\|call\|>|$)",
        re.DOTALL,
    )

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        found = self._CALL.search(text)
        if found is None:
            final = text.rfind("<|channel|>final<|message|>")
            if final >= 0:
                text = text[final + len("<|channel|>final<|message|>") :]
            return text.removesuffix("<|end|>"), []
        try:
            call = ToolCall(found["name"], _arguments(found["args"]))
        except ValueError:
            return text, []
        return "", [call]

    def format(self, calls: Sequence[ToolCall]) -> str:
        (call,) = calls  # harmony: one call per message
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        return (
            f"<|channel|>commentary to=functions.{call.name} <|constrain|>json"
            f"<|message|>{arguments}"
        )

    def format_content(self, content: str) -> str:
        """A final answer in harmony's ``final`` channel."""
        return f"<|channel|>final<|message|>{content}"


#: Reasoning parsers by vLLM's ``--reasoning-parser`` name.
REASONING_PARSERS: Final[Mapping[str, type[ReasoningParser]]] = {
    "qwen3": Qwen3Reasoning,
    "deepseek_r1": DeepSeekR1Reasoning,
    "openai_gptoss": HarmonyReasoning,
}
#: Tool-call parsers by vLLM's ``--tool-call-parser`` name.
TOOL_PARSERS: Final[Mapping[str, type[ToolParser]]] = {
    "hermes": HermesTools,
    "llama3_json": Llama3JsonTools,
    "deepseek_v3": DeepSeekV3Tools,
    "mistral": MistralTools,
    "openai": HarmonyTools,
}


def _named(table: Mapping[str, type[_P]], name: str | None, what: str) -> _P | None:
    if name is None:
        return None
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; choose one of {sorted(table)}")
    return table[name]()


def reasoning_parser_named(name: str | None) -> ReasoningParser | None:
    """The reasoning parser called ``name`` (None: no reasoning split)."""
    return _named(REASONING_PARSERS, name, "reasoning parser")


def tool_parser_named(name: str | None) -> ToolParser | None:
    """The tool-call parser called ``name`` (None: calls stay content)."""
    return _named(TOOL_PARSERS, name, "tool-call parser")


def parse_completion(
    text: str, reasoning: ReasoningParser | None, tools: ToolParser | None, call_seed: str
) -> dict[str, Any]:
    """A completion's text as an OpenAI assistant message (``reasoning_content``, ``content``,
    ``tool_calls``); the finish reason is the caller's (``tool_calls`` when calls came back)."""
    thought, content = reasoning.parse(text) if reasoning else (None, text)
    calls: list[ToolCall] = []
    if tools is not None:
        content, calls = tools.parse(content)
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if thought is not None:
        message["reasoning_content"] = thought
    if calls:
        assert tools is not None
        message["tool_calls"] = [
            call.to_openai(tools.call_id(f"{call_seed}:{i}:{call.name}"))
            for i, call in enumerate(calls)
        ]
    return message
