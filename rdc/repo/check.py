"""`check`: is the repository whole? Every index object must read; every indexed pack must
exist with its indexed size; every delta's base must be indexed, less deep than it; every
snapshot must read and its trees too (tree blobs are read and checked against their ids),
down to chunks that are indexed. With ``read_data``, every pack is read whole: its name
must be its hash, its trailer must agree with the index, and every record must decode to
the blob whose id it carries. Each problem names its pack, blob or snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import blake3

from rdc.errors import RdcError
from rdc.repo.blobs import Encoding
from rdc.repo.cache import Location
from rdc.repo.crypto import Unauthentic
from rdc.repo.errors import CorruptRepo
from rdc.repo.indexfile import decode_index
from rdc.repo.packs import pack_id_of, pack_name, parse_pack
from rdc.repo.reach import reach
from rdc.repo.repository import Repository
from rdc.repo.snapshots import PREFIX, decode_snapshot
from rdc.storage import ObjectNotFound, StoreError, map_parallel


@dataclass
class CheckResult:
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    snapshots: int = 0
    packs: int = 0
    blobs: int = 0
    packs_read: int = 0
    bytes_read: int = 0


def check(repo: Repository, read_data: bool = False,
          say: Callable[[str], None] | None = None) -> CheckResult:
    say = say or (lambda _: None)
    result = CheckResult()
    with repo.lock("shared", "check"):
        # The local index is read again from the index objects, so what is checked is the
        # repository, not what this client cached of it.
        repo.index.forget_index()
        say("reading index objects")
        _indexes(repo, result)
        listed = _packs(repo, result)
        _chains(repo, result)
        say("reading snapshots and their trees")
        snapshots = []
        for info in repo.store.list(PREFIX.rstrip("/")):
            name = info.name[len(PREFIX):]
            try:
                snapshots.append(decode_snapshot(name, repo.store.get(info.name), repo.crypto))
            except (ValueError, Unauthentic, ObjectNotFound) as exc:
                result.errors.append(f"{info.name}: does not read: {exc}")
        result.snapshots = len(snapshots)
        problems: list[str] = []
        used = reach(repo, snapshots, problems)
        result.errors += problems
        missing = used - set(repo.index.locate_many(used))
        # What reach could not find is already named (as unreadable) when it is a tree
        # blob; chunks are only looked up, so name them here.
        if missing and not problems:
            result.errors.append(f"{len(missing)} chunks the snapshots need are not indexed, "
                                 f"for example {min(missing).hex()[:16]}")
        if read_data:
            say(f"reading {len(listed)} packs")
            _read_packs(repo, listed, result)
    return result


def _indexes(repo: Repository, result: CheckResult) -> None:
    names = sorted(info.name for info in repo.store.list("index"))

    def fetch(name: str) -> tuple[str, object]:
        try:
            return name, decode_index(repo.store.get(name), repo.crypto)
        except (ValueError, Unauthentic, StoreError) as exc:
            return name, exc

    for name, outcome in map_parallel(fetch, names, workers=repo.store.capabilities.connections):
        if isinstance(outcome, Exception):
            result.errors.append(f"{name}: does not read: {outcome}")
        else:
            repo.index.add_index(name, outcome)  # type: ignore[arg-type]


def _packs(repo: Repository, result: CheckResult) -> dict[bytes, int]:
    listed: dict[bytes, int] = {}
    for info in repo.store.list("data"):
        try:
            listed[pack_id_of(info.name)] = info.size
        except ValueError:
            result.notes.append(f"{info.name}: not a pack name (ignored)")
    indexed = repo.index.packs()
    result.packs = len(listed)
    result.blobs = repo.index.blob_count()
    for pack_id, size in sorted(indexed.items()):
        if pack_id not in listed:
            result.errors.append(f"{pack_name(pack_id)}: indexed, but missing")
        elif listed[pack_id] != size:
            result.errors.append(f"{pack_name(pack_id)}: {listed[pack_id]} bytes, "
                                 f"indexed as {size}")
    unindexed = [p for p in listed if p not in indexed]
    if unindexed:
        result.notes.append(f"{len(unindexed)} packs are not indexed (left by an interrupted "
                            "backup or prune; prune removes them)")
    return listed


def _chains(repo: Repository, result: CheckResult) -> None:
    """Every delta's base indexed, and less deep than the delta (so chains end)."""
    rows = repo.index.conn.execute(
        "SELECT b.sid, b.base, b.depth, p.name FROM blob b JOIN pack p ON p.id = b.pack "
        "WHERE b.encoding = ?", (int(Encoding.DELTA),)).fetchall()
    bases = repo.index.locate_many({base for _, base, _, _ in rows})
    for sid, base, depth, pack_id in rows:
        found = bases.get(base)
        if found is None:
            result.errors.append(f"{pack_name(pack_id)}: delta {sid.hex()[:16]} has no "
                                 f"indexed base {base.hex()[:16]}")
        elif found.entry.depth >= depth:
            result.errors.append(f"{pack_name(pack_id)}: delta {sid.hex()[:16]} of depth "
                                 f"{depth} has a base of depth {found.entry.depth}")


def _read_packs(repo: Repository, listed: dict[bytes, int], result: CheckResult) -> None:
    def read(pack_id: bytes) -> tuple[bytes, bytes | Exception]:
        try:
            return pack_id, repo.store.get(pack_name(pack_id))
        except StoreError as exc:
            return pack_id, exc

    ids = sorted(listed)
    workers = repo.store.capabilities.connections
    for start in range(0, len(ids), workers):
        for pack_id, data in map_parallel(read, ids[start : start + workers], workers=workers):
            name = pack_name(pack_id)
            if isinstance(data, Exception):
                result.errors.append(f"{name}: cannot be read: {data}")
                continue
            result.packs_read += 1
            result.bytes_read += len(data)
            _read_pack(repo, pack_id, name, data, result)


def _read_pack(repo: Repository, pack_id: bytes, name: str, data: bytes,
               result: CheckResult) -> None:
    if blake3.blake3(data).digest() != pack_id:
        result.errors.append(f"{name}: content does not match its name (damaged)")
    indexed = {(e.sid, e.offset, e.length) for e in repo.index.entries(pack_id)}
    try:
        entries = parse_pack(data, repo.crypto)
    except (ValueError, Unauthentic) as exc:
        result.errors.append(f"{name}: trailer does not read: {exc}")
        entries = repo.index.entries(pack_id)  # still try the records the index names
    else:
        if not indexed <= {(e.sid, e.offset, e.length) for e in entries}:
            result.errors.append(f"{name}: trailer and index disagree")
    for entry in entries:
        if entry.end > len(data):
            result.errors.append(f"{name}: {entry.kind.name.lower()} {entry.sid.hex()[:16]} "
                                 "runs past the end of the pack")
            continue
        try:
            repo.decode(Location(pack_id, entry), data[entry.offset : entry.end])
        except CorruptRepo as exc:
            result.errors.append(exc.fields["message"])
        except RdcError as exc:  # a base that cannot be read: named by its own pack too
            result.errors.append(f"{name}: {entry.sid.hex()[:16]}: {exc}")
