"""The compiled extension is what runs (outside the pure-Python run) and agrees with the
reference on its constants and keys."""

from __future__ import annotations

import os
import platform
import random
import subprocess
import sys

import pytest

from rdc import _native
from rdc._native import chunker_ref, rabin

from .conftest import PURE


def test_compiled_extension_loaded() -> None:
    if PURE:
        assert _native.IMPLEMENTATION == "python"
        assert _native.Scanner is chunker_ref.ReferenceScanner
    else:
        from rdc._native import _blake3, _chunker, _entries, _listing

        assert _native.IMPLEMENTATION == "c"
        assert _native.Scanner is _chunker.Scanner
        assert _native.hash_chunks is _blake3.hash_chunks
        assert _native.list_dir is _listing.list_dir
        assert _native.unpack_sealed is _entries.unpack
        assert _native.seal_entries is _entries.seal
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


# ---------------------------------------------------------------- the chunker's code paths


def c_chunker():
    """The compiled chunker, also in the pure run where it was built."""
    if PURE:
        return pytest.importorskip("rdc._native._chunker")
    from rdc._native import _chunker

    return _chunker


def test_paths_are_the_portable_one_and_what_the_cpu_runs() -> None:
    _chunker = c_chunker()
    paths = _chunker.paths()
    assert paths[0] == "portable"
    assert set(paths) <= {"portable", "sse2", "avx2"}
    assert _chunker.default_path() in paths
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "sse2" in paths  # every x86-64 has it
    for path in paths:
        assert _chunker.Scanner(32, 64, 128, path=path).path == path
    assert _chunker.Scanner(32, 64, 128).path == _chunker.default_path()


def test_every_path_computes_ext_like_the_reference() -> None:
    _chunker = c_chunker()
    rng = random.Random(12)
    for path in _chunker.paths():
        for n in (16, 24, 32, 40, 48, 56, 64, 0, 5, 33):
            for _ in range(50):
                data = rng.randbytes(n)
                assert _chunker.ext(data, path=path) == chunker_ref.ext(data), (path, n)


def test_unknown_paths_and_sparse_settings_are_refused() -> None:
    _chunker = c_chunker()
    with pytest.raises(ValueError, match="paths"):
        _chunker.Scanner(32, 64, 128, path="neon9000")
    with pytest.raises(ValueError, match="paths"):
        _chunker.ext(bytes(32), path="neon9000")
    for bad in (-2, 256, 10**6):
        with pytest.raises(ValueError, match="sparse_lead"):
            _chunker.Scanner(32, 64, 128, sparse_lead=bad)
    with pytest.raises(TypeError):
        _chunker.Scanner(32, 64, 128, sparse_lead="0")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_environment_forces_a_path_for_the_whole_process() -> None:
    _chunker = c_chunker()
    code = (
        "from rdc._native import _chunker; "
        "print(_chunker.default_path(), _chunker.Scanner(32, 64, 128).path)"
    )
    for path in _chunker.paths():
        done = run_python(code, RDC_CHUNKER_PATH=path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [path, path]
    refused = run_python(code, RDC_CHUNKER_PATH="neon9000")
    assert refused.returncode != 0
    assert "RDC_CHUNKER_PATH=neon9000: not a code path this CPU can run" in refused.stderr
