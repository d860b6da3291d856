"""The messages of docs/protocol.md, typed: one class per message type.

A message from a peer becomes an object in one place, `decode`, which checks every field
(type, size, range) and turns wire forms into internal ones (paths: ``bin`` to rdc's
``str``; records: small typed values); a message to a peer becomes a map in one place,
`encode`. Nothing outside rdc.wire reads a message by string key, and a change to one
message's fields is a change to its class, its users and docs/protocol.md.

Each class lists its fields as dataclass fields whose metadata holds the field's check
(`read`); a field with a default may be absent on the wire. The conversation id is not a
field: the connection adds and strips it (`encode`, `decode`).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any, ClassVar, TypeVar

from rdc import records
from rdc.content.refine import MAX_HASHES, REFINE_LIMIT
from rdc.content.sketch import TRAIT_VALUES, TRAITS
from rdc.content.subchunks import SHORT_PREFIXES
from rdc.errors import ProtocolError
from rdc.local.paths import PathError, check_relpath, to_wire
from rdc.params import OFFER_ROOT, REFINE_HASH, SHORT_WIRE_PREFIX, SUB_PREFIX, WIRE_PREFIX
from rdc.wire.codec import MAX_ITEMS, MAX_PIECE

Check = Callable[[Any, str], Any]
MAX_ENTRIES = 16384  # directory entries in one listing item
HAVE_BYTES = 6 * 8192  # fingerprints of one directory in a list's ``have``
# A set sketch of one directory in a list's ``sketch``: capacity 16 at most, as decoding
# costs the server the square of it (a peer may name one directory many times).
SKETCH_BYTES = 4 * 16
MAX_TIMES = 1 << 16  # entries in one metadata vector
HASH_BYTES = 32
INT64 = (-(1 << 63), (1 << 63) - 1)


def _fail(where: str, what: str) -> ProtocolError:
    return ProtocolError(message=f"{where}: {what}")


# ---------------------------------------------------------------- checks of wire values


def uint(limit: int = (1 << 64) - 1, low: int = 0) -> Check:
    def check(v: Any, where: str) -> int:
        if type(v) is not int or not low <= v <= limit:
            raise _fail(where, f"expected an integer in {low}..{limit}")
        return v

    return check


def sint(v: Any, where: str) -> int:
    if type(v) is not int or not INT64[0] <= v <= INT64[1]:
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


def binary(limit: int, exact: int | None = None, low: int = 0) -> Check:
    def check(v: Any, where: str) -> bytes:
        if type(v) is not bytes or not low <= len(v) <= limit or (
            exact is not None and len(v) != exact
        ):
            size = f"exactly {exact}" if exact is not None else f"{low} to {limit}"
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
        return fields(v, where, [item] * len(v))

    return check


def fields(v: list, where: str, checks: Sequence[Check]) -> list:
    """Each item of ``v`` through its check: the place of each (``where[i]``) is written
    out only to name the one that failed, not for every item of every array and every
    field of every file of a batch."""
    try:
        return [check(x, where) for check, x in zip(checks, v, strict=True)]
    except ProtocolError:  # checked again with each item's place, for the message
        for i, (check, x) in enumerate(zip(checks, v, strict=True)):
            check(x, f"{where}[{i}]")
        raise


def items(v: Any, where: str, count: int | Sequence[int]) -> list:
    """``v`` as a fixed-length array (one of ``count`` lengths)."""
    counts = (count,) if isinstance(count, int) else tuple(count)
    if type(v) is not list or len(v) not in counts:
        raise _fail(where, f"expected an array of {' or '.join(map(str, counts))} items")
    return v


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


def prefix(v: Any, where: str) -> bytes:
    if type(v) is not bytes or not SHORT_WIRE_PREFIX <= len(v) <= HASH_BYTES:
        raise _fail(where, f"expected a hash prefix of {SHORT_WIRE_PREFIX} to 32 bytes")
    return v


ID = uint((1 << 32) - 1, low=1)  # conversation ids; 0 is not one
HASH = binary(HASH_BYTES, exact=HASH_BYTES)
OFFERED_ROOT = binary(HASH_BYTES, low=OFFER_ROOT)


def same_root(root: bytes | None, offered: bytes) -> bool:
    """Whether a whole ``root`` is the one an offer names (whole, or its first bytes); no
    root (None: nothing known) is none."""
    return root is not None and len(offered) >= OFFER_ROOT and root[: len(offered)] == offered
MAX_MODE = 0o7777
MODE = uint(MAX_MODE)
_TRAIT_BYTES = binary(TRAITS, exact=TRAITS)


def _sketch(v: Any, where: str) -> bytes:
    """12 traits of 6 bits, a byte each: a larger byte would index past the inverted
    lists (a fuzzed bit flip made one: an IndexError, an internal error)."""
    v = _TRAIT_BYTES(v, where)
    if max(v) >= TRAIT_VALUES:
        raise _fail(where, f"sketch traits are below {TRAIT_VALUES}")
    return v


SKETCH = optional(_sketch)


def hash_bytes(v: Any, where: str) -> int:
    if type(v) is not int or v not in (SHORT_WIRE_PREFIX, WIRE_PREFIX, HASH_BYTES):
        raise _fail(where, f"hash bytes must be {SHORT_WIRE_PREFIX}, {WIRE_PREFIX} or 32")
    return v


# ---------------------------------------------------------------- records inside messages


T = TypeVar("T")


def record(cls: type[T]) -> Check:
    """The check of a record class: its ``from_wire``."""
    return cls.from_wire  # type: ignore[attr-defined]


@records.record
class Top:
    """The opened directory's own mode and mtime."""

    mode: int
    mtime_ns: int

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Top:
        mode, mtime = items(v, where, 2)
        return cls(MODE(mode, f"{where}[0]"), sint(mtime, f"{where}[1]"))

    def to_wire(self) -> list:
        return [self.mode, self.mtime_ns]


