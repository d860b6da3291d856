"""``--json``: what push, pull, sync and watch do, as a stream of JSON objects, one per
line on stdout, for scripts and GUIs (README, "Machine-readable output" lists every
type and field).

Each object has ``type``: ``file`` (a file transferred), ``delete``, ``conflict``,
``error``, ``warning``, ``progress`` (with ``--progress``), ``status`` (a watch connected
or waiting to retry) and ``summary`` (the end of a run or of a watch round). Paths that
are not UTF-8 keep their undecodable bytes as ``\\udcXX`` escapes (Python's
surrogateescape), so a reader can still tell every path apart.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rdc.transfer.stats import Event


class EventStream:
    """Writes one JSON object per line to ``stream`` (stdout), flushed at once."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def emit(self, type_: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"type": type_, **fields}) + "\n")
        self.stream.flush()

    def file(self, fields: dict[str, Any]) -> None:
        """`rdc.transfer.stats.Options.files`: one file transferred."""
        self.emit("file", **fields)


class JsonProgress:
    """``--json --progress``: progress events of a transfer, at most one per ``interval``
    seconds (and the last)."""

    def __init__(self, events: EventStream, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.events = events
        self.interval = interval
        self.clock = clock
        self.last = -1e9
        self.counter: Any = None  # a CountingStream, set once connected

    def __call__(self, event: Event) -> None:
        now = self.clock()
        if now - self.last < self.interval and event.files_done != event.files_total:
            return
        self.last = now
        wire = 0
        if self.counter is not None:
            wire = self.counter.bytes_sent + self.counter.bytes_received
        self.events.emit("progress", files_done=event.files_done,
                         files_total=event.files_total, bytes_done=event.bytes_done,
                         bytes_total=event.bytes_total, wire_bytes=wire)

    def close(self) -> None:
        pass
