#!/usr/bin/env python3
"""Chunking throughput: the C fast path, the same path with the lead-byte filter off, and
pyfastcdc at the same mean chunk size, on in-memory inputs of four classes.

Absolute figures on shared machines swing by 30% between runs; the ratios measured here in
one run do not. Prints a table; the last line is one JSON object.

    pip install -e '.[bench]'; python bench/chunking.py [--mib 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from rdc import _native
from rdc.params import DEFAULT_CHUNKS

MIB = 1 << 20


def make_inputs(size: int) -> dict[str, bytes]:
    rng = random.Random(1)
    rand = b"".join(rng.randbytes(MIB) for _ in range(size // MIB))
    return {
        "random": rand,
        "zeros": bytes(size),
        "periodic": b"\x01\x02\x03\x04" * (size // 4),
        "text": english_like(size),
    }


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


def best_rate(fn: Callable[[], object], size: int, runs: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return size / best / 1e6, result


def matching_avg_size(pyfastcdc, data: bytes, mean: float) -> int:
    """pyfastcdc's avg_size whose measured mean chunk size on ``data`` is ``mean``: start
    from its documented mean (avg_size + avg_size / 4) and correct twice on a sample."""
    sample = data[: 32 * MIB]
    avg = mean / 1.25
    for _ in range(2):
        count = sum(1 for _ in pyfastcdc.FastCDC(int(avg)).cut_buf(sample))
        avg *= mean / (len(sample) / count)
    return int(avg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="input size per class")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the best counts")
    args = ap.parse_args()
    if _native.IMPLEMENTATION != "c":
        raise SystemExit("the C extension is not loaded; unset RDC_PUREPYTHON")
    p = DEFAULT_CHUNKS
    size = args.mib * MIB
    inputs = make_inputs(size)
    rdc, nofilter = {}, {}
    ext_fraction = mean_chunk = 0.0
    for name, data in inputs.items():

        def scan(data: bytes = data, flt: bool = True) -> object:
            scanner = _native.Scanner(p.window, p.min_size, p.max_size, flt)
            return scanner, scanner.scan(data, 0, True)

        rdc[name], (scanner, cuts) = best_rate(scan, size, args.runs)
        nofilter[name], _ = best_rate(lambda s=scan: s(flt=False), size, max(1, args.runs - 1))
        if name == "random":
            ext_fraction = scanner.ext_evaluations / size
            mean_chunk = size / len(cuts)
    pyfastcdc_mbps = pyfastcdc_mean = None
    try:
        import pyfastcdc
    except ImportError:
        print("pyfastcdc not installed (pip install -e '.[bench]'): peer column left empty")
    else:
        fast = pyfastcdc.FastCDC(matching_avg_size(pyfastcdc, inputs["random"], mean_chunk))
        pyfastcdc_mbps, count = best_rate(
            lambda: sum(1 for _ in fast.cut_buf(inputs["random"])), size, args.runs
        )
        pyfastcdc_mean = size / count
    print(
        f"params: window={p.window} min_size={p.min_size} max_size={p.max_size}; "
        f"{args.mib} MiB per class, best of {args.runs}"
    )
    print(f"{'class':<10} {'rdc MB/s':>9} {'no filter':>10} {'filter gain':>12}")
    for name in inputs:
        print(
            f"{name:<10} {rdc[name]:>9.0f} {nofilter[name]:>10.0f} "
            f"{rdc[name] / nofilter[name]:>11.1f}x"
        )
    if pyfastcdc_mbps:
        print(
            f"pyfastcdc (random, mean chunk {pyfastcdc_mean:.0f}): {pyfastcdc_mbps:.0f} MB/s; "
            f"rdc/pyfastcdc = {rdc['random'] / pyfastcdc_mbps:.2f}"
        )
    print(
        f"ext evaluated at {ext_fraction:.4%} of positions (random); "
        f"mean chunk {mean_chunk:.0f} bytes"
    )
    print(
        json.dumps(
            {
                "rdc_mbps": {k: round(v, 1) for k, v in rdc.items()},
                "nofilter_mbps": {k: round(v, 1) for k, v in nofilter.items()},
                "pyfastcdc_mbps": round(pyfastcdc_mbps, 1) if pyfastcdc_mbps else None,
                "pyfastcdc_mean_chunk_bytes": round(pyfastcdc_mean) if pyfastcdc_mean else None,
                "rdc_vs_pyfastcdc": round(rdc["random"] / pyfastcdc_mbps, 3)
                if pyfastcdc_mbps
                else None,
                "ext_fraction_random": round(ext_fraction, 6),
                "mean_chunk_bytes": round(mean_chunk),
                "params": {"window": p.window, "min_size": p.min_size, "max_size": p.max_size},
                "mib": args.mib,
            }
        )
    )


if __name__ == "__main__":
    main()