_KINDS = ("f", "d", "l")  # of a listed entry
_MAX_DIGEST = 4096  # bytes of a listed entry's digest (a link's target)


@records.record
class Listed:
    """A directory entry as a listing describes it: kind (f, d, l), mode, and hash
    prefix (a link's whole target); with ``sizes`` listings also a file's size; with
    ``meta`` listings also its mtime and, for a directory, its meta and sync-meta hash
    prefixes."""

    name: str
    kind: str
    mode: int
    digest: bytes
    mtime_ns: int = 0
    meta: bytes = b""
    smeta: bytes = b""
    has_meta: bool = False
    size: int | None = None  # None: not asked for

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Listed:
        """The entry; its fields checked inline first (listings carry thousands), and only
        an entry that fails them is checked again field by field, for the message."""
        return cls._inline(v) or cls.from_wire_by_field(v, where)

    @classmethod
    def _inline(cls, v: Any) -> Listed | None:
        """The entry if every field is good, else None: `from_wire_by_field`'s checks
        without building a check or a place per field."""
        if type(v) is not list or len(v) not in (4, 5, 7, 8):
            return None
        name_, kind, mode, digest = v[0], v[1], v[2], v[3]
        sized = len(v) in (5, 8)
        size = v[4] if sized else None
        if not (type(name_) is bytes and type(kind) is str and kind in _KINDS
                and type(mode) is int and 0 <= mode <= MAX_MODE
                and type(digest) is bytes and len(digest) <= _MAX_DIGEST
                and (not sized or (type(size) is int and 0 <= size < 1 << 64))):
            return None
        try:
            text_ = check_relpath(name_)
        except PathError:
            return None
        if not text_ or "/" in text_:
            return None
        if len(v) < 7:
            return cls(text_, kind, mode, digest, size=size)
        mtime, meta, smeta = v[-3], v[-2], v[-1]
        if not (type(mtime) is int and INT64[0] <= mtime <= INT64[1]
                and type(meta) is bytes and len(meta) <= HASH_BYTES
                and type(smeta) is bytes and len(smeta) <= HASH_BYTES):
            return None
        return cls(text_, kind, mode, digest, mtime, meta, smeta, True, size)

    @classmethod
    def from_wire_by_field(cls, v: Any, where: str) -> Listed:
        """The entry checked one field at a time, naming the place of a bad one."""
        v = items(v, where, (4, 5, 7, 8))
        fields = (name(v[0], f"{where}[0]"), one_of(*_KINDS)(v[1], f"{where}[1]"),
                  MODE(v[2], f"{where}[2]"), binary(_MAX_DIGEST)(v[3], f"{where}[3]"))
        size = None
        if len(v) in (5, 8):
            size = uint()(v[4], f"{where}[4]")
            v = v[:4] + v[5:]
        if len(v) == 4:
            return cls(*fields, size=size)
        return cls(*fields, sint(v[4], f"{where}[4]"), binary(HASH_BYTES)(v[5], f"{where}[5]"),
                   binary(HASH_BYTES)(v[6], f"{where}[6]"), True, size)

    def to_wire(self) -> list:
        item = [to_wire(self.name), self.kind, self.mode, self.digest]
        if self.size is not None:
            item.append(self.size)
        if self.has_meta:
            item += [self.mtime_ns, self.meta, self.smeta]
        return item


