"""Small files in batches (docs/protocol.md, "Small files in batches").

A source tree is mostly small files, and what they cost a sync is not their bytes but their
number: a conversation, a few thread hops, a sync and an index transaction each. Here up to
BATCH_FILES of them (and BATCH_BYTES of content) go in one conversation: offered in one
message, decided by the target in one worker-thread hop, their contents sent in a few data
messages, written, checked, made durable at once and renamed into place in one more hop,
and recorded in one index transaction.

A file whose older version the target holds at its path goes by the per-file exchange,
which sends only what differs: from the start when the source knows it (the listing said
what is there, and the file is large enough to be described rather than sent: offering
it in a batch too cost ~75 bytes of offer and a round trip each, a third of what a
scattered edit cost), else when the target answers ``descend``. So does a file new at its
path that is near-identical to one the target holds elsewhere (`NEAR_TRAITS` of its 12
traits in common: renamed or copied, then edited). Other new files are sent whole, even
if loosely similar files are there: the connection's compression stream finds most of
what they share with files sent shortly before, at none of a descent's round trips.

The blocking halves (`offer_batch` on the source, `decide_batch` and `write_batch` on the
target) run on one worker thread per batch; the four conversation flows wire them to the
two roles: `push_batch` and `receive_offers` (a push), `pull_batch` and `serve_gets` (a
pull).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import trio

from rdc.content.signature import FileSignature, signature_of_bytes, tree_of_bytes
from rdc.content.tree import Tree
from rdc.errors import ProtocolError, Refusal, RemoteError, disk_full
from rdc.local.filestat import FileStat, mtime_ns
from rdc.local.fs import ConflictError, Expect, HeldDirs, TempFile, sync_all
from rdc.local.index import IndexedFile
from rdc.local.paths import PathError
from rdc.local.replica import Replica, Signed
from rdc.local.verify import CHANGED, recheck
from rdc.params import OFFER_ROOT
from rdc.records import record
from rdc.transfer import lockstep
from rdc.transfer.compare import SHORT_DIGESTS
from rdc.transfer.descent import SUBS_FROM, WHOLE_BELOW, SourceFile, whole_is_best
from rdc.transfer.lockstep import Descents, Rebuilt
from rdc.transfer.ops import expectation, holds
from rdc.transfer.stats import Stats
from rdc.transfer.target import takes_short_prefixes
from rdc.wire import messages as m
from rdc.wire.connection import Connection, Conversation

# A file goes in a batch if it is smaller than this (by the size the source knows) ...
SMALL_FILE = 64 << 10
# ... or, between peers with ``large-deltas``, if the target holds an older version of it
# and it is smaller than this: it is described in its batch (``delta``). Alone, its
# exchange cost the target about 5 ms of CPU (a conversation, several round trips, five
# worker-thread hops, a commit of its own);
# Django 5.0.1 -> 5.0.2 has 29 such files of 67-355 KB among 336 edited: warm push 0.98-1.07
# -> 0.88-0.99 s, cold 1.52-1.82 -> 1.31-1.49 s, 1.5 KB fewer bytes; a cold pull 1.80-2.20
# -> 1.62-2.02 s. At most PARTIAL_BYTES: a larger file goes alone, where an interrupted
# transfer of it is resumed.
DELTA_FILE = 1 << 20
# ... and a batch holds at most this many files and this much content ...
BATCH_FILES = 256
BATCH_BYTES = 1 << 20
# ... and this much of files the target holds an older version of (``delta``), which it
# describes rather than receives: what travels is a fraction, but both ends hold their
# content until the batch is written. (Measured on 1,000 edits of the 100,000-file tree:
# 1, 4 and 8 MiB took the same time, the server's work, not the batches' round trips, being
# what the files' part of the sync waits for; larger ones only held more memory.)
DELTA_BYTES = 1 << 20
# The content one batch holds in memory at either end (what the source read and keeps until
# the verdicts, what the target copies or receives until it writes): a batch this side
# cuts holds at most BATCH_BYTES by the sizes it knew, and a file may have grown since. A
# peer's batch of 256 files of 64 KiB would be 16 MiB: beyond this, the target has the
# rest go one by one (``descend``) and the source reads them only when asked to send.
HELD_BYTES = BATCH_BYTES + SMALL_FILE
# Files a source bounded by ``hold`` reads at once (their content is in memory together,
# past what it holds for the batch: a peer's 8 batches in flight of 256 files of 60 KB took
# a server from 40 to 178 MB when each batch's files were read in one run).
HOLD_STEP = 16
DELTA_HELD = DELTA_BYTES + SMALL_FILE  # the same for the ``delta`` files
# Content sent in one data message.
DATA_MESSAGE = 1 << 20
# A file new at its path descends if an indexed file shares this many of its 12 traits
# (near-identical: most likely its own older version under another name).
NEAR_TRAITS = 9
# ... or, described in its batch (a peer that takes ``delta``: a few round trips shared
# by the batch), this many: about half its content. A file of 8 chunks or more is sketched
# over its chunks, and one edited chunk of 8 leaves 7 or 8 traits of 12 as they were
# (renamed and edited Django files sent whole: 155 KB). A seed that shares less than it
# seemed costs its lists, a few percent of the file.
RESEMBLED_TRAITS = 6
# Batches a sender has in flight (offered and not yet answered with results): at least
# BATCHES_IN_FLIGHT, the target's writers being the limit on a fast link; over a slow one,
# enough to cover the two round trips of a batch (offer to verdicts, data to results) at
# TARGET_RATE, the rate a target writes small files at (20-30 MB/s here), up to
# MOST_BATCHES_IN_FLIGHT (both ends hold up to HELD_BYTES + DELTA_HELD for each). With 4
# in flight, a Django first copy over a 200 ms link sent its last 40 batches 4 per two
# round trips: 2.3 s of its 7.2, at about 10 MB/s.
BATCHES_IN_FLIGHT = 4
MOST_BATCHES_IN_FLIGHT = 16
TARGET_RATE = 32 << 20


def batches_in_flight(rtt: float) -> int:
    """How many batches to have in flight over a link of round trip ``rtt`` seconds."""
    wanted = math.ceil(2 * rtt * TARGET_RATE / BATCH_BYTES)
    return max(BATCHES_IN_FLIGHT, min(MOST_BATCHES_IN_FLIGHT, wanted))


# Batches written at once in a process: each holds two descriptors per file (the temporary
# and its directory) until the batch is installed, so that a peer's many conversations
# cannot run the process out of descriptors (a fuzzer's offers of thousands of files each
# held 8,000 at once).
WRITERS = 4
_writers: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("batch_writers")


def writers() -> trio.CapacityLimiter:
    """This run's limiter of batch writes (`WRITERS`)."""
    try:
        return _writers.get()
    except LookupError:
        limiter = trio.CapacityLimiter(WRITERS)
        _writers.set(limiter)
        return limiter


