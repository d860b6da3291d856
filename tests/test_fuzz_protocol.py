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

import msgpack
import pytest
import zstandard

from tests.attack.capture import Captured, capture_sessions
from tests.attack.directed import directed
from tests.attack.fuzzer import Fuzzer
from tests.attack.inputs import Input, dump, load
from tests.attack.mutate import LEVELS, generate
from tests.attack.oracle import Flood, flood_before_login, flood_watch
from tests.attack.report import MIB, Report, Settings
from tests.attack.wire import Decoder, Encoder, set_content_size
from tests.attack.world import World

from .conftest import PURE, scaled

SEED = int(os.environ.get("RDC_FUZZ_SEED", "20261123"))
INPUTS = scaled(200, 150)  # per level
WARM = 24  # unmutated sessions before each run: the baseline is a server that has served
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
                        results=tmp_path / "results", floods=False, reference=WARM)
    report = Fuzzer(world, captured, settings).run()
    assert report.inputs == INPUTS
    assert not report.findings, findings(report)


def test_directed_attacks_find_nothing(fuzzed: tuple[World, Captured],
                                       tmp_path: Path) -> None:
    """Issue 10's holes, one hand-written input each (tests/attack/directed.py)."""
    world, captured = fuzzed
    inputs = directed(SEED, world.canary)
    settings = Settings(inputs=0, seed=SEED, jobs=1, batch=1, results=tmp_path / "results",
                        floods=False, reference=WARM)
    fuzzer = Fuzzer(world, captured, settings)
    fuzzer.inputs = {inp.index: inp for inp in inputs}
    report = fuzzer.run([inp.index for inp in inputs])
    assert report.inputs == len(inputs)
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


# ---------------------------------------------------------------- the harness itself


def test_unmutated_sessions_find_nothing(fuzzed: tuple[World, Captured],
                                         tmp_path: Path) -> None:
    """The captures played as they are: the oracle must not cry wolf at real clients."""
    world, captured = fuzzed
    settings = Settings(inputs=0, seed=SEED, jobs=8, batch=60, levels=("replay",),
                        results=tmp_path / "results", floods=False, reference=WARM)
    report = Fuzzer(world, captured, settings).run(list(range(60)))
    assert report.inputs == 60 and report.received > 0
    assert not report.findings, findings(report)


def test_inputs_are_reproducible_from_seed_and_index(fuzzed: tuple[World, Captured],
                                                     tmp_path: Path) -> None:
    _, captured = fuzzed
    for index in range(0, 3000, 37):
        a = generate(SEED, index, captured.sessions)
        b = generate(SEED, index, captured.sessions)
        assert a.describe() == b.describe()
        dump(a, tmp_path / "input.bin")
        again = load(tmp_path / "input.bin")
        assert packed(again) == packed(b)  # (as bytes: a NaN is not equal to itself)
    assert len({generate(SEED, i, captured.sessions).describe() for i in range(200)}) > 150


def packed(inp: Input) -> bytes:
    return msgpack.packb([[p.to_wire() for p in c] for c in inp.connections])


def test_frames_decode_as_encoded_with_their_history() -> None:
    """The harness's framing agrees with itself across compressed frames that use the
    history, and a rewritten zstd content size is what the frame then states."""
    encoder, bodies = Encoder(), [msgpack.packb([{"t": "ping", "n": i, "x": b"ab" * (i * 300)}])
                                  for i in range(12)]
    stream = encoder.frame(bodies[0])
    encoder.compress = True
    stream += b"".join(encoder.frame(b, squeeze=i % 2 == 0) for i, b in enumerate(bodies[1:]))
    decoder = Decoder(lambda first: True)
    got = [body for byte in stream for _, body in decoder.feed(bytes([byte]))]  # byte by byte
    assert got == bodies
    squeezed = zstandard.ZstdCompressor(write_content_size=True).compress(bodies[5])
    assert zstandard.frame_content_size(set_content_size(squeezed, 1000)) == 1000
