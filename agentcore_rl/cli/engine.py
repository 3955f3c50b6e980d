"""The worker pool behind ``agentcore-rl eval``: journal, invoke, await, record.

``concurrency`` workers take inputs from a queue, journal each rollout's session id and
result key, invoke it through the client with that session id, await its outcome and
write exactly one results line for it. Rollouts an earlier run left in flight come
first in the queue and are resumed by session id and result key (see docs/cli.md).

Example::

    engine = EvalEngine(options, client, journal, summary, Progress(10, 0, True))
    await engine.run(fresh_inputs, in_flight_entries, inputs_by_id)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from agentcore_rl import protocol
from agentcore_rl.cli.cost import price, trace_messages, trace_tokens, usage_of
from agentcore_rl.cli.eval_config import EvalInput, EvalOptions
from agentcore_rl.cli.journal import EvalJournal, JournalEntry
from agentcore_rl.cli.summary import RunSummary, failure_of, reward_of
from agentcore_rl.cli.trajectories import TrajectoryFile
from agentcore_rl.client import AsyncRolloutClient, RolloutFuture
from agentcore_rl.client.outcomes import is_agent_loss, is_retryable
from agentcore_rl.client.traces import trace_key_of
from agentcore_rl.errors import RolloutError, RolloutTimeoutError, StorageError, TraceLostError
from agentcore_rl.trajectory import build_trajectory

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["EvalEngine", "Progress", "outcome_record"]

logger = logging.getLogger(__name__)


def outcome_record(
    input_id: str,
    outcome: str,
    where: JournalEntry | None,
    elapsed: float | None,
    *,
    result: dict[str, Any] | None = None,
    error: BaseException | None = None,
    reattached: bool = False,
    attempts: int = 1,
    losses: int = 0,
) -> dict[str, Any]:
    """One results-file line. ``where`` is the started rollout (``None`` when the agent
    never accepted it); the reward is read from a successful result only. ``retryable``
    marks a failure worth running again (:func:`~agentcore_rl.client.outcomes.is_retryable`;
    ``--resume`` does), ``agent_lost`` one whose agent process went away under it (on the
    client's ``Retries.lost`` budget), ``attempts`` the sessions this run tried and
    ``losses`` how many of them were lost with their agent.
    """
    if isinstance(error, RolloutError | TraceLostError) and error.envelope is not None:
        result = error.envelope  # what the agent wrote (for a lost trace: its result)
    return {
        "input_id": input_id,
        "outcome": outcome,
        "reward": reward_of(result) if outcome == "done" else None,
        "elapsed": None if elapsed is None else round(elapsed, 4),
        "session_id": where.session_id if where else getattr(error, "session_id", None),
        "result_key": where.result_key if where else None,
        "reattached": reattached,
        "error": None if error is None else str(error),
        "error_type": None if error is None else type(error).__name__,
        "retryable": error is not None and is_retryable(error),
        "agent_lost": error is not None and is_agent_loss(error),
        "attempts": attempts,
        "losses": losses,
        "result": result,
    }


@contextlib.asynccontextmanager
async def _task_group() -> AsyncIterator[TaskGroup]:
    """An anyio task group that raises a lone failure as itself, as ``asyncio.gather`` did,
    not wrapped in an ExceptionGroup: the CLI maps exception types to exit codes."""
    try:
        async with anyio.create_task_group() as tasks:
            yield tasks
    except Exception as exc:
        inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
        if len(inner) == 1 and isinstance(inner[0], Exception):
            raise inner[0] from exc
        raise


def _bar_shape() -> dict[str, int]:
    """tqdm's own size detection, unless the terminal reports a zero size (a pty nobody
    sized, as under ``script`` or some CI runners): then tqdm would draw nothing."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if size.columns > 0 and size.lines > 0 else {"ncols": 100, "nrows": 24}


