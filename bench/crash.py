#!/usr/bin/env python3
"""Crash test: hundreds of pushes and pulls killed at random points (SIGKILL of the client
or of the server), each checked: every file of the target is its old version or its new
one (or absent where one version has none), nothing but rdc's temporaries beside them,
and the same transfer run again ends in step. The trees, the loop and the checks are
tests/crash_support.py; tests/test_e2e_crash.py runs a few of the same in the suite.

    python bench/crash.py [--transfers 200] [--seconds 900] [--seed 1] [--big-mib 4]

Prints a table of transfers per direction and victim (and how many were killed while
they still ran, rather than after they ended), the problems found (none expected), and
the wall time; exits 1 on any problem, 2 if the time ran out before --transfers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from tests import crash_support
from tests.e2e_support import E2E


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transfers", type=int, default=200, help="killed transfers to run")
    parser.add_argument("--seconds", type=float, default=900,
                        help="stop after this long even if fewer ran")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--big-mib", type=float, default=4,
                        help="MiB of the tree's large file (the rest is about 1.5 MB)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rdc-crash-"))
    e2e = E2E(work)
    load = os.getloadavg()[0]
    tally = crash_support.run(e2e, args.transfers, args.seconds, args.seed,
                              int(args.big_mib * (1 << 20)))
    print(f"# rdc crash test: {tally.total} transfers killed at random points "
          f"in {tally.seconds:.0f} s (seed {args.seed}, load average {load:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end)\n")
    print("| transfer | killed | runs | killed while running | problems |")
    print("| --- | --- | ---: | ---: | ---: |")
    for key in sorted(tally.runs):
        verb, victim = key
        problems = sum(1 for p in tally.problems if f" {verb}, {victim} killed" in p)
        print(f"| {verb} | {victim} | {tally.runs[key]} | {tally.mid_transfer[key]} | "
              f"{problems} |")
    print(f"| all | | {tally.total} | {sum(tally.mid_transfer.values())} | "
          f"{len(tally.problems)} |")
    for problem in tally.problems:
        print(f"\nPROBLEM: {problem}")
    for process in e2e.started:  # reaped already; closes their pipes
        if process.poll() is None:
            process.kill()
        process.communicate()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"\nkept {work}")
    if tally.problems:
        return 1
    if tally.total < args.transfers:
        print(f"\nonly {tally.total} of {args.transfers} transfers within {args.seconds:g} s")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
