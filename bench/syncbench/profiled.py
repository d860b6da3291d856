"""Run the rdc command under cProfile, every thread of it, and write one merged profile.

    python bench/syncbench/profiled.py OUT.prof serve --listen ...
    python bench/syncbench/profiled.py OUT.prof push ...

``python -m cProfile`` sees only the main thread, while rdc does its file reading, index
work and big-frame compression on worker threads. Here each new thread starts a profiler
of its own (threading.setprofile), and at the end all of them go into OUT.prof. Times are
each thread's CPU time (time.thread_time), not wall time: with wall time a thread that
waits for the GIL inside a function is charged for what the other threads ran meanwhile.
The profile is written however the command ends (``rdc serve`` ends on SIGINT or SIGTERM).
"""

from __future__ import annotations

import cProfile
import marshal
import sys
import threading
import time

profiles: list[cProfile.Profile] = []
lock = threading.Lock()


def start_in_thread(frame: object, event: str, arg: object) -> None:
    """The first profile event of a new thread swaps this hook for a profiler of its own."""
    profile = cProfile.Profile(time.thread_time)
    with lock:
        profiles.append(profile)
    profile.enable()


def merged() -> dict:
    """All profiles' stats in pstats' form, added up per function. Threads still running
    are read as they stand (their unfinished calls are left out), not disabled from here."""
    total: dict = {}
    with lock:
        todo = list(profiles)
    for profile in todo:
        profile.snapshot_stats()
        for func, (cc, nc, tt, ct, callers) in profile.stats.items():
            if func in total:
                pcc, pnc, ptt, pct, pcallers = total[func]
                merged_callers = dict(pcallers)
                for caller, figures in callers.items():
                    old = merged_callers.get(caller)
                    merged_callers[caller] = figures if old is None else tuple(
                        a + b for a, b in zip(old, figures, strict=True))
                total[func] = (pcc + cc, pnc + nc, ptt + tt, pct + ct, merged_callers)
            else:
                total[func] = (cc, nc, tt, ct, callers)
    return total


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    from rdc_client.cli import main as rdc_main

    threading.setprofile(start_in_thread)
    profile = cProfile.Profile(time.thread_time)
    with lock:
        profiles.append(profile)
    profile.enable()
    try:
        code = rdc_main(argv)
    finally:
        profile.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        with open(out, "wb") as f:
            marshal.dump(merged(), f)
    return code


if __name__ == "__main__":
    sys.exit(main())
