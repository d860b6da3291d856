"""The target's side of one file (docs/protocol.md, "Files"): decide what is needed, descend
the source's tree, fetch what is missing, rebuild the file beside the old one, check its
root, and commit it atomically.

Whatever fails (the source, the peer, the disk), the old file stays as it was: the new one
only ever exists as a temporary until its root checked out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from rdc.content.signature import FileSignature, chunk_hash
from rdc.content.stream import SigningThread, StreamSigner
from rdc.errors import ProtocolError, Refusal, RemoteError, disk_full
from rdc.local.fs import PARTIAL_BYTES, ConflictError, Expect
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.records import record
from rdc.transfer.descent import (
    Plan,
    SeedChanged,
    SeedFile,
    SeedMap,
    target_descent,
    unrefine,
)
from rdc.transfer.ops import expectation, holds
from rdc.transfer.resume import Partials, keep_or_drop, open_partials
from rdc.transfer.seeds import choose_seeds
from rdc.transfer.source import WHOLE_CREDIT
from rdc.wire import messages as m
from rdc.wire.connection import Connection, Conversation

# Seed bytes copied a piece at a time: under the allocator's mapping threshold
# (`rdc.allocator.MMAP_THRESHOLD`), so that each piece read comes from the heap and the
# one freed before it, not from fresh pages mapped and faulted in (1 MiB pieces: a 256 MiB
# file rebuilt from its old version took 0.41-0.46 s of the server's system time, 0.23-0.27
# s in these).
COPY_PIECE = (256 << 10) - 4096
COPY_RUNS = 4 << 20  # seed ranges gathered for one copy on a worker thread
THREAD_FROM = 256 * 1024  # copies at least this large run on a worker thread
SIGN_APART = 8 << 20  # a file signs on a thread of its own once this much is written
# Nodes or leaves named in one want: a list in a message holds at most MAX_ITEMS, and the
# answer (a sub-chunk list is up to ~1.3 KB per leaf) must stay well inside one frame.
WANT_ITEMS = 1024


@record
class Outcome:
    """How a file arrived: ``have`` (nothing to do), ``copy`` (from another local file),
    ``whole`` or ``delta``; with the literal and matched bytes."""

    how: str
    literal: int = 0
    matched: int = 0


class _Assembly:
    """A temporary file being written in order, signed as it grows: past SIGN_APART bytes
    on a thread of its own, beside the reads and writes."""

    def __init__(self, replica: Replica, path: str) -> None:
        self.temp = replica.fs.create_temp(path)
        self.signer: StreamSigner | SigningThread = StreamSigner()
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.temp.write(data)
        if self.written >= SIGN_APART and isinstance(self.signer, StreamSigner):
            self.signer = SigningThread(self.signer)
        self.signer.feed(data)
        self.written += len(data)

    def expect_ends(self, ends: list[int] | None) -> None:
        """Sign at the leaf ends the descent found (`rdc.content.chunking.KnownCuts`):
        before anything is written. If they are wrong, so is the root, and the file is
        not taken."""
        if ends is not None and self.written == 0:
            self.signer = StreamSigner(ends=ends)

    def copy(self, runs: list[tuple[Callable[[int, int], bytes], int, int]]) -> None:
        for read, offset, length in runs:
            while length:
                n = min(length, COPY_PIECE)
                data = read(offset, n)
                if len(data) != n:
                    raise SeedChanged("a seed file is shorter than its signature")
                self.write(data)
                offset += n
                length -= n

    def abort(self) -> None:
        if isinstance(self.signer, SigningThread):
            self.signer.close()
        self.temp.abort()


async def _run(fn: Callable[..., Any], *args: Any, size: int = THREAD_FROM) -> Any:
    """Blocking file work: inline when small, on a worker thread when large."""
    if size >= THREAD_FROM:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


async def receive_file(
    conversation: Conversation,
    replica: Replica,
    path: str,
    offer: m.Offer,
    expect: m.Expected | None = None,
) -> Outcome:
    """Bring the file at ``path`` to the offered content, talking to the source over
    ``conversation``, and end the conversation with ``done``. ``expect``: what must still
    be at ``path`` when the new file is put there (None: anything). Raises Refusal (after
    sending ``done`` with the error) if the file could not be brought in."""
    try:
        outcome = await _receive(conversation, replica, path, offer, expect)
    except (Refusal, ConflictError, PathError, OSError) as exc:
        if disk_full(exc):  # no one file's failure: the run ends
            raise
        code = getattr(exc, "code", "conflict" if isinstance(exc, ConflictError) else "io")
        if isinstance(exc, PathError):  # through a symlink, or a directory on the way
            code = "path"
        message = str(exc) if not isinstance(exc, OSError) else f"{path}: {exc.strerror or exc}"
        if not isinstance(exc, RemoteError):  # the source ended it already
            conversation.send(m.Done(ok=False, code=code, msg=message))
        raise Refusal(code, message=message) from None
    conversation.send_last(
        m.Done(ok=True, how=outcome.how, literal=outcome.literal, matched=outcome.matched)
    )
    return outcome


async def _receive(
    conversation: Conversation, replica: Replica, path: str, offer: m.Offer,
    expect: m.Expected | None,
) -> Outcome:
    decided, check, seed_files, first = await trio.to_thread.run_sync(
        _decide, replica, path, offer, expect
    )
    try:
        return await _bring_in(conversation, replica, path, offer, decided, check,
                               seed_files, first)
    finally:
        if first is not None:
            first.abort()


async def _bring_in(
    conversation: Conversation, replica: Replica, path: str, offer: m.Offer,
    decided: Outcome | None, check: Expect | None, seed_files: list[SeedFile],
    first: _Assembly | None,
) -> Outcome:
    # What an interrupted transfer of this path left (rdc.transfer.resume): seeds too.
    # Only a file of PARTIAL_BYTES or more can have one; the rest skip the worker threads
    # (three hops a file, and the hand-offs between threads were a quarter of a server's
    # CPU on a 100,000-file tree).
    partials = (await trio.to_thread.run_sync(open_partials, replica, path, offer.size)
                if offer.size >= PARTIAL_BYTES else Partials(replica, path))
    if decided is not None:
        if partials.files:
            await trio.to_thread.run_sync(partials.drop)
        return decided
    try:
        if partials.files:
            seed_files += await trio.to_thread.run_sync(partials.seeds)
        assert first is not None
        outcome = await _rebuild(conversation, replica, path, offer, check, seed_files,
                                 partials, first)
    except BaseException:
        partials.close()
        raise
    if partials.files:
        await trio.to_thread.run_sync(partials.drop)
    return outcome


async def _rebuild(
    conversation: Conversation, replica: Replica, path: str, offer: m.Offer,
    check: Expect | None, seed_files: list[SeedFile], partials: Partials, first: _Assembly,
) -> Outcome:
    """Descend with the seeds, assemble and commit; or the whole content. A temporary
    cut off by an interruption stays as the path's partial (`keep_or_drop`). ``first``:
    the temporary made with the decision (on its worker thread), for the first attempt."""
    seeds = SeedMap(seed_files)
    try:
        plan = await _descend(conversation, offer, seeds)
        if not plan.whole:
            assembly, first = first, None
            assembly.expect_ends(plan.ends)
            try:
                extra, copied = await _assemble(conversation, assembly, plan, seeds)
                if await _commit(replica, assembly, path, offer, check, final=False,
                                 release=seed_files):
                    return Outcome("delta", plan.literal_bytes() + extra - copied,
                                   plan.matched_bytes() + copied)
            except SeedChanged:
                pass
            except BaseException as exc:
                keep_or_drop(assembly.temp, assembly.written, partials, exc)
                raise
            finally:
                assembly.abort()
    finally:
        # The seeds' descriptors close now (after a commit they closed on its worker
        # thread): an error's traceback keeps this frame, in a cycle that only a full
        # collection frees (an idle server held them for good).
        seed_files.clear()
    # No seeds, or the rebuilt file did not check out: the whole content, once.
    assembly = first or _Assembly(replica, path)
    try:
        await _receive_whole(conversation, assembly, offer.size)
        await _commit(replica, assembly, path, offer, check)
    except BaseException as exc:
        keep_or_drop(assembly.temp, assembly.written, partials, exc)
        raise
    finally:
        assembly.abort()
    return Outcome("whole", literal=offer.size)


def settle(
    replica: Replica, path: str, offer: m.Offer | m.FileOffer, expect: m.Expected | None
) -> tuple[Outcome | None, Expect | None]:
    """What can be settled without the source (blocking): the file already here (its mode
    and time set), a copy of another local file with its content, a tiny file whose
    content came in the offer. Also the check of what must still be at ``path`` when the
    new file is put there. ConflictError if ``expect`` does not hold now."""
    try:
        check = expectation(replica, path, expect)
    except ConflictError:
        if not holds(replica, path, offer.root):
            raise
        check = None  # what was expected is gone, but what is there is what we want
    if m.same_root(replica.current_root(path, read=True), offer.root):
        replica.set_meta(path, offer.mode, offer.mtime_ns)
        return Outcome("have"), check
    for holder in replica.holders(offer.root):
        if holder != path and _copy_local(replica, holder, path, offer, check) is not None:
            return Outcome("copy", matched=offer.size), check
    if offer.data is not None:
        assembly = _Assembly(replica, path)
        try:
            assembly.write(offer.data)
            _finish_file(replica, assembly, path, offer, check, final=True)
        finally:
            assembly.abort()
        return Outcome("whole", literal=offer.size), check
    return None, check


def _decide(
    replica: Replica, path: str, offer: m.Offer, expect: m.Expected | None
) -> tuple[Outcome | None, Expect | None, list[SeedFile], _Assembly | None]:
    """`settle`, or the seeds to descend with and the temporary to write (on one worker
    thread: making the temporary is file system work too)."""
    outcome, check = settle(replica, path, offer, expect)
    if outcome is not None:
        return outcome, check, [], None
    seeds = choose_seeds(replica, path, offer.sketch)
    return None, check, seeds, _Assembly(replica, path)


def _copy_local(
    replica: Replica, holder: str, path: str, offer: m.Offer | m.FileOffer, check: Expect | None
) -> FileSignature | None:
    """Copy another local file with the offered root; None if it no longer has it."""
    try:
        source = replica.fs.open_read(holder)
    except OSError:
        return None
    assembly = _Assembly(replica, path)
    try:
        with source:
            while data := source.read(COPY_PIECE):
                assembly.write(data)
        signature = assembly.signer.finish()
        if not m.same_root(signature.root, offer.root):
            return None
        replica.commit_received(assembly.temp, path, offer.mode, offer.mtime_ns, check,
                                signature)
        return signature
    finally:
        assembly.abort()


# The feature both sides must have for wants that name their lists' prefix length.
SHORT = "short-prefixes"


def takes_short_prefixes(connection: Connection) -> bool:
    """Whether the peer, as a source, answers a want in the prefix length it names
    (`rdc.content.subchunks.prefix_for`); an older one sends SUB_PREFIX bytes."""
    return SHORT in connection.frames.features


async def _descend(conversation: Conversation, offer: m.Offer, seeds: SeedMap) -> Plan:
    steps = target_descent(offer, seeds, False, takes_short_prefixes(conversation.connection))
    reply: list[m.EntryList] | None = None
    while True:
        try:
            request = steps.send(reply)
        except StopIteration as done:
            return done.value
        except ValueError as exc:
            raise ProtocolError(message=f"the source's tree does not add up: {exc}") from None
        reply = []
        for part in _parts(request):  # one want outstanding at a time
            conversation.send(part)
            reply.extend((await conversation.receive(m.Lists)).lists)


def _parts(request: m.WantExpand | m.WantSubs | m.WantFine) -> list[m.Want]:
    """``request`` cut into wants of at most WANT_ITEMS nodes, leaves or mids."""
    if isinstance(request, m.WantExpand):
        return [m.WantExpand(nodes=request.nodes[i : i + WANT_ITEMS])
                for i in range(0, len(request.nodes), WANT_ITEMS)]
    if isinstance(request, m.WantSubs):
        return [m.WantSubs(leaves=request.leaves[i : i + WANT_ITEMS], prefix=request.prefix)
                for i in range(0, len(request.leaves), WANT_ITEMS)]
    return [m.WantFine(mids=request.mids[i : i + WANT_ITEMS], prefix=request.prefix)
            for i in range(0, len(request.mids), WANT_ITEMS)]


class _Literal:
    """The fetched items of a plan, in order: one ``fetch`` want per batch, sent when the
    batch is first needed. A refined item arrives as ops over its old bytes
    (`rdc.content.refine`) and is rebuilt here."""

    def __init__(self, conversation: Conversation, plan: Plan, seeds: SeedMap) -> None:
        self.conversation = conversation
        self.plan = plan
        self.seeds = seeds
        self.batches = deque(plan.fetch_batches())
        self.ready: deque[bytes] = deque()
        self.next_item = 0
        self.refetched = 0  # bytes of leaves or items fetched again
        self.copied: dict[int, int] = {}  # refined items: bytes that came from old blocks

    async def take(self, item: int) -> bytes:
        if item != self.next_item:
            raise AssertionError("literal items are taken in order")
        if not self.ready:
            await self._fetch_batch()
        try:
            data, copied = unrefine(self.plan.fetch[item], self.ready.popleft(), self.seeds)
        except ValueError as exc:
            raise ProtocolError(message=f"fetched item {item}: {exc}") from None
        expected = self.plan.fetch[item].length
        if len(data) != expected:
            raise ProtocolError(message=f"fetched {len(data)} bytes where {expected} were asked")
        if copied:
            self.copied[item] = copied
        self.next_item += 1
        return data

    async def plain(self, items: list[int]) -> dict[int, bytes]:
        """Refined items fetched again as plain bytes (a block hash matched other bytes:
        their leaf failed its check); between batches, as `leaf`."""
        wanted = [self.plan.fetch[i] for i in items]
        self.conversation.send(m.WantFetch(items=[(f.leaf, f.start, f.length) for f in wanted]))
        pieces: list[bytes] = []
        while True:
            message = await self.conversation.receive(m.Data)
            pieces.extend(message.d)
            if len(pieces) > len(items):
                raise ProtocolError(message="more data than was fetched")
            if message.end:
                break
        if [len(p) for p in pieces] != [f.length for f in wanted]:
            raise ProtocolError(message="refetched items came back with other lengths")
        for i in items:
            self.refetched += self.plan.fetch[i].length
            self.copied.pop(i, None)
        return dict(zip(items, pieces, strict=True))

    async def leaf(self, leaf: int, length: int) -> bytes:
        """One leaf's bytes, whole (between batches, so no other want is outstanding)."""
        self.conversation.send(m.WantFetch(items=[(leaf, 0, length)]))
        pieces: list[bytes] = []
        while True:
            message = await self.conversation.receive(m.Data)
            pieces.extend(message.d)
            if message.end:
                break
        if len(pieces) != 1 or len(pieces[0]) != length:
            raise ProtocolError(message=f"leaf {leaf} came back as other than {length} bytes")
        self.refetched += length
        return pieces[0]

    async def _fetch_batch(self) -> None:
        batch = self.batches.popleft()
        self.conversation.send(m.WantFetch(items=[self.plan.fetch[i].wire() for i in batch]))
        while True:
            message = await self.conversation.receive(m.Data)
            self.ready.extend(message.d)
            if len(self.ready) > len(batch):
                raise ProtocolError(message="more data than was fetched")
            if message.end:
                break
        if len(self.ready) != len(batch):
            raise ProtocolError(message="less data than was fetched")


