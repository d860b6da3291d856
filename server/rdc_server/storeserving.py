"""The server's side of a repository connection: after ``repo``, each ``store`` request is
one call of the Store contract on the exported repository's store (docs/protocol.md
section 3b).

The client is not trusted: every object name is checked with `check_name` before the
store sees it (so no name leaves the repository: no ``..``, no absolute path, no
temporaries), a put is bounded by MAX_OBJECT, and a read-only token cannot put or delete.
A connection serves shares or a repository, not both.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rdc.errors import ProtocolError, Refusal
from rdc.storage import (
    ObjectExists,
    ObjectNotFound,
    ShortObject,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    check_name,
)
from rdc.storage.base import check_prefix
from rdc.wire import messages as m
from rdc.wire.codec import MAX_ITEMS, MAX_PIECE
from rdc.wire.connection import Conversation
from rdc_server.repos import ClientRepos, OpenedRepo

log = logging.getLogger("rdc.serve")
# The largest object a put stores: a pack closes at 16 MiB (rdc.repo.packs.PACK_SIZE); the
# rest is room for its last record and trailer, and for index objects. A put is held in
# memory until it is whole, so this also bounds what one conversation costs the server.
MAX_OBJECT = 64 << 20
GRANT = 1 << 20  # data taken before a ``more`` tells the sender
LIST_BATCH = 1024  # objects per ``objects`` message of a listing

Handler = Callable[[Conversation, m.Message], Awaitable[None]]


def _refusal(exc: StoreError) -> Refusal:
    """The wire error for a store's failure (the client raises the same class again)."""
    if isinstance(exc, ObjectNotFound):
        return Refusal("missing", message=exc.name)
    if isinstance(exc, ObjectExists):
        return Refusal("exists", message=exc.name)
    if isinstance(exc, ShortObject):
        return Refusal("short", message=str(exc))
    if isinstance(exc, StoreAccessDenied):
        return Refusal("denied", message=str(exc))
    if isinstance(exc, StoreUnavailable):
        return Refusal("unavailable", message=str(exc))
    return Refusal("io", message=str(exc))


def _name(name: str, prefix: bool = False) -> str:
    try:
        return check_prefix(name) if prefix else check_name(name)
    except ValueError as exc:
        raise Refusal("name", message=str(exc)) from None


