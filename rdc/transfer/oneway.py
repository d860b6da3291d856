"""One-way sync (``rdc push`` and ``rdc pull``): make a target directory a copy of a source
directory. Push and pull are one algorithm over two sides (`rdc.transfer.sides`): the
local directory is the source of a push and the target of a pull, the remote one the
other; only the moving of file content differs by direction.

The steps, each in docs/protocol.md: open the remote directory while the local one is
scanned; stop if both root hashes (and the opened directory's own mode and time) agree;
compare top-down; on the target, replace entries of another kind and make directories (in
stages, while the files whose directories are made already go); move files (many in
flight); make links; delete (``--delete``); bring modes and times in step; compare the root
hashes again.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Awaitable, Callable

import trio

from rdc.errors import ProtocolError
from rdc.local.index import Progress as ScanProgress
from rdc.local.marker import RootState, settle
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.local.snapshot import EMPTY_CONTENT, Entry, Walk
from rdc.local.stamproots import racy_from
from rdc.local.verify import CHANGED
from rdc.records import record
from rdc.transfer import guards, metadata
from rdc.transfer.batch import (
    Files,
    batches,
    batches_in_flight,
    pull_batch,
    push_batch,
    takes_deltas,
    takes_large_deltas,
)
from rdc.transfer.compare import (
    Changes,
    compare,
    everything,
    first_prefix,
    known_listings,
    moves,
)
from rdc.transfer.files import pull_file, push_file
from rdc.transfer.made_dirs import MadeDirs
from rdc.transfer.quickcheck import STAMP_ROOTS, WARM_STAMPS, tree_sketch, walk_sketch
from rdc.transfer.sides import Hashes, Local, Remote, Side
from rdc.transfer.stats import Options, Progress, Stats, count_files
from rdc.transfer.tally import files_of, settle_in_step, settle_one_way
from rdc.wire import messages as m
from rdc.wire.codec import MAX_ITEMS
from rdc.wire.connection import Connection, Conversation, unwrap_group


def request_open(connection: Connection, share: str, path: str, write: bool,
                 excludes: list[str], checksum: bool = False, stamps: bool = False,
                 warm: bool = False) -> Conversation:
    """Send ``open`` (creating ``path`` if it writes); the server starts scanning its
    tree, which the client overlaps with its own scan before it waits for ``opened``.
    ``checksum``: the server reads every file again. ``stamps``: a sync by stamp roots
    is offered by a cold index (a ``stamps`` request must follow: `by_stamps`);
    ``warm``: by a warm one (`opened_or_wanted`)."""
    return connection.start(m.Open(share=share, path=path, write=write, create=write,
                                   excludes=excludes, checksum=checksum, stamps=stamps,
                                   warm=warm))


async def receive_opened(conversation: Conversation) -> m.Opened:
    try:
        return await conversation.receive(m.Opened)
    finally:
        conversation.close()


async def opened_or_wanted(conversation: Conversation) -> m.Opened | m.Stamped:
    """The answer to an ``open`` with ``warm``: ``opened``, or first ``stamped`` with
    ``want`` (the server's index is cold: send ``stamps``, then ``opened`` follows)."""
    try:
        answer = await conversation.receive(m.Opened, m.Stamped)
    except BaseException:
        conversation.close()
        raise
    if isinstance(answer, m.Opened):
        conversation.close()
    elif not answer.want:
        raise ProtocolError(message="stamped before opened, and no want")
    return answer


class ScanAbandoned(Exception):
    """Raised from a scan's progress callback to stop the scan at the next file."""


async def scan_while_opening(
    replica: Replica,
    opening: Conversation,
    progress: Callable[[ScanProgress], None] | None = None,
    walked: Walk | None = None,
    streaming: bool = False,
    checksum: bool = False,
    warm: bool = False,
) -> tuple[m.Opened | m.Stamped, Entry]:
    """The server's answer to ``open`` and the local tree, scanned meanwhile (every file
    read with ``checksum``): the two scans are independent, and in series a cold push
    paid for both. A refused open stops the local scan at its next file. ``warm``: the
    open offered stamps as a warm client, and the answer may be `opened_or_wanted`'s.

    With ``streaming`` (a push, given the walk), an empty remote directory stops the scan
    too, and the walk's tree is returned unsealed, without roots: everything goes, and the
    files are read and signed as they are offered, while the server writes the ones before
    (a first copy's client no longer reads the whole tree before sending its first byte)."""
    stop = threading.Event()
    finished = False

    def report(event: ScanProgress) -> None:
        if stop.is_set():
            raise ScanAbandoned
        if progress is not None:
            progress(event)

    tree: Entry | None = None

    async def scan() -> None:
        nonlocal tree, finished
        with contextlib.suppress(ScanAbandoned):  # the open was refused, or streaming
            scanner = functools.partial(replica.scan, checksum=True) if checksum else replica.scan
            tree = await trio.to_thread.run_sync(scanner, None, report, walked)
        finished = True

    with unwrap_group():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scan)
            try:
                answer = await (opened_or_wanted(opening) if warm else receive_opened(opening))
            except BaseException:
                stop.set()
                raise
            if streaming and not finished and isinstance(answer, m.Opened) and _empty(answer):
                stop.set()
    if tree is None:  # abandoned for streaming: the walk is all it needs
        assert walked is not None
        replica.errors = list(walked.errors)
        return answer, walked.tree
    return answer, tree