class Progress:
    """The progress bar on stderr (tqdm), showing failures and the mean reward so far."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        # lazy: tqdm is the cli extra; a library user of the engine may not have it
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="rollout",
            disable=not enabled,
            **_bar_shape(),
        )

    def update(self, summary: RunSummary) -> None:
        """Count one more outcome; refresh the failure count and mean reward."""
        self.bar.update(1)
        mean = summary.mean_reward
        self.bar.set_postfix(
            failed=summary.counts["failed"] + summary.counts["timeout"],
            reward="-" if mean is None else f"{mean:.2f}",
            refresh=False,
        )

    def close(self) -> None:
        """Finish the bar. Idempotent."""
        self.bar.close()


class EvalEngine:
    """The worker pool: ``concurrency`` workers take work from a queue: first the rollouts
    an earlier run left in flight (their results collected; the ones that were stopped or
    lost run again at once), then the inputs. Every outcome goes to the journal, the
    summary and the progress bar.
    """

    def __init__(
        self,
        options: EvalOptions,
        client: AsyncRolloutClient,
        journal: EvalJournal,
        summary: RunSummary,
        bar: Progress,
        trajectories: TrajectoryFile | None = None,
    ) -> None:
        self.options = options
        self.trajectories = trajectories  # with a gateway: one line per done rollout
        self.client = client
        self.journal = journal
        self.summary = summary
        self.bar = bar
        # Work for the workers: rollouts an earlier run left in flight (first), inputs,
        # and one None per worker to end it.
        self.queue: asyncio.Queue[tuple[JournalEntry, EvalInput] | EvalInput | None] = (
            asyncio.Queue()
        )

    def _record(self, record: dict[str, Any], future: RolloutFuture | None = None) -> None:
        trace = None if future is None else future.trace
        record["ended_at"] = round(time.time(), 3)
        record["cost"] = price(usage_of(record, trace_tokens(trace)), self.options.prices)
        self.journal.record_outcome(record)
        error_type, error = failure_of(record)
        self.summary.add(
            record["outcome"],
            elapsed=record["elapsed"],
            reward=record["reward"],
            error_type=error_type,
            error=error,
            cost=record["cost"],
        )
        # After the results line: a run killed in between has --resume read it from S3.
        if future is not None and future.trace is not None and record["outcome"] == "done":
            self._write_trajectory(future.trace, record["result"])
        self.bar.update(self.summary)

    def _write_trajectory(self, trace: SessionTrace, result: Any) -> None:
        if self.trajectories is None:
            return
        metrics = result.get("metrics") if isinstance(result, dict) else None
        trajectory = build_trajectory(
            trace,
            reward=reward_of(result),
            metrics=metrics if isinstance(metrics, dict) else None,
        )
        has_messages = isinstance(result, dict) and "messages" in result
        transcript = None if has_messages else trace_messages(trace)
        if self.trajectories.write(
            trajectory,
            tokens_captured=trace.tokens_captured,
            **trace_tokens(trace),
            **({} if transcript is None else {"messages": transcript}),
        ):
            self.summary.add_trajectory(trajectory, trace.tokens_captured)

    async def collect_trajectories(self, finished: Mapping[str, dict[str, Any]]) -> None:
        """Write the trajectories of done rollouts an earlier run recorded but never wrote
        (it died in between), from their traces in S3.
        """
        if self.trajectories is None:
            return
        for record in list(finished.values()):
            sid, key = record.get("session_id"), record.get("result_key")
            if record.get("outcome") != "done" or not isinstance(sid, str):
                continue
            if self.trajectories.has(sid) or not isinstance(key, str):
                continue
            try:
                trace = await self.client.store.get_trace(self.options.s3_bucket, trace_key_of(key))
            except StorageError as exc:
                logger.warning("reading the trace of %s failed: %s", record["input_id"], exc)
                trace = None
            if trace is None:
                self.summary.trajectories_missing += 1
                continue
            self._write_trajectory(trace, record.get("result"))

    async def run(
        self,
        fresh: Sequence[EvalInput],
        in_flight: Sequence[JournalEntry],
        by_id: dict[str, EvalInput],
    ) -> None:
        """Run ``fresh`` inputs and re-attach ``in_flight`` ones until each has an outcome."""
        # The earlier run's rollouts first: queued behind the fresh inputs, one found lost
        # would wait for every slot those take (the chaos run's detection tail).
        for entry in in_flight:
            self.queue.put_nowait((entry, by_id[entry.input_id]))
        for item in fresh:
            self.queue.put_nowait(item)
        for _ in range(self.options.concurrency):
            self.queue.put_nowait(None)
        async with _task_group() as workers:
            for n in range(self.options.concurrency):
                workers.start_soon(self._worker, name=f"eval worker {n}")

    async def _resume_one(self, entry: JournalEntry, item: EvalInput) -> None:
        """Finish a rollout an earlier run journaled as started but never saw end.

        Its invocation may or may not have reached the agent (the journal line is written
        before the call). Within its deadline it is resumed under the same session id
        (its result read, else the invocation sent again marked as a repeat, which an
        agent still running it does not start twice; see docs/cli.md), and a retryable
        outcome runs it again in a new session like any rollout; past its deadline, or
        journaled under another experiment's key, the client only follows its result key
        (``attach``) and stops the session if the deadline passed.
        """
        remaining = entry.started_at + self.options.timeout - time.time()
        same_key = (
            protocol.RolloutConfig(
                exp_id=self.options.exp_id,
                input_id=entry.input_id,
                s3_bucket=self.options.s3_bucket,
            ).key_for(entry.session_id)
            == entry.result_key
        )
        try:
            if remaining > 0 and same_key and entry.s3_bucket == self.options.s3_bucket:
                future = await self.client.invoke(
                    item.payload,
                    input_id=item.input_id,
                    session_id=entry.session_id,
                    timeout=self.options.timeout,
                    resume=True,
                    started_at=entry.started_at,
                    on_session=self._journaled(item),
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
        except asyncio.CancelledError:
            self.journal.record_abandoned(entry.input_id)  # the client stops the session
            raise
        except Exception as exc:  # a journal line the client refuses, or closing
            self._record_resumed(entry, "failed", error=exc)
            return
        try:
            result = await future
        except asyncio.CancelledError:
            self.journal.record_abandoned(entry.input_id)  # the client stops the session
            raise
        except RolloutError as exc:
            if exc.envelope.get(protocol.ERROR_TYPE) != protocol.ERROR_CANCELLED:
                self._record_resumed(entry, "failed", error=exc, future=future)
                return
            # The previous run stopped it on its way out: it never ran to its end.
            self.journal.record_abandoned(entry.input_id)
            await self._run_one(item)
        except RolloutTimeoutError as exc:
            error = RolloutTimeoutError(
                f"{exc} (re-attached after a restart)",
                session_id=future.session_id,
                timeout=self.options.timeout,
            )
            self._record_resumed(entry, "timeout", error=error, future=future)
        except Exception as exc:  # AgentLostError past its retries, StorageError...
            self._record_resumed(entry, "failed", error=exc, future=future)
        else:
            self._record_resumed(entry, "done", result=result, future=future)

    def _journaled(self, item: EvalInput) -> Callable[[RolloutFuture], None]:
        """The ``on_session`` hook of one input: journal each session before it is sent,
        so a resumed run finds it and never starts a second rollout for this input."""

        def journal(fut: RolloutFuture) -> None:
            entry = JournalEntry(
                item.input_id, fut.session_id, fut.s3_bucket, fut.result_key, fut.invoked_at
            )
            self.journal.record_started(entry)

        return journal

    def _record_resumed(
        self,
        entry: JournalEntry,
        outcome: str,
        *,
        result: dict[str, Any] | None = None,
        error: BaseException | None = None,
        future: RolloutFuture | None = None,
    ) -> None:
        self.summary.reattached += 1
        where = entry if future is None else self._where(entry.input_id, future)
        self._record(
            outcome_record(
                entry.input_id,
                outcome,
                where,
                time.time() - entry.started_at,
                result=result,
                error=error,
                reattached=True,
                attempts=1 if future is None else future.attempts,
                losses=0 if future is None else future.losses,
            ),
            future,
        )

    @staticmethod
    def _where(input_id: str, future: RolloutFuture) -> JournalEntry:
        return JournalEntry(
            input_id, future.session_id, future.s3_bucket, future.result_key, future.invoked_at
        )

    async def _worker(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if isinstance(item, tuple):
                await self._resume_one(*item)
            else:
                await self._run_one(item)

    async def _run_one(self, item: EvalInput) -> None:
        """Run one input to its one results line. The client runs a retryable failure
        again in a new session (an agent loss up to ``Retries.lost`` times, any other up
        to ``Retries.rollouts``), journaling each session first; the line counts them."""
        t0 = time.monotonic()
        try:
            future = await self.client.invoke(
                item.payload, input_id=item.input_id, on_session=self._journaled(item)
            )
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)  # the client stops the session
            raise
        except Exception as exc:  # refused, or never reached: nothing runs
            elapsed = time.monotonic() - t0
            self._record(outcome_record(item.input_id, "failed", None, elapsed, error=exc))
            return
        try:
            result = await future
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)
            raise
        except Exception as exc:  # RolloutError, RolloutTimeoutError, StorageError...
            outcome = "timeout" if isinstance(exc, RolloutTimeoutError) else "failed"
            record = self._future_record(item, outcome, future, error=exc)
        else:
            record = self._future_record(item, "done", future, result=result)
        self._record(record, future)

    def _future_record(
        self,
        item: EvalInput,
        outcome: str,
        future: RolloutFuture,
        *,
        result: dict[str, Any] | None = None,
        error: BaseException | None = None,
    ) -> dict[str, Any]:
        # The whole time of the input: its retries included.
        self.summary.retried += future.attempts - 1
        return outcome_record(
            item.input_id,
            outcome,
            self._where(item.input_id, future),
            future.elapsed,
            result=result,
            error=error,
            attempts=future.attempts,
            losses=future.losses,
        )
