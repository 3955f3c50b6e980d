"""Hostile input on every route, from a seeded generator: the gateway never answers a 5xx of
its own, never loses a trace it accepted, and refuses integers beyond 64 bits with 400."""

from __future__ import annotations

import contextlib
import json
import random

import httpx

from agentcore_rl.gateway import TraceLostError
from tests.gateway.helpers import ADMIN, served

AUTH = {"authorization": f"Bearer {ADMIN}"}
BIG_INTS = [2**64, 10**30, -(2**63) - 1, 2**200]
ODD_STRINGS = ["\\ud800", "\\udfff x", "\\u0000", "é\\ud83d", "\\\\ud800"]
FIELDS = [
    "model",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "n",
    "max_tokens",
    "stop",
    "seed",
    "temperature",
    "logit_bias",
    "tools",
    "min_tokens",
]

# The Responses API's fields, and the chat fields each may become (nothing else is forwarded).
RESPONSES_FIELDS = {
    "model": {"model"},
    "input": {"messages"},
    "instructions": {"messages"},
    "stream": {"stream", "stream_options"},
    "tools": {"tools"},
    "tool_choice": {"tool_choice"},
    "max_output_tokens": {"max_tokens"},
    "temperature": {"temperature"},
    "top_p": {"top_p"},
    "previous_response_id": {"messages"},
    "include": {"logprobs", "top_logprobs"},
    "top_logprobs": set(),
    "text": {"response_format"},
    "reasoning": set(),
    "metadata": set(),
    "store": set(),
    "parallel_tool_calls": {"parallel_tool_calls"},
    "seed": {"seed"},
    "stop": {"stop"},
}


def _nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def _scalar(rng: random.Random) -> str:
    """A JSON scalar as text (so that big integers and escapes stay as written)."""
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.choice(BIG_INTS))
    if kind == 1:
        return f'"{rng.choice(ODD_STRINGS)}"'
    if kind == 2:
        return rng.choice(["NaN", "Infinity", "-1e400", "1e19"])
    if kind == 3:
        return rng.choice(["null", "true", "false", "0", "-1", "2", "0.5", "18446744073709551615"])
    if kind == 4:
        return _nested(rng.choice([2, 127, 128, 129, 254, 255, 600, 1023]))
    if kind == 5:
        return json.dumps({"a": rng.random()})
    return json.dumps(rng.choice(["x", "", "e", "\n"]))


def _agent_body(rng: random.Random, fields: list[str] = FIELDS) -> tuple[str, bool]:
    """A chat body with some fields odd; -> (text, whether it holds an integer beyond 64 bits)."""
    parts = ['"messages": [{"role": "user", "content": "What is 1 + 1?"}]']
    big = False
    for name in rng.sample(fields, rng.randrange(1, 4)):
        value = _scalar(rng)
        big = big or any(value == str(i) for i in BIG_INTS)
        parts.append(f'"{name}": {value}')
    if rng.random() < 0.2:
        parts[0] = f'"messages": [{{"role": "user", "content": {_scalar(rng)}}}]'
        big = big or any(str(i) in parts[0] for i in BIG_INTS)
    return "{" + ", ".join(parts) + "}", big


# Anthropic Messages: its fields, and the chat fields each may become (nothing else is sent on)
MESSAGES_FIELDS = {
    "system": (),
    "stop_sequences": ("stop",),
    "temperature": ("temperature",),
    "top_p": ("top_p",),
    "top_k": ("top_k",),
    "tools": ("tools",),
    "tool_choice": ("tool_choice", "parallel_tool_calls"),
    "stream": ("stream", "stream_options"),
    "metadata": (),
    "thinking": (),
    "max_tokens": (),
    "model": (),
}
BLOCKS = [
    '{"type": "text", "text": "What is 1 + 1?"}',
    '{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}',
    '{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]}',
    '{"type": "tool_use", "id": "t1", "name": "calculator", "input": {"expression": "1 + 1"}}',
    '{"type": "thinking", "thinking": "hm", "signature": ""}',
    '{"type": "document"}',
]


