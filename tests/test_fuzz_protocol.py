"""End to end, issue 10: a bounded fuzz of the real ``rdc serve`` with mutated captures of
real push, pull, sync and watch sessions (tests/attack), one test per mutation level, and
the two memory floods. Every check of the oracle must come out clean: no traceback,
internal error or failure in the server's log, no hang, descriptors and memory back to
their baseline once the connections closed, nothing outside the share changed, no secret
in any byte received.

The seed is fixed (``RDC_FUZZ_SEED`` overrides it); a failure names each finding and where
its reproducer was saved (``python bench/fuzz.py --replay FILE``). ``bench/fuzz.py`` runs
the same for a million inputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.attack.capture import Captured, capture_sessions
from tests.attack.fuzzer import MIB, Fuzzer, Report, Settings
from tests.attack.mutate import LEVELS
from tests.attack.oracle import Flood, flood_before_login, flood_watch
from tests.attack.world import World

from .conftest import PURE, scaled

SEED = int(os.environ.get("RDC_FUZZ_SEED", "20261123"))
INPUTS = scaled(240, 160)  # per level
FLOOD_MIB = 64  # what a flood may add to the server's memory


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Captured]]:
    world = World(tmp_path_factory.mktemp("fuzz"), scale=0.3 if PURE else 1.0)
    world.build()
    world.start()
    try:
        yield world, capture_sessions(world)
    finally:
        world.stop()


def findings(report: Report) -> str:
    lines = [report.table(), ""]
    for finding in report.findings.values():
        lines.append(f"[{finding.kind}] x{finding.count} {finding.signature}")
        lines.append("    " + finding.detail[:600].replace("\n", "\n    "))
        if finding.where is not None:
            lines.append(f"    reproducers: {finding.where}")
    return "\n".join(lines)


@pytest.mark.parametrize("level", LEVELS)
def test_mutated_sessions_find_nothing(fuzzed: tuple[World, Captured], level: str,
                                       tmp_path: Path) -> None:
    world, captured = fuzzed
    settings = Settings(inputs=INPUTS, seed=SEED, jobs=8, batch=INPUTS // 2, levels=(level,),
                        results=tmp_path / "results", floods=False)
    report = Fuzzer(world, captured, settings).run()
    assert report.inputs == INPUTS
    assert not report.findings, findings(report)


@pytest.mark.parametrize("flood", [flood_before_login, flood_watch])
def test_memory_floods_are_bounded(tmp_path: Path, flood: Callable[[World], Flood]) -> None:
    """Before login, connections holding all but one byte of a maximal frame; with a
    read-only token, a watch conversation sent 4 MiB messages that compress to nothing.
    Each against a fresh server, so that no other test's memory hides its own."""
    world = World(tmp_path, scale=0.3)
    world.build()
    world.start()
    try:
        result = flood(world)
    finally:
        world.stop()
    grew, kept = result.peak - result.before, result.after - result.before
    assert grew < FLOOD_MIB * MIB and kept < FLOOD_MIB * MIB, (
        f"flood {result.name}: RSS {result.before / MIB:.0f} -> {result.peak / MIB:.0f} MiB, "
        f"{result.after / MIB:.0f} MiB after ({result.detail})")
