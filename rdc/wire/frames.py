"""Frames: a 4-byte header (compressed flag, body length) and a msgpack array of messages.

`FrameStream` turns a trio stream into batches of messages and back, enforcing the limits
of docs/protocol.md section 1 on everything it receives. `CountingStream` counts the bytes
that really cross the socket (under TLS, wrap the TCP stream, not the TLS one).
"""

from __future__ import annotations

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
# A compressed frame uses the last HISTORY bytes of the plaintext frame bodies sent before
# it in the same direction (since the handshake) as a raw-content dictionary: most of what
# a stream of small frames shares (names, paths, message keys) is in its recent past. The
# receiver keeps the same history, so each frame still decodes on its own, bounded.
HISTORY = 256 * 1024
# Compression level by how much plaintext this side has sent: small syncs (a few MB of
# signatures and literal data) are squeezed hard, where a tenth of a second of CPU saves
# tens of KB; bulk transfers fall back to fast levels that keep up with the network. Frames
# under SMALL_FRAME (a few wants or offers) get a middle level: level 19 spends ~19 ms per
# frame taking in the 256 KiB history, whatever the frame's size (docs/formats.md
# section 7 has the measurement).
LEVELS = ((2 << 20, 19), (32 << 20, 9))
BULK_LEVEL = 3
SMALL_FRAME = 8 * 1024
SMALL_LEVEL = 9
READ_SIZE = 65536


class ConnectionClosed(Exception):
    """The connection ended: closed cleanly between two frames, or cut in the middle of
    one (a peer that died while sending is a lost connection, not a protocol error)."""


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
        self.level = level  # None: by the volume sent so far (LEVELS)
        # The largest frame accepted: a server lowers it until the peer has authenticated.
        self.max_receive = MAX_FRAME
        self.plain_sent = 0
        self._buffer = bytearray()
        self._sent = _History()
        self._received = _History()

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
        plain = _array_header(len(packed)) + b"".join(packed)
        body, flag = plain, 0
        if self.compress:
            if len(plain) >= COMPRESS_FROM:
                compressor = zstandard.ZstdCompressor(
                    level=self._level(len(plain)), write_content_size=True,
                    dict_data=self._sent.dictionary(),
                )
                if len(plain) >= THREAD_FROM:
                    squeezed = await trio.to_thread.run_sync(compressor.compress, plain)
                else:
                    squeezed = compressor.compress(plain)
                if len(squeezed) < len(plain):
                    body, flag = squeezed, COMPRESSED
            self._sent.add(plain)
            self.plain_sent += len(plain)
        await self.stream.send_all(HEADER.pack(flag | len(body)) + body)

    def _level(self, size: int) -> int:
        if self.level is not None:
            return self.level
        for volume, level in LEVELS:
            if self.plain_sent < volume:
                return level if size >= SMALL_FRAME else min(level, SMALL_LEVEL)
        return BULK_LEVEL

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
            raise ProtocolError(message=f"frame length {length} outside 1..{self.max_receive}")
        await self._fill(4 + length)
        body = bytes(self._buffer[4 : 4 + length])
        del self._buffer[: 4 + length]
        if header & COMPRESSED:
            if not self.compress:
                raise ProtocolError(message="a compressed frame before compression was agreed")
            body = await _decompress(body, self._received.dictionary())
        if self.compress:
            self._received.add(body)
        messages = unpack_array(body, MAX_ITEMS)
        for message, _ in messages:
            if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                raise ProtocolError(message="a message must be a map with a string 't'")
        return messages


class _History:
    """The last HISTORY bytes of one direction's plaintext frame bodies."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, body: bytes) -> None:
        self.data += body[-HISTORY:]
        if len(self.data) > HISTORY:
            del self.data[: len(self.data) - HISTORY]

    def dictionary(self) -> zstandard.ZstdCompressionDict | None:
        if not self.data:
            return None
        return zstandard.ZstdCompressionDict(
            bytes(self.data), dict_type=zstandard.DICT_TYPE_RAWCONTENT
        )


async def _decompress(body: bytes, dictionary: zstandard.ZstdCompressionDict | None) -> bytes:
    """One zstd frame that states its content size, at most MAX_FRAME. The one-shot decoder
    writes into a buffer of exactly that size and fails if the data would overflow it, so a
    peer cannot make us allocate more than a frame (a zip bomb)."""
    try:
        size = zstandard.frame_content_size(body)
    except zstandard.ZstdError as exc:
        raise ProtocolError(message=f"bad zstd frame: {exc}") from None
    if not 0 < size <= MAX_FRAME:
        raise ProtocolError(message=f"compressed frame content size {size} not in 1..{MAX_FRAME}")

    def run() -> bytes:
        return zstandard.ZstdDecompressor(dict_data=dictionary).decompress(body)

    try:
        out = await trio.to_thread.run_sync(run) if len(body) >= 4 * THREAD_FROM else run()
    except zstandard.ZstdError as exc:
        raise ProtocolError(message=f"bad zstd frame: {exc}") from None
    if len(out) != size:
        raise ProtocolError(message="compressed frame does not hold its stated size")
    return out
