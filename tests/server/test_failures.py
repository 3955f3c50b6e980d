"""Every failure kind of a rollout writes an error envelope the trainer can read."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import InfraError, InvalidPayloadError, RewardError, RolloutError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp

from .helpers import (
    SESSION,
    read_envelope,
    rollout_app,
    rollout_payload,
    run_to_end,
    served,
    session_headers,
    settle,
)

KEY = f"exp/q-1/{SESSION}.json"


async def run_one(store: ResultStore, bucket: str, handler: Any) -> dict[str, Any]:
    response = await run_to_end(rollout_app(store, handler), bucket)
    assert response.json()["result_key"] == KEY
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope[protocol.STATUS_CODE] == 500
    assert envelope[protocol.RESULT_KEY] == KEY
    assert envelope[protocol.SESSION_ID] == SESSION
    assert envelope[protocol.S3_BUCKET] == bucket
    assert envelope[protocol.PAYLOAD] == rollout_payload(bucket)
    assert protocol.is_error_envelope(envelope)
    return envelope


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_handler_raised(store: ResultStore, bucket: str, kind: str) -> None:
    def boom(payload: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("model server unreachable")

    async def aboom(payload: dict[str, Any]) -> dict[str, Any]:
        boom(payload)
        return {}

    envelope = await run_one(store, bucket, aboom if kind == "async" else boom)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_HANDLER_RAISED
    assert envelope[protocol.STOP_REASON] == "ValueError: model server unreachable"
    assert "ValueError: model server unreachable" in envelope[protocol.TRACEBACK]
    assert "rewards" not in envelope


async def test_a_handler_error_is_reported_with_its_type(store: ResultStore, bucket: str) -> None:
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": [payload["a"]]}

    envelope = await run_one(store, bucket, solve)
    assert envelope[protocol.STOP_REASON] == "KeyError: 'a'"
    error = RolloutError(envelope)
    assert "(handler_exception): KeyError: 'a'" in str(error)


async def test_handler_returned_non_dict(store: ResultStore, bucket: str) -> None:
    async def solve(payload: dict[str, Any]) -> list[float]:
        return [1.0]

    envelope = await run_one(store, bucket, solve)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_NOT_A_DICT
    assert envelope[protocol.STOP_REASON] == "handler returned list, expected a dict"


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        ({"rewards": [float("nan")]}, "rewards[0] must be finite, got nan"),
        ({"rewards": [1.0, float("-inf")]}, "rewards[1] must be finite, got -inf"),
        ({"rewards": 1.0}, "rewards must be a list of numbers, got float"),
        ({"rewards": ["1.0"]}, "rewards[0] must be a number, got str '1.0'"),
        ({"rewards": [True]}, "rewards[0] must be a number, got bool True"),
        ({"reward": None, "rewards": [None]}, "rewards[0] must be a number, got NoneType None"),
        ({"reward": "high"}, "reward must be a number, got str 'high'"),
    ],
)
async def test_a_reward_that_cannot_be_used_is_a_reward_failure_naming_its_field(
    store: ResultStore, bucket: str, result: dict[str, Any], reason: str
) -> None:
    envelope = await run_one(store, bucket, lambda payload: result)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_INVALID_REWARD
    assert envelope[protocol.FAILURE_KIND] == "reward"
    assert envelope[protocol.STOP_REASON] == reason


@pytest.mark.parametrize(
    ("raised", "error_type", "kind"),
    [
        (InfraError("sandbox down"), protocol.ERROR_INFRA, "infra"),
        (RewardError("the judge gave no score"), protocol.ERROR_INVALID_REWARD, "reward"),
        (KeyError("tool_call"), protocol.ERROR_HANDLER_RAISED, "agent"),
    ],
)
async def test_what_a_handler_raises_says_the_failure_kind(
    store: ResultStore, bucket: str, raised: Exception, error_type: str, kind: str
) -> None:
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        raise raised

    envelope = await run_one(store, bucket, solve)
    assert (envelope[protocol.ERROR_TYPE], envelope[protocol.FAILURE_KIND]) == (error_type, kind)
    assert type(raised).__name__ in envelope[protocol.TRACEBACK]


async def test_a_result_without_a_reward_is_no_failure_of_the_server(
    store: ResultStore, bucket: str
) -> None:
    # Whether a reward is needed is the caller's rule (a group's, eval's): not the server's.
    await run_to_end(rollout_app(store, lambda payload: {"answer": 4}), bucket)
    envelope = await read_envelope(store, bucket, KEY)
    assert not protocol.is_error_envelope(envelope)


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        ({"tokens": {1, 2}}, "Object of type set is not JSON serializable"),
        ({"obj": object()}, "Object of type object is not JSON serializable"),
    ],
)
async def test_handler_result_not_json(
    store: ResultStore, bucket: str, result: dict[str, Any], fragment: str
) -> None:
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return result

    envelope = await run_one(store, bucket, solve)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_NOT_JSON
    assert envelope[protocol.STOP_REASON].startswith("handler result is not JSON-serialisable")
    assert fragment in envelope[protocol.STOP_REASON]


async def test_handler_spoiled_its_payload(store: ResultStore, bucket: str) -> None:
    # The envelope carries the payload; a handler that put a non-JSON value into it must
    # still get an envelope written.
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        payload["scratch"] = {1, 2}
        return {"rewards": [1.0]}

    await run_to_end(rollout_app(store, solve), bucket)
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_NOT_JSON
    assert "unserialisable_payload" in envelope[protocol.PAYLOAD]


async def test_without_rollout_block_runs_and_logs(
    store: ResultStore, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = AgentCoreRLApp(store=store)
    ran = asyncio.Event()

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        ran.set()
        return {"rewards": [1.0]}

    caplog.set_level(logging.WARNING, logger="agentcore_rl.server")
    async with served(app) as http:
        response = await http.post("/invocations", json={"prompt": "hi"}, headers=session_headers())
        assert response.status_code == 200
        assert response.json() == {"status": "processing"}
        await asyncio.wait_for(ran.wait(), 5)
        await settle(app)
    messages = [r.getMessage() for r in caplog.records]
    assert any("names no S3 location" in m and SESSION in m for m in messages)
    assert any("was not written anywhere" in m for m in messages)
    assert await store.list_keys(bucket, "") == []


async def test_retried_invocation_runs_once(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(store=store)
    release = asyncio.Event()
    calls: list[str] = []

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload["prompt"])
        await release.wait()
        return {"rewards": [1.0]}

    async with served(app) as http:
        payload = rollout_payload(bucket)
        first = await http.post("/invocations", json=payload, headers=session_headers())
        again = await http.post("/invocations", json=payload, headers=session_headers())
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()
        assert app.runner.active == 1
        release.set()
        await settle(app)
    assert calls == ["2+2?"]
    assert await store.list_keys(bucket, "") == [KEY]


async def test_handler_refusing_its_payload(store: ResultStore, bucket: str) -> None:
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        raise InvalidPayloadError("answer must be a string", field="answer")

    await run_to_end(rollout_app(store, solve), bucket)
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope[protocol.STATUS_CODE] == 400
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_INVALID_PAYLOAD
    assert envelope[protocol.STOP_REASON] == "answer must be a string"