def _at_most_a_batch(files: list, what: str) -> None:
    """A batch from a peer holds at most BATCH_FILES files (what this side sends)."""
    if len(files) > BATCH_FILES:
        raise ProtocolError(message=f"{what} of {len(files)} files (at most {BATCH_FILES})")

Verdict = str | m.Failure
Files = list[tuple[str, bytes | None]]  # (path, root prefix the target holds there)
# A source's offer of a file (or why not), its content if held, its tree.
Offered = tuple[m.FileOffer | m.Failure, bytes | None, Tree | None]
# The feature both sides must have for the verdict ``delta`` (rdc.transfer.lockstep).
DELTAS = "batch-deltas"
# The feature with which the offers answering a ``gets`` name no path (b""): each is the
# path asked for in its place, which the client has (the paths were a tenth of a pull's
# bytes: 1% of 100,000 files, 58 KB asked and the same again in the offers).
ASKED_PATHS = "asked-paths"
# The feature with which a batch may hold files under DELTA_FILE that the target holds an
# older version of, described (``delta``) like small ones.
LARGE_DELTAS = "large-deltas"
# The feature with which a server sets each directory where a pushed batch replaced files
# back to its time before the batch: where only files edited in place changed, the client
# then sends no op for it (1% of 100,000 files: an op for each of about 900 directories).
KEPT_TIMES = "kept-dir-times"


def takes_deltas(connection: Connection) -> bool:
    """Whether the peer takes ``delta`` in batches (an older one sends edited files alone)."""
    return DELTAS in connection.frames.features


def takes_large_deltas(connection: Connection) -> bool:
    """Whether a batch may describe files up to DELTA_FILE (`LARGE_DELTAS`)."""
    return takes_deltas(connection) and LARGE_DELTAS in connection.frames.features


def batch_below(large: bool) -> int:
    """The files a batch holds are smaller than this: DELTA_FILE between peers with
    `LARGE_DELTAS` (``large``), else SMALL_FILE."""
    return DELTA_FILE if large else SMALL_FILE


def offer_root(connection: Connection) -> int:
    """How many bytes of each file's root this side's offers carry: OFFER_ROOT if the
    peer takes them (``short-digests``), else the whole root."""
    return OFFER_ROOT if SHORT_DIGESTS in connection.frames.features else m.HASH_BYTES


def expected(digest: bytes | None) -> m.Expected:
    """What the target holds at a path: nothing, or a file whose root starts so."""
    return m.NOTHING if digest is None else m.Expected("f", digest)


def batches(files: Files, sizes: dict[str, int], deltas: bool = False, large: bool = False
            ) -> tuple[list[Files], Files]:
    """``files`` cut into batches of small files, and the rest (larger, of unknown size,
    or, unless the peer takes ``deltas`` in batches, with an older version at the target
    to descend against), each in their original order. With ``large`` (a peer with
    `LARGE_DELTAS`), files up to DELTA_FILE go in batches too: described there if the
    target holds an older version, else (new at their path) sent whole unless the target
    finds a seed or a copy for them, as their own exchange would."""
    out: list[Files] = []
    alone: Files = []
    count = size = described = 0
    for item in files:  # the caller's tuples, not copies (100,000 files: 6 MB)
        path, there = item
        n = sizes.get(path)
        delta = there is not None and n is not None and n >= SUBS_FROM
        if n is None or (delta and not deltas) or n >= batch_below(large):
            alone.append(item)
            continue
        if not out or count == BATCH_FILES or (
                described + n > DELTA_BYTES if delta else size + n > BATCH_BYTES):
            out.append([])
            count = size = described = 0
        out[-1].append(item)
        count += 1
        if delta:
            described += n
        else:
            size += n
    return out, alone