def _messages_body(rng: random.Random) -> tuple[str, set[str], bool]:
    """An Anthropic body with some fields and blocks odd; -> (text, the agent's fields,
    whether it holds an integer beyond 64 bits)."""
    content = '"What is 1 + 1?"'
    if rng.random() < 0.4:
        blocks = rng.sample(BLOCKS, rng.randrange(1, 3))
        content = "[" + ", ".join(_scalar(rng) if rng.random() < 0.1 else b for b in blocks) + "]"
    role = rng.choice(["user", "user", "assistant", "system", "tool"])
    parts = [
        '"model": "m"',
        '"max_tokens": 16',
        f'"messages": [{{"role": "{role}", "content": {content}}}]',
    ]
    names = {"model", "max_tokens", "messages"}
    big = False
    for name in rng.sample(sorted(MESSAGES_FIELDS), rng.randrange(0, 4)):
        value = _scalar(rng)
        big = big or any(value == str(i) for i in BIG_INTS)
        parts.append(f'"{name}": {value}')
        names.add(name)
    if rng.random() < 0.1:
        parts.pop(rng.randrange(3))  # a required field missing
    return "{" + ", ".join(parts) + "}", names, big


def _admin_body(rng: random.Random, sid: str) -> str:
    parts = [f'"session_id": "{sid}"']
    for name in rng.sample(["exp_id", "input_id", "sampling"], rng.randrange(0, 4)):
        if name == "sampling":
            key = rng.choice(["seed", "stop", "temperature", "max_tokens", "logit_bias"])
            parts.append(f'"sampling": {{"{key}": {_scalar(rng)}}}')
        else:
            parts.append(f'"{name}": {_scalar(rng)}')
    return "{" + ", ".join(parts) + "}"


async def _ok_or_4xx(response: httpx.Response, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:300]}"


async def test_hostile_input_on_every_route_gets_no_5xx_and_loses_no_trace() -> None:
    rng = random.Random(2025)
    accepted: set[str] = set()  # sessions the gateway took (opened, or called)
    messages_answered = 0
    async with served() as stack, httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        # the named cases, then generated ones
        fixed = [
            (
                b'{"messages": [{"role": "user", "content": "x"}], "seed": '
                + str(2**64).encode()
                + b"}",
                400,
            ),
            (b'{"messages": [], "seed": -9223372036854775809}', 400),
            (b'{"messages": ' + _nested(300).encode() + b"}", 400),
            (b'{"messages": ' + _nested(1023).encode() + b"}", 400),
            (b'{"messages": ' + _nested(1000, '"' + "x" * 28_000_000 + '"').encode() + b"}", 400),
        ]
        for i, (content, status) in enumerate(fixed):
            response = await http.post(f"/sessions/f{i}/v1/chat/completions", content=content)
            assert response.status_code == status, response.text[:300]
        for case in (b"[" * 100_000 + b"]" * 100_000, b'{"session_id": "a", "exp_id": "\\ud800"}'):
            response = await http.post("/admin/sessions", content=case, headers=AUTH)
            assert response.status_code == 400, response.text[:300]
        for version in ["1e30", str(10**30), "-1", '"7"', "true", str(2**63)]:
            response = await http.post(
                "/admin/policy_version", content=f'{{"version": {version}}}', headers=AUTH
            )
            assert response.status_code == 400, (version, response.text[:300])
        for mode in ["5", '"\\ud800"', _nested(300, '"hold"'), '{"a": 1}', '"hold"', '"reject"']:
            response = await http.post(
                "/admin/pause", content=f'{{"mode": {mode}}}'.encode(), headers=AUTH
            )
            await _ok_or_4xx(response, f"pause {mode[:40]}")
            await _ok_or_4xx(await http.post("/admin/resume", headers=AUTH), "resume")
        for i in range(120):
            sid = f"z{i}"
            if rng.random() < 0.5:
                response = await http.post(
                    "/admin/sessions", content=_admin_body(rng, sid), headers=AUTH
                )
                await _ok_or_4xx(response, f"open {sid}")
                if response.status_code == 204:
                    accepted.add(sid)
            for turn in range(rng.randrange(1, 3)):
                names: set[str] = set()
                route = rng.choice(["chat/completions", "completions", "messages", "responses"])
                if route == "responses":
                    body, big = _agent_body(rng, list(RESPONSES_FIELDS)[1:])
                    body = body.replace('"messages": ', '"input": ', 1)
                else:
                    body, big = _agent_body(rng)
                if route == "completions":
                    body = body.replace('"messages": ', '"prompt": "hi", "x": ', 1)
                elif route == "messages":
                    body, names, big = _messages_body(rng)
                response = await http.post(f"/sessions/{sid}/v1/{route}", content=body.encode())
                await _ok_or_4xx(response, f"{sid} turn {turn}: {body[:200]}")
                if big:
                    assert response.status_code == 400, body[:200]
                if route == "responses" and response.status_code == 200:
                    sent = json.loads(body)
                    implied = set().union(*(RESPONSES_FIELDS[k] for k in sent))
                    record = stack.gateway.peek_session(sid).records[-1]
                    forwarded = set(json.loads(record.request_body))
                    assert forwarded <= implied, (body[:200], forwarded - implied)
                with contextlib.suppress(TraceLostError):  # not taken: no session
                    records = stack.gateway.peek_session(sid).records
                    accepted.add(sid)
                    if route == "messages" and response.status_code == 200:
                        sent = {"model", "messages", "max_tokens"}.union(
                            *(MESSAGES_FIELDS.get(n, ()) for n in names)
                        )
                        forwarded = set(records[-1].request) - set(records[-1].overrides or {})
                        assert forwarded <= sent, (body[:200], forwarded - sent)
                        messages_answered += 1
        for sid in sorted(accepted):
            view = await http.get(f"/admin/sessions/{sid}/trace", headers=AUTH)
            assert view.status_code == 200, (sid, view.text[:300])
            json_form = rng.random() < 0.5
            finish = await http.post(
                f"/admin/sessions/{sid}/finish" + ("?format=json" if json_form else ""),
                headers=AUTH,
            )
            assert finish.status_code == 200, (sid, finish.text[:300])
        stats = (await http.get("/admin/stats", headers=AUTH)).json()
    assert accepted
    assert messages_answered > 5
    assert stats["live_sessions"] == 0


