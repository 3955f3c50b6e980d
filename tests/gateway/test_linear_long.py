"""Linear history on long conversations: what is new is rendered in a small context, and the
prompt ids are the ones a rendering of the whole conversation gives, on every template of the
conformance table (tool calls, reasoning, answers cut off by ``max_tokens`` and by a stop
string) at 1, 10 and 100 turns. A template that renders new messages differently without the
earlier ones is found out and rendered whole. The stand-in's voice answers token-in."""

from __future__ import annotations

import json
import logging
from array import array
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.helpers import CALCULATOR
from tests.gateway.template_fixtures import FIXTURES
from tests.gateway.template_rig import QUESTION, TEMPLATE_MARKS, tokenizer_dir

pytestmark = TEMPLATE_MARKS


def _converse(directory: str, name: str, turns: int, check: set[int]) -> tuple[Any, list[int]]:
    """An agent's ``turns + 1`` calls through linear history, each answer generated token-in
    by the stand-in; every third answer of seven cut off by ``max_tokens``, every fifth by a
    stop string (the agent then says "Go on."); every fourth answer the agent echoes with its
    reasoning, the others without. At the calls in ``check`` the prompt is
    also planned with the whole conversation rendered, and must be the same.
    -> (the template, the calls rendered afresh)."""
    from agentcore_rl.gateway.render.linear import LinearHistory
    from agentcore_rl.gateway.render.parsers import parse_completion
    from agentcore_rl.gateway.render.template import ChatTemplate
    from agentcore_rl.local.policy import TemplateVoice

    fixture = FIXTURES[name]
    voice = TemplateVoice(
        directory,
        tool_call_parser=fixture.tool_parser,
        reasoning_parser=fixture.reasoning_parser,
        tool_rounds=10**6,
    )
    template = ChatTemplate.load(directory)
    whole = ChatTemplate(template.tokenizer, directory)
    whole.incremental = False
    stop_ids = template.stop_ids()
    history = LinearHistory()
    forks = []
    messages: list[Any] = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": QUESTION},
    ]
    for turn in range(turns + 1):
        plan = history.plan(template, messages, tools=[CALCULATOR])
        if plan.fork is not None:
            forks.append(turn)
        if turn in check:
            whole.ends.clear()  # the reference renders up to the answer too
            assert plan.prompt_ids == history.plan(whole, messages, tools=[CALCULATOR]).prompt_ids
        budget, stop = {3: (5, ()), 5: (None, ('"step"',))}.get(turn % 7, (None, ()))
        ids, _, _, reason = voice.generate(plan.prompt_ids.tolist(), budget, stop=stop)
        stopped = ids[-1] in stop_ids
        text = template.decode(ids[:-1] if stopped else ids)
        message = parse_completion(
            text[: text.find(reason)] if reason else text, voice.reasoning, voice.tools, str(turn)
        )
        history.remember(plan, message, plan.prompt_ids, array("i", ids), stopped=stopped)
        kept = ("role", "content", "tool_calls", *(("reasoning_content",) if turn % 4 == 2 else ()))
        echo = {k: v for k, v in message.items() if k in kept}
        messages = [*messages, echo]
        for call in message.get("tool_calls") or ():
            step = json.loads(call["function"]["arguments"])["step"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(step)})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "Go on."})
    return template, forks


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_new_messages_render_as_in_the_whole_conversation(name: str) -> None:
    template, forks = _converse(str(tokenizer_dir(name)), name, 100, {1, 10, 100})
    # gpt-oss's template ends the last answer with <|return|> and any other with <|end|> (no
    # stop token): an answer cut off cannot be closed as the template closes it, in either way
    cut = [t + 1 for t in range(100) if t % 7 in (3, 5)]
    assert forks == (cut if name == "gpt-oss" else [])
    # each shape of conversation was checked once against the whole rendering, then rendered
    # in a context of its own
    assert template.incremental
    assert template.contexts
    assert all(level >= 0 for level in template.contexts.values()), template.contexts


def test_a_template_that_needs_the_earlier_messages_is_rendered_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A template numbering tool outputs across the conversation: no context renders them as
    the whole conversation does; found at the first check, logged once, rendered whole."""
    source = tokenizer_dir("qwen2.5")
    target = tmp_path / "numbered"
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = config["chat_template"].replace(
        "{{- '\\n<tool_response>\\n' }}",
        "{{- '\\n<tool_response>' ~ loop.index ~ '\\n' }}",
    )
    assert "~ loop.index ~" in config["chat_template"]
    config_path.write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="agentcore_rl.gateway"):
        template, forks = _converse(str(target), "qwen2.5", 10, set(range(11)))
    assert not forks
    assert not template.incremental
    (warning,) = [r for r in caplog.records if "renders whole conversations" in r.message]
    assert "numbered" in warning.getMessage()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_template_renders_and_encodes_as_transformers_does(name: str) -> None:
    """The gateway renders through the compiled template and the Rust tokenizer itself: the
    ids are transformers' ``apply_chat_template`` ones (with and without tools, reasoning
    echoed, a JSON-string arguments object, null fields; the tools' JSON kept per list)."""
    from agentcore_rl.gateway.render.template import ChatTemplate, prepare_messages

    template = ChatTemplate.load(tokenizer_dir(name))
    function = {"name": "calculator", "arguments": '{"expression": "1 + 2"}'}
    call = {"id": "call00001", "type": "function", "function": function}  # Mistral: 9 alnum
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "reasoning_content": "Add.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call00001", "content": "3", "name": None},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 3."}]},
        {"role": "user", "content": "Go on."},
    ]
    other = json.loads(json.dumps(CALCULATOR).replace("arithmetic", "an"))
    for tools in ([CALCULATOR], None, [other], [CALCULATOR, other]):
        for upto in (2, 4, 6):
            reference = template.tokenizer.apply_chat_template(
                prepare_messages(messages[:upto]),
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            text = template.render(messages[:upto], tools=tools)
            assert template.encode(text) == list(reference), (tools, upto)
            assert template.decode(template.encode(text)) == text
