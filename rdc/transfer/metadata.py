"""The metadata phase of push and pull: modes and modification times, after the content.

Top-down over metadata hashes (``mlist``). Where a directory's content is the same on both
sides, its entries' times and modes travel as vectors without names (cheap: Django's 10,000
entries cost a few KB). Where it is not (the receiver keeps extra entries, without
``--delete``), that directory is listed with its entries' times and modes instead, and the
entries both sides have are set one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from rdc.local.paths import join, to_wire
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, decode_values, encode_values, iter_entries, lookup, meta_of
from rdc.transfer.compare import Remote, fetch_listings
from rdc.transfer.ops import apply_meta, apply_ops
from rdc.wire.connection import Connection

HB = 8


@dataclass(frozen=True, slots=True)
class Single:
    """One entry whose mode or time differs, in a directory whose content differs."""

    path: str
    local: Entry
    remote: Remote


async def _mlist(connection: Connection, paths: list[str]) -> list:
    conversation = connection.start("mlist", paths=[to_wire(p) for p in paths], hb=HB)
    items: list = []
    while True:
        message = await conversation.receive("mlisting")
        items.extend(message["dirs"])
        if not message["more"]:
            break
    conversation.close()
    return items


async def walk(connection: Connection, tree: Entry) -> tuple[list[tuple[list, Entry]], list]:
    """The metadata that differs between ``tree`` and the server's: ``mlisting`` items with
    their local directory, for directories of equal content, and `Single` entries."""
    vectors: list[tuple[list, Entry]] = []
    singles: list[Single] = []
    frontier = [""]
    while frontier:
        next_frontier: list[str] = []
        mismatched: list[str] = []
        for item in await _mlist(connection, frontier):
            path, content, whole, _, _, metas = item
            local = lookup(tree, path)
            if local is None or local.kind != "d":
                continue
            if local.content[: len(content)] != content:
                mismatched.append(path)
                continue
            vectors.append((item, local))
            if not whole:
                subdirs = [(n, e) for n, e in local.sorted_children() if e.kind == "d"]
                next_frontier += [join(path, name) for k, (name, entry) in enumerate(subdirs)
                                  if metas[k * HB : (k + 1) * HB] != entry.meta[:HB]]
        if mismatched:
            listings = await fetch_listings(connection, mismatched, HB, meta=True)
            for path in mismatched:
                remote = listings.get(path) or {}
                local = lookup(tree, path)
                assert local is not None
                for name, entry in local.sorted_children():
                    theirs = remote.get(name)
                    if theirs is None or theirs.kind != entry.kind:
                        continue
                    if theirs.mode != entry.mode or theirs.mtime_ns != entry.mtime_ns:
                        singles.append(Single(join(path, name), entry, theirs))
                    if entry.kind == "d" and theirs.meta != entry.meta[:HB]:
                        next_frontier.append(join(path, name))
        frontier = next_frontier
    return vectors, singles


def differences(vectors: list[tuple[list, Entry]], singles: list[Single]) -> list[tuple[str, str]]:
    """(path, "mode", "time" or "mode and time") of every entry whose metadata differs: for
    a dry run's listing."""
    out = []
    for item, local in vectors:
        path, _, whole, times, modes, _ = item
        try:
            theirs = list(zip(decode_values(*times), decode_values(*modes), strict=True))
        except ValueError:
            continue
        entries = list(iter_entries(local)) if whole else local.sorted_children()
        if len(entries) != len(theirs):
            continue
        for (rel, entry), (mtime, mode) in zip(entries, theirs, strict=True):
            out.append((join(path, rel), what(entry.mode != mode, entry.mtime_ns != mtime)))
    for single in singles:
        out.append((single.path, what(single.local.mode != single.remote.mode,
                                      single.local.mtime_ns != single.remote.mtime_ns)))
    return [(path, change) for path, change in out if change]


def what(mode: bool, time: bool) -> str:
    """How an entry's metadata differs, in a dry run's words ("" if it does not)."""
    return "mode and time" if mode and time else "mode" if mode else "time" if time else ""


async def push(
    connection: Connection, tree: Entry, extra: list[list] | None = None
) -> list[list[str] | None]:
    """Bring the server's modes and times to those of ``tree``; ``extra`` ops go last (the
    opened directory's own, which the others may have moved). Returns the results of the
    per-entry ops (None for each success)."""
    vectors, singles = await walk(connection, tree)
    updates = []
    for item, local in vectors:
        path, content, whole, times, modes, _ = item
        mine = meta_of(local, whole)
        try:
            theirs = (decode_values(*times), decode_values(*modes))
        except ValueError:
            theirs = ([], [])
        if mine != theirs:
            updates.append([to_wire(path), content, whole, list(encode_values(mine[0])),
                            list(encode_values(mine[1]))])
    for start in range(0, len(updates), 256):
        conversation = connection.start("mset", dirs=updates[start : start + 256])
        await conversation.receive("ok")
        conversation.close()
    results: list[list[str] | None] = []
    ops = [["meta", to_wire(s.path), [s.local.mode, s.local.mtime_ns], None] for s in singles]
    ops += extra or []
    for start in range(0, len(ops), 4096):
        conversation = connection.start("ops", ops=ops[start : start + 4096])
        results += (await conversation.receive("oks"))["results"]
        conversation.close()
    return results


async def pull(connection: Connection, replica: Replica, tree: Entry) -> list:
    """Bring the local modes and times (of ``replica``, scanned as ``tree``) to the
    server's. Returns the results of the per-entry ops."""
    vectors, singles = await walk(connection, tree)

    def apply() -> list:
        for (path, content, whole, times, modes, _), _local in vectors:
            apply_meta(replica, tree, path, content, whole, times, modes)
        return apply_ops(replica, [
            ("meta", s.path, [s.remote.mode, s.remote.mtime_ns], None) for s in singles
        ])

    return await trio.to_thread.run_sync(apply)
