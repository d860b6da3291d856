"""Top-down comparison of the client's tree with the server's (docs/protocol.md, "list").

Only directories whose content hash differs are listed; each level of the descent is one
``list`` request for all differing directories of that level. The result says, for the
direction of the transfer, what the target must do: directories to create, files to send,
links to make, entries to replace or remove. Modes and times are metadata: they are brought
in step afterwards (``mlist``), not here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rdc.local.paths import join, to_wire
from rdc.local.snapshot import Entry, iter_entries, lookup
from rdc.wire.connection import Connection

# Directories asked for in one list request.
LIST_BATCH = 512


@dataclass(frozen=True, slots=True)
class Remote:
    """An entry as a listing describes it: kind, mode, and hash prefix (a link's target);
    with ``meta`` listings also its mtime and (directories) meta and sync meta prefixes."""

    kind: str
    mode: int
    digest: bytes
    mtime_ns: int = 0
    meta: bytes = b""
    smeta: bytes = b""


@dataclass
class Changes:
    """What the target needs, in the order it is applied. ``expect`` values describe what
    the target holds now (docs/protocol.md ``expect``): ``[kind, digest]``, or ``[]`` for
    nothing."""

    replace: list[tuple[str, list]] = field(default_factory=list)  # rm before creating
    mkdirs: list[tuple[str, int]] = field(default_factory=list)  # parents first
    files: list[tuple[str, bytes | None]] = field(default_factory=list)  # expected root prefix
    links: list[tuple[str, bytes, list]] = field(default_factory=list)
    removals: list[tuple[str, list]] = field(default_factory=list)  # only with --delete
    meta: list[tuple[str, str]] = field(default_factory=list)  # dry runs: (path, what)
    sizes: dict[str, int] = field(default_factory=dict)  # files: size when known

    def __bool__(self) -> bool:
        return any((self.replace, self.mkdirs, self.files, self.links, self.removals))


def describe_local(entry: Entry, hb: int) -> Remote:
    digest = entry.digest()
    return Remote(entry.kind, entry.mode, digest if entry.kind == "l" else digest[:hb])


def _expect(entry: Remote | None) -> list:
    return [] if entry is None else [entry.kind, entry.digest]


async def fetch_listings(
    connection: Connection, paths: list[str], hb: int, meta: bool = False
) -> dict[str, dict[str, Remote] | None]:
    """The server's listings of ``paths``: per path, its entries by name (None if it is
    not a directory there). Requests are batched and overlap."""
    result: dict[str, dict[str, Remote] | None] = {}
    conversations = []
    for start in range(0, len(paths), LIST_BATCH):
        batch = paths[start : start + LIST_BATCH]
        conversations.append(
            connection.start("list", paths=[to_wire(p) for p in batch], hb=hb, meta=meta)
        )
    for conversation in conversations:
        while True:
            message = await conversation.receive("listing")
            for path, entries in message["dirs"]:
                if entries is None:
                    result[path] = None
                    continue
                found = result.setdefault(path, {}) or {}
                result[path] = found
                for name, *fields in entries:
                    found[name] = Remote(*fields)
            if not message["more"]:
                break
        conversation.close()
    return result


class Comparison:
    """Compare ``local`` with the server's tree. ``push``: the local tree is the source."""

    def __init__(self, local: Entry, push: bool, hb: int = 8) -> None:
        self.local = local
        self.push = push
        self.hb = hb
        self.changes = Changes()

    async def run(self, connection: Connection, remote_content: bytes) -> Changes:
        if self.local.content == remote_content:
            return self.changes
        frontier = [""]
        fresh: set[str] = set()  # pull: directories new here, listed in full
        while frontier:
            listings = await fetch_listings(connection, frontier, self.hb)
            next_frontier: list[str] = []
            for path in frontier:
                remote = listings.get(path) or {}
                local_dir = None if path in fresh else lookup(self.local, path)
                local = dict(local_dir.children) if local_dir and local_dir.kind == "d" else {}
                for name, action in self._compare_dir(path, local, remote):
                    if action == "descend":
                        next_frontier.append(join(path, name))
                    elif action == "fresh":
                        fresh.add(join(path, name))
                        next_frontier.append(join(path, name))
            frontier = next_frontier
        return self.changes

    def _compare_dir(
        self, path: str, local: dict[str, Entry], remote: dict[str, Remote]
    ) -> Iterator[tuple[str, str]]:
        """Record what the target lacks in one directory; yield (name, "descend"|"fresh")
        for subdirectories to list next."""
        changes = self.changes
        for name in sorted(set(local) | set(remote), key=to_wire):
            rel = join(path, name)
            mine = local.get(name)
            theirs = remote.get(name)
            here = describe_local(mine, self.hb) if mine is not None else None
            source, target = (here, theirs) if self.push else (theirs, here)
            if source is None:
                changes.removals.append((rel, _expect(target)))
                continue
            if target is not None and target.kind != source.kind:
                changes.replace.append((rel, _expect(target)))
                target = None
            if source.kind == "d":
                if target is None:
                    changes.mkdirs.append((rel, source.mode))
                    if self.push:
                        self._create_subtree(rel, mine)  # type: ignore[arg-type]
                    else:
                        yield name, "fresh"
                    continue
                if source.digest != target.digest:
                    yield name, "descend"
            elif source.kind == "f":
                if target is None or source.digest != target.digest:
                    changes.files.append((rel, None if target is None else target.digest))
                    if mine is not None and self.push:
                        changes.sizes[rel] = mine.size
            elif target is None or source.digest != target.digest:
                changes.links.append((rel, source.digest, _expect(target)))

    def _create_subtree(self, path: str, directory: Entry) -> None:
        """Everything below a directory the target does not have (push: known locally)."""
        for rel, entry in iter_entries(directory):
            full = join(path, rel)
            if entry.kind == "d":
                self.changes.mkdirs.append((full, entry.mode))
            elif entry.kind == "f":
                self.changes.files.append((full, None))
                self.changes.sizes[full] = entry.size
            else:
                self.changes.links.append((full, entry.digest(), []))


def summary(changes: Changes) -> dict[str, Any]:
    return {
        "files": len(changes.files),
        "dirs": len(changes.mkdirs),
        "links": len(changes.links),
        "replaced": len(changes.replace),
        "removals": len(changes.removals),
    }
