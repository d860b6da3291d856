"""Frames and message schemas over in-memory streams: what a peer can and cannot make a
connection do."""

from __future__ import annotations

import contextlib
import functools
import random
import struct

import msgpack
import pytest
import trio
import trio.testing
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc.errors import NoSpace, ProtocolError, Refusal
from rdc.wire import messages as m
from rdc.wire.codec import MAX_FRAME, pack, unpack
from rdc.wire.connection import Connection, running
from rdc.wire.frames import ConnectionClosed, CountingStream, FrameStream

pytestmark = pytest.mark.filterwarnings("ignore::trio.TrioDeprecationWarning")


async def test_batches_round_trip_compressed_as_one_stream(monkeypatch) -> None:
    """Each direction is one zstd stream: frames decode in order, across a change of
    level (a new zstd frame), and repeated content costs almost nothing once sent."""
    from rdc.wire import frames

    monkeypatch.setattr(frames, "BULK_FROM", 40_000)  # the level changes mid-way
    a, b = trio.testing.memory_stream_pair()
    sender, receiver = FrameStream(CountingStream(a)), FrameStream(b)
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
    assert sender.plain_sent > 100_000
    assert sender.stream.bytes_sent < sender.plain_sent // 20


class _Recorded(trio.abc.Stream):
    """A stream that keeps what is sent, and gives back ``bytes`` in pieces of ``piece``."""

    def __init__(self, data: bytes = b"", piece: int = 1) -> None:
        self.sent, self.data, self.piece = bytearray(), data, piece

    async def send_all(self, data) -> None:
        self.sent += data

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.lowlevel.checkpoint()
        out = self.data[: min(self.piece, max_bytes or self.piece)]
        self.data = self.data[len(out):]
        return out

    async def aclose(self) -> None:
        pass


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 70_000), min_size=1, max_size=6),
       piece=st.integers(1, 150_000), compress=st.booleans())
def test_frames_arrive_whole_however_the_bytes_are_cut(sizes: list[int], piece: int,
                                                       compress: bool) -> None:
    """Frames sent back to back (small and large, compressible and not, compressed or
    not) come out as sent whatever pieces the stream delivers: a read that stops inside a
    frame, or one that takes the next frame's first bytes with it."""
    batches = [[{"t": "data", "id": i + 1,
                 "d": [random.Random(i).randbytes(size) if i % 2 else bytes([i]) * size]}]
               for i, size in enumerate(sizes)]

    async def main() -> None:
        sender = FrameStream(_Recorded())
        sender.compress = compress
        for batch in batches:
            await sender.send(batch)
        receiver = FrameStream(_Recorded(bytes(sender.stream.sent), piece))
        receiver.compress = compress
        for batch in batches:
            assert await receiver.receive() == batch
        with pytest.raises(ConnectionClosed):
            await receiver.receive()

    trio.run(main)


def _compressed_frame(plain_size: int, zstd_bytes: bytes) -> bytes:
    body = struct.pack(">I", plain_size) + zstd_bytes
    return struct.pack(">I", (1 << 31) | len(body)) + body


