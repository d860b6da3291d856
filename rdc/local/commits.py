"""Group commit: files received one by one, on many threads at once, made durable together.

A file received by the per-file exchange used to be fsynced alone, renamed, and recorded in
its own index transaction: a push that changed 1,000 files of a large tree paid 1,000
fsyncs and 1,000 transactions, and its receiving threads queued on the replica's lock for
them. Here a thread that has a file ready joins the group being formed; the first to find
no flush under way flushes everything waiting (one `sync_all`, the renames, one index
transaction) while the others wait for their result; whoever arrives meanwhile is in the
next flush. A file alone costs what it did; under concurrency the cost is shared.

The guarantee is the batch path's: every file of a flush is durable (data and metadata)
before any of them is renamed into place, so a crash leaves each path with its old file
or its new one, never a mix.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Protocol

from rdc.content.signature import FileSignature
from rdc.local.fs import Expect, SafeRoot, TempFile, sync_all


class _Target(Protocol):
    fs: SafeRoot

    def install(self, temp: TempFile, path: str, expect: Expect | None) -> os.stat_result: ...

    def record_many(self, files: list[tuple[str, os.stat_result, FileSignature]]) -> None: ...


@dataclass
class _Item:
    temp: TempFile
    path: str
    expect: Expect | None
    signature: FileSignature
    done: bool = False
    stat: os.stat_result | None = None
    error: BaseException | None = None


class GroupCommit:
    """Commits of one replica's received files, grouped (see the module's text)."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._cond = threading.Condition()
        self._waiting: list[_Item] = []
        self._flushing = False

    def commit(
        self, temp: TempFile, path: str, mode: int, mtime_ns: int, expect: Expect | None,
        signature: FileSignature,
    ) -> os.stat_result:
        """Give ``temp`` its mode and time, then make it durable with the others waiting,
        rename it over ``path`` if ``expect`` still holds there, and record ``signature``
        for it; its final stat, or the error of its own install (ConflictError, OSError)."""
        temp.prepare(mode, mtime_ns)
        item = _Item(temp, path, expect, signature)
        with self._cond:
            self._waiting.append(item)
            while not item.done:
                if self._flushing:
                    self._cond.wait()
                    continue
                group, self._waiting = self._waiting, []
                self._flushing = True
                self._cond.release()
                try:
                    self._flush(group)
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error
        assert item.stat is not None
        return item.stat

    def _flush(self, group: list[_Item]) -> None:
        try:
            sync_all(self.target.fs, [item.temp for item in group])
        except BaseException as exc:  # nothing installed: each fails, its old file stays
            for item in group:
                item.error, item.done = exc, True
            return
        recorded = []
        for item in group:
            try:
                item.stat = self.target.install(item.temp, item.path, item.expect)
                recorded.append((item.path, item.stat, item.signature))
            except BaseException as exc:
                item.error = exc
        try:
            self.target.record_many(recorded)
        except BaseException as exc:  # installed, but the index does not know: it reads
            for item in group:  # them again at the next scan; say so to each
                if item.error is None:
                    item.error = exc
        finally:
            for item in group:
                item.done = True
