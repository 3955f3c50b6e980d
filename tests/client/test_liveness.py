"""The crash detector with an injected clock. Probes (servers without a heartbeat): only
long-pending sessions, each at most every probe_interval, never more than max_rate per
second however many are in flight, the longest-unconfirmed first, a probe starved by
invocations queued among them, and a lost session on one HTTP server makes that server's
sessions suspects. Heartbeats: a session is lost once its process's heartbeat has stayed
unchanged for three intervals, with one listing per experiment and no probe."""

from __future__ import annotations

import asyncio

from agentcore_rl import protocol
from agentcore_rl.client import LivenessConfig
from agentcore_rl.client.liveness import LivenessProber
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.client.transports.transport import NotConnectedError
from agentcore_rl.ratelimit import Priority, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Transport:
    """Answers status requests from a table; unknown sessions are lost."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.lost: set[str] = set()
        self.asked: list[str] = []

    def url_for(self, session_id: str) -> str:
        return self.urls[session_id]

    async def status(self, session_id: str) -> protocol.SessionState:
        self.asked.append(session_id)
        if session_id in self.lost:
            return protocol.SessionState.UNKNOWN
        return protocol.SessionState.RUNNING


class Pending:
    """A rollout waiting for its outcome, as the prober sees it; ``lost`` collects wakes."""

    def __init__(self, session_id: str, lost: list[str]) -> None:
        self.session_id = session_id
        self.lost = lost
        self.waiting = True
        self.beat: tuple[str, str, float] | None = None  # probed: no heartbeat

    def wake(self, kind: str, value: object) -> None:
        assert kind == "lost"
        self.waiting = False
        self.lost.append(self.session_id)


def _futures(n: int, lost: list[str] | None = None) -> dict[str, Pending]:
    sink: list[str] = [] if lost is None else lost
    return {f"s{i}": Pending(f"s{i}", sink) for i in range(n)}


async def test_probes_are_capped_and_only_for_long_pending_sessions() -> None:
    clock = Clock()
    live = _futures(10_000)
    transport = Transport({sid: "http://a" for sid in live})
    config = LivenessConfig(probe_after=10, probe_interval=5, max_rate=2)
    prober = LivenessProber(
        transport, TokenBucket(1000), live, ClientStats(), config=config, clock=clock
    )
    await prober.round()  # first sight: nothing is due
    clock.now = 5.0
    await prober.round()
    assert transport.asked == []  # younger than probe_after
    for second in range(11, 31):
        clock.now = float(second)
        await prober.round()
    assert len(transport.asked) == 2 * 20  # max_rate per second, not 10,000
    assert len(set(transport.asked)) == len(transport.asked)  # longest-unprobed first


class BusyLimiter:
    """A TPS budget invocations never leave free: a PROBE token never comes."""

    def __init__(self) -> None:
        self.granted: list[int] = []

    async def acquire(self, priority: int = Priority.INVOKE) -> None:
        if priority > Priority.INVOKE:
            await asyncio.Event().wait()
        self.granted.append(priority)

    def on_throttle(self) -> None: ...

    def on_success(self) -> None: ...


async def test_a_probe_starved_by_invocations_queues_among_them() -> None:
    clock = Clock()
    lost: list[str] = []
    live = _futures(1, lost)
    transport = Transport({sid: "http://a" for sid in live})
    transport.lost = {"s0"}
    limiter = BusyLimiter()
    counters = ClientStats()
    config = LivenessConfig(probe_after=0, escalate_after=0)
    prober = LivenessProber(
        transport,
        limiter,
        live,
        counters,
        config=config,
        clock=clock,
    )
    await prober.round()  # first sight
    clock.now = 1.0
    await asyncio.wait_for(prober.round(), 5)
    assert lost == ["s0"]
    assert limiter.granted == [Priority.INVOKE]
    assert counters.probes_escalated == 1


async def test_the_longest_unconfirmed_session_is_probed_first() -> None:
    clock = Clock()
    futures = _futures(3)
    live: dict[str, Pending] = {}
    transport = Transport({sid: "http://a" for sid in futures})
    config = LivenessConfig(probe_after=10, probe_interval=60, max_rate=1)
    prober = LivenessProber(
        transport,
        TokenBucket(1000),
        live,
        ClientStats(),
        config=config,
        clock=clock,
    )
    for sid in ("s2", "s0", "s1"):  # invoked in this order, a second apart
        live[sid] = futures[sid]
        await prober.round()
        clock.now += 1
    clock.now = 20.0
    for _ in range(3):  # one probe a round
        await prober.round()
        clock.now += 1
    assert transport.asked == ["s2", "s0", "s1"]


async def test_a_lost_session_makes_its_servers_sessions_suspects() -> None:
    clock = Clock()
    lost: list[str] = []
    live = _futures(6, lost)
    urls = {sid: ("http://a" if int(sid[1:]) % 2 else "http://b") for sid in live}
    transport = Transport(urls)
    transport.lost = {"s1", "s3", "s5"}  # server a restarted
    config = LivenessConfig(probe_after=10, probe_interval=5, max_rate=1)
    prober = LivenessProber(
        transport,
        TokenBucket(1000),
        live,
        ClientStats(),
        config=config,
        clock=clock,
    )
    await prober.round()
    clock.now = 10.0
    for _ in range(10):
        if len(lost) == 3:
            break
        await prober.round()
        for sid in lost:
            live.pop(sid, None)
        clock.now += 1.0
    assert sorted(lost) == ["s1", "s3", "s5"]
    # after the first loss, server a's sessions went first: none of b's was probed before
    first = transport.asked.index(lost[0])
    assert all(urls[sid] == "http://a" for sid in transport.asked[first + 1 : first + 3])


class DeadTransport(Transport):
    """An agent that died and stays dead: every probe fails to connect."""

    async def status(self, session_id: str) -> protocol.SessionState:
        self.asked.append(session_id)
        raise NotConnectedError("connection refused", session_id=session_id)


async def test_an_agent_unreachable_for_lost_after_loses_its_sessions() -> None:
    clock = Clock()
    lost: list[str] = []
    live = _futures(2, lost)
    transport = DeadTransport({sid: "http://a" for sid in live})
    config = LivenessConfig(probe_after=0, probe_interval=1, lost_after=10, max_rate=10)
    counters = ClientStats()
    prober = LivenessProber(
        transport, TokenBucket(1000), live, counters, config=config, clock=clock
    )
    await prober.round()  # first sight
    for second in range(1, 11):
        clock.now = float(second)
        await prober.round()
        assert lost == []  # the first failure at 1 s: lost from 11 s on
    clock.now = 11.0
    await prober.round()
    assert sorted(lost) == ["s0", "s1"]
    assert counters.agents_lost == 2
    assert counters.probe_failures >= 20


class Folder:
    """A heartbeat folder as listings show it: ``beat`` rewrites one; ``down`` fails reads."""

    def __init__(self) -> None:
        self.etags: dict[str, str] = {}
        self.down = False
        self.reads = 0

    def beat(self, key: str) -> None:
        self.etags[key] = f"{key}-{self.reads}"

    async def read(self, bucket: str, prefix: str) -> dict[str, str] | None:
        assert (bucket, prefix) == ("b", "exp/.heartbeats/")
        self.reads += 1
        return None if self.down else {k: v for k, v in self.etags.items() if k.startswith(prefix)}


async def test_a_heartbeat_unchanged_for_three_intervals_loses_its_sessions_unprobed() -> None:
    clock, folder, lost = Clock(), Folder(), list[str]()
    live = _futures(3, lost)
    keys = {sid: f"exp/.heartbeats/p{sid}.json" for sid in live}
    for sid, rollout in live.items():
        rollout.beat = ("b", keys[sid], 5.0)
    # s0's process dies after its first beat, s1's keeps beating, s2's never writes one.
    folder.beat(keys["s0"])
    transport = Transport({})
    counters = ClientStats()
    prober = LivenessProber(
        transport, TokenBucket(1000), live, counters, clock=clock, read=folder.read
    )

    async def at(second: float, *, beats: bool = True) -> None:
        clock.now = second
        if beats:
            folder.beat(keys["s1"])
        await prober.round()

    await at(0)
    for second in range(1, 15):
        await at(second)
        assert lost == []
    await at(15)
    assert sorted(lost) == ["s0", "s2"]
    assert transport.asked == []  # a heartbeat costs no invocation
    assert folder.reads == 6  # one listing per half interval (0, 3, 6... s), for all sessions
    # s1's process dies as S3 stops answering: an unanswered listing counts as a beat, so
    # it is lost three intervals after the last one (at 57 s), not during the outage.
    folder.down = True
    for second in range(16, 59):
        await at(second, beats=False)
    folder.down = False
    for second in range(59, 72):
        await at(second, beats=False)
        assert sorted(lost) == ["s0", "s2"]
    await at(72, beats=False)
    assert sorted(lost) == ["s0", "s1", "s2"]
    assert counters.agents_lost == 3