async def test_a_frame_over_the_limit_is_refused_before_its_body() -> None:
    a, b = trio.testing.memory_stream_pair()
    await a.send_all(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(ProtocolError, match="frame length"):
        await FrameStream(b).receive()


@pytest.mark.parametrize("stated", [100, MAX_FRAME + 1])
async def test_a_zip_bomb_is_refused(stated: int) -> None:
    """A small body that would expand to 64 MiB: the reader never gives more than the
    frame's stated size (at most MAX_FRAME), so nothing near 64 MiB is ever held."""
    a, b = trio.testing.memory_stream_pair()
    receiver = FrameStream(b)
    receiver.compress = True
    compressor = zstandard.ZstdCompressor().compressobj()
    bomb = compressor.compress(bytes(64 << 20)) + compressor.flush(
        zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    assert len(bomb) < 10_000
    await a.send_all(_compressed_frame(stated, bomb))
    with pytest.raises(ProtocolError):
        await receiver.receive()


async def test_a_compressed_frame_shorter_than_it_says_is_refused() -> None:
    a, b = trio.testing.memory_stream_pair()
    receiver = FrameStream(b)
    receiver.compress = True
    compressor = zstandard.ZstdCompressor().compressobj()
    body = compressor.compress(pack([{"t": "ping"}]) * 100) + compressor.flush(
        zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    await a.send_all(_compressed_frame(5_000, body))
    with pytest.raises(ProtocolError, match="stated size"):
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
), st.sampled_from([(t, k) for t in m.TYPES for k in m.KINDS.get(t, (None,))]))
def test_any_garbage_message_is_accepted_or_a_protocol_error(value, kind) -> None:
    fields = value if isinstance(value, dict) else {"x": value}
    t, k = kind
    try:
        _, checked = m.decode({**fields, "t": t, **({"k": k} if k else {})})
    except ProtocolError:
        return
    assert t == checked.TYPE and k == checked.KIND


EXAMPLES: list[m.Message] = [
    m.Hello(proto=(2, 2), agent="rdc/x", features=["zstd"], token="t" * 20, format="f"),
    m.Welcome(proto=1, agent="rdc/x", features=[], format="f"),
    m.Error(code="path", msg="caf\\xe9: nope"),
    m.Ping(),
    m.Open(share="s", path="a/b\udcff", write=True, create=True, excludes=["*.o"]),
    m.Open(share="s", stamps=True),
    m.Stamps(sketch=bytes(range(256)), racy_from=1_700_000_000_000_000_000),
    m.Stamps(sketch=bytes(range(256)), racy_from=1, paths=bytes(range(256)) * 2),
    m.Stamped(stamps=True),
    m.Roots(paths=["a", "b/c"]),
    m.Rooted(roots=[b"r" * 8, None]),
    m.Opened(content=b"c" * 32, meta=b"m" * 32, smeta=b"s" * 32, unreadable=2, writable=True,
             seq=7, top=m.Top(0o755, -5), fixed=True),
    m.List(paths=["", "d"], hb=32, meta=True),
    m.Listings(dirs=[m.Listing("d", [m.Listed("f", "f", 0o644, b"12345678"),
                                     m.Listed("e", "d", 0o755, b"8" * 8, 9, b"m" * 8,
                                              b"s" * 8, True)]),
                     m.Listing("x", None)], more=True),
    m.MetaList(paths=["d"], hb=8),
    m.MetaListing(dirs=[m.MetaDir("d", b"c" * 8, False, m.Vector.encode([5, 5, -1]),
                                  m.Vector.encode([0o644] * 3), b"x" * 8)]),
    m.MetaSet(dirs=[m.MetaDir("d", b"c" * 8, True, m.Vector.encode(range(300)),
                              m.Vector.encode([0o600] * 300))]),
    m.Ok(applied=3, skipped=1),
    m.Ops(ops=[m.Op("mkdir", "d", mode=0o755), m.Op("link", "l", target=b"t",
               expect=m.NOTHING), m.Op("rm", "r", expect=m.Expected("f", b"12345678")),
               m.Op("rmdir", "e"), m.Op("mv", "a", destination="b",
               expect=m.Expected("l", b"t")), m.Op("meta", "", mode=0o700, mtime_ns=-7)]),
    m.OpResults(results=[None, m.Failure("conflict", "x changed")]),
    m.Finish(),
    m.Finished(content=b"c" * 32, meta=b"m" * 32, seq=3, top=m.Top(0o700, 1)),
    m.Watch(seq=4),
    m.Verify(),
    m.Verified(files=3, size=1000, mismatches=["a/b", "c\udcff"], unreadable=1, more=True),
    m.Changed(seq=5),
    m.Offer(size=9, root=b"r" * 32, depth=2, sketch=bytes(range(12)), mode=0o600, mtime_ns=-1,
            path="f", expect=m.Expected("f", b"12345678"), data=b"123456789"),
    m.Offer(size=2000, root=b"r" * 32, depth=2, path="g", expect=m.NOTHING,
            subs=m.EntryList(0, b"abcd", b"\x01")),
    m.Get(path="f", expect=m.NOTHING),
    m.Get(path="f"),
    m.WantWhole(),
    m.WantExpand(nodes=[(3, 0), (2, 4)]),
    m.WantSubs(leaves=[1, 5]),
    m.WantFine(mids=[(1, 2)]),
    m.WantFetch(items=[(1, 0, 30)]),
    m.Lists(lists=[m.EntryList(4, b"12345678", b"\x05")]),
    m.Data(d=[b"x", b""], end=True),
    m.More(n=1 << 20),
    m.Done(ok=False, code="io", msg="disk full"),
    m.Offers(files=[m.FileOffer("a", 3, b"r" * 32, 2, None, 0o644, 5, m.NOTHING, b"abc"),
                    m.FileOffer("b", 9999, b"s" * 32, 3, bytes(range(12)), 0o600, -5,
                                m.Expected("f", b"12345678")),
                    m.FileOffer("c", 10, b"t" * 32, 2, None, 0o644, 0),
                    m.FileOffer("e", 10, b"u" * 16, 2, None, 0o644, 0,
                                m.Expected("f", b"12345")),
                    m.Failure("vanished", "d is gone")]),
    m.Gets(files=[m.FileRequest("a", m.NOTHING), m.FileRequest("b"),
                  m.FileRequest("c", m.Expected("f", b"87654321"))]),
    m.Verdicts(verdicts=["have", "copy", "done", "send", "descend", "delta",
                         m.Failure("conflict", "x")]),
    m.Wants(wants=[m.FileWant(0, "expand", [(2, 0)]), m.FileWant(3, "subs", [0, 2]),
                   m.FileWant(255, "fine", [(1, 4)]), m.FileWant(4, "subs", [1], 2),
                   m.FileWant(5, "fine", [(0, 0)], 3)]),
    m.WantSubs(leaves=[1, 2], prefix=2),
    m.WantFine(mids=[(0, 1)], prefix=3),
    m.Fetches(files=[m.FileFetch(1, [(0, 0, 100), (2, 10, 50, b"abcd", 60)])]),
    m.Results(results=[None, m.Failure("verify", "root")]),
    m.List(paths=[""], hb=8, sizes=True),
    m.MetaListing(dirs=[m.MetaDir(None, b"c" * 5, False, m.Vector.encode([5]),
                                  m.Vector.encode([0o755]), b"m" * 5, b"f" * 5), None]),
    m.List(paths=["a", "b", "c"], hb=5, sizes=True, have=[None, b"abcdef", None],
           sketch=[b"\1\2\3\4" * 4, None, None]),
    m.Listings(dirs=[m.Listing(None, [m.Listed("f", "f", 0o644, b"12345")], sums=b"s" * 16),
                     m.Listing(None, [], b"\x03"), m.Listing("c", None)]),
    m.Listings(dirs=[m.Listing("", [m.Listed("f", "f", 0o644, b"12345678", size=77),
                                    m.Listed("d", "d", 0o755, b"8" * 8, 1, b"m" * 8, b"s" * 8,
                                             True, 0)])]),
    m.Report(health=m.PeerHealth(role="replica", name="b:8731/mirror", mode="receive-only",
                                 state="behind", connected_ms=5000, lag_ms=1200, pending=3,
                                 error="upstream away", error_ms=9000, rounds=4, bytes=1)),
    m.Status(),
    m.Health(share="s", seq=9, peers=[m.PeerHealth(), m.PeerHealth(role="follows",
                                                                   ok_ms=0)]),
    m.RepoOpen(name="backups"),
    m.RepoOpened(writable=False, max_object=64 << 20, exclusive=True, connections=4),
    m.StorePut(name="data/ab/abcd", size=12, exclusive=True),
    m.StoreGet(name="config"),
    m.StoreRange(name="data/ab/abcd", offset=4, length=8),
    m.StoreStat(name="locks/x"),
    m.StoreList(prefix="snapshots"),
    m.StoreDelete(name="locks/x"),
    m.Objects(objects=[("config", 120), ("keys/k", 0)], more=True),
]


def test_every_message_type_has_an_example() -> None:
    assert {(e.TYPE, e.KIND) for e in EXAMPLES} == {
        (t, k) for t in m.TYPES for k in m.KINDS.get(t, (None,))
    }


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda e: f"{e.TYPE}-{e.KIND or ''}")
def test_every_message_survives_the_wire(message: m.Message) -> None:
    """What `encode` writes, `decode` reads back as the same message: the class is the
    one place a message's form is defined, in both directions."""
    conversation, back = m.decode(unpack(pack(m.encode(message, 7))))
    assert (conversation, back) == (7, message)


