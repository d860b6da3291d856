"""A small buffer's signature in one native call (rdc._native._sign) is the signature the
step-by-step path makes: every tree level, bit for bit, and the sketch."""

from __future__ import annotations

import os
import random
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc import _native
from rdc.content import signature
from rdc.content.leaves import SEGMENT_SIZE, segments_of_buffer
from rdc.content.tree import build_tree, pack_tree
from rdc.params import (
    DEFAULT_SIGNATURE,
    MID_PARAMS,
    ChunkParams,
    GroupParams,
    SignatureParams,
)

from .conftest import PURE

_sign = pytest.importorskip("rdc._native._sign") if PURE else None
if _sign is None:
    from rdc._native import _sign

KINDS = ("random", "zeros", "text", "repeats")


def data_of(kind: str, size: int, rng: random.Random) -> bytes:
    if kind == "random":
        return rng.randbytes(size)
    if kind == "zeros":
        return bytes(size)
    if kind == "text":
        words = [b"alpha ", b"beta\n", b"gamma, ", b"delta; ", b"%d " % rng.randrange(999)]
        return b"".join(rng.choice(words) for _ in range(size // 5 + 1))[:size]
    block = rng.randbytes(rng.randrange(1, 5000))
    return (block * (size // len(block) + 1))[:size]


params = st.sampled_from([
    DEFAULT_SIGNATURE,
    SignatureParams(chunks=MID_PARAMS),  # many chunks: several tree levels
    SignatureParams(chunks=ChunkParams(16, 64, 256), groups=GroupParams(2, 5),
                    sub_chunks=ChunkParams(64, 100, 1000)),
])


def step_by_step(data: bytes, p: SignatureParams) -> signature.FileSignature:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_native, "sign_buffer", None)
        return signature._signature(segments_of_buffer(data, SEGMENT_SIZE), p)


@given(st.sampled_from(KINDS), st.integers(0, 300_000), st.integers(0, 2**32), params)
def test_one_call_makes_the_same_tree_and_sketch(kind: str, size: int, seed: int,
                                                 p: SignatureParams) -> None:
    data = data_of(kind, size, random.Random(seed))
    want = step_by_step(data, p)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_native, "sign_buffer", _sign.sign)
        assert signature.signature_of_bytes(data, p) == want
        assert signature.tree_of_bytes(data, p) == want.tree
        assert want.tree == build_tree(want.tree.leaves, p.groups)


@pytest.mark.parametrize("size", [0, 1, 4096, 4097, 12288, 98304, 98305, SEGMENT_SIZE])
def test_the_edges_of_the_sizes(size: int) -> None:
    """An empty buffer (its root the node over nothing), one chunk, the largest that is
    sketched over its sub-chunks and the smallest that is not, a whole segment."""
    data = data_of("random", size, random.Random(size))
    levels, traits = _sign.sign(data, (32, 4096, 12288), (16, 48, 320), (4, 12), 8,
                                b"rdc 2026-11 merkle tree node v1")
    want = step_by_step(data, DEFAULT_SIGNATURE)
    assert [(level.hashes, level.lengths) for level in want.tree.levels] == levels
    assert traits == want.sketch


def test_bad_parameters_are_a_value_error() -> None:
    context = b"rdc 2026-11 merkle tree node v1"
    for chunks, groups in (((32, 4096, 4096), (4, 12)), ((33, 4096, 12288), (4, 12)),
                           ((32, 4096, 12288), (5, 5)), ((32, 4096, 12288), (0, 12))):
        with pytest.raises(ValueError):
            _sign.sign(b"x" * 5000, chunks, (16, 48, 320), groups, 8,
                       context)


def test_the_selected_implementation_is_the_compiled_one() -> None:
    assert _native.sign_buffer is (None if PURE else _sign.sign)


def test_a_small_file_is_read_whole_and_signed_in_one_call(tmp_path, monkeypatch) -> None:
    """A regular file of at most ``read_size`` bytes: one read, one native call, the same
    signature; one that grows past it between its size and its read is streamed after all
    (signed as it is then)."""
    import io

    data = random.Random(3).randbytes(50_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    calls: list[int] = []
    real = _sign.sign
    monkeypatch.setattr(_native, "sign_buffer", lambda d, *a: calls.append(len(d)) or real(d, *a))
    with open(path, "rb") as f:
        assert signature.signature_of_file(f) == step_by_step(data, DEFAULT_SIGNATURE)
    assert calls == [len(data)]

    class Growing(io.BufferedReader):
        grew = False

        def read(self, n: int | None = -1) -> bytes:
            if not self.grew:  # (once)
                self.grew = True
                with open(path, "ab") as out:
                    out.write(b"more" * 2000)
            return super().read(n)

    calls.clear()
    with Growing(io.FileIO(path)) as f:
        grown = signature.signature_of_file(f, read_size=52_000)
    assert f.grew
    assert calls == [] and grown == step_by_step(path.read_bytes(), DEFAULT_SIGNATURE)


def row(path: bytes, full, signed: signature.FileSignature, racy: int) -> tuple:
    """The index row `index_rows_of_files` gives of the file at ``full``, named ``path``."""
    st = os.lstat(full)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, signed.root, signed.sketch,
            pack_tree(signed.tree), racy)


def _fields(path) -> tuple[int, int, int, int]:
    st = os.lstat(path)
    return st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino


@given(sizes=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40_000)), max_size=12),
       kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1),
       racy=st.sampled_from(["none", "all", "some"]))