def _failure(exc: BaseException, path: str) -> m.Failure:
    """Why one file failed; a full disk is no one file's failure: it is raised again."""
    if disk_full(exc):
        raise exc
    if isinstance(exc, ConflictError):
        return m.Failure("conflict", str(exc))
    if isinstance(exc, PathError | IsADirectoryError | NotADirectoryError):
        return m.Failure("path", str(exc))
    if isinstance(exc, Refusal):
        return m.Failure(exc.code, str(exc))
    if isinstance(exc, FileNotFoundError):
        return m.Failure("vanished", f"{path} is gone")
    assert isinstance(exc, OSError)
    return m.Failure("io", f"{path}: {exc.strerror or exc}")


_EXPECTED_ERRORS = (OSError, PathError, ConflictError, Refusal)


# ---------------------------------------------------------------- the blocking halves


def offer_batch(
    replica: Replica, files: list[tuple[str, m.Expected | None]],
    changed: Callable[[str], None] | None = None, hold: int | None = None,
    root: int = m.HASH_BYTES, large: bool = False, sizes: Mapping[str, int] | None = None,
) -> list[Offered]:
    """The source's offer of each file, with its content if it is small, and its tree
    (blocking). A
    file that cannot be read (gone, through a symlink now) is a Failure in its place. A
    file whose content is not what its index says is read again and offered as it is
    (``changed`` is told of it if its time did not move: bit rot). With ``hold``, small
    files past that many bytes of content are offered as indexed, without their content
    (None): `read_offered` reads it if the target asks for it. ``root``: how many bytes
    of each file's root its offer carries (`offer_root`). With ``large`` (`batches`), files
    of SMALL_FILE up to DELTA_FILE are read whole too (`_read_limit`); ``sizes``: the sizes
    `batches` cut the batch by, for files not indexed (a side synced by stamp roots has
    read none of them)."""
    # One index transaction for the files signed; each directory opened once.
    with replica.recording_together(), HeldDirs(replica.fs) as dirs:
        return _offer_each(replica, files, changed, hold, dirs, root, large, sizes or {})


def _offer_each(
    replica: Replica, files: list[tuple[str, m.Expected | None]],
    changed: Callable[[str], None] | None, hold: int | None, dirs: HeldDirs, root: int,
    large: bool, sizes: Mapping[str, int],
) -> list[Offered]:
    out: list[Offered] = []
    held = 0
    rows = replica.indexed([path for path, _ in files])
    limits = [_read_limit(rows.get(path), large, sizes.get(path)) for path, _ in files]
    read: list[Signed | None] = []
    # Files read at once: all of them, or a few at a time where ``hold`` bounds what is kept.
    step = len(files) if hold is None else HOLD_STEP
    for k, (path, expect) in enumerate(files):
        if k == len(read):
            read += _read_many(replica, [p for p, _ in files[k : k + step]],
                               limits[k : k + step], rows)
        signed, read[k], limit = read[k], None, limits[k]
        try:
            signature, st, data, suspect = signed if signed is not None else (
                replica.sign_small(path, rows.get(path), limit, dirs))
            if suspect:  # not what its index says: read again, signed from the bytes read
                replica.store_recorded()  # (recheck compares with the index)
                if recheck(replica, path) is not None and changed is not None:
                    changed(path)
                signature, st, data, _ = replica.sign_small(path, None, limit)
        except _EXPECTED_ERRORS as exc:
            out.append((_failure(exc, path), None, None))
            continue
        if data is not None and hold is not None and signature.size >= WHOLE_BELOW and (
                held + signature.size > hold):
            data = None  # offered as indexed; read again if the target asks for it
        held += len(data or b"")
        out.append((_offer(path, signature, st, expect, data, root), data, signature.tree))
    return out


def _read_limit(row: IndexedFile | None, large: bool, size: int | None = None) -> int:
    """The most a batch's source reads of a file whole: with ``large``, up to DELTA_FILE of
    one that was SMALL_FILE or more when indexed (``row``), or when walked if it is not
    indexed (``size``: `batches` put it there by that size), else up to SMALL_FILE. A
    file grown past its limit since is not read whole (it goes alone), so a batch holds
    at most 32 files read up to DELTA_FILE (1 MiB of files to describe and 1 MiB of new
    ones, by the sizes it was cut by), whatever grows meanwhile. Read whole, a file's
    bytes are checked against its index row when offered (bit rot is found then, and it
    is offered as it is); offered as indexed, a file changed under its row would fail the
    whole batch when read to be sent. (Every file a batch offers is one the target holds
    a version of or nothing at all at its path, and a pulled one is asked for by the
    same rules: what is there does not change the limit.)"""
    known = row.size if row is not None else size
    if large and known is not None and known >= SMALL_FILE:
        return DELTA_FILE - 1
    return SMALL_FILE - 1


def _read_many(replica: Replica, paths: list[str], limits: list[int],
               rows: dict[str, IndexedFile]) -> list[Signed | None]:
    """`Replica.sign_small_many` of ``paths``, each up to its limit (`_read_limit`), in
    order: one native call per distinct limit."""
    out: list[Signed | None] = [None] * len(paths)
    for limit in sorted(set(limits)):
        at = [k for k, one in enumerate(limits) if one == limit]
        for k, signed in zip(at, replica.sign_small_many([paths[k] for k in at], rows,
                                                         limit), strict=True):
            out[k] = signed
    return out


