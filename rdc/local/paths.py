"""Relative paths as peers send them, and the checks that make them safe to use.

Inside rdc a path is a ``str`` of '/'-separated components relative to a synced root,
decoded from the bytes on disk with ``os.fsdecode`` (surrogateescape), so every POSIX name
round-trips, UTF-8 or not. On the wire it is those bytes (``to_wire``). Anything a peer
sends goes through ``check_relpath`` before it is used, and every operation in
``rdc.local.fs`` checks again, so a path that passed cannot name anything outside the root by
its spelling. (Symlinks are the other way out; ``rdc.local.fs`` refuses to follow them.)

rdc's own temporary names (``.rdc-tmp-<16 hex>-<name>``) are refused as well: a peer must
not read a transfer in flight, nor plant a file that ``clean_temporaries`` would delete.
"""

from __future__ import annotations

import os
import re
import secrets

from rdc.errors import RdcError

MAX_NAME = 255  # bytes in one component (NAME_MAX on Linux file systems)
MAX_PATH = 4096  # bytes in a whole relative path (PATH_MAX)
TEMP_PREFIX = ".rdc-tmp-"
_TEMP = re.compile(r"\.rdc-tmp-[0-9a-f]{16}-")
_TEMP_BYTES = TEMP_PREFIX.encode()
_SHOWN = 200  # characters of a rejected path kept in the message


class PathError(RdcError):
    """unsafe path {path}: {reason}"""

    exit_code = 3

    def __init__(self, *, path: object, reason: str) -> None:
        shown = repr(path)
        if len(shown) > _SHOWN:
            shown = shown[:_SHOWN] + "..."
        super().__init__(path=shown, reason=reason)


def check_relpath(p: str | bytes, *, allow_root: bool = False) -> str:
    """``p`` as rdc's normalised relative path, or PathError.

    Accepted: one or more components joined by single '/', none of them empty, '.', '..'
    or an rdc temporary name, no NUL, at most MAX_NAME bytes each and MAX_PATH bytes in
    all once encoded. "" is the root itself, accepted only with ``allow_root``. There is
    nothing to normalise away: a path is either already in its one spelling or refused.
    """
    if isinstance(p, bytes):
        raw = p
        text = os.fsdecode(p)
    elif isinstance(p, str):
        text = p
        try:
            raw = os.fsencode(p)
        except UnicodeEncodeError:
            raise PathError(path=p, reason="not encodable as a file name") from None
    else:
        raise PathError(path=p, reason=f"a path is str or bytes, not {type(p).__name__}")
    if not raw:
        if allow_root:
            return ""
        raise PathError(path=p, reason="empty path")
    # The common case in a few substring tests (this runs on every file operation): no
    # component can be too long, and nothing `_check_parts` refuses can be there.
    wrapped = b"/" + raw + b"/"
    if (
        len(raw) <= MAX_NAME
        and b"\0" not in raw
        and b"//" not in wrapped
        and b"/./" not in wrapped
        and b"/../" not in wrapped
        and _TEMP_BYTES not in raw
    ):
        return text
    return _check_parts(p, raw, text)


def _check_parts(p: str | bytes, raw: bytes, text: str) -> str:
    """`check_relpath` one rule at a time: the specification, and the reason for a
    refusal."""
    if len(raw) > MAX_PATH:
        raise PathError(path=p, reason=f"longer than {MAX_PATH} bytes")
    if b"\0" in raw:
        raise PathError(path=p, reason="contains a NUL byte")
    if raw.startswith(b"/"):
        raise PathError(path=p, reason="absolute")
    for part in raw.split(b"/"):
        if not part:
            raise PathError(path=p, reason="empty component")
        if part in (b".", b".."):
            raise PathError(path=p, reason=f"{part.decode()!r} component")
        if len(part) > MAX_NAME:
            raise PathError(path=p, reason=f"component longer than {MAX_NAME} bytes")
        if is_temporary(os.fsdecode(part)):
            raise PathError(path=p, reason="names an rdc temporary file")
    return text


def to_wire(rel: str) -> bytes:
    """The bytes that stand for ``rel`` on the wire and on disk."""
    return os.fsencode(rel)


def join(parent: str, name: str) -> str:
    """``name`` inside ``parent``; "" is the root."""
    return f"{parent}/{name}" if parent else name


def parent(rel: str) -> str:
    """The directory holding ``rel`` ("" for a top-level name)."""
    return rel.rpartition("/")[0]


def name(rel: str) -> str:
    """The last component of ``rel``."""
    return rel.rpartition("/")[2]


def is_temporary(name: str) -> bool:
    """Whether ``name`` (one component) is an rdc temporary name. Only the exact shape
    ``temporary_name`` makes counts, so a user's ``.rdc-tmp-notes`` is left alone."""
    return _TEMP.match(name) is not None


def temporary_name(name: str) -> str:
    """A fresh temporary name beside ``name``: ``.rdc-tmp-<16 random hex>-<name>``, the
    name cut (in bytes) so that the whole fits in MAX_NAME bytes. The random part, not
    O_EXCL alone, is what keeps concurrent writers of one path apart."""
    head = f"{TEMP_PREFIX}{secrets.token_hex(8)}-"
    room = MAX_NAME - len(head)
    return head + os.fsdecode(os.fsencode(name)[:room])


def displayable(text: str) -> str:
    """``text`` as valid UTF-8 for people: the bytes a surrogate escape stands for are
    shown as ``\\xNN``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")
