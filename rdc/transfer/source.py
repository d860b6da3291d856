"""The source's side of one file (docs/protocol.md, "Files"): the offer, then answers to the
target's wants until the target says ``done``."""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from rdc.content.check import LeafCheck, Mismatch, matches
from rdc.content.signature import FileSignature
from rdc.errors import ProtocolError, Refusal
from rdc.local.filestat import mtime_ns
from rdc.transfer.descent import (
    FETCH_LIMIT,
    SUBS_FROM,
    WHOLE_BELOW,
    SourceChanged,
    SourceFile,
)
from rdc.wire import messages as m
from rdc.wire.codec import MAX_PIECE
from rdc.wire.connection import Conversation

# What the source may send for ``want whole`` before the target grants more (``more``).
WHOLE_CREDIT = 4 << 20
# Data messages are cut at about this size, so that other conversations interleave.
MESSAGE_BYTES = 1 << 20
# Bytes of refined items one fetch may ask for (what a target asks for at once: the
# search costs the source about 0.4 us a byte where nothing matches).
REFINED_LIMIT = FETCH_LIMIT


def make_offer(
    signature: FileSignature,
    st: os.stat_result,
    read: Callable[[int, int], bytes],
    *,
    older_version_likely: bool = False,
) -> m.Offer:
    """The offer of a file: its root, size and sketch; the content itself for a tiny file;
    the sub-chunk list of a one-chunk file the target probably holds an older version of
    (it saves the descent two round trips)."""
    tree = signature.tree
    data = subs = None
    if tree.size < WHOLE_BELOW:
        data = read(0, tree.size)
        if len(data) != tree.size:
            raise Refusal("vanished", message="the file changed while it was being read")
        if not matches(tree, data):
            raise SourceChanged("its content differs from its signature")
    elif older_version_likely and len(tree.leaves) == 1 and tree.size >= SUBS_FROM:
        subs = SourceFile(tree, read).subs(0)
    return m.Offer(size=tree.size, root=tree.root, depth=len(tree.levels),
                   sketch=signature.sketch, mode=st.st_mode & 0o7777, mtime_ns=mtime_ns(st),
                   data=data, subs=subs)


async def serve_wants(conversation: Conversation, source: SourceFile) -> m.Done:
    """Answer wants until ``done``, which is returned. A want that does not fit the file is
    a protocol error; a file that changed under us ends the conversation (``vanished``)."""
    while True:
        message = await conversation.receive(m.Want, m.Done, m.More)
        if isinstance(message, m.Done):
            return message
        if isinstance(message, m.More):  # credit that arrived after the whole file was sent
            continue
        try:
            if isinstance(message, m.WantFetch):
                await _send_items(conversation, source, message.items)
            elif isinstance(message, m.WantWhole):
                done = await _send_whole(conversation, source)
                if done is not None:
                    return done
            else:
                conversation.send(m.Lists(lists=source.lists(message)))  # type: ignore[arg-type]
        except SourceChanged as exc:
            changed = f"the file changed while it was sent: {exc}"
            raise Refusal("vanished", message=changed) from None
        except ValueError as exc:
            raise ProtocolError(message=f"a want that does not fit the file: {exc}") from None


async def _send_items(conversation: Conversation, source: SourceFile, items: list[tuple]) -> None:
    refined = sum(item[2] for item in items if len(item) == 5)
    if refined > REFINED_LIMIT:  # each byte costs a hash and a lookup, not a copy
        raise ProtocolError(message=f"a fetch of {refined:,} bytes to refine (at most "
                            f"{REFINED_LIMIT:,})")
    pieces: list[bytes] = []
    size = 0
    for n, item in enumerate(items):
        data = source.item(item)
        pieces.append(data)
        size += len(data)
        if size >= MESSAGE_BYTES or n == len(items) - 1:
            await conversation.send_data(m.Data(d=pieces, end=n == len(items) - 1))
            pieces, size = [], 0
    if not items:
        conversation.send(m.Data(d=[], end=True))


async def _send_whole(conversation: Conversation, source: SourceFile) -> m.Done | None:
    """Stream the whole file within the target's credit. Returns ``done`` if the target
    gave up meanwhile."""
    size = source.tree.size
    credit = WHOLE_CREDIT
    offset = 0
    check = LeafCheck(source.tree)  # what goes out is what was offered
    while True:
        while credit <= 0:
            message = await conversation.receive(m.More, m.Done)
            if isinstance(message, m.Done):
                return message
            credit += message.n
        n = min(MAX_PIECE, size - offset)
        data = await trio.to_thread.run_sync(source.read, offset, n) if n else b""
        if len(data) != n:
            raise SourceChanged("the file is shorter than its signature")
        try:
            check.feed(data)
            if offset + n == size:
                check.finish()
        except Mismatch as exc:
            raise SourceChanged(str(exc)) from None
        offset += n
        credit -= n
        await conversation.send_data(m.Data(d=[data] if n else [], end=offset == size))
        if offset == size:
            return None