async def _assemble(
    conversation: Conversation, assembly: _Assembly, plan: Plan, seeds: SeedMap
) -> int:
    """Write the plan's pieces in order: seed ranges copied (gathered into large runs for a
    worker thread), literal data as it arrives. A leaf rebuilt from sub-chunks is held until
    its hash checks out against its prefix; if it does not (a sub-chunk prefix or a block
    hash matched the wrong bytes), its refined items are fetched again plain, and if that
    does not do, the leaf alone is fetched whole. Returns the bytes fetched again and those
    that refined items took from old blocks."""
    literal = _Literal(conversation, plan, seeds)
    checks = {offset: (leaf, length, key) for leaf, offset, length, key in plan.checks}
    runs: list[tuple[Callable[[int, int], bytes], int, int]] = []
    pending = 0
    held: bytearray | None = None
    held_parts: list[tuple[int, bytes]] = []  # (item or -1, bytes) of the held leaf
    held_leaf = held_end = 0
    held_key = b""

    async def flush() -> None:
        nonlocal runs, pending
        if runs:
            await _run(assembly.copy, runs, size=pending)
            runs, pending = [], 0

    for piece in plan.pieces:
        if held is None and piece.offset in checks:
            await flush()
            held_leaf, length, held_key = checks[piece.offset]
            held, held_end, held_parts = bytearray(), piece.offset + length, []
        if held is not None:
            if piece.seed >= 0:
                data = seeds.seeds[piece.seed].read(piece.seed_offset, piece.length)
                if len(data) != piece.length:
                    raise SeedChanged("a seed file is shorter than its signature")
            else:
                data = await literal.take(piece.item)
            held += data
            held_parts.append((piece.item, data))
            if piece.offset + piece.length == held_end:
                if not chunk_hash(held).startswith(held_key):
                    held = await _recheck(literal, held_leaf, held_key, held_parts, plan)
                assembly.write(held)
                held = None
            continue
        if piece.seed >= 0:
            runs.append((seeds.seeds[piece.seed].read, piece.seed_offset, piece.length))
            pending += piece.length
            if pending >= COPY_RUNS:
                await flush()
            continue
        await flush()
        assembly.write(await literal.take(piece.item))
    await flush()
    return literal.refetched, sum(literal.copied.values())


