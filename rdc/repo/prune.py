"""`prune`: reclaim the space of what no snapshot reaches, under the exclusive lock.

Marks what the snapshots reach (and the bases of the deltas among it), then: a pack with
nothing marked is deleted; a pack where unmarked records hold REPACK_FRACTION of the bytes
or more is repacked (its marked records copied as they are into new packs). One new index
object names the marked records of every pack kept or made; then the old index objects go,
then the packs no longer named, then packs no index object named when prune began (left
by killed backups). Killed at any point, this leaves every indexed blob in place
(docs/formats.md section 8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rdc.repo.blobs import Entry
from rdc.repo.cache import Location
from rdc.repo.errors import CorruptRepo
from rdc.repo.indexfile import PackInfo, encode_index
from rdc.repo.packs import PACK_SIZE, PackWriter, pack_id_of, pack_name
from rdc.repo.reach import Unreadable, reach, with_bases
from rdc.repo.repository import Repository
from rdc.storage import map_parallel

REPACK_FRACTION = 0.2
# Blobs per new index object: about 60 bytes each once encoded, so a few MB an object (a
# pack of small chunks holds ~10,000 blobs; 4096 packs in one object made ~2.8 GB, over
# what a reader takes and what rdc serve takes in one put).
INDEX_BLOBS = 100_000


@dataclass
class PruneResult:
    snapshots: int = 0
    packs_before: int = 0
    bytes_before: int = 0
    packs_deleted: int = 0
    packs_repacked: int = 0
    packs_written: int = 0
    unindexed_deleted: int = 0
    bytes_deleted: int = 0
    bytes_written: int = 0
    blobs_kept: int = 0
    blobs_dropped: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def prune(repo: Repository, say: Callable[[str], None] | None = None,
          locked: bool = False) -> PruneResult:
    """Prune ``repo`` (taking the exclusive lock unless the caller holds it)."""
    if locked:
        return _prune(repo, say or (lambda _: None))
    with repo.lock("exclusive", "prune"):
        return _prune(repo, say or (lambda _: None))


def _prune(repo: Repository, say: Callable[[str], None]) -> PruneResult:
    result = PruneResult()
    listed = {pack_id_of(info.name): info.size for info in repo.store.list("data")
              if _is_pack(info.name)}
    repo.sync_index()
    old_indexes = sorted(repo.index.index_objects())
    indexed = repo.index.packs()
    snapshots = repo.snapshots()
    result.snapshots = len(snapshots)
    say(f"marking what {len(snapshots)} snapshots reach")
    try:
        used = with_bases(repo, reach(repo, snapshots))
    except Unreadable as exc:
        raise CorruptRepo(location=repo.location,
                          message=f"{exc}; nothing was pruned (run rdc check)") from None

    # The copy of each used blob that readers take, and what each pack holds of them.
    chosen: dict[bytes, Location] = repo.index.locate_many(used)
    keep_entries: dict[bytes, list[Entry]] = {}
    for loc in chosen.values():
        keep_entries.setdefault(loc.pack_id, []).append(loc.entry)
    result.packs_before = len(indexed)
    result.bytes_before = sum(indexed.values())
    delete, repack, kept = [], [], []
    for pack_id in indexed:
        entries = repo.index.entries(pack_id)
        mine = keep_entries.get(pack_id, [])
        total = sum(e.length for e in entries)
        live = sum(e.length for e in mine)
        result.blobs_dropped += len(entries) - len(mine)
        if not mine:
            delete.append(pack_id)
        elif total and (total - live) / total >= REPACK_FRACTION:
            repack.append(pack_id)
        else:
            kept.append(PackInfo(pack_id, indexed[pack_id],
                                 sorted(mine, key=lambda e: e.offset)))
    result.blobs_kept = len(chosen)
    say(f"{len(delete)} packs to delete, {len(repack)} to repack, {len(kept)} to keep")

    written = _repack(repo, [(p, keep_entries[p]) for p in repack])
    result.packs_repacked = len(repack)
    result.packs_written = len(written)
    result.bytes_written = sum(info.size for info in written)
    infos = kept + written
    names = []
    for group in _index_groups(infos):
        name, data = encode_index(group, repo.crypto)
        repo.store.put(name, data)
        names.append(name)
    for name in old_indexes:
        if name not in names:
            repo.store.delete(name)
    # A pack written now may have the very name of one to delete (an earlier, killed prune
    # made the same pack from the same records): what the new index names stays.
    named = {info.pack_id for info in infos}
    gone = [p for p in delete + repack if p not in named]
    unindexed = [p for p in listed if p not in indexed and p not in named]
    workers = repo.store.capabilities.connections
    map_parallel(lambda p: repo.store.delete(pack_name(p)), gone + unindexed, workers=workers)
    result.packs_deleted = len(delete)
    result.unindexed_deleted = len(unindexed)
    result.bytes_deleted = (sum(indexed[p] for p in gone)
                            + sum(listed[p] for p in unindexed))
    repo.sync_index()
    return result


def _index_groups(infos: list[PackInfo], limit: int | None = None) -> list[list[PackInfo]]:
    """``infos`` in order, cut into groups of at most ``limit`` (INDEX_BLOBS) blobs (a pack
    is never split; one larger than that is a group of its own)."""
    limit = INDEX_BLOBS if limit is None else limit
    groups: list[list[PackInfo]] = []
    blobs = 0
    for info in infos:
        if not groups or blobs + len(info.entries) > limit:
            groups.append([])
            blobs = 0
        groups[-1].append(info)
        blobs += len(info.entries)
    return groups


def _is_pack(name: str) -> bool:
    try:
        pack_id_of(name)
    except ValueError:
        return False
    return True


def _repack(repo: Repository, packs: list[tuple[bytes, list[Entry]]]) -> list[PackInfo]:
    """Copy the given records of ``packs`` into new packs (data and tree records apart);
    the new packs' index infos."""
    writers = {True: PackWriter(repo.crypto), False: PackWriter(repo.crypto)}
    done: list[PackInfo] = []

    def close(is_data: bool) -> None:
        writer = writers[is_data]
        if len(writer):
            pack_id, data = writer.finish()
            repo.store.put(pack_name(pack_id), data)
            done.append(PackInfo(pack_id, len(data), writer.entries))
        writers[is_data] = PackWriter(repo.crypto)

    for pack_id, entries in packs:
        entries = sorted(entries, key=lambda e: e.offset)
        start, end = entries[0].offset, entries[-1].end
        data = repo.store.get_range(pack_name(pack_id), start, end - start)
        for entry in entries:
            is_data = entry.kind.in_data_pack
            writers[is_data].add_sealed(entry, data[entry.offset - start : entry.end - start])
            if writers[is_data].size >= PACK_SIZE:
                close(is_data)
    close(True)
    close(False)
    return done
