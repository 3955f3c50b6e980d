"""A model's tokenizer and chat template, loaded with transformers (what vLLM renders with;
the ``render`` extra)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from agentcore_rl._extras import require
from agentcore_rl.errors import GatewayInputError

__all__ = ["ChatTemplate", "RenderError"]

_KEPT = 64  # distinct tools lists a template keeps the JSON of


class RenderError(GatewayInputError):
    """The template refused the conversation (its own ``raise_exception``, a bad message)."""


def prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM gives them to the template: no null fields (templates test them with
    ``is defined``), content "" when null (templates read it unguarded), content parts as their
    text, JSON-string tool ``arguments`` as objects (templates write them with ``tojson``),
    ``reasoning_content`` also as ``reasoning`` and ``thinking`` (other templates' names)."""
    out = []
    for message in messages:
        item = {k: v for k, v in message.items() if v is not None}
        content = item.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        item["content"] = content or ""
        calls = item.get("tool_calls")
        if calls:
            prepared = []
            for call in calls:
                call = dict(call)
                function = dict(call.get("function") or {})
                arguments = function.get("arguments")
                if isinstance(arguments, str):  # not JSON: kept as the string
                    with contextlib.suppress(ValueError):
                        function["arguments"] = json.loads(arguments)
                call["function"] = function
                prepared.append(call)
            item["tool_calls"] = prepared
        reasoning = item.get("reasoning_content")
        if isinstance(reasoning, str):
            item.setdefault("reasoning", reasoning)
            item.setdefault("thinking", reasoning)
        out.append(item)
    return out


_DICT: Final = frozenset(dir(dict))