@records.record
class Listing:
    """One directory of a ``listing``: its entries, or None if it is not a directory.
    ``path`` None (between peers with ``asked-listings``): the directory asked for in this
    item's place (`rdc.transfer.sides.Remote.listings` resolves it)."""

    path: str | None
    entries: list[Listed] | None
    # Answering ``have``: one bit per fingerprint the client sent, set where this side has
    # that entry; ``entries`` are then only those the client did not name.
    matched: bytes | None = None
    # Answering ``sketch``: this side's sums of the same capacity; ``entries`` are then
    # those of its entries that differ from the client's (rdc.transfer.reconcile).
    sums: bytes | None = None

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Listing:
        v = items(v, where, (2, 3, 4))
        out = cls(optional(path)(v[0], f"{where}[0]"),
                  optional(array(record(Listed), MAX_ENTRIES))(v[1], f"{where}[1]"))
        if len(v) >= 3:
            out = dataclasses.replace(
                out, matched=optional(binary(HAVE_BYTES // 48 + 1))(v[2], f"{where}[2]"))
        if len(v) == 4:
            out = dataclasses.replace(
                out, sums=optional(binary(SKETCH_BYTES, low=4))(v[3], f"{where}[3]"))
        return out

    def to_wire(self) -> list:
        entries = None if self.entries is None else [e.to_wire() for e in self.entries]
        item = [None if self.path is None else to_wire(self.path), entries]
        if self.sums is not None:
            return [*item, self.matched, self.sums]
        return item if self.matched is None else [*item, self.matched]


@records.record
class Vector:
    """Integers as a table of the distinct values and one index per value (1 byte each
    for at most 256 distinct values, else 2 bytes big-endian)."""

    table: list[int]
    index: bytes

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Vector:
        table, index = items(v, where, 2)
        return cls(array(sint, MAX_TIMES)(table, f"{where}[0]"),
                   binary(2 * MAX_TIMES)(index, f"{where}[1]"))

    def to_wire(self) -> list:
        return [self.table, self.index]

    @classmethod
    def encode(cls, values: Sequence[int]) -> Vector:
        table = sorted(set(values))
        keys = list(map({t: i for i, t in enumerate(table)}.__getitem__, values))
        if len(table) <= 256:
            return cls(table, bytes(keys))
        return cls(table, struct.pack(f">{len(keys)}H", *keys))

    def decode(self) -> list[int]:
        """The values; ValueError if the index does not fit the table. (A vector per
        directory each way, both sides: one element at a time this was a tenth of the
        metadata pass.)"""
        table, index = self.table, self.index
        if len(table) <= 256:
            keys: Sequence[int] = index
        elif len(index) % 2:
            raise ValueError("vector index has a partial entry")
        else:
            keys = struct.unpack(f">{len(index) // 2}H", index)
        if keys and max(keys) >= len(table):
            raise ValueError("vector index points past its table")
        return list(map(table.__getitem__, keys))


@records.record
class MetaDir:
    """One directory of an ``mlisting`` (``metas`` set) or an ``mset`` (empty)."""

    path: str | None  # None (``asked-meta``): the directory asked for in this item's place
    content: bytes  # content hash prefix: the vectors apply only where it matches
    whole: bool  # the vectors cover the whole subtree, depth-first
    times: Vector
    modes: Vector
    metas: bytes = b""  # meta hash prefixes of the subdirectories (not whole)
    # An ``mlist`` with ``split``: the vectors are of the subdirectories alone, and this is
    # the hash prefix of the other entries' (`rdc.local.snapshot.files_meta`); empty else.
    files: bytes = b""

    @classmethod
    def from_wire(cls, v: Any, where: str) -> MetaDir:
        v = items(v, where, (5, 6, 7))
        out = cls(optional(path)(v[0], f"{where}[0]"), binary(HASH_BYTES)(v[1], f"{where}[1]"),
                  boolean(v[2], f"{where}[2]"), Vector.from_wire(v[3], f"{where}[3]"),
                  Vector.from_wire(v[4], f"{where}[4]"))
        if len(v) >= 6:
            out = dataclasses.replace(
                out, metas=binary(HASH_BYTES * MAX_ENTRIES)(v[5], f"{where}[5]"))
        if len(v) == 7:
            out = dataclasses.replace(out, files=binary(HASH_BYTES)(v[6], f"{where}[6]"))
        return out

    def to_wire(self, with_metas: bool = True) -> list:
        item = [None if self.path is None else to_wire(self.path), self.content, self.whole,
                self.times.to_wire(),
                self.modes.to_wire()]
        if not with_metas:
            return item
        return [*item, self.metas, self.files] if self.files else [*item, self.metas]


@records.record
class Expected:
    """What a request expects at a path (docs/protocol.md ``expect``): nothing there
    (``kind`` ""), or an entry as a listing showed it (kind and hash prefix; a link's
    whole target). A request without one (None) checks nothing."""

    kind: str = ""
    digest: bytes = b""

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Expected:
        if v == []:
            return cls()
        kind, digest = items(v, where, 2)
        return cls(one_of("f", "d", "l")(kind, f"{where}[0]"),
                   binary(4096)(digest, f"{where}[1]"))

    def to_wire(self) -> list:
        return [self.kind, self.digest] if self.kind else []


NOTHING = Expected()


@records.record
class Op:
    """One operation of ``ops``: what it does (``kind``), where, with what, and what it
    expects to find there first."""

    KINDS: ClassVar[tuple[str, ...]] = ("mkdir", "link", "rm", "rmdir", "mv", "meta")
    kind: str
    path: str
    mode: int = 0  # mkdir, meta
    mtime_ns: int = 0  # meta
    target: bytes = b""  # link: the link's target
    destination: str = ""  # mv
    expect: Expected | None = None

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Op:
        kind, p, arg, expect = items(v, where, 4)
        kind = one_of(*cls.KINDS)(kind, f"{where}[0]")
        out = cls(kind, path(p, f"{where}[1]"),
                  expect=optional(record(Expected))(expect, f"{where}[3]"))
        at = f"{where}[2]"
        if kind == "mkdir":
            return dataclasses.replace(out, mode=MODE(arg, at))
        if kind == "link":
            return dataclasses.replace(out, target=binary(4096, low=1)(arg, at))
        if kind == "mv":
            destination = path(arg, at)
            if not destination:
                raise _fail(at, "mv needs a destination path")
            return dataclasses.replace(out, destination=destination)
        if kind == "meta":
            mode, mtime = items(arg, at, 2)
            return dataclasses.replace(out, mode=MODE(mode, at), mtime_ns=sint(mtime, at))
        if arg is not None:
            raise _fail(at, f"{kind} takes no argument")
        return out

    def to_wire(self) -> list:
        arg: Any = None
        if self.kind == "mkdir":
            arg = self.mode
        elif self.kind == "link":
            arg = self.target
        elif self.kind == "mv":
            arg = to_wire(self.destination)
        elif self.kind == "meta":
            arg = [self.mode, self.mtime_ns]
        expect = None if self.expect is None else self.expect.to_wire()
        return [self.kind, to_wire(self.path), arg, expect]


@records.record
class Failure:
    """Why one op (or one file of a batch) failed: an error code and a message."""

    code: str
    msg: str

    @classmethod
    def from_wire(cls, v: Any, where: str) -> Failure:
        code, msg = items(v, where, 2)
        return cls(text(32)(code, f"{where}[0]"), text(4096)(msg, f"{where}[1]"))

    def to_wire(self) -> list:
        return [self.code, self.msg]


@records.record
class EntryList:
    """Entries as they travel: hash prefixes, concatenated, and their lengths as LEB128
    varints. ``first`` is the index of the first one in its level (0 for sub-chunks)."""

    first: int
    prefixes: bytes
    lengths: bytes

    @classmethod
    def from_wire(cls, v: Any, where: str) -> EntryList:
        first, prefixes, lengths = items(v, where, 3)
        return cls(uint()(first, f"{where}[0]"), binary(MAX_PIECE)(prefixes, f"{where}[1]"),
                   binary(MAX_PIECE)(lengths, f"{where}[2]"))

    def to_wire(self) -> list:
        return [self.first, self.prefixes, self.lengths]


def node(v: Any, where: str) -> tuple[int, int]:
    level, index = items(v, where, 2)
    return uint(64)(level, f"{where}[0]"), uint()(index, f"{where}[1]")


def mid(v: Any, where: str) -> tuple[int, int]:
    leaf, k = items(v, where, 2)
    return uint()(leaf, f"{where}[0]"), uint()(k, f"{where}[1]")


def fetch_item(v: Any, where: str) -> tuple[int, int, int] | tuple[int, int, int, bytes, int]:
    """(leaf, start, length), with the old bytes' block hashes and length when refined."""
    if type(v) is list and len(v) == 5:
        *plain, hashes, old_length = v
        hashes = binary(MAX_HASHES)(hashes, f"{where}[3]")
        if len(hashes) % REFINE_HASH:
            raise ProtocolError(message=f"{where}[3]: block hashes with a partial entry")
        return (*fetch_item(plain, where), hashes, uint(REFINE_LIMIT)(old_length, f"{where}[4]"))
    leaf, start, length = items(v, where, 3)
    return (uint()(leaf, f"{where}[0]"), uint()(start, f"{where}[1]"),
            uint()(length, f"{where}[2]"))


# ---------------------------------------------------------------- message classes


def wire(check: Check, default: Any = dataclasses.MISSING, *, key: str | None = None,
         out: Callable[[Any], Any] | None = None, factory: Callable[[], Any] | None = None,
         omit: Any = dataclasses.MISSING) -> Any:
    """A message field: ``check`` reads it from the wire, ``out`` writes it (default: as
    is, or ``to_wire()`` of a record); ``key`` is its wire name if not the field's; a
    field equal to ``omit`` is left out of the map."""
    metadata = {"check": check, "key": key, "out": out, "omit": omit}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


class Message:
    """A message of the protocol. ``TYPE`` is its ``t``; ``KIND`` its ``k`` where one
    type has several (``want``). ``REQUEST``: it starts a conversation (client to server;
    docs/protocol.md section 3's table), and ``FOLLOW_UPS``: the client sends more in that
    conversation after it."""

    TYPE: ClassVar[str]
    KIND: ClassVar[str | None] = None
    REQUEST: ClassVar[bool] = False
    FOLLOW_UPS: ClassVar[bool] = False


M = TypeVar("M", bound=Message)
_BY_TYPE: dict[str, type[Message] | dict[str, type[Message]]] = {}


def message(t: str, kind: str | None = None) -> Callable[[type[M]], type[M]]:
    def register(cls: type[M]) -> type[M]:
        cls = records.record(kw_only=True)(cls)
        cls.TYPE, cls.KIND = t, kind
        if kind is None:
            _BY_TYPE[t] = cls
        else:
            kinds = _BY_TYPE.setdefault(t, {})
            assert isinstance(kinds, dict)
            kinds[kind] = cls
        return cls

    return register


def _write(value: Any) -> Any:
    if hasattr(value, "to_wire"):
        return value.to_wire()
    if isinstance(value, list):
        return [_write(item) for item in value]
    return value


def encode(msg: Message, conversation: int | None = None) -> dict[str, Any]:
    """The map of ``msg`` as it travels, with ``id`` if it belongs to a conversation."""
    out: dict[str, Any] = {"t": msg.TYPE}
    if conversation is not None:
        out["id"] = conversation
    if msg.KIND is not None:
        out["k"] = msg.KIND
    for f in dataclasses.fields(msg):  # type: ignore[arg-type]
        value = getattr(msg, f.name)
        meta = f.metadata
        if meta.get("omit", dataclasses.MISSING) is not dataclasses.MISSING and (
            value == meta["omit"]
        ):
            continue
        writer = meta.get("out")
        out[meta.get("key") or f.name] = writer(value) if writer else _write(value)
    return out


def decode(raw: dict[str, Any]) -> tuple[int | None, Message]:
    """The conversation id (None if there is none) and the checked message of one map
    from a peer; ProtocolError for anything that does not fit docs/protocol.md."""
    t = raw.get("t")
    cls = _BY_TYPE.get(t) if isinstance(t, str) else None
    if isinstance(cls, dict):
        kind = raw.get("k")
        cls = cls.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise ProtocolError(message=f"{t}: unknown or missing k {raw.get('k')!r}")
    if cls is None:
        raise ProtocolError(message=f"unknown message type {t!r}")
    conversation = ID(raw["id"], f"{t}.id") if raw.get("id") is not None else None
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f.metadata.get("key") or f.name
        if key in raw:
            values[f.name] = f.metadata["check"](raw[key], f"{t}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(message=f"{t}: missing field {key!r}")
    return conversation, cls(**values)


# -- the handshake


def versions(v: Any, where: str) -> tuple[int, int]:
    low, high = items(v, where, 2)
    return uint(1 << 16)(low, f"{where}[0]"), uint(1 << 16)(high, f"{where}[1]")


def file_expect(v: Any, where: str) -> Expected:
    """A file's ``expect`` (offer, get): nil for nothing there, else a root prefix."""
    return NOTHING if v is None else Expected("f", prefix(v, where))


def sub_list(v: Any, where: str) -> EntryList:
    """An offer's ``subs``: [prefixes, lengths] of the file's one chunk."""
    prefixes, lengths = items(v, where, 2)
    return EntryList(0, binary(MAX_PIECE)(prefixes, f"{where}[0]"),
                     binary(MAX_PIECE)(lengths, f"{where}[1]"))


@message("hello")
class Hello(Message):
    proto: tuple[int, int] = wire(versions, out=list)
    agent: str = wire(text(256), "")
    features: list[str] = wire(array(text(64), 64), factory=list)
    token: str = wire(text(1024), "")
    format: str = wire(text(512), "")


@message("welcome")
class Welcome(Message):
    proto: int = wire(uint(1 << 16))
    agent: str = wire(text(256), "")
    features: list[str] = wire(array(text(64), 64), factory=list)
    format: str = wire(text(512), "", omit="")  # "": the same as the client's (same-format)
    host: str = wire(text(255), "", omit="")  # the server's host name (conflict copies)


@message("error")
class Error(Message):
    """Ends a conversation (with an id) or the connection (without)."""

    code: str = wire(text(32), "internal")
    msg: str = wire(text(4096), "")


@message("ping")
class Ping(Message):
    pass


# -- open, listings, metadata, ops, finish, watch


@message("open")
class Open(Message):
    REQUEST = True
    share: str = wire(text(255))
    path: str = wire(path, "", out=to_wire)
    write: bool = wire(boolean, False)
    create: bool = wire(boolean, False)
    excludes: list[str] = wire(array(text(1024), 1000), factory=list)
    checksum: bool = wire(boolean, False, omit=False)
    # (``stamp-roots``) The client's index is cold: it offers a sync by stamp roots and
    # sends a ``stamps`` request next, by which the server decides.
    stamps: bool = wire(boolean, False, omit=False)
    # (``warm-stamps``) The client's index is warm and it offers a sync by stamp roots:
    # they pay only if the server's is cold, and the client sends its ``stamps`` only if
    # the server asks for it (a ``stamped`` with ``want`` before ``opened``).
    warm: bool = wire(boolean, False, omit=False)


@message("opened")
class Opened(Message):
    content: bytes = wire(HASH)
    meta: bytes = wire(HASH)
    smeta: bytes | None = wire(optional(HASH), None)
    unreadable: int = wire(uint(), 0)
    writable: bool = wire(boolean, False)
    seq: int = wire(uint(), 0)
    top: Top | None = wire(optional(record(Top)), None)
    fixed: bool = wire(boolean, False)
    files: int | None = wire(optional(uint()), None, omit=None)
    marker_lost: bool = wire(boolean, False, omit=False)


STAMP_BINS = 64  # the bins of a ``stamps`` request's sketch, 4 bytes each


@message("stamps")
class Stamps(Message):
    """After ``open`` with ``stamps``: the client's sketch of the (path, size, time) of
    its files (rdc.transfer.quickcheck), for the server to judge whether stamps tell the
    trees apart."""

    REQUEST = True
    sketch: bytes = wire(binary(4 * STAMP_BINS, exact=4 * STAMP_BINS))
    # Files modified at this time (ns since the epoch) or later keep their true roots, on
    # both sides: the client's clock at its walk, less two seconds.
    racy_from: int = wire(sint, 0)
    # The sketch of its paths, with tags of their sizes and times (8 bytes a bin): where
    # the stamps are less alike, whether they differ only where sizes do.
    paths: bytes | None = wire(optional(binary(8 * STAMP_BINS, exact=8 * STAMP_BINS)), None,
                               omit=None)


@message("stamped")
class Stamped(Message):
    """The answer to ``stamps``, as soon as the server decided: whether this sync goes by
    stamp roots (then ``opened`` gives the hashes of such a tree), or reads (then the
    client scans its tree while the server scans its own)."""

    stamps: bool = wire(boolean, False, omit=False)
    # (``warm-stamps``: sent in an ``open``'s conversation, before ``opened``, to a warm
    # client) The server's index is cold: the client sends its ``stamps`` now.
    want: bool = wire(boolean, False, omit=False)


@message("roots")
class Roots(Message):
    """(``stamp-roots``) The content roots of files of the opened directory, read where its
    index does not know them: a pull by stamp roots checks a move with them."""

    REQUEST = True
    paths: list[str] = wire(array(path), out=lambda ps: [to_wire(p) for p in ps])


@message("rooted")
class Rooted(Message):
    """Per path asked for, the first WIRE_PREFIX bytes of its root; nil where it is not a
    regular file that could be read."""

    roots: list[bytes | None] = wire(array(optional(binary(WIRE_PREFIX, exact=WIRE_PREFIX))))


@message("list")
class List(Message):
    REQUEST = True
    paths: list[str] = wire(array(path), out=lambda ps: [to_wire(p) for p in ps])
    hb: int = wire(hash_bytes, 8)
    meta: bool = wire(boolean, False)
    sizes: bool = wire(boolean, False, omit=False)
    # Per path, the fingerprints (6 bytes each) of the entries the client has there, or
    # nil: the server answers with a bitmap and the entries it has that were not named.
    have: list[bytes | None] | None = wire(optional(array(optional(binary(HAVE_BYTES)))),
                                           None, omit=None)
    # Per path (between peers with ``listing-sketch``), in place of ``have``: the set
    # sketch of those fingerprints (4 bytes a sum); the server answers with its own sums
    # and the entries it has that differ.
    sketch: list[bytes | None] | None = wire(
        optional(array(optional(binary(SKETCH_BYTES, low=4)))), None, omit=None)


@message("listing")
class Listings(Message):
    dirs: list[Listing] = wire(array(record(Listing)))
    more: bool = wire(boolean, False)


@message("mlist")
class MetaList(Message):
    REQUEST = True
    paths: list[str] = wire(array(path), out=lambda ps: [to_wire(p) for p in ps])
    hb: int = wire(hash_bytes, 8)
    # False: a ``whole`` item's vectors are left empty and its ``metas`` is the subtree's
    # own meta hash prefix (a pushing client sends its own vectors where that differs).
    vectors: bool = wire(boolean, True)
    # True: no item is ``whole`` (a pulling client that wrote in few directories descends
    # to them rather than take whole subtrees' vectors; a server that ignores it sends
    # whole items, which the client takes as before).
    levels: bool = wire(boolean, False, omit=False)
    # True (with ``levels``, between peers with ``split-meta``): each item's vectors are of
    # its subdirectories alone, the other entries described by one hash (``files``); a
    # pull's content phase set its files' times already, and their vectors were most of
    # its metadata bytes. A server that ignores it sends whole vectors.
    split: bool = wire(boolean, False, omit=False)


@message("mlisting")
class MetaListing(Message):
    # Between peers with ``asked-meta``: one item per path asked for, in order, nil where
    # that path is not a directory, the item's path nil (the one asked for in its place).
    dirs: list[MetaDir | None] = wire(array(optional(record(MetaDir))))
    more: bool = wire(boolean, False)


def _named(v: Any, where: str) -> MetaDir:
    item = MetaDir.from_wire(v, where)
    if item.path is None:
        raise _fail(where, "expected the path of the directory")
    return item


@message("mset")
class MetaSet(Message):
    REQUEST = True
    dirs: list[MetaDir] = wire(array(_named),
                               out=lambda ds: [d.to_wire(with_metas=False) for d in ds])


@message("ok")
class Ok(Message):
    applied: int = wire(uint(), 0)
    skipped: int = wire(uint(), 0)


@message("ops")
class Ops(Message):
    REQUEST = True
    ops: list[Op] = wire(array(record(Op)))


@message("oks")
class OpResults(Message):
    results: list[Failure | None] = wire(array(optional(record(Failure))),
                                         out=lambda rs: [r and r.to_wire() for r in rs])


@message("finish")
class Finish(Message):
    REQUEST = True
    pass


@message("finished")
class Finished(Message):
    content: bytes = wire(HASH)
    meta: bytes = wire(HASH)
    smeta: bytes | None = wire(optional(HASH), None)
    unreadable: int = wire(uint(), 0)
    seq: int = wire(uint(), 0)
    top: Top | None = wire(optional(record(Top)), None)
    files: int | None = wire(optional(uint()), None, omit=None)
    marker_lost: bool = wire(boolean, False, omit=False)


@message("verify")
class Verify(Message):
    """Read every file of the opened directory again and compare it with its index."""

    REQUEST = True


@message("verified")
class Verified(Message):
    """What ``verify`` read, and the files whose content did not match their index."""

    files: int = wire(uint(), 0)
    size: int = wire(uint(), 0, key="bytes")
    mismatches: list[str] = wire(array(path), factory=list,
                                 out=lambda ps: [to_wire(p) for p in ps])
    unreadable: int = wire(uint(), 0)
    more: bool = wire(boolean, False)


@message("watch")
class Watch(Message):
    REQUEST = True
    seq: int = wire(uint(), 0)


@message("changed")
class Changed(Message):
    seq: int = wire(uint())


# -- files


@message("offer")
class Offer(Message):
    """What the source says of a file (``path`` and ``expect`` in a push only)."""

    REQUEST = FOLLOW_UPS = True
    size: int = wire(uint())
    root: bytes = wire(HASH)
    depth: int = wire(uint(64))
    sketch: bytes | None = wire(SKETCH, None)
    mode: int = wire(MODE, 0o644)
    mtime_ns: int = wire(sint, 0, key="mtime")
    path: str | None = wire(path, None, out=to_wire, omit=None)
    # push: what the source believes is at ``path`` (NOTHING, or a version of a file);
    # None: overwrite whatever is there.
    expect: Expected | None = wire(file_expect, None, out=lambda e: e.digest or None, omit=None)
    data: bytes | None = wire(binary(255), None, omit=None)
    subs: EntryList | None = wire(sub_list, None, out=lambda s: [s.prefixes, s.lengths],
                                  omit=None)


@message("get")
class Get(Message):
    REQUEST = FOLLOW_UPS = True
    path: str = wire(path, out=to_wire)
    expect: Expected | None = wire(file_expect, None, out=lambda e: e.digest or None, omit=None)


class Want(Message):
    """What the target asks of the source for one file (``k`` says what)."""

    TYPE = "want"


@message("want", "whole")
class WantWhole(Want):
    """Send all the content."""


@message("want", "expand")
class WantExpand(Want):
    """Send the children of these nodes, each (level, index)."""

    nodes: list[tuple[int, int]] = wire(array(node), factory=list,
                                        out=lambda ns: [list(n) for n in ns])


def sub_prefix(v: Any, where: str) -> int:
    """The hash prefix length a want asks sub-chunk lists in (rdc.content.subchunks)."""
    if v not in SHORT_PREFIXES:
        raise _fail(where, f"expected one of {', '.join(map(str, SHORT_PREFIXES))}")
    return v


@message("want", "subs")
class WantSubs(Want):
    """Send the mid lists of these leaves, with hash prefixes of ``prefix`` bytes."""

    leaves: list[int] = wire(array(uint()), factory=list)
    prefix: int = wire(sub_prefix, SUB_PREFIX, key="p", omit=SUB_PREFIX)


@message("want", "fine")
class WantFine(Want):
    """Send the fine sub-chunk lists of these mids, each (leaf, mid index), with hash
    prefixes of ``prefix`` bytes."""

    mids: list[tuple[int, int]] = wire(array(mid), factory=list,
                                       out=lambda ms: [list(m) for m in ms])
    prefix: int = wire(sub_prefix, SUB_PREFIX, key="p", omit=SUB_PREFIX)


@message("want", "fetch")
class WantFetch(Want):
    """Send data: per item (leaf, start, length), bytes of a leaf; an item with the block
    hashes and length of the old bytes it replaces (a fourth and fifth element) is
    answered with ops
    (`rdc.content.refine`)."""

    items: list[tuple] = wire(array(fetch_item), factory=list,
                                             out=lambda its: [list(i) for i in its])


@message("lists")
class Lists(Message):
    lists: list[EntryList] = wire(array(record(EntryList)))


@message("data")
class Data(Message):
    d: list[bytes] = wire(array(binary(MAX_PIECE)))
    end: bool = wire(boolean, False)


@message("more")
class More(Message):
    n: int = wire(uint(1 << 40))


@message("done")
class Done(Message):
    """The target ends a file's conversation: how it went."""

    ok: bool = wire(boolean)
    how: str = wire(text(16), "")
    literal: int = wire(uint(), 0)
    matched: int = wire(uint(), 0)
    code: str = wire(text(32), "")
    msg: str = wire(text(4096), "")


# -- small files in batches


def _expect_in_batch(v: Any, where: str) -> Expected | None:
    """A file offer's ``expect``: nil (overwrite), empty (nothing there) or a prefix."""
    if v is None:
        return None
    if v == b"":
        return NOTHING
    return Expected("f", prefix(v, where))


def _expect_out(expect: Expected | None) -> bytes | None:
    return None if expect is None else expect.digest


# The checks of a file offer's fields, in their order on the wire.
_FILE_OFFER: tuple[Check, ...] = (path, uint(), OFFERED_ROOT, uint(64), SKETCH, MODE, sint,
                                  _expect_in_batch, optional(binary(255)))


@records.record
class FileOffer:
    """One file of a batch, as an ``offer`` describes it. Its ``root`` is the whole root
    or (``short-digests``) its first OFFER_ROOT bytes: compare with `same_root`."""

    path: str
    size: int
    root: bytes
    depth: int
    sketch: bytes | None
    mode: int
    mtime_ns: int
    expect: Expected | None = None
    data: bytes | None = None

    @classmethod
    def from_wire(cls, v: Any, where: str) -> FileOffer | Failure:
        if type(v) is list and len(v) == 2:
            return Failure.from_wire(v, where)
        return cls(*fields(items(v, where, 9), where, _FILE_OFFER))

    def to_wire(self) -> list:
        return [to_wire(self.path), self.size, self.root, self.depth, self.sketch, self.mode,
                self.mtime_ns, _expect_out(self.expect), self.data]

    def as_offer(self) -> Offer:
        """The same file as a single ``offer`` (for the per-file exchange)."""
        return Offer(size=self.size, root=self.root, depth=self.depth, sketch=self.sketch,
                     mode=self.mode, mtime_ns=self.mtime_ns, path=self.path,
                     expect=self.expect, data=self.data)


@records.record
class FileRequest:
    """One file of a ``gets``: its path and what the client holds there."""

    path: str
    expect: Expected | None = None

    @classmethod
    def from_wire(cls, v: Any, where: str) -> FileRequest:
        p, expect = items(v, where, 2)
        return cls(path(p, f"{where}[0]"), _expect_in_batch(expect, f"{where}[1]"))

    def to_wire(self) -> list:
        return [to_wire(self.path), _expect_out(self.expect)]


VERDICTS = ("have", "copy", "done", "send", "descend", "delta")


def verdict(v: Any, where: str) -> str | Failure:
    if type(v) is str:
        return one_of(*VERDICTS)(v, where)
    return Failure.from_wire(v, where)


@message("offers")
class Offers(Message):
    """A batch of small files: the client's in a push, the server's answer to ``gets``."""

    REQUEST = FOLLOW_UPS = True
    files: list[FileOffer | Failure] = wire(array(record(FileOffer)))


@message("gets")
class Gets(Message):
    REQUEST = FOLLOW_UPS = True
    files: list[FileRequest] = wire(array(record(FileRequest)))


@message("verdicts")
class Verdicts(Message):
    """What the target makes of each file of a batch, in order."""

    verdicts: list[str | Failure] = wire(array(verdict),
                                         out=lambda vs: [_write(v) for v in vs])


_WANT_KINDS: dict[str, Check] = {"expand": array(node), "subs": array(uint()),
                                "fine": array(mid)}


@records.record
class FileWant:
    """One ``delta`` file's want in a batch's round: ``file``, its number among the
    batch's offers; ``kind`` (``expand``, ``subs``, ``fine``) and its nodes, leaves or mids,
    as the per-file want of that kind carries them, and for ``subs`` and ``fine`` the
    prefix length (a fourth element where it is not SUB_PREFIX)."""

    file: int
    kind: str
    asked: list
    prefix: int = SUB_PREFIX

    @classmethod
    def from_wire(cls, v: Any, where: str) -> FileWant:
        file, kind, asked, *rest = items(v, where, (3, 4))
        kind = one_of(*_WANT_KINDS)(kind, f"{where}[1]")
        return cls(uint(MAX_ITEMS)(file, f"{where}[0]"), kind,
                   _WANT_KINDS[kind](asked, f"{where}[2]"),
                   sub_prefix(rest[0], f"{where}[3]") if rest else SUB_PREFIX)

    def to_wire(self) -> list:
        out = [self.file, self.kind, self.asked]  # (tuples travel as arrays)
        return out if self.prefix == SUB_PREFIX else [*out, self.prefix]

    def want(self) -> WantExpand | WantSubs | WantFine:
        """The same want as the per-file exchange has it."""
        if self.kind == "expand":
            return WantExpand(nodes=self.asked)
        if self.kind == "subs":
            return WantSubs(leaves=self.asked, prefix=self.prefix)
        return WantFine(mids=self.asked, prefix=self.prefix)


@records.record
class FileFetch:
    """One ``delta`` file's literal data in a batch: its number and ``fetch`` items."""

    file: int
    items: list[tuple]

    @classmethod
    def from_wire(cls, v: Any, where: str) -> FileFetch:
        file, fetched = items(v, where, 2)
        return cls(uint(MAX_ITEMS)(file, f"{where}[0]"),
                   array(fetch_item)(fetched, f"{where}[1]"))

    def to_wire(self) -> list:
        return [self.file, self.items]


@message("wants")
class Wants(Message):
    """The target's wants of one round of a batch's descents (target -> source), answered
    by one ``lists`` holding the entry lists of every want in order."""

    wants: list[FileWant] = wire(array(record(FileWant)))


@message("fetches")
class Fetches(Message):
    """The literal data of a batch's ``delta`` files (target -> source), answered by
    ``data`` messages holding one piece per item, in order (the last with ``end``)."""

    files: list[FileFetch] = wire(array(record(FileFetch)))


@message("results")
class Results(Message):
    """How each file whose content was sent ended up: None (written) or why not."""

    results: list[Failure | None] = wire(array(optional(record(Failure))),
                                         out=lambda rs: [r and r.to_wire() for r in rs])


# -- health: rdc status


@records.record
class PeerHealth:
    """How one replica or watcher is doing, as ``report`` tells the server and ``health``
    tells ``rdc status``. Times are ages in milliseconds at the moment the message is sent
    (so the two machines' clocks never meet); None: never. On the wire a map (unknown keys
    ignored, absent ones default), so it can grow."""

    role: str = "watch"  # "follows": the share's own upstream; "replica" or "watch": a peer
    name: str = ""  # the peer's host (and share), or the upstream URL
    peer: str = ""  # the connection's address (filled in by the server)
    mode: str = ""  # two-way, send-only, receive-only
    state: str = ""  # in step, syncing, behind, away, failing
    connected_ms: int | None = None  # since the connection was made; None: not connected
    ok_ms: int | None = None  # since the last round that ended in step
    lag_ms: int = 0  # how long the oldest change not yet in step has waited; 0 in step
    last_lag_ms: int = 0  # from a change to in step, in the last round that got there
    pending: int = 0  # files the current round still moves, or the last one failed
    error: str = ""  # the last error
    error_ms: int | None = None
    rounds: int = 0
    bytes: int = 0  # on the wire, both ways, since it started

    TEXT: ClassVar[dict[str, int]] = {"role": 16, "name": 512, "peer": 512, "mode": 16,
                                      "state": 32, "error": 1024}
    AGES: ClassVar[tuple[str, ...]] = ("connected_ms", "ok_ms", "error_ms")
    COUNTS: ClassVar[tuple[str, ...]] = ("lag_ms", "last_lag_ms", "pending", "rounds", "bytes")

    @classmethod
    def from_wire(cls, v: Any, where: str) -> PeerHealth:
        if type(v) is not dict or len(v) > 64:
            raise _fail(where, "expected a map of at most 64 items")
        values: dict[str, Any] = {}
        for key, limit in cls.TEXT.items():
            if key in v:
                values[key] = text(limit)(v[key], f"{where}.{key}")
        for key in cls.AGES:
            if key in v:
                values[key] = optional(uint())(v[key], f"{where}.{key}")
        for key in cls.COUNTS:
            if key in v:
                values[key] = uint()(v[key], f"{where}.{key}")
        return cls(**values)

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@message("report")
class Report(Message):
    """A watching client or a replica tells the server how its rounds go (answer: ``ok``)."""

    REQUEST = True
    health: PeerHealth = wire(record(PeerHealth))


@message("status")
class Status(Message):
    """Ask how the opened share's replicas and watchers are doing (answer: ``health``)."""

    REQUEST = True


@message("health")
class Health(Message):
    share: str = wire(text(255), "")
    seq: int = wire(uint(), 0)
    peers: list[PeerHealth] = wire(array(record(PeerHealth)), factory=list)
# -- repositories exported by the server (docs/protocol.md section 3b)

OBJECT_NAME = text(512)  # a store object name; the server checks its spelling (check_name)
WINDOW = 4 << 20  # bytes of object data in flight, not yet granted by a ``more``


@message("repo")
class RepoOpen(Message):
    """Open a repository the server exports: the connection serves its store from now on."""

    REQUEST = True
    name: str = wire(text(255))


@message("repoed")
class RepoOpened(Message):
    writable: bool = wire(boolean)
    max_object: int = wire(uint())  # the largest object a put may store, in bytes
    exclusive: bool = wire(boolean, True)  # the store has atomic exclusive create
    connections: int = wire(uint(256, low=1), 4)  # calls at once that suit the store


class StoreCall(Message):
    """One call of the Store contract on the opened repository's store (``k`` says which)."""

    TYPE = "store"


@message("store", "put")
class StorePut(StoreCall):
    """Store ``size`` bytes as ``name``; the client sends them as ``data`` (``more``
    grants room beyond the first WINDOW bytes); ``ok`` when stored."""

    REQUEST = FOLLOW_UPS = True
    name: str = wire(OBJECT_NAME)
    size: int = wire(uint())
    exclusive: bool = wire(boolean, False)


@message("store", "get")
class StoreGet(StoreCall):
    """The whole object, as ``data`` (the client grants room with ``more``)."""

    REQUEST = FOLLOW_UPS = True
    name: str = wire(OBJECT_NAME)


@message("store", "range")
class StoreRange(StoreCall):
    """``length`` bytes at ``offset``, as ``data``."""

    REQUEST = FOLLOW_UPS = True
    name: str = wire(OBJECT_NAME)
    offset: int = wire(uint())
    length: int = wire(uint(low=1))


@message("store", "stat")
class StoreStat(StoreCall):
    REQUEST = True
    name: str = wire(OBJECT_NAME)


@message("store", "list")
class StoreList(StoreCall):
    REQUEST = True
    prefix: str = wire(OBJECT_NAME, "")


@message("store", "delete")
class StoreDelete(StoreCall):
    REQUEST = True
    name: str = wire(OBJECT_NAME)


def object_info(v: Any, where: str) -> tuple[str, int]:
    name, size = items(v, where, 2)
    return OBJECT_NAME(name, f"{where}[0]"), uint()(size, f"{where}[1]")


@message("objects")
class Objects(Message):
    """Objects as [name, size]: the answer to ``stat`` (one) and ``list`` (``more`` on all
    messages but the last)."""

    objects: list[tuple[str, int]] = wire(array(object_info), factory=list,
                                          out=lambda os: [list(o) for o in os])
    more: bool = wire(boolean, False)


# Every message type, for tests and the fuzzer.
TYPES: tuple[str, ...] = tuple(sorted(_BY_TYPE))
KINDS: dict[str, tuple[str, ...]] = {
    t: tuple(sorted(cls)) for t, cls in _BY_TYPE.items() if isinstance(cls, dict)
}
