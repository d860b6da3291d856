"""`RemoteStore`: a repository that ``rdc serve`` exports (``rdc://HOST[:PORT]/NAME``), as a
`Store` whose every call travels over one authenticated rdc connection and is performed by
the server on the repository's own store (docs/protocol.md section 3b).

The Store API blocks and the connection is trio's: a thread of its own runs a trio loop
that holds the connection, and each call (from any thread, many at once) runs there as a
task of its own with `trio.from_thread.run`, one conversation per call. Dedup stays on
the client (the repository index is cached locally), so only new packs travel.

It lives here, not in rdc.storage, because it needs the connection set-up (token, TLS,
handshake) of the client; rdc.storage depends on nothing but itself.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import trio

from rdc.errors import ConnectionFailed, ProtocolError, RdcError, RemoteError, UsageError
from rdc.storage import (
    Capabilities,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreUnavailable,
)
from rdc.wire import messages as m
from rdc.wire.codec import MAX_PIECE
from rdc.wire.frames import ConnectionClosed
from rdc_client.remote import CONNECT_SECONDS, RemoteURL, open_connection, parse_url

T = TypeVar("T")
CALLS_AT_ONCE = 64  # conversations of store calls open at once (the server allows 256)
GRANT = 1 << 20  # data taken before a ``more`` tells the server
# The largest object a get takes: more than a put may store (objects written to the store
# directly, such as an old prune's index objects), but not without end.
MAX_GET = 1 << 30


def parse_repo_url(text: str) -> RemoteURL:
    """``rdc://HOST[:PORT]/NAME``: a repository has a name, not a path inside it."""
    url = parse_url(text)
    if url.path:
        raise UsageError(message=f"{text}: a repository URL is rdc://HOST[:PORT]/NAME, "
                         "with nothing after the name")
    return url