@settings(max_examples=25, deadline=None)
def test_many_small_files_read_and_signed_at_once_are_signed_as_one_at_a_time(
    sizes: list[tuple[int, int]], kind: str, seed: int, racy: str,
) -> None:
    """`sign_files` over files in several directories (one descriptor each, a name given
    twice too): each result is that file's index row (its path as given, the name read its
    last component; racy from the given time on); with ``keep``
    (`signatures_and_contents_of_files`), its stat fields, its signature unpacked and the
    bytes read."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as top:
        fds = []
        for d in range(3):
            os.mkdir(os.path.join(top, f"d{d}"))
            fds.append(os.open(os.path.join(top, f"d{d}"), os.O_RDONLY | os.O_DIRECTORY))
        try:
            files, contents = [], []
            for i, (d, size) in enumerate(sizes):
                data = data_of(kind, size, rng)
                name = f"f{i % 5}"  # (a name written again: the last content counts)
                with open(os.path.join(top, f"d{d}", name), "wb") as out:
                    out.write(data)
                files.append((d, name))
            times = []
            for d, name in files:
                with open(os.path.join(top, f"d{d}", name), "rb") as f:
                    contents.append(f.read())
                times.append(os.lstat(os.path.join(top, f"d{d}", name)).st_mtime_ns)
            racy_from = {"none": 2**63 - 1, "all": -(2**63),
                         "some": sorted(times)[len(times) // 2] if times else 0}[racy]
            with pytest.MonkeyPatch.context() as patch:  # (also in the pure run)
                patch.setattr(_native, "sign_files", _sign.sign_files)
                got = signature.index_rows_of_files(
                    [(fds[d], f"d{d}/{name}".encode()) for d, name in files], 40_000, racy_from)
                kept = signature.signatures_and_contents_of_files(
                    [(fds[d], name.encode()) for d, name in files], 40_000)
            assert got is not None and len(got) == len(files)
            assert kept is not None and len(kept) == len(files)
            for (d, name), data, one, read, time_ns in zip(files, contents, got, kept, times,
                                                           strict=True):
                assert one is not None and read is not None
                full = os.path.join(top, f"d{d}", name)
                signed = step_by_step(data, DEFAULT_SIGNATURE)
                assert one == row(f"d{d}/{name}".encode(), full, signed,
                                  int(time_ns >= racy_from))
                assert read == (_fields(full), signed, _fields(full), data)
        finally:
            for fd in fds:
                os.close(fd)


def test_a_file_whose_stamp_moves_while_it_is_read_gets_a_racy_row(tmp_path, monkeypatch
                                                                   ) -> None:
    """The stat after the native read is compared with the one before: a file whose time
    another thread keeps moving is sooner or later caught moving, and its row is racy
    (from that alone: the racy time given is far ahead)."""
    (tmp_path / "f").write_bytes(os.urandom(200_000))
    monkeypatch.setattr(_native, "sign_files", _sign.sign_files)  # (also in the pure run)
    stop = threading.Event()

    def touch() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            os.utime(tmp_path / "f", ns=(k, k))

    toucher = threading.Thread(target=touch)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    seen = set()
    try:
        toucher.start()
        try:
            for _ in range(5000):
                rows = signature.index_rows_of_files([(fd, b"f")], 256 << 10, 2**62)
                assert rows is not None
                if rows[0] is not None:
                    seen.add(rows[0][-1])
                if 1 in seen:
                    break
        finally:
            stop.set()
            toucher.join()
        assert 1 in seen
        quiet = signature.index_rows_of_files([(fd, b"f")], 256 << 10, 2**62)
        assert quiet is not None and quiet[0] is not None and quiet[0][-1] == 0
    finally:
        os.close(fd)


def test_sign_files_leaves_all_but_clean_small_regular_files_to_the_caller(tmp_path, monkeypatch
                                                                          ) -> None:
    """Anything the one-file path has a precise error or another way for gets None: a
    link (not followed), a directory, a FIFO (not opened), nothing there, a file over the
    limit, a directory descriptor that is not one. Names are one path component."""
    (tmp_path / "ok").write_bytes(b"fine" * 100)
    (tmp_path / "big").write_bytes(b"x" * 1001)
    (tmp_path / "link").symlink_to("ok")
    (tmp_path / "sub").mkdir()
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setattr(_native, "sign_files", _sign.sign_files)  # (also in the pure run)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = [b"ok", b"big", b"link", b"sub", b"fifo", b"missing", b"ok/missing"]
        got = signature.index_rows_of_files(
            [(fd, n) for n in names] + [(-1, b"ok")], 1000, 0)
        assert got is not None
        assert [one is not None for one in got] == [True] + [False] * 7
        fine = step_by_step(b"fine" * 100, DEFAULT_SIGNATURE)
        assert got[0] == row(b"ok", tmp_path / "ok", fine, 1)
        # The path is the row's; only its last component is looked up, in the directory given.
        assert signature.index_rows_of_files([(fd, b"any/where/ok")], 1000, 2**62) == [
            row(b"any/where/ok", tmp_path / "ok", fine, 0)]
        kept = signature.signatures_and_contents_of_files(
            [(fd, n) for n in names] + [(-1, b"ok")], 1000)
        assert kept is not None and [one is not None for one in kept] == [True] + [False] * 7
        assert kept[0][1:] == (fine, _fields(tmp_path / "ok"), b"fine" * 100)
        for bad in (b"sub/", b"", b"a\0b", b"x/..", b"."):
            with pytest.raises(ValueError, match="must end in a file's name"):
                signature.index_rows_of_files([(fd, bad)], 1000, 0)
        with pytest.raises(TypeError):
            signature.index_rows_of_files([(fd, "ok")], 1000, 0)  # type: ignore[list-item]
    finally:
        os.close(fd)
