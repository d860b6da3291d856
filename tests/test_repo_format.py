"""The repository's formats, piece by piece: entries, records and deltas, packs, index
objects, sealing and keys, dir, node and meta blobs (docs/formats.md section 8)."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc.content.signature import signature_of_bytes
from rdc.content.tree import node_hash
from rdc.local.snapshot import Entry, seal
from rdc.repo import codec, crypto
from rdc.repo.blobs import Encoding, Kind, pack_entries, unpack_entries
from rdc.repo.blobs import Entry as BlobEntry
from rdc.repo.crypto import MasterKeys, Plain, Sealed, Unauthentic
from rdc.repo.indexfile import PackInfo, decode_index, encode_index
from rdc.repo.packs import MAGIC, PackWriter, parse_pack, record_aad
from rdc.repo.similarity import chunk_sketch, features, rank
from rdc.repo.trees import (
    DirEntry,
    FileRef,
    content_hash,
    decode_dir,
    decode_meta,
    decode_node,
    encode_dir,
    encode_meta,
    inner_nodes,
    leaves,
)

from .conftest import scaled

ids = st.binary(min_size=32, max_size=32)


@st.composite
def blob_entries(draw: st.DrawFn) -> list[BlobEntry]:
    out, offset = [], len(MAGIC)
    for _ in range(draw(st.integers(0, 20))):
        encoding = draw(st.sampled_from(list(Encoding)))
        kind = draw(st.sampled_from(list(Kind)))
        length = draw(st.integers(0, 1 << 40))
        delta = encoding is Encoding.DELTA
        out.append(BlobEntry(
            kind, encoding, draw(ids), offset, length, draw(st.integers(0, 1 << 40)),
            draw(ids) if delta else None, draw(st.integers(1, 64)) if delta else 0,
            draw(st.one_of(st.none(), st.binary(min_size=12, max_size=12)))))
        offset += length
    return out


@given(blob_entries())
def test_entries_round_trip(entries: list[BlobEntry]) -> None:
    limit = entries[-1].end if entries else len(MAGIC)
    assert unpack_entries(pack_entries(entries), len(MAGIC), limit, contiguous=True) == entries
    assert unpack_entries(pack_entries(entries[1::2]), len(MAGIC), limit) == entries[1::2]


def test_entries_refuse_what_does_not_parse() -> None:
    entry = BlobEntry(Kind.CHUNK, Encoding.ZSTD, b"i" * 32, 8, 10, 20)
    packed = pack_entries([entry])
    with pytest.raises(ValueError):
        unpack_entries(packed[:-1], 8, 100)  # truncated
    with pytest.raises(ValueError):
        unpack_entries(packed + b"\0", 8, 100)  # trailing bytes
    with pytest.raises(ValueError):
        unpack_entries(packed, 8, 17)  # a record past the end of its pack
    with pytest.raises(ValueError):
        unpack_entries(packed, 7, 100, contiguous=True)  # not where the records start
    with pytest.raises(ValueError):
        unpack_entries(b"\x01\x0c" + b"i" * 32 + b"\x08\x01\x01", 8, 100)  # encoding 3


@given(st.binary(max_size=5000), st.binary(max_size=5000))
def test_records_and_deltas_round_trip(plain: bytes, base: bytes) -> None:
    encoding, record = codec.compress(plain)
    assert codec.decode(encoding, record, len(plain)) == plain
    assert codec.decode(Encoding.DELTA, codec.delta(plain, base), len(plain), base) == plain


def test_a_delta_against_a_similar_base_is_small() -> None:
    rng = random.Random(1)
    base = rng.randbytes(8000)
    edited = base[:3000] + b"an edit" + base[3100:]
    _, alone = codec.compress(edited)
    delta = codec.delta(edited, base)
    assert len(alone) > 7900 and len(delta) < 100
    assert codec.better_delta(alone, delta)


def test_a_record_claiming_another_size_is_refused() -> None:
    _, record = codec.compress(b"a" * 1000)
    with pytest.raises(ValueError):
        codec.decode(Encoding.ZSTD, record, 999)
    with pytest.raises(ValueError):
        codec.decode(Encoding.ZSTD, b"not zstd at all", 10)


@pytest.mark.parametrize("encrypted", [False, True])
def test_packs_and_index_objects_round_trip(encrypted: bool) -> None:
    box = Sealed(MasterKeys.generate()) if encrypted else Plain()
    rng = random.Random(2)
    writer = PackWriter(box)
    blobs = {}
    for i in range(30):
        plain = rng.randbytes(rng.randrange(1, 3000)) * rng.randrange(1, 3)
        sid = box.storage_id(bytes([i]) * 32)
        encoding, record = codec.compress(plain)
        writer.add(Kind.CHUNK, sid, encoding, record, len(plain), sketch=bytes(12))
        blobs[sid] = plain
    pack_id, data = writer.finish()
    entries = parse_pack(data, box)
    assert entries == writer.entries
    for e in entries:
        record = box.open(data[e.offset : e.end], record_aad(e.kind, e.sid))
        assert codec.decode(e.encoding, record, e.size) == blobs[e.sid]
    name, index = encode_index([PackInfo(pack_id, len(data), entries)], box)
    assert name.startswith("index/")
    [info] = decode_index(index, box)
    assert (info.pack_id, info.size, info.entries) == (pack_id, len(data), entries)


def test_sealing_authenticates_content_and_context() -> None:
    box = Sealed(MasterKeys.generate())
    sealed = box.seal(b"plaintext", b"aad")
    assert box.open(sealed, b"aad") == b"plaintext"
    assert b"plaintext" not in sealed
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    for bad, aad in ((bytes(flipped), b"aad"), (sealed, b"other"), (sealed[:10], b"aad")):
        with pytest.raises(Unauthentic):
            box.open(bad, aad)
    with pytest.raises(Unauthentic):
        Sealed(MasterKeys.generate()).open(sealed, b"aad")
    assert box.storage_id(b"x" * 32) != Sealed(MasterKeys.generate()).storage_id(b"x" * 32)


def test_key_objects_open_with_their_passphrase_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crypto, "KDF_N", 1 << 10)
    keys = MasterKeys.generate()
    data = crypto.make_key_object(b"right", "repo-1", keys)
    assert crypto.open_key_object(data, b"right", "repo-1") == keys
    assert crypto.open_key_object(data, b"wrong", "repo-1") is None
    with pytest.raises(ValueError):
        crypto.open_key_object(data, b"right", "repo-2")
    with pytest.raises(ValueError):
        crypto.open_key_object(b"\x93garbage", b"right", "repo-1")


# ---------------------------------------------------------------- trees

names = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
    and not b.startswith(b".rdc-tmp-"))


@st.composite
def walked_trees(draw: st.DrawFn, depth: int = 0) -> Entry:
    directory = Entry("d", draw(st.integers(0, 0o7777)), draw(st.integers(-(1 << 63), 1 << 62)),
                      children={})
    for raw in draw(st.sets(names, max_size=5)):
        kind = draw(st.sampled_from("fdl" if depth < 2 else "fl"))
        mode, mtime = draw(st.integers(0, 0o7777)), draw(st.integers(0, 1 << 62))
        if kind == "d":
            child = draw(walked_trees(depth + 1))
        elif kind == "l":
            child = Entry("l", 0, mtime, target=os.fsdecode(draw(names)))
        else:
            child = Entry("f", mode, mtime, root=node_hash(2, draw(ids), [5]))
        directory.children[os.fsdecode(raw)] = child
    return directory


def _dir_entries(directory: Entry, refs: dict[int, FileRef]) -> list[DirEntry]:
    out = []
    for name, child in directory.sorted_children():
        if child.kind == "f":
            out.append(DirEntry(name, "f", refs[id(child)]))
        elif child.kind == "d":
            out.append(DirEntry(name, "d", content=child.content))
        else:
            out.append(DirEntry(name, "l", target=child.target))
    return out


@given(walked_trees())
def test_dir_blobs_carry_rdc_directory_content_hashes(tree: Entry) -> None:
    refs: dict[int, FileRef] = {}
    stack = [tree]
    while stack:  # a file ref whose root is the walked file's root
        directory = stack.pop()
        for child in directory.children.values():
            if child.kind == "d":
                stack.append(child)
            elif child.kind == "f":
                ref = FileRef(2, os.urandom(32), (5,))
                child.root = ref.root
                refs[id(child)] = ref
    seal(tree)
    stack = [tree]
    while stack:
        directory = stack.pop()
        entries = _dir_entries(directory, refs)
        blob = encode_dir(entries)
        assert decode_dir(blob) == entries
        assert content_hash(decode_dir(blob)) == directory.content
        stack += [c for c in directory.children.values() if c.kind == "d"]


@pytest.mark.parametrize(
    "name", [b"..", b".", b"a/b", b"", b"x\0y", b".rdc-tmp-0123456789abcdef-x"])
def test_dir_blobs_with_unsafe_names_are_refused(name: bytes) -> None:
    from rdc.repo import msg

    with pytest.raises(ValueError):
        decode_dir(msg.pack([1, [[name, 2, b"target"]]]))


def test_dir_blobs_out_of_order_are_refused() -> None:
    from rdc.repo import msg

    with pytest.raises(ValueError):
        decode_dir(msg.pack([1, [[b"b", 2, b"t"], [b"a", 2, b"t"]]]))


class _Nodes:
    def __init__(self) -> None:
        self.blobs: dict[bytes, bytes] = {}

    def load(self, kind: Kind, plain_id: bytes) -> bytes:
        assert kind is Kind.NODE
        return self.blobs[plain_id]


@pytest.mark.parametrize("size", [0, 1, 5000, 120_000, 2_000_000])
def test_file_trees_round_trip_through_node_blobs(size: int) -> None:
    size = min(size, scaled(size, 300_000))
    data = random.Random(size).randbytes(size)
    tree = signature_of_bytes(data).tree
    ref = FileRef.of_tree(tree)
    assert ref.root == tree.root and ref.size == size
    nodes = _Nodes()
    for plain_id, blob in inner_nodes(tree):
        level, hashes, lengths = decode_node(blob)
        assert node_hash(level, hashes, lengths) == plain_id
        nodes.blobs[plain_id] = blob
    assert len(nodes.blobs) == sum(len(level) for level in tree.levels[1:-1])
    hashes, lengths = leaves(ref, nodes)
    assert hashes == tree.leaves.hashes and lengths == list(tree.leaves.lengths)


def test_meta_blobs_hold_every_entry_in_walk_order() -> None:
    tree = Entry("d", 0o755, 1, children={})
    tree.children["b"] = Entry("f", 0o600, 22)
    tree.children["a"] = Entry("d", 0o700, 33, children={"x": Entry("l", 0, 44, target="t")})
    plain_id, blob = encode_meta(tree)
    times, modes = decode_meta(blob)
    assert times == [33, 44, 22] and modes == [0o700, 0, 0o600]
    assert encode_meta(tree)[0] == plain_id


def test_sketches_find_an_edited_chunk_and_not_a_stranger() -> None:
    rng = random.Random(5)
    chunk = rng.randbytes(8000)
    edited = chunk[:4000] + b"edit" + chunk[4000:7990]
    a, b, c = chunk_sketch(chunk), chunk_sketch(edited), chunk_sketch(rng.randbytes(8000))
    assert a is not None and b is not None and c is not None
    assert set(features(a)) & set(features(b))
    assert not set(features(a)) & set(features(c))
    ranked = rank(a, [(b"e" * 32, b, 0), (b"s" * 32, c, 0), (b"d" * 32, b, 8)], max_depth=8)
    assert [sid for _, sid, _ in ranked] == [b"e" * 32]  # the stranger and the too deep go
    assert chunk_sketch(b"tiny") is None
