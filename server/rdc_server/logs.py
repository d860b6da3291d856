"""The daemon's log: one short line per event on stderr.

A line is capped at MAX_LINE characters (the message of a peer or a library can be of any
length: watchdog once wrote lines of 900 KB), newlines inside a message are folded so that
one event stays one line, and Python warnings (from libraries) go through the same log
instead of their own multi-line format. Tracebacks of bugs are kept whole, below their
line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

MAX_LINE = 1000  # characters of one log line (a test may lower it)
FORMAT = "%(asctime)s rdc serve: %(message)s"


class ShortLines(logging.Formatter):
    """A formatter that folds a message's newlines and caps its line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record).rstrip("\n").replace("\n", " | ")
        if len(line) > MAX_LINE:
            cut = len(line) - MAX_LINE
            line = f"{line[:MAX_LINE]}... ({cut:,} more characters)"
        return line


def setup(verbose: bool, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) at INFO, or DEBUG with ``verbose``; warnings included."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(ShortLines(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.captureWarnings(True)