CONVERSE_MODELS = [
    "m",
    "us.anthropic.claude-sonnet-4-20250514-v1%3A0",
    "arn%3Aaws%3Ab%2Fx",
    "%FF",
    "%00",
]
CONVERSE_FIELDS = {
    "system": ['[{"text": "Be brief."}]', '[{"cachePoint": {"type": "default"}}]', '[{"x": 1}]'],
    "inferenceConfig": [
        '{"maxTokens": %s}',
        '{"temperature": %s, "topP": 0.5}',
        '{"stopSequences": %s}',
    ],
    "toolConfig": [
        '{"tools": [{"toolSpec": {"name": "calc", "inputSchema": {"json": %s}}}]}',
        '{"tools": [], "toolChoice": %s}',
        '{"tools": [{"cachePoint": {}}], "toolChoice": {"any": {}}}',
    ],
    "additionalModelRequestFields": ["{}", '{"top_k": %s}'],
    "requestMetadata": ['{"k": %s}'],
    "messages": [
        '[{"role": "assistant", "content": [{"toolUse": {"toolUseId": "t", "name": "c", '
        '"input": %s}}]}]',
        '[{"role": "user", "content": [{"toolResult": {"toolUseId": "t", '
        '"content": [{"json": %s}]}}]}]',
        '[{"role": "assistant", "content": [{"reasoningContent": {"reasoningText": '
        '{"text": %s}}}]}]',
        '[{"role": "user", "content": [{"image": %s}]}]',
        '[{"role": %s, "content": []}]',
    ],
    "guardrailConfig": ["%s"],
}
# The chat fields each Converse field may become (the model always; a stream its options).
IMPLIED = {
    "system": {"messages"},
    "messages": {"messages"},
    "inferenceConfig": {"max_tokens", "temperature", "top_p", "stop"},
    "toolConfig": {"tools", "tool_choice"},
}


async def test_hostile_converse_input_gets_no_5xx_and_forwards_only_what_was_sent() -> None:
    rng = random.Random(34)
    taken = 0
    async with served() as stack, httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        for i in range(150):
            sid = f"c{i}"
            fields = {'"messages"': '[{"role": "user", "content": [{"text": "What is 1 + 1?"}]}]'}
            for name in rng.sample(sorted(CONVERSE_FIELDS), rng.randrange(0, 4)):
                template = rng.choice(CONVERSE_FIELDS[name])
                fields[f'"{name}"'] = (
                    template.replace("%s", _scalar(rng)) if "%s" in template else template
                )
            body = "{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"
            action = rng.choice(["converse", "converse-stream"])
            path = f"/sessions/{sid}/model/{rng.choice(CONVERSE_MODELS)}/{action}"
            response = await http.post(path, content=body.encode())
            await _ok_or_4xx(response, f"{path}: {body[:200]}")
            if response.status_code >= 400:
                assert response.headers["x-amzn-errortype"].endswith(":"), body[:200]
                continue
            taken += 1
            (record,) = (await stack.gateway.finish_session(sid)).records
            allowed = {"model"}.union(*(IMPLIED.get(k.strip('"'), ()) for k in fields))
            if action == "converse-stream":
                allowed |= {"stream", "stream_options"}
            assert set(record.request) <= allowed, (body[:200], record.request)
    assert 30 < taken < 150, taken  # both answered and refused calls
