"""``rdc chunk``: output forms, and clear errors instead of tracebacks."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

from rdc.content.chunking import boundaries
from rdc_client.cli import main


def write(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_list_prints_offset_and_length_of_every_chunk(tmp_path, capsys) -> None:
    data = random.Random(1).randbytes(100_000)
    path = write(tmp_path, "f.bin", data)
    assert main(["chunk", "--list", path]) == 0
    lines = capsys.readouterr().out.split("\n")[:-1]
    ends = boundaries(data)
    assert lines == [f"{a} {b - a}" for a, b in zip([0, *ends], ends, strict=False)]


def test_json_reports_the_size_distribution(tmp_path, capsys) -> None:
    data = random.Random(2).randbytes(200_000)
    path = write(tmp_path, "f.bin", data)
    assert main(["chunk", "--json", path]) == 0
    doc = json.loads(capsys.readouterr().out)
    (report,) = doc["files"]
    ends = boundaries(data)
    lengths = sorted(b - a for a, b in zip([0, *ends], ends, strict=False))
    assert report["bytes"] == len(data)
    assert report["chunks"] == len(lengths)
    assert (report["min"], report["max"]) == (lengths[0], lengths[-1])
    assert abs(report["mean"] - len(data) / len(lengths)) < 0.1
    assert lengths[0] <= report["median"] <= report["p99"] <= lengths[-1]
    assert report["mb_per_s"] > 0
    assert doc["params"] == {"window": 32, "min_size": 4096, "max_size": 12288}


def test_human_output_names_each_file(tmp_path, capsys) -> None:
    a = write(tmp_path, "a.txt", b"hello world\n" * 5000)
    b = write(tmp_path, "empty", b"")
    assert main(["chunk", a, b]) == 0
    out = capsys.readouterr().out
    assert f"{a}: 60,000 bytes" in out
    assert f"{b}: empty, 0 chunks" in out


def test_missing_and_unreadable_files_are_errors_not_tracebacks(tmp_path, capsys) -> None:
    good = write(tmp_path, "good", b"x" * 10)
    status = main(["chunk", str(tmp_path / "missing"), str(tmp_path), good])
    captured = capsys.readouterr()
    assert status == 3
    assert "cannot read" in captured.err and "missing" in captured.err
    assert "Is a directory" in captured.err
    assert "Traceback" not in captured.err
    assert f"{good}: 10 bytes" in captured.out


def test_bad_parameters_are_a_usage_error(tmp_path, capsys) -> None:
    path = write(tmp_path, "f", b"abc")
    assert main(["chunk", "--min-size", "8", path]) == 2
    assert "min_size" in capsys.readouterr().err


def test_the_installed_command_runs(tmp_path) -> None:
    path = write(tmp_path, "f", random.Random(3).randbytes(50_000))
    rdc = os.path.join(os.path.dirname(sys.executable), "rdc")
    result = subprocess.run(
        [rdc, "chunk", "--json", path], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout)["files"][0]["bytes"] == 50_000


def test_list_into_a_closed_pipe_stops_quietly(tmp_path) -> None:
    path = write(tmp_path, "f", random.Random(4).randbytes(2_000_000))
    rdc = os.path.join(os.path.dirname(sys.executable), "rdc")
    result = subprocess.run(
        f"'{rdc}' chunk --list '{path}' | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.count("\n") == 1
    assert result.stderr == ""


def test_version_is_the_installed_one(capsys) -> None:
    """``rdc --version`` and the handshake's agent read rdc.__version__, which must agree
    with the version pyproject.toml installed."""
    from importlib import metadata

    import pytest

    import rdc
    from rdc.wire.handshake import agent

    assert rdc.__version__ == metadata.version("rdc")
    assert agent() == f"rdc/{rdc.__version__}"
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"rdc {rdc.__version__}\n"
