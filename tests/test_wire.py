"""Frames and message schemas over in-memory streams: what a peer can and cannot make a
connection do."""

from __future__ import annotations

import struct

import msgpack
import pytest
import trio
import trio.testing
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from rdc.errors import ProtocolError
from rdc.session import Connection
from rdc.wire import messages
from rdc.wire.codec import MAX_FRAME, pack
from rdc.wire.frames import ConnectionClosed, FrameStream

pytestmark = pytest.mark.filterwarnings("ignore::trio.TrioDeprecationWarning")


async def test_batches_round_trip_compressed_against_history() -> None:
    a, b = trio.testing.memory_stream_pair()
    sender, receiver = FrameStream(a), FrameStream(b)
    sender.compress = receiver.compress = True
    batches = [[{"t": "data", "id": i, "d": [b"x" * 5000 + bytes([i])], "end": False}]
               for i in range(20)]
    async with trio.open_nursery() as nursery:
        async def send() -> None:
            for batch in batches:
                await sender.send(batch)
        nursery.start_soon(send)
        for batch in batches:
            assert await receiver.receive() == batch
    # Repeated content costs almost nothing once it is in the history.
    assert sender.plain_sent > 100_000


async def test_a_frame_over_the_limit_is_refused_before_its_body() -> None:
    a, b = trio.testing.memory_stream_pair()
    await a.send_all(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(ProtocolError, match="frame length"):
        await FrameStream(b).receive()


async def test_a_zip_bomb_is_refused() -> None:
    a, b = trio.testing.memory_stream_pair()
    receiver = FrameStream(b)
    receiver.compress = True
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))
    await a.send_all(struct.pack(">I", (1 << 31) | len(bomb)) + bomb)
    with pytest.raises(ProtocolError, match="content size"):
        await receiver.receive()


async def test_a_compressed_frame_before_compression_was_agreed_is_refused() -> None:
    a, b = trio.testing.memory_stream_pair()
    body = zstandard.ZstdCompressor().compress(pack([{"t": "ping"}]) * 100)
    await a.send_all(struct.pack(">I", (1 << 31) | len(body)) + body)
    with pytest.raises(ProtocolError):
        await FrameStream(b).receive()


async def test_a_clean_end_between_frames_and_a_cut_inside_one() -> None:
    a, b = trio.testing.memory_stream_pair()
    await a.aclose()
    with pytest.raises(ConnectionClosed):
        await FrameStream(b).receive()
    a, b = trio.testing.memory_stream_pair()
    await a.send_all(struct.pack(">I", 100) + b"\x91")
    await a.aclose()
    with pytest.raises(ConnectionClosed):
        await FrameStream(b).receive()


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.binary(max_size=20) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=20,
), st.sampled_from(sorted(messages.SCHEMAS)))
def test_any_garbage_message_is_accepted_or_a_protocol_error(value, kind) -> None:
    fields = value if isinstance(value, dict) else {"x": value}
    try:
        checked = messages.check({**fields, "t": kind})
    except ProtocolError:
        return
    assert checked["t"] == kind


def test_paths_are_checked_and_decoded() -> None:
    ok = messages.check({"t": "get", "id": 1, "path": b"a/b\xff"})
    assert ok["path"] == "a/b\udcff"
    for bad in (b"../x", b"/etc/passwd", b"a//b", b"a\0b", "text, not bytes"):
        with pytest.raises(ProtocolError):
            messages.check({"t": "get", "id": 1, "path": bad})


async def test_a_silent_peer_ends_the_connection_but_pings_keep_it(autojump_clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    async def never_answer(conversation, message) -> None:
        await trio.sleep_forever()

    quiet = Connection(FrameStream(a), idle_timeout=60)
    talker = Connection(FrameStream(b), idle_timeout=60, handler=never_answer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(quiet.run)
        nursery.start_soon(talker.run)
        conversation = quiet.start("finish")  # the peer never answers
        await trio.sleep(300)  # but its writer pings every 15 s: no timeout
        assert quiet.failure is None
        nursery.cancel_scope.cancel()
    assert conversation.id == 1


async def test_a_peer_that_says_nothing_at_all_times_out(autojump_clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    waiting = Connection(FrameStream(a), idle_timeout=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting.run)
        conversation = waiting.start("finish")  # b is a stream nobody reads or writes
        with pytest.raises(ConnectionClosed, match="no word"):
            await conversation.receive("finished")
        nursery.cancel_scope.cancel()
    del b


async def test_messages_for_an_unknown_conversation_end_the_connection() -> None:
    a, b = trio.testing.memory_stream_pair()
    client = Connection(FrameStream(a))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expect_protocol_error, client)
        raw = FrameStream(b)
        await raw.send([{"t": "done", "id": 99, "ok": True}])
        reply = await raw.receive()
        assert reply[0]["t"] == "error" and reply[0]["code"] == "protocol"


async def _expect_protocol_error(connection: Connection) -> None:
    with pytest.raises(ProtocolError):
        await connection.run()


def test_the_codec_refuses_ext_types_and_trailing_bytes() -> None:
    from rdc.wire.codec import unpack

    with pytest.raises(ProtocolError):
        unpack(msgpack.packb(msgpack.ExtType(1, b"x")))
    with pytest.raises(ProtocolError):
        unpack(msgpack.packb([1]) + b"\x00")


async def test_answers_queued_in_one_wake_up_leave_in_one_frame() -> None:
    """Conversations woken by the same event (one frame read) queue their answers, some a
    few scheduler passes later than others; the writer lets them all run before it sends,
    so one frame carries every answer (fewer, larger frames compress better)."""
    a, b = trio.testing.memory_stream_pair()
    connection, peer = Connection(FrameStream(a)), FrameStream(b)
    wake = trio.Event()

    async def answer(n: int) -> None:
        await wake.wait()
        for _ in range(n % 4):  # some take a few scheduler passes to get their answer out
            await trio.lowlevel.checkpoint()
        connection.post({"t": "ping", "n": n})

    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        for n in range(20):
            nursery.start_soon(answer, n)
        await trio.testing.wait_all_tasks_blocked()
        wake.set()
        batch = await peer.receive()
        assert sorted(m["n"] for m in batch) == list(range(20))
        nursery.cancel_scope.cancel()
