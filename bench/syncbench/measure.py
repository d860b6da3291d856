"""What a process costs: wall time, CPU seconds (user + system) and peak resident memory.

A child we start is measured by ``os.wait4`` (its rusage includes the descendants it
waited for), but for its peak memory: Linux's ``ru_maxrss`` carries over ``exec`` the
peak of the forked copy of this process, so a child forked from a bench holding a large
tree reported the bench's size (a push with nothing to do "peaked" at 216 MB; it uses
34). Its own VmHWM, which ``exec`` starts afresh, is polled instead. rsync's peak memory
is the sum over its processes (sender, receiver, generator), each process's VmHWM polled
while it runs: wait4 reports only the largest of a tree. The long-running ``rdc serve``
is read from /proc around each run, with its peak reset first (``clear_refs``), so each
run gets its own figures.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    seconds: float = 0.0
    cpu: float = 0.0  # user + system seconds
    peak_rss: int = 0  # bytes
    peaks: tuple[int, ...] = ()  # per process, where a tree of processes was polled


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    usage: Usage


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a running process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def status_bytes(pid: int, key: str) -> int:
    """A memory line of /proc/PID/status (VmHWM, VmRSS) in bytes; 0 if the process is
    gone or has no memory any more (a zombie)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak(pid: int) -> None:
    """Make VmHWM start again from the current RSS (Linux: '5' to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _comm(program: str) -> str:
    """The name /proc gives a process running ``program`` (at most 15 bytes)."""
    return os.path.basename(program)[:15]


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        with contextlib.suppress(OSError):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


class TreePeaks:
    """Polls the peak RSS of every process named ``name`` under ``pid`` (``pid`` too)
    until stopped; ``total`` is the sum of the per-process peaks."""

    def __init__(self, pid: int, name: str, interval: float = 0.01) -> None:
        self.pid, self.name, self.interval = pid, name, interval
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            todo = [self.pid]
            while todo:
                pid = todo.pop()
                todo += children(pid)
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                if comm == self.name:
                    self.peaks[pid] = max(self.peaks.get(pid, 0), status_bytes(pid, "VmHWM"))
            self._stop.wait(self.interval)

    def stop(self) -> tuple[int, ...]:
        self._stop.set()
        self._thread.join()
        return tuple(self.peaks.values())


def run(cmd: list[str], env: dict[str, str] | None = None,
        tree_name: str | None = None) -> Finished:
    """Run ``cmd`` to its end and measure it. With ``tree_name``, the peak RSS is the sum
    over its processes of that name (polled; pages that a fork shares count in each
    process, so the sum can overstate); else the peak of the child itself, polled."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        peaks = TreePeaks(proc.pid, tree_name or _comm(cmd[0]))
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
        finally:
            parts = peaks.stop()
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait again
        out.seek(0)
        err.seek(0)
        usage = Usage(seconds, rusage.ru_utime + rusage.ru_stime,
                      sum(parts) if tree_name else max(parts, default=rusage.ru_maxrss * 1024),
                      parts)
        return Finished(proc.returncode, out.read().decode(errors="replace"),
                        err.read().decode(errors="replace"), usage)


class ServerProbe:
    """CPU seconds and peak RSS of a running process over one stretch of time."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu = 0.0

    def begin(self) -> None:
        reset_peak(self.pid)
        self.cpu = process_cpu(self.pid)

    def end(self) -> tuple[float, int]:
        return process_cpu(self.pid) - self.cpu, status_bytes(self.pid, "VmHWM")