class RepoSession:
    """One connection's repository (nothing before ``repo``)."""

    def __init__(self, repos: ClientRepos, peer: str = "?") -> None:
        self.repos = repos
        self.peer = peer
        self.opened: OpenedRepo | None = None
        self._opening = False
        self.kind: str | None = None  # "share" or "repo", by the first request

    def route(self, shares: Handler) -> Handler:
        """The connection's handler: repository requests here, the others to ``shares``
        (the share session); the first request decides which the connection is for."""

        async def handle(conversation: Conversation, message: m.Message) -> None:
            kind = "repo" if isinstance(message, m.RepoOpen | m.StoreCall) else "share"
            if self.kind is None:
                self.kind = kind
            elif self.kind != kind:
                raise ProtocolError(message=f"{message.TYPE!r} on a connection for a {self.kind}")
            if kind == "share":
                await shares(conversation, message)
            else:
                await self.handle(conversation, message)

        return handle

    async def handle(self, conversation: Conversation, message: m.Message) -> None:
        if isinstance(message, m.RepoOpen):
            if self._opening:
                raise ProtocolError(message="repo twice on one connection")
            self._opening = True
            self.opened = await self.repos.open(message.name)
            log.info("%s opened repository %s (%s)", self.peer, message.name,
                     "read-write" if self.opened.writable else "read-only")
            caps = self.opened.store.capabilities
            conversation.send(m.RepoOpened(
                writable=self.opened.writable, max_object=MAX_OBJECT,
                exclusive=caps.exclusive_create, connections=caps.connections))
            return
        if self.opened is None:
            raise ProtocolError(message=f"{message.TYPE!r} before repo")
        handler = self.handlers()[type(message)]
        try:
            await handler(conversation, message)
        except StoreError as exc:
            raise _refusal(exc) from None

    def handlers(self) -> dict[type[m.Message], Callable[[Conversation, Any], Awaitable[None]]]:
        return {m.StorePut: self._put, m.StoreGet: self._get, m.StoreRange: self._range,
                m.StoreStat: self._stat, m.StoreList: self._list, m.StoreDelete: self._delete}

    def _writable(self) -> OpenedRepo:
        assert self.opened is not None
        if not self.opened.writable:
            raise Refusal("readonly", message=f"repository {self.opened.name!r} is read-only "
                          "for this token")
        return self.opened

    async def _put(self, conversation: Conversation, message: m.StorePut) -> None:
        opened = self._writable()
        name = _name(message.name)
        if message.size > MAX_OBJECT:
            raise Refusal("size", message=f"{name}: {message.size:,} bytes; a repository "
                          f"served over the network takes objects of at most {MAX_OBJECT:,}")
        data = bytearray()
        ungranted = 0
        while True:
            part = await conversation.receive(m.Data)
            for piece in part.d:
                data += piece
                ungranted += len(piece)
            if len(data) > message.size:
                raise ProtocolError(message=f"put {name}: more than the {message.size} bytes "
                                    "announced")
            if part.end:
                break
            if ungranted >= GRANT:
                conversation.send(m.More(n=ungranted))
                ungranted = 0
        if len(data) != message.size:
            raise ProtocolError(message=f"put {name}: {len(data)} bytes, {message.size} "
                                "announced")
        await trio.to_thread.run_sync(
            lambda: opened.store.put(name, data, exclusive=message.exclusive))
        conversation.send(m.Ok())

    async def _get(self, conversation: Conversation, message: m.StoreGet) -> None:
        assert self.opened is not None
        name = _name(message.name)
        data = await trio.to_thread.run_sync(self.opened.store.get, name)
        await _send_object(conversation, data)

    async def _range(self, conversation: Conversation, message: m.StoreRange) -> None:
        assert self.opened is not None
        name = _name(message.name)
        if message.length > MAX_OBJECT:
            raise Refusal("size", message=f"{name}: a read of at most {MAX_OBJECT:,} bytes")
        data = await trio.to_thread.run_sync(
            self.opened.store.get_range, name, message.offset, message.length)
        await _send_object(conversation, data)

    async def _stat(self, conversation: Conversation, message: m.StoreStat) -> None:
        assert self.opened is not None
        info = await trio.to_thread.run_sync(self.opened.store.stat, _name(message.name))
        conversation.send(m.Objects(objects=[(info.name, info.size)]))

    async def _list(self, conversation: Conversation, message: m.StoreList) -> None:
        assert self.opened is not None
        prefix = _name(message.prefix, prefix=True)
        store = self.opened.store
        found = await trio.to_thread.run_sync(
            lambda: [(i.name, i.size) for i in store.list(prefix)])
        batch = min(LIST_BATCH, MAX_ITEMS)
        for start in range(0, max(len(found), 1), batch):
            await conversation.send_data(m.Objects(objects=found[start : start + batch],
                                                   more=start + batch < len(found)))

    async def _delete(self, conversation: Conversation, message: m.StoreDelete) -> None:
        opened = self._writable()
        await trio.to_thread.run_sync(opened.store.delete, _name(message.name))
        conversation.send(m.Ok())


async def _send_object(conversation: Conversation, data: bytes) -> None:
    """``data`` as ``data`` messages of one piece each, at most WINDOW bytes ahead of what
    the client granted with ``more``."""
    view = memoryview(data)
    credit = m.WINDOW
    offsets = range(0, len(view), MAX_PIECE) if view else [0]
    for offset in offsets:
        piece = view[offset : offset + MAX_PIECE]
        while credit < len(piece):
            credit += (await conversation.receive(m.More)).n
        credit -= len(piece)
        await conversation.send_data(
            m.Data(d=[bytes(piece)], end=offset + MAX_PIECE >= len(view)))