def _empty(answer: m.Opened) -> bool:
    """Whether the opened remote directory is empty (and all of it could be read)."""
    return answer.content == EMPTY_CONTENT and not answer.unreadable


async def run(
    connection: Connection, replica: Replica, share: str, path: str, push: bool,
    options: Options, excludes: list[str],
    progress: Callable[[ScanProgress], None] | None = None,
) -> Stats:
    """A whole push (``push``) or pull between ``replica`` and directory ``path`` of
    ``share``: open it, scan the local tree meanwhile, and sync. ``excludes``: the
    patterns both sides leave out; ``progress``: of the local scan."""
    if options.markers is not None and not options.dry_run:  # before the scan: it moves
        await trio.to_thread.run_sync(local_marker, replica, options, True)  # the top's time
    answer, tree, walked, stamps = await open_and_scan(
        connection, replica, share, path, push, options, excludes, progress
    )
    if tree is None:  # neither side changed since both were last in step
        stats = Stats(in_step=True, seq=answer.seq)
        return settle_in_step(stats, walked.file_count)
    stats = await one_way(connection, replica, tree, answer, push, options, walked, stamps)
    return settle_one_way(stats, replica, push, options.dry_run, files_of(tree) if push else None)


async def open_and_scan(
    connection: Connection, replica: Replica, share: str, path: str, push: bool,
    options: Options, excludes: list[str],
    progress: Callable[[ScanProgress], None] | None = None,
) -> tuple[m.Opened, Entry | None, Walk, int | None]:
    """Open the remote directory and scan the local one. When neither side changed since
    its last scan (stat says so for this side, the server's answer for its own), the
    local tree is not scanned at all: None, with the walk that showed it. Where this
    side's index is cold (or, with ``warm-stamps``, the server's may be), a sync by
    stamp roots is offered (`by_stamps`): if the server takes it, the tree has stamp
    roots, and the last value is the time from which files keep their true roots (else
    None)."""
    write = push and not options.dry_run
    features = connection.frames.features
    cold = await trio.to_thread.run_sync(replica.is_cold)
    offer = (STAMP_ROOTS in features and not options.checksum
             and (cold or WARM_STAMPS in features))
    warm = offer and not cold  # (the server says whether it wants the sketch)
    opening = request_open(connection, share, path, write, excludes, options.checksum,
                           offer and cold, warm)
    # The local walk runs while the server scans its side.
    cached, walked = await trio.to_thread.run_sync(replica.quick)
    if walked.temporaries and not push and not options.dry_run:
        await trio.to_thread.run_sync(replica.fs.clean_temporaries)
    if offer and cold:
        stamped = await by_stamps(connection, replica, walked)
        if stamped is not None:
            return await receive_opened(opening), stamped[0], walked, stamped[1]
    if cached is None or options.checksum:
        streaming = write and not walked.errors
        first, tree = await scan_while_opening(replica, opening, progress, walked, streaming,
                                               options.checksum, warm)
        if isinstance(first, m.Stamped):
            return await warm_by_stamps(connection, replica, opening, tree, walked)
        return first, tree, walked, None
    first = await (opened_or_wanted(opening) if warm else receive_opened(opening))
    if isinstance(first, m.Stamped):
        tree = await trio.to_thread.run_sync(replica.scan, None, progress, walked)
        return await warm_by_stamps(connection, replica, opening, tree, walked)
    answer = first
    theirs = Hashes.of_message(answer)
    mine = Hashes(*cached, m.Top(*walked.top))
    if (mine.content, mine.meta) == (theirs.content, theirs.meta) and not _top_differs(
        mine, theirs, push
    ):
        return answer, None, walked, None
    tree = await trio.to_thread.run_sync(replica.scan, None, progress, walked)
    return answer, tree, walked, None