class RemoteStore(Store):
    """The store of repository ``url.share`` on an ``rdc serve``; `close` it when done."""

    def __init__(self, url: RemoteURL, token: str, tls: ssl.SSLContext | None = None,
                 compress: bool = True) -> None:
        self.url = url
        self.location = str(url)
        self._token, self._tls, self._compress = token, tls, compress
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._counted: Any = None
        self._connection: Any = None
        self._limit: trio.Semaphore | None = None
        self.opened: m.RepoOpened | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True,
                                        name=f"rdc-repo {url.host}:{url.port}")
        self._thread.start()
        if not self._ready.wait(3 * CONNECT_SECONDS + 10):
            raise StoreUnavailable(location=self.location, message="no answer from the server")
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self._thread.join()
            raise failure

    # ------------------------------------------------------------ the connection's thread

    async def _main(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._limit = trio.Semaphore(CALLS_AT_ONCE)
        try:
            async with open_connection(self.url, self._token, self._tls,
                                       compress=self._compress) as (connection, counted):
                self._connection, self._counted = connection, counted
                conversation = connection.start(m.RepoOpen(name=self.url.share))
                try:
                    self.opened = await conversation.receive(m.RepoOpened)
                except RemoteError as exc:
                    if exc.code == "repo":
                        raise StoreMissing(location=self.location,
                                           message=f"the server exports {exc}") from None
                    raise self._error(exc, "") from None
                finally:
                    conversation.close()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # handed to the thread that waits in __init__
            if not self._ready.is_set():
                self._failure = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._ready.set()

    def close(self) -> None:
        """End the connection (idempotent); calls after it fail with StoreUnavailable."""
        if self._thread.is_alive() and self._trio_token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._trio_token)
        self._thread.join(CONNECT_SECONDS)

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wire_bytes(self) -> tuple[int, int]:
        """Bytes sent and received on the connection so far (after TLS, before TCP)."""
        counted = self._counted
        return (counted.bytes_sent, counted.bytes_received) if counted else (0, 0)

    def _run(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``call`` in the connection's loop and wait for it (from any other thread)."""
        if self._trio_token is None:
            raise StoreUnavailable(location=self.location, message="not connected")
        try:
            return trio.from_thread.run(self._guarded, call, *args,
                                        trio_token=self._trio_token)
        except trio.RunFinishedError:
            raise StoreUnavailable(location=self.location,
                                   message="the connection is closed") from None

    async def _guarded(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        name = args[0] if args and isinstance(args[0], str) else ""
        if self._connection is None or self._stop is None or self._stop.is_set():
            raise StoreUnavailable(location=self.location, message="the connection is closed")
        assert self._limit is not None
        async with self._limit:
            try:
                return await call(*args)
            except RemoteError as exc:
                raise self._error(exc, name) from None
            except (ConnectionClosed, ProtocolError, ConnectionFailed, trio.BrokenResourceError,
                    trio.ClosedResourceError) as exc:
                why = str(exc) or "the server closed it (did it stop or restart?)"
                raise StoreUnavailable(location=self.location,
                                       message=f"connection lost: {why}") from None

    def _error(self, exc: RemoteError, name: str) -> RdcError:
        """The contract's error for the server's refusal."""
        where = self.location
        if exc.code == "missing":
            return ObjectNotFound(location=where, name=name or str(exc))
        if exc.code == "exists":
            return ObjectExists(location=where, name=name or str(exc))
        if exc.code in ("readonly", "denied", "auth", "share", "repo"):
            return StoreAccessDenied(location=where, message=str(exc))
        if exc.code == "unavailable":
            return StoreUnavailable(location=where, message=str(exc))
        if exc.code == "name":  # check_name passed here: the server's rules differ
            return StoreError(location=where, message=f"the server refused a name: {exc}")
        return StoreError(location=where, message=str(exc))

    # ------------------------------------------------------------ calls, in the loop

    async def _call_put(self, name: str, data: memoryview, exclusive: bool) -> None:
        conversation = self._connection.start(
            m.StorePut(name=name, size=len(data), exclusive=exclusive))
        try:
            credit = m.WINDOW
            offsets = range(0, len(data), MAX_PIECE) if len(data) else [0]
            for offset in offsets:
                piece = data[offset : offset + MAX_PIECE]
                while credit < len(piece):
                    credit += (await conversation.receive(m.More)).n
                credit -= len(piece)
                await conversation.send_data(
                    m.Data(d=[bytes(piece)], end=offset + MAX_PIECE >= len(data)))
            while not isinstance(await conversation.receive(m.More, m.Ok), m.Ok):
                pass
        finally:
            conversation.close()

    async def _receive_object(self, request: m.Message, limit: int) -> bytes:
        conversation = self._connection.start(request)
        try:
            parts: list[bytes] = []
            size = ungranted = 0
            while True:
                message = await conversation.receive(m.Data)
                for piece in message.d:
                    parts.append(piece)
                    size += len(piece)
                    ungranted += len(piece)
                if size > limit:
                    raise ProtocolError(message=f"more than the {limit} bytes asked for")
                if message.end:
                    return b"".join(parts)
                if ungranted >= GRANT:
                    conversation.send(m.More(n=ungranted))
                    ungranted = 0
        finally:
            conversation.close()

    async def _request(self, request: m.Message, *answers: type[m.Message]) -> list[m.Message]:
        """Send a request; its answers (``objects`` messages until one has ``more`` false,
        or one ``ok``)."""
        conversation = self._connection.start(request)
        try:
            out = []
            while True:
                message = await conversation.receive(*answers)
                out.append(message)
                if not getattr(message, "more", False):
                    return out
        finally:
            conversation.close()

    @property
    def writable(self) -> bool:
        """Whether the server lets this token put and delete."""
        return self.opened is not None and self.opened.writable

    # ------------------------------------------------------------ the Store hooks

    @property
    def capabilities(self) -> Capabilities:
        assert self.opened is not None
        return Capabilities(exclusive_create=self.opened.exclusive,
                            connections=max(self.opened.connections, 8))

    def _put(self, name: str, data: memoryview, exclusive: bool) -> None:
        assert self.opened is not None
        if len(data) > self.opened.max_object:
            raise StoreError(location=self.location, message=(
                f"cannot store {name}: {len(data):,} bytes; the server takes objects of at "
                f"most {self.opened.max_object:,}"))
        self._run(self._call_put, name, data, exclusive)

    def _get(self, name: str) -> bytes:
        return self._run(lambda n: self._receive_object(m.StoreGet(name=n), MAX_GET), name)

    def _get_range(self, name: str, offset: int, length: int) -> bytes:
        return self._run(self._call_range, name, offset, length)

    async def _call_range(self, name: str, offset: int, length: int) -> bytes:
        try:
            return await self._receive_object(
                m.StoreRange(name=name, offset=offset, length=length), length)
        except RemoteError as exc:
            if exc.code == "short":
                return b""  # Store.get_range raises ShortObject for it
            raise

    def _stat(self, name: str) -> ObjectInfo:
        answers = self._run(lambda n: self._request(m.StoreStat(name=n), m.Objects), name)
        objects = answers[0].objects  # type: ignore[attr-defined]
        if len(objects) != 1 or objects[0][0] != name:
            raise StoreError(location=self.location, message=f"stat {name}: a wrong answer")
        return ObjectInfo(*objects[0])

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        answers = self._run(lambda p: self._request(m.StoreList(prefix=p), m.Objects),
                            prefix)
        for answer in answers:
            for name, size in answer.objects:  # type: ignore[attr-defined]
                yield ObjectInfo(name, size)

    def _delete(self, name: str) -> None:
        self._run(lambda n: self._request(m.StoreDelete(name=n), m.Ok), name)


def open_remote_store(text: str, token: str, tls: ssl.SSLContext | None = None,
                      compress: bool = True) -> RemoteStore:
    """The store of the repository at ``rdc://HOST[:PORT]/NAME``."""
    return RemoteStore(parse_repo_url(text), token, tls, compress)