def _offer(path: str, signature: FileSignature, st: FileStat,
           expect: m.Expected | None, data: bytes | None, root: int) -> m.FileOffer:
    tree = signature.tree
    inline = data if data is not None and tree.size < WHOLE_BELOW else None
    return m.FileOffer(path, tree.size, tree.root[:root], len(tree.levels),
                       signature.sketch, st.st_mode & 0o7777, mtime_ns(st), expect, inline)


def read_offered(replica: Replica, offer: m.FileOffer) -> bytes:
    """The content of a file offered without it (``hold``, or larger than SMALL_FILE),
    read now that the target asked for it: still what was offered, else Refusal
    ``vanished`` (blocking). At most DELTA_FILE bytes are read."""
    try:
        _, _, f = replica.sign(offer.path)
        with f:
            data = f.read(min(offer.size, DELTA_FILE - 1) + 1)
    except _EXPECTED_ERRORS as exc:
        raise Refusal("vanished", message=f"{offer.path}: {exc}") from None
    if not _is_offered(data, offer):
        raise Refusal("vanished", message=f"{offer.path} changed while it was read; ask again")
    return data


@record
class Decision:
    """The target's verdict on one offered file, the check of what must still be at its
    path when its content is put there, and the content when this side has it (a local
    copy, or the offer's inline data)."""

    verdict: Verdict
    check: Expect | None = None
    content: bytes | None = None
    seeds: list[tuple[str, Tree]] | None = None  # ``delta``: the seeds' paths and trees


def decide_batch(
    replica: Replica, offers: list[tuple[m.FileOffer, m.Expected | None]],
    deltas: bool = False, large: bool = False,
) -> list[Decision]:
    """The target's verdict on each offered file (blocking; see docs/protocol.md). Nothing
    is written here: copies, inline files and ``delta`` files (only if the source takes
    ``deltas``; with ``large``, of up to DELTA_FILE) are written with the sent ones, by
    `write_batch`, so that one sync makes the whole batch durable."""
    out: list[Decision] = []
    rows = replica.indexed([offer.path for offer, _ in offers])
    unindexed = [offer.path for offer, expect in offers
                 if offer.path not in rows and expect is not None and expect.kind == "f"]
    if unindexed:  # (a side synced by stamp roots: read now, all at once)
        replica.index_paths(unindexed)
        rows.update(replica.indexed(unindexed))
    holders = replica.holders_of([offer.root for offer, _ in offers
                                  if offer.size < batch_below(large)])
    with HeldDirs(replica.fs) as dirs:
        for offer, expect in offers:
            try:
                out.append(_decide(replica, offer, expect, rows.get(offer.path),
                                   holders.get(offer.root, []), deltas, dirs, large))
            except _EXPECTED_ERRORS as exc:
                out.append(Decision(_failure(exc, offer.path)))
    # The seeds of the files to describe, looked up together.
    described = [k for k, d in enumerate(out) if d.verdict == "delta" and d.seeds is None]
    found = replica.seed_trees_many([(offers[k][0].path, offers[k][0].sketch)
                                     for k in described])
    for k, seeds in zip(described, found, strict=True):
        out[k] = _seeded(out[k], offers[k][0], seeds)
    held = {"copy": 0, "send": 0, "delta": 0}
    return [d if isinstance(d.verdict, m.Failure) else _within_budget(d, offer, held)
            for d, (offer, _) in zip(out, offers, strict=True)]


def _within_budget(decision: Decision, offer: m.FileOffer, held: dict[str, int]
                   ) -> Decision:
    """``decision``, or ``descend`` where the batch already holds as much content of its
    kind as it may (the file then goes alone); ``held`` counts what it holds."""
    kind = decision.verdict
    if kind in held:
        held[kind] += offer.size
        over = (held["delta"] > DELTA_HELD if kind == "delta"
                else held["copy"] + held["send"] > HELD_BYTES)
        if over:  # more content than a batch holds: this one alone
            held[kind] -= offer.size
            return Decision("descend", decision.check)
    return decision


