"""What the bench compares: cases (a receiver's OLD tree, a sender's NEW tree) and runs
(one tool's sync of one case, with its bytes, time, CPU and memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Case:
    name: str
    group: str
    old: Path | None  # what the receiver starts with (None: an empty directory)
    new: Path  # what the sender has
    rsync_variants: list[list[str]]
    single: str | None = None  # rsync this one file rather than the directory
    bound_old: Path | None = None  # the files the delta bound compares (tars)
    bound_new: Path | None = None
    pull: bool = False  # the receiver pulls (rdc: a local copy of OLD from the share)


@dataclass
class Run:
    case: str
    tool: str
    variant: str
    state: str
    sent: int = 0
    received: int = 0
    literal: int | None = None
    seconds: float = 0.0
    verify: str = "ok"
    cpu: float = 0.0  # CPU seconds: all rsync processes; the rdc client
    rss: int = 0  # peak RSS, bytes: rsync's processes summed; the rdc client
    rss_parts: tuple[int, ...] = ()  # rsync: the peak of each of its processes
    server_cpu: float | None = None  # the rdc server during the timed run
    server_rss: int | None = None  # the rdc server's peak RSS during the timed run
    stats: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.sent + self.received

    def figures(self) -> dict:
        """Every figure of the run, for the JSON output."""
        return {
            "tool": self.tool, "variant": self.variant, "state": self.state,
            "sent": self.sent, "received": self.received, "total": self.total,
            "literal": self.literal, "seconds": round(self.seconds, 3),
            "cpu": round(self.cpu, 3), "peak_rss": self.rss,
            **({"peak_rss_per_process": list(self.rss_parts)} if self.rss_parts else {}),
            "server_cpu": None if self.server_cpu is None else round(self.server_cpu, 3),
            "server_peak_rss": self.server_rss, "verify": self.verify,
            **({"rdc_stats": self.stats} if self.stats else {}),
        }
