#!/usr/bin/env python3
"""The symlink races of issue 10 against a real ``rdc serve`` on 127.0.0.1, for as long as
asked: prints attempts and escapes.

Open race (item 1): one connection (read-write token, protocol only) keeps replacing a
directory ``d`` of the share, and a fresh ``d-N`` each round, by a symlink to a directory
outside the share (``ops`` rm + link) and back; ``--victims`` connections keep opening it
and, once opened, list it, get files (the outside secret's name among them) and write.
Any outside name listed, outside file offered, secret byte received, or change outside
the share is an escape. Scan races (item 5): pulls while the share's ``sub`` is swapped
on disk, pushes while the local ``sub`` is; a run that fails, prints a traceback, makes
the server log an internal error, or brings the outside along is counted.

    pip install -e '.[test]'
    python bench/race.py                     # 600 s of open race, 60 s per scan race
    python bench/race.py --seconds 60 --scan-seconds 0
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.attack.race import KINDS, open_race, scan_race
from tests.attack.world import World, remove


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600, help="open race duration")
    parser.add_argument("--scan-seconds", type=float, default=60,
                        help="duration of each scan race (0: skip them)")
    parser.add_argument("--victims", type=int, default=2, help="connections that open")
    parser.add_argument("--keep", action="store_true", help="keep the temporary world")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rdc-race-"))
    world = World(tmp)
    escapes = 0
    try:
        world.build()
        world.start()
        print(f"world in {tmp}; load average {os.getloadavg()[0]:.2f}", flush=True)
        report = open_race(world, args.seconds, victims=args.victims, until_first=False)
        escapes += len(report.escapes)
        print(f"open race: {report.line()}")
        for kind in KINDS:
            example = next((e for e in report.escapes if e.startswith(kind + ":")), None)
            if example:
                print(f"  e.g. {example[:200]}")
        if args.scan_seconds > 0:
            for side in ("server", "client"):
                scan = scan_race(world, side, args.scan_seconds)
                escapes += len(scan.failures)
                print(f"scan race, {scan.line()}")
                for example in scan.failures[:3]:
                    print(f"  e.g. {example[:300]}")
    finally:
        world.stop()
        if not args.keep:
            remove(tmp)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
