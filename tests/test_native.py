"""The compiled extension is what runs (outside the pure-Python run) and agrees with the
reference on its constants and keys."""

from __future__ import annotations

import random

import pytest

from rdc import _native
from rdc._native import chunker_ref, rabin

from .conftest import PURE


def test_compiled_extension_loaded() -> None:
    if PURE:
        assert _native.IMPLEMENTATION == "python"
        assert _native.Scanner is chunker_ref.ReferenceScanner
    else:
        from rdc._native import _blake3, _chunker

        assert _native.IMPLEMENTATION == "c"
        assert _native.Scanner is _chunker.Scanner
        assert _native.hash_chunks is _blake3.hash_chunks
        assert _chunker.__file__.endswith((".so", ".pyd"))
        assert _blake3.__file__.endswith((".so", ".pyd"))


def test_c_constants_and_keys_match_the_reference() -> None:
    _chunker = pytest.importorskip("rdc._native._chunker") if PURE else None
    if _chunker is None:
        from rdc._native import _chunker
    assert _chunker.gear_table() == chunker_ref.GEAR
    rng = random.Random(5)
    for window in (16, 32, 64):
        for _ in range(200):
            data = rng.randbytes(window)
            assert _chunker.ext(data) == chunker_ref.ext(data) == rabin.fingerprint(data)
            shift = 64 // window
            assert _chunker.lead(data, shift) == chunker_ref.lead(data, shift)


def test_scan_releases_the_gil() -> None:
    """Another thread runs while a long scan is in C: within the first half of the scan,
    where a held GIL would keep it waiting to the end (its switch interval is 5 ms, the
    scan about 100 times that)."""
    if PURE:
        pytest.skip("the pure-Python scanner holds the GIL by nature")
    import threading
    import time

    data = bytes(random.Random(8).randbytes(1 << 20)) * 256
    started = threading.Event()
    other_ran_at: list[float] = []

    def other() -> None:
        started.wait()
        other_ran_at.append(time.perf_counter())

    thread = threading.Thread(target=other)
    thread.start()
    scanner = _native.Scanner(32, 4096, 12288)
    scan_started_at = time.perf_counter()
    started.set()
    scanner.scan(data, 0, True)
    scan_seconds = time.perf_counter() - scan_started_at
    thread.join()
    assert other_ran_at[0] - scan_started_at < scan_seconds / 2