async def _recheck(literal: _Literal, leaf: int, key: bytes, parts: list[tuple[int, bytes]],
                   plan: Plan) -> bytearray:
    """A leaf that failed its check: rebuilt with its refined items fetched plain, or else
    fetched whole."""
    refined = [item for item, _ in parts if item >= 0 and plan.fetch[item].old is not None]
    if refined:
        plain = await literal.plain(refined)
        rebuilt = bytearray(b"".join(plain.get(item, data) if item >= 0 else data
                                     for item, data in parts))
        if chunk_hash(rebuilt).startswith(key):
            return rebuilt
    size = sum(len(data) for _, data in parts)
    return bytearray(await literal.leaf(leaf, size))


async def _receive_whole(conversation: Conversation, assembly: _Assembly, size: int) -> None:
    """The whole content, granting the source more credit as it is written."""
    conversation.send(m.WantWhole())
    received = 0
    unacknowledged = 0
    while True:
        message = await conversation.receive(m.Data)
        for piece in message.d:
            received += len(piece)
            if received > size:
                raise ProtocolError(message="more data than the offered size")
            await _run(assembly.write, piece, size=len(piece))
            unacknowledged += len(piece)
        if message.end:
            break
        if unacknowledged >= WHOLE_CREDIT // 4:
            conversation.send(m.More(n=unacknowledged))
            unacknowledged = 0
    if received != size:
        raise ProtocolError(message=f"received {received} bytes of a {size}-byte file")