def _decide(replica: Replica, offer: m.FileOffer, expect: m.Expected | None,
            row: IndexedFile | None, holders: list[str], deltas: bool = False,
            dirs: HeldDirs | None = None, large: bool = False) -> Decision:
    """One file's verdict; ``row``: its path's index row, ``holders``: the paths indexed
    with its root (both looked up for the whole batch at once); ``dirs``: the batch's
    directory descriptors; ``deltas``, ``large``: as for `decide_batch`."""
    path = offer.path
    # Where nothing may be there, nothing is looked at: the install checks it (a link that
    # fails if anything is there), and a look here only saved sending a file that another
    # writer put there meanwhile, at a stat per file of every first copy (a twentieth of
    # the server's time).
    nothing = expect is not None and expect.kind == ""
    st = None if nothing else replica.fs.lstat(path, dirs)
    try:
        if nothing:
            check: Expect | None = Expect.absent()
        else:
            check = expectation(replica, path, expect, row)
    except ConflictError:
        if not holds(replica, path, offer.root):
            raise
        check = None  # what was expected is gone, but what is there is what we want
        st = replica.fs.lstat(path)
        row = replica.indexed([path]).get(path)  # (holds() indexed it)
    if st is not None:  # (read now if not indexed as it is: to be found, and a seed)
        row = replica.row_as_it_is(path, st, row)
    current = row.root if st is not None and row is not None and row.describes(st) else None
    if m.same_root(current, offer.root):
        replica.set_meta(path, offer.mode, offer.mtime_ns, held=dirs)
        return Decision("have", check)
    if offer.size < batch_below(large):
        for holder in holders:
            content = _local_copy(replica, holder, path, offer)
            if content is not None:
                return Decision("copy", check, content)
    if offer.data is not None:
        return Decision("done", check, offer.data)
    # An indexed older version is a seed of its own, even if written too recently for the
    # index to vouch for it (racy): a seed's bytes are checked against its hashes as read.
    older_here = st is not None and row is not None
    if offer.size >= SMALL_FILE or (older_here and not whole_is_best(
        offer.size, offer.depth, older_here, row.size if row is not None else None)
    ):
        return _described(offer, check, deltas, large)
    if (not older_here and offer.sketch is not None
            and offer.size >= (WHOLE_BELOW if deltas else SUBS_FROM)
            and replica.resembled(offer.sketch, RESEMBLED_TRAITS if deltas else NEAR_TRAITS)):
        return _described(offer, check, deltas, large)  # renamed or copied, then edited
    return Decision("send", check)


def _described(offer: m.FileOffer, check: Expect | None, deltas: bool, large: bool = False
               ) -> Decision:
    """A file worth describing against seeds: in this batch (``delta``) if it is small (up
    to DELTA_FILE with ``large``) and the source takes deltas, its seeds to be chosen with
    the batch's (`_seeded`); else by the per-file exchange."""
    if not deltas or offer.size >= batch_below(large):
        return Decision("descend", check)
    return Decision("delta", check)


def _seeded(decision: Decision, offer: m.FileOffer, seeds: list[tuple[str, Tree]]
            ) -> Decision:
    """A ``delta`` decision with its ``seeds``, or ``send`` if none serves."""
    if not seeds or whole_is_best(offer.size, offer.depth, True, seeds[0][1].size):
        return Decision("send", decision.check)  # (an older version's tree that no longer
        # parses; a small file whose best seed is too unlike it in size to describe it against)
    return dataclasses.replace(decision, seeds=seeds)


def _local_copy(replica: Replica, holder: str, path: str, offer: m.FileOffer) -> bytes | None:
    """The content of local file ``holder`` if it still has the offered content."""
    if holder == path:
        return None
    try:
        with replica.fs.open_read(holder) as f:
            content = f.read(offer.size + 1)
    except (OSError, PathError):
        return None
    return content if _is_offered(content, offer) else None


def _is_offered(content: bytes, offer: m.FileOffer) -> bool:
    """Whether ``content`` is the file ``offer`` describes (its size and root)."""
    return len(content) == offer.size and m.same_root(signature_of_bytes(content).root,
                                                      offer.root)


WRITTEN = ("copy", "done", "send", "delta")  # the verdicts whose files write_batch writes
# The result of a ``delta`` file that did not check out when rebuilt: not a failure, the
# source sends it by the per-file exchange (which asks again plain, then whole).
AGAIN = "again"


def write_batch(
    replica: Replica, files: list[tuple[m.FileOffer, Expect | None, bytes]],
    signatures: Sequence[FileSignature | None] = (), keep_times: bool = False,
) -> list[m.Failure | None]:
    """Write each file's content beside its destination, check its root, make them all
    durable at once, then install each where its check still holds, and record them in
    one index transaction (blocking). One result per file. ``signatures``: those already
    made of the contents (by position; a missing one is made here, with the offered sketch:
    it only steers the choice of seeds, whose bytes are checked as they are used). With
    ``keep_times``, the directories where it replaced files (below the top) get back the
    times they had before (`Replica.keep_dir_times`)."""
    results: list[m.Failure | None] = [None] * len(files)
    prepared: list[tuple[int, TempFile, FileSignature]] = []
    checked: list[tuple[int, FileSignature]] = []
    for i, (offer, _, data) in enumerate(files):
        made = signatures[i] if i < len(signatures) else None
        signature = made if made is not None else FileSignature(tree_of_bytes(data),
                                                                offer.sketch)
        if m.same_root(signature.root, offer.root):
            checked.append((i, signature))
        else:
            results[i] = m.Failure("verify", f"{offer.path}: the content does not have "
                                   "the offered root (it changed at the source?)")
    dirs = HeldDirs(replica.fs)
    noted: list[str] = []
    written = False
    try:
        if keep_times:
            noted = replica.keep_dir_times(dirs, [files[i][0].path for i, _ in checked
                                                  if _replaces(files[i][1])])
        temps = replica.fs.create_temps(
            [(files[i][0].path, files[i][2], files[i][0].mode, files[i][0].mtime_ns)
             for i, _ in checked], dirs)
        for (i, signature), temp in zip(checked, temps, strict=True):
            if isinstance(temp, TempFile):
                prepared.append((i, temp, signature))
            else:
                results[i] = _failure(temp, files[i][0].path)
        dirs.close()  # (each temporary holds its own)
        sync_all(replica.fs, [temp for _, temp, _ in prepared])
        recorded = []
        installed = replica.install_all([(temp, files[i][1]) for i, temp, _ in prepared])
        for (i, _, signature), st in zip(prepared, installed, strict=True):
            offer = files[i][0]
            if isinstance(st, ConflictError):
                if holds(replica, offer.path, offer.root):  # another writer got there first
                    replica.set_meta(offer.path, offer.mode, offer.mtime_ns)
                else:
                    results[i] = _failure(st, offer.path)
            elif isinstance(st, _EXPECTED_ERRORS):
                results[i] = _failure(st, offer.path)
            else:
                recorded.append((offer.path, st, signature))
        replica.record_many(recorded)
        written = True
    finally:
        replica.put_dir_times_back(noted, write=written)
        dirs.close()
        for _, temp, _ in prepared:
            temp.abort()  # nothing for those installed
    return results


