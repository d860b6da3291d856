"""The pieces of issue 13 on their own: bytes checked against their signature as they are
read (property tests), the deletion guards' rules, the folder marker, the names of
partial files, and two-way sync's notion of damage."""

from __future__ import annotations

import argparse
import os
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc.content.check import LeafCheck, Mismatch, matches
from rdc.content.signature import signature_of_bytes
from rdc.errors import UsageError
from rdc.local import marker
from rdc.local.paths import temporary_name
from rdc.local.snapshot import EMPTY_CONTENT, Entry, seal
from rdc.transfer import guards
from rdc.transfer.resume import _candidates
from rdc.transfer.sides import Local
from rdc.transfer.stats import Options
from rdc.transfer.twoway import State, damaged
from rdc.wire import messages as m
from rdc_server.config import load

# ---------------------------------------------------------------- LeafCheck

DATA = st.binary(min_size=0, max_size=60_000)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in pairwise(points)]


@given(DATA, st.lists(st.integers(min_value=0), max_size=12))
def test_the_right_bytes_pass_however_they_are_cut(data: bytes, cuts: list[int]) -> None:
    check = LeafCheck(signature_of_bytes(data).tree)
    for piece in pieces(data, cuts):
        check.feed(piece)
    check.finish()
    assert matches(signature_of_bytes(data).tree, data)


@given(DATA.filter(bool), st.integers(min_value=0), st.integers(min_value=1, max_value=255),
       st.lists(st.integers(min_value=0), max_size=8))
def test_one_changed_byte_is_found_however_they_are_cut(
    data: bytes, at: int, flip: int, cuts: list[int]
) -> None:
    tree = signature_of_bytes(data).tree
    at %= len(data)
    bad = data[:at] + bytes([data[at] ^ flip]) + data[at + 1 :]
    check = LeafCheck(tree)
    with pytest.raises(Mismatch):
        for piece in pieces(bad, cuts):
            check.feed(piece)
        check.finish()
    assert not matches(tree, bad)


@given(DATA, st.binary(min_size=1, max_size=100))
def test_shorter_or_longer_is_a_mismatch(data: bytes, extra: bytes) -> None:
    tree = signature_of_bytes(data).tree
    assert not matches(tree, data + extra)
    if data:
        assert not matches(tree, data[:-1])


# ---------------------------------------------------------------- the guards

def size(entries: int, files: int) -> guards.Size:
    return guards.Size(entries, files)


@pytest.mark.parametrize(("source", "deleted", "total", "options", "why"), [
    (guards.Source("src"), size(0, 0), 10, Options(), None),
    (guards.Source("src", lost=True), size(0, 0), 10, Options(), None),  # nothing to delete
    (guards.Source("src", lost=True), size(1, 1), 100, Options(), "lost its folder marker"),
    (guards.Source("src", empty=True), size(1, 1), 100, Options(), "is empty"),
    (guards.Source("src", lost=True, empty=True), size(1, 1), 100, Options(force=True), None),
    (guards.Source("src"), size(5, 5), 100, Options(max_delete=4), "--max-delete 4"),
    (guards.Source("src"), size(4, 4), 100, Options(max_delete=4), None),
    (guards.Source("src"), size(1, 0), 100, Options(max_delete=0), "--max-delete 0"),
    (guards.Source("src"), size(9, 9), 100, Options(max_delete=4, force=True), None),
    (guards.Source("src"), size(10, 10), 12, Options(), None),  # at most DELETE_FREE
    (guards.Source("src"), size(11, 11), 22, Options(), None),  # exactly half
    (guards.Source("src"), size(12, 12), 22, Options(), "12 of the 22 files"),
    (guards.Source("src"), size(12, 12), 22, Options(force=True), None),
    (guards.Source("src"), size(500, 500), -1, Options(), None),  # total unknown
])
def test_refusal(source: guards.Source, deleted: guards.Size, total: int, options: Options,
                 why: str | None) -> None:
    said = guards.refusal(source, deleted, total, "the target", options)
    if why is None:
        assert said is None
    else:
        assert said is not None and why in said and "nothing was deleted" in said


def tree(spec: dict) -> Entry:
    root = Entry("d", 0o755, 0, children={})
    for name, value in spec.items():
        if isinstance(value, dict):
            root.children[name] = tree(value)
        else:
            root.children[name] = Entry(value, 0o644, 0, root=b"r" * 32, target="t")
    return root


async def test_size_of_counts_whole_subtrees() -> None:
    local = tree({"a": "f", "d": {"x": "f", "y": "l", "e": {"z": "f"}}, "keep": "f"})
    seal(local)
    side = Local(None, local)  # type: ignore[arg-type]  # listings come from the tree
    removals = [("a", m.Expected("f", b"")), ("d", m.Expected("d", b""))]
    assert await guards.size_of(side, removals) == guards.Size(entries=6, files=3)
    assert await guards.size_of(side, []) == guards.Size(0, 0)


