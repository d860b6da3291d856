"""The state both sides had at the last successful two-way sync (the *base*), kept by the
client per (local root, remote directory), so that a difference can be told apart as
"changed here", "changed there" or "changed on both".

The base is a tree of `Known` entries: kind, mode, mtime and a content digest prefix (a
file's root, a link's target). It is written atomically (temporary, fsync, rename): a killed
sync leaves the previous base, which is safe, because an entry that both sides already have
in the same state is in step whatever the base says.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import msgpack

from rdc.errors import FileWriteError

FORMAT = 1
DIGEST_BYTES = 8  # files: a root prefix, like the listings; links keep their whole target


@dataclass(slots=True)
class Known:
    kind: str
    mode: int
    mtime_ns: int
    digest: bytes = b""
    children: dict[str, Known] = field(default_factory=dict)

    def to_wire(self) -> list[Any]:
        kids = {name: child.to_wire() for name, child in self.children.items()}
        return [self.kind, self.mode, self.mtime_ns, self.digest, kids]

    @classmethod
    def from_wire(cls, item: list[Any]) -> Known:
        kind, mode, mtime, digest, kids = item
        return cls(kind, mode, mtime, digest,
                   {name: cls.from_wire(child) for name, child in kids.items()})


def location(local_root: str, remote: str) -> Path:
    """``$XDG_STATE_HOME/rdc/sync/<key>.base`` (default ``~/.local/state``), keyed by the
    local root's absolute path and the remote directory's URL."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    key = blake3.blake3(os.fsencode(os.path.abspath(local_root)) + b"\0" + remote.encode())
    return Path(base) / "rdc" / "sync" / f"{key.hexdigest()[:24]}.base"


def load(path: Path) -> Known | None:
    """The stored base, or None if there is none (or it is unreadable: then every
    difference is treated as new on one side, and nothing is deleted)."""
    try:
        data = path.read_bytes()
        version, root = msgpack.unpackb(data, raw=False)
        if version != FORMAT:
            return None
        return Known.from_wire(root)
    except (OSError, ValueError, TypeError, KeyError, msgpack.UnpackException):
        return None


def save(path: Path, root: Known) -> None:
    """Store the base (atomically); FileWriteError if it cannot be (a full disk, a state
    directory made read-only during the run: the client checks it first)."""
    temp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temp, "wb") as f:
            f.write(msgpack.packb([FORMAT, root.to_wire()], use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise FileWriteError(path=exc.filename or path, reason=exc.strerror or str(exc)
                             ) from None
