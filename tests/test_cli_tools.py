"""``rdc sig``, ``rdc similar`` and ``rdc delta``: what they report, and errors."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from rdc.content.chunking import chunks_of
from rdc.content.signature import signature_of_bytes
from rdc_client.cli import main

from .conftest import scaled
from .e2e_support import RDC


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_sig_reports_root_levels_and_sketch(tmp_path, capsys) -> None:
    data = random.Random(1).randbytes(300_000)
    (tmp_path / "f").write_bytes(data)
    assert main(["sig", "--json", str(tmp_path / "f")]) == 0
    info = json.loads(capsys.readouterr().out)
    signature = signature_of_bytes(data)
    assert info["root"] == signature.root.hex()
    assert info["chunks"] == len(signature.tree.leaves)
    assert [lv["nodes"] for lv in info["levels"]] == [len(lv) for lv in signature.tree.levels]
    assert info["sketch"] == list(signature.sketch)


def test_sig_of_a_missing_file_is_an_error(tmp_path, capsys) -> None:
    assert main(["sig", str(tmp_path / "nope")]) == 3
    assert "cannot read" in capsys.readouterr().err


def test_similar_groups_near_duplicates(tmp_path, capsys) -> None:
    rng = random.Random(2)
    base = rng.randbytes(400_000)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "original.bin").write_bytes(base)
    (tmp_path / "d" / "edited.bin").write_bytes(base[:100_000] + b"edit" + base[100_000:])
    (tmp_path / "d" / "unrelated.bin").write_bytes(rng.randbytes(400_000))
    assert main(["similar", "--json", "--no-progress", str(tmp_path / "d")]) == 0
    report = json.loads(capsys.readouterr().out)
    [group] = report["groups"]
    assert sorted(group["files"]) == ["edited.bin", "original.bin"]
    [pair] = group["pairs"]
    assert pair["jaccard"] > 0.9 and pair["matching_traits"] >= 8


def test_delta_reports_what_a_transfer_costs(tmp_path, capsys) -> None:
    rng = random.Random(3)
    old = rng.randbytes(1_000_000)
    new = old[:500_000] + b"a small insertion" + old[500_000:]
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    assert main(["delta", "--json", "--verify", str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["literal_bytes"] + report["matched_bytes"] == len(new)
    assert 0 < report["literal_bytes"] < 2048
    assert report["total_bytes"] == (report["signature_bytes"] + report["request_bytes"]
                                     + report["offer_bytes"] + report["data_message_bytes"])
    assert report["round_trips"] >= 3


def test_delta_over_a_directory_of_seeds_finds_a_renamed_file(tmp_path, capsys) -> None:
    data = random.Random(4).randbytes(200_000)
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds" / "old-name.bin").write_bytes(data)
    (tmp_path / "new.bin").write_bytes(data[:50_000] + b"!" + data[50_000:])
    assert main(["delta", "--json", "--no-progress", str(tmp_path / "seeds"),
                 str(tmp_path / "new.bin")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["matched_bytes"] > 190_000


def test_delta_lists_the_files_that_cost_the_most(tmp_path, capsys) -> None:
    rng = random.Random(5)
    for side in ("old", "new"):
        (tmp_path / side).mkdir()
    small, large = rng.randbytes(60_000), rng.randbytes(60_000)
    (tmp_path / "old" / "touched.bin").write_bytes(small)
    (tmp_path / "new" / "touched.bin").write_bytes(small[:100] + b"!" + small[100:])
    (tmp_path / "old" / "rewritten.bin").write_bytes(large)
    (tmp_path / "new" / "rewritten.bin").write_bytes(rng.randbytes(60_000))
    (tmp_path / "old" / "same.bin").write_bytes(large[:5_000])
    (tmp_path / "new" / "same.bin").write_bytes(large[:5_000])
    args = ["delta", "--no-progress", str(tmp_path / "old"), str(tmp_path / "new")]
    assert main([*args, "--json", "--files", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [f["path"] for f in report["costliest"]] == ["rewritten.bin", "touched.bin"]
    assert sum(f["total_bytes"] for f in report["costliest"]) == report["total_bytes"]
    assert report["costliest"][0]["literal_bytes"] == 60_000
    assert main([*args, "--files", "1"]) == 0
    out = capsys.readouterr().out
    assert "rewritten.bin" in out and "touched.bin" not in out
    assert main([*args, "--files", "-1"]) == 2


def test_delta_needs_two_directories_or_a_file_new(tmp_path, capsys) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "f").write_bytes(b"x")
    assert main(["delta", str(tmp_path / "f"), str(tmp_path / "a")]) == 2
    assert main(["delta", str(tmp_path / "missing"), str(tmp_path / "f")]) == 3


def test_an_index_another_rdc_keeps_locked_is_a_clear_error(tmp_path, capsys,
                                                             monkeypatch) -> None:
    import sqlite3

    import rdc.local.index.db
    from rdc.local.index import default_location

    data = tmp_path / "data"
    data.mkdir()
    (data / "a").write_bytes(random.Random(2).randbytes(50_000))
    assert main(["similar", str(data)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(rdc.local.index.db, "BUSY_TIMEOUT", 0.05)
    holder = sqlite3.connect(default_location(str(data)), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert main(["similar", str(data)]) == 1
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    err = capsys.readouterr().err
    assert err.startswith("rdc: the signature index: ") and "locked" in err, err
    assert main(["similar", str(data)]) == 0  # nothing was lost: the index is still there


def _program(*args: str, **kw) -> subprocess.CompletedProcess:
    """The ``rdc`` program itself (`rdc_client.cli.entry`), as a user runs it."""
    return subprocess.run([*RDC, *args], timeout=60, **kw)


def test_the_program_writes_all_its_output_and_keeps_its_exit_code(tmp_path) -> None:
    """It ends without Python's teardown: what it printed must still all arrive, and its
    exit code must be main's."""
    (tmp_path / "f").write_bytes(random.Random(4).randbytes(scaled(2_000_000, 400_000)))
    expected = [f"{c.offset} {c.length}" for c in chunks_of((tmp_path / "f").read_bytes())]
    done = _program("chunk", "--list", *[str(tmp_path / "f")] * 40, capture_output=True,
                    text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line and not line.startswith("==> ")] == expected * 40
    assert sum(line.startswith("==> ") for line in lines) == 40
    missing = _program("sig", str(tmp_path / "nope"), capture_output=True, text=True)
    assert missing.returncode == 3
    assert missing.stderr.startswith("rdc: cannot read")


def test_the_program_stops_quietly_when_its_reader_goes_away(tmp_path) -> None:
    (tmp_path / "f").write_bytes(random.Random(5).randbytes(2_000_000))
    with subprocess.Popen([*RDC, "chunk", "--list", *[str(tmp_path / "f")] * 200],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"==> ")
        proc.stdout.close()  # as `| head -1` does
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in err and b"Exception ignored" not in err
