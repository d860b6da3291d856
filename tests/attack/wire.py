"""docs/protocol.md section 1 spoken by hand, both ways: a `Decoder` that follows one
direction of a real stream (its one zstd stream included), and an `Encoder` that builds
frames as a peer would, or breaks one on purpose (`Breakage`).

A compressed body is a 4-byte plain size and the bytes the direction's zstd stream gave
when flushed: each direction is one stream, so a frame can only be decoded after every
compressed frame before it in that direction. The constants come from `rdc.wire`, so the
harness speaks the protocol as it is when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import zstandard

from rdc.params import FORMAT
from rdc.wire import messages as m
from rdc.wire.codec import MAX_FRAME
from rdc.wire.frames import COMPRESSED, HEADER, MAX_WINDOW, PLAIN_SIZE
from rdc.wire.handshake import PROTOCOL_MAX, PROTOCOL_MIN

LEVEL = 1  # the harness's own level: it sends much and speed matters more than bytes
WINDOW_LOG = 22  # as rdc's, and within the peer's MAX_WINDOW


class BadStream(Exception):
    """A stream that does not decode as frames (the peer broke section 1)."""


def unpack(body: bytes) -> Any:
    """A body as msgpack (what a peer would see), or BadStream."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise BadStream(f"body is not msgpack: {exc}") from None


def hello(token: str, agent: str = "attack/0", zstd: bool = True) -> dict[str, Any]:
    """The first message of a connection, as today's ``rdc`` client sends it."""
    return m.encode(m.Hello(proto=(PROTOCOL_MIN, PROTOCOL_MAX), agent=agent,
                            features=["zstd"] if zstd else [], token=token, format=FORMAT))


class Inflater:
    """The receiving end of one direction's zstd stream (zstd frames one after another,
    each body ending where the sender flushed)."""

    def __init__(self) -> None:
        self._stream = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).decompressobj(
            read_across_frames=True)

    def plain(self, body: bytes) -> bytes:
        """The plaintext of one compressed body: exactly its stated size, or BadStream."""
        if len(body) < PLAIN_SIZE.size:
            raise BadStream("a compressed frame without its plain size")
        (size,) = PLAIN_SIZE.unpack_from(body)
        if not 1 <= size <= MAX_FRAME:
            raise BadStream(f"compressed frame states plain size {size}")
        try:
            out = self._stream.decompress(body[PLAIN_SIZE.size :])
        except zstandard.ZstdError as exc:
            raise BadStream(f"bad zstd stream: {exc}") from None
        if len(out) != size:
            raise BadStream(f"compressed frame gave {len(out)} bytes, stated {size}")
        return out