def test_conversation_ids_start_at_one() -> None:
    with pytest.raises(ProtocolError):
        m.decode({"t": "get", "id": 0, "path": b"f"})


def test_paths_are_checked_and_decoded() -> None:
    _, ok = m.decode({"t": "get", "id": 1, "path": b"a/b\xff"})
    assert ok.path == "a/b\udcff"
    for bad in (b"../x", b"/etc/passwd", b"a//b", b"a\0b", "text, not bytes"):
        with pytest.raises(ProtocolError):
            m.decode({"t": "get", "id": 1, "path": bad})


def test_a_prefix_length_is_one_a_source_can_answer_in() -> None:
    """A want's prefix length (``p``; a batch want's fourth element) is 2, 3 or 4 bytes:
    one of 0 would make a list of nothing, one of 32 a list as long as the hashes."""
    for p in (0, 1, 5, 32, "2"):
        with pytest.raises(ProtocolError):
            m.decode({"t": "want", "k": "subs", "id": 1, "leaves": [0], "p": p})
        with pytest.raises(ProtocolError):
            m.decode({"t": "wants", "id": 1, "wants": [[0, "fine", [[0, 1]], p]]})
    _, want = m.decode({"t": "want", "k": "fine", "id": 1, "mids": [[0, 1]]})
    assert want.prefix == 4  # (an older target names none)


