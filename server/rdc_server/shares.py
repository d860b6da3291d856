"""Shares: named directories the daemon exports, what each token may do with them, and one
`Replica` (with its index in the state directory) per opened directory, shared by every
connection that opens it."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import trio

from rdc.errors import Refusal
from rdc.local.fs import SafeRoot
from rdc.local.ignore import Excludes
from rdc.local.marker import MarkerBook, settle
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.local.versions import PRUNE_SECONDS, Retention, VersionStore
from rdc.records import record
from rdc.wire import messages as m
from rdc_server.health import Board
from rdc_server.watcher import ShareWatcher


@record
class Share:
    name: str
    path: str  # absolute, resolved at start-up
    readonly: bool = False
    replica_of: str = ""  # the upstream a read-only replica follows (for messages)
    versions: Retention | None = None  # keep what clients and replication replace
    versions_dir: str = ""  # where (default: the state directory's versions/NAME)


@record
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


@dataclass(eq=False)
class _Directory:
    """One opened directory: its replica (held by a descriptor reached from the share's
    root without following a symlink), the lock that keeps its scans and writes in
    series, and how many connections use it."""

    replica: Replica
    lock: trio.Lock = field(default_factory=trio.Lock)
    users: int = 0
    last_scan: tuple[int, tuple[str, ...], Any, list] | None = None  # seq, excludes, tree


class Registry:
    """All shares of one daemon, their opened directories, and their change sequence
    numbers."""

    def __init__(self, shares: dict[str, Share], state_dir: str | os.PathLike[str]) -> None:
        self.shares = shares
        self.state_dir = Path(state_dir)
        self._open: dict[tuple[str, str], _Directory] = {}
        self._opening = threading.Lock()  # `acquire` and `release` run on worker threads
        self._sequence = {name: itertools.count(1) for name in shares}
        self._current = dict.fromkeys(shares, 0)
        self.changed = {name: trio.Event() for name in shares}
        self._watchers: dict[str, ShareWatcher] = {}
        self.board = Board()
        self._stores: dict[str, VersionStore] = {}
        self.markers = MarkerBook(self.state_dir / "roots")

    def marker_lost(self, name: str, place: bool = False) -> bool:
        """Whether share ``name`` lost its folder marker (`rdc.local.marker`): it had one
        and has not now. With ``place``, a share with content and no marker yet gets one."""
        path = self.shares[name].path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return self.markers.knows(path)
        try:
            return settle(fd, path, self.markers, place=place).lost
        except OSError:
            return False
        finally:
            os.close(fd)

    def bump(self, share: str) -> int:
        """A connection wrote to ``share``: a new change sequence number; wakes watchers."""
        self._current[share] = next(self._sequence[share])
        event, self.changed[share] = self.changed[share], trio.Event()
        event.set()
        return self._current[share]

    def sequence(self, share: str) -> int:
        return self._current[share]

    def watched(self, share: str) -> bool:
        """Whether edits on this machine's disk move the share's change number."""
        watcher = self._watchers.get(share)
        return watcher is not None and watcher.running

    def watch(self, share: str) -> trio.Event:
        """An event set at the share's next change; the first call also starts watching
        the share's directory, so edits made on this machine reach watching clients. An
        edit made before that went unseen: the first call counts as a change (its event
        is already set), so the client that asked looks once more."""
        if share not in self._watchers:
            path = self.shares[share].path
            self._watchers[share] = ShareWatcher(share, path, lambda: self.bump(share))
            started = self.changed[share]
            self.bump(share)
            return started
        return self.changed[share]

    def versions(self, share: str) -> VersionStore:
        """The share's store of versions (outside the share: docs in rdc.local.versions)."""
        store = self._stores.get(share)
        if store is None:
            config = self.shares[share]
            location = config.versions_dir or self.state_dir / "versions" / share
            store = self._stores[share] = VersionStore(location, config.path, config.versions)
        return store

    async def prune_versions(self) -> None:
        """Prune the versions of every share that keeps them, once per PRUNE_SECONDS
        (staggered versions thin out as they age), until cancelled."""
        while True:
            for name, share in sorted(self.shares.items()):
                if share.versions is not None:
                    store = self.versions(name)
                    await trio.to_thread.run_sync(store.prune_all)
            await trio.sleep(PRUNE_SECONDS)

    @contextlib.contextmanager
    def writing(self, share: str) -> Iterator[None]:
        """While a replica's round writes to ``share``: the share's own watcher ignores
        what it sees (the round rescans at its end, and announces its writes itself)."""
        watcher = self._watchers.get(share)
        if watcher is not None:
            watcher.pause()
        try:
            yield
        finally:
            if watcher is not None:
                watcher.resume()

    def seen_while_writing(self, share: str) -> set[str] | None:
        """Share-relative paths that the share's watcher saw change while `writing` (since
        the last call); None: the share is not watched, or too many to list."""
        watcher = self._watchers.get(share)
        if watcher is None or not watcher.running:
            return None
        return watcher.take_seen_paused()

    def index_location(self, share: str, path: str) -> Path:
        key = blake3.blake3(os.fsencode(path)).hexdigest()[:16]
        return self.state_dir / "index" / f"{share}-{key}.sqlite3"

    def for_client(self, rights: Rights, peer: str = "") -> ClientShares:
        return ClientShares(self, rights, peer)

    def close(self) -> None:
        for watcher in self._watchers.values():
            watcher.stop()
        self._watchers.clear()
        with self._opening:
            for directory in self._open.values():
                directory.replica.close()
            self._open.clear()

    def acquire(self, share: Share, path: str, create: bool) -> _Directory:
        """The opened directory ``path`` of ``share`` (blocking: run it on a worker
        thread), made if ``create``. It is reached anew from the share's root, one
        component at a time without following a symlink, on every open; connections that
        open the same directory share one `_Directory` (its lock keeps their writes
        apart), as long as it is still the same directory: one that was replaced (a
        symlink or another directory swapped in) gets a new one, and the old one serves
        its current users only. Raises Refusal (``path``)."""
        try:
            with SafeRoot(share.path) as top:
                root = top.subroot(path, create=create)
        except PathError as exc:
            raise Refusal("path", message=str(exc)) from None
        except FileNotFoundError:
            raise Refusal("path", message=f"{path} does not exist in share {share.name!r}"
                          ) from None
        except NotADirectoryError:
            raise Refusal("path", message=f"{path} is not a directory") from None
        key = (share.name, path)
        with self._opening:
            current = self._open.get(key)
            if current is not None and current.replica.fs.identity() == root.identity():
                root.close()
            else:
                if share.versions is not None:
                    root.keeper = self.versions(share.name).keeper(prefix=path)
                try:
                    current = _Directory(Replica(root, self.index_location(share.name, path)))
                except BaseException:
                    root.close()
                    raise
                self._open[key] = current  # a replaced one closes with its last user
            current.users += 1
            return current

    def release(self, directory: _Directory) -> None:
        """A connection is done with ``directory``; the last one closes it (an idle
        daemon holds no trees, indexes or descriptors of shares)."""
        with self._opening:
            directory.users -= 1
            if directory.users:
                return
            for key, value in list(self._open.items()):
                if value is directory:
                    del self._open[key]
            directory.replica.close()


