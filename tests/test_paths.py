"""check_relpath accepts exactly what a plain model of a safe relative path accepts."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rdc.errors import RdcError
from rdc.local.paths import (
    MAX_NAME,
    MAX_PATH,
    PathError,
    check_relpath,
    is_temporary,
    join,
    name,
    parent,
    temporary_name,
    to_wire,
)

TEMP = ".rdc-tmp-0123456789abcdef-x"


def model_accepts(raw: bytes) -> bool:
    """The spec, written as directly as possible."""
    if not raw or len(raw) > 4096 or raw.startswith(b"/") or b"\0" in raw:
        return False
    for part in raw.split(b"/"):
        if part in (b"", b".", b"..") or len(part) > 255:
            return False
        if re.match(rb"\.rdc-tmp-[0-9a-f]{16}-", part):
            return False
    return True


# Paths built from pieces that hit every rule, plus arbitrary bytes.
pieces = st.sampled_from(
    [b"a", b"b", b"/", b".", b"..", b"\0", b"\xff", b"\xc3\xa9", b"\n", b"\\",
     b"x" * 200, b"y" * 56, b".rdc-tmp-", b"0123456789abcdef-", TEMP.encode()]
)
built = st.lists(pieces, max_size=30).map(b"".join)
paths = st.one_of(built, st.binary(max_size=300))


@given(paths)
@example(b"a" * 255)
@example(b"a" * 256)
@example(b"/".join([b"a" * 255] * 16) + b"/" + b"b" * 4)  # 4096 bytes exactly
@example(b"/".join([b"a" * 255] * 16) + b"/" + b"b" * 5)
@example(b"a/")
@example(b".a/..b/...")
def test_bytes_accepted_exactly_as_model(raw: bytes) -> None:
    if model_accepts(raw):
        rel = check_relpath(raw)
        assert isinstance(rel, str)
        assert os.fsencode(rel) == raw  # round trip, any bytes
        assert to_wire(rel) == raw
        assert check_relpath(rel) == rel  # str form is accepted as is
    else:
        with pytest.raises(PathError):
            check_relpath(raw)


@given(st.text(max_size=100))
def test_str_agrees_with_bytes(text: str) -> None:
    raw = os.fsencode(text)
    if model_accepts(raw):
        assert check_relpath(text) == text
    else:
        with pytest.raises(PathError):
            check_relpath(text)


@pytest.mark.parametrize(
    "bad",
    ["/etc/passwd", "/", "a//b", "a/", "./a", "a/.", "..", "a/../b", "a/..", "a\0b",
     b"/x", b"a/\0", "x" * 256, "é" * 128, "a/" * 2048 + "b", TEMP, f"d/{TEMP}/f", ""],
)
def test_rejected(bad: str | bytes) -> None:
    with pytest.raises(PathError) as info:
        check_relpath(bad)
    assert isinstance(info.value, RdcError)
    assert info.value.exit_code == 3
    assert str(info.value).startswith("unsafe path ")


@pytest.mark.parametrize("bad", [None, 5, ["a"], bytearray(b"a"), memoryview(b"a")])
def test_non_path_types_rejected(bad: object) -> None:
    with pytest.raises(PathError, match="str or bytes"):
        check_relpath(bad)  # type: ignore[arg-type]


def test_accepted_edge_cases() -> None:
    assert check_relpath("x" * MAX_NAME) == "x" * MAX_NAME
    assert check_relpath("é" * 127) == "é" * 127  # 254 bytes
    assert check_relpath("...") == "..."
    assert check_relpath(".hidden/..x/a b/c\\d/\n") == ".hidden/..x/a b/c\\d/\n"
    assert check_relpath(".rdc-tmp-notes") == ".rdc-tmp-notes"  # not rdc's shape
    deep = "/".join(["ab"] * (MAX_PATH // 3)) + "/c"
    assert check_relpath(deep) == deep


def test_root_only_when_allowed() -> None:
    with pytest.raises(PathError, match="empty path"):
        check_relpath("")
    assert check_relpath("", allow_root=True) == ""
    assert check_relpath(b"", allow_root=True) == ""


def test_non_utf8_round_trip() -> None:
    raw = b"caf\xe9/\xff\xfe.bin"
    rel = check_relpath(raw)
    assert rel == "caf\udce9/\udcff\udcfe.bin"
    assert to_wire(rel) == raw
    assert check_relpath(rel) == rel


def test_unencodable_str_rejected() -> None:
    with pytest.raises(PathError, match="not encodable"):
        check_relpath("a\ud800b")  # a lone surrogate that surrogateescape cannot carry


def test_message_is_bounded_and_escaped() -> None:
    with pytest.raises(PathError) as info:
        check_relpath("\x1b[2J/" * 2000)
    message = str(info.value)
    assert len(message) < 300
    assert "\x1b" not in message  # control characters are shown escaped


def test_helpers() -> None:
    assert join("", "a") == "a"
    assert join("a/b", "c") == "a/b/c"
    assert parent("a/b/c") == "a/b"
    assert parent("a") == ""
    assert name("a/b/c") == "c"
    assert name("a") == "a"


def test_temporary_names() -> None:
    tmp = temporary_name("file.txt")
    assert is_temporary(tmp)
    assert tmp.endswith("-file.txt")
    assert temporary_name("file.txt") != tmp
    assert not is_temporary("file.txt")
    assert not is_temporary(".rdc-tmp-xyz-file")
    assert not is_temporary("a.rdc-tmp-0123456789abcdef-x")


@given(st.binary(min_size=1, max_size=MAX_NAME).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_temporary_name_fits(raw: bytes) -> None:
    tmp = temporary_name(os.fsdecode(raw))
    encoded = os.fsencode(tmp)
    assert len(encoded) <= MAX_NAME
    assert is_temporary(tmp)
    assert b"/" not in encoded and b"\0" not in encoded
    # The name survives the cut intact when it fits.
    if len(raw) <= MAX_NAME - 26:
        assert encoded.endswith(b"-" + raw)
