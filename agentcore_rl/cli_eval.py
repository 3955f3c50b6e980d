"""The engine of ``agentcore-rl eval`` (and of ``demo``): run a JSONL file of inputs through
:class:`~agentcore_rl.client.AsyncRolloutClient`, record every outcome exactly once, and
resume an interrupted run.

Each input line is a JSON object, sent as the payload. Its ``input_id`` (or ``id``) field
names it (the line number otherwise); ids must be unique and usable in an S3 key.

Example::

    options = EvalOptions(data=Path("problems.jsonl"), out=Path("results.jsonl"),
                          s3_bucket="rollouts", exp_id="eval-1",
                          agent_urls=("http://127.0.0.1:8080",))
    summary = await run_eval(options)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from agentcore_rl import protocol
from agentcore_rl.cli_reattach import await_existing_results
from agentcore_rl.cli_summary import RunSummary, reward_of
from agentcore_rl.client import AsyncRolloutClient
from agentcore_rl.errors import (
    ConfigurationError,
    InvalidRolloutConfig,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
)
from agentcore_rl.eval_journal import EvalJournal, JournalEntry
from agentcore_rl.s3 import ResultStore, S3RetryPolicy

__all__ = ["EvalInput", "EvalOptions", "EvalRun", "load_inputs", "run_eval"]

logger = logging.getLogger(__name__)

#: A quick retry policy for the preflight check and re-attaching: fail fast when S3 is
#: unreachable instead of backing off for tens of seconds.
_QUICK_S3_RETRY: Final = S3RetryPolicy(attempts=2, initial=0.2, maximum=1.0, jitter=0.1)
_UNLIMITED_TPS: Final = 1e6
# A prefix no result key can have (key parts start with a letter or digit): listing it is
# a cheap way to prove the bucket exists and is readable.
_PREFLIGHT_PREFIX: Final = ".agentcore-rl-preflight/"


@dataclass(frozen=True)
class EvalInput:
    """One input: its id and the payload sent to the agent.

    Example::

        EvalInput("q-1", {"prompt": "2+2?", "answer": "4"})
    """

    input_id: str
    payload: dict[str, Any]


def load_inputs(path: Path, *, limit: int | None = None) -> list[EvalInput]:
    """Read and check a JSONL file of inputs; raise ConfigurationError naming the line.

    Example::

        inputs = load_inputs(Path("examples/math_agent/data/problems.jsonl"), limit=10)
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(f"data file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read data file {path}: {exc}") from None
    inputs: list[EvalInput] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(inputs) >= limit:
            break
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ConfigurationError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise ConfigurationError(
                f"{path}:{number}: each line must be a JSON object, got {type(record).__name__}"
            )
        raw_id = record.get("input_id", record.get("id", f"line-{number}"))
        try:
            input_id = protocol.validate_key_part("input id", str(raw_id))
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(f"{path}:{number}: {exc}") from None
        if input_id in seen:
            raise ConfigurationError(
                f"{path}:{number}: input id {input_id!r} repeats line {seen[input_id]}; "
                "ids must be unique (they name the results)"
            )
        seen[input_id] = number
        inputs.append(EvalInput(input_id, record))
    if not inputs:
        raise ConfigurationError(f"data file {path} has no inputs")
    return inputs


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """Everything one eval run needs (the CLI's arguments, checked).

    Exactly one of ``agent_runtime_arn`` and ``agent_urls`` is given. ``s3_endpoint_url``
    and ``runtime_endpoint_url`` default to botocore's own resolution (``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``).

    Example::

        EvalOptions(data=Path("in.jsonl"), out=Path("out.jsonl"), s3_bucket="rollouts",
                    exp_id="e1", agent_runtime_arn=arn)
    """

    data: Path
    out: Path
    s3_bucket: str
    exp_id: str
    agent_runtime_arn: str | None = None
    agent_urls: Sequence[str] = ()
    concurrency: int = 32
    tps: float | None = 25.0
    timeout: float = 900.0
    base_url: str | None = None
    model_id: str | None = None
    resume: bool = False
    limit: int | None = None
    s3_endpoint_url: str | None = None
    runtime_endpoint_url: str | None = None
    rollout_extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.agent_runtime_arn is None) == (not self.agent_urls):
            raise ConfigurationError("give either an agent runtime ARN or agent URL(s)")
        protocol.validate_bucket(self.s3_bucket, name="--s3-bucket")
        try:
            protocol.validate_key_part("--exp-id", self.exp_id)
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(str(exc)) from None
        if self.concurrency < 1:
            raise ConfigurationError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.tps is not None and self.tps <= 0:
            raise ConfigurationError(f"--tps must be > 0, got {self.tps}")
        if self.timeout <= 0:
            raise ConfigurationError(f"--timeout must be > 0 seconds, got {self.timeout}")


