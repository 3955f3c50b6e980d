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
from collections.abc import AsyncIterator, Mapping, Sequence
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
from agentcore_rl.client.invocation import as_repeat
from agentcore_rl.client.outcomes import is_agent_loss, is_retryable
from agentcore_rl.client.traces import trace_key_of
from agentcore_rl.errors import (
    AgentLostError,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
    TraceLostError,
)
from agentcore_rl.ratelimit import Priority
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
) -> dict[str, Any]:
    """One results-file line. ``where`` is the started rollout (``None`` when the agent
    never accepted it); the reward is read from a successful result only. ``retryable``
    marks a failure worth running again (:func:`~agentcore_rl.client.outcomes.is_retryable`;
    ``--resume`` does), ``agent_lost`` one whose agent process went away under it (on the
    client's ``retry_lost`` budget), ``attempts`` the sessions this run tried and
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
        "losses": 0,
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
        before the call). Within its deadline it is invoked again with the same session id
        and result key, which an agent still running it does not start twice (see
        docs/cli.md); otherwise the client follows its result key (``attach``) until the
        deadline, and stops the session if it passes.
        """
        remaining = entry.started_at + self.options.timeout - time.time()
        # Read first, without a slot: a successor's agent_lost envelope (or a shutdown's
        # cancelled one) means run it again now; waiting for a slot to read it would add
        # a whole rollout's wait to its detection.
        rerun = await self._rerun_cause(entry)
        if rerun is not None:
            self.journal.record_abandoned(entry.input_id)
            await self._run_one(item, losses=int(is_agent_loss(rerun)))
            return
        try:
            future = await self._reinvoke(entry, item, remaining) if remaining > 0 else None
            if future is None:
                future = await self.client.attach(
                    session_id=entry.session_id,
                    result_key=entry.result_key,
                    input_id=entry.input_id,
                    s3_bucket=entry.s3_bucket,
                    timeout=self.options.timeout,
                    started_at=entry.started_at,
                )
        except Exception as exc:  # a journal line the client refuses, or closing
            self._record_resumed(entry, "failed", error=exc)
            return
        try:
            result = await future
        except asyncio.CancelledError:
            self.journal.record_abandoned(entry.input_id)  # the client stops the session
            raise
        except RolloutError as exc:
            if exc.envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED or (
                is_retryable(exc)
            ):
                rerun = exc  # the previous run stopped it on its way out, or a shutdown did
            else:
                self._record_resumed(entry, "failed", error=exc)
        except InvocationError as exc:  # AgentLostError: its agent crashed meanwhile
            if is_retryable(exc):
                rerun = exc
            else:
                self._record_resumed(entry, "failed", error=exc)
        except RolloutTimeoutError as exc:
            error = RolloutTimeoutError(
                f"{exc} (re-attached after a restart)",
                session_id=entry.session_id,
                timeout=self.options.timeout,
            )
            self._record_resumed(entry, "timeout", error=error)
        except Exception as exc:  # StorageError or a surprise
            self._record_resumed(entry, "failed", error=exc)
        else:
            self._record_resumed(entry, "done", result=result, future=future)
        if rerun is not None:
            self.journal.record_abandoned(entry.input_id)
            # Now, as a worker retries: behind every input still queued, a lost rollout
            # would wait for the whole queue.
            await self._run_one(item, losses=int(is_agent_loss(rerun)))

    async def _rerun_cause(self, entry: JournalEntry) -> BaseException | None:
        """The retryable outcome already at a journaled rollout's key (an ``agent_lost``
        envelope, or a ``cancelled`` one), else ``None``."""
        try:
            found = await self.client.store.get_json(entry.s3_bucket, entry.result_key)
        except StorageError:
            return None
        if found is None or not protocol.is_error_envelope(found):
            return None
        if found.get(protocol.ERROR_TYPE) == protocol.ERROR_AGENT_LOST:
            return AgentLostError(
                f"the agent process running session {entry.session_id} died",
                session_id=entry.session_id,
                envelope=found,
            )
        error = RolloutError(found, session_id=entry.session_id)
        if found.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED or is_retryable(error):
            return error
        return None

    async def _reinvoke(
        self, entry: JournalEntry, item: EvalInput, remaining: float
    ) -> RolloutFuture | None:
        """Invoke a journaled rollout again with its session id; ``None`` when it must
        not be (its result is there, or the key would differ) or the call failed."""
        try:
            body, config = self.client._prepare(item.payload, input_id=item.input_id, overrides={})
        except Exception:
            return None
        if (config.s3_bucket, config.key_for(entry.session_id)) != (
            entry.s3_bucket,
            entry.result_key,
        ):
            # Another --exp-id or bucket than the first run: same session, other key, and
            # the agent would run it again. Only follow the journaled key.
            return None
        async with self.client._slot() as slot:
            # Checked with the slot held, right before sending: a rollout that finished
            # while we waited is read (by attach), not run again.
            try:
                found = await self.client.store.get_json(entry.s3_bucket, entry.result_key)
            except StorageError:
                return None
            if found is not None:
                return None
            try:
                # The earlier run may have reached the agent: a repeat is checked, not rerun.
                return await self.client._launch(
                    slot, as_repeat(body), config, timeout=remaining, session_id=entry.session_id
                )
            except asyncio.CancelledError:
                self.journal.record_abandoned(entry.input_id)  # the client stops the session
                raise
            except Exception as exc:  # the agent may still run it: follow its key instead
                logger.warning("invoking %s again failed: %s", entry.input_id, exc)
                return None

    def _record_resumed(
        self,
        entry: JournalEntry,
        outcome: str,
        *,
        result: dict[str, Any] | None = None,
        error: BaseException | None = None,
        future: RolloutFuture | None = None,
    ) -> None:
        elapsed = time.time() - entry.started_at
        self.summary.reattached += 1
        self._record(
            outcome_record(
                entry.input_id,
                outcome,
                entry,
                elapsed,
                result=result,
                error=error,
                reattached=True,
            ),
            future,
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

    async def _run_one(self, item: EvalInput, *, losses: int = 0) -> None:
        """Run one input; a retryable failure runs again under a new journaled session:
        an agent loss (a crash, a restart, a server shutdown) up to the client's
        ``retry_lost`` times, any other (an unreachable or failing agent) up to its
        ``retry_rollouts`` times. Only the last attempt's outcome is recorded. ``losses``:
        sessions of this input already lost (a resumed run's)."""
        others = 0
        t0 = time.monotonic()  # the input's whole time, retries included
        while True:
            attempted = await self._attempt(item, retry=losses + others > 0)
            if attempted is None:
                return
            record, future = attempted
            record["attempts"] = 1 + losses + others
            record["losses"] = losses
            if record["agent_lost"] and losses < self.client.retries.lost:
                losses += 1
            elif (
                record["retryable"]
                and not record["agent_lost"]
                and others < self.client.retries.rollouts
            ):
                others += 1
            else:
                record["elapsed"] = round(time.monotonic() - t0, 4)
                self._record(record, future)
                return
            logger.warning(
                "input %s failed retryably (%s); running it again in a new session",
                item.input_id,
                record["error_type"],
            )
            self.summary.retried += 1

    async def _attempt(
        self, item: EvalInput, *, retry: bool = False
    ) -> tuple[dict[str, Any], RolloutFuture | None] | None:
        """One session for ``item``: its outcome record and future (the future is ``None``
        when nothing started; the whole is ``None`` when cancelled). A ``retry`` takes
        its token ahead of first invocations (``Priority.RETRY``)."""
        t0 = time.monotonic()
        try:
            body, config = self.client._prepare(item.payload, input_id=item.input_id, overrides={})
        except Exception as exc:  # a bad payload: nothing starts
            elapsed = time.monotonic() - t0
            return outcome_record(item.input_id, "failed", None, elapsed, error=exc), None
        # Journaled before the call: whatever happens next, a resumed run knows the session
        # and result key, and never starts a second rollout for this input.
        session_id = protocol.new_session_id()
        entry = JournalEntry(
            item.input_id, session_id, config.s3_bucket, config.key_for(session_id), time.time()
        )
        self.journal.record_started(entry)
        priority = Priority.RETRY if retry else Priority.INVOKE
        try:
            async with self.client._slot(priority=priority) as slot:
                future = await self.client._launch(slot, body, config, session_id=session_id)
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)  # the client stops the session
            raise
        except Exception as exc:  # one input failing must not end the run
            # The invocation itself failed (after the client's retries): nothing started.
            elapsed = time.monotonic() - t0
            return outcome_record(item.input_id, "failed", None, elapsed, error=exc), None
        if (future.s3_bucket, future.result_key) != (entry.s3_bucket, entry.result_key):
            # The agent chose another place for the result: journal where it really goes.
            entry = JournalEntry(
                item.input_id, session_id, future.s3_bucket, future.result_key, entry.started_at
            )
            self.journal.record_started(entry)
        try:
            result = await future
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)
            raise
        except RolloutTimeoutError as exc:
            record = outcome_record(item.input_id, "timeout", entry, future.elapsed, error=exc)
        except Exception as exc:  # RolloutError, StorageError or a surprise
            record = outcome_record(item.input_id, "failed", entry, future.elapsed, error=exc)
        else:
            record = outcome_record(item.input_id, "done", entry, future.elapsed, result=result)
        return record, future
