"""Repository locks: shared for backups and reads, exclusive for forget and prune, as lock
objects in the store (docs/formats.md section 8).

Taking a lock writes it, then lists the others: a conflicting lock that is not stale makes
the taker withdraw its own. Both of two conflicting takers list after writing, so at least
one of them sees the other. That needs nothing of the store beyond its contract; where the
store has an atomic exclusive create, the lock object is written with it, so a lock can
never replace another's.

A shared lock that the store refuses to write (a read-only token of `rdc serve`, read-only
credentials) is not taken: the reader goes on without one, as a read-only user must. A
prune running meanwhile can then make the read fail (a pack gone), never return wrong
data: every blob is checked against its id.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from rdc.repo import msg
from rdc.repo.errors import RepoLocked
from rdc.storage import ObjectNotFound, Store, StoreAccessDenied, StoreError

PREFIX = "locks"
STALE_SECONDS = 30 * 60
REFRESH_SECONDS = 5 * 60
# Two takers that both withdrew try again after a random pause, this many times in all.
ATTEMPTS = 4


@dataclass(frozen=True)
class LockInfo:
    name: str
    kind: str  # "shared" or "exclusive"
    host: str
    pid: int
    command: str
    time: int
    refreshed: int

    def conflicts(self, kind: str) -> bool:
        return kind == "exclusive" or self.kind == "exclusive"

    def stale(self, now_ns: int, host: str) -> bool:
        if now_ns - self.refreshed > STALE_SECONDS * 1_000_000_000:
            return True
        return self.host == host and not _alive(self.pid)

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.time / 1e9).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.command} (pid {self.pid} on {self.host}, since {since})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def read_lock(store: Store, name: str) -> LockInfo | None:
    """The lock object ``name``, or None if it is gone or unreadable (a lock that cannot be
    read is not one this rdc wrote; it does not block)."""
    try:
        value = msg.unpack(store.get(name))
        return LockInfo(name, value["kind"], value["host"], int(value["pid"]),
                        value["command"], int(value["time"]), int(value["refreshed"]))
    except ObjectNotFound:
        return None
    except (ValueError, KeyError, TypeError):
        return None


class Lock:
    """A lock on one repository, held from `acquire` to `release`; refreshed by a thread."""

    def __init__(self, store: Store, kind: str, command: str) -> None:
        if kind not in ("shared", "exclusive"):
            raise ValueError(kind)
        self.store = store
        self.kind = kind
        self.command = command
        self.host = socket.gethostname()
        self.name = f"{PREFIX}/{secrets.token_hex(16)}"
        self.started = time.time_ns()
        self.lost = False
        self.held = False  # False while not acquired, and for a reader the store refused
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _content(self) -> bytes:
        return msg.pack({"kind": self.kind, "host": self.host, "pid": os.getpid(),
                         "command": self.command, "time": self.started,
                         "refreshed": time.time_ns()})

    def acquire(self) -> Lock:
        """Take the lock, or RepoLocked naming who holds the repository."""
        for attempt in range(ATTEMPTS):
            try:
                self.store.put(self.name, self._content(),
                               exclusive=self.store.capabilities.exclusive_create)
            except StoreAccessDenied:
                if self.kind == "shared":
                    return self  # a read-only reader reads unlocked (see above)
                raise
            holder = self._conflict()
            if holder is None:
                self.held = True
                self._thread = threading.Thread(target=self._refresh, name="rdc-lock",
                                                daemon=True)
                self._thread.start()
                return self
            self.store.delete(self.name)
            if attempt + 1 < ATTEMPTS and holder.kind == self.kind == "exclusive":
                time.sleep(random.uniform(0.1, 0.5) * (attempt + 1))
                continue
            break
        how = "exclusively " if holder.kind == "exclusive" else ""
        raise RepoLocked(location=self.store.location,
                         message=f"the repository is locked {how}by {holder.describe()}; "
                         f"a lock not refreshed for {STALE_SECONDS // 60} minutes is stale")

    def _conflict(self) -> LockInfo | None:
        now = time.time_ns()
        for info in list(self.store.list(PREFIX)):
            if info.name == self.name:
                continue
            other = read_lock(self.store, info.name)
            if other is None:
                continue
            if other.stale(now, self.host):
                with contextlib.suppress(StoreError):
                    self.store.delete(other.name)
                continue
            if other.conflicts(self.kind):
                return other
        return None

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_SECONDS):
            try:
                if not self.store.exists(self.name):
                    self.lost = True  # someone judged it stale: stop at the next check
                    return
                self.store.put(self.name, self._content())
            except StoreError:
                continue  # try again at the next refresh

    def check(self) -> None:
        """RepoLocked if the lock was lost (removed by another process as stale)."""
        if self.lost:
            raise RepoLocked(location=self.store.location,
                             message="this command's lock was removed by another process")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(StoreError):
            self.store.delete(self.name)

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
