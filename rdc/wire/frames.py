"""Frames: a 4-byte header (compressed flag, body length) and a msgpack array of messages.

`FrameStream` turns a trio stream into batches of messages and back, enforcing the limits
of docs/protocol.md section 1 on everything it receives. `CountingStream` counts the bytes
that really cross the socket (under TLS, wrap the TCP stream, not the TLS one).
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Sequence
from typing import Any

import trio
import zstandard

from rdc.errors import ProtocolError
from rdc.wire.codec import MAX_FRAME, MAX_ITEMS, pack, unpack_array

COMPRESSED = 1 << 31
HEADER = struct.Struct(">I")
# Below this a frame is sent as is: zstd's own header would eat the gain.
COMPRESS_FROM = 256
# Bodies this large are (de)compressed on a worker thread (zstd releases the GIL) so the
# event loop keeps serving other conversations.
THREAD_FROM = 16 * 1024
# Each direction is one zstd stream, flushed at the end of every compressed frame: a frame
# compresses against everything sent before it in that direction (the stream's window),
# and the context is reused, so a small frame costs its own bytes, not a dictionary's.
# Level 6 while the volume is small (signatures, edits: every byte counts), then level 3,
# which keeps up with a gigabit link on one core (docs/formats.md section 7).
LEVEL = 6
BULK_LEVEL = 3
BULK_FROM = 32 << 20  # plaintext bytes sent before the stream switches to BULK_LEVEL
# The largest window a peer's stream may use (8 MiB): what its decoder holds.
MAX_WINDOW = 1 << 23
PLAIN_SIZE = struct.Struct(">I")
READ_SIZE = 65536
# The first bytes of a TLS handshake record: a client with TLS talking to a server without.
TLS_RECORD = b"\x16\x03"


class ConnectionClosed(Exception):
    """The connection ended: closed cleanly between two frames, or cut in the middle of
    one (a peer that died while sending is a lost connection, not a protocol error)."""


class TLSWithoutTLS(ProtocolError):
    """protocol error: the peer started a TLS handshake on a connection without TLS"""


class CountingStream(trio.abc.Stream):
    """A stream that counts the bytes sent and received through it."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.bytes_sent = 0
        self.bytes_received = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.bytes_sent += len(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.bytes_received += len(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class FrameStream:
    """Batches of messages over a stream. Sending and receiving may run in two tasks; each
    direction must be used by one task at a time. Cancellation in the middle of a frame
    leaves the stream unusable (close it)."""

    def __init__(self, stream: trio.abc.Stream, level: int | None = None) -> None:
        self.stream = stream
        self.compress = False  # switched on after the handshake if both sides agree
        self.features: frozenset[str] = frozenset()  # both sides have them (the handshake)
        # Seconds from the hello sent to the welcome received: the link's round trip as the
        # client measured it (0 on a server, and before the handshake).
        self.rtt = 0.0
        self.level = level  # None: LEVEL, then BULK_LEVEL past BULK_FROM
        # The largest frame accepted: a server lowers it until the peer has authenticated.
        self.max_receive = MAX_FRAME
        self.plain_sent = 0
        # A send cancelled or failed after it began: the peer may hold part of a frame,
        # so nothing more can go (an error frame after it read as garbage; fuzzing).
        self.cut = False
        self._buffer = bytearray()
        self._compressor: zstandard.ZstdCompressionObj | None = None
        self._compressor_level = -1
        self._source = _Pending()
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
            self._source, read_size=READ_SIZE, read_across_frames=True
        )

    def forget(self) -> None:
        """Drop the zstd contexts and the buffers (about 12 MB with compression on): the
        connection is ending, and only the stream underneath is used from now on."""
        self._compressor = None
        self._decompressor = None  # type: ignore[assignment]
        self._buffer = bytearray()
        self._source = _Pending()
        self.cut = True  # nothing more can be sent or received as frames

    # ------------------------------------------------------------ sending

    async def send(self, messages: Sequence[dict[str, Any]]) -> None:
        """Send ``messages`` in as few frames as the size limit allows, in order."""
        await self.send_packed([pack(message) for message in messages])

    async def send_packed(self, messages: Sequence[bytes]) -> None:
        """Send messages already packed (`rdc.wire.codec.pack`), as `send` does."""
        batch: list[bytes] = []
        size = 0
        for packed in messages:
            if len(packed) + 5 > MAX_FRAME:
                raise ValueError(f"a message of {len(packed)} bytes is over the frame limit")
            if batch and (size + len(packed) + 5 > MAX_FRAME or len(batch) == MAX_ITEMS):
                await self._send_frame(batch)
                batch, size = [], 0
            batch.append(packed)
            size += len(packed)
        if batch:
            await self._send_frame(batch)

    async def _send_frame(self, packed: list[bytes]) -> None:
        if self.cut:
            raise trio.ClosedResourceError("a frame was cut short: the stream is unusable")
        self.cut = True  # until the whole frame is out (the compressor takes it first)
        header = _array_header(len(packed))
        length = len(header) + sum(map(len, packed))
        if self.compress and length >= COMPRESS_FROM:
            # Once in the stream, a frame goes compressed whatever it saved: the peer's
            # decoder must see every byte the encoder took in.
            head, compressor = self._stream()
            plain = b"".join([header, *packed])
            if length >= THREAD_FROM:
                squeezed = await trio.to_thread.run_sync(_squeeze, compressor, plain)
            else:
                squeezed = _squeeze(compressor, plain)
            self.plain_sent += length
            size = PLAIN_SIZE.size + len(head) + sum(map(len, squeezed))
            parts = [HEADER.pack(COMPRESSED | size), PLAIN_SIZE.pack(length), head, *squeezed]
        else:
            parts = [HEADER.pack(length), header, *packed]
        # One copy of the frame on its way out: each copy of a large one is fresh memory
        # that the kernel zeroes first (page faults were a tenth of a receiver's time).
        await self.stream.send_all(b"".join(parts))
        self.cut = False

    def _stream(self) -> tuple[bytes, zstandard.ZstdCompressionObj]:
        """This direction's compressor, and the bytes that end its previous zstd frame when
        the level just changed (the next frame's body begins with them)."""
        level = self.level if self.level is not None else (
            LEVEL if self.plain_sent < BULK_FROM else BULK_LEVEL
        )
        head = b""
        if self._compressor is None or level != self._compressor_level:
            if self._compressor is not None:
                head = self._compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
            params = zstandard.ZstdCompressionParameters.from_level(level, window_log=22)
            self._compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
            self._compressor_level = level
        return head, self._compressor

    # ------------------------------------------------------------ receiving

    async def _fill(self, n: int) -> bool:
        """Buffer at least ``n`` bytes; False on a clean EOF before any byte of a frame."""
        while len(self._buffer) < n:
            data = await self.stream.receive_some(READ_SIZE)
            if not data:
                if not self._buffer:
                    return False
                raise ConnectionClosed("the connection was cut in the middle of a frame")
            self._buffer += data
        return True

    async def receive(self) -> list[dict[str, Any]]:
        """The messages of the next frame. Raises ConnectionClosed at the end of the stream
        (wherever it comes) and ProtocolError for anything that breaks section 1 of the
        protocol."""
        return [message for message, _ in await self.receive_sized()]

    async def receive_sized(self) -> list[tuple[dict[str, Any], int]]:
        """As `receive`, each message with the bytes it took in the frame."""
        if not await self._fill(4):
            raise ConnectionClosed
        (header,) = HEADER.unpack_from(self._buffer)
        length = header & ~COMPRESSED
        if not 1 <= length <= self.max_receive:
            if self._buffer[:2] == TLS_RECORD:
                raise TLSWithoutTLS
            raise ProtocolError(message=f"frame length {length} outside 1..{self.max_receive}")
        await self._fill(4 + length)
        body = self._take(4 + length)[4:]
        if header & COMPRESSED:
            if not self.compress:
                raise ProtocolError(message="a compressed frame before compression was agreed")
            body = await self._decompress(body)
        messages = unpack_array(body, MAX_ITEMS)
        for message, _ in messages:
            if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                raise ProtocolError(message="a message must be a map with a string 't'")
        return messages

    def _take(self, n: int) -> memoryview:
        """The first ``n`` bytes buffered, out of the buffer without copying them: the
        buffer becomes the frame, and the few bytes after it (the next frame's start, read
        with it) a new buffer. (Copying each frame twice more, into fresh memory, cost more
        than decompressing it.)"""
        frame, self._buffer = self._buffer, self._buffer[n:]
        del frame[n:]
        return memoryview(frame)

    async def _decompress(self, body: memoryview) -> bytearray:
        """The plaintext of a compressed frame: its stated size (at most MAX_FRAME), read
        from this direction's stream. The reader never returns more than it is asked
        for, so a peer cannot make us allocate more than a frame (a zip bomb); one whose
        data does not give its stated size commits a protocol error."""
        if len(body) < PLAIN_SIZE.size:
            raise ProtocolError(message="a compressed frame without its plain size")
        (size,) = PLAIN_SIZE.unpack_from(body)
        if not 1 <= size <= MAX_FRAME:
            raise ProtocolError(message=f"compressed frame content size {size} not in "
                                f"1..{MAX_FRAME}")
        self._source.add(body[PLAIN_SIZE.size :])

        def run() -> bytearray:
            out = bytearray(size)
            view, done = memoryview(out), 0
            while done < size:
                count = self._decompressor.readinto(view[done:])
                if not count:
                    break
                done += count
            view.release()
            del out[done:]
            return out

        try:
            plain = await trio.to_thread.run_sync(run) if len(body) >= THREAD_FROM else run()
        except zstandard.ZstdError as exc:
            raise ProtocolError(message=f"bad zstd stream: {exc}") from None
        if len(plain) != size or self._source.pending:
            raise ProtocolError(message="compressed frame does not hold its stated size")
        return plain


def _squeeze(compressor: zstandard.ZstdCompressionObj, plain: bytes) -> tuple[bytes, bytes]:
    """``plain`` through this direction's stream, flushed (the peer can decode it now): the
    compressed bytes in two pieces, which the frame joins with its header."""
    return compressor.compress(plain), compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)


class _Pending:
    """The compressed bytes received and not yet decoded: what the stream reader reads,
    handed over as views of the frames they came in, not copied."""

    def __init__(self) -> None:
        self._views: collections.deque[memoryview] = collections.deque()

    @property
    def pending(self) -> int:
        return sum(map(len, self._views))

    def add(self, data: memoryview) -> None:
        if data:
            self._views.append(data)

    def read(self, n: int = -1) -> memoryview | bytes:
        if not self._views:
            return b""
        view = self._views.popleft()
        if 0 <= n < len(view):
            self._views.appendleft(view[n:])
            view = view[:n]
        return view
