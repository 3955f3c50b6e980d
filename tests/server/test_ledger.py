"""The run ledger: a restarted server reports the rollouts its dead predecessor left
running as ``agent_lost`` envelopes, and never over an envelope that exists."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.config import SpoolConfig
from agentcore_rl.server.ledger import RunLedger
from agentcore_rl.server.spool import s3_destination

from .helpers import (
    SESSION,
    HeldRollout,
    accept,
    read_envelope,
    rollout_app,
    served,
    settle,
    spool_record,
)

OTHER = "session-" + "b" * 40
SPOOLED = "session-" + "c" * 40
RUNNING = "session-" + "d" * 40


def key_of(session_id: str, input_id: str = "q-1") -> str:
    return f"exp/{input_id}/{session_id}.json"


def identity_of(app_name: str, store: ResultStore) -> tuple[str | None, ...]:
    destination = s3_destination(store)
    return (app_name, destination.endpoint_url, destination.region)


def dead_ledger(
    directory: Path,
    name: str,
    bucket: str,
    sessions: list[str],
    *,
    identity: tuple[str | None, ...],
) -> Path:
    """A ledger as a SIGKILLed process leaves it: every rollout begun, one ended, no lock."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    lines: list[list[Any]] = [["=", *identity]]
    lines += [["+", n, bucket, key_of(s), s, "exp", "q-1", 1.0] for n, s in enumerate(sessions)]
    lines.append(["+", 99, bucket, key_of("ended"), "ended", "exp", "q-1", 1.0])
    lines.append(["-", 99])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '["+", 7, "tor')
    return path


async def test_a_dead_processs_rollouts_get_lost_envelopes_and_existing_ones_win(
    store: ResultStore, bucket: str, tmp_path: Path
) -> None:
    math = identity_of("math", store)
    dead = dead_ledger(
        tmp_path, "ledger-4242-dead-1.jsonl", bucket, [SESSION, OTHER, SPOOLED], identity=math
    )
    # OTHER finished just before the crash: its envelope is in S3, SPOOLED's in the spool.
    await store.put_json(bucket, key_of(OTHER), {"status_code": 200, "rewards": [1.0]})
    spooled = {"status_code": 200, "rewards": [0.5]}
    record = spool_record(store, bucket, key_of(SPOOLED), json.dumps(spooled), owner="math")
    (tmp_path / "00000000000000000001-abcd.json").write_text(json.dumps(record))
    # A live process's ledger (its lock held) lists RUNNING: not reported.
    live = dead_ledger(tmp_path, "ledger-4343-live-1.jsonl", bucket, [RUNNING], identity=math)
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        app = AgentCoreRLApp(store=store, app_name="math", spool=SpoolConfig(directory=tmp_path))
        async with app:
            await asyncio.wait_for(app.lost_reported.wait(), 5)
            await asyncio.wait_for(app.spool.wait_drained(), 5)
            lost = await read_envelope(store, bucket, key_of(SESSION))
            assert lost[protocol.ERROR_TYPE] == protocol.ERROR_AGENT_LOST
            assert lost[protocol.STATUS_CODE] == 503
            assert "4242" in lost[protocol.STOP_REASON]
            assert lost[protocol.SESSION_ID] == SESSION
            assert lost[protocol.INPUT_ID] == "q-1"
            assert await read_envelope(store, bucket, key_of(OTHER)) == {
                "status_code": 200,
                "rewards": [1.0],
            }
            assert await read_envelope(store, bucket, key_of(SPOOLED)) == spooled
            assert not await store.head(bucket, key_of("ended"))
            assert not await store.head(bucket, key_of(RUNNING))
            assert not dead.exists()
            assert live.exists()
            # A repeat of the lost session is answered as finished, not run.
            assert app.session_state(SESSION)["state"] == "finished"
    finally:
        os.close(held)


async def test_a_live_servers_ledger_lists_its_rollouts_until_they_end(
    store: ResultStore, bucket: str, tmp_path: Path
) -> None:
    held = HeldRollout()
    app = rollout_app(store, held.solve, spool=SpoolConfig(directory=tmp_path))
    async with served(app) as http:
        await accept(http, bucket)
        await held.wait_entered()
        path = app.ledger.path
        assert path is not None
        assert path.parent == tmp_path
        # Another server on the same directory leaves a live ledger alone.
        second = AgentCoreRLApp(store=store, spool=SpoolConfig(directory=tmp_path))
        async with second:
            await asyncio.wait_for(second.lost_reported.wait(), 5)
        assert not await store.head(bucket, key_of(SESSION))
        assert app.ledger.running == 1
        held.release.set()
        await settle(app)
        assert app.ledger.running == 0
        envelope: dict[str, Any] = await read_envelope(store, bucket, key_of(SESSION))
        assert envelope[protocol.STATUS_CODE] == 200
    assert not path.exists()  # a clean shutdown leaves nothing to take over


def test_the_ledger_keeps_only_running_rollouts_when_rewritten(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path)
    ledger.open()
    first = ledger.path
    keep = ledger.begin("b", "k-keep", session_id="s", exp_id="e", input_id="i", started_at=1.0)
    for n in range(600):
        token = ledger.begin("b", f"k{n}", session_id="s", exp_id="e", input_id="i", started_at=1)
        ledger.end(token)
    assert first is not None
    assert not first.exists()
    assert ledger.path is not None
    lines = ledger.path.read_text().splitlines()
    assert len(lines) < 400
    ledger.end(keep)
    ledger.close()
    assert list(tmp_path.iterdir()) == []


def test_the_ledger_can_be_switched_off(tmp_path: Path) -> None:
    app = AgentCoreRLApp(spool=SpoolConfig(directory=tmp_path, run_ledger=False))
    app.ledger.open()
    assert app.ledger.path is None
    assert list(tmp_path.iterdir()) == []


def test_a_failing_ledger_turns_off_and_leaves_nothing_to_take_over(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path)
    ledger.open()
    assert ledger._fd is not None
    os.close(ledger._fd)  # the disk write fails from now on
    ledger.begin("b", "k", session_id="s", exp_id="e", input_id="i", started_at=1.0)
    assert not ledger.enabled
    # Not left behind unlocked: a successor would report this live process's rollouts.
    assert list(tmp_path.iterdir()) == []
    assert RunLedger(tmp_path).claim_orphans() == []


async def test_another_apps_or_another_s3s_ledger_is_left_alone(
    store: ResultStore, bucket: str, tmp_path: Path
) -> None:
    # Both dead, in a directory shared on purpose: neither is this server's to report.
    other_app = dead_ledger(
        tmp_path, "ledger-5151-x-1.jsonl", bucket, [SESSION], identity=identity_of("code", store)
    )
    other_s3 = dead_ledger(
        tmp_path,
        "ledger-5252-y-1.jsonl",
        bucket,
        [OTHER],
        identity=("math", "http://127.0.0.1:9", "us-east-1"),
    )
    before = {path: path.read_bytes() for path in (other_app, other_s3)}
    app = AgentCoreRLApp(store=store, app_name="math", spool=SpoolConfig(directory=tmp_path))
    async with app:
        await asyncio.wait_for(app.lost_reported.wait(), 5)
    assert not await store.head(bucket, key_of(SESSION))
    assert not await store.head(bucket, key_of(OTHER))
    assert {path: path.read_bytes() for path in before} == before
