"""Policy versions and weight-sync pauses (``hold``, ``reject``, ``suspend``: docs/gateway.md,
"Weight-sync recipe"): which calls may start, and when the weights may go."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Final, Literal

import anyio

from agentcore_rl.errors import AlreadyPausedError, GatewayInputError

__all__ = ["UNKNOWN", "PauseMode", "PolicyGate", "Versions"]

PauseMode = Literal["hold", "reject", "suspend"]
_MODES: Final = ("hold", "reject", "suspend")
#: The version of tokens no one can say which weights sampled (the trajectory's NO_VERSION).
UNKNOWN: Final = -1


class Versions:
    """``starts``: ``(first token index, policy version)`` of one generation, in order;
    ``count``: how many tokens a stream has so far (where a resume starts a span); ``since``:
    the gate's ``resumes`` when the call started."""

    __slots__ = ("count", "first", "since", "starts")

    def __init__(self, version: int, since: int = 0) -> None:
        self.first = version  # the record's policy_version_start
        self.since = since
        self.starts: list[tuple[int, int]] = [(0, version)]
        self.count: Callable[[], int] = lambda: 0

    def recorded(self) -> list[tuple[int, int]] | None:
        """The spans a record keeps: None when every token is the call's first version. A
        call that waited out an update before its first token is all the new version's."""
        return None if self.starts == [(0, self.first)] else list(self.starts)

    def adopt(self, spans: list[tuple[int, str]], labels: list[tuple[str, int]]) -> None:
        """The upstream's own spans, ``(first token index, weight label)``, for the gateway's:
        a label one of the gate's ``labels`` sent at a resume during this call names its
        version; any other is the label the upstream had when the call started: its first."""
        sent = dict(labels[self.since :])
        self.starts = [(0, self.first)]
        for at, label in spans:
            self.start(at, sent.get(label, self.first))

    def start(self, at: int, version: int) -> None:
        if version == self.starts[-1][1]:
            return
        if at == self.starts[-1][0]:
            self.starts[-1] = (at, version)
        else:
            self.starts.append((at, version))


class PolicyGate:
    """The current policy version, the pause state, and the calls in flight.

    ``live``: the :class:`Versions` of proxied streams, whose tokens are counted as they
    arrive (those after a ``suspend`` are :data:`UNKNOWN`: the tokens in transit are not told
    apart from the new weights' tokens);
    ``resumes`` counts the ends of ``suspend`` pauses (a token-in call compares it before and
    after each request); ``labels``: the weight label each of them gave the upstreams, and
    its version (unique to this gate and resume, so a span vLLM labels is never taken for
    another's); ``token_in``: upstream base URL -> vLLM's ids of its token-in requests running
    there (what a suspend aborts).
    """

    def __init__(self) -> None:
        self.version = 0
        self.in_flight = 0
        self.resumes = 0
        self.labels: list[tuple[str, int]] = []
        self._nonce = uuid.uuid4().hex[:8]
        self.live: set[Versions] = set()
        self.token_in: dict[str, set[str]] = {}
        self.paused: PauseMode | None = None  # None: calls flow
        self._resumed = anyio.Event()
        self._resumed.set()
        self._drained: anyio.Event | None = None

    def label(self) -> str:
        """The weight label the next resume gives the upstreams: ``{version}-{gate}-{resume}``."""
        return f"{self.version}-{self._nonce}-{self.resumes + 1}"

    async def flowing(self) -> None:
        """Wait until no pause is on (a suspended generation waits here to go on)."""
        while self.paused is not None:
            await self._resumed.wait()

    async def enter(self) -> int | None:
        """Admit one call (waiting out a ``hold`` pause); -> the version it starts under, or
        None in a ``reject`` pause."""
        while self.paused is not None:
            if self.paused == "reject":
                return None
            await self._resumed.wait()
        self.in_flight += 1
        return self.version

    def exit(self) -> None:
        """One admitted call has ended (its record is committed)."""
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None:
            self._drained.set()

    async def pause(self, mode: PauseMode = "hold") -> None:
        """Stop admitting calls; then (``hold``, ``reject``) wait until none is running."""
        if mode not in _MODES:
            raise GatewayInputError(f"pause mode must be one of {_MODES}, got {mode!r}")
        if self.paused is not None:
            raise AlreadyPausedError("the gateway is already paused")
        self.paused = mode
        self._resumed = anyio.Event()
        if mode == "suspend":
            return
        try:
            while self.in_flight:
                self._drained = anyio.Event()
                await self._drained.wait()
        except BaseException:
            self.resume()  # a cancelled pause must not leave the gateway stuck
            raise
        finally:
            self._drained = None

    def resume(self) -> None:
        """Admit calls again; held ones proceed, suspended proxied streams' tokens from here
        on are :data:`UNKNOWN`."""
        if self.paused == "suspend":
            self.labels.append((self.label(), self.version))
            self.resumes += 1
            for versions in self.live:
                versions.start(versions.count(), UNKNOWN)
        self.paused = None
        self._resumed.set()
