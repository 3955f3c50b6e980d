"""The run behind ``agentcore-rl eval`` (and ``demo``): every input's outcome recorded
exactly once, an interrupted run resumed from its journal (docs/cli.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import anyio

from agentcore_rl import protocol
from agentcore_rl._unwrap import raise_unwrapped
from agentcore_rl.cli.cost import Prices, price, trace_messages, trace_tokens, usage_of
from agentcore_rl.cli.eval_config import EvalInput, EvalOptions
from agentcore_rl.cli.journal import EvalJournal, JournalEntry, rows_path_for
from agentcore_rl.cli.summary import EvalRun, correct, outcome_of, pass_at_k, reward_of
from agentcore_rl.client import (
    AsyncRolloutClient,
    AwsConfig,
    GatewayConfig,
    InfraStop,
    Limits,
    LivenessConfig,
    Retries,
    RolloutFuture,
    Timeouts,
)
from agentcore_rl.client.outcomes import failure_kind, is_agent_loss, is_retryable
from agentcore_rl.errors import (
    ClientClosedError,
    InfraFailureRateError,
    RewardError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
    TraceLostError,
)
from agentcore_rl.groups import GroupDroppedError, GroupMember, GroupRules, RolloutGroup
from agentcore_rl.training import group_rows, write_jsonl
from agentcore_rl.trajectory import build_trajectory

if TYPE_CHECKING:
    from agentcore_rl.trace import SessionTrace

__all__ = ["EvalEngine", "Progress", "make_client", "run_eval"]

logger = logging.getLogger(__name__)

_UNLIMITED_TPS: Final = 1e6


def make_client(options: EvalOptions) -> AsyncRolloutClient:
    rollout: dict[str, Any] = dict(options.rollout_extra)
    for name, value in (("base_url", options.base_url), ("model_id", options.model_id)):
        if value is not None:
            rollout[name] = value
    default = Retries()
    retries = Retries(
        rollouts=default.rollouts if options.retry_rollouts is None else options.retry_rollouts,
        lost=default.lost if options.retry_lost is None else options.retry_lost,
    )
    # One lease per results file, so a resumed run renews the lease of what it re-attaches.
    run_key = f"{options.exp_id}\0{options.out.resolve()}".encode()
    liveness = LivenessConfig(lease_id="eval-" + hashlib.sha256(run_key).hexdigest()[:32])
    gateway = None
    if options.gateway_url is not None:
        gateway = GatewayConfig(url=options.gateway_url, admin_token=options.gateway_admin_token)
    return AsyncRolloutClient(
        agent_runtime_arn=options.agent_runtime_arn,
        agent_url=None if options.agent_runtime_arn is not None else list(options.agent_urls),
        s3_bucket=options.s3_bucket,
        exp_id=options.exp_id,
        rollout=rollout,
        limits=Limits(
            max_concurrent_sessions=options.concurrency,
            # The token bucket needs a finite rate.
            tps=options.tps if options.tps is not None else _UNLIMITED_TPS,
        ),
        timeouts=Timeouts(rollout=options.timeout),
        retries=retries,
        liveness=liveness,
        aws=AwsConfig(
            endpoint_url=options.runtime_endpoint_url if options.agent_runtime_arn else None,
            s3_endpoint_url=options.s3_endpoint_url,
        ),
        gateway=gateway,
        preflight=False,  # run_eval checks before it opens any file
        infra_stop=None if options.infra_stop is None else InfraStop(share=options.infra_stop),
    )


def _bar_shape() -> dict[str, int]:
    # An unsized pty (``script``, some CI) reports 0x0 and tqdm would draw nothing.
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if size.columns > 0 and size.lines > 0 else {"ncols": 100, "nrows": 24}


class Progress:
    """The progress bar on stderr, with the failures and the mean reward so far."""

    def __init__(self, total: int, initial: int, enabled: bool, *, unit: str = "rollout") -> None:
        # lazy: tqdm is the cli extra
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, initial=initial, unit=unit, disable=not enabled, **_bar_shape()
        )
        self.failed = 0
        self.rollouts = 0
        self.rewards: list[float] = []

    def update(self, record: Mapping[str, Any]) -> None:
        """One results line more (a group's counts each of its members)."""
        for line in record.get("members") or [record]:
            outcome = outcome_of(line)
            self.rollouts += 1
            self.failed += outcome in ("failed", "timeout")
            if outcome == "done" and line.get("reward") is not None:
                self.rewards.append(line["reward"])
        self.bar.update(1)
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else None
        self.bar.set_postfix(
            failed=self.failed, reward="-" if mean is None else f"{mean:.2f}", refresh=False
        )

    def close(self) -> None:
        self.bar.close()


def _member(m: GroupMember, prices: Prices) -> dict[str, Any]:
    return {
        "index": m.index,
        "attempt": m.attempt,
        "session_id": m.session_id,
        "outcome": m.outcome.value,
        "reward": m.reward,
        "zeroed": m.zeroed,
        "drop_reason": None if m.drop_reason is None else m.drop_reason.value,
        "error": m.error,
        "failure_kind": None if m.failure_kind is None else m.failure_kind.value,
        "cost": price(usage_of({"result": m.result}), prices),
        "result": m.result,
    }


class EvalEngine:
    """``concurrency`` workers taking in turn an earlier run's in-flight rollouts, then inputs."""

    def __init__(
        self,
        options: EvalOptions,
        client: AsyncRolloutClient,
        journal: EvalJournal,
        bar: Progress,
    ) -> None:
        self.options = options
        self.client = client
        self.journal = journal
        self.bar = bar
        self.opening = anyio.Lock()  # groups open one at a time, in input order
        self.trajectories_missing = 0
        self.rules = None
        if options.group_size is not None:
            self.rules = GroupRules(
                n=options.group_size, redundancy=options.redundancy, member_seed=options.group_seed
            )

    async def run(
        self,
        fresh: Sequence[EvalInput],
        in_flight: Sequence[JournalEntry],
        by_id: dict[str, EvalInput],
    ) -> None:
        await self._collect_earlier()
        # Resumed ones first: behind fresh inputs, a lost one would wait for every slot.
        work = iter([*((e, by_id[e.input_id]) for e in in_flight), *((None, i) for i in fresh)])
        try:
            async with anyio.create_task_group() as workers:
                for n in range(self.options.concurrency):
                    workers.start_soon(self._worker, work, name=f"eval worker {n}")
        except Exception as exc:  # the CLI maps a lone failure's type to an exit code
            # Workers admitted at once may meet the same stop: it is the run's one error.
            grouped = getattr(exc, "exceptions", ())
            stop = next((e for e in grouped if isinstance(e, InfraFailureRateError)), None)
            raise_unwrapped(stop or exc)

    async def _worker(self, work: Iterator[tuple[JournalEntry | None, EvalInput]]) -> None:
        for entry, item in work:  # shared by the workers: each takes the next one
            if self.rules is not None:
                await self._run_group(item, self.rules)
                continue
            try:
                await (self._run_one(item) if entry is None else self._resume_one(entry, item))
            except asyncio.CancelledError:
                self.journal.record_abandoned(item.input_id)  # the client stops the session
                raise

    async def _trace(self, bucket: str, result_key: str, what: str) -> SessionTrace | None:
        try:
            return await self.client.store.get_trace(bucket, protocol.trace_key(result_key))
        except StorageError as exc:
            logger.warning("reading the trace of %s failed: %s", what, exc)
            return None

    async def _collect_earlier(self) -> None:
        """An earlier run's group members (with traces) and the trajectories it did not write."""
        if self.rules is not None:
            for group in self.journal.groups.values() if self.options.gateway_url else ():
                for number, end in enumerate(group.ended):
                    start = group.started.get(end.session_id)
                    if end.kind != "succeeded" or start is None:
                        continue
                    trace = await self._trace(start.s3_bucket, start.result_key, end.session_id)
                    if trace is not None:
                        trajectory = build_trajectory(trace, reward=end.reward)
                        group.ended[number] = dataclasses.replace(end, trajectory=trajectory)
        written = self.journal.traced
        for record in list(self.journal.finished.values()) if self.journal.trajectories else ():
            sid, key = record.get("session_id"), record.get("result_key")
            if record.get("outcome") != "done" or not isinstance(sid, str):
                continue
            if sid in written or not isinstance(key, str):
                continue
            trace = await self._trace(self.options.s3_bucket, key, record["input_id"])
            if trace is None:
                self.trajectories_missing += 1
            else:
                self._write_trajectory(trace, record.get("result"))

    async def _run_group(self, item: EvalInput, rules: GroupRules) -> None:
        t0 = time.monotonic()
        try:
            async with self.opening:  # waiting for members' slots paces the run
                fut = await self.client.invoke_group(
                    item.payload,
                    rules=rules,
                    input_id=item.input_id,
                    timeout=self.options.timeout,
                    journal=self.journal,
                    resume=self.journal.groups.get(item.input_id),
                )
            group = await fut
        except (ClientClosedError, InfraFailureRateError):
            raise  # interrupted or stopped: the journal has what --resume needs
        except Exception as exc:  # the run goes on
            self._record_group(item, None, exc, t0)
            return
        # Rows first: a kill in between may duplicate rows (keyed, easy to drop) on
        # --resume, but never leaves a results line without rows.
        write_jsonl(
            group_rows(group, require_tokens=False), rows_path_for(self.options.out), append=True
        )
        self._record_group(item, group, None, t0)

    def _record_group(
        self, item: EvalInput, group: RolloutGroup | None, error: Exception | None, t0: float
    ) -> None:
        if isinstance(error, GroupDroppedError):
            group = error.group
        rewards = [] if group is None or error is not None else group.rewards
        reason = getattr(getattr(error, "reason", None), "value", None) or "failed"
        members = [] if group is None else [_member(m, self.options.prices) for m in group.members]
        discarded = (
            [] if group is None else [_member(m, self.options.prices) for m in group.discarded]
        )
        threshold = self.options.pass_threshold
        record: dict[str, Any] = {
            "input_id": item.input_id,
            "outcome": "done" if error is None else "dropped",
            "reason": None if error is None else reason,
            "n": None if group is None else group.n,
            "rewards": rewards,
            "reward": sum(rewards) / len(rewards) if rewards else None,
            "pass@1": correct(rewards, threshold) / len(rewards) if rewards else None,
            "pass@k": pass_at_k(rewards, len(rewards), threshold) if rewards else None,
            "pass_threshold": threshold,
            "elapsed": round(time.monotonic() - t0, 4),
            "members": members,
            "discarded": discarded,
            "error": None if error is None else str(error),
            "error_type": None if error is None else type(error).__name__,
            "failure_kind": getattr(failure_kind(error), "value", None),
        }
        self.journal.record_outcome(record)
        self.bar.update(record)

    def _journaled(self, item: EvalInput, fut: RolloutFuture) -> None:
        entry = JournalEntry(
            item.input_id, fut.session_id, fut.s3_bucket, fut.result_key, fut.invoked_at
        )
        self.journal.record_started(entry)

    async def _run_one(self, item: EvalInput) -> None:
        t0 = time.monotonic()
        try:
            future = await self.client.invoke(
                item.payload, input_id=item.input_id, on_session=partial(self._journaled, item)
            )
        except InfraFailureRateError:
            raise  # the run stops: this input was not started
        except Exception as exc:  # refused, or never reached: nothing runs
            self._finish(item.input_id, "failed", error=exc, elapsed=time.monotonic() - t0)
            return
        await self._await(item, future)

    async def _await(
        self, item: EvalInput, future: RolloutFuture, entry: JournalEntry | None = None
    ) -> None:
        input_id = item.input_id
        try:
            result = await future
        except RolloutError as exc:
            cancelled = exc.envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED
            if entry is None or not cancelled:
                self._finish(input_id, "failed", future, entry, error=exc)
                return
            # The previous run stopped it on its way out.
            self.journal.record_abandoned(input_id)
            await self._run_one(item)
        except RolloutTimeoutError as exc:
            if entry is not None:
                exc = RolloutTimeoutError(
                    f"{exc} (re-attached after a restart)",
                    session_id=future.session_id,
                    timeout=self.options.timeout,
                )
            self._finish(input_id, "timeout", future, entry, error=exc)
        except Exception as exc:
            self._finish(input_id, "failed", future, entry, error=exc)
        else:
            problem = protocol.reward_problem(result, required=True)  # a score needs one
            error = None if problem is None else RewardError(problem)
            outcome = "done" if error is None else "failed"
            self._finish(input_id, outcome, future, entry, result=result, error=error)

    async def _resume_one(self, entry: JournalEntry, item: EvalInput) -> None:
        """Finish a rollout an earlier run journaled: within its deadline re-sent as a repeat
        under the same session; past it (or another key), its result key followed."""
        remaining = entry.started_at + self.options.timeout - time.time()
        config = protocol.RolloutConfig(
            exp_id=self.options.exp_id, input_id=entry.input_id, s3_bucket=self.options.s3_bucket
        )
        same_key = config.key_for(entry.session_id) == entry.result_key
        try:
            if remaining > 0 and same_key and entry.s3_bucket == self.options.s3_bucket:
                future = await self.client.invoke(
                    item.payload,
                    input_id=item.input_id,
                    session_id=entry.session_id,
                    timeout=self.options.timeout,
                    resume=True,
                    started_at=entry.started_at,
                    on_session=partial(self._journaled, item),
                )
            else:
                future = await self.client.attach(
                    session_id=entry.session_id,
                    result_key=entry.result_key,
                    input_id=entry.input_id,
                    s3_bucket=entry.s3_bucket,
                    timeout=self.options.timeout,
                    started_at=entry.started_at,
                )
        except Exception as exc:  # a journal line the client refuses, or closing
            self._finish(entry.input_id, "failed", None, entry, error=exc)
            return
        await self._await(item, future, entry)

    def _finish(
        self,
        input_id: str,
        outcome: str,
        future: RolloutFuture | None = None,
        entry: JournalEntry | None = None,
        *,
        result: dict[str, Any] | None = None,
        error: BaseException | None = None,
        elapsed: float | None = None,
    ) -> None:
        if entry is not None:
            elapsed = time.time() - entry.started_at
        elif future is not None:
            elapsed = future.elapsed  # retries included
        if isinstance(error, RolloutError | TraceLostError) and error.envelope is not None:
            result = error.envelope
        where: JournalEntry | RolloutFuture | None = entry if future is None else future
        trace = None if future is None else future.trace
        record: dict[str, Any] = {
            "input_id": input_id,
            "outcome": outcome,
            "reward": reward_of(result) if outcome == "done" else None,
            "elapsed": None if elapsed is None else round(elapsed, 4),
            "session_id": getattr(where or error, "session_id", None),
            "result_key": getattr(where, "result_key", None),
            "reattached": entry is not None,
            "error": None if error is None else str(error),
            "error_type": None if error is None else type(error).__name__,
            "failure_kind": getattr(failure_kind(error), "value", None),
            "retryable": error is not None and is_retryable(error),
            "agent_lost": error is not None and is_agent_loss(error),
            "attempts": getattr(error, "attempts", 1) if future is None else future.attempts,
            "losses": 0 if future is None else future.losses,
            "result": result,
            "ended_at": round(time.time(), 3),
            "cost": price(usage_of({"result": result}, trace_tokens(trace)), self.options.prices),
        }
        self.journal.record_outcome(record)
        # After the results line: a run killed in between has --resume read it from S3.
        if trace is not None and outcome == "done":
            self._write_trajectory(trace, result)
        self.bar.update(record)

    def _write_trajectory(self, trace: SessionTrace, result: Any) -> None:
        if self.journal.trajectories is None:
            return
        metrics = result.get("metrics") if isinstance(result, dict) else None
        trajectory = build_trajectory(
            trace, reward=reward_of(result), metrics=metrics if isinstance(metrics, dict) else None
        )
        has_messages = isinstance(result, dict) and "messages" in result
        transcript = None if has_messages else trace_messages(trace)
        self.journal.record_trajectory(
            trajectory,
            tokens_captured=trace.tokens_captured,
            **trace_tokens(trace),
            **({} if transcript is None else {"messages": transcript}),
        )


async def run_eval(
    options: EvalOptions, inputs: Sequence[EvalInput], run: EvalRun, *, progress: bool
) -> None:
    """Run (or resume) an evaluation, filling in ``run`` as it goes; every input ends in
    exactly one results line."""
    by_id = {item.input_id: item for item in inputs}
    run.out = options.out
    started = time.monotonic()
    client = make_client(options)  # its refusals come before any file is touched
    await client.check_services()
    if options.base_url is None and options.gateway_url is None:
        logger.warning(
            "no --base-url or --gateway-url: the agents get no _rollout.base_url, and an "
            "OpenAI client in them falls back to its own default (the public OpenAI API)"
        )
    # A group's trajectories go into its rows file instead.
    traced = options.gateway_url is not None and options.group_size is None
    journal = EvalJournal.open(options.out, resume=options.resume, trajectories=traced)
    engine: EvalEngine | None = None
    try:
        run.trajectories = journal.trajectories
        run.resumed = sum(1 for i in by_id if i in journal.finished)
        in_flight = [e for i, e in journal.in_flight.items() if i in by_id]
        fresh = [
            item
            for item in inputs
            if item.input_id not in journal.finished and item.input_id not in journal.in_flight
        ]
        unit = "rollout" if options.group_size is None else "group"  # a bar step is an input
        bar = Progress(len(inputs), run.resumed, progress, unit=unit)
        engine = EvalEngine(options, client, journal, bar)
        async with client:
            for session_id in journal.unstopped:  # left running by the previous run
                client.stop_session(session_id)
            try:
                await engine.run(fresh, in_flight, by_id)
            finally:
                run.s3_requests = client.stats.s3_total
                run.trajectories_missing = engine.trajectories_missing
    finally:
        journal.record_unstopped(client.unstopped_sessions)
        if engine is not None:
            engine.bar.close()
            run.ran = engine.bar.rollouts
        journal.close()
        run.wall_seconds = time.monotonic() - started