def _getattr(env: Any) -> Any:
    """The sandbox's ``env.getattr`` (``x.name`` in a template) with the same results, less
    work: a message's field without the sandbox's failed attribute lookup first (a dict has
    no such attribute), and its verdict on an attribute kept per type and name (it reads
    only those: jinja's ``is_safe_attribute``)."""
    sandboxed, undefined, wraps = env.getattr, env.undefined, env.wrap_str_format
    safe: dict[tuple[type, str], bool] = {}

    def getattr_(obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT:
            return obj[attribute] if attribute in obj else undefined(obj=obj, name=attribute)
        allowed = safe.get((kind, attribute))
        if allowed is None:
            allowed = safe[kind, attribute] = env.is_safe_attribute(obj, attribute, None)
        if allowed:
            value = getattr(obj, attribute, undefined)
            if value is not undefined and wraps(value) is None:
                return value
        return sandboxed(obj, attribute)

    return getattr_


@functools.lru_cache(maxsize=8)
def _load(factory: Any, path: str) -> Any:
    # Loading takes seconds; rendering and encoding do not change the tokenizer.
    return factory.from_pretrained(path, local_files_only=True)


class ChatTemplate:
    """A tokenizer directory's tokenizer and chat template."""

    def __init__(self, tokenizer: Any, source: str = "") -> None:
        self.tokenizer = tokenizer
        self.source = source
        # transformers' apply_chat_template prepares every rendering's inputs afresh (copies of
        # the messages and tools, its template's globals merged); the compiled template is
        # rendered here with them merged once, and the Rust tokenizer called without the
        # batch wrapper (where there is one: transformers' fast tokenizers). A request's tools
        # stand for the first equal list met, whose JSON (the template's ``tojson``) is kept.
        self._compiled: dict[bool, Any] = {}  # with tools or not: a template dict's choice
        self._tools: dict[bytes, list[Any]] = {}
        self._stable: dict[int, Any] = {}  # id -> the kept tools' lists and objects
        self._json: dict[tuple[int, str, str], Any] = {}
        self._fast = getattr(tokenizer, "backend_tokenizer", None)
        self._clean = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._special: dict[int, str] = {
            int(i): str(t.content) for i, t in tokenizer.added_tokens_decoder.items()
        }
        # What linear history learned of it (render/linear.py): per shape of conversation, the
        # context that renders new messages as the whole conversation does (-1: none does);
        # False once a context rendered them differently; per kind of answer and new messages,
        # the id closing a cut-off answer, the answer's end and how often the rest holds it.
        self.contexts: dict[Any, int] = {}
        self.ends: dict[Any, tuple[list[int], str, int]] = {}
        self.incremental = True

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ChatTemplate:
        """Load a local Hugging Face tokenizer directory (its chat template included)."""
        require("render", "rendering chat templates", "transformers")
        from transformers import AutoTokenizer  # lazy: the render extra, slow to import

        path = os.fspath(directory)
        if not os.path.isdir(path):
            raise ValueError(f"tokenizer directory {path!r} does not exist")
        tokenizer = _load(AutoTokenizer, os.path.realpath(path))
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer in {path!r} has no chat template")
        return cls(tokenizer, path)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The template's text for a conversation (``kwargs``: ``chat_template_kwargs``), as
        transformers' ``apply_chat_template`` renders the prepared messages."""
        try:
            template, variables = self._template(bool(tools))
            context = {**variables, **(kwargs or {})}
            context.update(
                messages=prepare_messages(messages),
                tools=self._kept(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
            return "".join(template.root_render_func(template.new_context(context, shared=True)))
        except Exception as exc:  # jinja's TemplateError, or a template's raise_exception
            raise RenderError(f"the chat template refused the request: {exc}") from None

    def _kept(self, tools: Sequence[Any]) -> list[Any]:
        """The first list met equal to ``tools`` (in its keys' order too)."""
        key = orjson.dumps(tools)
        kept = self._tools.get(key)
        if kept is None:
            if not all(isinstance(t, Mapping) for t in tools):
                raise ValueError("every tool must be a JSON schema object")
            if len(self._tools) >= _KEPT:
                self._tools.clear()
                self._stable.clear()
                self._json.clear()
            kept = self._tools[key] = list(tools)
            stack: list[Any] = [kept]
            while stack:
                item = stack.pop()
                self._stable[id(item)] = item
                inner = item.values() if isinstance(item, dict) else item
                stack += [x for x in inner if isinstance(x, (dict, list))]
        return kept

    def _tojson(self, convert: Any) -> Any:
        """The template's ``tojson`` filter (``convert``), remembering the kept tools' JSON."""

        def tojson(value: Any, *args: Any, **kwargs: Any) -> Any:
            if self._stable.get(id(value)) is not value:
                return convert(value, *args, **kwargs)
            key = (id(value), repr(args), repr(kwargs))
            text = self._json.get(key)
            if text is None:
                text = self._json[key] = convert(value, *args, **kwargs)
            return text

        return tojson

    def _template(self, tools: bool) -> tuple[Any, dict[str, Any]]:
        """The compiled template (transformers' environment, its ``tojson`` remembering) and
        the variables every rendering starts from: the globals, then the special tokens."""
        found = self._compiled.get(tools)
        if found is None:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            source = self.tokenizer.get_chat_template(None, [] if tools else None)
            env = _compile_jinja_template(source).environment.overlay()
            env.filters = {**env.filters, "tojson": self._tojson(env.filters["tojson"])}
            env.getattr = _getattr(env)
            template = env.from_string(source)
            found = template, {**template.globals, **self.tokenizer.special_tokens_map}
            self._compiled[tools] = found
        return found

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS added: templates write their own)."""
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids  # type: ignore[no-any-return]
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included."""
        if self._fast is not None and not self._clean:
            return str(self._fast.decode(list(ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_text(self, token_id: int) -> str | None:
        """The text of an added (special) token, or None for an ordinary one."""
        return self._special.get(token_id)

    def stop_ids(self) -> frozenset[int]:
        """Token ids that end a turn: the EOS and the template's other end-of-turn markers."""
        eos = self.tokenizer.eos_token_id
        ids = set(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        for name in ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|call|>", "<|return|>"):
            found = self.tokenizer.convert_tokens_to_ids(name)
            if isinstance(found, int) and self._special.get(found) == name:
                ids.add(found)
        return frozenset(ids)
