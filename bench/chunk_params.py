#!/usr/bin/env python3
"""Pick chunking parameters by measurement: chunk-size distribution, chunking speed, and
how much of an edited file is found again among the old file's chunks.

For each parameter set: mean and coefficient of variation of chunk sizes (random data and
a Django tar), MB/s on random data, and the literal bytes (new content in chunks the old
version lacks) for consecutive Django release tars and the 256 MiB file with 10 edits from
``../shared/bench/make_corpus.sh``. Last line: one JSON object.

    bench/chunk_params.py [--corpus /tmp/corpus]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from pathlib import Path

import blake3

from rdc.content.chunking import boundaries
from rdc.params import ChunkParams

CANDIDATES = [
    ChunkParams(32, 1024, 7168),
    ChunkParams(32, 2048, 10240),
    ChunkParams(16, 2048, 14336),
    ChunkParams(32, 2048, 14336),
    ChunkParams(64, 2048, 14336),
    ChunkParams(32, 4096, 12288),
    ChunkParams(32, 3072, 16384),
    ChunkParams(32, 4096, 20480),
]
DJANGO = ["5.0.1", "5.0.2", "5.0.3", "5.0.4", "5.0.6", "5.0.7"]


def chunk_hashes(data: bytes, params: ChunkParams) -> tuple[list[int], dict[bytes, int]]:
    ends = boundaries(data, params)
    hashes: dict[bytes, int] = {}
    start = 0
    for end in ends:
        hashes[blake3.blake3(data[start:end]).digest()] = end - start
        start = end
    return [b - a for a, b in zip([0, *ends], ends, strict=False)], hashes


def literal_bytes(old: bytes, new: bytes, params: ChunkParams) -> int:
    _, old_hashes = chunk_hashes(old, params)
    _, new_hashes = chunk_hashes(new, params)
    return sum(n for h, n in new_hashes.items() if h not in old_hashes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/corpus"))
    ap.add_argument("--random-mib", type=int, default=64)
    args = ap.parse_args()
    rng = random.Random(1)
    rand = b"".join(rng.randbytes(1 << 20) for _ in range(args.random_mib))
    tars = [(args.corpus / "tar" / f"django-{v}.tar").read_bytes() for v in DJANGO]
    big_old = (args.corpus / "bigbin" / "orig.bin").read_bytes()
    big_new = (args.corpus / "bigbin" / "edited.bin").read_bytes()
    results = []
    print(
        f"{'params':>18} {'MB/s':>6} {'mean':>6} {'cv':>5} {'tar mean':>8} "
        f"{'django literal':>14} {'bigbin literal':>14} {'chunks/MB':>9}"
    )
    for p in CANDIDATES:
        start = time.perf_counter()
        ends = boundaries(rand, p)
        mbps = len(rand) / (time.perf_counter() - start) / 1e6
        sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)][:-1]
        tar_sizes, _ = chunk_hashes(tars[-1], p)
        django = sum(literal_bytes(a, b, p) for a, b in itertools.pairwise(tars))
        big = literal_bytes(big_old, big_new, p)
        row = {
            "window": p.window,
            "min_size": p.min_size,
            "max_size": p.max_size,
            "mbps_random": round(mbps),
            "mean_random": round(statistics.fmean(sizes)),
            "cv_random": round(statistics.pstdev(sizes) / statistics.fmean(sizes), 3),
            "mean_tar": round(statistics.fmean(tar_sizes)),
            "django_literal": django,
            "bigbin_literal": big,
            "chunks_per_mb": round(1e6 / statistics.fmean(sizes), 1),
        }
        results.append(row)
        print(
            f"{p.window:>4}/{p.min_size:>5}/{p.max_size:>5} {row['mbps_random']:>6} "
            f"{row['mean_random']:>6} {row['cv_random']:>5} {row['mean_tar']:>8} "
            f"{django:>14,} {big:>14,} {row['chunks_per_mb']:>9}"
        )
    print(json.dumps({"candidates": results}))


if __name__ == "__main__":
    main()
