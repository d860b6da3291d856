"""An rdc server and client joined by in-memory streams: the real protocol logic, without
sockets or processes (the end-to-end suite has those)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

from rdc.errors import AccessDenied, ProtocolError, RemoteError
from rdc.local.ignore import Excludes
from rdc.local.replica import Replica
from rdc.transfer import oneway, twoway
from rdc.transfer.serving import ServerSession
from rdc.transfer.sides import Changed, Remote
from rdc.transfer.stats import Options, Stats
from rdc.wire.connection import Connection, unwrap_group
from rdc.wire.frames import CountingStream, FrameStream
from rdc.wire.handshake import client_handshake, server_handshake
from rdc_server.shares import Registry, Rights, Share

TOKEN = "a-test-token-of-some-length"


def tree_state(root: str | os.PathLike[str], dir_times: bool = True) -> dict[str, tuple]:
    """Every entry under ``root`` (not the root itself): kind, mode, mtime_ns and content
    hash or link target, by relative path (directory times only if ``dir_times``: two-way
    sync leaves them alone). Folder markers are left out: each side has its own."""
    out: dict[str, tuple] = {}
    base = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            if name == ".rdc-folder":
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, base)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", st.st_mtime_ns, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_mtime_ns if dir_times else 0)
            else:
                with open(path, "rb") as f:
                    digest = hashlib.blake2b(f.read()).hexdigest()
                out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_mtime_ns, digest)
    return out


class Pair:
    """A server exporting ``share`` (read-write unless ``readonly``) and a client that syncs
    ``local`` with it over memory streams."""

    def __init__(self, tmp: Path, readonly: bool = False) -> None:
        self.tmp = tmp
        self.share = tmp / "share"
        self.share.mkdir(exist_ok=True)
        self.state = tmp / "state"
        self.readonly = readonly
        self.registry = Registry({"s": Share("s", str(self.share), readonly)}, self.state)
        self.server_errors: list[Exception] = []

    def close(self) -> None:
        self.registry.close()

    def forget_client(self, local: Path) -> None:
        """Drop the client's index of ``local``: its next sync is a client's new to the
        server (no tree it sealed after syncing, so no listing it knows the server holds)."""
        for suffix in ("", "-wal", "-shm"):
            (self.tmp / f"client-{local.name}.sqlite3{suffix}").unlink(missing_ok=True)

    def forget_server(self) -> None:
        """Drop the server's indexes (a share whose state was lost, or that was filled by
        other means): its next sync finds the index cold."""
        self.registry.close()
        shutil.rmtree(self.state)
        self.registry = Registry({"s": Share("s", str(self.share), self.readonly)},
                                 self.state)

    async def run(
        self,
        direction: str,
        local: Path,
        *,
        path: str = "",
        excludes: list[str] | None = None,
        options: Options | None = None,
        token: str = TOKEN,
        between: Callable[[Connection], Any] | None = None,
    ) -> Stats:
        """One push or pull, as ``rdc push|pull`` would run it."""
        local.mkdir(parents=True, exist_ok=True)  # as rdc pull does
        client_stream, server_stream = trio.testing.memory_stream_pair()
        counted = CountingStream(client_stream)
        patterns = excludes or []
        with unwrap_group():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve, server_stream)
                frames = FrameStream(counted)
                await client_handshake(frames, token)
                connection = Connection(frames)
                await nursery.start(connection.run)
                replica = Replica(str(local), self.tmp / f"client-{local.name}.sqlite3",
                                  Excludes(patterns))
                try:
                    stats = await self._run(connection, replica, direction, path, patterns,
                                            options or Options(), between)
                finally:
                    replica.close()
                await connection.close()
                nursery.cancel_scope.cancel()
        stats.bytes_sent, stats.bytes_received = counted.bytes_sent, counted.bytes_received
        return stats

    async def _run(self, connection: Connection, replica: Replica, direction: str, path: str,
                   patterns: list[str], options: Options,
                   between: Callable[[Connection], Any] | None) -> Stats:
        """The core's entry points, as the command line calls them; with ``between``, the
        lower-level steps, to run it after the open and before the transfer."""
        if direction == "sync":
            remote, tree = await twoway.open_round(connection, replica, "s", path, options,
                                                   patterns)
            if between is not None:
                await between(connection)
            stats, self.actions, _ = await twoway.sync_round(
                remote, replica, self.tmp / f"base-{replica.fs.path.rpartition('/')[2]}",
                ("here", "there"), options, None if between is not None else tree,
            )
            return stats
        push = direction == "push"
        if between is None:
            return await oneway.run(connection, replica, "s", path, push, options, patterns)
        answer, tree, _, stamps = await oneway.open_and_scan(connection, replica, "s", path,
                                                             push, options, patterns)
        await between(connection)
        if tree is None:
            tree = await trio.to_thread.run_sync(replica.scan)
        return await oneway.one_way(connection, replica, tree, answer, push, options,
                                    stamps=stamps)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        """As the daemon serves one connection: its failures end it, nothing else."""
        frames = FrameStream(stream)
        try:
            _, rights = await server_handshake(
                frames, lambda t: Rights() if t == TOKEN else None
            )
            session = ServerSession(self.registry.for_client(rights))
            try:
                await Connection(frames, handler=session.handle).run()
            finally:
                session.close()
        except (AccessDenied, ProtocolError, RemoteError) as exc:
            self.server_errors.append(exc)


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def remote_answering(answer: object, features: set[str]) -> Remote:
    """A `Remote` whose every request gets ``answer`` (a peer's message, however wrong),
    between peers with ``features``: for what a client does with a bad answer."""
    from types import SimpleNamespace

    class Conversation:
        async def receive(self, kind: type) -> object:
            return answer

        def close(self) -> None:
            pass

    remote = Remote.__new__(Remote)
    remote.connection = SimpleNamespace(frames=SimpleNamespace(features=features),
                                        start=lambda message: Conversation())
    remote._early = None
    remote._changed = Changed()
    return remote

