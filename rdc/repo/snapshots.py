"""Snapshot records: when, where from and what (the root dir and meta blobs), sealed and
named by their hash; and how a user names one (an id prefix, or ``latest``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import blake3

from rdc.repo import msg
from rdc.repo.blobs import ID_BYTES
from rdc.repo.crypto import Crypto

SNAPSHOT_AAD = b"rdc snapshot"
PREFIX = "snapshots/"
SHORT = 8


@dataclass
class Snapshot:
    """A snapshot record. ``name`` is the 64-hex id (its object is ``snapshots/<name>``)."""

    time: int  # ns since the epoch
    host: str
    paths: list[bytes]
    tags: list[str]
    tree: bytes  # plain id of the root dir blob
    meta: bytes  # plain id of the meta blob
    root_mode: int
    root_mtime: int
    synthetic: bool = False
    parent: str | None = None
    summary: dict[str, int] = field(default_factory=dict)
    name: str = ""

    @property
    def short_id(self) -> str:
        return self.name[:SHORT]

    @property
    def path_text(self) -> list[str]:
        return [os.fsdecode(p) for p in self.paths]

    def group(self) -> tuple[str, tuple[bytes, ...]]:
        """Snapshots of one host and one set of paths form a group (for parents and forget)."""
        return self.host, tuple(sorted(self.paths))


def encode_snapshot(snap: Snapshot, crypto: Crypto) -> tuple[str, bytes]:
    """(name, object content)."""
    body = msg.pack({
        "v": 1, "time": snap.time, "host": snap.host, "paths": snap.paths, "tags": snap.tags,
        "tree": snap.tree, "meta": snap.meta, "root": [snap.root_mode, snap.root_mtime],
        "synthetic": snap.synthetic, "parent": snap.parent, "summary": snap.summary,
    })
    data = crypto.seal(body, SNAPSHOT_AAD)
    return blake3.blake3(data).hexdigest(), data


def decode_snapshot(name: str, data: bytes, crypto: Crypto) -> Snapshot:
    """ValueError or `Unauthentic` if the record is not one."""
    if blake3.blake3(data).hexdigest() != name:
        raise ValueError("content does not match its name")
    value: Any = msg.unpack(crypto.open(data, SNAPSHOT_AAD))
    if not isinstance(value, dict) or value.get("v") != 1:
        raise ValueError("not a snapshot record of version 1")
    try:
        root = value["root"]
        snap = Snapshot(
            time=value["time"], host=value["host"], paths=value["paths"], tags=value["tags"],
            tree=value["tree"], meta=value["meta"], root_mode=root[0], root_mtime=root[1],
            synthetic=value["synthetic"], parent=value["parent"], summary=value["summary"],
            name=name,
        )
    except (KeyError, IndexError, TypeError):
        raise ValueError("snapshot record with missing fields") from None
    ok = (isinstance(snap.time, int) and isinstance(snap.host, str)
          and isinstance(snap.paths, list) and all(isinstance(p, bytes) for p in snap.paths)
          and isinstance(snap.tags, list) and all(isinstance(t, str) for t in snap.tags)
          and isinstance(snap.tree, bytes) and len(snap.tree) == ID_BYTES
          and isinstance(snap.meta, bytes) and len(snap.meta) == ID_BYTES
          and isinstance(snap.root_mode, int) and isinstance(snap.root_mtime, int)
          and isinstance(snap.synthetic, bool) and isinstance(snap.summary, dict)
          and (snap.parent is None or isinstance(snap.parent, str)))
    if not ok:
        raise ValueError("snapshot record with malformed fields")
    return snap


def newest_first(snapshots: list[Snapshot]) -> list[Snapshot]:
    return sorted(snapshots, key=lambda s: (s.time, s.name), reverse=True)


def find(snapshots: list[Snapshot], spec: str) -> Snapshot | str:
    """The snapshot ``spec`` names (``latest``, or a prefix of its id), or why none does."""
    if spec == "latest":
        return newest_first(snapshots)[0] if snapshots else "no snapshots yet"
    spec = spec.lower()
    if not spec or any(c not in "0123456789abcdef" for c in spec):
        return f"{spec!r} is not a snapshot id (hex digits) or 'latest'"
    matches = [s for s in snapshots if s.name.startswith(spec)]
    if not matches:
        return f"no snapshot {spec}"
    if len(matches) > 1:
        return f"snapshot id {spec} is ambiguous ({len(matches)} match): give more digits"
    return matches[0]


def parent_of(snapshots: list[Snapshot], host: str, paths: list[bytes]) -> Snapshot | None:
    """The newest snapshot of the same host and paths: the next backup's parent."""
    key = (host, tuple(sorted(paths)))
    for snap in newest_first(snapshots):
        if snap.group() == key:
            return snap
    return None
