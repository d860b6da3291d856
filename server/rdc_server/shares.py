"""Shares: named directories the daemon exports, what each token may do with them, and one
`Replica` (with its index in the state directory) per opened directory, shared by every
connection that opens it."""

from __future__ import annotations

import itertools
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import trio

from rdc.errors import Refusal
from rdc.fs import SafeRoot
from rdc.paths import PathError
from rdc.replica import Replica
from rdc.transfer.serving import Opened
from rdc_server.watcher import ShareWatcher


@dataclass(frozen=True, slots=True)
class Share:
    name: str
    path: str  # absolute, resolved at start-up
    readonly: bool = False


@dataclass(frozen=True, slots=True)
class Rights:
    """What one token may do: ``shares`` maps a share name to "rw" or "ro"; None means every
    share, with the share's own mode."""

    shares: dict[str, str] | None = None

    def mode(self, share: Share) -> str | None:
        if self.shares is None:
            return "ro" if share.readonly else "rw"
        granted = self.shares.get(share.name)
        if granted is None:
            return None
        return "ro" if share.readonly or granted == "ro" else "rw"


@dataclass
class _Open:
    replica: Replica
    lock: trio.Lock = field(default_factory=trio.Lock)


class Registry:
    """All shares of one daemon, their replicas, and their change sequence numbers."""

    def __init__(self, shares: dict[str, Share], state_dir: str | os.PathLike[str]) -> None:
        self.shares = shares
        self.state_dir = Path(state_dir)
        self._open: dict[tuple[str, str], _Open] = {}
        self._opening = threading.Lock()  # `_replica` runs on worker threads
        self._sequence = {name: itertools.count(1) for name in shares}
        self._current = dict.fromkeys(shares, 0)
        self.changed = {name: trio.Event() for name in shares}
        self._watchers: dict[str, ShareWatcher] = {}

    def bump(self, share: str) -> int:
        """A connection wrote to ``share``: a new change sequence number; wakes watchers."""
        self._current[share] = next(self._sequence[share])
        event, self.changed[share] = self.changed[share], trio.Event()
        event.set()
        return self._current[share]

    def sequence(self, share: str) -> int:
        return self._current[share]

    def watch(self, share: str) -> trio.Event:
        """An event set at the share's next change; the first call also starts watching
        the share's directory, so edits made on this machine reach watching clients."""
        if share not in self._watchers:
            self._watchers[share] = ShareWatcher(self, share, self.shares[share].path)
        return self.changed[share]

    def index_location(self, share: str, path: str) -> Path:
        key = blake3.blake3(os.fsencode(path)).hexdigest()[:16]
        return self.state_dir / "index" / f"{share}-{key}.sqlite3"

    def for_client(self, rights: Rights) -> ClientShares:
        return ClientShares(self, rights)

    def close(self) -> None:
        for watcher in self._watchers.values():
            watcher.stop()
        self._watchers.clear()
        for opened in self._open.values():
            opened.replica.close()
        self._open.clear()

    def _replica(self, share: Share, path: str) -> _Open:
        """The one `Replica` of ``path`` in ``share``. Connections that open it at the same
        time must get the same one: its lock is what keeps their writes apart."""
        key = (share.name, path)
        with self._opening:
            if key not in self._open:
                root = os.path.join(share.path, path) if path else share.path
                self._open[key] = _Open(Replica(root, self.index_location(share.name, path)))
            return self._open[key]


class ClientShares:
    """The shares as one client sees them (implements `rdc.transfer.serving.Shares`)."""

    def __init__(self, registry: Registry, rights: Rights) -> None:
        self.registry = registry
        self.rights = rights

    async def open(self, name: str, path: str, write: bool, create: bool) -> Opened:
        share = self.registry.shares.get(name)
        mode = self.rights.mode(share) if share is not None else None
        if share is None or mode is None:
            raise Refusal("share", message=f"no share {name!r} (or not for this token)")
        if write and mode != "rw":
            raise Refusal("readonly", message=f"share {name!r} is read-only")
        if path:
            await trio.to_thread.run_sync(_prepare, share, path, create and write)
        opened = await trio.to_thread.run_sync(self.registry._replica, share, path)
        registry = self.registry
        return Opened(
            replica=opened.replica,
            writable=mode == "rw",
            share=name,
            lock=opened.lock,
            changed=lambda: registry.bump(name),
            sequence=lambda: registry.sequence(name),
            next_change=lambda: registry.watch(name),
        )


def _prepare(share: Share, path: str, create: bool) -> None:
    """Check that ``path`` is a directory inside the share reached without symlinks; make
    it (and its parents) if ``create``."""
    with SafeRoot(share.path) as fs:
        try:
            st = fs.lstat(path)
            if st is None and create:
                fs.makedirs(path, 0o755)
                st = fs.lstat(path)
        except PathError as exc:
            raise Refusal("path", message=str(exc)) from None
        if st is None:
            raise Refusal("path", message=f"{path} does not exist in share {share.name!r}")
        if not stat.S_ISDIR(st.st_mode):
            raise Refusal("path", message=f"{path} is not a directory")
