"""The agent server cancels the rollouts of a client whose lease lapsed, and only those:
a renewing client, a missing lease and an unreadable one (S3 down) cancel nothing."""

from __future__ import annotations

from typing import Any

import anyio

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, FaultChecks, ShutdownConfig, SpoolConfig
from agentcore_rl.server.lease import LeaseWatcher
from tests.conftest import FAST_RETRY
from tests.server.helpers import FakeClock, accept, rollout_app, rollout_payload, served
from tests.server.test_sigterm import free_port

TTL = 60.0
NO_GRACE = ShutdownConfig(grace=0)
RENEW = 5.0
INTERVAL = 10.0


async def park(_: float) -> None:
    """The watcher's own loop never runs: the tests call ``check()`` themselves."""
    await anyio.sleep_forever()


async def hang(payload: dict[str, Any]) -> dict[str, Any]:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


class Clocks:
    def __init__(self) -> None:
        self.mono = FakeClock(0.0)
        self.wall = FakeClock(1_700_000_000.0)

    def advance(self, seconds: float) -> None:
        self.mono.advance(seconds)
        self.wall.advance(seconds)

    def checks(self, **options: Any) -> FaultChecks:
        return FaultChecks(lease_interval=INTERVAL, **options)

    def watch(self, app: AgentCoreRLApp) -> AgentCoreRLApp:
        """``app`` with its lease watcher on these clocks."""
        config = app.leases.config
        app.leases = LeaseWatcher(
            app.store, app.runner, config, clock=self.mono, wall=self.wall, sleep=park
        )
        return app


def lease(bucket: str, lease_id: str = "c0ffee") -> tuple[str, dict[str, str]]:
    key = protocol.lease_key("exp", lease_id)
    return key, protocol.lease_reference(bucket, key)


async def renew(store: ResultStore, bucket: str, key: str, seq: int, renewed_at: float) -> None:
    body = protocol.lease_body("c0ffee", seq=seq, renewed_at=renewed_at, ttl=TTL, renew=RENEW)
    await store.put_json(bucket, key, body)


async def start(http: Any, bucket: str, ref: dict[str, str], sessions: list[str]) -> None:
    for n, session in enumerate(sessions):
        payload = rollout_payload(bucket, input_id=f"q-{n}")
        payload[protocol.ROLLOUT_FIELD][protocol.LEASE] = ref
        response = await http.post(
            "/invocations", json=payload, headers={protocol.SESSION_ID_HEADER: session}
        )
        assert response.status_code == 200


SESSIONS = ["lease-session-" + c * 30 for c in "ab"]


