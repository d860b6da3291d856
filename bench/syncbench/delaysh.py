"""rsync's remote shell with added round-trip time: runs ``localsh`` (the fake remote
shell, ../shared/bench/localsh) with this command's arguments, and relays stdin to its
stdin and its stdout to stdout, each chunk ``rtt/2`` seconds after it was read (stderr
passes straight through). The RTT comes from the environment, in milliseconds:

    RDC_BENCH_RTT_MS=50 rsync -az -e "python3 bench/syncbench/delaysh.py" SRC/ localhost:DST/

RDC_BENCH_LOCALSH names the fake remote shell (default: the nearest shared/bench/localsh
above this file). Needs only the standard library (bench/latency.py runs it with -S).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from delay import CHUNK, relay  # (this file's folder is on sys.path when it is run)


def localsh() -> str:
    if os.environ.get("RDC_BENCH_LOCALSH"):
        return os.environ["RDC_BENCH_LOCALSH"]
    for parent in Path(__file__).resolve().parents:
        if (parent / "shared" / "bench" / "localsh").is_file():
            return str(parent / "shared" / "bench" / "localsh")
    sys.exit("delaysh: no shared/bench/localsh found (set RDC_BENCH_LOCALSH)")


def main() -> None:
    delay = float(os.environ.get("RDC_BENCH_RTT_MS", "0")) / 2000
    child = subprocess.Popen([localsh(), *sys.argv[1:]], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    to_child, from_child = child.stdin.fileno(), child.stdout.fileno()

    def write_all(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    relay(lambda: os.read(0, CHUNK), lambda d: write_all(to_child, d),
          child.stdin.close, delay)
    back = relay(lambda: os.read(from_child, CHUNK), lambda d: write_all(1, d),
                 lambda: os.close(1), delay)
    code = child.wait()
    back.join()  # everything the child wrote reaches rsync before this shell exits
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
