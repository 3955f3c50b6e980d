"""Linear history: a request that extends a kept turn is sent that turn's served ids plus the
rendering of what is new; any other starts afresh (a fork). docs/gateway.md, "Two capture
modes", says when a request extends a turn."""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcore_rl.gateway.render.template import ChatTemplate, prepare_messages

__all__ = ["LinearHistory", "Plan", "Turn"]

_KEEP = 8  # answered turns a request can extend (a sub-agent's interleave with its parent's)


@dataclass(slots=True)
class Turn:
    """One answered request: its messages, its served ids, the answer the agent got."""

    messages: list[Any]
    key: str  # the tools and template kwargs it was rendered with
    prompt_ids: array[int]  # compact: a session keeps several long prompts
    completion_ids: array[int]
    answer: dict[str, Any]
    stopped: bool  # the completion ended with a stop token


@dataclass(slots=True)
class Plan:
    """What to send for one request: the prompt ids and how they were made."""

    prompt_ids: list[int]
    key: str
    extends: Turn | None = None  # the turn it extends (None: rendered afresh)
    fork: str | None = None  # why it was rendered afresh although the session had turns
    retry: bool = False  # the same request as a kept turn's: its prompt again


def _key(tools: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> str:
    return json.dumps([tools or [], kwargs or {}], sort_keys=True, default=str)


def _gist(message: Mapping[str, Any]) -> tuple[str, list[tuple[Any, Any]]]:
    calls = [c["function"] for c in message.get("tool_calls") or ()]
    return str(message["content"]).strip(), [(f.get("name"), f.get("arguments")) for f in calls]


def same_answer(sent: Any, answer: Mapping[str, Any]) -> bool:
    """Whether the agent's echo ``sent`` is the gateway's ``answer`` (as the template sees it)."""
    if not isinstance(sent, Mapping) or sent.get("role") != "assistant":
        return False
    mine, theirs = prepare_messages([sent, answer])
    return _gist(mine) == _gist(theirs)


@dataclass
class LinearHistory:
    """One session's kept turns (see the module doc)."""

    turns: list[Turn] = field(default_factory=list)

    def plan(
        self,
        template: ChatTemplate,
        messages: list[Any],
        *,
        tools: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Plan:
        """The prompt ids for a request (raises ``RenderError`` when the template refuses)."""
        key = _key(tools, kwargs)
        full = template.render(messages, tools=tools, kwargs=kwargs)
        reason = "no earlier turn of this session is a prefix of its messages"
        for turn in reversed(self.turns):
            if turn.key != key:
                continue
            n = len(turn.messages)
            if messages == turn.messages:
                return Plan(turn.prompt_ids.tolist(), key, turn, retry=True)
            if len(messages) <= n or messages[:n] != turn.messages:
                continue
            if not same_answer(messages[n], turn.answer):
                reason = "the agent changed the answer it was given"
                continue
            ids = self._extend(template, turn, messages[: n + 1], full, tools, kwargs)
            if isinstance(ids, str):
                reason = ids
                break
            return Plan(ids, key, turn)
        return Plan(template.encode(full), key, fork=reason if self.turns else None)

    @staticmethod
    def _extend(
        template: ChatTemplate,
        turn: Turn,
        history: list[Any],
        full: str,
        tools: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
    ) -> list[int] | str:
        """The extended prompt ids, or why the turn cannot be extended."""
        # The rendering up to the answer's last stop token is replaced by the served ids.
        upto = template.render(history, tools=tools, add_generation_prompt=False, kwargs=kwargs)
        close: list[int] = []
        if turn.stopped:
            stop_text = template.token_text(turn.completion_ids[-1])
            if not stop_text:
                return "the answer it extends ended with an ordinary token"
        else:  # cut off (max_tokens, a stop string): closed as the template closes a turn
            ends = [
                (upto.rfind(t), t, i) for i in template.stop_ids() if (t := template.token_text(i))
            ]
            at, stop_text, end_id = max(ends, default=(-1, "", 0))
            if at < 0:
                return "the template renders no end-of-turn token after the answer"
            close = [end_id]
        count = upto.count(stop_text)
        parts = full.split(stop_text, count)  # the last: what follows the answer's end
        if not count or len(parts) <= count:
            return f"the template does not render the answer's end {stop_text!r} as served"
        return [
            *turn.prompt_ids.tolist(),
            *turn.completion_ids.tolist(),
            *close,
            *template.encode(parts[-1]),
        ]

    def remember(
        self,
        plan: Plan,
        messages: list[Any],
        answer: dict[str, Any],
        completion_ids: list[int],
        *,
        stopped: bool,
    ) -> None:
        """Keep an answered request as a turn later requests can extend."""
        turn = Turn(
            messages,
            plan.key,
            array("i", plan.prompt_ids),
            array("i", completion_ids),
            answer,
            stopped,
        )
        if plan.extends is not None and plan.extends in self.turns and not plan.retry:
            self.turns.remove(plan.extends)  # the extension replaces it
        self.turns.append(turn)
        del self.turns[:-_KEEP]
