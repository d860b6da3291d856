"""End to end, issue 10 (items 1 and 5): a directory of the share swapped for a symlink to
the outside while the real ``rdc serve`` opens it or scans it, and a local directory
swapped while the real client scans it. Bounded in time; nothing outside may be listed,
read, created or changed, and a scan skips the swapped entry instead of failing.

``bench/race.py`` runs the same races for longer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attack.race import open_race, scan_race
from tests.attack.world import World

from .conftest import PURE

OPEN_SECONDS = 12.0
SCAN_SECONDS = 4.0


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = World(tmp_path, scale=0.3 if PURE else 1.0)
    world.build()
    world.start()
    try:
        yield world
    finally:
        world.stop()
        if world.daemon is not None:
            print(f"==== serve.log (tail)\n{world.daemon.log_path.read_text()[-6000:]}")


def test_opening_a_directory_swapped_for_a_symlink_never_escapes(world: World) -> None:
    """One connection keeps replacing ``d`` (and a fresh ``d-N``) by a symlink to the
    outside and back with ``ops``; others open it, then list, get and write."""
    report = open_race(world, OPEN_SECONDS)
    assert not report.escapes, report.line() + "\n" + "\n".join(report.escapes[:20])
    assert report.swaps > 20 and report.opened > 20, f"the race did not run: {report.line()}"


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_scan_skips_a_directory_swapped_for_a_symlink(world: World, side: str) -> None:
    """Pulls while the share's ``sub`` is swapped (the server scans), pushes while the
    local ``sub`` is (the client scans): each run ends cleanly and the outside never
    arrives."""
    report = scan_race(world, side, SCAN_SECONDS)
    assert not report.failures, report.line() + "\n" + "\n".join(report.failures[:10])
    assert report.runs >= 2 and report.swaps > 10, f"the race did not run: {report.line()}"
