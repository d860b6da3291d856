"""Support for the repository tests: source trees with every kind of entry, the ``rdc``
command run in this process, and a repository's objects listed."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from rdc.storage import open_store
from rdc_client.cli import main

from .conftest import scaled
from .e2e_support import random_file, stamp_times

PASSWORD = "correct horse battery staple"


def make_tree(root: Path, seed: int, big: int | None = None) -> Path:
    """A tree with nested and empty directories, files of 0 bytes to a few chunks (and one
    of ``big`` bytes), odd modes, symlinks (relative, absolute, dangling), a non-UTF-8 name,
    and times with nanoseconds. Everything is stamped old enough not to be racy."""
    rng = random.Random(seed)
    big = scaled(3 << 20, 200_000) if big is None else big
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "deep" / "a" / "b" / "c").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_bytes(b"")
    for i in range(scaled(40, 12)):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "rdc", "chunk"])
                         for _ in range(rng.randrange(10, 3000)))
        (root / "src" / "pkg" / f"mod{i}.py").write_text(f"# module {i}\n{words}\n")
    random_file(root / "deep" / "a" / "b" / "c" / "big.bin", big, seed)
    (root / "deep" / "a" / "tiny").write_bytes(b"x")
    (root / os.fsdecode(b"caf\xe9-\xff.txt")).write_bytes(b"not UTF-8 named\n")
    (root / "secret").write_bytes(b"private\n")
    os.chmod(root / "secret", 0o600)
    (root / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "readonly.txt").write_bytes(b"read only\n")
    os.chmod(root / "readonly.txt", 0o444)
    os.symlink("src/pkg/mod1.py", root / "link-relative")
    os.symlink("/etc/hostname", root / "link-absolute")
    os.symlink("nowhere/at/all", root / "link-dangling")
    (root / "locked").mkdir()
    (root / "locked" / "inside").write_bytes(b"in a 0555 directory\n")
    stamp_times(root, seed)
    os.chmod(root / "locked", 0o555)
    os.utime(root, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``rdc ARGS`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def objects(location: str) -> dict[str, int]:
    """Every object of a store: name -> size."""
    return {info.name: info.size for info in open_store(location).list()}


def root_meta(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mode & 0o7777, st.st_mtime_ns
