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

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import trio
import trio.testing

from rdc.errors import ProtocolError
from rdc.wire.frames import ConnectionClosed, FrameStream
from tests.attack.capture import Captured, capture_sessions
from tests.attack.directed import directed
from tests.attack.fuzzer import Fuzzer
from tests.attack.inputs import Input, dump, load
from tests.attack.mutate import LEVELS, generate
from tests.attack.oracle import FLOODS, Flood
from tests.attack.report import MIB, Report, Settings
from tests.attack.wire import Breakage, Decoder, Encoder
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
    inputs = directed(SEED, world)
    settings = Settings(inputs=0, seed=SEED, jobs=1, batch=1, results=tmp_path / "results",
                        floods=False, reference=WARM)
    fuzzer = Fuzzer(world, captured, settings)
    fuzzer.inputs = {inp.index: inp for inp in inputs}
    report = fuzzer.run([inp.index for inp in inputs])
    assert report.inputs == len(inputs)
    assert not report.findings, findings(report)


@pytest.mark.parametrize("flood", FLOODS, ids=lambda f: f.__name__)
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


def _bodies(n: int) -> list[bytes]:
    return [msgpack.packb([{"t": "ping", "n": i, "x": b"ab" * (i * 300)}]) for i in range(n)]


async def _received_by_rdc(stream: bytes) -> list[bytes]:
    """``stream`` as rdc's own receiver (`rdc.wire.frames.FrameStream`) decodes it,
    compression agreed: the bodies, re-packed."""
    sender, receiver = trio.testing.memory_stream_one_way_pair()
    frames = FrameStream(receiver)
    frames.compress = True
    await sender.send_all(stream)
    await sender.aclose()
    out = []
    with contextlib.suppress(ConnectionClosed):
        while True:
            out.append(msgpack.packb(await frames.receive()))
    return out


async def _sent_by_rdc(bodies: list[bytes]) -> bytes:
    """What rdc's own sender puts on the wire for ``bodies`` (each a msgpack array),
    compressed; its level changes half-way, which starts a new zstd frame."""
    sender, receiver = trio.testing.memory_stream_one_way_pair()
    frames = FrameStream(sender, level=6)
    frames.compress = True
    for n, body in enumerate(bodies):
        if n == len(bodies) // 2:
            frames.level = 1
        await frames.send(msgpack.unpackb(body))
    await sender.aclose()
    out = b""
    while data := await receiver.receive_some():
        out += data
    return out


def test_the_harness_frames_agree_with_rdcs_own() -> None:
    """Compressed frames in one stream per direction: what the harness sends, rdc's
    receiver decodes (the stream restarted once, as a sender changing levels does), and
    what rdc sends, the harness decodes, fed one byte at a time."""
    bodies = _bodies(12)
    encoder = Encoder()
    stream = b"".join(encoder.frame(b, squeeze=i % 3 != 0, breakage=Breakage(
        "new_frame", 6) if i == 7 else None) for i, b in enumerate(bodies))
    assert trio.run(_received_by_rdc, stream) == bodies
    decoder = Decoder()
    wire = trio.run(_sent_by_rdc, bodies)
    got = [(squeezed, body) for byte in wire for squeezed, body in decoder.feed(bytes([byte]))]
    assert [body for _, body in got] == bodies
    assert sum(squeezed for squeezed, _ in got) >= 10  # the stream, not plain frames


@pytest.mark.parametrize("breakage", [
    Breakage("plain_size", 5), Breakage("plain_size", 2**32 - 1), Breakage("no_plain_size"),
    Breakage("unflushed"), Breakage("restart"), Breakage("wide_window", 24),
    Breakage("bomb", 16 << 20, 4 << 20), Breakage("length", 5), Breakage("flag"),
], ids=lambda b: f"{b.kind}-{b.value}")
def test_each_breakage_of_the_stream_is_refused_by_rdc(breakage: Breakage) -> None:
    """A mutation that breaks section 1 breaks it: rdc's own receiver refuses the frame
    (after two good compressed frames, so that a restarted stream is a wrong one)."""
    bodies = _bodies(3)
    encoder = Encoder()
    stream = b"".join(encoder.frame(b, squeeze=True) for b in bodies[:2])
    stream += encoder.frame(bodies[2], squeeze=True, breakage=breakage)
    with pytest.raises((ProtocolError, ConnectionClosed)):
        assert trio.run(_received_by_rdc, stream) != bodies


@pytest.mark.parametrize(("series", "leak"), [
    ([61, 94, 242, 175, 126, 132, 152, 202, 187, 205, 184, 231], False),  # a real run's
    ([100, 240, 120, 230, 110, 250, 130, 220, 140, 235] * 5, False),  # swings, level
    ([100 + 20 * n for n in range(20)], True),  # 20 MiB more after every batch
    ([150] * 10 + [450] * 10, True),  # a step that stays
])
def test_memory_that_keeps_growing_is_told_from_a_swinging_working_set(
        series: list[int], leak: bool) -> None:
    from types import SimpleNamespace

    found: list[tuple] = []
    fuzzer = SimpleNamespace(after=[], settings=Settings(), found=lambda *a: found.append(a))
    for mib in series:
        Fuzzer._trend(fuzzer, mib * MIB)  # type: ignore[arg-type]
    assert bool(found) == leak


@pytest.mark.parametrize("works", [True, False])
def test_a_batch_settles_once_a_busy_server_lets_go_not_at_the_idle_bound(
        monkeypatch: pytest.MonkeyPatch, works: bool) -> None:
    """A server still at work on an input (CPU here; a slow disk on CI) is waited for past
    the idle bound; one that idles holding a socket is not (that is a leak)."""
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from tests.attack import fuzzer as fuzzing
    from tests.attack.world import descriptor_targets

    held = 1.5  # seconds the child keeps its extra socket
    child = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.readline()\n"
        "s = socket.socket(); sys.stdout.write('held\\n'); sys.stdout.flush()\n"
        f"end = time.monotonic() + {held}\n"
        f"while time.monotonic() < end: {'pass' if works else 'time.sleep(0.01)'}\n"
        "s.close(); time.sleep(30)\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "up\n"
        baseline = descriptor_targets(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "held\n"
        monkeypatch.setattr(fuzzing, "SETTLE_SECONDS", 0.5)
        fuzzer = SimpleNamespace(world=SimpleNamespace(daemon=SimpleNamespace(pid=child.pid)),
                                 baseline_fds=baseline)
        start = time.monotonic()
        fuzzing.Fuzzer._settle(fuzzer)  # type: ignore[arg-type]
        waited = time.monotonic() - start
        sockets = sum(t.startswith("socket:") for t in descriptor_targets(child.pid))
        assert sockets == (0 if works else 1)
        assert (waited >= held * 0.9) == works
    finally:
        child.kill()
        child.wait()
