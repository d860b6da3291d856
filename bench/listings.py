#!/usr/bin/env python3
"""What a directory listing costs to decode: the entries checked inline
(`Listed.from_wire`) against the same entries checked field by field
(`Listed.from_wire_by_field`, which builds each field's check and its place in the
message), in one run, best of --runs.

    python bench/listings.py [--runs 9] [--entries 16000]
"""

from __future__ import annotations

import argparse
import time

from rdc.wire import messages as m


def best_of(runs: int, work) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--entries", type=int, default=16_000)
    args = parser.parse_args()
    listing = m.Listing("some/dir", [
        m.Listed(f"file_{i:05}.py", "f", 0o644, i.to_bytes(5, "big"),
                 1_700_000_000_000_000_000 + i, b"", b"", True, 1000 + i)
        for i in range(args.entries)])
    wire = listing.to_wire()
    assert m.Listing.from_wire(wire, "l") == listing
    inline = best_of(args.runs, lambda: m.Listing.from_wire(wire, "l"))
    checked = best_of(args.runs,
                      lambda: [m.Listed.from_wire_by_field(e, "l") for e in wire[1]])
    n = args.entries
    print(f"{n:,} entries, best of {args.runs}")
    print(f"field by field  {checked * 1e3:7.1f} ms  {checked / n * 1e6:5.2f} us an entry")
    print(f"inline          {inline * 1e3:7.1f} ms  {inline / n * 1e6:5.2f} us an entry"
          f"  ratio {inline / checked:.2f}")


if __name__ == "__main__":
    main()