def test_hash_prefixes_are_never_shorter_than_the_protocol_allows() -> None:
    """A listing's ``hb`` is 5 (``short-digests``), 8 or 32; an expectation's hash prefix
    at least 5 bytes; an offer's root at least 16 (a root shorter than that would let a
    wrong file through too often). Anything shorter is a protocol error."""
    def offers(root: bytes, expect: bytes) -> dict:
        return {"t": "offers", "id": 1, "files": [
            [b"f", 1, root, 2, None, 0o644, 0, expect, None]]}

    m.decode(offers(b"r" * 16, b"12345"))
    for root, expect in ((b"r" * 15, b"12345"), (b"r" * 16, b"1234"), (b"r" * 33, b"12345")):
        with pytest.raises(ProtocolError):
            m.decode(offers(root, expect))
    for hb in (5, 8, 32):
        m.decode({"t": "list", "id": 1, "paths": [b""], "hb": hb})
    for hb in (0, 4, 6, 16, 33):
        with pytest.raises(ProtocolError):
            m.decode({"t": "list", "id": 1, "paths": [b""], "hb": hb})


def test_ops_are_checked_each_by_its_kind() -> None:
    for bad in (["mkdir", b"d", None, None], ["meta", b"f", [0o644, 1 << 63], None],
                ["link", b"l", b"", None], ["mv", b"a", b"", None], ["rm", b"r", 5, None],
                ["chmod", b"f", 0o644, None], ["rm", b"r", None, ["f"]]):
        with pytest.raises(ProtocolError):
            m.decode({"t": "ops", "id": 1, "ops": [bad]})


