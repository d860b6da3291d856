"""Generated test trees: source-like files of realistic sizes, and scattered small edits
like ``../shared/bench/make_scattered.py`` makes (a version string on every page)."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

WORDS = (
    "self return import from class def if else for in while with as try except raise "
    "value result request response model field query template context settings user "
    "name path data list dict none true false count index item key error message test"
).split()


def source_file(rng: random.Random, size: int) -> bytes:
    lines = []
    total = 0
    depth = 0
    while total < size:
        indent = "    " * depth
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
        line = f"{indent}{words}{':' if rng.random() < 0.2 else ''}\n"
        depth = max(0, min(4, depth + rng.choice((-1, 0, 0, 1))))
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size]


def make_source_tree(root: str | os.PathLike[str], files: int = 300, seed: int = 1) -> None:
    """Files of 200 bytes to 80 KB (log-uniform, like a source release) in a few
    directories, with old mtimes."""
    rng = random.Random(seed)
    for i in range(files):
        size = int(math.exp(rng.uniform(math.log(200), math.log(80_000))))
        path = Path(root) / f"pkg{i % 7}" / f"sub{i % 3}" / f"module_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source_file(rng, size))
        os.utime(path, ns=(1_600_000_000 * 10**9,) * 2)


def scatter_edits(root: str | os.PathLike[str], seed: int = 3, fraction: float = 0.25) -> int:
    """In about ``fraction`` of the files, replace 1 to 6 short runs at random places with
    words of another length. Returns the number of files edited."""
    rng = random.Random(seed)
    edited = 0
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        data = path.read_bytes()
        if len(data) < 200 or rng.random() >= fraction:
            continue
        buf = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(buf) - 8)
            buf[pos : pos + rng.randint(1, 6)] = rng.choice(
                [b"5.1.0rc1", b"v2", b"release-2026", b"X"]
            )
        path.write_bytes(bytes(buf))
        edited += 1
    return edited
