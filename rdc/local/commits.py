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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from rdc.content.signature import FileSignature
from rdc.local.fs import Expect, SafeRoot, TempFile, sync_all


class _Target(Protocol):
    fs: SafeRoot

    def install(self, temp: TempFile, path: str, expect: Expect | None) -> os.stat_result: ...

    def record_many(self, files: list[tuple[str, os.stat_result, FileSignature]]) -> None: ...


_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class _Slot:
    value: Any
    done: bool = False
    result: Any = None


class Gathered(Generic[_T, _R]):
    """Work handed in by many threads one item at a time, done for all waiting at once:
    the first thread to find no flush under way flushes everything waiting while the
    others wait for their results; whoever arrives meanwhile is in the next flush.
    ``flush`` takes the items in the order they came and gives each its result, or the
    error to raise in its thread; an error of its own is every item's."""

    def __init__(self, flush: Callable[[list[_T]], list[_R | BaseException]]) -> None:
        self._flush = flush
        self._cond = threading.Condition()
        self._waiting: list[_Slot] = []
        self._flushing = False

    def join(self, value: _T) -> _R:
        """``value``'s result, once a flush that held it is done (or its error raised)."""
        slot = _Slot(value)
        with self._cond:
            self._waiting.append(slot)
            while not slot.done:
                if self._flushing:
                    self._cond.wait()
                    continue
                group, self._waiting = self._waiting, []
                self._flushing = True
                self._cond.release()
                try:
                    self._run(group)
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self._cond.notify_all()
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result

    def _run(self, group: list[_Slot]) -> None:
        try:
            results: list[Any] = self._flush([slot.value for slot in group])
            if len(results) != len(group):
                raise AssertionError(f"{len(results)} results for {len(group)} items")
        except BaseException as exc:
            results = [exc] * len(group)
        for slot, result in zip(group, results, strict=True):
            slot.result, slot.done = result, True


@dataclass
class _Item:
    temp: TempFile
    path: str
    expect: Expect | None
    signature: FileSignature


class GroupCommit:
    """Commits of one replica's received files, grouped (see the module's text)."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._group: Gathered[_Item, os.stat_result] = Gathered(self._flush)

    def commit(
        self, temp: TempFile, path: str, mode: int, mtime_ns: int, expect: Expect | None,
        signature: FileSignature,
    ) -> os.stat_result:
        """Give ``temp`` its mode and time, then make it durable with the others waiting,
        rename it over ``path`` if ``expect`` still holds there, and record ``signature``
        for it; its final stat, or the error of its own install (ConflictError, OSError)."""
        temp.prepare(mode, mtime_ns)
        return self._group.join(_Item(temp, path, expect, signature))

    def _flush(self, group: list[_Item]) -> list[os.stat_result | BaseException]:
        # (an error of sync_all: nothing installed, each fails, its old file stays)
        sync_all(self.target.fs, [item.temp for item in group])
        out: list[os.stat_result | BaseException] = []
        recorded = []
        for item in group:
            try:
                st = self.target.install(item.temp, item.path, item.expect)
                recorded.append((item.path, st, item.signature))
                out.append(st)
            except BaseException as exc:
                out.append(exc)
        try:
            self.target.record_many(recorded)
        except BaseException as exc:  # installed, but the index does not know: it reads
            # them again at the next scan; say so to each
            out = [exc if not isinstance(result, BaseException) else result
                   for result in out]
        return out