def _replaces(expect: Expect | None) -> bool:
    """Whether a file written with ``expect`` replaces one (a file new at its path adds an
    entry: its directory's time moved at the source too, and is set by the metadata)."""
    return expect is not None and expect.kind == "file"


# ---------------------------------------------------------------- the conversations


async def _send_contents(conversation: Conversation, contents: Sequence[bytes | m.FileOffer],
                         replica: Replica | None = None) -> None:
    """The contents in ``data`` messages; an offer in ``contents`` is a file offered without
    its content (`offer_batch`'s ``hold``), read from ``replica`` now."""
    pieces: list[bytes] = []
    size = 0
    for n, item in enumerate(contents):
        if isinstance(item, m.FileOffer):
            assert replica is not None
            data = await trio.to_thread.run_sync(read_offered, replica, item)
        else:
            data = item
        pieces.append(data)
        size += len(data)
        last = n == len(contents) - 1
        if size >= DATA_MESSAGE or last:
            await conversation.send_data(m.Data(d=pieces, end=last))
            pieces, size = [], 0


async def _receive_contents(conversation: Conversation, sizes: list[int]) -> list[bytes]:
    """One piece per file, of its offered size, over ``data`` messages up to ``end``."""
    contents: list[bytes] = []
    while True:
        message = await conversation.receive(m.Data)
        contents.extend(message.d)
        if len(contents) > len(sizes):
            raise ProtocolError(message="more file contents than were asked for")
        if message.end:
            break
    if [len(d) for d in contents] != sizes:
        raise ProtocolError(message="file contents that do not have their offered sizes")
    return contents


def _failed(stats: Stats, path: str, failure: m.Failure) -> None:
    stats.failed.append((path, f"{failure.code}: {failure.msg}"))


def _written(stats: Stats, offer: m.FileOffer, verdict: Verdict,
             result: m.Failure | None, literal: int = 0) -> None:
    """Count a file the target wrote (a copy, an inline file, one sent, or a ``delta``
    with ``literal`` bytes of data)."""
    if result is not None:
        _failed(stats, offer.path, result)
    elif verdict == "copy":
        stats.file_done(offer.path, m.Done(ok=True, how="copy", matched=offer.size))
    elif verdict == "delta":
        stats.file_done(offer.path, m.Done(ok=True, how="delta", literal=literal,
                                           matched=offer.size - literal))
    else:
        stats.file_done(offer.path, m.Done(ok=True, how="whole", literal=offer.size))


async def push_batch(connection: Connection, replica: Replica, files: Files, stats: Stats,
                     done: Callable[[str, int, bool], None],
                     sizes: Mapping[str, int] | None = None) -> Files:
    """Push a batch of small local files (the client is the source); the files the server
    wants by the per-file exchange are returned. ``done(path, size, arrived)`` is called for
    each file settled here; ``sizes``: those `batches` cut it by."""
    def changed(path: str) -> None:
        stats.warnings.append(f"{path}: {CHANGED} (bit rot?); read again and sent as it is")

    large = takes_large_deltas(connection)
    signed = await trio.to_thread.run_sync(
        offer_batch, replica, [(path, expected(there)) for path, there in files], changed,
        None, offer_root(connection), large, sizes)
    offered: list[tuple[m.FileOffer, bytes | None, Tree | None, bytes | None]] = []
    alone: Files = []
    for (path, there), (offer, data, tree) in zip(files, signed, strict=True):
        if isinstance(offer, m.Failure):
            _failed(stats, path, offer)
            done(path, 0, False)
        elif large and data is None and offer.size >= SMALL_FILE:
            # Grown past what this side reads whole for a batch since the scan: a peer with
            # `LARGE_DELTAS` may answer ``delta`` for any file under DELTA_FILE it is offered.
            alone.append((path, there))
        else:
            offered.append((offer, data, tree, there))
    if not offered:
        return alone
    conversation = connection.start(m.Offers(files=[offer for offer, _, _, _ in offered]))
    try:
        verdicts = (await conversation.receive(m.Verdicts)).verdicts
        if len(verdicts) != len(offered):
            raise ProtocolError(message="verdicts that do not match the offers")
        sends: list[bytes] = []
        written: list[tuple[int, m.FileOffer, Verdict, bytes | None]] = []
        sources: dict[int, SourceFile] = {}
        for n, ((offer, data, tree, there), verdict) in enumerate(
                zip(offered, verdicts, strict=True)):
            if verdict == "descend":
                alone.append((offer.path, there))
            elif isinstance(verdict, m.Failure):
                _failed(stats, offer.path, verdict)
                done(offer.path, 0, False)
            elif verdict == "have":
                done(offer.path, offer.size, True)
            else:
                written.append((n, offer, verdict, there))
                if verdict in ("send", "delta") and data is None:
                    raise ProtocolError(message=f"{verdict} asked for {offer.path}, too large")
                if verdict == "send":
                    sends.append(data)  # type: ignore[arg-type]
                elif verdict == "delta":
                    assert data is not None and tree is not None
                    sources[n] = lockstep.source_of(tree, data)
        if sends:
            await _send_contents(conversation, sends)
        if written:
            sent: dict[int, int] = {}
            if sources:
                last, sent = await lockstep.serve(conversation, sources, m.Results)
            else:
                last = await conversation.receive(m.Results)
            assert isinstance(last, m.Results)
            if len(last.results) != len(written):
                raise ProtocolError(message="results that do not match the files written")
            for (n, offer, verdict, there), result in zip(written, last.results, strict=True):
                if verdict == "delta" and result is not None and result.code == AGAIN:
                    alone.append((offer.path, there))
                    continue
                literal = min(sent.get(n, 0), offer.size)
                _written(stats, offer, verdict, result, literal)
                if result is None and KEPT_TIMES in connection.frames.features:
                    stats.kept_times.add(offer.path)
                done(offer.path, offer.size, result is None)
    except Refusal as exc:  # the server refused the whole batch (read-only, say)
        if not isinstance(exc, RemoteError):  # (this side's: the server's side ends too)
            conversation.send(m.Error(code=exc.code, msg=str(exc)))
        for offer, _, _, _ in offered:
            stats.failed.append((offer.path, str(exc)))
            done(offer.path, 0, False)
        return []
    finally:
        conversation.close()
    return alone