@dataclass
class EvalRun:
    """What a finished (or interrupted) run reports: the summary, S3 request count and
    where the results file is.

    Example::

        run = await run_eval(options)
        print(run.summary.render(wall_seconds=run.wall_seconds, s3_requests=run.s3_requests))
    """

    summary: RunSummary
    wall_seconds: float = 0.0
    s3_requests: int = 0
    interrupted: bool = False
    out: Path | None = None


def _outcome_record(
    input_id: str,
    outcome: str,
    where: JournalEntry | None,
    elapsed: float | None,
    *,
    result: dict[str, Any] | None = None,
    error: BaseException | None = None,
    reattached: bool = False,
) -> dict[str, Any]:
    """One results-file line. ``where`` is the started rollout (None if never accepted)."""
    if isinstance(error, RolloutError):
        result = error.envelope
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
        "result": result,
    }


def _make_client(options: EvalOptions) -> AsyncRolloutClient:
    kwargs: dict[str, Any] = dict(options.rollout_extra)
    if options.agent_runtime_arn is not None:
        kwargs["agent_runtime_arn"] = options.agent_runtime_arn
        if options.runtime_endpoint_url is not None:
            kwargs["endpoint_url"] = options.runtime_endpoint_url
    else:
        kwargs["agent_url"] = list(options.agent_urls)
    return AsyncRolloutClient(
        s3_bucket=options.s3_bucket,
        exp_id=options.exp_id,
        max_concurrent_sessions=options.concurrency,
        # The client's bucket needs a finite rate; "no limit" becomes one nobody reaches.
        tps_limit=options.tps if options.tps is not None else _UNLIMITED_TPS,
        timeout=options.timeout,
        base_url=options.base_url,
        model_id=options.model_id,
        s3_endpoint_url=options.s3_endpoint_url,
        **kwargs,
    )


def _bar_shape() -> dict[str, int]:
    """tqdm's own size detection, unless the terminal reports a zero size (a pty nobody
    sized, as under ``script`` or some CI runners): then tqdm would draw nothing."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if size.columns > 0 and size.lines > 0 else {"ncols": 100, "nrows": 24}


class _Progress:
    """A tqdm bar (when stderr is a terminal) that also feeds the summary."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="rollout",
            disable=not enabled,
            **_bar_shape(),
        )

    def update(self, summary: RunSummary) -> None:
        self.bar.update(1)
        mean = summary.mean_reward
        self.bar.set_postfix(
            failed=summary.counts["failed"] + summary.counts["timeout"],
            reward="-" if mean is None else f"{mean:.2f}",
            refresh=False,
        )

    def close(self) -> None:
        self.bar.close()


async def preflight_s3(store: ResultStore, bucket: str, endpoint_url: str | None = None) -> None:
    """Prove the bucket is reachable and readable before starting anything.

    Raises :class:`~agentcore_rl.errors.StorageError` naming the bucket and endpoint.

    Example::

        await preflight_s3(store, "rollouts")
    """
    try:
        await store.list_keys(bucket, _PREFLIGHT_PREFIX)
    except StorageError as exc:
        where = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS S3"
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise StorageError(
            f"cannot use S3 bucket {bucket!r} at {where}: {exc.code}: {cause}",
            operation=exc.operation,
            bucket=bucket,
            code=exc.code,
        ) from exc


async def run_eval(
    options: EvalOptions,
    *,
    progress: bool = True,
    inputs: Sequence[EvalInput] | None = None,
    run: EvalRun | None = None,
) -> EvalRun:
    """Run (or resume) an evaluation; every input ends in exactly one results line.

    Cancelling it (Ctrl-C) stops the rollouts in flight and journals them as abandoned, so
    that ``--resume`` runs them again; a run that dies without cleanup leaves them in the
    journal as started, and ``--resume`` re-attaches to them.

    Example::

        run = await run_eval(options)
        run.summary.counts["done"]

    ``inputs`` (from :func:`load_inputs`) saves reading ``options.data`` again. ``run``,
    when given, is filled in as the run goes, so a caller still has the partial figures
    after a cancellation.
    """
    if inputs is None:
        inputs = load_inputs(options.data, limit=options.limit)
    by_id = {item.input_id: item for item in inputs}
    if run is None:
        run = EvalRun(RunSummary())
    summary = run.summary
    run.out = options.out
    started = time.monotonic()
    side_store = ResultStore(
        endpoint_url=options.s3_endpoint_url, retry=_QUICK_S3_RETRY, connect_timeout=5.0
    )
    async with side_store:
        # Before the results file is touched: a run that cannot start leaves nothing behind.
        await preflight_s3(side_store, options.s3_bucket, options.s3_endpoint_url)
        journal = EvalJournal.open(options.out, resume=options.resume)
        bar: _Progress | None = None
        try:
            summary.resumed = sum(1 for i in by_id if i in journal.finished)
            in_flight = [e for i, e in journal.in_flight.items() if i in by_id]
            fresh = [
                item
                for item in inputs
                if item.input_id not in journal.finished and item.input_id not in journal.in_flight
            ]
            bar = _Progress(len(inputs), summary.resumed, progress)
            client = _make_client(options)
            async with client:
                engine = _Engine(options, client, journal, summary, bar, side_store)
                try:
                    await engine.run(fresh, in_flight, by_id)
                except asyncio.CancelledError:
                    run.interrupted = True
                    raise
                finally:
                    run.s3_requests = side_store.total_requests + client.stats.s3_total
        finally:
            if bar is not None:
                bar.close()
            journal.close()
            run.wall_seconds = time.monotonic() - started
    return run


