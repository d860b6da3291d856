"""Message schemas of docs/protocol.md: every field of every message a peer sends is
checked (type, size, range) before any code uses it.

`check(message)` returns a copy with defaults filled in and paths decoded to the internal
``str`` form (`rdc.local.paths`), or raises ProtocolError. A field whose absence means something
(``expect``: "do not check") is left out of the copy when absent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rdc.errors import ProtocolError
from rdc.local.paths import PathError, check_relpath
from rdc.wire.codec import MAX_ITEMS, MAX_PIECE

Check = Callable[[Any, str], Any]
MAX_ENTRIES = 16384  # directory entries in one listing message
MAX_TIMES = 1 << 16  # entries in one times vector
ABSENT = object()


def _fail(where: str, what: str) -> ProtocolError:
    return ProtocolError(message=f"{where}: {what}")


def uint(limit: int = (1 << 64) - 1, low: int = 0) -> Check:
    def check(v: Any, where: str) -> int:
        if type(v) is not int or not low <= v <= limit:
            raise _fail(where, f"expected an integer in {low}..{limit}")
        return v

    return check


def sint(v: Any, where: str) -> int:
    if type(v) is not int or not -(1 << 63) <= v < 1 << 63:
        raise _fail(where, "expected a 64-bit integer")
    return v


def boolean(v: Any, where: str) -> bool:
    if type(v) is not bool:
        raise _fail(where, "expected a boolean")
    return v


def text(limit: int) -> Check:
    def check(v: Any, where: str) -> str:
        if type(v) is not str or len(v.encode("utf-8", "surrogatepass")) > limit:
            raise _fail(where, f"expected a string of at most {limit} bytes")
        return v

    return check


def binary(limit: int, exact: int | None = None) -> Check:
    def check(v: Any, where: str) -> bytes:
        if type(v) is not bytes or len(v) > limit or (exact is not None and len(v) != exact):
            size = f"exactly {exact}" if exact is not None else f"at most {limit}"
            raise _fail(where, f"expected binary of {size} bytes")
        return v

    return check


def one_of(*values: str) -> Check:
    def check(v: Any, where: str) -> str:
        if v not in values:
            raise _fail(where, f"expected one of {', '.join(values)}")
        return v

    return check


def optional(inner: Check) -> Check:
    def check(v: Any, where: str) -> Any:
        return None if v is None else inner(v, where)

    return check


def array(item: Check, limit: int = MAX_ITEMS) -> Check:
    def check(v: Any, where: str) -> list:
        if type(v) is not list or len(v) > limit:
            raise _fail(where, f"expected an array of at most {limit} items")
        return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]

    return check


def record(*items: Check) -> Check:
    """A fixed-length array whose items have their own checks."""

    def check(v: Any, where: str) -> tuple:
        if type(v) is not list or len(v) != len(items):
            raise _fail(where, f"expected an array of {len(items)} items")
        return tuple(c(x, f"{where}[{i}]") for i, (c, x) in enumerate(zip(items, v, strict=True)))

    return check


def path(v: Any, where: str) -> str:
    if type(v) is not bytes:
        raise _fail(where, "expected a path (binary)")
    try:
        return check_relpath(v, allow_root=True)
    except PathError as exc:
        raise _fail(where, str(exc)) from None


def name(v: Any, where: str) -> str:
    result = path(v, where)
    if not result or "/" in result:
        raise _fail(where, "expected a single path component")
    return result


def anything(v: Any, where: str) -> Any:
    return v


def prefix(v: Any, where: str) -> bytes:
    if type(v) is not bytes or not 8 <= len(v) <= 32:
        raise _fail(where, "expected a hash prefix of 8 to 32 bytes")
    return v


ID = uint((1 << 32) - 1, low=1)  # conversation ids; 0 is not one
HASH = binary(32, exact=32)


def HB(v: Any, where: str) -> int:
    if v not in (8, 32) or type(v) is not int:
        raise _fail(where, "hash bytes must be 8 or 32")
    return v


MODE = uint(0o7777)
TOP = record(MODE, sint)  # the opened directory's own mode and mtime
VECTOR = record(array(sint, MAX_TIMES), binary(2 * MAX_TIMES))
ENTRY = record(name, one_of("f", "d", "l"), MODE, binary(4096))
OP = one_of("mkdir", "link", "rm", "rmdir", "mode", "mv", "meta")
FULL_ENTRY = record(
    name, one_of("f", "d", "l"), MODE, binary(4096), sint, binary(32), binary(32)
)


def entry(v: Any, where: str) -> tuple:
    """A listing entry: 4 items, or 7 with ``meta`` (mtime, meta and sync meta prefixes)."""
    return FULL_ENTRY(v, where) if type(v) is list and len(v) == 7 else ENTRY(v, where)


# (check, default): default ABSENT means required; ``optional_key`` fields are left out of
# the checked message when absent.
Field = tuple[Check, Any]
OPTIONAL_KEY = object()

SCHEMAS: dict[str, dict[str, Field]] = {
    "hello": {
        "proto": (record(uint(1 << 16), uint(1 << 16)), ABSENT),
        "agent": (text(256), ""),
        "features": (array(text(64), 64), []),
        "token": (text(1024), ""),
        "format": (text(512), ""),
    },
    "welcome": {
        "proto": (uint(1 << 16), ABSENT),
        "agent": (text(256), ""),
        "features": (array(text(64), 64), []),
        "format": (text(512), ""),
    },
    "error": {
        "id": (optional(ID), None),
        "code": (text(32), "internal"),
        "msg": (text(4096), ""),
    },
    "open": {
        "id": (ID, ABSENT),
        "share": (text(255), ABSENT),
        "path": (path, ""),
        "write": (boolean, False),
        "create": (boolean, False),
        "excludes": (array(text(1024), 1000), []),
    },
    "opened": {
        "id": (ID, ABSENT),
        "content": (HASH, ABSENT),
        "meta": (HASH, ABSENT),
        "smeta": (optional(HASH), None),
        "unreadable": (uint(), 0),
        "writable": (boolean, False),
        "seq": (uint(), 0),
        "top": (optional(TOP), None),
        "fixed": (boolean, False),
    },
    "list": {
        "id": (ID, ABSENT),
        "paths": (array(path), ABSENT),
        "hb": (HB, 8),
        "meta": (boolean, False),
    },
    "listing": {
        "id": (ID, ABSENT),
        "dirs": (array(record(path, optional(array(entry, MAX_ENTRIES)))), ABSENT),
        "more": (boolean, False),
    },
    "mlist": {"id": (ID, ABSENT), "paths": (array(path), ABSENT), "hb": (HB, 8)},
    "mlisting": {
        "id": (ID, ABSENT),
        "dirs": (
            array(record(path, binary(32), boolean, VECTOR, VECTOR, binary(32 * MAX_ENTRIES))),
            ABSENT,
        ),
        "more": (boolean, False),
    },
    "mset": {
        "id": (ID, ABSENT),
        "dirs": (array(record(path, binary(32), boolean, VECTOR, VECTOR)), ABSENT),
    },
    "ok": {"id": (ID, ABSENT), "applied": (uint(), 0), "skipped": (uint(), 0)},
    "offer": {
        "id": (ID, ABSENT),
        "path": (path, OPTIONAL_KEY),
        "size": (uint(), ABSENT),
        "root": (HASH, ABSENT),
        "depth": (uint(64), ABSENT),
        "sketch": (optional(binary(12, exact=12)), None),
        "mode": (MODE, 0o644),
        "mtime": (sint, 0),
        "expect": (optional(prefix), OPTIONAL_KEY),
        "data": (binary(255), OPTIONAL_KEY),
        "subs": (record(binary(MAX_PIECE), binary(MAX_PIECE)), OPTIONAL_KEY),
    },
    "get": {
        "id": (ID, ABSENT),
        "path": (path, ABSENT),
        "expect": (optional(prefix), OPTIONAL_KEY),
    },
    "want": {
        "id": (ID, ABSENT),
        "k": (one_of("whole", "expand", "subs", "fine", "fetch"), ABSENT),
        "nodes": (array(record(uint(64), uint())), []),
        "leaves": (array(uint()), []),
        "mids": (array(record(uint(), uint())), []),
        "items": (array(record(uint(), uint(), uint())), []),
    },
    "lists": {"id": (ID, ABSENT), "lists": (array(record(uint(), binary(MAX_PIECE),
                                                         binary(MAX_PIECE))), ABSENT)},
    "data": {"id": (ID, ABSENT), "d": (array(binary(MAX_PIECE)), ABSENT), "end": (boolean, False)},
    "more": {"id": (ID, ABSENT), "n": (uint(1 << 40), ABSENT)},
    "done": {
        "id": (ID, ABSENT),
        "ok": (boolean, ABSENT),
        "how": (text(16), ""),
        "literal": (uint(), 0),
        "matched": (uint(), 0),
        "code": (text(32), ""),
        "msg": (text(4096), ""),
    },
    "ops": {
        "id": (ID, ABSENT),
        "ops": (
            array(record(OP, path, anything, anything)),
            ABSENT,
        ),
    },
    "oks": {"id": (ID, ABSENT), "results": (array(optional(record(text(32), text(4096)))),
                                            ABSENT)},
    "finish": {"id": (ID, ABSENT)},
    "watch": {"id": (ID, ABSENT), "seq": (uint(), 0)},
    "ping": {},
    "changed": {"id": (ID, ABSENT), "seq": (uint(), ABSENT)},
    "finished": {
        "id": (ID, ABSENT),
        "content": (HASH, ABSENT),
        "meta": (HASH, ABSENT),
        "smeta": (optional(HASH), None),
        "unreadable": (uint(), 0),
        "seq": (uint(), 0),
        "top": (optional(TOP), None),
    },
}


def check(message: dict[str, Any]) -> dict[str, Any]:
    """The message with every known field checked and defaults filled in."""
    kind = message.get("t")
    schema = SCHEMAS.get(kind)  # type: ignore[arg-type]
    if schema is None:
        raise ProtocolError(message=f"unknown message type {kind!r}")
    out: dict[str, Any] = {"t": kind}
    for key, (field_check, default) in schema.items():
        if key in message:
            out[key] = field_check(message[key], f"{kind}.{key}")
        elif default is ABSENT:
            raise ProtocolError(message=f"{kind}: missing field {key!r}")
        elif default is not OPTIONAL_KEY:
            out[key] = list(default) if isinstance(default, list) else default
    return out
