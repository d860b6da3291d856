"""docs/protocol.md section 1 spoken by hand, both ways: a `Decoder` that follows one
direction of a real stream (compressed frames and their history included), and an `Encoder`
that builds frames as a peer would, or breaks one on purpose (`Breakage`).

The constants come from `rdc.wire`, so the harness speaks the protocol as it is when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import zstandard

from rdc.wire.codec import MAX_FRAME
from rdc.wire.frames import COMPRESSED, HEADER, HISTORY

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class BadStream(Exception):
    """A stream that does not decode as frames (the peer broke section 1)."""


class History:
    """The last HISTORY bytes of one direction's plaintext bodies (the zstd dictionary)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, body: bytes) -> None:
        self.data += body[-HISTORY:]
        if len(self.data) > HISTORY:
            del self.data[: len(self.data) - HISTORY]

    def dictionary(self) -> zstandard.ZstdCompressionDict | None:
        if not self.data:
            return None
        return zstandard.ZstdCompressionDict(bytes(self.data),
                                             dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def unpack(body: bytes) -> Any:
    """A body as msgpack (what a peer would see), or BadStream."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise BadStream(f"body is not msgpack: {exc}") from None


def welcomed_zstd(first: bytes, offered: bool) -> bool:
    """Whether a stream whose first frame (a welcome) is ``first`` compresses from then on."""
    if not offered:
        return False
    try:
        message = unpack(first)[0]
        return message.get("t") == "welcome" and "zstd" in message.get("features", [])
    except (BadStream, AttributeError, IndexError, KeyError, TypeError):
        return False


class Decoder:
    """Frames of one direction, fed in pieces. ``switch`` sees the first (handshake) body
    and says whether the frames after it use compression and its history."""

    def __init__(self, switch: Callable[[bytes], bool]) -> None:
        self.buffer = bytearray()
        self.history = History()
        self.switch = switch
        self.compress = False
        self.frames = 0

    def feed(self, data: bytes) -> list[tuple[bool, bytes]]:
        """The frames completed by ``data``: (was compressed, plaintext body)."""
        self.buffer += data
        out = []
        while len(self.buffer) >= 4:
            (header,) = HEADER.unpack_from(self.buffer)
            length = header & ~COMPRESSED
            if len(self.buffer) < 4 + length:
                break
            body = bytes(self.buffer[4 : 4 + length])
            del self.buffer[: 4 + length]
            squeezed = bool(header & COMPRESSED)
            if squeezed:
                body = _decompress(body, self.history)
            if self.compress:
                self.history.add(body)
            if self.frames == 0:
                self.compress = self.switch(body)
            self.frames += 1
            out.append((squeezed, body))
        return out


def _decompress(body: bytes, history: History) -> bytes:
    try:
        size = zstandard.frame_content_size(body)
        if not 0 < size <= MAX_FRAME:
            raise BadStream(f"compressed frame states size {size}")
        return zstandard.ZstdDecompressor(dict_data=history.dictionary()).decompress(body)
    except zstandard.ZstdError as exc:
        raise BadStream(f"bad zstd frame: {exc}") from None


@dataclass(frozen=True)
class Breakage:
    """One way to break a frame as it is encoded. ``kind``:

    - ``length``: the header states ``value`` as the body length (the body stays)
    - ``flag``: the compressed bit flipped in the header
    - ``truncate``: only the first ``value`` bytes of the encoded frame are sent
    - ``content_size``: compressed, the zstd header's content size rewritten to ``value``
    - ``no_content_size``: compressed without a content size in the zstd header
    - ``no_dict``: compressed without the history (the receiver uses it)
    - ``bomb``: the body replaced by ``value`` zero bytes in a msgpack bin, compressed,
      its content size stated as ``extra`` (None: truthfully)
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


class Encoder:
    """Frames as a sending peer makes them: after the handshake frame, with ``compress``
    (both sides listed zstd), every plaintext body goes into the history, compressed or not."""

    def __init__(self) -> None:
        self.history = History()
        self.compress = False

    def frame(self, body: bytes, squeeze: bool = False, level: int = 3,
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
        squeeze = squeeze or kind in ("content_size", "no_content_size", "no_dict", "bomb")
        data, flag = body, 0
        if squeeze:
            dictionary = None if kind == "no_dict" else self.history.dictionary()
            compressor = zstandard.ZstdCompressor(
                level=level, write_content_size=kind != "no_content_size",
                dict_data=dictionary,
            )
            data, flag = compressor.compress(body), COMPRESSED
            if kind == "content_size" or (kind == "bomb" and breakage.extra is not None):
                stated = breakage.value if kind == "content_size" else breakage.extra
                data = set_content_size(data, stated)  # type: ignore[arg-type]
        if self.compress:
            self.history.add(body)
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


def set_content_size(frame: bytes, size: int) -> bytes:
    """``frame`` (one zstd frame) with the content size in its header rewritten to ``size``
    (masked to the field's width; a frame without the field is returned as is)."""
    if frame[:4] != ZSTD_MAGIC or len(frame) < 6:
        return frame
    descriptor = frame[4]
    single = (descriptor >> 5) & 1
    position = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    if width == 0:
        return frame
    value = size - 256 if width == 2 else size
    value &= (1 << (8 * width)) - 1
    return frame[:position] + value.to_bytes(width, "little") + frame[position + width :]