class Decoder:
    """Frames of one direction, fed in pieces."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.inflater = Inflater()
        self.frames = 0

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        """The frames completed by ``data``: (was compressed, plaintext body)."""
        self.buffer += data
        out = []
        while len(self.buffer) >= HEADER.size:
            (header,) = HEADER.unpack_from(self.buffer)
            length = header & ~COMPRESSED
            if len(self.buffer) < HEADER.size + length:
                break
            body = bytes(self.buffer[HEADER.size : HEADER.size + length])
            del self.buffer[: HEADER.size + length]
            squeezed = bool(header & COMPRESSED)
            if squeezed:
                body = self.inflater.plain(body)
            self.frames += 1
            out.append((squeezed, body))
        return out


@dataclass(frozen=True)
class Breakage:
    """One way to break a frame as it is encoded. ``kind``:

    - ``length``: the header states ``value`` as the body length (the body stays)
    - ``flag``: the compressed bit flipped in the header
    - ``truncate``: only the first ``value`` bytes of the encoded frame are sent
    - ``plain_size``: compressed, the plain size stated as ``value`` (32 bits of it)
    - ``no_plain_size``: compressed, the body without its 4-byte plain size
    - ``unflushed``: compressed, the body without the bytes of the final flush (the
      plaintext cannot all be decoded from it)
    - ``restart``: compressed by a fresh stream (a new zstd frame in the middle of the
      one the receiver is decoding, unless this is the first compressed frame)
    - ``new_frame``: legal: the stream ends its zstd frame in this body and starts a new
      one at level ``value`` (what a sender changing levels does); the receiver must
      accept it
    - ``wide_window``: the stream ends its zstd frame and starts one whose window is
      ``2**value`` bytes (over MAX_WINDOW: a protocol error)
    - ``bomb``: the body replaced by ``value`` zero bytes in a msgpack bin, compressed,
      its plain size stated as ``extra`` (None: truthfully)
    - ``flip``: ``extra`` is [[position, xor]]: bytes of the plain body changed
    - ``garbage``: ``extra`` (bytes) appended after the frame
    """

    kind: str
    value: int = 0
    extra: Any = None

    def to_wire(self) -> list:
        return [self.kind, self.value, self.extra]

    @classmethod
    def from_wire(cls, item: list) -> Breakage:
        return cls(item[0], item[1], item[2])


COMPRESSING = ("plain_size", "no_plain_size", "unflushed", "restart", "new_frame",
               "wide_window", "bomb")


class Encoder:
    """Frames as a sending peer makes them: every compressed body goes through this
    direction's one zstd stream, flushed at its end."""

    def __init__(self, level: int = LEVEL) -> None:
        self.level = level
        self._stream: zstandard.ZstdCompressionObj | None = None

    def _open(self, level: int, window_log: int = WINDOW_LOG) -> zstandard.ZstdCompressionObj:
        params = zstandard.ZstdCompressionParameters.from_level(level, window_log=window_log)
        return zstandard.ZstdCompressor(compression_params=params).compressobj()

    def _squeeze(self, body: bytes, breakage: Breakage | None) -> bytes:
        """``body`` through the stream (or as ``breakage`` says), flushed."""
        kind = breakage.kind if breakage else ""
        head = b""
        if kind == "restart":
            stream = self._open(self.level)
        else:
            if kind in ("new_frame", "wide_window") and self._stream is not None:
                head = self._stream.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
                self._stream = None
            if self._stream is None:
                value = breakage.value if breakage else 0
                if kind == "new_frame":
                    self._stream = self._open(value or self.level)
                elif kind == "wide_window":
                    self._stream = self._open(self.level, value or WINDOW_LOG)
                else:
                    self._stream = self._open(self.level)
            stream = self._stream
        data = head + stream.compress(body)
        if kind != "unflushed":
            data += stream.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        if kind == "no_plain_size":
            return data
        stated = len(body)
        if kind == "plain_size" or (kind == "bomb" and breakage.extra is not None):  # type: ignore[union-attr]
            stated = breakage.value if kind == "plain_size" else breakage.extra  # type: ignore[union-attr]
        return PLAIN_SIZE.pack(stated & 0xFFFFFFFF) + data

    def frame(self, body: bytes, squeeze: bool = False,
              breakage: Breakage | None = None) -> bytes:
        kind = breakage.kind if breakage else ""
        if kind == "flip":
            raw = bytearray(body)
            for position, xor in breakage.extra:  # type: ignore[union-attr]
                if raw:
                    raw[position % len(raw)] ^= xor
            body = bytes(raw)
        if kind == "bomb":
            body = msgpack.packb([{"t": "list", "id": 7, "paths": [b"\0" * breakage.value]}],
                                 use_bin_type=True)  # type: ignore[union-attr]
        data, flag = body, 0
        if squeeze or kind in COMPRESSING:
            data, flag = self._squeeze(body, breakage), COMPRESSED
        length = len(data)
        if kind == "length":
            length = breakage.value & ~COMPRESSED  # type: ignore[union-attr]
        if kind == "flag":
            flag ^= COMPRESSED
        out = HEADER.pack(flag | length) + data
        if kind == "truncate":
            out = out[: breakage.value]  # type: ignore[union-attr]
        if kind == "garbage":
            out += breakage.extra  # type: ignore[union-attr]
        return out
