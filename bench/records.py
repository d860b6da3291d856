#!/usr/bin/env python3
"""What unchecked records (rdc.records) save against frozen dataclasses, measured in one
run: each measurement runs in a fresh interpreter per mode (RDC_CHECK_RECORDS=1 is the
test suite's frozen records, 0 is what users run), alternating, best of --runs.

- import: ``rdc.transfer.oneway`` and the push command's module (every class built);
- decode: a server reading offers of --files files, 1,000 a message (a FileOffer made
  per file);
- make: --files FileOffers made on the sending side.

    python bench/records.py [--runs 15] [--files 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys, time
t = time.perf_counter()
import rdc_client.cmd_transfer, rdc.transfer.oneway
imported = time.perf_counter() - t
from rdc.wire import messages as m
n = int(sys.argv[1])
def make():
    return [m.FileOffer(f"d{i % 50}/f{i}.txt", i, bytes(32), 0, None, 0o644,
                        1_700_000_000_000_000_000 + i) for i in range(n)]
t = time.perf_counter(); offers = make(); made = time.perf_counter() - t
raws = [m.encode(m.Offers(files=offers[i:i + 1000]), 3) for i in range(0, n, 1000)]
t = time.perf_counter()
for raw in raws:
    m.decode(raw)
decoded = time.perf_counter() - t
print(json.dumps({"import": imported, "make": made, "decode": decoded}))
"""


def probe(checked: bool, files: int) -> dict[str, float]:
    env = dict(os.environ, RDC_CHECK_RECORDS="1" if checked else "0")
    done = subprocess.run([sys.executable, "-c", PROBE, str(files)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    best: dict[bool, dict[str, float]] = {True: {}, False: {}}
    for _ in range(args.runs):
        for checked in (True, False):
            for key, seconds in probe(checked, args.files).items():
                best[checked][key] = min(best[checked].get(key, seconds), seconds)
    print(f"best of {args.runs}, {args.files:,} offers")
    print(f"{'what':<8} {'frozen ms':>10} {'unchecked ms':>13} {'ratio':>6}")
    for key in ("import", "make", "decode"):
        frozen, fast = best[True][key] * 1000, best[False][key] * 1000
        print(f"{key:<8} {frozen:>10.1f} {fast:>13.1f} {fast / frozen:>6.2f}")
    print(json.dumps({"frozen": best[True], "unchecked": best[False], "files": args.files}))


if __name__ == "__main__":
    main()
