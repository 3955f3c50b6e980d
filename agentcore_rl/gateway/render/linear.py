"""Linear history: a request that extends a kept turn is sent that turn's served ids plus the
rendering of what is new; any other starts afresh (a fork). docs/gateway.md, "Two capture
modes", says when a request extends a turn.

What is new is rendered in a small context, so a call costs the same at turn 300 as at turn
3: the leading system message, the answer it extends and the new messages (narrow), or also
the messages up to the first user message and the first tool round (wide: templates keep
state across messages, e.g. DeepSeek's first tool output). The first time a template meets a
shape of context, its rendering is checked against the whole conversation's and the narrowest
context that renders the same is kept for that shape; a template that renders new messages
differently in every context is rendered whole from then on (logged once)."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentcore_rl.gateway.render.template import ChatTemplate, RenderError, prepare_messages

__all__ = ["LinearHistory", "Plan", "Turn"]

log = logging.getLogger("agentcore_rl.gateway")

_KEEP = 8  # answered turns a request can extend (a sub-agent's interleave with its parent's)
_SHAPES = 1024  # context shapes a template remembers before it checks them afresh


@dataclass(slots=True)
class Turn:
    """One answered request: its messages, its served ids, the answer the agent got."""

    messages: list[Any]
    key: bytes  # the tools and template kwargs it was rendered with
    prompt_ids: array[int]  # compact: a session keeps several long prompts
    completion_ids: array[int]
    answer: dict[str, Any]
    stopped: bool  # the completion ended with a stop token
    head: tuple[int, ...] = ()  # the wide context's first messages, found in messages[:scanned]
    scanned: int = 0


@dataclass(slots=True)
class Plan:
    """What to send for one request: the prompt ids and how they were made."""

    prompt_ids: array[int]
    key: bytes
    messages: list[Any]  # the request's, the kept turn's own objects standing in for its part
    extends: Turn | None = None  # the turn it extends (None: rendered afresh)
    fork: str | None = None  # why it was rendered afresh although the session had turns
    retry: bool = False  # the same request as a kept turn's: its prompt again
    head: tuple[int, ...] = ()
    scanned: int = 0


def _key(tools: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> bytes:
    return orjson.dumps([tools or [], kwargs or {}], option=orjson.OPT_SORT_KEYS)


def _gist(message: Mapping[str, Any]) -> tuple[str, list[tuple[Any, Any]]]:
    calls = [c["function"] for c in message.get("tool_calls") or ()]
    return str(message["content"]).strip(), [(f.get("name"), f.get("arguments")) for f in calls]


def same_answer(sent: Any, answer: Mapping[str, Any]) -> bool:
    """Whether the agent's echo ``sent`` is the gateway's ``answer`` (as the template sees it)."""
    if not isinstance(sent, Mapping) or sent.get("role") != "assistant":
        return False
    mine, theirs = prepare_messages([sent, answer])
    return _gist(mine) == _gist(theirs)


def _head(
    messages: list[Any], end: int, head: tuple[int, ...], scanned: int
) -> tuple[tuple[int, ...], int]:
    """The wide context's first messages before ``end``: those up to the first user message and
    the first tool round (tool calls and the tool messages after them); resumed from a search
    of ``messages[:scanned]`` that found ``head``. -> (head, how far it searched)."""
    found, at = list(head), scanned
    opened = any(messages[i]["role"] == "user" for i in found)
    while at < end and not opened:  # the opening, up to the first user message
        found.append(at)
        opened = messages[at]["role"] == "user"
        at += 1
    rounds = any(messages[i].get("tool_calls") for i in found)
    while at < end and not rounds:
        rounds = bool(messages[at].get("tool_calls"))
        if rounds:
            found.append(at)
            while at + 1 < end and messages[at + 1]["role"] == "tool":
                at += 1
                found.append(at)
        at += 1
    return tuple(found), at


def _shape(messages: list[Any], indices: Sequence[int]) -> tuple[tuple[str, bool, bool], ...]:
    """A context's roles (with tool calls or not), runs of one kind as one item (more than one)."""
    kinds = [(messages[i]["role"], bool(messages[i].get("tool_calls"))) for i in indices]
    out: list[tuple[str, bool, bool]] = []
    for n, kind in enumerate(kinds):
        if n and kind == kinds[n - 1]:
            out[-1] = (*kind, True)
        else:
            out.append((*kind, False))
    return tuple(out)


