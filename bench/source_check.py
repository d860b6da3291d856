#!/usr/bin/env python3
"""What checking served bytes against their signature costs a source (issue 13 item 2):
`rdc.content.check` over data already signed, next to signing the same data (chunking,
BLAKE3, tree, sketch: what a cold index pays), measured in the same run by the process's
CPU time (all threads).

Cases: one large random buffer fed in 1 MiB pieces (a whole send), and many small files
checked one by one (a batch of small files, each read whole). Prints a table with the
ratio check / sign; below 1 the check costs less than signing.

    python bench/source_check.py [--mib 256] [--files 4000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import blake3

from rdc import _native
from rdc.content.check import LeafCheck, matches
from rdc.content.signature import signature_of_bytes

PIECE = 1 << 20


def cpu(fn) -> float:
    started = time.process_time()  # every thread's: signing runs on workers
    fn()
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=4000)
    args = parser.parse_args()
    size = args.mib << 20
    data = blake3.blake3(b"source check").digest(length=size)
    signature = signature_of_bytes(data)
    view = memoryview(data)

    def whole() -> None:
        check = LeafCheck(signature.tree)
        for offset in range(0, size, PIECE):
            check.feed(view[offset : offset + PIECE])
        check.finish()

    sign_big = cpu(lambda: signature_of_bytes(data))
    check_big = cpu(whole)
    small = [blake3.blake3(b"small %d" % n).digest(length=500 + (n * 7919) % 60_000)
             for n in range(args.files)]
    trees = [signature_of_bytes(d).tree for d in small]
    sign_small = cpu(lambda: [signature_of_bytes(d) for d in small])
    check_small = cpu(lambda: [matches(t, d) for t, d in zip(trees, small, strict=True)])
    total_small = sum(map(len, small))
    print(f"# the source's check against signing the same data ({_native.IMPLEMENTATION}, "
          f"load average {os.getloadavg()[0]:.2f})\n")
    print("| data | sign (CPU s) | check (CPU s) | check / sign | check MB/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| one {args.mib} MiB file, 1 MiB pieces | {sign_big:.3f} | {check_big:.3f} | "
          f"{check_big / sign_big:.2f} | {size / check_big / 1e6:,.0f} |")
    print(f"| {args.files:,} small files, {total_small / 1e6:.1f} MB | {sign_small:.3f} | "
          f"{check_small:.3f} | {check_small / sign_small:.2f} | "
          f"{total_small / check_small / 1e6:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
