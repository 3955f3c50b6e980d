"""RunLedger: which rollouts this process is running, on disk, so a successor can tell.

A process killed outright (SIGKILL, OOM, a crashed container) writes no envelope for the
rollouts it was running; their clients would learn of it only from a liveness probe or
their timeout. So each server process keeps a small ledger in its spool directory: one
file (``ledger-<pid>-<token>.jsonl``) that it holds under an exclusive ``flock`` while it
lives, with one line per accepted rollout and one per finished one. A server started later
on the same directory (the restarted container, with its volume) takes over every ledger
whose lock it can get (the owner is dead, the kernel released its lock) and gets the
rollouts started there and never finished: it writes their "agent lost" envelopes, which
the client reads within a second and retries in a new session.

Costs per rollout: two ``write`` calls of about 150 bytes on an ``O_APPEND`` descriptor
(no ``fsync``: a killed process's writes are in the kernel already; only a lost machine
loses them, and with it the disk). The file is rewritten with only the running rollouts
when finished lines dominate, so it stays small on a server that runs for months. Where
``fcntl`` is missing (Windows) the ledger is off.

Each file starts with the ledger's ``identity`` (the app and the S3 it writes to): a
successor takes over only the ledgers of its own identity, so a directory shared by two
apps, or by one app pointed at two S3s, never has one report the other's rollouts.

Example::

    ledger = RunLedger(Path("/var/spool/agent"))
    ledger.open()
    token = ledger.begin("rollouts", key, session_id=sid, exp_id="e1", input_id="q-1",
                         started_at=time.time())
    ledger.end(token)
    for orphan in ledger.claim_orphans():       # at startup: the dead predecessors'
        for entry in orphan.entries: ...        # rollouts that never finished
        orphan.release()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, no ledger
    fcntl = None  # type: ignore[assignment]

__all__ = ["LEDGER_ENV", "LedgerEntry", "OrphanLedger", "RunLedger"]

logger = logging.getLogger(__name__)

#: ``0``/``false``/``off`` turns the ledger off (the ``SpoolConfig.run_ledger`` default).
LEDGER_ENV: Final = "AGENTCORE_RL_RUN_LEDGER"

_PREFIX: Final = "ledger-"
_SUFFIX: Final = ".jsonl"
_BEGIN: Final = "+"
_END: Final = "-"
_IDENTITY: Final = "="
# Rewrite the file once it holds this many lines and four times as many as are running.
_COMPACT_MIN_LINES: Final = 1024
_COMPACT_FACTOR: Final = 4


def ledger_enabled_by_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """False when ``$AGENTCORE_RL_RUN_LEDGER`` says ``0``, ``false``, ``no`` or ``off``."""
    return environ.get(LEDGER_ENV, "").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class LedgerEntry:
    """One rollout a dead process started and never finished."""

    bucket: str
    key: str
    session_id: str
    exp_id: str
    input_id: str
    started_at: float


def _lock(fd: int) -> bool:
    """Take the exclusive lock without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _parse(data: bytes) -> tuple[list[Any] | None, list[LedgerEntry]]:
    """The identity and the entries begun and not ended in a ledger file's bytes (bad
    lines skipped: the last one may be torn)."""
    identity: list[Any] | None = None
    running: dict[int, LedgerEntry] = {}
    for line in data.splitlines():
        try:
            record = json.loads(line)
            if record[0] == _IDENTITY:
                identity = list(record[1:])
            elif record[0] == _BEGIN:
                _, n, bucket, key, sid, exp_id, input_id, started = record
                running[int(n)] = LedgerEntry(
                    str(bucket), str(key), str(sid), str(exp_id), str(input_id), float(started)
                )
            elif record[0] == _END:
                running.pop(int(record[1]), None)
        except (ValueError, TypeError, IndexError, KeyError):
            continue
    return identity, list(running.values())