def _tail(
    template: ChatTemplate,
    turn: Turn,
    messages: list[Any],
    at: int,
    tools: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
) -> tuple[list[int], str] | str:
    """What the rendering of ``messages`` puts after the answer ``messages[at]`` (the turn's
    served ids stand in for the rendering up to its last stop token): (the end-of-turn id that
    closes a cut-off answer, the text after the answer's end), or why there is none.

    Found once per kind of answer and new messages by also rendering up to the answer; then
    by one rendering, counting the answer's end back from the tail's end: the template writes
    as many of it after the answer as it did then, unless a new message's own text holds one."""
    full = template.render(messages, tools=tools, kwargs=kwargs)
    kinds = tuple(
        (m["role"], len(m.get("tool_calls") or ()), bool(m.get("content"))) for m in messages[at:]
    )
    known = (turn.key, turn.stopped and turn.completion_ids[-1], kinds)
    learned = template.ends.get(known)
    if learned is not None and learned[1] not in repr(messages[at + 1 :]):
        cut, end = len(full), learned[1]
        for _ in range(learned[2] + 1):
            cut = full.rfind(end, 0, cut)
        if cut >= 0:
            return learned[0], full[cut + len(end) :]
    upto = template.render(
        messages[: at + 1], tools=tools, add_generation_prompt=False, kwargs=kwargs
    )
    close: list[int] = []
    if turn.stopped:
        stop_text = template.token_text(turn.completion_ids[-1])
        if not stop_text:
            return "the answer it extends ended with an ordinary token"
    else:  # cut off (max_tokens, a stop string): closed as the template closes a turn
        ends = [(upto.rfind(t), t, i) for i in template.stop_ids() if (t := template.token_text(i))]
        found, stop_text, end_id = max(ends, default=(-1, "", 0))
        if found < 0:
            return "the template renders no end-of-turn token after the answer"
        close = [end_id]
    count = upto.count(stop_text)
    parts = full.split(stop_text, count)  # the last: what follows the answer's end
    if not count or len(parts) <= count:
        return f"the template does not render the answer's end {stop_text!r} as served"
    if len(template.ends) >= _SHAPES:
        template.ends.clear()
    template.ends[known] = (close, stop_text, parts[-1].count(stop_text))
    return close, parts[-1]


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
        reason = "no earlier turn of this session is a prefix of its messages"
        for turn in reversed(self.turns):
            n = len(turn.messages)
            if turn.key != key or len(messages) < n:
                continue
            if len(messages) == n:  # the answer is all it lacks: a retry, or no extension
                if messages == turn.messages:
                    ids, kept = turn.prompt_ids, turn.messages
                    return Plan(
                        ids, key, kept, turn, retry=True, head=turn.head, scanned=turn.scanned
                    )
                continue
            # the answer first (one message), then the one comparison of the kept messages
            answered = same_answer(messages[n], turn.answer)
            if messages[:n] != turn.messages:
                continue
            if not answered:
                reason = "the agent changed the answer it was given"
                continue
            head, scanned = _head(messages, n, turn.head, turn.scanned)
            found = self._extend(template, turn, messages, head, tools, kwargs)
            if isinstance(found, str):
                reason = found
                break
            close, tail = found
            ids = turn.prompt_ids + turn.completion_ids + array("i", close + template.encode(tail))
            # the turn's message objects, not their equal copies: one copy per session alive
            kept = [*turn.messages, *messages[n:]]
            return Plan(ids, key, kept, turn, head=head, scanned=scanned)
        full = template.render(messages, tools=tools, kwargs=kwargs)
        ids = array("i", template.encode(full))
        return Plan(ids, key, messages, fork=reason if self.turns else None)

    @staticmethod
    def _extend(
        template: ChatTemplate,
        turn: Turn,
        messages: list[Any],
        head: tuple[int, ...],
        tools: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
    ) -> tuple[list[int], str] | str:
        """What follows the turn's answer, rendered in the narrowest context checked for this
        shape (see the module doc); or why the turn cannot be extended."""
        n = len(turn.messages)
        new = range(n, len(messages))
        narrow = [*([0] if messages[0]["role"] in ("system", "developer") else []), *new]
        contexts = (narrow, [*head, *new])

        def within(level: int) -> tuple[list[int], str] | str | None:
            """The tail in context ``level`` (None: the template refuses that context)."""
            context = [messages[i] for i in contexts[level]]
            try:
                return _tail(template, turn, context, len(context) - len(new), tools, kwargs)
            except RenderError:
                return None

        if not template.incremental or len(contexts[1]) == len(messages):
            return _tail(template, turn, messages, n, tools, kwargs)
        shape = (turn.key, turn.stopped, _shape(messages, contexts[1]))
        level = template.contexts.get(shape)
        if level is not None and level >= 0:
            found = within(level)
            if found is not None and not isinstance(found, str):
                return found
        whole = _tail(template, turn, messages, n, tools, kwargs)
        if level is not None or isinstance(whole, str):
            return whole
        if len(template.contexts) >= _SHAPES:
            template.contexts.clear()
        tails = [within(0), within(1)]
        level = template.contexts[shape] = next((i for i, t in enumerate(tails) if t == whole), -1)
        if level < 0 and any(t is not None for t in tails):
            template.incremental = False
            log.warning(
                "linear history: the chat template of %r renders new messages differently "
                "without the earlier ones; it renders whole conversations from now on",
                template.source,
            )
        return whole

    def remember(
        self,
        plan: Plan,
        answer: dict[str, Any],
        prompt_ids: array[int],
        completion_ids: array[int],
        *,
        stopped: bool,
    ) -> None:
        """Keep an answered request (its ids as sent and served) as a turn to extend."""
        turn = Turn(
            plan.messages,
            plan.key,
            prompt_ids,
            completion_ids,
            answer,
            stopped,
            plan.head,
            plan.scanned,
        )
        if plan.extends is not None and plan.extends in self.turns and not plan.retry:
            self.turns.remove(plan.extends)  # the extension replaces it
        self.turns.append(turn)
        del self.turns[:-_KEEP]
