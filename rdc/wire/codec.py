"""msgpack with the project's defaults: one place that packs, and unpackers that treat
their input as hostile (sizes bounded, no ext types, string map keys only)."""

from __future__ import annotations

from typing import Any

import msgpack

from rdc.errors import ProtocolError
from rdc.local.paths import displayable

MAX_FRAME = 4 * 1024 * 1024
MAX_ITEMS = 4096
MAX_PIECE = 1 << 20

_packer = msgpack.Packer(use_bin_type=True, strict_types=False, autoreset=True)


def pack(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` (bytes become ``bin``, str becomes ``str``). Text that is
    not valid Unicode (a file name that is not UTF-8, decoded with surrogate escapes,
    inside an error message) is sent in its `displayable` form rather than failing: a
    ``str`` on the wire must be UTF-8, and paths themselves travel as ``bin``."""
    try:
        return _packer.pack(obj)
    except UnicodeEncodeError:
        _packer.reset()
        return _packer.pack(_displayable_all(obj))


def _displayable_all(obj: Any) -> Any:
    if isinstance(obj, str):
        return displayable(obj)
    if isinstance(obj, list | tuple):
        return [_displayable_all(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _displayable_all(value) for key, value in obj.items()}
    return obj


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(message=f"msgpack ext type {code} is not used by this protocol")


_LIMITS = {
    "raw": False,
    "use_list": True,
    "strict_map_key": True,
    "ext_hook": None,  # set below: no ext types
    "max_bin_len": MAX_FRAME,
    "max_str_len": 1 << 16,
    "max_array_len": 4 * MAX_ITEMS,
    "max_map_len": 64,
}
_LIMITS["ext_hook"] = _no_ext
_MALFORMED = (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
              msgpack.StackError, msgpack.OutOfData, RecursionError)


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """One msgpack object from a peer, bounded by the frame size; raises ProtocolError for
    anything malformed, truncated, followed by trailing bytes, or over a limit."""
    try:
        return msgpack.unpackb(data, **_LIMITS)
    except ProtocolError:
        raise
    except _MALFORMED as exc:
        raise ProtocolError(message=f"malformed msgpack: {exc}") from None


def unpack_array(data: bytes | bytearray | memoryview, limit: int) -> list[tuple[Any, int]]:
    """The items of one msgpack array from a peer (1 to ``limit`` of them), each with the
    number of bytes it took: what a message weighs is known exactly, not guessed from its
    unpacked objects. ProtocolError as for `unpack`."""
    unpacker = msgpack.Unpacker(max_buffer_size=len(data) or 1, **_LIMITS)
    try:
        unpacker.feed(data)
        count = unpacker.read_array_header()
        if not 1 <= count <= limit:
            raise ProtocolError(message=f"a frame body must be an array of 1 to {limit} items")
        out = []
        position = unpacker.tell()
        for _ in range(count):
            item = unpacker.unpack()
            end = unpacker.tell()
            out.append((item, end - position))
            position = end
    except ProtocolError:
        raise
    except _MALFORMED as exc:
        raise ProtocolError(message=f"malformed msgpack: {exc}") from None
    if position != len(data):
        raise ProtocolError(message="malformed msgpack: trailing bytes after the array")
    return out
