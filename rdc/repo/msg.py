"""msgpack with the repository's conventions: bytes stay bytes, text is str, and anything
read back is parsed with limits (a repository's content is not trusted)."""

from __future__ import annotations

from typing import Any

import msgpack


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes | memoryview) -> Any:
    """One msgpack value that is the whole of ``data``; ValueError if it is not."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed msgpack: {exc}") from None