async def test_a_silent_peer_ends_the_connection_but_pings_keep_it(autojump_clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    async def never_answer(conversation, message) -> None:
        await trio.sleep_forever()

    quiet = Connection(FrameStream(a), idle_timeout=60)
    talker = Connection(FrameStream(b), idle_timeout=60, handler=never_answer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(quiet.run)
        nursery.start_soon(talker.run)
        conversation = quiet.start(m.Finish())  # the peer never answers
        await trio.sleep(300)  # but its writer pings every 15 s: no timeout
        assert quiet.failure is None
        nursery.cancel_scope.cancel()
    assert conversation.id == 1


async def test_a_peer_that_says_nothing_at_all_times_out(autojump_clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    waiting = Connection(FrameStream(a), idle_timeout=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting.run)
        conversation = waiting.start(m.Finish())  # b is a stream nobody reads or writes
        with pytest.raises(ConnectionClosed, match="no word"):
            await conversation.receive(m.Finished)
        nursery.cancel_scope.cancel()
    del b


async def test_messages_for_an_unknown_conversation_end_the_connection(autojump_clock) -> None:
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
        connection.post(m.Changed(seq=n))

    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        for n in range(20):
            nursery.start_soon(answer, n)
        await trio.testing.wait_all_tasks_blocked()
        wake.set()
        batch = await peer.receive()
        assert sorted(msg["seq"] for msg in batch) == list(range(20))
        nursery.cancel_scope.cancel()


async def test_a_server_ends_a_connection_silent_with_nothing_open(autojump_clock) -> None:
    """A logged-in peer that opens nothing and says nothing (not even the pings every
    rdc sends while quiet) does not hold a connection forever."""
    a, b = trio.testing.memory_stream_pair()

    async def handler(conversation, message) -> None:
        raise AssertionError("no conversation was started")

    server = Connection(FrameStream(a), idle_timeout=600, handler=handler)
    with trio.move_on_after(3600) as waited:
        await server.run()
    assert not waited.cancelled_caught, "the silent connection was never ended"
    assert isinstance(server.failure, ConnectionClosed)
    del b


async def test_a_conversation_that_takes_no_input_refuses_it(autojump_clock) -> None:
    """Input to a conversation whose request has no follow-ups (a watch, say) is a
    protocol error at once, however small: nothing is queued for a handler that will
    never read it."""
    a, b = trio.testing.memory_stream_pair()

    async def watch(conversation, message) -> None:
        await trio.sleep_forever()

    server = Connection(FrameStream(a), handler=watch)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expect_protocol_error, server)
        peer = FrameStream(b)
        await peer.send([{"t": "watch", "id": 1, "seq": 0}])
        await peer.send([{"t": "more", "id": 1, "n": 1}])
        reply = await peer.receive()
        assert reply[0]["t"] == "error" and reply[0]["code"] == "protocol", reply


async def test_unread_input_is_bounded_by_pausing_the_reader(monkeypatch) -> None:
    """While a handler does not take its input, the reader stops reading once the
    connection holds PAUSE_BYTES of unread input; every field of a message counts, not
    only data pieces. When the handler takes it, reading goes on."""
    from rdc.wire import connection as session

    a, b = trio.testing.memory_stream_pair()
    release = trio.Event()
    taken: list[int] = []

    async def slow_target(conversation, message) -> None:
        await release.wait()
        while True:
            taken.append(len((await conversation.receive(m.Lists)).lists))

    monkeypatch.setattr(session, "PENDING_BYTES", 64 << 20)  # the reader's pause, not this
    server = Connection(FrameStream(a), handler=slow_target)
    piece = b"\x01" * (512 << 10)
    high = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        peer = FrameStream(b)
        await peer.send([{"t": "offer", "id": 1, "path": b"f", "size": 1, "root": b"r" * 32,
                          "depth": 2}])

        async def flood() -> None:
            for _ in range(12):  # 3 MiB a message: 36 MiB sent while nothing is taken
                await peer.send([{"t": "lists", "id": 1,
                                  "lists": [[0, piece, b""] for _ in range(6)]}])

        nursery.start_soon(flood)
        for _ in range(200):
            await trio.sleep(0.01)
            high = max(high, server._pending_input)
        assert 0 < high <= session.PAUSE_BYTES + (4 << 20), high  # plus one frame
        assert not taken
        release.set()
        with trio.fail_after(10):
            while len(taken) < 12:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert server._pending_input == 0


async def test_a_closed_conversation_gives_back_what_it_did_not_read() -> None:
    a, b = trio.testing.memory_stream_pair()
    stop = trio.Event()

    async def gives_up(conversation, message) -> None:
        await stop.wait()  # returns without reading: the conversation closes

    server = Connection(FrameStream(a), handler=gives_up)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        peer = FrameStream(b)
        await peer.send([{"t": "get", "id": 1, "path": b"f"}])
        await peer.send([{"t": "more", "id": 1, "n": 5}] * 10)
        await trio.testing.wait_all_tasks_blocked()
        assert server._pending_input > 0
        stop.set()
        await trio.testing.wait_all_tasks_blocked()
        assert server._pending_input == 0
        nursery.cancel_scope.cancel()


def test_text_that_is_not_unicode_is_sent_displayable() -> None:
    from rdc.wire.codec import unpack

    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    message = unpack(pack({"t": "error", "code": "io", "msg": f"{name}: not empty"}))
    assert message["msg"] == "caf\\xe9: not empty"


async def test_a_peer_that_does_not_read_answers_gets_no_more_requests_read() -> None:
    """Answers are queued without waiting; a peer that keeps asking and never reads
    stops being read itself once the queue is over OUTPUT_PAUSE."""
    from rdc.wire import connection as session

    a, b = trio.testing.lockstep_stream_pair()  # a send waits for the peer to read
    big = b"\x02" * 4000  # a link target can be this long: answers of ~4 KB each

    async def answer(conversation, message) -> None:
        entries = [m.Listed(f"n{i}", "l", 0, big) for i in range(256)]  # ~1 MB an answer
        conversation.send(m.Listings(dirs=[m.Listing("", entries)]))

    server = Connection(FrameStream(a), handler=answer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        peer = FrameStream(b)
        sent = 0

        async def ask() -> None:
            nonlocal sent
            for n in range(1, 200):
                await peer.send([{"t": "list", "id": n, "paths": [b""]}])
                sent = n

        nursery.start_soon(ask)
        await trio.sleep(1)
        await trio.testing.wait_all_tasks_blocked()
        assert server._queued_bytes <= session.OUTPUT_PAUSE + (4 << 20)
        assert sent < 199  # the server stopped reading: the peer's sends block
        nursery.cancel_scope.cancel()


def test_the_server_answers_every_request_and_nothing_else() -> None:
    """The requests are declared once (the message classes' REQUEST); the server's table
    answers each of them, and the connection lets nothing else start a conversation."""
    from rdc.transfer.serving import ServerSession
    from rdc_server.storeserving import RepoSession

    requests = {cls for cls in _all_message_classes() if cls.REQUEST}
    assert requests == {*ServerSession(shares=None).handlers(), m.Open,  # type: ignore[arg-type]
                        m.Stamps, *RepoSession(repos=None).handlers(), m.RepoOpen}  # type: ignore[arg-type]
    assert {cls.TYPE for cls in requests} == {
        "open", "list", "mlist", "offer", "get", "offers", "gets", "ops", "mset", "finish",
        "watch", "report", "status", "repo", "store", "verify", "stamps", "roots"}
    assert {cls for cls in requests if cls.FOLLOW_UPS} == {
        m.Offer, m.Get, m.Offers, m.Gets, m.StorePut, m.StoreGet, m.StoreRange}


def _all_message_classes() -> set[type[m.Message]]:
    found: set[type[m.Message]] = set()
    for value in vars(m).values():
        if isinstance(value, type) and issubclass(value, m.Message) and hasattr(value, "TYPE"):
            found.add(value)
    return found



def _frame(*messages: dict) -> bytes:
    body = msgpack.packb(list(messages), use_bin_type=True)
    return struct.pack(">I", len(body)) + body


async def test_no_request_starts_once_the_connection_failed(autojump_clock) -> None:
    """A request broke the protocol; while the error to the peer was being sent, another
    request arrived. It was started, and its handler's refusal (its worker thread, which
    no cancel stops, came back with one) raised the connection's failure from inside its
    task: the daemon logged a traceback for a peer's mistake."""
    incoming = trio.testing.MemoryReceiveStream()
    outgoing = trio.testing.MemorySendStream()

    async def while_the_error_is_sent() -> None:
        outgoing.get_data_nowait()
        incoming.put_data(_frame({"t": "list", "id": 2, "paths": [b""], "hb": 8}))
        await trio.sleep(0.05)  # the reader reads it before the connection is cancelled

    outgoing.send_all_hook = while_the_error_is_sent

    async def handler(conversation, message) -> None:
        if conversation.id == 1:
            raise ProtocolError(message="a request out of place")
        with trio.CancelScope(shield=True):  # as trio.to_thread.run_sync waits
            await trio.sleep(0.1)
        raise Refusal("path", message="refused once the connection had failed")

    server = Connection(FrameStream(trio.StapledStream(outgoing, incoming)), handler=handler)
    incoming.put_data(_frame({"t": "list", "id": 1, "paths": [b""], "hb": 8}))
    with pytest.raises(ProtocolError):
        await server.run()


async def test_a_send_cut_short_leaves_the_stream_unusable() -> None:
    """A frame cancelled half-way out: nothing may follow it (the server's error frame
    after a cut one reached a fuzzing client as garbage)."""
    a, b = trio.testing.lockstep_stream_pair()
    sender = FrameStream(a)
    big = {"t": "data", "d": [b"x" * 100_000]}

    async def read_a_little() -> None:
        await b.receive_some(1000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_a_little)
        with trio.move_on_after(0.5):
            await sender.send([big])
    assert sender.cut
    with pytest.raises(trio.ClosedResourceError):
        await sender.send([{"t": "error", "code": "protocol", "msg": "after the cut"}])


@pytest.mark.parametrize("server_knows", [True, False])
async def test_a_welcome_leaves_out_the_format_the_server_checked(monkeypatch,
                                                                  server_knows) -> None:
    """``same-format``: the server, having checked that the client's format is its own,
    says so without its 210-byte format string; a server that predates the feature sends
    the string, and the client takes either. A client of another format is still refused
    with ``version``."""
    from rdc.params import FORMAT
    from rdc.wire import handshake

    if not server_knows:
        monkeypatch.setattr(handshake, "FEATURES", ("zstd", "health"))
    replies = []
    for hello_format in (FORMAT, FORMAT.replace("tree=v1", "tree=v0")):
        client_stream, server_stream = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:

            async def serve(stream=server_stream) -> None:
                with contextlib.suppress(ProtocolError):
                    await handshake.server_handshake(FrameStream(stream), lambda t: True)

            nursery.start_soon(serve)
            frames = FrameStream(client_stream)
            await frames.send([m.encode(m.Hello(
                proto=(2, 2), agent="test", token="t",
                features=["zstd", "health", "same-format"], format=hello_format))])
            (raw,) = await frames.receive()
            replies.append(m.decode(raw)[1])
    welcome, refusal = replies
    assert isinstance(welcome, m.Welcome)
    assert welcome.format == ("" if server_knows else FORMAT)
    assert ("same-format" in welcome.features) == server_knows
    assert isinstance(refusal, m.Error) and refusal.code == "version"
    assert "tree v1 here, v0 there" in refusal.msg


async def test_a_client_takes_a_welcome_without_format_only_if_vouched_for() -> None:
    """A welcome with no format and without ``same-format`` is a server of another format
    (or none): refused."""
    from rdc.wire import handshake

    for features, accepted in ((["same-format"], True), ([], False)):
        client_stream, server_stream = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:

            async def serve(stream=server_stream, features=features) -> None:
                frames = FrameStream(stream)
                await frames.receive()
                await frames.send([m.encode(m.Welcome(proto=2, agent="x", features=features,
                                                      format=""))])

            nursery.start_soon(serve)
            frames = FrameStream(client_stream)
            if accepted:
                await handshake.client_handshake(frames, "t")
            else:
                with pytest.raises(ProtocolError, match="other format parameters"):
                    await handshake.client_handshake(frames, "t")


@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=600),
       st.integers(1, 400))
def test_a_vector_gives_back_its_values(values: list[int], distinct: int) -> None:
    """Any values, few distinct (one byte an index) or many (two): decoded as they were
    encoded."""
    values = [values[i % distinct] for i in range(len(values))]
    vector = m.Vector.encode(values)
    assert vector.decode() == values
    assert len(vector.index) == len(values) * (1 if len(vector.table) <= 256 else 2)


@pytest.mark.parametrize(("table", "index", "why"), [
    ([7], b"\x01", "past its table"),
    ([], b"\x00", "past its table"),
    (list(range(300)), b"\x01\x2c", "past its table"),  # 300
    (list(range(300)), b"\x00\x01\x02", "partial"),
])
def test_a_vector_that_does_not_fit_its_table_is_refused(table, index, why) -> None:
    with pytest.raises(ValueError, match=why):
        m.Vector(table, index).decode()


_ODD_VALUES = [b"name", b"a.py", b"", b"a/b", b"..", b".rdc-tmp-x", b"n\0", "name", "f", "d",
               "l", "x", 0o644, 0o7777, 0o10000, -1, 1 << 64, (1 << 64) - 1, (1 << 63) - 1,
               1 << 63, -(1 << 63), -(1 << 63) - 1, True, None, b"h" * 32, b"h" * 33,
               b"h" * 4096, b"h" * 4097, [], ["f"], 1.5]
_HEAD, _SIZE, _META = [b"name", "f", 0o644, b"12345"], [77], [1, b"m" * 8, b"s" * 8]


def _decodes_alike(v: list) -> None:
    """`Listed.from_wire` (fields checked inline) and its field-by-field check agree:
    the same entry, or the same refusal."""
    try:
        expected = m.Listed.from_wire_by_field(v, "e")
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as refused:
            m.Listed.from_wire(v, "e")
        assert str(refused.value) == str(exc)
    else:
        assert m.Listed.from_wire(v, "e") == expected


def test_a_listed_entry_with_any_one_field_replaced_decodes_as_checked() -> None:
    for template in (_HEAD, _HEAD + _SIZE, _HEAD + _META, _HEAD + _SIZE + _META):
        _decodes_alike(template)
        _decodes_alike([*template, 0])
        for at in range(len(template)):
            for value in _ODD_VALUES:
                _decodes_alike([*template[:at], value, *template[at + 1:]])


@given(st.lists(st.one_of(st.sampled_from(_ODD_VALUES), st.binary(max_size=40),
                          st.integers(), st.text(max_size=5)), max_size=9))
def test_any_listed_entry_decodes_as_checked(v: list) -> None:
    _decodes_alike(v)


def test_an_array_names_the_place_of_its_bad_item() -> None:
    check = m.array(m.uint(9))
    assert check([1, 2, 3], "a") == [1, 2, 3]
    with pytest.raises(ProtocolError, match=r"a\[2\]: expected an integer"):
        check([1, 2, 10, 3], "a")



@pytest.mark.parametrize(("field", "bad", "why"), [
    (0, b"../x", "path"), (1, -1, "integer"), (4, bytes([64] * 12), "sketch traits"),
    (5, 0o10000, "integer in 0..4095"), (8, b"x" * 256, "binary"),
])
def test_a_file_offer_names_the_field_that_is_wrong(field: int, bad, why: str) -> None:
    """The fields of each file of a batch are checked without writing out their places;
    the one that fails is named by its place all the same."""
    offers = [m.FileOffer(f"d/f{i}", 10, bytes(16), 1, bytes(12), 0o644, 5, m.NOTHING, b"")
              for i in range(5)]
    raw = m.encode(m.Offers(files=offers), 1)
    assert m.decode(raw)[1] == m.Offers(files=offers)
    raw["files"][3][field] = bad
    with pytest.raises(ProtocolError, match=rf"files\[3\]\[{field}\]: .*{why}"):
        m.decode(raw)

async def test_an_error_that_ends_the_connection_reaches_a_peer_still_sending() -> None:
    """A full disk ends the connection while the client is still sending (a push's data in
    flight). A socket closed with input unread sends a reset; the client's next send met
    it, and its writer's "connection reset" won over the error frame waiting to be read:
    the user saw the reset instead of "its state directory is full" (CI,
    test_the_servers_state_directory_full). So the server takes what the client still
    sends until the client closes: the client's sends all succeed, and it reads the error,
    then a clean end. What the session held is let go before that wait, not after."""

    async def handler(conversation, message) -> None:
        raise NoSpace(message="on the server: its state directory is full")

    released: list[bool] = []

    async def serve(stream: trio.SocketStream) -> None:
        with contextlib.suppress(Exception):
            await Connection(FrameStream(stream), handler=handler,
                             on_end=lambda: released.append(True)).run()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = FrameStream(await trio.open_tcp_stream("127.0.0.1", port))
        await client.send([{"t": "list", "id": 1, "paths": [b""], "hb": 8}])
        with trio.fail_after(10):
            for _ in range(50):  # 0.5 s of sends that do not read: the server has ended
                await client.send([{"t": "ping"}] * 500)
                await trio.sleep(0.01)
            assert await client.receive() == [
                {"t": "error", "code": "full",
                 "msg": "no space left on the server: its state directory is full"}]
            with pytest.raises(ConnectionClosed):  # the end, not a reset
                await client.receive()
        assert released == [True]  # while the server still waits for this client
        await client.stream.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("failing", [False, True], ids=["client leaves", "error"])
async def test_a_server_drops_its_zstd_contexts_before_its_session_ends(failing: bool,
                                                                       autojump_clock) -> None:
    """As a connection ends, the server's session closes and packs the tree it keeps (the
    server's peak on a 100,000-file first copy). The frame stream's zstd contexts, some
    12 MB, are let go before that: when the client leaves (the daemon closes the session
    once `run` returns) and when an error ends the connection (``on_end``) alike."""
    a, b = trio.testing.memory_stream_pair()
    frames, peer = FrameStream(a), FrameStream(b)
    frames.compress = peer.compress = True

    async def handler(conversation, message) -> None:
        if failing:
            raise NoSpace(message="on the server: its state directory is full")

    at_end: list[object] = []
    server = Connection(frames, handler=handler,
                        on_end=lambda: at_end.append(frames._decompressor))

    async def serve() -> None:
        with contextlib.suppress(Exception):
            await server.run()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await peer.send([{"t": "list", "id": 1, "paths": [b"p%d" % i for i in range(100)],
                          "hb": 8}])  # (over COMPRESS_FROM: a compressed frame)
        if failing:
            assert (await peer.receive())[0]["code"] == "full"
        else:
            await trio.sleep(1)
        assert frames._decompressor is not None or failing
        await peer.stream.aclose()
    assert frames._decompressor is None and frames._compressor is None
    assert at_end == ([None] if failing else [])


async def test_a_client_drops_its_zstd_contexts_when_the_connection_ends(autojump_clock) -> None:
    """A client packs the tree it keeps once its sync is over (its replica's close), after
    the connection: the connection's zstd contexts are gone by then, as a server's are."""
    a, b = trio.testing.memory_stream_pair()
    frames, peer = FrameStream(a), FrameStream(b)
    frames.compress = peer.compress = True
    async with running(frames, idle_timeout=600) as connection:
        connection.post(m.Ping())
        assert (await peer.receive())[0]["t"] == "ping"
        assert frames._decompressor is not None
    assert frames._decompressor is None and frames._compressor is None


async def test_the_client_measures_the_handshake_round_trip() -> None:
    """``rtt`` is the time from the hello sent to the welcome received (what sizes a
    sender's batches in flight), at least the server's delay in answering; 0 before."""
    from rdc.params import FORMAT
    from rdc.wire import handshake

    client_stream, server_stream = trio.testing.memory_stream_pair()
    frames = FrameStream(client_stream)
    assert frames.rtt == 0.0
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            server = FrameStream(server_stream)
            await server.receive()
            await trio.sleep(0.05)
            await server.send([m.encode(m.Welcome(proto=2, agent="x", features=[],
                                                  format=FORMAT))])

        nursery.start_soon(serve)
        await handshake.client_handshake(frames, "t")
    assert 0.05 <= frames.rtt < 10
