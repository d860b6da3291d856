"""Watching a share's directory on the server's own disk, so that edits made on this
machine (not through rdc) reach the clients that watch the share.

watchdog calls back on its own thread; events are coalesced there into one pending bump,
which a trio task makes after SETTLE_SECONDS of calm (at most MAX_DELAY_SECONDS after the
first event). rdc's own temporaries are ignored.

One watch per share, started by the first client that watches it, stopped with the
daemon. watchdog itself registers some directories twice, harmlessly; see
`ignore_repeated_registration`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable

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
        self.observer = Observer()
        self.running = False  # whether edits on the disk are seen (and move the number)
        try:
            self.observer.schedule(self, path, recursive=True, event_filter=CHANGES)
            self.observer.start()
            self.running = True
        except OSError as exc:  # inotify limits, for one: clients still see rdc's writes
            log.warning("cannot watch share %s for local edits: %s", share, exc)

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
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(self._start, trio_token=self.token)

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

    def _start(self) -> None:
        trio.lowlevel.spawn_system_task(self._bump_when_calm)

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
        self.observer.stop()
        if self.observer.is_alive():
            self.observer.join(timeout=5)
