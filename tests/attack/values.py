"""Hostile values for message fields: integers at every edge, paths that try to leave the
share, strings and binaries of the wrong size or encoding, values of the wrong type.

`mutate_value` picks one for a field by what the field holds and how it is named; `bad_str`
makes a msgpack ``str`` whose bytes are not UTF-8 (msgpack cannot pack one), which
`patch_bad_strs` puts in place after packing.
"""

from __future__ import annotations

import random
import re
from typing import Any

import msgpack

from rdc.wire.codec import MAX_FRAME, MAX_ITEMS

INTS = [
    0, 1, -1, 2, 7, 255, 256, 0o777, 0o7777, 0o10000, 0o170777, 65535, 65536,
    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1,
    -(2**31), -(2**63), 10**18, 10**19, 16 * 10**18,  # mtimes: 2001, 2286, 2477
    4 * 1024 * 1024, 4 * 1024 * 1024 + 1, MAX_ITEMS, MAX_ITEMS + 1,
]
TEMP = b".rdc-tmp-0123456789abcdef-"
PATHS = [
    b"", b".", b"..", b"../x", b"x/../../y", b"/", b"/etc/passwd", b"/tmp/rdc-fuzz-absolute",
    b"a\0b", b"docs//note-00.md", b"docs/", b"./docs", b"docs/.", b"docs/..",
    TEMP + b"x", TEMP + b"docs", b"docs/" + TEMP + b"note-00.md", b".rdc-tmp-", b".rdc-tmp-x",
    b"a" * 255, b"a" * 256, b"a/" * 2048 + b"b", b"b" * 5000, b"a/" * 2047 + b"b",
    b"\xff\xfe", b"caf\xe9.txt", b"docs/\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x80\xae", b"\n",
    b" ", b"-", b"~", b"%s%n", b"...", b"\\..\\x",
    b"evil", b"evil/x", b"evil/new-dir", b"evil-secret", b"evil-secret/x", b"link",
    b"link/x", b"linked.txt", b"private.txt", b"run.sh", b"empty", b"empty/new", b"docs",
    b"docs/note-00.md", b"data/blob.bin", b"data", b"src/rdc", b"work", b"two", b"watched",
    b"nowhere/x", b"caf\xe9.txt/x",
]
# The lone surrogate U+DCFF goes as its bytes, a `bad_str` (msgpack packs no such str).
STRINGS = [
    "", "s", "r", "S", "s ", "s/..", "../s", "x" * 256, "x" * 1025, "x" * 5000, "\u2603",
    "\x00", "\ue000bad-str:edb3bf\ue000", "é" * 100, "zstd", "\n",
]
BINS = [b"", b"\0", b"\0" * 8, b"\xff" * 32, b"\0" * 33, b"x" * 4096, b"x" * 65536]
SWAPS: list[Any] = [
    None, True, False, 0, -1, 2**64 - 1, 1.5, float("nan"), "", "x", b"", b"x", [], [None],
    {}, {"t": "x"}, msgpack.ExtType(1, b"x"), [[[[]]]],
]
BAD_STR = "\ue000bad-str:"  # marks a str whose bytes will not be UTF-8
_BAD = re.compile(re.escape(BAD_STR).encode("utf-8") + rb"([0-9a-f]*)\xee\x80\x80")


def bad_str(raw: bytes) -> str:
    """A placeholder for a msgpack ``str`` made of ``raw`` (not UTF-8)."""
    return f"{BAD_STR}{raw.hex()}\ue000"