class OrphanLedger:
    """A dead process's ledger, locked by this process until :meth:`release`.

    ``pid`` is the dead owner's; ``entries`` its unfinished rollouts.
    """

    def __init__(self, path: Path, fd: int, pid: int | None, entries: list[LedgerEntry]):
        self.path = path
        self.pid = pid
        self.entries = entries
        self._fd: int | None = fd

    def __repr__(self) -> str:
        return f"OrphanLedger({self.path.name!r}, entries={len(self.entries)})"

    def release(self) -> None:
        """Delete the file (its rollouts are reported) and drop the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(fd)

    def abandon(self) -> None:
        """Drop the lock and keep the file (a later server tries again). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class RunLedger:
    """This process's running rollouts in ``directory``, and its dead predecessors'.

    ``enabled`` False (or no ``fcntl``) makes every method a no-op. A failing disk turns
    the ledger off with one warning: it is a shortcut to detection, never a reason to
    refuse a rollout.
    """

    def __init__(
        self,
        directory: Path | None,
        *,
        enabled: bool = True,
        identity: Sequence[str | None] = (),
    ) -> None:
        #: ``None`` until the owner knows it (the app: once its name is known).
        self.directory = directory
        #: Whose ledgers this one takes over: those written under the same identity.
        self.identity: tuple[str | None, ...] = tuple(identity)
        self.enabled = enabled and fcntl is not None
        self._fd: int | None = None
        self._path: Path | None = None
        self._name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self._generation = 0
        self._next = 0
        self._running: dict[int, bytes] = {}
        self._lines = 0

    def __repr__(self) -> str:
        return (
            f"RunLedger(directory={str(self.directory)!r}, enabled={self.enabled}, "
            f"running={len(self._running)})"
        )

    @property
    def path(self) -> Path | None:
        """This process's ledger file (``None`` until :meth:`open`, or when off)."""
        return self._path

    @property
    def running(self) -> int:
        """Rollouts begun and not ended."""
        return len(self._running)

    def _new_file(self) -> tuple[Path, int]:
        """A fresh file, locked before it appears under a name others look at."""
        self._generation += 1
        assert self.directory is not None
        path = self.directory / f"{self._name}-{self._generation}{_SUFFIX}"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            if not _lock(fd):  # nobody else knows the name; cannot happen
                raise OSError(f"could not lock {tmp}")
            os.write(fd, (json.dumps([_IDENTITY, *self.identity]) + "\n").encode())
            if self._running:
                os.write(fd, b"".join(self._running.values()))
            tmp.replace(path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return path, fd

    def open(self) -> None:
        """Create and lock this process's ledger file. Idempotent."""
        if not self.enabled or self._fd is not None or self.directory is None:
            return
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._path, self._fd = self._new_file()
        except OSError as exc:
            self._off(exc)

    def _off(self, exc: OSError) -> None:
        logger.warning(
            "the run ledger in %s is off (%s): a crash of this process is found by the "
            "clients' liveness probes instead",
            self.directory,
            exc,
        )
        self.enabled = False
        fd, path = self._fd, self._path
        self._fd = self._path = None
        # Deleted before its lock goes: a successor must never take a live process's
        # ledger for a dead one's and report running rollouts lost.
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._running.clear()

    def _write(self, line: bytes) -> None:
        assert self._fd is not None
        try:
            os.write(self._fd, line)
        except OSError as exc:
            self._off(exc)
            return
        self._lines += 1

    def begin(
        self,
        bucket: str,
        key: str,
        *,
        session_id: str,
        exp_id: str,
        input_id: str,
        started_at: float,
    ) -> int | None:
        """Record an accepted rollout; the token for :meth:`end` (``None`` when off)."""
        if self._fd is None:
            return None
        self._next += 1
        token = self._next
        line = (
            json.dumps([_BEGIN, token, bucket, key, session_id, exp_id, input_id, started_at])
            + "\n"
        ).encode()
        self._running[token] = line
        self._write(line)
        return token

    def end(self, token: int | None) -> None:
        """Record that the rollout's envelope is written or spooled."""
        if token is None or self._fd is None or self._running.pop(token, None) is None:
            return
        self._write(f'["{_END}",{token}]\n'.encode())
        if self._lines >= _COMPACT_MIN_LINES and self._lines >= _COMPACT_FACTOR * len(
            self._running
        ):
            self._compact()

    def _compact(self) -> None:
        """Start a new file holding only the running rollouts; delete the old one."""
        old_path, old_fd = self._path, self._fd
        try:
            self._path, self._fd = self._new_file()
        except OSError as exc:
            self._off(exc)
            return
        self._lines = len(self._running)
        # Until here both files were locked: a successor saw one of them, or both (the
        # same entries twice, reported once).
        if old_path is not None:
            with contextlib.suppress(OSError):
                old_path.unlink()
        if old_fd is not None:
            os.close(old_fd)

    def close(self) -> None:
        """Delete this process's ledger (every rollout ended or was spooled). Idempotent."""
        fd, path = self._fd, self._path
        self._fd = self._path = None
        self._running.clear()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        if fd is not None:
            os.close(fd)

    def claim_orphans(self) -> list[OrphanLedger]:
        """Lock and read every other ledger in the directory whose owner is dead.

        A ledger whose lock is held belongs to a live process and is left alone. Each
        returned ledger stays locked (so no other successor reports it too) until its
        :meth:`OrphanLedger.release` or :meth:`OrphanLedger.abandon`.
        """
        if not self.enabled or self.directory is None or not self.directory.is_dir():
            return []
        orphans: list[OrphanLedger] = []
        for tmp in self.directory.glob(f"{_PREFIX}*.tmp"):
            _remove_if_dead(tmp)  # a half-made file of a process killed mid-rewrite
        for path in sorted(self.directory.glob(f"{_PREFIX}*{_SUFFIX}")):
            if path == self._path:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue  # gone meanwhile (its owner compacted or closed it)
            try:
                # Locked, and still the file under that name (another successor may
                # have released and deleted it between our open and our lock).
                if not _lock(fd) or os.fstat(fd).st_ino != os.stat(path).st_ino:
                    os.close(fd)
                    continue
                with os.fdopen(os.dup(fd), "rb") as handle:
                    identity, entries = _parse(handle.read())
            except OSError:
                os.close(fd)
                continue
            if identity != list(self.identity):
                os.close(fd)  # another app's, or for another S3: not ours to report
                continue
            orphans.append(OrphanLedger(path, fd, _pid_of(path), entries))
        return orphans


def _remove_if_dead(path: Path) -> None:
    """Delete a file whose creator is dead (we can lock it); leave it to a live one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if _lock(fd):
            path.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_of(path: Path) -> int | None:
    with contextlib.suppress(ValueError, IndexError):
        return int(path.name[len(_PREFIX) :].split("-")[0])
    return None