async def by_stamps(connection: Connection, replica: Replica, walked: Walk
                    ) -> tuple[Entry, int] | None:
    """After an ``open`` that offered stamp roots from a cold index: send the sketch of
    this side's stamps (`rdc.transfer.quickcheck`) and, if the server takes stamp roots,
    return this side's tree with them (none of its files read) and the time from which
    files keep their true roots; else None (the sync reads, as without)."""
    limit = racy_from()
    kept = await trio.to_thread.run_sync(replica.kept_stamps, walked, limit)
    if kept is not None:
        sketch = await trio.to_thread.run_sync(tree_sketch, kept, limit)
    else:
        sketch = await trio.to_thread.run_sync(walk_sketch, walked, limit)
    if not await _stamps_taken(connection, sketch, limit):
        return None
    replica.errors = list(walked.errors)
    if kept is not None:
        return kept, limit
    return await trio.to_thread.run_sync(replica.stamped, walked.tree, limit, True), limit


async def warm_by_stamps(connection: Connection, replica: Replica, opening: Conversation,
                         tree: Entry, walked: Walk) -> tuple[m.Opened, Entry, Walk, int | None]:
    """`open_and_scan`'s answer where a warm client's offer met a cold server
    (`opened_or_wanted`): the sketch of ``tree`` (scanned as without stamps: the index
    vouches for it) decides, then ``opened`` comes."""
    limit = racy_from()
    sketch = await trio.to_thread.run_sync(tree_sketch, tree, limit)
    taken = await _stamps_taken(connection, sketch, limit)
    answer = await receive_opened(opening)
    if not taken:
        return answer, tree, walked, None
    return answer, await trio.to_thread.run_sync(replica.stamped, tree, limit), walked, limit


async def _stamps_taken(connection: Connection, sketch: tuple[bytes, bytes], limit: int
                        ) -> bool:
    """Send ``stamps`` with this side's `sketches`: whether the server takes stamp roots."""
    conversation = connection.start(m.Stamps(sketch=sketch[0], racy_from=limit,
                                             paths=sketch[1]))
    try:
        return (await conversation.receive(m.Stamped)).stamps
    finally:
        conversation.close()


async def _scan_streamed(
    replica: Replica, remote: Remote, tree: Entry, walked: Walk | None, changes: Changes,
    stats: Stats, hb: int,
) -> tuple[Entry, list[m.Op], list[m.Failure | None]]:
    """After a streamed push, scan the tree the files came from (signed by then) while the
    server sets the times of the directories written in (`metadata.first_ops`, from the
    walk's tree: one that moved since is found by the metadata walk) and then rescans for
    the metadata walk's first question (`Remote.ask_metadata_early`). Asked before those
    ops, its answer was dropped and asked again: on a first copy of 100,000 files in 4,166
    directories, a second rescan and listing of 0.7 s. Returns the scanned tree, the ops
    and their results."""
    same = walked if walked is not None and walked.tree is tree else None
    entries = len(changes.files) + len(changes.mkdirs) + len(changes.links)
    first = metadata.first_ops(tree, changes, stats.kept_times, entries)
    scanned: list[Entry] = []

    async def scan() -> None:
        scanned.append(await trio.to_thread.run_sync(replica.scan, None, None, same))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scan)
        done = await remote.apply(first) if first else []
        remote.ask_metadata_early(hb)
    return scanned[0], first, done