async def receive_offers(conversation: Conversation, replica: Replica,
                         message: m.Offers) -> None:
    """The server's side of a pushed batch (it is the target)."""
    _at_most_a_batch(message.files, "offers")
    offers: list[m.FileOffer] = []
    for offer in message.files:
        if isinstance(offer, m.Failure):
            raise ProtocolError(message="a pushed batch offers files, not errors")
        if not offer.path:
            raise ProtocolError(message="an offer to the server names its path")
        offers.append(offer)
    decided = await trio.to_thread.run_sync(
        decide_batch, replica, [(offer, offer.expect) for offer in offers],
        takes_deltas(conversation.connection), takes_large_deltas(conversation.connection))
    conversation.send(m.Verdicts(verdicts=[d.verdict for d in decided]))
    written, _ = await _write_decided(
        conversation, replica, offers, decided,
        keep_times=KEPT_TIMES in conversation.connection.frames.features)
    if written:
        conversation.send_last(m.Results(results=written))


async def _write_decided(conversation: Conversation, replica: Replica,
                         offers: Sequence[m.FileOffer | m.Failure], decided: list[Decision],
                         finish: bool = False, keep_times: bool = False,
                         ) -> tuple[list[m.Failure | None], dict[int, Rebuilt]]:
    """The target's second half of a batch: receive the contents of the ``send`` files,
    rebuild the ``delta`` ones (`rdc.transfer.lockstep`; with ``finish``, telling the
    source ``done`` after their data), then write them with the copies and inline files
    in one `write_batch`. One result per file written, in offer order (AGAIN for a
    ``delta`` file that did not check out), and each ``delta`` file's outcome by its
    number among the offers. ``keep_times``: as for `write_batch`."""
    chosen = [(n, offer, d) for n, (offer, d) in enumerate(zip(offers, decided, strict=True))
              if d.verdict in WRITTEN]
    if not chosen:
        return [], {}
    sends = [offer.size for _, offer, d in chosen if d.verdict == "send"]
    received = iter(await _receive_contents(conversation, sends) if sends else [])
    contents = {n: d.content if d.content is not None else next(received)
                for n, _, d in chosen if d.verdict != "delta"}
    deltas = [(n, offer, d.seeds or []) for n, offer, d in chosen if d.verdict == "delta"]
    rebuilt: dict[int, Rebuilt] = {}
    short = takes_short_prefixes(conversation.connection)
    descents = (await trio.to_thread.run_sync(Descents, replica, deltas, short) if deltas
                else None)
    try:
        if descents is not None:
            rebuilt = await lockstep.descend(conversation, descents)
            if finish:
                conversation.send(m.Done(ok=True))
    except BaseException:
        if descents is not None:
            descents.close()
        raise
    results: list[m.Failure | None] = [None] * len(chosen)
    files: list[tuple[m.FileOffer, Expect | None, bytes]] = []
    signatures: list[FileSignature | None] = []
    at: list[int] = []
    for k, (n, offer, d) in enumerate(chosen):
        content = rebuilt[n].content if d.verdict == "delta" else contents[n]
        if content is None:
            results[k] = m.Failure(AGAIN, f"{offer.path}: rebuilt, it did not check out")
            continue
        assert isinstance(offer, m.FileOffer)
        files.append((offer, d.check, content))
        signatures.append(rebuilt[n].signature if d.verdict == "delta" else None)
        at.append(k)

    def write() -> list[m.Failure | None]:
        try:
            return write_batch(replica, files, signatures, keep_times) if files else []
        finally:
            if descents is not None:
                descents.close()  # (after the installs: a replaced seed frees its blocks)

    written = await trio.to_thread.run_sync(write, limiter=writers())
    for k, result in zip(at, written, strict=True):
        results[k] = result
    return results, rebuilt