class ClientShares:
    """The shares as one client sees them (implements `rdc.transfer.serving.Shares`)."""

    def __init__(self, registry: Registry, rights: Rights, peer: str = "") -> None:
        self.registry = registry
        self.rights = rights
        self.peer = peer  # the client's address, for rdc status

    async def open(self, name: str, path: str, write: bool, create: bool) -> GrantedDirectory:
        share = self.registry.shares.get(name)
        mode = self.rights.mode(share) if share is not None else None
        if share is None or mode is None:
            raise Refusal("share", message=f"no share {name!r} (or not for this token)")
        if write and mode != "rw":
            if share.replica_of:
                raise Refusal("readonly", message=f"share {name!r} is a read-only replica of "
                              f"{share.replica_of}: change it there")
            raise Refusal("readonly", message=f"share {name!r} is read-only")
        # The share's folder marker first: nothing may wait (and be cancelled) between
        # acquiring the directory and handing it to the connection that releases it.
        await trio.to_thread.run_sync(self.registry.marker_lost, name, True)
        directory = await trio.to_thread.run_sync(
            self.registry.acquire, share, path, create and write
        )
        # A connection that opened without ``write`` stays read-only, whatever its token
        # allows.
        return GrantedDirectory(self.registry, name, directory, writable=write and mode == "rw",
                                peer=self.peer)


class GrantedDirectory:
    """One connection's open directory (implements `rdc.transfer.serving.OpenDirectory`)."""

    def __init__(
        self, registry: Registry, share: str, directory: _Directory, writable: bool,
        peer: str = "",
    ) -> None:
        self.registry = registry
        self.share = share
        self.writable = writable
        self.peer = peer
        self._directory = directory
        self._released = False

    @property
    def replica(self) -> Replica:
        return self._directory.replica

    @property
    def lock(self) -> trio.Lock:
        return self._directory.lock

    def changed(self) -> int:
        return self.registry.bump(self.share)

    def sequence(self) -> int:
        return self.registry.sequence(self.share)

    def next_change(self) -> trio.Event:
        return self.registry.watch(self.share)

    def scanned(self, seq: int, excludes: Excludes) -> tuple[Any, list] | None:
        last = self._directory.last_scan
        if last is None or not self.registry.watched(self.share):
            return None
        if (last[0], last[1]) != (seq, tuple(excludes.patterns)):
            return None
        return last[2], last[3]

    def keep_scan(self, seq: int, excludes: Excludes, tree: Any, errors: list) -> None:
        self._directory.last_scan = (seq, tuple(excludes.patterns), tree, errors)

    def watching(self) -> None:
        self.registry.board.watcher(self.share, id(self), self.peer)

    def reported(self, health: m.PeerHealth) -> None:
        self.registry.board.reported(self.share, id(self), self.peer, health)

    def health(self) -> m.Health:
        return m.Health(share=self.share, seq=self.sequence(),
                        peers=self.registry.board.health(self.share))

    def marker_lost(self) -> bool:
        return self.registry.marker_lost(self.share)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.registry.board.gone(self.share, id(self))
            self.registry.release(self._directory)