async def test_a_lapsed_lease_cancels_its_rollouts_with_the_reason(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    clocks = Clocks()
    key, ref = lease(bucket)
    await renew(store, bucket, key, 1, clocks.wall())
    app = clocks.watch(
        rollout_app(
            store,
            hang,
            spool=SpoolConfig(directory=tmp_path),
            faults=clocks.checks(),
            shutdown=NO_GRACE,
        )
    )
    async with served(app) as http:
        await start(http, bucket, ref, SESSIONS)
        assert await app.leases.check() == 0
        # Renewed on time for a while: nothing happens.
        for seq in range(2, 12):
            clocks.advance(INTERVAL)
            await renew(store, bucket, key, seq, clocks.wall())
            assert await app.leases.check() == 0
        # The client dies: no more renewals.
        clocks.advance(TTL - INTERVAL)
        assert await app.leases.check() == 0
        clocks.advance(INTERVAL)
        assert await app.leases.check() == 2
        assert await app.runner.wait(app.runner.jobs, within=10)
        assert app.leases.reads == 13  # one GET per check, however many rollouts
    for n, session in enumerate(SESSIONS):
        envelope = await store.get_json(bucket, f"exp/q-{n}/{session}.json")
        assert envelope is not None
        assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
        assert "the client's lease lapsed" in envelope[protocol.STOP_REASON]


async def test_a_skewed_client_clock_is_no_lapse_while_it_renews(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    clocks = Clocks()
    key, ref = lease(bucket)
    app = clocks.watch(
        rollout_app(
            store,
            hang,
            spool=SpoolConfig(directory=tmp_path),
            faults=clocks.checks(),
            shutdown=NO_GRACE,
        )
    )
    async with served(app) as http:
        await renew(store, bucket, key, 1, clocks.wall() - 10 * TTL)  # an hour-slow clock
        await start(http, bucket, ref, SESSIONS[:1])
        for seq in range(2, 20):
            clocks.advance(INTERVAL)
            await renew(store, bucket, key, seq, clocks.wall() - 10 * TTL)
            assert await app.leases.check() == 0
        # Once it stops renewing, the stamp's age counts after one missed renewal.
        clocks.advance(RENEW + INTERVAL + 1)
        assert await app.leases.check() == 1
        assert await app.runner.wait(app.runner.jobs, within=10)


async def test_a_missing_lease_is_no_lapse(store: ResultStore, bucket: str, tmp_path: Any) -> None:
    clocks = Clocks()
    _, ref = lease(bucket, "never-written")
    app = clocks.watch(
        rollout_app(
            store,
            hang,
            spool=SpoolConfig(directory=tmp_path),
            faults=clocks.checks(),
            shutdown=NO_GRACE,
        )
    )
    async with served(app) as http:
        await start(http, bucket, ref, SESSIONS[:1])
        for _ in range(3):
            clocks.advance(10 * TTL)
            assert await app.leases.check() == 0
        assert app.runner.active == 1


async def test_an_unreadable_lease_is_no_lapse(tmp_path: Any) -> None:
    # S3 is down for the server: the lease cannot be read, which is no proof of death.
    clocks = Clocks()
    dead = ResultStore(endpoint_url=f"http://127.0.0.1:{free_port()}", retry=FAST_RETRY)
    _, ref = lease("rollouts")
    app = clocks.watch(
        rollout_app(
            dead,
            hang,
            spool=SpoolConfig(directory=tmp_path),
            faults=clocks.checks(),
            shutdown=NO_GRACE,
        )
    )
    async with served(app) as http:
        await start(http, "rollouts", ref, SESSIONS[:1])
        for _ in range(3):
            clocks.advance(10 * TTL)
            assert await app.leases.check() == 0
        assert app.runner.active == 1
    await dead.aclose()


async def test_a_malformed_lease_reference_is_refused(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    app = rollout_app(store, hang, spool=SpoolConfig(directory=tmp_path), shutdown=NO_GRACE)
    async with served(app) as http:
        payload = rollout_payload(bucket)
        payload[protocol.ROLLOUT_FIELD][protocol.LEASE] = {"s3_bucket": bucket, "key": "exp/q/x"}
        response = await http.post(
            "/invocations", json=payload, headers={protocol.SESSION_ID_HEADER: SESSIONS[0]}
        )
        assert response.status_code == 400
        assert response.json()["field"] == "_rollout.lease.key"


async def test_a_process_heartbeats_while_it_has_rollouts_and_names_it_in_its_answers(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    gate = anyio.Event()

    async def held(payload: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {"ok": True}

    app = rollout_app(
        store,
        held,
        spool=SpoolConfig(directory=tmp_path),
        faults=FaultChecks(heartbeat_interval=0.05),
        shutdown=NO_GRACE,
    )
    folder = f"exp/{protocol.HEARTBEAT_FOLDER}/"

    async def etag(key: str) -> str | None:
        return (await store.list_etags(bucket, folder)).get(key)

    async with served(app) as http:
        answer = (await accept(http, bucket)).json()
        assert app.heartbeat is not None
        key = protocol.heartbeat_key("exp", app.heartbeat.process_id)
        assert protocol.parse_heartbeat(answer, "exp") == (key, 0.05)
        seen = set()
        for _ in range(500):  # bounded: rewritten every 50 ms while the rollout runs
            seen.add(await etag(key))
            if len(seen - {None}) >= 2:
                break
            await anyio.sleep(0.01)
        else:
            raise AssertionError(f"the heartbeat was not rewritten: {seen}")
        gate.set()
        for _ in range(500):  # bounded: deleted once the process has no rollout left
            if await etag(key) is None:
                break
            await anyio.sleep(0.01)
        else:
            raise AssertionError("the heartbeat outlived the process's last rollout")


async def test_without_a_heartbeat_the_answer_names_none(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    app = rollout_app(
        store,
        hang,
        spool=SpoolConfig(directory=tmp_path),
        faults=FaultChecks(heartbeat_interval=None),
        shutdown=NO_GRACE,
    )
    async with served(app) as http:
        answer = (await accept(http, bucket)).json()
    assert protocol.HEARTBEAT not in answer
