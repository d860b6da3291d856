"""Local file-system events for ``rdc watch``: watchdog's callbacks, coalesced per
directory with caps and a settle delay, handed to trio as "something changed".

The caps are module variables that tests override: SETTLE_SECONDS of calm after the last
event, but at most MAX_DELAY_SECONDS after the first; past MAX_DIRS dirty directories the
set collapses to "everything" (the sync rescans the whole tree anyway, so nothing is lost,
the set only keeps the log readable and memory bounded).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import trio
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from rdc.local.ignore import Excludes
from rdc.local.paths import is_temporary
from rdc_server.watcher import ignore_repeated_registration

SETTLE_SECONDS = 0.5
MAX_DELAY_SECONDS = 5.0
MAX_DIRS = 10_000
QUIET_EVENTS = ("opened", "closed_no_write")


class LocalChanges(FileSystemEventHandler):
    """Watches ``root``; `wait` returns the directories that changed (None: too many to
    name) once things have settled."""

    def __init__(self, root: str, excludes: Excludes) -> None:
        self.root = os.path.realpath(root)
        self.excludes = excludes
        self.token = trio.lowlevel.current_trio_token()
        self._lock = threading.Lock()
        self._dirs: set[str] | None = set()
        self._first = 0.0
        self._last = 0.0
        self._wake = trio.Event()
        ignore_repeated_registration()
        self.observer = Observer()
        self.observer.schedule(self, self.root, recursive=True)
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        if self.observer.is_alive():
            self.observer.join(timeout=5)

    # ------------------------------------------------------------ watchdog's thread

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in QUIET_EVENTS:
            return
        dirs = [self._dirty_dir(p, event.is_directory)
                for p in (event.src_path, getattr(event, "dest_path", "")) if p]
        dirs = [d for d in dirs if d is not None]
        if not dirs:
            return
        now = time.monotonic()
        with self._lock:
            first = self._dirs is not None and not self._dirs
            if self._dirs is not None:
                self._dirs.update(dirs)
                if len(self._dirs) > MAX_DIRS:
                    self._dirs = None
            if first:
                self._first = now
            self._last = now
        # Queued, not waited for: this thread holds watchdog's lock, which `stop` (on
        # trio's thread) takes; waiting for trio here would hold both forever.
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self._poke, idempotent=True)

    def _poke(self) -> None:
        self._wake.set()

    def _dirty_dir(self, path: str | bytes, is_dir: bool) -> str | None:
        """The directory (relative, "" for the root) an event dirties, unless the path is
        rdc's temporary or excluded."""
        rel = os.path.relpath(os.fsdecode(path), self.root)
        if rel == ".":
            return ""
        if rel.startswith(".."):
            return None
        rel = rel.replace(os.sep, "/")
        name = rel.rpartition("/")[2]
        if is_temporary(name) or self.excludes(rel, is_dir):
            return None
        return rel.rpartition("/")[0]

    # ------------------------------------------------------------ trio's side

    def pending(self) -> bool:
        with self._lock:
            return self._dirs is None or bool(self._dirs)

    async def wait(self) -> set[str] | None:
        """Block until something changed and settled; return and forget what it was."""
        while not self.pending():
            await self._wake.wait()
            self._wake = trio.Event()
        while True:
            with self._lock:
                now = time.monotonic()
                if (now - self._last >= SETTLE_SECONDS
                        or now - self._first >= MAX_DELAY_SECONDS):
                    dirs, self._dirs = self._dirs, set()
                    return dirs
            await trio.sleep(min(SETTLE_SECONDS / 4, 0.1))
