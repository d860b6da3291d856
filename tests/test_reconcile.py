"""Listing only what differs (``list`` with ``have``): the client names the entries it has
by fingerprint, the server sends back a bitmap and only the entries the client did not
name; the client's view of the server's directory is the same as from a full listing."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc import _native
from rdc.params import SHORT_WIRE_PREFIX, WIRE_PREFIX
from rdc.transfer import compare, metadata, oneway, ops, reconcile, serving
from rdc.transfer.reconcile import answer, fingerprints, merge
from rdc.transfer.stats import Options
from rdc.wire import handshake
from rdc.wire import messages as m

from .protocol_support import Pair, remote_answering, tree_state, write

OLD = 1_600_000_000_123_456_789

names = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1,
                max_size=12)
entries = st.dictionaries(
    names, st.tuples(st.sampled_from("fdl"), st.binary(min_size=1, max_size=3)), max_size=40)


def listed(d: dict[str, tuple[str, bytes]]) -> list[m.Listed]:
    return [m.Listed(name, kind, 0o644, digest) for name, (kind, digest) in sorted(d.items())]


@given(entries, entries, st.data(), st.booleans())
def test_merged_answer_is_the_servers_listing(client, server, data, short) -> None:
    """Whatever the two sides hold (shared entries, changed ones, ones only one side has),
    the client rebuilds exactly the server's (name, kind, hash) entries, with fingerprints
    of FINGERPRINT bytes or sized by their count (``short``)."""
    shared = data.draw(st.sets(st.sampled_from(sorted(client)) if client else st.nothing()))
    for name in shared:  # some entries the same on both sides
        server[name] = client[name]
    mine, theirs = listed(client), listed(server)
    have = fingerprints(mine, short)
    size = reconcile.fingerprint_size(have, short)
    assert size is not None and (short or size == reconcile.FINGERPRINT)
    unmatched, bitmap = answer(theirs, have, size)
    rebuilt = merge(mine, unmatched, bitmap)
    assert {n: (e.kind, e.digest) for n, e in rebuilt.items()} == {
        e.name: (e.kind, e.digest) for e in theirs}
    assert len(unmatched) == sum(1 for n, v in server.items() if client.get(n) != v)


@given(entries, st.sampled_from([3, 4, 5, reconcile.FINGERPRINT]),
       st.integers(0, 300))
def test_fingerprints_in_one_call_are_blake3_of_each_entry(d, size, long) -> None:
    """`fingerprint_list` (one call of the chunk hashes in C) gives each entry's
    fingerprint as docs/protocol.md defines it: BLAKE3 in derive-key mode of the name's
    length (a varint: past 127 bytes, two), the name, the kind and the hash prefix."""
    from blake3 import blake3

    from rdc.content.entries import put_varint
    from rdc.params import LISTING_CONTEXT

    items = [*listed(d), m.Listed("n" * long or "x", "f", 0o644, b"\x01" * 8)]

    def expected(e: m.Listed) -> bytes:
        name = os.fsencode(e.name)
        data = bytearray()
        put_varint(len(name), data)
        return blake3(bytes(data + name + e.kind.encode() + e.digest),
                      derive_key_context=LISTING_CONTEXT).digest(size)

    assert reconcile.fingerprint_list(items, size) == [expected(e) for e in items]
    assert reconcile.fingerprint_list([], size) == []


def test_a_fingerprint_length_is_found_again_from_the_bytes_alone() -> None:
    """`fingerprint_size` inverts `fingerprint_bytes` for every count a ``have`` may hold:
    3 bytes for a few entries, more for many; a length no count makes is refused."""
    for count in range(reconcile.HAVE_ENTRIES + 1):
        size = reconcile.fingerprint_bytes(count)
        assert reconcile.fingerprint_size(bytes(size * count)) == size
    assert [reconcile.fingerprint_bytes(n) for n in (2, 16, 17, 4096, 4097, 8192)] == [
        3, 3, 4, 4, 5, 5]
    for bad in (1, 2, 7, 17 * 3, 6 * 4097):
        assert reconcile.fingerprint_size(bytes(bad)) is None


def _without(monkeypatch, *features: str) -> None:
    monkeypatch.setattr(handshake, "FEATURES", tuple(
        f for f in handshake.FEATURES if f not in features))


async def _three_hundred(tmp_path, verb: str) -> tuple[Path, Pair]:
    """A directory ``many`` of 300 files, pushed; the client's index made for ``verb``:
    a pull's knows its own tree, a push's forgets what it pushed (else it knows the
    server's listing and asks for none)."""
    src = tmp_path / "src"
    for i in range(300):
        write(src / "many" / f"file-{i:03}.txt", b"content %d\n" % i * 20, OLD + i)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    if verb == "pull":
        await pair.run("pull", src)
    else:
        pair.forget_client(src)
    return src, pair


@pytest.mark.parametrize("verb", ["push", "pull"])
@pytest.mark.parametrize("names", ["sketch", "short", "long"])
async def test_a_sync_lists_only_what_differs(tmp_path, monkeypatch, verb, names) -> None:
    """One file edited, one added and one removed in a directory of 300: the server's
    listing of that directory carries the two entries the client does not hold as the
    server does, not 300 entries (the client's entries go along: the source's in a push,
    the target's in a pull), and the sync ends in step. Between peers with
    ``listing-sketch`` the client names its entries by a sketch of 16 bytes, and the
    server's answer carries its own sums; without it, by fingerprints of 4 bytes each
    and a bitmap comes back, or of 6 bytes where a side lacks ``short-fingerprints``."""
    if names != "sketch":
        _without(monkeypatch, reconcile.SKETCH, *([reconcile.SHORT] if names == "long" else []))
    src, pair = await _three_hundred(tmp_path, verb)
    source = src if verb == "push" else pair.share
    write(source / "many" / "file-123.txt", b"edited\n", OLD)
    write(source / "many" / "new.txt", b"new\n", OLD)
    os.remove(source / "many" / "file-200.txt")
    sent: list[m.Listing] = []
    real, real_answer = serving._split_large, serving.answer
    sizes: list[int] = []
    asked: list[m.List] = []

    def spying(dirs, *args):
        sent.extend(dirs)
        return real(dirs, *args)

    def answering(entries, have, size):
        sizes.append(size)
        return real_answer(entries, have, size)

    async def between(connection) -> None:
        real_start = connection.start

        def start(message):
            if isinstance(message, m.List):
                asked.append(message)
            return real_start(message)

        connection.start = start

    monkeypatch.setattr(serving, "_split_large", spying)
    monkeypatch.setattr(serving, "answer", answering)
    stats = await pair.run(verb, src, options=Options(delete=True), between=between)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    many = [item for item in sent if item.path == "many"]
    assert len(many) == 1
    assert sorted(e.name for e in many[0].entries) == (
        ["file-123.txt", "file-200.txt"] if verb == "push" else ["file-123.txt", "new.txt"])
    sketches = [s for message in asked for s in message.sketch or () if s is not None]
    if names == "sketch":
        assert many[0].sums is not None and many[0].matched is None
        assert [len(s) for s in sketches] == [4 * reconcile.SKETCH_CAPACITY] and not sizes
    else:
        assert many[0].matched is not None and many[0].sums is None and not sketches
        assert 4 in sizes if names == "short" else set(sizes) == {reconcile.FINGERPRINT}
    pair.close()


@given(entries, entries, st.data())
def test_a_sketch_gives_the_servers_listing_or_nothing(client, server, data) -> None:
    """Whatever the two sides hold, the client rebuilds exactly the server's (name, kind,
    hash) entries from its sketch where they differ in at most SKETCH_CAPACITY entries;
    where more differ it gets nothing (and asks again with fingerprints), never a wrong
    listing; the server sends only the entries that differ."""
    shared = data.draw(st.sets(st.sampled_from(sorted(client)) if client else st.nothing()))
    for name in shared:
        server[name] = client[name]
    if data.draw(st.booleans()):  # (mostly the same: the case a sketch is for)
        server = {**client, **dict(list(server.items())[:2])}
    mine, theirs = listed(client), listed(server)
    items = reconcile.elements(mine)
    sums = _native.set_sketch(items, reconcile.SKETCH_CAPACITY)
    answered = reconcile.answer_sketch(theirs, sums)
    assert answered is not None  # (distinct names: 32-bit fingerprints that differ)
    unmatched, own = answered
    rebuilt = reconcile.merge_sketch(mine, items, sums, own, unmatched)
    differ = set(client.items()) ^ set(server.items())
    expected = {e.name: (e.kind, e.digest) for e in theirs}
    if len(differ) <= reconcile.SKETCH_CAPACITY:
        assert rebuilt is not None
        assert sorted(e.name for e in unmatched) == sorted(
            n for n, v in server.items() if client.get(n) != v)
    if rebuilt is not None:
        assert {n: (e.kind, e.digest) for n, e in rebuilt.items()} == expected


def test_a_fingerprint_of_zero_is_the_element_one(monkeypatch) -> None:
    """A sketch cannot hold 0: an entry whose 32-bit fingerprint is 0 stands as 1, the
    others as they are."""
    entries = listed({"a": ("f", b"1"), "b": ("f", b"2")})
    monkeypatch.setattr(reconcile, "fingerprint_list",
                        lambda entries, size=6: [bytes(4), b"\2\0\0\7"][: len(entries)])
    assert reconcile.elements(entries) == b"\1\0\0\0\2\0\0\7"


def test_a_sketch_of_entries_that_share_a_fingerprint_is_not_made(monkeypatch) -> None:
    """Two entries of one side with the same 32-bit fingerprint would cancel in a sketch:
    the server answers such a directory whole, and the client sends fingerprints."""
    entries = listed({"a": ("f", b"1"), "b": ("f", b"2"), "c": ("f", b"3")})
    monkeypatch.setattr(reconcile, "fingerprint_list",
                        lambda entries, size=6: [b"\0\0\0\7"[-size:] for _ in entries])
    assert not reconcile.distinct(reconcile.elements(entries))
    assert reconcile.answer_sketch(entries, bytes(16)) is None
    from rdc.transfer.sides import _list_requests

    requests = _list_requests(["d"], {"d": {e.name: e for e in entries * 10}}, True, True)
    assert not requests.sketched and requests.batches[0][1][0] is not None


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_directory_that_differs_in_more_than_a_sketch_holds_is_asked_again(
        tmp_path, monkeypatch, verb) -> None:
    """Six files edited in a directory of 300 (twelve entries differ, capacity four): the
    sketch does not decode, the client asks for that directory again with fingerprints,
    and the sync ends in step."""
    src, pair = await _three_hundred(tmp_path, verb)
    for i in range(6):
        write((src if verb == "push" else pair.share) / "many" / f"file-{i * 40:03}.txt",
              b"edited %d\n" % i, OLD)
    answers: list[str] = []
    real_sketch, real_answer = serving.answer_sketch, serving.answer
    monkeypatch.setattr(serving, "answer_sketch", lambda entries, sums: (
        answers.append("sketch"), real_sketch(entries, sums))[1])
    monkeypatch.setattr(serving, "answer", lambda entries, have, size: (
        answers.append("have"), real_answer(entries, have, size))[1])
    stats = await pair.run(verb, src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 6
    assert tree_state(pair.share) == tree_state(src)
    assert answers == ["sketch", "have"]
    pair.close()


@pytest.mark.parametrize("bad", ["not whole sums", "with fingerprints", "too few", "too large"])
async def test_a_sketch_that_does_not_fit_its_paths_is_a_protocol_error(tmp_path, bad) -> None:
    """The server refuses a ``list`` whose sketches are not whole 4-byte sums, name a
    path that has fingerprints too, are fewer than its paths, or hold more than 16 sums
    (a decoding costs the server the square of that)."""
    from rdc.errors import RemoteError

    src, pair = await pushed(tmp_path, 3)
    sketch, have = {"not whole sums": ([b"12345"], None),
                    "with fingerprints": ([b"1234"], [b"abcdef"]),
                    "too few": ([], None), "too large": ([bytes(range(68))], None)}[bad]

    async def between(connection) -> None:
        conversation = connection.start(m.List(paths=["d"], hb=8, have=have, sketch=sketch))
        await conversation.receive(m.Listings)

    with pytest.raises(RemoteError, match=r"sketch does not fit|binary of 4 to 64 bytes"):
        await pair.run("push", src, between=between)
    pair.close()


async def test_sums_for_a_directory_not_sketched_are_a_protocol_error() -> None:
    """A listing that carries sums where the client sent no sketch ends the request as a
    protocol error."""
    from rdc.errors import ProtocolError

    remote = remote_answering(m.Listings(dirs=[m.Listing("d", [], sums=bytes(16))]),
                              {reconcile.SKETCH})
    with pytest.raises(ProtocolError, match="not sketched"):
        await remote.listings(["d"], 8)


async def pushed(tmp_path, files: int) -> tuple[Path, Pair]:
    """A directory ``d`` of ``files`` small files, pushed once (the server holds it)."""
    src = tmp_path / "src"
    for i in range(files):
        write(src / "d" / f"f{i}", b"x%d" % i, OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    return src, pair


@pytest.mark.parametrize("verb", ["push", "pull"])
@pytest.mark.parametrize("server", ["predates have", "fingerprints collide"])
async def test_one_changed_file_is_sent_whatever_the_fingerprints_say(
        tmp_path, monkeypatch, server, verb) -> None:
    """A server that predates ``have`` sends whole listings: the sync is the same. If
    every fingerprint collided, the client would think the server has every entry it has;
    the root hashes at the end differ, and the comparison runs again with whole hashes and
    no fingerprints: the sync still ends in step."""
    src, pair = await pushed(tmp_path, 30)
    if verb == "pull":
        await pair.run("pull", src)
    write((src if verb == "push" else pair.share) / "d" / "f3", b"changed", OLD)
    if server == "predates have":
        real = serving.ServerSession._list

        async def old_server(self, conversation, message):
            await real(self, conversation, dataclasses.replace(message, have=None))

        monkeypatch.setattr(serving.ServerSession, "_list", old_server)
    else:
        monkeypatch.setattr(reconcile, "fingerprint_list",
                            lambda entries, size=6: [b"\0" * size for _ in entries])
    stats = await pair.run(verb, src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 1
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_a_client_that_pushed_the_tree_asks_for_no_listing_the_server_kept(
        tmp_path, monkeypatch) -> None:
    """After its own push, a client knows the server's listings where the server's hashes
    are still those it left: a push that changed half the directories (its scan goes in
    full, not patched) asks for none, and ends in step; forgotten, it asks again."""
    src, pair = await pushed(tmp_path, 20)
    asked: list[list[str]] = []
    real = serving.ServerSession._list

    async def spying(self, conversation, message):
        asked.append(message.paths)
        await real(self, conversation, message)

    monkeypatch.setattr(serving.ServerSession, "_list", spying)
    for forgotten in (False, True):
        # (later each time: a client that forgot its index compares by stamps)
        write(src / "d" / "f3", b"changed %d" % forgotten, OLD + 10**9 * (1 + forgotten))
        if forgotten:
            pair.forget_client(src)
        stats = await pair.run("push", src)
        assert stats.in_step and not stats.failed and stats.files_transferred == 1
        assert tree_state(pair.share) == tree_state(src)
        assert bool(asked) == forgotten, asked
    pair.close()


@pytest.mark.parametrize("short", [True, False])
async def test_listings_and_metadata_hashes_go_in_short_prefixes_between_peers_that_can(
        tmp_path, monkeypatch, short) -> None:
    """With ``short-digests`` on both sides a push lists and walks metadata in 5-byte hash
    prefixes (an entry's expectation too); where a side lacks it, in 8. Either way it
    ends in step."""
    if not short:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != compare.SHORT_DIGESTS))
    src, pair = await pushed(tmp_path, 20)
    pair.forget_client(src)  # (a client new to the server: it asks for the listings)
    write(src / "d" / "f3", b"changed", OLD)
    os.utime(src / "d" / "f4", ns=(OLD + 9, OLD + 9))
    asked: list[tuple[str, int]] = []
    for name in ("_list", "_mlist"):
        real = getattr(serving.ServerSession, name)

        async def spying(self, conversation, message, real=real, name=name):
            asked.append((name, message.hb))
            await real(self, conversation, message)

        monkeypatch.setattr(serving.ServerSession, name, spying)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 1
    assert tree_state(pair.share) == tree_state(src)
    assert {name for name, _ in asked} == {"_list", "_mlist"}
    assert {hb for _, hb in asked} == {SHORT_WIRE_PREFIX if short else WIRE_PREFIX}
    pair.close()


@pytest.mark.parametrize("what", ["content", "metadata"])
async def test_what_a_short_prefix_missed_is_caught_by_the_roots(
        tmp_path, monkeypatch, what) -> None:
    """If the 5-byte prefixes all matched by chance (an edited file's, or a directory's
    metadata hash), the first pass would find nothing to do; the roots at the end differ,
    the sync compares and walks again in whole hashes, and ends in step."""
    src, pair = await pushed(tmp_path, 10)
    if what == "content":
        write(src / "d" / "f3", b"changed", OLD)
    else:
        os.utime(src / "d" / "f4", ns=(OLD + 9, OLD + 9))
    passes: list[int] = []
    real_compare, real_walk = oneway.compare, metadata.walk

    async def blind_compare(source, target, hb, pull=False, **known):
        passes.append(hb)
        return compare.Changes() if hb == SHORT_WIRE_PREFIX else await real_compare(
            source, target, hb, pull, **known)

    async def blind_walk(remote, tree, their_vectors=True, *, hb, levels=False):
        if hb == SHORT_WIRE_PREFIX:
            return [], []
        return await real_walk(remote, tree, their_vectors, hb=hb, levels=levels)

    monkeypatch.setattr(oneway, "compare", blind_compare)
    monkeypatch.setattr(metadata, "walk", blind_walk)
    stats = await pair.run("push", src)
    assert passes == [SHORT_WIRE_PREFIX, m.HASH_BYTES]
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


@pytest.mark.parametrize("asked", [True, False])
async def test_listings_name_no_path_where_they_answer_the_one_asked(
        tmp_path, monkeypatch, asked: bool) -> None:
    """Between peers with ``asked-listings``, a listing names no path where it is the
    directory asked for in its place, and the part after a split names it (a directory of
    more entries than one item holds); without the feature each names its path. The sync
    ends in step either way."""
    if not asked:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != reconcile.ASKED_LISTINGS))
    monkeypatch.setattr(serving, "LISTING_SPLIT", 4)
    src = tmp_path / "src"
    for d in range(3):
        for i in range(10):
            write(src / f"d{d}" / f"sub{i % 2}" / f"f{i}.txt", b"content %d %d\n" % (d, i), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    pair.forget_client(src)  # (a client new to the server: it asks for every listing)
    for d in range(3):
        write(src / f"d{d}" / "sub1" / "f1.txt", b"edited\n", OLD)  # (every level differs)
    for i in range(6):  # more than an item of 4 holds: d0/sub1's listing is split
        write(pair.share / "d0" / "sub1" / f"extra{i}.txt", b"extra %d\n" % i, OLD)
    sent: list[m.Listing] = []
    real = serving._split_large

    def spying(dirs, *args):
        out = real(dirs, *args)
        sent.extend(out)
        return out

    monkeypatch.setattr(serving, "_split_large", spying)
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed and stats.files_transferred == 3
    assert tree_state(pair.share) == tree_state(src)
    named = [item.path for item in sent]
    assert len(named) > 6 and (None in named) == asked
    if asked:  # only the parts after a split name their directory, each the one before
        assert all(path is None or path == sent[k - 1].path or sent[k - 1].path is None
                   for k, path in enumerate(named))
        assert "d0/sub1" in named  # (the second part of the split)
    pair.close()


async def test_more_unnamed_listings_than_directories_asked_is_a_protocol_error() -> None:
    """A server that answers a ``list`` of one directory with two listings that name no
    path ends the request as a protocol error, not with a listing put anywhere."""
    from rdc.errors import ProtocolError

    remote = remote_answering(m.Listings(dirs=[m.Listing(None, []), m.Listing(None, [])]),
                              {reconcile.ASKED_LISTINGS})
    with pytest.raises(ProtocolError, match="more unnamed"):
        await remote.listings(["d"], 8)


@pytest.mark.parametrize("server_changed", [False, True])
async def test_a_push_takes_the_listings_the_server_did_not_change_from_its_last_tree(
        tmp_path, monkeypatch, server_changed) -> None:
    """After a push, the client's index keeps the tree it pushed. The next push compares
    against it wherever the server's directory still has its content hash: with one file
    edited among ten directories it asks the server for no listing at all. A directory
    the server changed meanwhile (another writer) is asked for, as is every directory on
    the way to it; the push ends in step either way."""
    src = tmp_path / "src"
    for d in range(10):
        for i in range(5):
            write(src / f"d{d}" / f"f{i}", b"content %d %d\n" % (d, i), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    write(src / "d3" / "f1", b"edited\n", OLD)
    if server_changed:
        write(pair.share / "d5" / "extra", b"someone else's\n", OLD)
    asked: list[str] = []
    real = serving.ServerSession._list

    async def spying(self, conversation, message):
        asked.extend(message.paths)
        await real(self, conversation, message)

    monkeypatch.setattr(serving.ServerSession, "_list", spying)
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed
    assert stats.files_transferred == 1
    assert tree_state(pair.share) == tree_state(src)
    assert sorted(asked) == (["", "d5"] if server_changed else [])
    pair.close()


async def test_a_listing_taken_from_the_last_tree_by_a_false_match_is_caught_by_the_roots(
        tmp_path, monkeypatch) -> None:
    """If a directory's short hash prefix matched the last tree's by chance, the listing
    taken from it is wrong (here: every listing is this side's own, as if the server held
    the edit already). The roots differ at the end, and the second comparison, in whole
    hashes, asks the server and ends in step."""
    src = tmp_path / "src"
    for d in range(10):
        write(src / f"d{d}" / "f", b"content %d\n" % d, OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    write(src / "d3" / "f", b"edited\n", OLD)
    passes: list[int] = []

    def fooled(base, hb):
        passes.append(hb)

        def known(path, digest):
            return {e.name: e for e in ops.listing(current["tree"], path, hb) or []}

        return known

    current: dict = {}
    real_compare = oneway.compare

    compared: list[int] = []

    async def remember(source, target, hb, pull=False, **kw):
        current["tree"] = source.tree
        compared.append(hb)
        return await real_compare(source, target, hb, pull, **kw)

    monkeypatch.setattr(oneway, "known_listings", fooled)
    monkeypatch.setattr(oneway, "compare", remember)
    stats = await pair.run("push", src)
    assert passes == [SHORT_WIRE_PREFIX]  # (the second pass takes nothing from the tree)
    assert compared == [SHORT_WIRE_PREFIX, m.HASH_BYTES]
    assert stats.in_step and not stats.failed and stats.files_transferred == 1
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


def test_a_subdirectory_is_sketched_unless_its_parent_or_the_walk_so_far_says_it_differs_much(
) -> None:
    """`Changed` guesses from the share of files that differed in the parent (else in
    every directory so far) whether a sketch of a directory would fail: twice that share
    of its entries (an edited file is two elements) over the capacity. Large directories
    are sketched whatever the guess (their fingerprints would cost more where it is
    wrong); one whose sketch failed already never is."""
    from rdc.transfer.sides import GUESS_UP_TO, Changed

    def files(n: int, changed: int, salt: bytes = b"") -> tuple[dict, dict]:
        mine = {e.name: e for e in listed({f"f{i}": ("f", b"old%d" % i + salt)
                                            for i in range(n)})}
        theirs = dict(mine)
        for i in range(changed):
            theirs[f"f{i}"] = dataclasses.replace(mine[f"f{i}"], digest=b"new%d" % i)
        return mine, theirs

    changed = Changed()
    assert not changed.likely_past_capacity("a/b", 20)  # nothing known yet
    changed.note("a", *files(10, 3))  # 30% of a's files differ
    changed.note("q", *files(2, 2))  # too few files to judge q by
    assert "q" not in changed.share and changed.share["a"] == pytest.approx(0.3)
    assert changed.likely_past_capacity("a/b", 20)  # 2 * 0.3 * 20 = 12 > 4
    assert not changed.likely_past_capacity("a/b", 6)  # 3.6
    assert not changed.likely_past_capacity("a/b", GUESS_UP_TO + 1)
    assert not changed.likely_past_capacity("q/r", 20)  # by the walk: 5 of 12 files, but
    changed.note("z", *files(30, 0))  # too few files seen to go by that yet
    assert changed.likely_past_capacity("q/r", 20) == (2 * 5 / 42 * 20 > 4)
    changed.failed.add("big")
    assert changed.likely_past_capacity("big", 10_000)


def test_the_top_goes_by_fingerprints_unless_it_is_large() -> None:
    """Nothing is known of the top when it is asked for, but that something below it
    differs: up to GUESS_UP_TO entries it is named by fingerprints (a sketch failed there
    in every case of the bench), beyond that by a sketch, as any large directory."""
    from rdc.transfer.sides import GUESS_UP_TO, Changed, _list_requests

    changed = Changed()
    assert changed.likely_past_capacity("", 12)
    assert changed.likely_past_capacity("", GUESS_UP_TO)
    assert not changed.likely_past_capacity("", GUESS_UP_TO + 1)
    assert not changed.likely_past_capacity("a", 12)  # (a subdirectory: nothing known yet)
    for n, by_prints in ((12, True), (GUESS_UP_TO + 20, False)):
        have = {"": {e.name: e for e in listed({f"f{i}": ("f", b"c%d" % i) for i in range(n)})}}
        requests = _list_requests([""], have, short=False, sketch=True, changed=changed)
        (paths, prints, sums), = requests.batches
        assert paths == [""]
        assert (prints[0] is not None, sums[0] is not None) == (by_prints, not by_prints)
