"""The client's API cannot be misused quietly: unknown keywords are errors that say where the
right one is, ``_rollout`` extras go through ``rollout=`` only, the sync facade takes exactly
the async client's parameters, and errors leave ``async with`` as themselves."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agentcore_rl import (
    AsyncRolloutClient,
    AwsConfig,
    ConfigurationError,
    GatewayConfig,
    GroupRules,
    Limits,
    Retries,
    RetryPolicy,
    RolloutClient,
    RolloutError,
    RolloutGateway,
    Timeouts,
)
from agentcore_rl.client.config import DEFAULT_LIMITS, DEFAULT_RETRIES, DEFAULT_TIMEOUTS
from agentcore_rl.local.stack import LocalStack
from agentcore_rl.server import AgentCoreRLApp
from tests.client.agents import Recorder
from tests.client.conftest import FAST_WATCH, ClientFactory

_OFFLINE: dict[str, Any] = {"agent_url": "http://127.0.0.1:9", "s3_bucket": "bkt", "exp_id": "e"}


# --- unknown keywords -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [AsyncRolloutClient, RolloutClient])
def test_a_misspelt_constructor_keyword_is_a_type_error_naming_it(cls: type[Any]) -> None:
    with pytest.raises(TypeError) as caught:
        cls(**_OFFLINE, max_concurent_sessions=5)
    assert str(caught.value) == (
        f"{cls.__name__}() got an unexpected keyword argument 'max_concurent_sessions' "
        "(did you mean 'limits=Limits(max_concurrent_sessions=...)'?)"
    )


@pytest.mark.parametrize(
    ("keyword", "hint"),
    [
        ("tps_limit", "limits=Limits(tps=...)"),
        ("timeout", "timeouts=Timeouts(rollout=...)"),
        ("max_concurrent_sessions", "limits=Limits(max_concurrent_sessions=...)"),
        ("s3_endpoint_url", "aws=AwsConfig(s3_endpoint_url=...)"),
        ("model_id", "rollout={'model_id': ...}"),
        ("watchr", "watcher"),
    ],
)
def test_a_moved_constructor_keyword_points_to_where_it_lives(keyword: str, hint: str) -> None:
    options: dict[str, Any] = {**_OFFLINE, keyword: 1}
    with pytest.raises(TypeError, match=re.escape(f"'{keyword}' (did you mean {hint!r}?)")):
        AsyncRolloutClient(**options)


async def test_a_misspelt_keyword_on_invoke_is_a_type_error_naming_it(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    with pytest.raises(TypeError) as caught:
        await client.invoke({"n": 1}, input_idd="q-1")  # type: ignore[call-arg]
    assert str(caught.value) == (
        "AsyncRolloutClient.invoke() got an unexpected keyword argument 'input_idd' "
        "(did you mean 'input_id'?)"
    )
    with pytest.raises(TypeError, match=r"free-form keys go in rollout=\{'temperature': \.\.\.\}"):
        await client.invoke({"n": 1}, temperature=0.7)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'redundancy'"):
        await client.invoke_group({"n": 1}, rules=GroupRules(n=2), redundancy=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="the client's limits=Limits"):
        client.run_batch([{"n": 1}], max_concurrent_sessions=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'overrides'"):
        client.run_batch([{"n": 1}], overrides={"temperature": 0.7})  # type: ignore[call-arg]
    assert client.stats.invocations == 0
    assert recorder.sessions == []


def test_config_objects_name_unknown_keywords_and_bad_values() -> None:
    with pytest.raises(TypeError, match=r"Limits\(\) got .* 'max_concurent_sessions' \(did you"):
        Limits(max_concurent_sessions=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"GroupRules\(\) got .* 'redundnacy'"):
        GroupRules(n=2, redundnacy=1)  # type: ignore[call-arg]
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: Limits(max_concurrent_sessions=0), "Limits.max_concurrent_sessions must be"),
        (lambda: Limits(tps=0), "Limits.tps must be a number > 0, got 0"),
        (lambda: Limits(burst=-1.0), "Limits.burst"),
        (lambda: Timeouts(rollout=0), "Timeouts.rollout must be a number > 0 or None, got 0"),
        (lambda: Timeouts(close=None), "Timeouts.close"),  # type: ignore[arg-type]
        (lambda: Retries(rollouts=-1), "Retries.rollouts must be an int >= 0"),
        (lambda: Retries(call=3), "Retries.call must be a RetryPolicy"),  # type: ignore[arg-type]
        (lambda: AwsConfig(endpoint_url="localhost:9000"), "AwsConfig.endpoint_url"),
        (lambda: AwsConfig(qualifier=""), "AwsConfig.qualifier"),
        (lambda: GatewayConfig(url="gw:9000", admin_token="t"), "GatewayConfig.url"),
        (lambda: GroupRules(n=2, member_seed=1.5), "member_seed"),  # type: ignore[arg-type]
    ]
    for make, message in cases:
        with pytest.raises(ConfigurationError, match=message.replace(".", r"\.")):
            make()


def test_config_objects_are_frozen_keyword_only_with_readable_reprs() -> None:
    assert repr(DEFAULT_LIMITS) == "Limits(max_concurrent_sessions=100, tps=25.0, burst=None)"
    assert repr(DEFAULT_TIMEOUTS) == "Timeouts(rollout=3600.0, close=30.0, check=1.0)"
    assert repr(DEFAULT_RETRIES) == (
        "Retries(call=RetryPolicy(attempts=5, initial=0.5, maximum=10.0, jitter=0.5), "
        "rollouts=2, lost=5)"
    )
    assert repr(AwsConfig(qualifier="prod")) == (
        "AwsConfig(endpoint_url=None, s3_endpoint_url=None, qualifier='prod')"
    )
    gateway = GatewayConfig(url="http://127.0.0.1:9000", admin_token="s3cret")
    assert repr(gateway) == "GatewayConfig(url='http://127.0.0.1:9000', app=None)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_LIMITS.tps = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        Limits(5)  # type: ignore[call-arg]
    assert dataclasses.replace(DEFAULT_LIMITS, tps=50.0) == Limits(tps=50.0)
    assert Retries(call=RetryPolicy(attempts=2)).call.attempts == 2


async def test_the_client_checks_the_types_of_its_config_objects() -> None:
    with pytest.raises(ConfigurationError, match="limits must be a Limits, got dict"):
        AsyncRolloutClient(**_OFFLINE, limits={"tps": 5})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"rollout= takes a mapping"):
        AsyncRolloutClient(**_OFFLINE, rollout=[("temperature", 0.7)])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="rollout= cannot set 's3_bucket'"):
        AsyncRolloutClient(**_OFFLINE, rollout={"s3_bucket": "other"})
    client = AsyncRolloutClient(**_OFFLINE)
    with pytest.raises(ConfigurationError, match="rules must be a GroupRules"):
        client.run_groups([], rules=8)  # type: ignore[arg-type]
    await client.aclose()


# --- the sync facade is derived -----------------------------------------------------------


def _public_methods(cls: type[Any]) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if name[0] != "_"}


def test_rolloutclient_takes_exactly_the_async_clients_parameters() -> None:
    def parameters(func: Callable[..., Any]) -> list[inspect.Parameter]:
        return list(inspect.signature(func).parameters.values())

    assert parameters(RolloutClient.__init__) == parameters(AsyncRolloutClient.__init__)
    shared = _public_methods(RolloutClient) & _public_methods(AsyncRolloutClient)
    assert shared >= {
        "invoke",
        "rollout",
        "run_batch",
        "invoke_group",
        "run_groups",
        "attach",
        "set_policy_version",
        "advance_policy",
        "trace_of",
    }
    for name in shared - {"trace_of"}:
        assert parameters(getattr(RolloutClient, name)) == parameters(
            getattr(AsyncRolloutClient, name)
        ), name
    # trace_of takes the facade's own future (a concurrent one): the same names only.
    assert inspect.signature(RolloutClient.trace_of).parameters.keys() == (
        inspect.signature(AsyncRolloutClient.trace_of).parameters.keys()
    )
    # What only the async client has is its lifecycle (the facade's is close()).
    assert _public_methods(AsyncRolloutClient) - shared <= {"aclose"}


# --- rollout= reaches _rollout ----------------------------------------------------------------


async def test_rollout_mapping_reaches_the_payload_and_a_call_overrides_it(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(rollout={"model_id": "qwen3", "temperature": 0.7, "top_k": 20})
    await client.rollout({"n": 1}, input_id="a")
    await client.rollout({"n": 2}, input_id="b", rollout={"temperature": 1.0, "seed": 3})
    items = [i async for i in client.run_batch([{"n": 3}], rollout={"top_k": 5})]
    assert items[0].success
    first, second, third = recorder.rollout_blocks
    assert (first["model_id"], first["temperature"], first["top_k"]) == ("qwen3", 0.7, 20)
    assert (second["temperature"], second["seed"], second["top_k"]) == (1.0, 3, 20)
    assert (third["temperature"], third["top_k"]) == (0.7, 5)
    assert "seed" not in first  # a call's keys are its own
    assert "seed" not in third


# --- errors leave async with as themselves ----------------------------------------------------


async def test_a_value_error_inside_async_with_leaves_as_itself(
    make_client: ClientFactory,
) -> None:
    client = make_client()

    async def use() -> None:
        async with client:
            await client.rollout({"n": 1})  # the client's task groups are running
            raise ValueError("mine")

    with pytest.raises(ValueError, match="mine") as caught:
        await use()
    assert type(caught.value) is ValueError
    assert client.state.name == "CLOSED"


async def test_a_rollout_error_from_an_awaited_rollout_leaves_as_itself(
    make_client: ClientFactory,
) -> None:
    client = make_client()
    sessions: list[str] = []

    async def use() -> None:
        async with client:
            fut = await client.invoke({"mode": "raise"})
            sessions.append(fut.session_id)
            await fut

    with pytest.raises(RolloutError) as caught:
        await use()
    assert type(caught.value) is RolloutError
    assert caught.value.session_id == sessions[0]


async def test_cancelling_around_async_with_stays_a_plain_cancellation(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    with anyio.CancelScope() as scope:
        async with client:
            fut = await client.invoke({"mode": "hang"})
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught  # a plain cancellation, caught by its own scope
    assert client.state.name == "CLOSED"
    assert fut.done()
    # The cancelled block took the client's background work with it: the session it could
    # not stop is listed, not forgotten.
    assert fut.session_id in client.unstopped_sessions


async def test_nested_async_with_is_refused_at_once(make_client: ClientFactory) -> None:
    client = make_client()
    async with client:
        with pytest.raises(RuntimeError, match="already entered with 'async with'"):
            async with client:
                pytest.fail("entered twice")
        assert (await client.rollout({"n": 7}))["n"] == 7  # the first block goes on
    assert client.state.name == "CLOSED"


def _echo_app() -> AgentCoreRLApp:
    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": [1.0], "n": payload["n"]}

    return app


async def test_errors_leave_the_gateway_and_the_local_stack_as_themselves() -> None:
    async def serve() -> None:
        async with RolloutGateway("http://127.0.0.1:9/v1"):
            raise ValueError("inside the gateway")

    with pytest.raises(ValueError, match="gateway") as caught:
        await serve()
    assert type(caught.value) is ValueError
    stack = LocalStack(app_factory=_echo_app, agents=1, tps=None)

    async def use() -> None:
        async with stack:
            async with AsyncRolloutClient(
                agent_url=stack.agent_urls,
                s3_bucket=stack.bucket,
                exp_id="stack-errors",
                aws=AwsConfig(s3_endpoint_url=stack.s3_endpoint_url),
                watcher=FAST_WATCH,
            ) as client:
                assert (await client.rollout({"n": 2}))["n"] == 2
            raise ValueError("inside the stack")

    with pytest.raises(ValueError, match="stack") as raised:
        await use()
    assert type(raised.value) is ValueError
