"""Construction and registration: bad arguments are refused with a clear message."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from agentcore_rl.server.invoke import HandlerSpec
from agentcore_rl.server.options import (
    DEFAULT_REQUEST_LIMITS,
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
    SpoolConfig,
    default_host,
)


@pytest.fixture
def switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (
            lambda: RequestLimits(max_body_bytes=0),
            "RequestLimits.max_body_bytes must be a number > 0",
        ),
        (lambda: RequestLimits(max_body_bytes=100, max_inflight_body_bytes=99), "at least"),
        (lambda: ShutdownConfig(grace=-1), "ShutdownConfig.grace must be a number >= 0"),
        (
            lambda: RequestLimits(max_sync_workers=0),
            "RequestLimits.max_sync_workers must be an int >= 1",
        ),
        (lambda: SpoolConfig(retry_interval=0), "retry_interval"),
        (
            lambda: FaultChecks(gil_switch_interval=0),
            "gil_switch_interval must be a number > 0 or None",
        ),
        (
            lambda: AgentCoreRLApp(limits=ShutdownConfig()),  # type: ignore[arg-type]
            "limits must be a RequestLimits",
        ),
    ],
)
def test_bad_arguments(make: Callable[[], object], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment):
        make()


def test_an_unknown_keyword_names_the_closest_known_one() -> None:
    with pytest.raises(
        TypeError,
        match=r"AgentCoreRLApp\(\) got an unexpected keyword argument "
        r"'fault' \(did you mean 'faults'\?\)",
    ):
        AgentCoreRLApp(fault=FaultChecks())  # type: ignore[call-arg]
    with pytest.raises(
        TypeError,
        match=r"RequestLimits\(\) got .* 'max_body' \(did you mean 'max_body_bytes'\?\)",
    ):
        RequestLimits(max_body=10)  # type: ignore[call-arg]


def test_a_moved_keyword_says_where_it_lives_now() -> None:
    with pytest.raises(
        TypeError,
        match=r"'shutdown_grace' \(did you mean 'shutdown=ShutdownConfig\(grace=...\)'\?\)",
    ):
        AgentCoreRLApp(shutdown_grace=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"limits=RequestLimits\(max_body_bytes=...\)"):
        AgentCoreRLApp(max_body_bytes=5)  # type: ignore[call-arg]
    # A config field given to the app itself is named where it belongs.
    with pytest.raises(TypeError, match=r"'grace' \(did you mean 'shutdown=ShutdownConfig"):
        AgentCoreRLApp(grace=60)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"spool=SpoolConfig\(directory=...\)"):
        AgentCoreRLApp(spool_dir="/tmp/x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"limits=RequestLimits\(allowed_buckets=...\)"):
        AgentCoreRLApp(allowed_buckets=["rollouts"])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"spool=SpoolConfig\(app_name=...\)"):
        AgentCoreRLApp(app_name="math")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"RequestLimits\(max_sync_workers=...\), faults="):
        AgentCoreRLApp(workers=None)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"app.clock = "):
        AgentCoreRLApp(clock=lambda: 0.0)  # type: ignore[call-arg]


def test_at_most_eight_parameters_and_readable_configs() -> None:
    assert len(inspect.signature(AgentCoreRLApp).parameters) <= 8
    assert repr(ShutdownConfig(grace=60.0)) == (
        "ShutdownConfig(grace=60.0, stop_wait=5.0, cancel_timeout=5.0)"
    )
    app = AgentCoreRLApp(shutdown=ShutdownConfig(grace=60.0))
    assert app.shutdown.grace == 60.0
    assert app.limits is DEFAULT_REQUEST_LIMITS


def test_bad_allowed_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="allowed_buckets: allowed bucket 'Not_A_"):
        RequestLimits(allowed_buckets=["Not_A_Bucket"])
    monkeypatch.setenv("AGENTCORE_RL_ALLOWED_BUCKETS", "ok-bucket,Bad_One")
    with pytest.raises(ConfigurationError, match="AGENTCORE_RL_ALLOWED_BUCKETS: allowed bucket"):
        AgentCoreRLApp()


def test_allowed_buckets_as_one_string() -> None:
    limits = RequestLimits(allowed_buckets="rollouts")
    assert AgentCoreRLApp(limits=limits).allowed_buckets == frozenset({"rollouts"})


def test_one_entrypoint_per_app() -> None:
    app = AgentCoreRLApp()
    app.rollout_entrypoint(lambda payload: {})
    with pytest.raises(ConfigurationError, match="already has an entrypoint"):
        app.entrypoint(lambda payload: {})


def test_handler_signatures() -> None:
    def no_args() -> dict[str, Any]:
        return {}

    def with_option(payload: dict[str, Any], retries: int = 3) -> dict[str, Any]:
        return {}

    def with_context_default(payload: dict[str, Any], context: Any = None) -> dict[str, Any]:
        return {}

    class Agent:
        async def __call__(self, payload: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            return {}

    with pytest.raises(ConfigurationError, match="must take the payload"):
        HandlerSpec.inspect(no_args)
    with pytest.raises(ConfigurationError, match="must be callable"):
        HandlerSpec.inspect(42)  # type: ignore[arg-type]
    assert not HandlerSpec.inspect(with_option).takes_context
    assert HandlerSpec.inspect(with_context_default).takes_context
    agent = HandlerSpec.inspect(Agent())
    assert (agent.is_async, agent.takes_context) == (True, True)


def test_owning_the_process_lowers_gil_switch_interval(switch_interval: None) -> None:
    sys.setswitchinterval(0.005)
    AgentCoreRLApp(faults=FaultChecks(gil_switch_interval=0.002)).tune_process()
    assert sys.getswitchinterval() == pytest.approx(0.002)
    sys.setswitchinterval(0.0005)
    AgentCoreRLApp(faults=FaultChecks(gil_switch_interval=0.002)).tune_process()
    assert sys.getswitchinterval() == pytest.approx(0.0005)  # never raised
    AgentCoreRLApp(faults=FaultChecks(gil_switch_interval=None)).tune_process()
    assert sys.getswitchinterval() == pytest.approx(0.0005)


async def test_a_mounted_app_leaves_the_process_alone(switch_interval: None) -> None:
    # Entered from someone else's lifespan (or served without run()): the process is
    # not the app's to tune.
    sys.setswitchinterval(0.005)
    async with AgentCoreRLApp(faults=FaultChecks(gil_switch_interval=0.001)) as app:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            assert (await http.get("/ping")).status_code == 200
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_default_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_CONTAINER", raising=False)
    monkeypatch.setenv("AGENTCORE_RL_HOST", "10.1.2.3")
    assert default_host() == "10.1.2.3"
    monkeypatch.delenv("AGENTCORE_RL_HOST")
    monkeypatch.setenv("DOCKER_CONTAINER", "1")
    assert default_host() == "0.0.0.0"


def test_repr_and_context_repr(s3_endpoint: str) -> None:
    app = AgentCoreRLApp(store=ResultStore(endpoint_url=s3_endpoint))

    @app.rollout_entrypoint
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return {}

    assert "rollout_entrypoint=" in repr(app)
    assert "solve" in repr(app)
    ctx = RequestContext(session_id="s-1", headers={"authorization": "secret"})
    assert "secret" not in repr(ctx)
