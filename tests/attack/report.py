"""What a fuzz run is asked to do (`Settings`), what it found (`Finding`), and the table it
prints (`Report`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.attack.mutate import LEVELS
from tests.attack.oracle import Flood

MIB = 1024  # KiB


@dataclass
class Settings:
    inputs: int = 1000
    seed: int = 1
    jobs: int = 4
    batch: int = 500  # inputs between two rounds of checks (and share resets)
    levels: tuple[str, ...] = LEVELS
    results: Path | None = None
    # RSS over the (warmed-up) baseline while inputs run, and once their connections
    # closed, that is a finding; so is RSS after that keeps growing from batch to batch.
    # Generous bounds: today's server serving only real clients, 8 at once, goes from
    # ~150 to ~350 MiB over 500 sessions and stays there (zstd level-19 contexts of
    # ~18 MiB on worker threads, malloc arenas); a flood costs gigabytes.
    peak_mib: int = 512
    after_mib: int = 384
    trend_mib: int = 128
    restart_mib: int = 3072  # RSS at which the server is restarted (the machine is shared)
    floods: bool = True  # the two memory floods after the inputs
    attribute: bool = True  # replay a batch input by input to find who changed the canary
    reference: int = 0  # unmutated sessions played first, for the reference rate
    directed: bool = False  # the hand-written attacks played next, one batch each
    progress: Callable[[str], None] | None = None


@dataclass
class Finding:
    kind: str  # crash, hang, escape, leak, fds, memory, stream, semantics, log
    signature: str
    detail: str
    indices: list[int] = field(default_factory=list)  # inputs that showed it (a few)
    count: int = 0
    where: Path | None = None


@dataclass
class Report:
    inputs: int = 0
    seconds: float = 0.0
    crashes: int = 0  # inputs (or events) that made a suspicious log record
    hangs: int = 0
    escapes: int = 0  # canary changes plus leaks seen in received bytes
    fds_base: int = 0
    fds_max: int = 0
    fd_growth: int = 0
    rss_base: int = 0  # KiB
    rss_peak: int = 0
    rss_after: int = 0
    sent: int = 0
    received: int = 0
    waited_out: int = 0
    restarts: int = 0
    harness_errors: int = 0  # inputs the harness itself failed on (a bug of ours)
    server_cpu: float = 0.0  # seconds of CPU the server used on the inputs
    reference_rate: float = 0.0  # unmutated sessions per second, same run
    client_cpu: float = 0.0  # ... and this process (mutating, playing, checking)
    floods: list[Flood] = field(default_factory=list)
    findings: dict[str, Finding] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds else 0.0

    def table(self) -> str:
        rows = [
            ("inputs", f"{self.inputs:,}"),
            ("crashes", str(self.crashes)),
            ("hangs", str(self.hangs)),
            ("escapes", str(self.escapes)),
            ("max fds", f"{self.fds_max} (baseline {self.fds_base})"),
            ("fd growth", f"{self.fd_growth:+d}"),
            ("peak RSS", f"{self.rss_peak / MIB:.0f} MiB (baseline {self.rss_base / MIB:.0f})"),
            ("RSS after", f"{self.rss_after / MIB:.0f} MiB"),
            ("inputs/s", f"{self.rate:.0f}" + (
                f" ({self.rate / self.reference_rate:.2f} x the {self.reference_rate:.0f}/s "
                "of unmutated sessions)" if self.reference_rate else "")),
            ("CPU per input", f"server {1000 * self.server_cpu / max(1, self.inputs):.1f} ms, "
                              f"fuzzer {1000 * self.client_cpu / max(1, self.inputs):.1f} ms"),
            ("distinct findings", str(len(self.findings))),
            *([("server restarts", str(self.restarts))] if self.restarts else []),
            *([("harness errors", str(self.harness_errors))] if self.harness_errors else []),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        for flood in self.floods:
            lines.append(f"flood {flood.name}: {flood.wire_bytes / 1e6:.1f} MB on the wire, "
                         f"RSS {flood.before / MIB:.0f} -> peak {flood.peak / MIB:.0f} -> "
                         f"{flood.after / MIB:.0f} MiB after ({flood.detail})")
        return "\n".join(lines)

    def summary(self) -> str:
        lines = [self.table(), ""]
        for n, finding in enumerate(self.findings.values(), 1):
            lines.append(f"{n}. [{finding.kind}] x{finding.count} {finding.signature}")
            if finding.where is not None:
                lines.append(f"   {finding.where}")
        return "\n".join(lines)
