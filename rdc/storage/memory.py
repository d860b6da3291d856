"""`MemoryStore`: the contract in a dict, for tests and for code that wants a scratch store."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from rdc.storage.base import Capabilities, ObjectInfo, Store
from rdc.storage.errors import ObjectExists, ObjectNotFound


class MemoryStore(Store):
    """Objects held in memory by one process; gone when it ends. One lock guards the dict,
    and an object is stored as an immutable `bytes`, so every call is atomic."""

    def __init__(self, location: str = "memory:") -> None:
        self.location = location
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(exclusive_create=True, connections=4)

    def _put(self, name: str, data: memoryview, exclusive: bool) -> None:
        content = bytes(data)
        with self._lock:
            if exclusive and name in self._objects:
                raise ObjectExists(location=self.location, name=name)
            self._objects[name] = content

    def _content(self, name: str) -> bytes:
        with self._lock:
            content = self._objects.get(name)
        if content is None:
            raise ObjectNotFound(location=self.location, name=name)
        return content

    def _get(self, name: str) -> bytes:
        return self._content(name)

    def _get_range(self, name: str, offset: int, length: int) -> bytes:
        return self._content(name)[offset : offset + length]

    def _stat(self, name: str) -> ObjectInfo:
        return ObjectInfo(name, len(self._content(name)))

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        start = prefix + "/" if prefix else ""
        with self._lock:
            found = [ObjectInfo(n, len(c)) for n, c in self._objects.items() if n.startswith(start)]
        return iter(found)

    def _delete(self, name: str) -> None:
        with self._lock:
            self._objects.pop(name, None)
