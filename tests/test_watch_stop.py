"""A watch stops while edits stream in: neither the client's watcher of its directory nor
the server's of a share may hold trio's thread waiting on watchdog's.

watchdog calls our handler with its observer's lock held, and `Observer.stop` takes that
lock. A handler that waited for trio (``trio.from_thread.run_sync``) while trio's thread sat
in ``stop`` held both for good: ``rdc watch`` then hung on Ctrl-C (CI saw it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import trio

from rdc.local.ignore import Excludes
from rdc_client.watching import LocalChanges
from rdc_server.watcher import ShareWatcher

DEADLINE = 30.0


def edits(root: Path, stop: threading.Event) -> threading.Thread:
    """A thread that creates and removes files in ``root`` until ``stop``."""
    def run() -> None:
        n = 0
        while not stop.is_set():
            path = root / f"f{n % 50}"
            path.write_bytes(b"x")
            path.unlink()
            n += 1
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def assert_stops(start: Callable[[Path], object], stop: Callable[[object], None],
                 root: Path) -> None:
    """Calls `stop` on trio's thread while that thread is busy and events queue up; fails
    if the run does not end by DEADLINE (a daemon thread holds what hangs)."""
    stopped: list[bool] = []

    async def main() -> None:
        watcher = start(root)
        done = threading.Event()
        writer = edits(root, done)
        try:
            time.sleep(0.5)  # trio's thread busy: the handler's call to it waits
            stop(watcher)
            stopped.append(True)
        finally:
            done.set()
            writer.join(DEADLINE)

    runner = threading.Thread(target=trio.run, args=(main,), daemon=True)
    runner.start()
    runner.join(DEADLINE)
    assert not runner.is_alive(), "stopping the watcher hung"
    assert stopped == [True]


def test_the_clients_watcher_stops_while_edits_stream_in(tmp_path: Path) -> None:
    assert_stops(lambda root: LocalChanges(str(root), Excludes([])),
                 lambda changes: changes.stop(), tmp_path)


def test_the_servers_watcher_stops_while_edits_stream_in(tmp_path: Path) -> None:
    assert_stops(lambda root: ShareWatcher("s", str(root), lambda: None),
                 lambda watcher: watcher.stop(), tmp_path)