async def pull_batch(connection: Connection, replica: Replica, files: Files, stats: Stats,
                     done: Callable[[str, int, bool], None]) -> Files:
    """Pull a batch of small remote files (the client is the target); the files to fetch
    by the per-file exchange are returned."""
    conversation = connection.start(m.Gets(
        files=[m.FileRequest(path, expected(here)) for path, here in files]))
    alone: Files = []
    try:
        offers = _as_asked((await conversation.receive(m.Offers)).files, files)
        valid = [(offer, expected(here)) for offer, (_, here) in zip(offers, files, strict=True)
                 if isinstance(offer, m.FileOffer)]
        decided_valid = iter(await trio.to_thread.run_sync(
            decide_batch, replica, valid, takes_deltas(connection),
            takes_large_deltas(connection)))
        decided = [Decision(offer) if isinstance(offer, m.Failure) else next(decided_valid)
                   for offer in offers]
        conversation.send(m.Verdicts(verdicts=[d.verdict for d in decided]))
        for offer, d, (path, here) in zip(offers, decided, files, strict=True):
            if d.verdict == "descend":
                alone.append((path, here))
            elif isinstance(d.verdict, m.Failure):
                _failed(stats, path, d.verdict)
                done(path, 0, False)
            elif d.verdict == "have":
                done(path, offer.size, True)  # type: ignore[union-attr]
        results, rebuilt = await _write_decided(conversation, replica, offers, decided,
                                                finish=True)
        chosen = [(n, offer, d.verdict, here)
                  for n, (offer, d, (_, here)) in enumerate(zip(offers, decided, files,
                                                               strict=True))
                  if d.verdict in WRITTEN]
        for (n, offer, verdict, here), result in zip(chosen, results, strict=True):
            assert isinstance(offer, m.FileOffer)
            if verdict == "delta" and result is not None and result.code == AGAIN:
                alone.append((offer.path, here))
                continue
            literal = rebuilt[n].literal if n in rebuilt else 0
            _written(stats, offer, verdict, result, literal)
            done(offer.path, offer.size, result is None)
    except Refusal as exc:
        for path, _ in files:
            stats.failed.append((path, str(exc)))
            done(path, 0, False)
        return []
    finally:
        conversation.close()
    return alone


def _as_asked(offers: list[m.FileOffer | m.Failure], files: Files
              ) -> list[m.FileOffer | m.Failure]:
    """The offers answering a ``gets`` of ``files``, one per file in order, each with the
    path asked for (an offer that names none, ``asked-paths``, is given it)."""
    if len(offers) != len(files):
        raise ProtocolError(message="offers that do not match the files asked for")
    out: list[m.FileOffer | m.Failure] = []
    for offer, (path, _) in zip(offers, files, strict=True):
        if isinstance(offer, m.FileOffer) and offer.path != path:
            if offer.path:
                raise ProtocolError(message="offers that do not match the files asked for")
            offer = dataclasses.replace(offer, path=path)
        out.append(offer)
    return out


async def serve_gets(conversation: Conversation, replica: Replica, message: m.Gets,
                     changed: Callable[[str], None] | None = None) -> None:
    """The server's side of a pulled batch (it is the source); ``changed`` as for
    `offer_batch`."""
    _at_most_a_batch(message.files, "gets")
    signed = await trio.to_thread.run_sync(
        offer_batch, replica, [(request.path, None) for request in message.files], changed,
        HELD_BYTES, offer_root(conversation.connection),
        takes_large_deltas(conversation.connection))
    offers = [offer for offer, _, _ in signed]
    if ASKED_PATHS in conversation.connection.frames.features:
        offers = [dataclasses.replace(offer, path="") if isinstance(offer, m.FileOffer)
                  else offer for offer in offers]
    conversation.send(m.Offers(files=offers))
    verdicts = (await conversation.receive(m.Verdicts)).verdicts
    if len(verdicts) != len(signed):
        raise ProtocolError(message="verdicts that do not match the offers")
    contents: list[bytes | m.FileOffer] = []  # an offer: read when its turn comes
    deltas: list[tuple[int, m.FileOffer, bytes | None, Tree]] = []
    largest = batch_below(takes_large_deltas(conversation.connection))
    described = 0  # (what the deltas' sources hold together, whatever the peer asks)
    for n, ((offer, data, tree), verdict) in enumerate(zip(signed, verdicts, strict=True)):
        if verdict in ("send", "delta"):
            if not isinstance(offer, m.FileOffer) or offer.size >= largest:
                raise ProtocolError(message=f"{verdict} asked for a file this side did not "
                                    "offer")
            described += offer.size if verdict == "delta" else 0
            if described > DELTA_HELD:
                raise ProtocolError(message="deltas of more content than a batch holds")
            if verdict == "send":
                contents.append(offer if data is None else data)
            else:
                assert tree is not None
                deltas.append((n, offer, data, tree))
    if contents:
        await _send_contents(conversation, contents, replica)
    if deltas:
        sources = {}
        for n, offer, data, tree in deltas:
            if data is None:
                data = await trio.to_thread.run_sync(read_offered, replica, offer)
            sources[n] = lockstep.source_of(tree, data)
        await lockstep.serve(conversation, sources, m.Done)
