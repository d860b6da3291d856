"""The descents of a batch's edited files, in lockstep (docs/protocol.md, "Edited files in
batches").

A small file whose older version the target holds (verdict ``delta``) is described, not
sent: the per-file descent of `rdc.transfer.descent`, unchanged, with the same wants and
entry lists, so it costs the same bytes. What changes is what carries it. Alone, each
file was a conversation of its own: an offer, four or five round trips, a message each
way per round and five worker-thread hops on the target, a commit of its own. On 1,000
edited files of a 100,000-file tree the server spent 5.6 ms of CPU a file on that, a
quarter of it in thread hand-offs. Here every round's wants of all the batch's files go
in one ``wants`` message, answered by one ``lists``; their literal data in one
``fetches``, answered by ``data``; the target runs each round's steps of every file on
one worker thread, and the rebuilt files are written with the rest of the batch, in one
sync and one index transaction.

`Descents` is the target's side (its blocking methods run on worker threads), `descend`
drives it over a conversation; `serve` is the source's side.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import trio

from rdc.content.signature import FileSignature, signature_of_bytes
from rdc.content.tree import Tree
from rdc.errors import ProtocolError, Refusal
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.params import SUB_PREFIX
from rdc.records import record
from rdc.transfer.descent import (
    Plan,
    Reply,
    Request,
    SeedFile,
    SeedMap,
    SourceChanged,
    SourceFile,
    rebuild,
    target_descent,
    unrefine,
)
from rdc.transfer.source import MESSAGE_BYTES, REFINED_LIMIT
from rdc.transfer.target import WANT_ITEMS
from rdc.wire import messages as m
from rdc.wire.codec import MAX_ITEMS
from rdc.wire.connection import Conversation

# Seed files a batch's descents hold open at once: a batch of 256 files with a few seeds
# each must not hold a descriptor per seed (the per-file exchange held one per seed, but
# only for the files in flight).
OPEN_SEEDS = 64
# A seed of at most WHOLE_SEED bytes (by its indexed tree) is read whole at its first read
# and served from memory after, and a batch's readers keep at most WHOLE_SEEDS bytes of
# such seeds. A batch of 200 scattered edits has about 280 seeds, more than OPEN_SEEDS:
# each round of the descents opened every seed again, and read it in 18 small reads a file.
WHOLE_SEED = 64 << 10
WHOLE_SEEDS = 4 << 20
_KINDS = {m.WantExpand: "expand", m.WantSubs: "subs", m.WantFine: "fine"}


class SeedReaders:
    """Readers of the seed files of a batch. A small seed (WHOLE_SEED) is read whole when
    first read, and kept, WHOLE_SEEDS bytes of them at most (the least recently read goes
    first, to be read again if asked for). A larger one is opened when first read and kept
    open, at most OPEN_SEEDS at once (the least recently read closes first). A seed that
    cannot be opened reads as empty: its file's plan then fails its checks and the file
    goes by the per-file exchange. Blocking: used and closed on worker threads (the last
    close of a replaced file frees its blocks)."""

    def __init__(self, replica: Replica, limit: int = OPEN_SEEDS,
                 whole: int = WHOLE_SEEDS) -> None:
        self.replica = replica
        self.limit = limit
        self.whole = whole
        self._open: OrderedDict[str, BinaryIO | None] = OrderedDict()
        self._contents: OrderedDict[str, bytes] = OrderedDict()
        self._held = 0  # bytes in ``_contents``
        self._large: set[str] = set()  # small by their trees, found larger when read

    def reader(self, path: str, size: int | None = None) -> Callable[[int, int], bytes]:
        """A reader of the seed at ``path``; ``size``: its size as indexed, if known."""
        if size is not None and size <= WHOLE_SEED:
            def read_small(offset: int, length: int) -> bytes:
                content = self._content(path)
                if content is None:
                    return self._read(path, offset, length)
                return content[offset : offset + length]

            return read_small

        def read(offset: int, length: int) -> bytes:
            return self._read(path, offset, length)

        return read

    def _read(self, path: str, offset: int, length: int) -> bytes:
        f = self._file(path)
        return os.pread(f.fileno(), length, offset) if f is not None else b""

    def _content(self, path: str) -> bytes | None:
        """The seed's bytes, read whole now if they are not kept; None if it has grown
        past WHOLE_SEED (read it through a descriptor then)."""
        content = self._contents.get(path)
        if content is not None:
            self._contents.move_to_end(path)
            return content
        if path in self._large:
            return None
        try:
            got = self.replica.fs.read_whole(path, WHOLE_SEED)
        except (OSError, PathError):
            content = b""  # (as a seed that cannot be opened: read as empty)
        else:
            if got is None:
                self._large.add(path)
                return None
            content = got[1]
        self._contents[path] = content
        self._held += len(content)
        while self._held > self.whole and len(self._contents) > 1:
            _, old = self._contents.popitem(last=False)
            self._held -= len(old)
        return content

    def _file(self, path: str) -> BinaryIO | None:
        if path in self._open:
            self._open.move_to_end(path)
            return self._open[path]
        try:
            f: BinaryIO | None = self.replica.fs.open_read(path)
        except (OSError, PathError):
            f = None
        self._open[path] = f
        while len(self._open) > self.limit:
            _, old = self._open.popitem(last=False)
            if old is not None:
                old.close()
        return f

    def close(self) -> None:
        self._contents.clear()
        self._held = 0
        while self._open:
            _, f = self._open.popitem()
            if f is not None:
                f.close()


@dataclass
class _Descent:
    file: int  # the file's number among the batch's offers
    offer: m.FileOffer
    seeds: SeedMap
    steps: Generator[Request, Reply | None, Plan]
    plan: Plan | None = None


@record
class Rebuilt:
    """A ``delta`` file's outcome: its content (None: it did not check out, and goes by the
    per-file exchange) and signature, and the bytes that came as literal data and from
    seeds."""

    content: bytes | None
    signature: FileSignature | None = None
    literal: int = 0
    matched: int = 0


class Descents:
    """The target's descents of a batch's ``delta`` files: each file's seeds are the
    indexed trees chosen when the batch was decided, read through one `SeedReaders`;
    ``short`` as for `target_descent`."""

    def __init__(self, replica: Replica,
                 files: list[tuple[int, m.FileOffer, list[tuple[str, Tree]]]],
                 short: bool = False) -> None:
        self.readers = SeedReaders(replica)
        self.descents: list[_Descent] = []
        for file, offer, trees in files:
            seeds = SeedMap([SeedFile(tree, self.readers.reader(path, tree.size))
                             for path, tree in trees])
            self.descents.append(_Descent(
                file, offer, seeds, target_descent(offer.as_offer(), seeds, False, short)))

    def advance(self, replies: dict[int, Reply] | None) -> list[m.FileWant]:
        """Give each file still descending the entry lists that answer its last want (none
        at the start), and return the next round's wants: empty when every plan is made
        (blocking: a step reads the seed regions it searches)."""
        wants = []
        for descent in self.descents:
            if descent.plan is not None:
                continue
            reply = None if replies is None else replies.get(descent.file)
            if replies is not None and reply is None:
                continue  # (cannot be: every running descent asked)
            try:
                request = descent.steps.send(reply)
            except StopIteration as done:
                descent.plan = done.value
                continue
            except ValueError as exc:
                raise ProtocolError(
                    message=f"{descent.offer.path}: the source's tree does not add up: {exc}"
                ) from None
            wants.append(m.FileWant(descent.file, _KINDS[type(request)], _asked(request),
                                    getattr(request, "prefix", SUB_PREFIX)))
        return wants

    def fetches(self) -> list[m.FileFetch]:
        """The literal data the plans need, one entry per file that needs any."""
        out = []
        for descent in self.descents:
            plan = descent.plan
            assert plan is not None and not plan.have
            if plan.fetch and not plan.whole:  # (whole: better sent; see `rebuild`)
                out.append(m.FileFetch(descent.file, [item.wire() for item in plan.fetch]))
        return out

    def rebuild(self, literal: dict[int, list[bytes]]) -> dict[int, Rebuilt]:
        """Each file rebuilt from its seeds and the ``literal`` pieces that answered its
        fetch items (blocking). A file that does not check out (a sub-chunk prefix or a
        block hash matched other bytes, or a seed changed) is Rebuilt(None)."""
        out = {}
        for descent in self.descents:
            plan = descent.plan
            assert plan is not None
            pieces = literal.get(descent.file, [])
            if plan.whole:  # (a file the source describes as too small to describe)
                out[descent.file] = Rebuilt(None)
                continue
            try:
                data, copied = [], 0
                for item, piece in zip(plan.fetch, pieces, strict=True):
                    plain, from_old = unrefine(item, piece, descent.seeds)
                    data.append(plain)
                    copied += from_old
                content = rebuild(plan, descent.seeds, data, check_root=False)
            except (ValueError, OSError):
                out[descent.file] = Rebuilt(None)
                continue
            signature = signature_of_bytes(content)  # (what the index records, too)
            if not m.same_root(signature.root, plan.root):
                out[descent.file] = Rebuilt(None)
                continue
            out[descent.file] = Rebuilt(content, signature, plan.literal_bytes() - copied,
                                        plan.matched_bytes() + copied)
        return out

    def close(self) -> None:
        """Close the seeds (blocking)."""
        self.descents.clear()
        self.readers.close()


def _asked(request: Request) -> list:
    if isinstance(request, m.WantExpand):
        return request.nodes
    if isinstance(request, m.WantSubs):
        return request.leaves
    return request.mids


def _cut(wants: list[m.FileWant]) -> Iterator[list[m.FileWant]]:
    """``wants`` in messages of at most WANT_ITEMS nodes, leaves or mids, a file's want
    cut where it is longer (the answer stays well inside one frame)."""
    part: list[m.FileWant] = []
    count = 0
    for want in wants:
        asked = want.asked
        while asked:
            room = WANT_ITEMS - count
            part.append(m.FileWant(want.file, want.kind, asked[:room], want.prefix))
            count += len(asked[:room])
            asked = asked[room:]
            if count == WANT_ITEMS:
                yield part
                part, count = [], 0
    if part:
        yield part


async def descend(conversation: Conversation, descents: Descents) -> dict[int, Rebuilt]:
    """The target's side: every round's wants over ``conversation``, then the literal data,
    then each file rebuilt."""
    wants = await trio.to_thread.run_sync(descents.advance, None)
    while wants:
        parts = list(_cut(wants))
        for part in parts:  # all sent at once: the source answers them in order
            conversation.send(m.Wants(wants=part))
        replies: dict[int, Reply] = {}
        for part in parts:
            lists = (await conversation.receive(m.Lists)).lists
            if len(lists) != sum(len(want.asked) for want in part):
                raise ProtocolError(message="entry lists that do not match the wants")
            at = 0
            for want in part:
                replies.setdefault(want.file, []).extend(lists[at : at + len(want.asked)])
                at += len(want.asked)
        wants = await trio.to_thread.run_sync(descents.advance, replies)
    fetches = descents.fetches()
    literal: dict[int, list[bytes]] = {}
    if fetches:
        conversation.send(m.Fetches(files=fetches))
        asked = sum(len(f.items) for f in fetches)
        pieces: list[bytes] = []
        while True:
            message = await conversation.receive(m.Data)
            pieces.extend(message.d)
            if len(pieces) > asked:
                raise ProtocolError(message="more data than was fetched")
            if message.end:
                break
        if len(pieces) != asked:
            raise ProtocolError(message="data that does not match the fetched items")
        at = 0
        for f in fetches:
            literal[f.file] = pieces[at : at + len(f.items)]
            at += len(f.items)
    return await trio.to_thread.run_sync(descents.rebuild, literal)


# ---------------------------------------------------------------- the source's side


def _lists(sources: dict[int, SourceFile], wants: list[m.FileWant]) -> list[m.EntryList]:
    out = []
    for want in wants:
        source = sources.get(want.file)
        if source is None:
            raise ProtocolError(message=f"a want of file {want.file}, not a delta of the batch")
        out.extend(source.lists(want.want()))
    return out


def _items(sources: dict[int, SourceFile], files: list[m.FileFetch], limit: int
           ) -> list[tuple[int, bytes]]:
    """The answers to a ``fetches``, all made at once: so at most ``limit`` bytes (what the
    batch's files hold in all), else a protocol error, not a peer's 13 GB of answers."""
    refined = sum(item[2] for f in files for item in f.items if len(item) == 5)
    if refined > REFINED_LIMIT:  # each byte costs a hash and a lookup, not a copy
        raise ProtocolError(message=f"a fetch of {refined:,} bytes to refine (at most "
                            f"{REFINED_LIMIT:,})")
    asked = sum(item[2] for f in files for item in f.items)
    if asked > limit:
        raise ProtocolError(message=f"a fetch of {asked:,} bytes from files of {limit:,}")
    out = []
    for f in files:
        source = sources.get(f.file)
        if source is None:
            raise ProtocolError(message=f"a fetch of file {f.file}, not a delta of the batch")
        out.extend((f.file, source.item(item)) for item in f.items)
    return out


async def serve(conversation: Conversation, sources: dict[int, SourceFile],
                until: type[m.Message]) -> tuple[m.Message, dict[int, int]]:
    """The source's side: answer the batch's ``wants`` and ``fetches`` from ``sources`` (by
    file number) until the target sends ``until``, which is returned with the bytes of
    data sent per file. A want that does not fit its file is a protocol error."""
    sent: dict[int, int] = {}
    held = sum(source.tree.size for source in sources.values())
    while True:
        message = await conversation.receive(m.Wants, m.Fetches, until)
        try:
            if isinstance(message, m.Wants):
                lists = await trio.to_thread.run_sync(_lists, sources, message.wants)
                conversation.send(m.Lists(lists=lists))
            elif isinstance(message, m.Fetches):
                answered = await trio.to_thread.run_sync(_items, sources, message.files, held)
                await _send_pieces(conversation, answered, sent)
            else:
                return message, sent
        except SourceChanged as exc:  # (cannot be: the sources are bytes checked when
            # offered; if it were, the batch fails, not the connection)
            raise Refusal("vanished", message=f"a file changed while it was sent: {exc}"
                          ) from None
        except ValueError as exc:
            raise ProtocolError(message=f"a want that does not fit its file: {exc}") from None


async def _send_pieces(conversation: Conversation, answered: list[tuple[int, bytes]],
                       sent: dict[int, int]) -> None:
    pieces: list[bytes] = []
    size = 0
    for n, (file, data) in enumerate(answered):
        sent[file] = sent.get(file, 0) + len(data)
        pieces.append(data)
        size += len(data)
        last = n == len(answered) - 1
        if size >= MESSAGE_BYTES or len(pieces) == MAX_ITEMS or last:
            await conversation.send_data(m.Data(d=pieces, end=last))
            pieces, size = [], 0
    if not answered:
        conversation.send(m.Data(d=[], end=True))


def source_of(tree: Tree, content: bytes) -> SourceFile:
    """A source that answers from a small file's content, held since it was offered."""
    view = memoryview(content)

    def read(offset: int, length: int) -> bytes:
        return bytes(view[offset : offset + length])

    return SourceFile(tree, read)
