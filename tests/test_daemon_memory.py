"""An idle daemon holds no trees: when its last connection ends, what the sessions left
in reference cycles (a finished coroutine's frame, a replica and its group commit) is
freed at once, not at some later collection that an idle process never triggers."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import trio
import trio.testing

from rdc.local.replica import Replica
from rdc.transfer import oneway
from rdc.transfer.stats import Options
from rdc.wire.connection import Connection, unwrap_group
from rdc.wire.frames import FrameStream
from rdc.wire.handshake import client_handshake
from rdc_server.config import ServerConfig, Tokens
from rdc_server.daemon import Daemon
from rdc_server.shares import Registry, Rights, Share

TOKEN = "a-token-for-the-memory-test"


def test_the_last_connection_leaves_no_replica_behind(tmp_path: Path, monkeypatch) -> None:
    share = tmp_path / "share"
    share.mkdir()
    local = tmp_path / "local"
    for i in range(30):
        (local / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (local / f"d{i % 3}" / f"f{i}").write_bytes(b"content %d\n" % i * (i + 1))
    config = ServerConfig(shares={"s": Share("s", str(share), False)},
                          tokens=Tokens([(TOKEN, Rights())]), state_dir=tmp_path / "state")
    daemon = Daemon(config)
    opened: weakref.WeakSet[Replica] = weakref.WeakSet()
    acquire = Registry.acquire

    def recording(self: Registry, *args, **kwargs):
        directory = acquire(self, *args, **kwargs)
        opened.add(directory.replica)
        return directory

    monkeypatch.setattr(Registry, "acquire", recording)

    async def main() -> None:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        with unwrap_group():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(daemon._connection, server_stream)
                frames = FrameStream(client_stream)
                await client_handshake(frames, TOKEN)
                connection = Connection(frames)
                await nursery.start(connection.run)
                replica = Replica(str(local), tmp_path / "client.sqlite3")
                try:
                    stats = await oneway.run(connection, replica, "s", "", True, Options(), [])
                finally:
                    replica.close()
                assert not stats.failed and len(opened) == 1
                await connection.close()
                with trio.move_on_after(5):
                    while len(opened):  # the connection ends, then its memory goes
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()

    gc.collect()
    gc.disable()  # only the daemon's own collection may free the session's cycles
    try:
        trio.run(main)
        assert len(opened) == 0
    finally:
        gc.enable()
        daemon.registry.close()
    assert sorted(p.name for p in share.iterdir()) == ["d0", "d1", "d2"]


def test_the_allocator_is_tuned_where_libc_is_glibc() -> None:
    """`rdc.allocator` finds glibc's mallopt and malloc_trim among the process's own
    symbols (without ctypes.util.find_library, which ran ldconfig at every start-up)."""
    import platform

    from rdc import allocator

    if platform.libc_ver()[0] != "glibc":
        assert allocator._libc is None or hasattr(allocator._libc, "malloc_trim")
        return
    assert allocator._libc is not None
    allocator.tune_allocator()
    allocator.trim()
    assert allocator._libc.mallopt(allocator._M_TRIM_THRESHOLD, 4 << 20) == 1  # glibc: 1 = ok


def test_each_command_runs_with_the_collector_tuned(tmp_path: Path) -> None:
    """`rdc` freezes what start-up made and collects the young generation every YOUNG
    allocations (a scan's tree of long-lived objects was gone over again and again)."""
    import subprocess
    import sys

    from rdc import allocator

    (tmp_path / "file").write_bytes(b"some content\n" * 100)
    script = ("import contextlib, gc, io\n"
              "from rdc_client.cli import main\n"
              "assert gc.get_freeze_count() == 0\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              f"    assert main(['chunk', {str(tmp_path / 'file')!r}]) == 0\n"
              "print(gc.get_threshold()[0], gc.get_freeze_count() > 0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(allocator.YOUNG), "True"]