def test_an_empty_directory_has_the_empty_content_hash() -> None:
    empty = Entry("d", 0o700, 123, children={})
    seal(empty)
    assert empty.content == EMPTY_CONTENT
    full = tree({"a": "f"})
    seal(full)
    assert full.content != EMPTY_CONTENT


# ---------------------------------------------------------------- the marker

def test_a_root_is_marked_once_it_has_content_and_then_remembered(tmp_path: Path) -> None:
    root, book = tmp_path / "root", marker.MarkerBook(tmp_path / "book")
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert marker.settle(fd, str(root), book) == marker.RootState(False)  # empty
        assert not (root / marker.MARKER).exists()
        (root / "file").write_bytes(b"x")
        assert marker.settle(fd, str(root), book, place=False) == marker.RootState(False)
        assert marker.settle(fd, str(root), book) == marker.RootState(True)
        assert (root / marker.MARKER).read_bytes() == marker.TEXT
        assert book.knows(str(root))
        os.unlink(root / marker.MARKER)
        assert marker.settle(fd, str(root), book) == marker.RootState(False, lost=True)
        assert not (root / marker.MARKER).exists()  # a lost marker is not put back
        (root / marker.MARKER).write_bytes(b"")  # by hand: any content will do
        assert marker.settle(fd, str(root), book) == marker.RootState(True)
    finally:
        os.close(fd)


def test_a_link_or_directory_is_no_marker(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.symlink("elsewhere", root / marker.MARKER)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert not marker.has_marker(fd)
        assert not marker.place_marker(fd)  # never replaces what is there
    finally:
        os.close(fd)


# ---------------------------------------------------------------- partial files' names

class _Replica:
    def __init__(self, temporaries: list[str]) -> None:
        self.temporaries = temporaries


def test_partials_are_found_by_the_name_they_were_made_for() -> None:
    long = "n" * 255
    temps = [f"d/{temporary_name('big.bin')}", f"d/{temporary_name('other.bin')}",
             temporary_name("big.bin"), f"d/{temporary_name(long)}", "d/.rdc-tmp-notes"]
    replica = _Replica(temps)
    assert _candidates(replica, "d/big.bin") == [temps[0].rpartition("/")[2]]  # type: ignore[arg-type]
    assert _candidates(replica, "big.bin") == [temps[2]]  # type: ignore[arg-type]
    assert _candidates(replica, f"d/{long}") == [temps[3].rpartition("/")[2]]  # type: ignore[arg-type]
    assert _candidates(replica, "d/missing") == []  # type: ignore[arg-type]


# ---------------------------------------------------------------- damage in two-way sync

def test_damage_is_new_content_under_the_old_time() -> None:
    base = State("f", 0o644, 100, b"a" * 8)
    assert damaged(State("f", 0o644, 100, b"b" * 8), base)
    assert not damaged(State("f", 0o644, 101, b"b" * 8), base)  # an edit
    assert not damaged(State("f", 0o600, 100, b"a" * 8), base)  # a mode change
    assert not damaged(None, base) and not damaged(State("f", 0o644, 100, b"b" * 8), None)
    assert not damaged(State("l", 0, 100, b"x"), State("l", 0, 100, b"y"))


# ---------------------------------------------------------------- the scrub's schedule


def test_the_scrub_schedule_from_the_config_file_or_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "share").mkdir()
    (tmp_path / "tokens").write_text("scrub-test-token-0001\n")

    def config(scrub_every: object, cli: str | None = None):
        toml = tmp_path / "rdc.toml"
        toml.write_text(f'token_file = "{tmp_path / "tokens"}"\n'
                        + (f"scrub_every = {scrub_every}\n" if scrub_every is not None else "")
                        + f'[shares]\ns = "{tmp_path / "share"}"\n')
        return load(argparse.Namespace(
            config=str(toml), listen=None, share=None, share_ro=None, token_file=None,
            state_dir=str(tmp_path / "state"), tls_cert=None, tls_key=None, scrub_every=cli))

    assert config(None).scrub_every is None  # never, unless asked
    assert config('"12h"').scrub_every == 12 * 3600
    assert config("90").scrub_every == 90  # a bare number: seconds
    assert config('"7d"', cli="30m").scrub_every == 1800  # the command line wins
    for bad in ('"0"', '"often"', '"-5m"', '"0.5s"'):
        with pytest.raises(UsageError, match="scrub interval"):
            config(bad)
