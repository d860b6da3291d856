#!/usr/bin/env python3
"""Chunking throughput: rdc's C chunker on each code path this CPU runs, the same chunker
with the lead-byte filter off, and pyfastcdc at the same mean chunk size, on in-memory
inputs of six classes (random, zeros, periodic, text, and the sorted-key fixtures tiled).

Absolute figures on shared machines swing by 30% between runs; the ratios measured here in
one run do not. Runs of all contenders are interleaved, the best of each counts, and each
is timed by the CPU time of the thread that runs it (every contender scans on the calling
thread): wall time would also count other processes' turns on the core. Prints a table
and the load average; the last line is one JSON object.

    pip install -e '.[bench]'; python bench/chunking.py [--mib 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from rdc import _native
from rdc.params import DEFAULT_CHUNKS, ChunkParams

MIB = 1 << 20
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# The sorted-key fixtures are made for window 16 (fixtures/make_sorted_keys.py).
SORTED_PARAMS = ChunkParams(16, DEFAULT_CHUNKS.min_size, DEFAULT_CHUNKS.max_size)


def make_inputs(size: int) -> dict[str, tuple[bytes, ChunkParams]]:
    rng = random.Random(1)
    rand = b"".join(rng.randbytes(MIB) for _ in range(size // MIB))
    inputs = {
        "random": (rand, DEFAULT_CHUNKS),
        "zeros": (bytes(size), DEFAULT_CHUNKS),
        "periodic": (b"\x01\x02\x03\x04" * (size // 4), DEFAULT_CHUNKS),
        "text": (english_like(size), DEFAULT_CHUNKS),
    }
    for order in ("up", "down"):
        fixture = (FIXTURES / f"sorted_keys_{order}.bin").read_bytes()
        inputs[f"sorted-{order}"] = ((fixture * (size // len(fixture) + 1))[:size], SORTED_PARAMS)
    return inputs


def english_like(size: int) -> bytes:
    """Zipf-distributed words with punctuation and line breaks: text-like entropy (about
    4.5 bits per byte) without shipping a corpus."""
    rng = random.Random(2)
    vocabulary = (
        "the of and to a in is that it was for on are as with his they be at one have this "
        "from or had by hot word but what some we can out other were all there when up use "
        "your how said an each she which do their time if will way about many then them "
        "write would like so these her long make thing see him two has look more day could "
        "go come did number sound no most people my over know water than call first who may "
        "down side been now find any new work part take get place made live where after back "
        "little only round man year came show every good me give our under name very through "
        "just form sentence great think say help low line differ turn cause much mean before"
    ).split()
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    out = bytearray()
    while len(out) < size:
        words = rng.choices(vocabulary, weights, k=4096)
        for i in range(0, len(words), 12):
            sentence = " ".join(words[i : i + 12])
            out += sentence[:1].upper().encode() + sentence[1:].encode()
            out += b".\n" if rng.random() < 0.2 else b". "
    return bytes(out[:size])


def matching_avg_size(pyfastcdc, data: bytes, mean: float) -> int:
    """pyfastcdc's avg_size whose measured mean chunk size on ``data`` is ``mean``: start
    from its documented mean (avg_size + avg_size / 4) and correct twice on a sample."""
    sample = data[: 32 * MIB]
    avg = mean / 1.25
    for _ in range(2):
        count = sum(1 for _ in pyfastcdc.FastCDC(int(avg)).cut_buf(sample))
        avg *= mean / (len(sample) / count)
    return int(avg)


def rdc_scan(data: bytes, p: ChunkParams, **options) -> Callable[[], object]:
    def run() -> object:
        scanner = _native.Scanner(p.window, p.min_size, p.max_size, **options)
        return scanner, scanner.scan(data, 0, True)

    return run


def interleaved_best(
    jobs: dict[tuple[str, str], Callable[[], object]], runs: int
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], object]]:
    """CPU seconds of the fastest of ``runs`` runs of each job, the jobs taking turns so
    that a change in the machine's load hits all of them alike; and each job's last
    result."""
    best = dict.fromkeys(jobs, float("inf"))
    results: dict[tuple[str, str], object] = {}
    for _ in range(runs):
        for key, job in jobs.items():
            start = time.thread_time()
            results[key] = job()
            best[key] = min(best[key], time.thread_time() - start)
    return best, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="input size per class")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the best counts")
    args = ap.parse_args()
    if _native.IMPLEMENTATION != "c":
        raise SystemExit("the C extension is not loaded; unset RDC_PUREPYTHON")
    from rdc._native import _chunker

    size = args.mib * MIB
    inputs = make_inputs(size)
    paths = _chunker.paths()
    contenders = [*paths, "no filter"]
    try:
        import pyfastcdc
    except ImportError:
        pyfastcdc = None
        print("pyfastcdc not installed (pip install -e '.[bench]'): peer column left empty")
    else:
        contenders.append("pyfastcdc")

    jobs: dict[tuple[str, str], Callable[[], object]] = {}
    for name, (data, p) in inputs.items():
        for path in paths:
            jobs[name, path] = rdc_scan(data, p, path=path)
        if name == "random":  # slow by design: one class shows the filter's gain
            jobs[name, "no filter"] = rdc_scan(data, p, filter=False)
    fast = None
    if pyfastcdc is not None:
        mean = size / len(rdc_scan(inputs["random"][0], DEFAULT_CHUNKS)()[1])
        fast = pyfastcdc.FastCDC(matching_avg_size(pyfastcdc, inputs["random"][0], mean))
        for name, (data, _) in inputs.items():
            jobs[name, "pyfastcdc"] = lambda d=data: sum(1 for _ in fast.cut_buf(d))
    seconds, results = interleaved_best(jobs, args.runs)
    rate = {key: size / s / 1e6 for key, s in seconds.items()}

    best_path = _chunker.default_path()
    print(
        f"{args.mib} MiB per class, best of {args.runs} interleaved runs (thread CPU time); "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"params: window={DEFAULT_CHUNKS.window} min_size={DEFAULT_CHUNKS.min_size} "
        f"max_size={DEFAULT_CHUNKS.max_size} (sorted-*: window 16); MB/s"
    )
    head = f"{'class':<12}" + "".join(f"{c:>11}" for c in contenders)
    print(head + f"{'/pyfastcdc':>11}{'ext':>9}{'sparse':>8}{'dense':>7}{'reroll':>7}")
    table: dict[str, dict[str, object]] = {}
    for name in inputs:
        row = {c: rate.get((name, c)) for c in contenders}
        scanner, cuts = results[name, best_path]
        ratio = row[best_path] / row["pyfastcdc"] if row.get("pyfastcdc") else None
        table[name] = {
            "mbps": {c: round(v, 1) for c, v in row.items() if v},
            "vs_pyfastcdc": round(ratio, 3) if ratio else None,
            "ext_per_position": round(scanner.ext_evaluations / max(scanner.positions, 1), 6),
            "ext_per_byte": round(scanner.ext_evaluations / size, 6),
            "sparse_windows": scanner.sparse_windows,
            "dense_windows": scanner.dense_windows,
            "rerolled": scanner.rerolled,
            "mean_chunk": round(size / len(cuts)),
        }
        cells = "".join(f"{v:>11.0f}" if v else f"{'-':>11}" for v in row.values())
        info = table[name]
        print(
            f"{name:<12}{cells}{(f'{ratio:.2f}x' if ratio else '-'):>11}"
            f"{info['ext_per_byte']:>9.4%}{info['sparse_windows']:>8}"
            f"{info['dense_windows']:>7}{info['rerolled']:>7}"
        )
    print(
        f"/pyfastcdc: the {best_path} path over pyfastcdc on the same class (pyfastcdc's "
        f"avg_size matched to rdc's mean chunk on random, {table['random']['mean_chunk']} "
        "bytes); ext: positions whose Rabin key was evaluated, per byte; sparse, dense, "
        "reroll: windows decided from the sparse roll, from stored leads, and sparse ones "
        "rolled again"
    )
    print(
        json.dumps(
            {
                "classes": table,
                "paths": paths,
                "default_path": best_path,
                "params": {
                    "window": DEFAULT_CHUNKS.window,
                    "min_size": DEFAULT_CHUNKS.min_size,
                    "max_size": DEFAULT_CHUNKS.max_size,
                },
                "mib": args.mib,
                "runs": args.runs,
                "loadavg": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
