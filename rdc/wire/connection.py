"""Conversations over one connection (docs/protocol.md section 3).

A `Connection` runs two tasks: a writer that batches every queued message into as few
frames as possible, and a reader that decodes each incoming message (`messages.decode`
checks every field) and hands it to its conversation. Sending never blocks on the peer,
except `send_data`, which waits while too much is queued: so a reader is never stuck
behind a slow consumer and the two sides cannot deadlock each other.

Memory stays bounded by the work in flight: each side asks for bounded amounts, a
conversation may hold only so much unread input (more than was asked for is a protocol
error, and so is any input to a conversation that takes none), and the reader stops
reading the socket while the unread input of all conversations together is over
PAUSE_BYTES, until their handlers have taken some (every handler takes its input without
waiting for the reader, so this never deadlocks; the peer just sees TCP back-pressure),
and while its queued output is over OUTPUT_PAUSE, until the peer has read some. Sizes are
exact: a message is packed when it is queued, and an incoming one weighs the bytes it took
in its frame.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import trio

from rdc.errors import NoSpace, ProtocolError, Refusal, RemoteError
from rdc.wire import messages as m
from rdc.wire.codec import pack
from rdc.wire.failures import reason
from rdc.wire.frames import ConnectionClosed, FrameStream

log = logging.getLogger("rdc.wire.connection")

MAX_CONVERSATIONS = 256
PENDING_MESSAGES = 1024
# Unread input one conversation may hold: the most a side asks for at once is 4 MiB of data
# (one fetch, or the source's credit for a whole file), plus framing.
PENDING_BYTES = 8 << 20
# Unread input of all conversations of a connection above which the reader stops reading.
PAUSE_BYTES = 8 << 20
# Scheduler passes the writer gives other tasks to add to a frame, until two add nothing.
SETTLE_PASSES = 8
HIGH_WATER = 8 << 20  # queued outgoing bytes above which data senders wait
OUTPUT_PAUSE = 2 * HIGH_WATER  # ... and above which the reader stops taking requests
BATCH_BYTES = 2 << 20  # what the writer gathers into one batch before it sends
# Seconds a side that ends the connection with an error waits to send it, and a server
# then goes on reading (and dropping) what the client sends, so that the client reads the
# error before the connection closes.
LINGER_SECONDS = 10
M = TypeVar("M", bound=m.Message)
Handler = Callable[["Conversation", m.Message], Awaitable[None]]


class Conversation:
    """One request and everything exchanged for it. ``receive`` raises `RemoteError` when
    the peer ends the conversation with ``error``."""

    def __init__(
        self, connection: Connection, conversation_id: int, takes_input: bool = True
    ) -> None:
        self.connection = connection
        self.id = conversation_id
        self.takes_input = takes_input
        self._inbox_send, self._inbox = trio.open_memory_channel[tuple[m.Message, int]](
            math.inf
        )
        self.pending_messages = 0
        self.pending_bytes = 0

    def send(self, message: m.Message) -> None:
        """Queue a message (never blocks)."""
        self.connection.post(message, self.id)

    def send_last(self, message: m.Message) -> None:
        """Queue a conversation's final message if the connection still stands: what it
        reports is already done, so a connection lost meanwhile is not this work's
        failure (the peer learns of the loss anyway)."""
        if self.connection.failure is None:
            self.send(message)

    async def send_data(self, message: m.Message) -> None:
        """Queue a message once the outgoing queue has room: the one place where a bulk
        sender waits for the peer to read."""
        await self.connection.wait_for_room()
        self.send(message)

    async def receive(self, *expected: type[M]) -> M:
        """The next message, which must be of one of the ``expected`` types."""
        try:
            message, size = await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise self.connection.failure or ConnectionClosed("connection closed") from None
        self.pending_messages -= 1
        self.pending_bytes -= size
        self.connection._taken(size)
        if isinstance(message, m.Error):
            raise RemoteError(code=message.code, message=message.msg or message.code)
        if expected and not isinstance(message, expected):
            names = " or ".join(t.TYPE for t in expected)
            raise ProtocolError(
                message=f"expected {names} in conversation {self.id}, got {message.TYPE!r}"
            )
        return message  # type: ignore[return-value]

    def refuse(self, code: str, msg: str) -> None:
        """End the conversation with an error (the connection goes on)."""
        self.connection.post(m.Error(code=code, msg=msg), self.id)
        self.close()

    def close(self) -> None:
        """End the conversation here; input that arrives for it later is dropped, and so
        is what it did not read."""
        self.connection._conversations.pop(self.id, None)
        while self.pending_messages > 0:
            try:
                self._inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            self.pending_messages -= 1
        self.pending_messages = 0
        if self.pending_bytes:
            self.connection._taken(self.pending_bytes)
            self.pending_bytes = 0

    def _deliver(self, message: m.Message, size: int) -> None:
        if not self.takes_input:
            raise ProtocolError(
                message=f"conversation {self.id} takes no further messages, got {message.TYPE!r}"
            )
        self.pending_messages += 1
        self.pending_bytes += size
        if self.pending_messages > PENDING_MESSAGES or self.pending_bytes > PENDING_BYTES:
            raise ProtocolError(message=f"conversation {self.id}: more unread input than asked for")
        self.connection._pending_input += size
        self._inbox_send.send_nowait((message, size))


class Connection:
    """Both directions of one connection. The client starts conversations; the server
    passes each new one to ``handler`` (run concurrently). Use as::

        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)
            ...
            await connection.close()

    If ``run`` ends (peer closed, protocol error), every conversation still waiting gets
    `ConnectionClosed` or the error; cancellation leaves the stream closed."""

    def __init__(
        self, frames: FrameStream, *, handler: Handler | None = None, idle_timeout: float = 600,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        """``idle_timeout``: seconds without a word from the peer after which the
        connection fails, while a conversation waits for it; a server (``handler`` given)
        also ends a connection that was silent that long with nothing open (every peer
        pings while it is quiet). ``on_end``: a server's release of what its handlers
        held, called once they have all ended, before it lingers (`linger`) for the
        client to read an error: so that a client which never closes holds a socket
        for that time, not a session."""
        self.frames = frames
        self.handler = handler
        self.on_end = on_end
        self.idle_timeout = idle_timeout
        self._conversations: dict[int, Conversation] = {}
        self._out_send, self._out = trio.open_memory_channel[bytes](math.inf)
        self._queued_bytes = 0
        self._room = trio.Condition()
        self._pending_input = 0  # unread input of all conversations
        self._drained = trio.Event()
        self._next_id = 1
        self._highest_seen = 0
        self._failure: BaseException | None = None
        self._closing = False
        self._told = False  # an error that ends the connection was sent to the peer
        # The writer and a final error must not send at once (trio refuses concurrent
        # send_all, and a frame must not be cut by another).
        self._send_lock = trio.Lock()

    # ------------------------------------------------------------ sending

    def post(self, message: m.Message, conversation: int | None = None) -> None:
        """Queue ``message`` (of ``conversation``, if it belongs to one), packed now."""
        if self._failure is not None:
            raise self._failure
        packed = pack(m.encode(message, conversation))
        self._queued_bytes += len(packed)
        self._out_send.send_nowait(packed)

    async def wait_for_room(self) -> None:
        async with self._room:
            while self._queued_bytes > HIGH_WATER and self._failure is None:
                await self._room.wait()
        if self._failure is not None:
            raise self._failure

    async def _writer(self) -> None:
        while True:
            # Quiet for a while (a long scan or signing on this side): a ping tells the peer
            # that this side is alive, so its idle timeout does not end the connection.
            with trio.move_on_after(self.idle_timeout / 4) as quiet:
                first = await self._out.receive()
            if quiet.cancelled_caught:
                async with self._send_lock:
                    await self.frames.send([m.encode(m.Ping())])
                continue
            # Scheduler passes first, while they bring more: the conversations woken by the
            # same event (a frame just read) queue their answers, and one frame carries
            # them all (fewer, larger frames compress better: docs/formats.md section 7).
            # Trio shuffles each scheduler batch, so an answer queued in this pass may land
            # just after the writer looked: only two empty passes in a row mean "settled".
            batch = [first]
            size = len(first)
            empty = 0
            for _ in range(SETTLE_PASSES):
                await trio.lowlevel.checkpoint()
                before = len(batch)
                while size < BATCH_BYTES:
                    try:
                        packed = self._out.receive_nowait()
                    except trio.WouldBlock:
                        break
                    batch.append(packed)
                    size += len(packed)
                empty = empty + 1 if len(batch) == before else 0
                if empty == 2 or size >= BATCH_BYTES:
                    break
            async with self._send_lock:
                await self.frames.send_packed(batch)
            self._queued_bytes -= size
            async with self._room:
                self._room.notify_all()

    # ------------------------------------------------------------ conversations

    def start(self, request: m.Message) -> Conversation:
        """A new conversation (client side) opened with its request."""
        conversation = Conversation(self, self._next_id)
        self._next_id += 1
        self._conversations[conversation.id] = conversation
        conversation.send(request)
        return conversation

    # ------------------------------------------------------------ receiving

    async def _reader(self, nursery: trio.Nursery) -> None:
        while True:
            with trio.move_on_after(self.idle_timeout) as idle:
                batch = await self.frames.receive_sized()
            if idle.cancelled_caught:
                if self._conversations or self.handler is not None:
                    silent = f"no word from the peer in {self.idle_timeout:g} s"
                    self._fail(ConnectionClosed(silent))
                    return
                continue
            for raw, size in batch:
                conversation, message = m.decode(raw)
                self._dispatch(conversation, message, size, nursery)
            while self._pending_input > PAUSE_BYTES:  # let the handlers catch up
                await self._drained.wait()
                self._drained = trio.Event()
            # Requests are answered without waiting: a peer that sends requests and does
            # not read the answers gets no more requests read until it does.
            async with self._room:
                while self._queued_bytes > OUTPUT_PAUSE and self._failure is None:
                    await self._room.wait()

    def _taken(self, size: int) -> None:
        """A handler took ``size`` bytes of input from its inbox."""
        self._pending_input -= size
        if self._pending_input <= PAUSE_BYTES:
            self._drained.set()

    def _dispatch(
        self, conversation_id: int | None, message: m.Message, size: int, nursery: trio.Nursery
    ) -> None:
        if self._failure is not None:
            # Ending (a handler's failure is being told to the peer): nothing new starts,
            # for it would outlive the failure that cleared the conversations.
            return
        if conversation_id is None:
            if isinstance(message, m.Ping):
                return
            if isinstance(message, m.Error):
                raise RemoteError(code=message.code, message=message.msg or message.code)
            raise ProtocolError(message=f"{message.TYPE!r} outside a conversation")
        conversation = self._conversations.get(conversation_id)
        if conversation is not None:
            conversation._deliver(message, size)
            return
        # Input for a conversation this side already ended (for example data still in
        # flight after the target gave up on a file) is dropped.
        if self.handler is None:
            if conversation_id < self._next_id:
                return
            raise ProtocolError(message=f"message for unknown conversation {conversation_id}")
        if not message.REQUEST:
            if conversation_id <= self._highest_seen:
                return  # input still in flight for a conversation this side ended
            raise ProtocolError(message=f"a conversation cannot start with {message.TYPE!r}")
        if conversation_id <= self._highest_seen:
            raise ProtocolError(
                message=f"conversation {conversation_id} reused (ids of new conversations grow)"
            )
        if len(self._conversations) >= MAX_CONVERSATIONS:
            raise ProtocolError(message=f"more than {MAX_CONVERSATIONS} open conversations")
        self._highest_seen = conversation_id
        conversation = Conversation(self, conversation_id, takes_input=message.FOLLOW_UPS)
        self._conversations[conversation_id] = conversation
        nursery.start_soon(self._handle, conversation, message, nursery)

    async def _handle(
        self, conversation: Conversation, message: m.Message, nursery: trio.Nursery
    ) -> None:
        """Run the handler of one conversation. A refusal ends the conversation; a protocol
        error or a bug ends the connection (and only it)."""
        assert self.handler is not None
        try:
            await self.handler(conversation, message)
        except RemoteError:
            pass  # the peer ended the conversation itself
        except NoSpace as exc:  # a full disk ends the run: the peer learns it, once
            await self._abort(exc, NoSpace.code, nursery)
        except Refusal as exc:
            if conversation.id in self._conversations:
                conversation.refuse(exc.code, str(exc))
        except OSError as exc:  # the disk, not the peer: this conversation fails
            log.warning("conversation %d: %s", conversation.id, exc)
            if conversation.id in self._conversations:
                conversation.refuse("io", exc.strerror or str(exc))
        except ProtocolError as exc:
            await self._abort(exc, "protocol", nursery)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            nursery.cancel_scope.cancel()
        except Exception as exc:
            log.exception("conversation %d (%s) failed", conversation.id, message.TYPE)
            await self._abort(ProtocolError(message=f"internal error: {exc}"), "internal", nursery)
        finally:
            conversation.close()

    async def _abort(self, exc: BaseException, code: str, nursery: trio.Nursery) -> None:
        self._fail(exc)
        await self._send_error(code, str(exc))
        nursery.cancel_scope.cancel()

    # ------------------------------------------------------------ lifetime

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read and write until the peer closes or `close` is called. Raises ProtocolError
        or RemoteError (connection-level) if that is how it ended."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._guard, self._writer, nursery)
                task_status.started()
                await self._guard(self._reader, nursery, nursery)
        finally:
            with trio.CancelScope(shield=True):
                # No frame goes either way from here. Their zstd contexts and buffers go
                # now, before a server's session ends (on_end, or its caller) and before a
                # client's replica closes, each packing the tree it keeps: the peak of a
                # 100,000-file first copy on either side.
                self.frames.forget()
                try:
                    if self._told and self.handler is not None:  # (a client ends at once:
                        if self.on_end is not None:             # its user is waiting)
                            self.on_end()
                        await linger(self.frames.stream, LINGER_SECONDS)
                finally:
                    await self.frames.stream.aclose()
        if isinstance(self._failure, ProtocolError | RemoteError):
            raise self._failure

    async def _guard(self, task: Callable[..., Awaitable[None]], nursery: trio.Nursery,
                     *args: object) -> None:
        """Run the reader or the writer; however it ends, record why and stop the other."""
        try:
            await task(*args)
        except ConnectionClosed as exc:
            if not self._closing:
                self._fail(exc)
        except ProtocolError as exc:
            self._fail(exc)
            await self._send_error("protocol", str(exc))
        except RemoteError as exc:
            self._fail(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if not self._closing:  # why, in words (a reset, a broken pipe): for messages
                self._fail(ConnectionClosed(reason(exc)))
        finally:
            nursery.cancel_scope.cancel()

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        for conversation in list(self._conversations.values()):
            conversation._inbox_send.close()
        self._conversations.clear()

    async def _send_error(self, code: str, msg: str) -> None:
        # (It may wait for the writer's batch to leave first: a client slow to read, busy
        # signing, still gets a server's error. A client waits less: its user is waiting.)
        with trio.move_on_after(LINGER_SECONDS if self.handler is not None else 2) as scope:
            scope.shield = True
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                async with self._send_lock:
                    await self.frames.send([m.encode(m.Error(code=code, msg=msg))])
                self._told = True

    async def close(self) -> None:
        """Flush what is queued, then close the stream."""
        self._closing = True
        with trio.move_on_after(30):
            while self._queued_bytes > 0 and self._failure is None:
                async with self._room:
                    await self._room.wait()
        with trio.CancelScope(shield=True):
            await self.frames.stream.aclose()

    @property
    def failure(self) -> BaseException | None:
        return self._failure


async def linger(stream: trio.abc.Stream, seconds: float) -> None:
    """After an error that ends the connection: wait, for at most ``seconds``, for the
    peer to read it and close its end, dropping what the peer sends meanwhile. A socket
    closed with input unread sends a reset, which throws away its own unsent output (the
    error, if the peer was slow to read) and, at the peer, fails its next send: the peer
    would report "connection reset" instead of the error (a push whose data was in flight
    when the server's disk filled)."""
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    with trio.move_on_after(seconds) as scope:
        scope.shield = True
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                 trio.BusyResourceError, OSError):
            if isinstance(raw, trio.abc.HalfCloseableStream):
                await raw.send_eof()  # after the error: the peer's reader ends there
            while await raw.receive_some(1 << 16):
                pass


@contextlib.asynccontextmanager
async def running(frames: FrameStream, idle_timeout: float,
                  close_within: float = math.inf) -> AsyncIterator[Connection]:
    """A connection over handshaken ``frames``, running while the block runs; closed
    (output flushed, for at most ``close_within`` seconds) when it ends. A failure of the
    connection is kept on it: the calls waiting on it raise it."""
    connection = Connection(frames, idle_timeout=idle_timeout)
    with unwrap_group():
        async with trio.open_nursery() as nursery:
            await nursery.start(_run_quietly, connection)
            try:
                yield connection
            finally:
                with trio.move_on_after(close_within):
                    await connection.close()
                nursery.cancel_scope.cancel()


async def _run_quietly(connection: Connection, *,
                       task_status: trio.TaskStatus[None]) -> None:
    with contextlib.suppress(Exception):
        await connection.run(task_status=task_status)


@contextlib.contextmanager
def unwrap_group() -> Iterator[None]:
    """Re-raise the exception inside a (nested) exception group from a nursery, so callers
    can catch it by its own type. Several tasks failing the same way (a lost connection
    seen by each) count as one; different failures stay a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len({type(leaf) for leaf in leaves}) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