def synced_top(hashes: Hashes, push: bool) -> m.Top | None:
    """The opened directory's own mode and time on the server, if this sync keeps them in
    step: a push leaves a share's top directory alone."""
    return None if hashes.top is None or (push and hashes.fixed) else hashes.top


def _top_differs(mine: Hashes, theirs: Hashes, push: bool) -> bool:
    top = synced_top(theirs, push)
    return top is not None and top != mine.top


async def one_way(connection: Connection, replica: Replica, tree: Entry, answer: m.Opened,
                  push: bool, options: Options, walked: Walk | None = None,
                  stamps: int | None = None) -> Stats:
    """Bring the target (the server's directory in a push, ``replica`` scanned as ``tree``
    in a pull) to the source's content, modes and times. An unsealed ``tree`` (a push into
    an empty directory, `scan_while_opening`) sends everything without comparing, and is
    scanned once the files are sent (signed by then: nothing is read again), from
    ``walked``, the walk it came from, when given (a second walk of a large tree would
    double the client's memory). ``stamps``: both trees have stamp roots, files modified
    since this time their true roots (`by_stamps`)."""
    started = time.monotonic()
    streaming = push and not tree.content
    local, remote = Local(replica, tree, stamps), Remote(connection, answer)
    source, target = (local, remote) if push else (remote, local)
    stats = Stats(files_total=count_files(tree), by_stamps=stamps is not None)
    stats.warnings += [f"{path}: {CHANGED} (read again by --checksum)"
                       for path in getattr(getattr(replica, "stats", None), "mismatched", [])
                       if options.checksum]
    if push:
        stats.failed += [(path, f"cannot read: {reason}") for path, reason in replica.errors]
    mine, theirs = local.hashes(), remote.hashes
    src, dst = (mine, theirs) if push else (theirs, mine)
    # The opened directory's own mode and time, where this sync keeps them in step: set
    # last, as every write inside it moves its time.
    top = src.top if synced_top(theirs, push) is not None else None
    last = [] if top is None else [m.Op("meta", "", mode=top.mode, mtime_ns=top.mtime_ns)]
    if (src.content, src.meta) == (dst.content, dst.meta):
        if top is None or top == dst.top:
            stats.in_step = not stats.failed
        elif options.dry_run:
            stats.changes = Changes(meta=[("", _top_what(top, dst.top))])
        else:
            stats.in_step = all(stats.ops_done(last, await target.apply(last)))
            stats.in_step = stats.in_step and not stats.failed
        await _keep_stamps(local, stats, stamps, options.dry_run)
        return _done(stats, started)
    deletion = await trio.to_thread.run_sync(_deletion, replica, tree, theirs, push, options,
                                             stats.files_total)
    for hb in (first_prefix(connection), m.HASH_BYTES):
        if streaming:
            stats.changes = changes = everything(tree)
        else:
            # A push's first comparison takes the listings this side knows from the tree it
            # started from (where the server did not change them since); the second, in
            # whole hashes after a prefix matched by chance, asks for everything.
            known = known_listings(replica.base, hb) if hb != m.HASH_BYTES else None
            stats.changes = changes = await compare(source, target, hb, pull=not push,
                                                    known=known, root=theirs.content)
            replica.base = None  # (its memory goes: only the first comparison takes it)
        if options.dry_run:
            vectors, singles = await metadata.walk(remote, local.tree, hb=hb)
            changes.meta = metadata.differences(vectors, singles)
            if top is not None and top != dst.top:
                changes.meta.append(("", _top_what(top, dst.top)))
            if options.delete:
                await _guard(target, changes, deletion, options, stats)
            return _done(stats, started)
        try:
            await _content(target, connection, replica, changes, options, stats, push,
                           theirs.unreadable, deletion, stamps)
        finally:
            if not push:
                await trio.to_thread.run_sync(replica.sync_dirs)
        if not push:
            await trio.to_thread.run_sync(metadata.put_back_times, replica, local.tree,
                                          changes)
            await local.refreshed()
        sent = None
        if streaming:  # the local tree's hashes, now that every file is signed
            sent = await _scan_streamed(replica, remote, tree, walked, changes, stats, hb)
            local.tree = sent[0]
            src = mine = local.hashes()
            streaming = False
        ops, results = await metadata.bring_in_step(
            local, remote, push, last, hb, changes, stats.kept_times,
            None if sent is None else sent[1:])
        stats.ops_done(ops, results)
        dst = await target.refreshed()
        stats.in_step = (src.content, src.meta) == (dst.content, dst.meta) and (
            top is None or dst.top == top
        )
        if stats.in_step or stats.failed or stats.refused or (
                (dst.content, dst.meta) == (src.content, src.meta)):
            break
        if changes.removals and not options.delete:
            break  # the target keeps files the source lacks: that is all that differs
        # A hash prefix matched by accident: compare again, in full.
    stats.seq = remote.hashes.seq if not push else dst.seq
    if not push:
        stats.files_total = count_files(local.tree)
        if stamps is not None:
            stats.covered = files_of(local.tree)
    await _keep_stamps(local, stats, stamps, options.dry_run)
    return _done(stats, started)