class _Engine:
    """The worker pool: ``concurrency`` workers take inputs from a queue; a re-attach task
    collects results of rollouts an earlier run left in flight (and queues the ones that
    must run again)."""

    def __init__(
        self,
        options: EvalOptions,
        client: AsyncRolloutClient,
        journal: EvalJournal,
        summary: RunSummary,
        bar: _Progress,
        store: ResultStore,
    ) -> None:
        self.options = options
        self.client = client
        self.journal = journal
        self.summary = summary
        self.bar = bar
        self.store = store
        self.queue: asyncio.Queue[EvalInput | None] = asyncio.Queue()

    def _record(self, record: dict[str, Any]) -> None:
        self.journal.record_outcome(record)
        self.summary.add(record["outcome"], elapsed=record["elapsed"], reward=record["reward"])
        self.bar.update(self.summary)

    async def run(
        self,
        fresh: Sequence[EvalInput],
        in_flight: Sequence[JournalEntry],
        by_id: dict[str, EvalInput],
    ) -> None:
        for item in fresh:
            self.queue.put_nowait(item)
        workers = [
            asyncio.create_task(self._worker(), name=f"eval worker {n}")
            for n in range(self.options.concurrency)
        ]
        tasks = set(workers)
        try:
            if in_flight:
                await self._reattach(in_flight, by_id)
            for _ in workers:
                self.queue.put_nowait(None)
            await asyncio.gather(*workers)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _reattach(self, entries: Sequence[JournalEntry], by_id: dict[str, EvalInput]) -> None:
        loop = asyncio.get_running_loop()
        wall_now, loop_now = time.time(), loop.time()
        deadlines = {
            e.input_id: loop_now + (e.started_at + self.options.timeout - wall_now) for e in entries
        }
        async for entry, envelope in await_existing_results(self.store, entries, deadlines):
            elapsed = time.time() - entry.started_at
            if (
                envelope is not None
                and envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED
            ):
                # The previous run stopped it on its way out: run it again.
                self.queue.put_nowait(by_id[entry.input_id])
                continue
            if envelope is None:
                error: BaseException = RolloutTimeoutError(
                    f"no result for session {entry.session_id} within {self.options.timeout} s "
                    "(re-attached after a restart)",
                    session_id=entry.session_id,
                    timeout=self.options.timeout,
                )
                record = _outcome_record(
                    entry.input_id, "timeout", entry, elapsed, error=error, reattached=True
                )
                await self._stop_orphan(entry.session_id)
            elif protocol.is_error_envelope(envelope):
                error = RolloutError(envelope, session_id=entry.session_id)
                record = _outcome_record(
                    entry.input_id, "failed", entry, elapsed, error=error, reattached=True
                )
            else:
                record = _outcome_record(
                    entry.input_id, "done", entry, elapsed, result=envelope, reattached=True
                )
            self.summary.reattached += 1
            self._record(record)

    async def _stop_orphan(self, session_id: str) -> None:
        """Stop a timed-out session an earlier run started, as the client stops its own.

        The client's stop queue only knows sessions it invoked, so this goes through its
        transport directly; a failure is logged, not fatal (the outcome is already known).
        """
        try:
            await self.client.transport.stop(session_id)
        except Exception as exc:  # the outcome stands; the session may linger
            logger.warning("could not stop timed-out session %s: %s", session_id, exc)

    async def _worker(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            await self._run_one(item)

    async def _run_one(self, item: EvalInput) -> None:
        t0 = time.monotonic()
        try:
            future = await self.client.invoke(item.payload, input_id=item.input_id)
        except Exception as exc:  # one input failing must not end the run
            # The invocation itself failed (after the client's retries): nothing started.
            elapsed = time.monotonic() - t0
            self._record(_outcome_record(item.input_id, "failed", None, elapsed, error=exc))
            return
        entry = JournalEntry(
            item.input_id, future.session_id, future.s3_bucket, future.result_key, time.time()
        )
        self.journal.record_started(entry)
        try:
            result = await future
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)
            raise
        except RolloutTimeoutError as exc:
            record = _outcome_record(item.input_id, "timeout", entry, future.elapsed, error=exc)
        except Exception as exc:  # RolloutError, StorageError or a surprise
            record = _outcome_record(item.input_id, "failed", entry, future.elapsed, error=exc)
        else:
            record = _outcome_record(item.input_id, "done", entry, future.elapsed, result=result)
        self._record(record)


def iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a results file (for scripts and tests).

    Example::

        done = sum(r["outcome"] == "done" for r in iter_lines(Path("results.jsonl")))
    """
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    yield record
