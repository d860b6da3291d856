"""Progress: rate-limited rendering of structured events on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rdc.local.index import Progress


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


class ProgressLine:
    """One status line, redrawn at most every ``interval`` seconds; cleared on close."""

    def __init__(
        self, stream: TextIO | None = None, interval: float = 0.2, enabled: bool | None = None
    ) -> None:
        self.stream = stream = stream or sys.stderr  # at the call: tests swap sys.stderr
        self.interval = interval
        self.enabled = stream.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self.last = 0.0
        self.width = 0

    def __call__(self, event: Progress) -> None:
        now = time.monotonic()
        if not self.enabled or (
            now - self.last < self.interval and event.files_done != event.files_total
        ):
            return
        self.last = now
        rate = event.bytes_done / max(now - self.started, 1e-6)
        text = (
            f"signing {event.files_done:,}/{event.files_total:,} files, "
            f"{human_bytes(event.bytes_done)} of {human_bytes(event.bytes_total)}, "
            f"{human_bytes(rate)}/s"
        )
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


class TransferBar:
    """A live bar for push and pull: files and bytes done of those planned, and the rate on
    the wire (from the connection's byte counter)."""

    WIDTH = 24

    def __init__(
        self, stream: TextIO | None = None, interval: float = 0.2, enabled: bool = False,
        after: ProgressLine | None = None,
    ) -> None:
        """``after``: the line of the scan before the transfer, cleared when the bar
        first draws."""
        self.stream = stream or sys.stderr
        self.interval = interval
        self.enabled = enabled
        self.after = after
        self.counter = None  # a CountingStream, set once connected
        self.started = time.monotonic()
        self.last = 0.0
        self.width = 0

    def __call__(self, event) -> None:  # an rdc.transfer.client.Event
        now = time.monotonic()
        finished = event.files_done == event.files_total
        if not self.enabled or (now - self.last < self.interval and not finished):
            return
        if self.after is not None:
            self.after.close()
            self.after = None
        self.last = now
        total = max(event.bytes_total, 1)
        filled = round(self.WIDTH * min(event.bytes_done / total, 1.0))
        wire = 0
        if self.counter is not None:
            wire = self.counter.bytes_sent + self.counter.bytes_received
        rate = wire / max(now - self.started, 1e-6)
        text = (
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] "
            f"{event.files_done:,}/{event.files_total:,} files, "
            f"{human_bytes(event.bytes_done)}/{human_bytes(event.bytes_total)}, "
            f"wire {human_bytes(wire)} at {human_bytes(rate)}/s"
        )
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0
