"""What snapshots reach: every dir, meta, node and chunk blob (by storage id), read from
their trees. Prune keeps what this finds; check reads every tree blob on the way."""

from __future__ import annotations

from rdc.errors import RdcError
from rdc.repo.blobs import Encoding, Kind
from rdc.repo.repository import Repository
from rdc.repo.snapshots import Snapshot
from rdc.repo.trees import decode_meta, decode_node


class Unreadable(Exception):
    """A tree blob a snapshot needs could not be read (the message says which and why)."""


def reach(repo: Repository, snapshots: list[Snapshot], problems: list[str] | None = None
          ) -> set[bytes]:
    """Storage ids of every blob the snapshots reach (delta bases not included). A blob
    that cannot be read is `Unreadable`, or, given ``problems``, noted there (the walk
    goes on without what is below it)."""
    sid = repo.crypto.storage_id
    used: set[bytes] = set()
    nodes_seen: set[bytes] = set()

    def load(kind: Kind, plain: bytes, where: str) -> bytes | None:
        try:
            return repo.load(kind, plain)
        except RdcError as exc:
            message = f"snapshot {where}: {exc.fields.get('message', exc)}"
            if problems is None:
                raise Unreadable(message) from None
            problems.append(message)
            return None

    for snap in snapshots:
        meta_sid = sid(snap.meta)
        if meta_sid not in used:
            used.add(meta_sid)
            content = load(Kind.META, snap.meta, f"{snap.short_id} (metadata)")
            if content is not None:
                try:
                    decode_meta(content)
                except ValueError as exc:
                    _note(problems, f"snapshot {snap.short_id}: meta blob: {exc}")
        stack = [("", snap.tree)]
        while stack:
            path, plain = stack.pop()
            s = sid(plain)
            if s in used:
                continue
            used.add(s)
            where = f"{snap.short_id}:{path or '/'}"
            try:
                entries = repo.load_dir(plain)
            except RdcError as exc:
                _note(problems, f"snapshot {where}: {exc.fields.get('message', exc)}")
                continue
            for entry in entries:
                child = f"{path}/{entry.name}" if path else entry.name
                if entry.kind == "d":
                    stack.append((child, entry.content))
                elif entry.kind == "f":
                    assert entry.file is not None
                    children = [(entry.file.level - 1, h) for h in entry.file.children()]
                    while children:
                        level, h = children.pop()
                        s = sid(h)
                        if level == 1 or s in nodes_seen:
                            used.add(s)
                            continue
                        nodes_seen.add(s)
                        used.add(s)
                        node = load(Kind.NODE, h, f"{snap.short_id}:{child}")
                        if node is None:
                            continue
                        _, hashes, _ = decode_node(node)
                        children += [(level - 1, hashes[i : i + 32])
                                     for i in range(0, len(hashes), 32)]
    return used


def _note(problems: list[str] | None, message: str) -> None:
    if problems is None:
        raise Unreadable(message)
    problems.append(message)


def with_bases(repo: Repository, used: set[bytes]) -> set[bytes]:
    """``used`` and the bases of the deltas among them (of the copies readers take),
    transitively; a base that is not indexed is left out (check reports it)."""
    out = set(used)
    frontier = set(used)
    while frontier:
        found = repo.index.locate_many(frontier)
        frontier = {loc.entry.base for loc in found.values()
                    if loc.entry.encoding is Encoding.DELTA and loc.entry.base not in out
                    } - {None}  # type: ignore[misc]
        out |= frontier  # type: ignore[arg-type]
    return out
