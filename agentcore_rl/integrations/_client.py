"""The adapters' one door to the rollout client: one client per settings and event loop,
open as long as that loop runs (with its Ray-wide limits when the settings name some)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from agentcore_rl.client import AsyncRolloutClient, AwsConfig, GatewayConfig, Limits, Timeouts
from agentcore_rl.client.config import GATEWAY_TOKEN_ENV
from agentcore_rl.errors import ConfigurationError, GatewayError, InvocationError
from agentcore_rl.groups import GroupDroppedError, GroupRules, RolloutGroup, result_reward
from agentcore_rl.integrations.settings import AgentCoreSettings
from agentcore_rl.training.rows import TrainingRow, group_rows
from agentcore_rl.trajectory import Trajectory

__all__ = [
    "SampleOutcome",
    "close_shared_clients",
    "run_groups",
    "run_sample",
    "set_policy_version",
    "shared_client",
]


@dataclass(frozen=True)
class SampleOutcome:
    """One sample as the adapters see it: its session, reward, tokens, or its error."""

    session_id: str
    reward: float
    trajectory: Trajectory | None
    error: str | None = None


class _Owner:
    """The task that holds one shared client open: a client's task group must be entered
    and left by one task, and the trainer's per-sample tasks come and go."""

    def __init__(self, settings: AgentCoreSettings) -> None:
        self.settings = settings
        self.ready: asyncio.Future[AsyncRolloutClient] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                self.ready.set_result(await _open_client(self.settings, stack))
                await self.stop.wait()
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise


async def _open_client(
    settings: AgentCoreSettings, stack: contextlib.AsyncExitStack
) -> AsyncRolloutClient:
    limiters: dict[str, Any] = {}
    if settings.shared_limits is not None:
        # lazy: shared limits run on Ray (the ray extra), only when configured
        from agentcore_rl.distributed import shared_limits

        limits = await stack.enter_async_context(
            shared_limits(
                settings.shared_limits,
                tps=settings.tps,
                sessions=settings.max_concurrent_sessions,
            )
        )
        limiters = {"rate_limiter": limits.rate, "session_limiter": limits.sessions}
    rollout = {} if settings.model_id is None else {"model_id": settings.model_id}
    assert settings.gateway_url is not None  # checked by the settings
    client = AsyncRolloutClient(
        agent_runtime_arn=settings.agent_runtime_arn,
        agent_url=settings.agent_url,
        s3_bucket=settings.s3_bucket,
        exp_id=settings.exp_id,
        rollout=rollout,
        limits=Limits(max_concurrent_sessions=settings.max_concurrent_sessions, tps=settings.tps),
        timeouts=Timeouts(rollout=settings.timeout),
        aws=AwsConfig(endpoint_url=settings.endpoint_url, s3_endpoint_url=settings.s3_endpoint_url),
        # the trainer's process: its environment is read here, where the client is made
        gateway=GatewayConfig(
            url=settings.gateway_url,
            admin_token=settings.gateway_admin_token or os.environ.get(GATEWAY_TOKEN_ENV),
        ),
        **limiters,
    )
    return await stack.enter_async_context(client)


_Key = tuple[AgentCoreSettings, int]
# One owner per settings and event loop, for the life of the loop (or until
# close_shared_clients); referenced here, so its task always has an owner to stop it.
_owners: dict[_Key, _Owner] = {}


async def shared_client(settings: AgentCoreSettings) -> AsyncRolloutClient:
    """This process's client for ``settings`` on the running event loop, opened once."""
    key = (settings, id(asyncio.get_running_loop()))
    owner = _owners.get(key)
    if owner is None:
        owner = _owners[key] = _Owner(settings)
        owner.task = asyncio.get_running_loop().create_task(
            owner.run(), name=f"agentcore-rl client {settings.exp_id}"
        )
    try:
        return await asyncio.shield(owner.ready)
    except Exception:
        _owners.pop(key, None)  # the next sample tries to open it again
        raise


async def close_shared_clients() -> None:
    """Close this event loop's shared clients (a worker shutting down, a test ending)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _owners if k[1] == loop]:
        owner = _owners.pop(key)
        owner.stop.set()
        if owner.task is not None:
            with contextlib.suppress(Exception):
                await owner.task


def set_policy_version(client: AsyncRolloutClient, version: int) -> None:
    """Stamp ``version`` into the group members started from now on; an older version (a
    late call from a trainer that already moved on) changes nothing."""
    with contextlib.suppress(ConfigurationError):
        client.set_policy_version(version)


async def run_sample(
    client: AsyncRolloutClient,
    payload: Mapping[str, Any],
    *,
    input_id: str,
    retry: int,
    overrides: Mapping[str, Any],
) -> SampleOutcome:
    """One sample: a rollout, re-run in a fresh session up to ``retry`` times on failure.

    The last failure comes back as an outcome with ``error`` set (reward 0, and the tokens
    its trace kept, if any), not raised: the adapter applies its ``on_failure`` rule.
    """
    error = "no attempt"
    session_id = ""
    trajectory: Trajectory | None = None
    for _ in range(retry + 1):
        try:
            fut = await client.invoke(payload, input_id=input_id, rollout=overrides)
        except (InvocationError, GatewayError) as exc:
            # Refused or unreachable (the agent, or the gateway opening the session): a
            # failed attempt like any other, not the end of the trainer's step.
            error = f"{type(exc).__name__}: {exc}"
            continue
        session_id = fut.session_id
        try:
            result = await fut
        except Exception as exc:  # a cancellation is no Exception: it goes on
            error = f"{type(exc).__name__}: {exc}"
            trajectory = None
            with contextlib.suppress(Exception):  # the tokens its trace kept, if any
                trajectory = fut.trajectory
            continue
        return SampleOutcome(session_id, result_reward(result) or 0.0, fut.trajectory)
    return SampleOutcome(session_id, 0.0, trajectory, error)


async def run_groups(
    client: AsyncRolloutClient,
    groups: Sequence[tuple[Mapping[str, Any], int, str]],
    *,
    settings: AgentCoreSettings,
    overrides: Mapping[str, Any],
) -> list[list[list[TrainingRow]] | None]:
    """GRPO groups, each ``(payload, n, input_id)``, run at once by the client under the
    settings' rules (member seeds from 0): each group's kept members' rows, in member order,
    or ``None`` when ``on_failure="drop_group"`` dropped it. ``on_failure="zero"`` keeps a
    failed member as a zeroed one.
    """
    out: list[list[list[TrainingRow]] | None] = [None] * len(groups)

    async def one(position: int, payload: Mapping[str, Any], n: int, input_id: str) -> None:
        rules = GroupRules(
            n=n,
            retry=settings.retry,
            on_failure=settings.on_failure,
            redundancy=settings.redundancy,
            member_seed=0,
        )
        try:
            group = await client.invoke_group(
                payload, rules=rules, input_id=input_id, rollout=overrides
            )
            result: RolloutGroup = await group
        except GroupDroppedError:
            return
        by_member: dict[int, list[TrainingRow]] = {}
        for row in group_rows(result, require_tokens=False):
            by_member.setdefault(row.member, []).append(row)
        out[position] = [by_member[member.index] for member in result.members]

    async with anyio.create_task_group() as tg:
        for position, (payload, n, input_id) in enumerate(groups):
            tg.start_soon(one, position, payload, n, input_id)
    return out
