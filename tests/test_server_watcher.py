"""The server's watcher of a share's disk outlives a death of watchdog's own threads.

watchdog 7's inotify reader thread can die of a KeyError in its book-keeping when a watched
directory is deleted at the wrong moment (the fuzzer found it). Here that death is forced
with the same exception, and the watcher must say so in one warning line, note that a
replica's rescan can no longer be trusted to cover what happened, and see edits again.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from watchdog.events import FileCreatedEvent
from watchdog.observers import inotify

from rdc_server import watcher as watcher_module
from rdc_server.watcher import ShareWatcher

DEADLINE = 20.0


async def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await trio.sleep(0.05)


def test_a_dead_watchdog_thread_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    share = tmp_path / "share"
    (share / "doomed").mkdir(parents=True)
    original = inotify.InotifyWatchGroup._remove_watch_internally
    broken = threading.Event()

    def racy(self, wd):  # watchdog's race, once: the path was already forgotten
        if not broken.is_set():
            broken.set()
            raise KeyError(b"/gone")
        return original(self, wd)

    monkeypatch.setattr(inotify.InotifyWatchGroup, "_remove_watch_internally", racy)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored after
    bumps: list[float] = []

    async def main() -> None:
        watch = ShareWatcher("s", str(share), lambda: bumps.append(time.monotonic()))
        try:
            assert watch.running
            first = watch.threads()
            watch.pause()  # a replica's round is writing
            (share / "doomed").rmdir()  # the directory's watch goes: the reader dies
            await wait_until(lambda: watch.restarts == 1, "the watcher to restart")
            assert watch.take_seen_paused() is None  # the round must scan in full
            watch.resume()
            assert not any(t.is_alive() for t in first if t is not watch.observer), \
                "the old observer's threads are stopped"
            assert all(t.is_alive() for t in watch.threads())
            restarted = len(bumps)
            assert restarted >= 1  # clients look again after the gap
            (share / "after").write_bytes(b"seen")
            await wait_until(lambda: len(bumps) > restarted, "an edit after the restart")
        finally:
            watch.stop()

    with caplog.at_level(logging.WARNING, logger="rdc.serve"):
        trio.run(main)
    assert broken.is_set()
    deaths = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    assert len(deaths) == 1 and "KeyError" in deaths[0]
    assert not watcher_module._live  # a stopped watcher is no longer restarted


def test_other_threads_keep_the_default_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BaseException | None] = []
    monkeypatch.setattr(watcher_module, "_default_hook", lambda args: seen.append(args.exc_value))
    monkeypatch.setattr(threading, "excepthook", watcher_module.guard_threads)

    def fail() -> None:
        raise ValueError("not watchdog's")

    thread = threading.Thread(target=fail)
    thread.start()
    thread.join()
    assert len(seen) == 1 and isinstance(seen[0], ValueError)


def test_events_while_the_run_ends_do_not_end_it_as_an_internal_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of edits, or a watchdog thread that died, can reach trio while its run is
    ending, when its system nursery takes no new tasks: they are dropped. (A test's run
    ended as trio.TrioInternalError when one did: the error was raised in trio's own
    callback queue.)"""
    refused: list[object] = []

    def closed(task: object) -> None:
        refused.append(task)
        raise RuntimeError("Nursery is closed to new arrivals")

    async def main() -> None:
        watcher = ShareWatcher("s", str(tmp_path), lambda: None)
        try:
            monkeypatch.setattr(trio.lowlevel, "spawn_system_task", closed)
            watcher.on_any_event(FileCreatedEvent(str(tmp_path / "new")))  # an edit's burst
            watcher.lost()  # a dead thread's restart, through trio's callback queue
            await trio.testing.wait_all_tasks_blocked()
        finally:
            monkeypatch.undo()
            watcher.stop()

    trio.run(main)
    assert len(refused) == 2