async def _commit(
    replica: Replica,
    assembly: _Assembly,
    path: str,
    offer: m.Offer,
    check: Expect | None,
    final: bool = True,
    release: list[SeedFile] | None = None,
) -> bool:
    """Check the root and, if it matches, commit and index the file. A mismatch is an error
    if ``final``, else False (the caller asks for the whole file). After a commit the
    ``release`` list (the seeds) is emptied on the worker thread: closing the last
    descriptor of the old version, replaced by then, frees its blocks, file system work
    that must not hold up the event loop (it did, half a millisecond a file)."""

    def finish() -> bool:
        done = _finish_file(replica, assembly, path, offer, check, final)
        if done and release is not None:
            release.clear()
        return done

    return await trio.to_thread.run_sync(finish)


def _finish_file(
    replica: Replica,
    assembly: _Assembly,
    path: str,
    offer: m.Offer | m.FileOffer,
    check: Expect | None,
    final: bool,
) -> bool:
    signature = assembly.signer.finish()
    if not m.same_root(signature.root, offer.root):
        if final:
            raise Refusal("verify", message=f"{path}: the received file does not have the "
                          "offered root (it changed at the source while being sent?)")
        return False
    try:
        replica.commit_received(assembly.temp, path, offer.mode, offer.mtime_ns, check,
                                signature)
    except ConflictError:
        if not holds(replica, path, offer.root):
            raise
        replica.set_meta(path, offer.mode, offer.mtime_ns)  # another writer got there first
    return True
