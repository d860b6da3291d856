"""Progress: rate-limited rendering of structured events on stderr.

Two displays, one line each, redrawn in place with a carriage return: `ProgressLine` for
signing a local tree, `TransferBar` for moving files. Both show what is done of the total,
the rate, and an estimate of the time left once there is enough to go on (ETA_AFTER
seconds of work). The clock is a parameter so that tests can drive it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rdc.local.index import Progress
from rdc.transfer.stats import Event

ETA_AFTER = 1.0  # seconds of work before an estimate of the time left is shown


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def clock_time(seconds: float) -> str:
    """``M:SS`` or ``H:MM:SS``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def estimate(done: float, total: float, elapsed: float) -> str:
    """``ETA M:SS`` from the rate so far, or "" while there is too little to tell."""
    if elapsed < ETA_AFTER or done <= 0 or total <= done:
        return ""
    return f"ETA {clock_time((total - done) * elapsed / done)}"


class _Line:
    """One status line on ``stream``, redrawn at most every ``interval`` seconds."""

    def __init__(self, stream: TextIO | None, interval: float, enabled: bool,
                 clock: Callable[[], float]) -> None:
        self.stream = stream or sys.stderr  # looked up now: tests swap sys.stderr
        self.interval = interval
        self.enabled = enabled
        self.clock = clock
        self.started: float | None = None  # at the first event
        self.last = -1e9
        self.width = 0

    def due(self, final: bool) -> float | None:
        """The time now if the line should be drawn (always for the ``final`` event)."""
        now = self.clock()
        if self.started is None:
            self.started = now
        if not self.enabled or (now - self.last < self.interval and not final):
            return None
        self.last = now
        return now

    def draw(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()


class ProgressLine(_Line):
    """Signing the local tree: files and bytes signed of those that need it. Cleared on
    close."""

    def __init__(self, stream: TextIO | None = None, interval: float = 0.2,
                 enabled: bool | None = None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        stream = stream or sys.stderr
        super().__init__(stream, interval, stream.isatty() if enabled is None else enabled,
                         clock)

    def __call__(self, event: Progress) -> None:
        now = self.due(event.files_done == event.files_total)
        if now is None:
            return
        elapsed = now - (self.started or now)
        rate = event.bytes_done / max(elapsed, 1e-6)
        parts = [f"signing {event.files_done:,}/{event.files_total:,} files",
                 f"{human_bytes(event.bytes_done)} of {human_bytes(event.bytes_total)}",
                 f"{human_bytes(rate)}/s"]
        eta = estimate(event.bytes_done, event.bytes_total, elapsed)
        self.draw(", ".join(parts + ([eta] if eta else [])))

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


class TransferBar(_Line):
    """Moving files (push, pull, sync, watch): a bar, the share done, files and bytes done
    of those planned, the rate, the bytes on the wire (from the connection's counter) and
    the time left. The bar follows the bytes, or the files where no size is known. The
    last drawing stays on screen (a newline on close)."""

    WIDTH = 24

    def __init__(self, stream: TextIO | None = None, interval: float = 0.2,
                 enabled: bool = False, after: ProgressLine | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``after``: the line of the scan before the transfer, cleared when the bar
        first draws."""
        super().__init__(stream, interval, enabled, clock)
        self.after = after
        self.counter: Any = None  # a CountingStream, set once connected

    def __call__(self, event: Event) -> None:
        now = self.due(event.files_done == event.files_total)
        if now is None:
            return
        if self.after is not None:
            self.after.close()
            self.after = None
        self.draw(self.render(event, now - (self.started or now)))

    def render(self, event: Event, elapsed: float) -> str:
        if event.bytes_total > 0:
            done, total = event.bytes_done, event.bytes_total
        else:
            done, total = event.files_done, event.files_total
        share = min(done / total, 1.0) if total > 0 else 0.0
        filled = int(self.WIDTH * share)
        wire = 0
        if self.counter is not None:
            wire = self.counter.bytes_sent + self.counter.bytes_received
        parts = [
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {share:4.0%} "
            f"{event.files_done:,}/{event.files_total:,} files",
            f"{human_bytes(event.bytes_done)}/{human_bytes(event.bytes_total)}",
            f"{human_bytes(event.bytes_done / max(elapsed, 1e-6))}/s",
            f"wire {human_bytes(wire)}",
        ]
        eta = estimate(done, total, elapsed)
        return ", ".join(parts + ([eta] if eta else []))

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0