def patch_bad_strs(packed: bytes) -> bytes:
    """Put the raw bytes of every `bad_str` placeholder in place, headers fixed."""
    if BAD_STR.encode("utf-8") not in packed:
        return packed
    out = bytearray()
    position = 0
    for found in _BAD.finditer(packed):
        size = found.end() - found.start()
        header = _str_header(size)
        start = found.start() - len(header)
        if packed[start : found.start()] != header:  # not where a str begins: leave it
            continue
        out += packed[position:start] + _str_header(len(found.group(1)) // 2)
        out += bytes.fromhex(found.group(1).decode())
        position = found.end()
    return bytes(out + packed[position:])


def _str_header(n: int) -> bytes:
    if n < 32:
        return bytes([0xA0 | n])
    if n < 256:
        return b"\xd9" + bytes([n])
    if n < 65536:
        return b"\xda" + n.to_bytes(2, "big")
    return b"\xdb" + n.to_bytes(4, "big")


def pick_path(rng: random.Random, seen: list[bytes]) -> bytes:
    """A hostile path, or a real one of the session bent a little."""
    if seen and rng.random() < 0.3:
        base = rng.choice(seen)
        how = rng.randrange(6)
        return [base + b"/x", b"../" + base, base + b"/..", base + b"/", base.upper(),
                base + b"\0"][how]
    return rng.choice(PATHS)


def mutate_value(rng: random.Random, value: Any, key: str, seen: list[bytes]) -> Any:
    """Another value for field ``key`` that now holds ``value``."""
    if rng.random() < 0.15:
        return rng.choice(SWAPS)
    if key in ("path", "paths") or (isinstance(value, bytes) and key in ("ops", "dirs")):
        if isinstance(value, list):
            return mutate_list(rng, value, key, seen)
        return pick_path(rng, seen)
    if isinstance(value, bool):
        return rng.choice([not value, 0, 1, None])
    if isinstance(value, int):
        near = [value - 1, value + 1, -value, value * 2**20] if abs(value) < 2**40 else []
        return rng.choice(INTS + near)
    if isinstance(value, str):
        if rng.random() < 0.2:
            return bad_str(rng.choice([b"\xff", b"caf\xe9", b"\xed\xa0\x80", b"\xc3"]))
        return rng.choice([*STRINGS, value + "x", value[:-1], value.upper()])
    if isinstance(value, bytes):
        return mutate_bytes(rng, value)
    if isinstance(value, list):
        return mutate_list(rng, value, key, seen)
    if isinstance(value, dict):
        return mutate_map(rng, value, seen)
    return rng.choice(SWAPS)


def mutate_bytes(rng: random.Random, value: bytes) -> bytes:
    how = rng.randrange(7)
    if how == 0 and value:
        return value[: rng.randrange(len(value))]
    if how == 1:
        return value + rng.randbytes(rng.choice([1, 8, 100]))
    if how == 2 and value:
        raw = bytearray(value)
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw)
    if how == 3:
        return b"\0" * rng.choice([1 << 20, (1 << 20) + 1, 2 << 20])
    return rng.choice(BINS)


def mutate_list(rng: random.Random, value: list, key: str, seen: list[bytes]) -> Any:
    how = rng.randrange(8)
    if how == 0:
        return []
    if how == 1 and value:  # huge: past the item limit, as long as the frame allows
        item = rng.choice(value)
        size = max(1, len(msgpack.packb(item, use_bin_type=True)))
        count = rng.choice([MAX_ITEMS, MAX_ITEMS + 1, 4 * MAX_ITEMS + 1, 65537])
        return [item] * min(count, (MAX_FRAME - 4096) // size)
    if how == 2 and value:
        return [*value, rng.choice(value)]
    if how == 3 and value:
        del_at = rng.randrange(len(value))
        return value[:del_at] + value[del_at + 1 :]
    if how == 4:
        return [value]
    if value:
        at = rng.randrange(len(value))
        out = list(value)
        out[at] = mutate_value(rng, value[at], key, seen)
        return out
    return [rng.choice(SWAPS)]


def mutate_map(rng: random.Random, value: dict, seen: list[bytes]) -> dict:
    out = dict(value)
    if not out or rng.random() < 0.2:
        out[rng.choice(["x", "t", "id", ""])] = rng.choice(SWAPS)
        return out
    key = rng.choice(list(out))
    out[key] = mutate_value(rng, out[key], str(key), seen)
    return out
