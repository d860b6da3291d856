"""The storage contract: `Store`, the one interface every backend implements.

A store is a flat set of named, immutable-in-place objects (a repository's packs, indexes,
snapshot records and locks). The public methods below state the contract and check their
arguments; a backend implements the underscored hooks. docs/storage.md is the prose form.
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

from rdc.storage.errors import ObjectNotFound, ShortObject

Data: TypeAlias = bytes | bytearray | memoryview

# Object names: lowercase, so that they mean the same on case-insensitive file systems; no
# segment starts with a dot, which keeps '.', '..' and every backend's temporaries
# (".tmp-...") out of the namespace; short enough for any file system and any S3 key.
SEGMENT = re.compile(r"[a-z0-9_-][a-z0-9._-]{0,127}")
MAX_NAME = 512


def check_name(name: str) -> str:
    """`name` if it is a valid object name, else ValueError (a caller's bug, not I/O)."""
    if not isinstance(name, str):
        raise ValueError(f"an object name is a str, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"object name of {len(name)} characters: 1 to {MAX_NAME} allowed")
    for segment in name.split("/"):
        if not SEGMENT.fullmatch(segment):
            raise ValueError(
                f"invalid object name {name!r}: each '/'-separated part is 1-128 of "
                "a-z 0-9 . _ - and does not start with '.'"
            )
    return name


def is_name(name: str) -> bool:
    """Whether `name` is a valid object name (listings skip keys that are not)."""
    return 0 < len(name) <= MAX_NAME and all(SEGMENT.fullmatch(s) for s in name.split("/"))


def check_prefix(prefix: str) -> str:
    """`prefix` if it is "" or a valid name (a directory of names), else ValueError."""
    return prefix if prefix == "" else check_name(prefix)


@dataclass(frozen=True)
class ObjectInfo:
    """One listed or stat-ed object: its name and its size in bytes."""

    name: str
    size: int


@dataclass(frozen=True)
class Capabilities:
    """Where backends differ.

    exclusive_create: `put(..., exclusive=True)` is atomic: of several callers creating
        one name at once, on any hosts, exactly one succeeds. A store without it refuses
        exclusive puts (NotImplementedError); lock with another scheme there.
    connections: how many calls at once suit the store (a good `workers` for
        `map_parallel`); more is allowed, and only costs memory and politeness.
    """

    exclusive_create: bool
    connections: int


class Store(abc.ABC):
    """A set of named objects with whole-object writes: the storage contract.

    Names are '/'-separated paths of lowercase segments (`check_name`); the caller must not
    store both `a` and `a/b` (a name that is also a directory of other names): a backend
    may refuse it (the local one does, with StoreError).

    Every call blocks and is thread-safe: call it from worker threads (under trio,
    `trio.to_thread.run_sync`), as many at once as you like; `map_parallel` runs N at a
    time. A call that the caller abandons (a cancelled trio task) still finishes in its
    thread, and by the guarantees below it leaves the object absent, old or whole.

    Errors: a missing object is always `ObjectNotFound`, whatever the backend. Transient
    failures (throttling: HTTP 503 SlowDown and 429; other 5xx; refused, reset or timed
    out connections) are retried inside the backend, with exponential backoff and jitter
    and a bounded total time; what still fails is `StoreUnavailable`. Permanent failures
    are not retried: `StoreAccessDenied` (credentials, permissions), `StoreMissing` (no
    such directory or bucket), `ShortObject`, and `StoreError` for the rest. All are
    `RdcError`s with an exit code. A bad name or argument is a `ValueError`, raised before
    any I/O. Every call may be retried by the caller: reads and deletes are idempotent,
    and a repeated put stores the same object again.
    """

    #: Where the store is, for messages: a path or a URL without credentials.
    location: str

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this store guarantees beyond the contract (may do I/O the first time)."""

    def put(self, name: str, data: Data, *, exclusive: bool = False) -> None:
        """Store `data` as object `name`, replacing any object of that name.

        Atomic: until the call returns, readers and listings see the old object (or none);
        afterwards, the new one, whole. A put that fails or is interrupted at any point, by
        an error or a crash of this process or of the store, leaves the old object or none,
        never part of the new one (a stray temporary, invisible to this interface, may be
        left behind). Of concurrent puts of one name, one wins whole. When the call
        returns, the object is durable (fsynced, or acknowledged by the server).

        With `exclusive`, the put fails with `ObjectExists` if `name` exists, atomically
        with respect to other exclusive puts (see `Capabilities.exclusive_create`): the
        building block of lock objects.
        """
        check_name(name)
        if exclusive and not self.capabilities.exclusive_create:
            raise NotImplementedError(f"{self.location}: no atomic exclusive create")
        self._put(name, memoryview(data).cast("B"), exclusive)

    def put_file(self, name: str, path: str | os.PathLike[str]) -> None:
        """Store the content of the local file `path` as object `name`: as `put`, for data
        too large to hold in memory twice (packs being assembled on disk). The file must
        exist (else FileNotFoundError, before the store is touched) and must not change
        during the call."""
        check_name(name)
        self._put_file(name, os.fspath(path))

    def get(self, name: str) -> bytes:
        """The whole content of object `name`, or `ObjectNotFound`."""
        return self._get(check_name(name))

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        """Exactly `length` bytes of object `name` starting at byte `offset`.

        `ObjectNotFound` if the object is missing; `ShortObject` if it ends before
        `offset + length` (a range is never silently cut short). `offset >= 0` and
        `length >= 1`, else ValueError.
        """
        check_name(name)
        if offset < 0 or length < 1:
            raise ValueError(f"range of {length} bytes at {offset}: need offset >= 0, length >= 1")
        data = self._get_range(name, offset, length)
        if len(data) != length:
            raise ShortObject(location=self.location, name=name, offset=offset, length=length)
        return data

    def stat(self, name: str) -> ObjectInfo:
        """Name and size of object `name`, or `ObjectNotFound`."""
        return self._stat(check_name(name))

    def exists(self, name: str) -> bool:
        """Whether object `name` exists (a stat that answers False for `ObjectNotFound`)."""
        try:
            self.stat(name)
        except ObjectNotFound:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose name is under the directory `prefix` ("" for all): `data`
        lists `data/ab/x` but neither `data` itself nor `database/y`.

        In no particular order (backends differ). An object that exists for the whole
        listing is listed exactly once, with its size; one put or deleted meanwhile may
        or may not be. A prefix that names nothing lists nothing. Objects are fetched
        page by page as the iterator advances, so errors can come from `next()`.
        """
        return self._list(check_prefix(prefix))

    def delete(self, name: str) -> None:
        """Remove object `name`. Deleting a missing object is not an error (so a retried
        delete whose first attempt went through succeeds). Afterwards `get`, `stat` and
        `list` no longer see it."""
        self._delete(check_name(name))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.location}>"

    # ------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _put(self, name: str, data: memoryview, exclusive: bool) -> None: ...

    def _put_file(self, name: str, path: str) -> None:
        with open(path, "rb") as f:
            self._put(name, memoryview(f.read()), False)

    @abc.abstractmethod
    def _get(self, name: str) -> bytes: ...

    @abc.abstractmethod
    def _get_range(self, name: str, offset: int, length: int) -> bytes:
        """At most `length` bytes at `offset`; fewer (or none) where the object ends."""

    @abc.abstractmethod
    def _stat(self, name: str) -> ObjectInfo: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> Iterator[ObjectInfo]: ...

    @abc.abstractmethod
    def _delete(self, name: str) -> None: ...
