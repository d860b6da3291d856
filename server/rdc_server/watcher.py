"""Watching a share's directory on the server's own disk, so that edits made on this
machine (not through rdc) reach the clients that watch the share.

watchdog calls back on its own thread; events are coalesced there into one pending bump,
which a trio task makes after SETTLE_SECONDS of calm (at most MAX_DELAY_SECONDS after the
first event). rdc's own temporaries are ignored.

One watch per share, started by the first client that watches it, stopped with the
daemon. watchdog itself registers some directories twice, harmlessly; see
`ignore_repeated_registration`. Its inotify thread can also die of a race in its own
book-keeping (a KeyError when a watched directory goes away at the wrong moment; seen
while fuzzing), after which nothing on the disk would be noticed again: `guard_threads`
turns that into a warning and the watcher restarts (`ShareWatcher.lost`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable

import trio
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from rdc.local.paths import is_temporary

log = logging.getLogger("rdc.serve")
SETTLE_SECONDS = 0.1
MAX_DELAY_SECONDS = 2.0
MAX_PAUSED_PATHS = 10_000
# Only changes: without a filter inotify also reports every open and read-only close, so
# each file the server reads for a client or a replica floods the kernel's event queue.
CHANGES = [FileCreatedEvent, DirCreatedEvent, FileModifiedEvent, DirModifiedEvent,
           FileDeletedEvent, DirDeletedEvent, FileMovedEvent, DirMovedEvent, FileClosedEvent]
# Levels of directories below which watchdog can still open a path: PATH_MAX bytes of
# "a/". It walks a directory that appears with os.walk, which recurses once per level
# (before Python 3.12): a tree deeper than the recursion limit (1,000), made by a client or
# moved in, killed its thread, and no local edit was noticed after.
WALK_LEVELS = 4096 // 2


def ignore_repeated_registration() -> None:
    """Silence watchdog's warning about a directory it registers twice.

    When a directory appears, watchdog's inotify observer watches it and every directory
    it then finds below it; the creation events of those below, queued meanwhile, make it
    register them once more. That second registration replaces a callback with itself
    (nothing is lost or watched twice), but watchdog (7.x) warns each time, and its text
    holds the repr of the watch's callback, which lists every path the observer watches:
    a push that makes a few hundred directories in a share wrote dozens of such warnings
    of up to 900 KB each to the daemon's log (a client's ``rdc watch`` saw the same for
    directories made locally)."""
    warnings.filterwarnings("ignore", message=r"Callback with id .* already exists for watch",
                            category=RuntimeWarning)


_live: weakref.WeakSet[ShareWatcher] = weakref.WeakSet()
_default_hook = threading.excepthook


def _from_watchdog(args: threading.ExceptHookArgs) -> bool:
    tb = args.exc_traceback
    while tb is not None:
        if "watchdog" in tb.tb_frame.f_code.co_filename.split(os.sep):
            return True
        tb = tb.tb_next
    return type(args.thread).__module__.startswith("watchdog")


def guard_threads(args: threading.ExceptHookArgs) -> None:
    """`threading.excepthook` while a share is watched: an exception that kills one of
    watchdog's threads is a warning and a restart of the watchers it stopped (each
    thread-owning watcher, or all if none owns it); any other goes to the default."""
    if not _from_watchdog(args):
        _default_hook(args)
        return
    name = type(args.exc_value).__name__ if args.exc_value is not None else "exit"
    log.warning("watchdog's thread %s died (%s: %.200s); watching again",
                getattr(args.thread, "name", "?"), name, args.exc_value)
    watchers = list(_live)
    owners = [w for w in watchers if args.thread in w.threads()]
    for watcher in owners or watchers:
        watcher.lost()


class ShareWatcher(FileSystemEventHandler):
    def __init__(self, share: str, path: str, changed: Callable[[], None]) -> None:
        """Watch ``path`` (share ``share``); ``changed`` is called (from a trio system
        task) once things settle after each burst of edits."""
        self.changed = changed
        self.token = trio.lowlevel.current_trio_token()
        sys.setrecursionlimit(max(sys.getrecursionlimit(), WALK_LEVELS + 1000))
        self._lock = threading.Lock()
        self._first = 0.0
        self._last = 0.0
        self._pending = False
        ignore_repeated_registration()
        self.paused = 0  # while a replica's round writes (it rescans after): events ignored
        self.root = path
        # What events named while paused (share-relative; None: too many to list), so the
        # replica can tell whether its rescan covers them or it must scan in full.
        self.seen_paused: set[str] | None = set()
        self.share = share
        self.running = False  # whether edits on the disk are seen (and move the number)
        self.restarts = 0
        self._stopped = False
        threading.excepthook = guard_threads
        _live.add(self)
        self.observer = self._observe()

    def _observe(self) -> Observer:
        observer = Observer()
        try:
            observer.schedule(self, self.root, recursive=True, event_filter=CHANGES)
            observer.start()
            self.running = True
        except OSError as exc:  # inotify limits, for one: clients still see rdc's writes
            self.running = False
            log.warning("cannot watch share %s for local edits: %s", self.share, exc)
        return observer

    def threads(self) -> list[threading.Thread]:
        """The threads that watch for this share (the observer, its emitters, and the
        inotify reader that watchdog 7 keeps in the observer)."""
        found = [self.observer, *self.observer.emitters]
        reader = getattr(self.observer, "_inotify_fd", None)
        return [*found, reader] if isinstance(reader, threading.Thread) else found

    def lost(self) -> None:
        """One of this watcher's threads died (called on that thread): what happened
        since is unknown, so a replica that paused it must scan in full, and clients
        look again once a new observer watches."""
        with self._lock:
            self.seen_paused = None
        with contextlib.suppress(trio.RunFinishedError, RuntimeError):
            self.token.run_sync_soon(self._spawn, self._restart)

    @staticmethod
    def _spawn(task: Callable[[], Awaitable[None]]) -> None:
        """Start a system task, unless the run is ending: then its system nursery takes
        no new tasks, and the error, raised in trio's own callback queue, would end the
        run as an internal error (an event that came in as a test's run ended did)."""
        with contextlib.suppress(RuntimeError):
            trio.lowlevel.spawn_system_task(task)

    async def _restart(self) -> None:
        if self._stopped:
            return
        old = self.observer
        await trio.to_thread.run_sync(self._stop_observer, old)
        if self._stopped:
            return
        self.observer = await trio.to_thread.run_sync(self._observe)
        self.restarts += 1
        self.changed()

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory and event.event_type in ("opened", "closed_no_write"):
            return
        if event.event_type in ("opened", "closed_no_write"):
            return
        paths = [event.src_path, getattr(event, "dest_path", "")]
        if all(not p or is_temporary(os.path.basename(os.fsdecode(p))) for p in paths):
            return
        if self._note_paused(paths):
            return
        now = time.monotonic()
        with self._lock:
            self._last = now
            if self._pending:
                return
            self._pending = True
            self._first = now
        # Queued, not waited for: this thread holds watchdog's lock, which `stop` (on
        # trio's thread, as the daemon ends) takes; waiting here would hold both forever.
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self._spawn, self._bump_when_calm)

    def pause(self) -> None:
        with self._lock:
            self.paused += 1

    def resume(self) -> None:
        with self._lock:
            self.paused -= 1

    def _note_paused(self, paths: list) -> bool:
        """While paused, note the paths (under the lock that `resume` and
        `take_seen_paused` take, so none falls between them); whether it was paused."""
        with self._lock:
            if not self.paused:
                return False
            if self.seen_paused is None:
                return True
            for path in paths:
                if path and not is_temporary(os.path.basename(os.fsdecode(path))):
                    rel = os.path.relpath(os.fsdecode(path), self.root)
                    self.seen_paused.add("" if rel == "." else rel)
            if len(self.seen_paused) > MAX_PAUSED_PATHS:
                self.seen_paused = None
        return True

    def take_seen_paused(self) -> set[str] | None:
        """The paths events named while paused, since the last call (None: too many)."""
        with self._lock:
            seen, self.seen_paused = self.seen_paused, set()
        return seen

    async def _bump_when_calm(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                calm = now - self._last >= SETTLE_SECONDS
                late = now - self._first >= MAX_DELAY_SECONDS
                if calm or late:
                    self._pending = False
                    break
            await trio.sleep(SETTLE_SECONDS / 3)
        self.changed()

    def stop(self) -> None:
        self._stopped = True
        _live.discard(self)
        self._stop_observer(self.observer)

    @staticmethod
    def _stop_observer(observer: Observer) -> None:
        with contextlib.suppress(Exception):  # a dead reader cannot be stopped twice
            observer.stop()
        if observer.is_alive():
            observer.join(timeout=5)