async def move_files(connection: Connection, replica: Replica, files: Files,
                     sizes: dict[str, int], push: bool, options: Options, stats: Stats,
                     done: Callable[[str, int, bool], None],
                     ready: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
    """Move ``files`` (path, root prefix the target holds there) to the target: small ones
    in batches, the rest (and those a batch sends back) one by one; many of each in
    flight. ``done(path, size, arrived)`` is called once per file. ``ready(paths)``
    returns once the target can take those files (`MadeDirs.ready`)."""
    if not push and files:  # this side is the target (as the server is for a push)
        await trio.to_thread.run_sync(replica.warm)
    groups, alone = batches(files, sizes, takes_deltas(connection),
                            takes_large_deltas(connection))
    limiter = trio.CapacityLimiter(options.concurrency)
    batch_limiter = trio.CapacityLimiter(batches_in_flight(connection.frames.rtt))

    async def one(path: str, there: bytes | None) -> None:
        if ready is not None:
            await ready([path])
        async with limiter:
            if push:
                ok = await push_file(connection, replica, path, there, stats)
                size = sizes.get(path, 0)
            else:
                got = await pull_file(connection, replica, path, there, stats)
                ok, size = got is not None, got or 0
        done(path, size, ok)

    async def batch(group: Files, nursery: trio.Nursery) -> None:
        if ready is not None:
            await ready([path for path, _ in group])
        async with batch_limiter:
            back = await (push_batch(connection, replica, group, stats, done, sizes) if push
                          else pull_batch(connection, replica, group, stats, done))
            for path, there in back:
                nursery.start_soon(one, path, there)

    async with trio.open_nursery() as nursery:
        for group in groups:
            nursery.start_soon(batch, group, nursery)
        for path, there in alone:
            nursery.start_soon(one, path, there)


async def _keep_stamps(local: Local, stats: Stats, stamps: int | None, dry_run: bool) -> None:
    """At the end of a sync by stamp roots, in step: keep the local tree of them, for the
    next sync to start from (`Replica.keep_stamps`: a cold index's only)."""
    replica = local.replica
    if stamps is not None and stats.in_step and not dry_run and not replica.errors:
        await trio.to_thread.run_sync(replica.keep_stamps, local.tree, stamps)


def _done(stats: Stats, started: float) -> Stats:
    stats.seconds = time.monotonic() - started
    return stats


def _top_what(mine: m.Top | None, theirs: m.Top | None) -> str:
    if mine is None or theirs is None:
        return ""
    return metadata.what(mine.mode != theirs.mode, mine.mtime_ns != theirs.mtime_ns)


async def _content(target: Side, connection: Connection, replica: Replica, changes: Changes,
                   options: Options, stats: Stats, push: bool, unreadable_there: int,
                   deletion: Deletion | None = None, stamps: int | None = None) -> None:
    """The target's entries made like the source's: replacements and directories in
    stages (`MadeDirs`), and files (many in flight) as their directories are made, while
    (where deletions may be made) the files the target holds at a path it is to remove are
    moved to their new path; then the files that could not be moved, and links; then
    deletions. With ``stamps``, a file is moved only where its content is the one sent
    (`_checked_moves`)."""
    stats.carried.append(changes)
    prelude = [m.Op("rm", p, expect=e) for p, e in changes.replace]
    prelude += [m.Op("mkdir", p, mode=mode) for p, mode in changes.mkdirs]
    made = MadeDirs(prelude)
    progress = Progress(options, len(changes.files), sum(changes.sizes.values()), stats)
    action = "send" if push else "fetch"

    def sent(path: str, size: int, ok: bool) -> None:
        progress.file_done(path, size, ok, action)

    # The prelude goes in stages from now on (the deletion guard's questions meanwhile),
    # and the files as the stages that make their directories are done. The moves are
    # made while the other files go: a move reads a path the source lacks and writes one
    # the target lacks, and no other file goes to either. (Made first, they held a renamed
    # tree's push up 0.2 s.)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(made.make, target, stats)
        deleting = await _may_delete(target, replica, changes, options, stats, push,
                                     unreadable_there, deletion)
        planned = moves(changes) if deleting else []
        if stamps is not None and planned:
            planned = await _checked_moves(connection, replica, planned, push)
        moving = {new for _, new, _ in planned}
        nursery.start_soon(move_files, connection, replica,
                           [(path, there) for path, there in changes.files if path not in moving],
                           changes.sizes, push, options, stats, sent, made.ready)
        await made.all_made()  # (a move may go into a new directory)
        for path, size in await _move_instead(target, planned, changes, stats):
            sent(path, size, True)
    unmoved = [(path, there) for path, there in changes.files if path in moving]
    await move_files(connection, replica, unmoved, changes.sizes, push, options, stats, sent)
    links = [m.Op("link", p, target=t, expect=e) for p, t, e in changes.links]
    stats.links += sum(stats.ops_done(links, await target.apply(links)))
    if not deleting:
        return
    if stamps is not None and push and await trio.to_thread.run_sync(
            _unreadable, replica, [path for path, _ in stats.failed]):
        # (by stamp roots, a file is first read when it is offered: as a scan's would,
        # an unreadable one keeps the target's files)
        stats.warnings.append("some files could not be read: nothing was deleted")
        return
    removals = [m.Op("rm", p, expect=e) for p, e in changes.removals]
    stats.deleted += sum(stats.ops_done(removals, await target.apply(removals)))


async def _checked_moves(connection: Connection, replica: Replica,
                         planned: list[tuple[str, str, m.Expected]], push: bool
                         ) -> list[tuple[str, str, m.Expected]]:
    """Moves found by stamp roots (a file gone from one path and new at another with the
    same size and time), made safe: another file can have both. Each goes only where the
    old file holds the new one's content: a push reads the new files here and names
    their roots in the moves' ``expect`` (the server reads the old ones to check it); a
    pull asks the server for the new ones' roots and reads the old ones here."""
    index = functools.partial(trio.to_thread.run_sync, replica.index_paths)
    if push:
        roots = await index([new for _, new, _ in planned])
        return [(old, new, m.Expected("f", roots[new][: m.WIRE_PREFIX]))
                for old, new, _ in planned if new in roots]
    theirs: dict[str, bytes | None] = {}
    news = [new for _, new, _ in planned]
    for start in range(0, len(news), MAX_ITEMS):
        some = news[start : start + MAX_ITEMS]
        conversation = connection.start(m.Roots(paths=some))
        try:
            roots = (await conversation.receive(m.Rooted)).roots
        finally:
            conversation.close()
        if len(roots) != len(some):
            raise ProtocolError(message="rooted: not one root per path asked for")
        theirs.update(zip(some, roots, strict=True))
    mine = await index([old for old, _, _ in planned])
    return [(old, new, m.Expected("f", theirs[new] or b""))
            for old, new, _ in planned
            if theirs[new] and mine.get(old, b"")[: m.WIRE_PREFIX] == theirs[new]]


def _unreadable(replica: Replica, paths: list[str]) -> bool:
    """Whether one of ``paths`` is a file here that cannot be read."""
    for path in paths:
        try:
            replica.fs.open_read(path).close()
        except FileNotFoundError:
            continue
        except (OSError, PathError):
            return True
    return False


async def _may_delete(target: Side, replica: Replica, changes: Changes, options: Options,
                      stats: Stats, push: bool, unreadable_there: int,
                      deletion: Deletion | None) -> bool:
    """Whether this run deletes what the source lacks: with ``--delete``, when every file
    of the source could be read and the deletion guards allow it (why not is in
    ``stats``). Weighed before the files move, as a renamed file is moved, not sent."""
    if not options.delete:
        return False
    unreadable = [p for p, _ in replica.errors] if push else unreadable_there
    if unreadable:
        what = ("some files could not be read" if push else
                f"the server could not read {unreadable_there} entries")
        stats.warnings.append(f"{what}: nothing was deleted" + ("" if push else " here"))
        return False
    return deletion is None or await _guard(target, changes, deletion, options, stats)


async def _move_instead(target: Side, planned: list[tuple[str, str, m.Expected]],
                        changes: Changes, stats: Stats) -> list[tuple[str, int]]:
    """Move the files the target holds at a path it is to remove to where the source has
    them (``planned``: `rdc.transfer.compare.moves`), and return them with their sizes;
    one that cannot be moved (changed meanwhile) stays in ``changes.files``, to be sent,
    and its old path removed, as without the move."""
    if not planned:
        return []
    ops = [m.Op("mv", old, destination=new, expect=e) for old, new, e in planned]
    results = await target.apply(ops)
    moved = {new: old for (old, new, _), result in zip(planned, results, strict=True)
             if result is None}
    gone = set(moved.values())
    changes.files = [(path, there) for path, there in changes.files if path not in moved]
    changes.removals = [(path, e) for path, e in changes.removals if path not in gone]
    done = []
    for new in moved:
        size = changes.sizes.get(new, 0)
        stats.file_done(new, m.Done(ok=True, how="move", matched=size))
        done.append((new, size))
    return done


@record
class Deletion:
    """What the deletion guards weigh (`rdc.transfer.guards`): the source, and the files
    of the target and how to name it."""

    source: guards.Source
    target_files: int
    target: str


def local_marker(replica: Replica, options: Options, place: bool = False) -> RootState:
    """The folder marker state of the local root (placed there if ``place`` and it has
    content but no marker yet); unmarked and not lost when markers are not used."""
    if options.markers is None:
        return RootState(False)
    return settle(replica.fs.fileno(), replica.root, options.markers, place=place)


def _deletion(replica: Replica, tree: Entry, theirs: Hashes, push: bool,
              options: Options, files: int) -> Deletion:
    """What a deletion would take from the target; ``files`` are ``tree``'s (counted
    once, by the caller)."""
    local = f"the local directory {replica.root}"
    if push:
        source = guards.Source(local, local_marker(replica, options).lost, not tree.children)
        return Deletion(source, -1 if theirs.files is None else theirs.files, "the server")
    source = guards.Source("the server's directory", theirs.marker_lost,
                           theirs.content == EMPTY_CONTENT)
    return Deletion(source, files, local)


async def _guard(target: Side, changes: Changes, deletion: Deletion, options: Options,
                 stats: Stats) -> bool:
    """Whether the deletions of ``changes`` may be made; if not, why is in ``stats``."""
    if not changes.removals:
        return True
    size = await guards.size_of(target, changes.removals)
    why = guards.refusal(deletion.source, size, deletion.target_files, deletion.target, options)
    if why is not None:
        stats.refused.append(why)
    return why is None
