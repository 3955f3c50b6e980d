"""A Bedrock Converse agent on the real boto3 ``bedrock-runtime`` client (sync, so the async
tests run it in a worker thread): one call, whole or streamed, read back into the message
botocore parsed, and the math agent's tool loop."""

from __future__ import annotations

import json
from typing import Any

import boto3
from botocore.config import Config

from agentcore_rl.local.policy import evaluate_arithmetic

#: A Bedrock inference profile id, as agents name their model (URL-encoded in the path).
MODEL = "us.anthropic.claude-sonnet-4-20250514-v1:0"
SYSTEM = "You are a careful math tutor."
CALCULATOR_SPEC: Any = {
    "toolSpec": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            }
        },
    }
}


_OPEN: list[Any] = []  # the clients made, closed by ``closed_clients`` after each test


def bedrock(session_url: str) -> Any:
    """The agent's client: only ``endpoint_url`` points at the gateway (no retries: a test
    sees each error once)."""
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=session_url,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    return keep(client)


def keep(client: Any) -> Any:
    """``client``, to be closed after the test (its pooled sockets are not left to the GC)."""
    _OPEN.append(client)
    return client


def close_clients() -> None:
    """Close the clients made so far (each test module's autouse fixture, after each test)."""
    while _OPEN:
        _OPEN.pop().close()


def collect(stream: Any) -> dict[str, Any]:
    """A ``converse_stream`` response's events as the non-streamed answer's shape."""
    blocks: dict[int, dict[str, Any]] = {}
    answer: dict[str, Any] = {"events": []}
    events = stream["stream"]
    try:
        for event in events:
            ((kind, body),) = event.items()
            answer["events"].append(kind)
            if kind == "messageStart":
                answer["role"] = body["role"]
            elif kind == "contentBlockStart":
                blocks[body["contentBlockIndex"]] = {"toolUse": {**body["start"]["toolUse"]}}
            elif kind == "contentBlockDelta":
                block = blocks.setdefault(body["contentBlockIndex"], {})
                delta = body["delta"]
                if "text" in delta:
                    block["text"] = block.get("text", "") + delta["text"]
                elif "toolUse" in delta:
                    use = block["toolUse"]
                    use["input"] = use.get("input", "") + delta["toolUse"]["input"]
                else:
                    thought = block.setdefault("reasoningContent", {"reasoningText": {"text": ""}})
                    thought["reasoningText"]["text"] += delta["reasoningContent"]["text"]
            elif kind == "messageStop":
                answer["stopReason"] = body["stopReason"]
            elif kind == "metadata":
                answer["usage"], answer["metrics"] = body["usage"], body["metrics"]
    finally:  # a stream an error cut short leaves its connection unread
        events.close()
    for block in blocks.values():
        if "toolUse" in block:
            block["toolUse"]["input"] = json.loads(block["toolUse"].get("input") or "{}")
    content = [blocks[i] for i in sorted(blocks)]
    answer["output"] = {"message": {"role": answer.pop("role"), "content": content}}
    return answer


def converse(client: Any, messages: list[Any], *, stream: bool, **fields: Any) -> dict[str, Any]:
    """One call with the calculator (``fields`` replace or add request fields)."""
    request: dict[str, Any] = {
        "modelId": MODEL,
        "messages": messages,
        "system": [{"text": SYSTEM}],
        "toolConfig": {"tools": [CALCULATOR_SPEC]},
        **fields,
    }
    if stream:
        return collect(client.converse_stream(**request))
    return dict(client.converse(**request))


def tool_loop(client: Any, problem: str, *, stream: bool) -> tuple[list[Any], list[Any]]:
    """The math agent's loop in Converse -> (the conversation, each call's answer)."""
    messages: list[Any] = [{"role": "user", "content": [{"text": problem}]}]
    answers = []
    for _ in range(6):  # bounded
        answer = converse(client, messages, stream=stream)
        answers.append(answer)
        message = answer["output"]["message"]
        messages.append(message)
        if answer["stopReason"] != "tool_use":
            return messages, answers
        results = []
        for block in message["content"]:
            if "toolUse" in block:
                value = evaluate_arithmetic(block["toolUse"]["input"]["expression"])
                result = {
                    "toolUseId": block["toolUse"]["toolUseId"],
                    "content": [{"text": str(value)}],
                }
                results.append({"toolResult": {**result, "status": "success"}})
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent did not finish in 6 turns")
