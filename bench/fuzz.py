#!/usr/bin/env python3
"""Fuzz a real ``rdc serve`` on 127.0.0.1 with mutated captures of real sessions.

Builds a world (a share with realistic content, a read-only share, a canary tree outside
them, a hard link from the share to the canary), starts ``rdc serve``, captures real push,
pull, sync and watch sessions through a recording proxy, then plays ``--inputs`` inputs of
the seeded mutator (frames, messages, sequences), ``--jobs`` connections at a time. After
every ``--batch`` inputs: the server's log (tracebacks, internal errors, failures), a fresh
client (hangs), its descriptors and memory once the connections closed, the canary tree
(escapes); secrets are looked for in every byte received. Before the inputs: --reference
unmutated sessions (the rate the fuzz rate is compared with) and the hand-written attacks
of tests/attack/directed.py; after them, two floods of memory.

Prints a table (inputs, crashes, hangs, escapes, max fds, fd growth, peak RSS, RSS after,
inputs/s) and the distinct findings; each is saved with a reproducer under ``--results``
(default bench/results/fuzz-SEED-TIME, gitignored). Exits 1 if anything was found.

    pip install -e '.[test,bench]'
    python bench/fuzz.py --inputs 1000000 --jobs 4          # about 3 hours on 2 cores
    python bench/fuzz.py --replay bench/results/.../input-123.bin
    python bench/fuzz.py --seed 1 --only 123 456
    python bench/fuzz.py --inputs 500000 --seed 7 --start 500000   # the second half
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rdc import _native
from tests.attack.capture import capture_sessions
from tests.attack.fuzzer import Fuzzer
from tests.attack.inputs import load
from tests.attack.mutate import LEVELS
from tests.attack.report import Settings
from tests.attack.world import World, remove


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000, help="inputs to play")
    parser.add_argument("--seed", type=int, default=1, help="the mutator's seed")
    parser.add_argument("--start", type=int, default=0,
                        help="index of the first input: one seed's inputs split between "
                             "runs (one server each, one core each) make one run")
    parser.add_argument("--jobs", type=int, default=4, help="connections at a time")
    parser.add_argument("--batch", type=int, default=500,
                        help="inputs between two rounds of checks")
    parser.add_argument("--levels", default=",".join(LEVELS),
                        help="mutation levels to use (frame,message,sequence)")
    parser.add_argument("--results", type=Path, help="where findings are saved")
    parser.add_argument("--only", type=int, nargs="+", metavar="INDEX",
                        help="play only these inputs of --seed")
    parser.add_argument("--replay", type=Path, nargs="+", metavar="FILE",
                        help="play saved inputs (input-N.bin of a finding)")
    parser.add_argument("--reference", type=int, default=200,
                        help="unmutated sessions played first (the reference rate)")
    parser.add_argument("--no-directed", action="store_true",
                        help="skip the hand-written attacks played before the inputs")
    parser.add_argument("--no-floods", action="store_true", help="skip the memory floods")
    parser.add_argument("--keep", action="store_true", help="keep the temporary world")
    args = parser.parse_args()
    levels = tuple(x for x in args.levels.split(",") if x)
    if not set(levels) <= set(LEVELS):
        parser.error(f"--levels: choose from {', '.join(LEVELS)}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = args.results or Path(__file__).parent / "results" / f"fuzz-{args.seed}-{stamp}"
    settings = Settings(inputs=args.inputs, seed=args.seed, jobs=args.jobs, batch=args.batch,
                        levels=levels, results=results, floods=not args.no_floods,
                        reference=args.reference, directed=not args.no_directed,
                        progress=lambda text: print(f"[{time.strftime('%H:%M:%S')}] {text}",
                                                    flush=True))
    tmp = Path(tempfile.mkdtemp(prefix="rdc-fuzz-"))
    world = World(tmp, scale=0.3 if _native.PURE_PYTHON else 1.0)
    try:
        world.build()
        world.start()
        started = time.monotonic()
        captured = capture_sessions(world)
        print(f"captured {len(captured.sessions)} sessions "
              f"({sum(len(s.frames) for s in captured.sessions)} frames) in "
              f"{time.monotonic() - started:.1f} s; world in {tmp}; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        fuzzer = Fuzzer(world, captured, settings)
        for signum in (signal.SIGINT, signal.SIGTERM):  # finish the batch, then report
            signal.signal(signum, lambda *_: fuzzer.stop.set())
        indices = None if not args.start else list(range(args.start, args.start + args.inputs))
        if args.replay:
            loaded = [load(path) for path in args.replay]
            fuzzer.inputs = {inp.index: inp for inp in loaded}
            indices = [inp.index for inp in loaded]
            settings.batch, settings.floods, settings.reference = 1, False, 0
            settings.directed = False
        elif args.only:
            indices, settings.batch, settings.floods = args.only, 1, False
            settings.reference, settings.directed = 0, False
        report = fuzzer.run(indices)
    finally:
        world.stop()
        if not args.keep:
            remove(tmp)
    print()
    span = f" inputs {args.start:,}-{args.start + args.inputs - 1:,}," if args.start else ""
    print(f"seed {args.seed},{span} {args.jobs} jobs, load average {os.getloadavg()[0]:.2f}, "
          f"{_native.IMPLEMENTATION} chunker")
    print(report.summary())
    print(f"\nresults: {results}")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
