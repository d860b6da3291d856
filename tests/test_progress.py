"""Progress displays (issue 14, item 10): what a transfer's bar shows at each step, driven
by a fake clock, and what the real ``rdc pull``, ``sync`` and ``watch`` print on a
pseudo-terminal: the totals from the start, a bar that fills with the work (never full
before the end), the rate, and an ETA once there is enough to go on."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rdc.transfer.stats import Options, Progress
from rdc_client.progress import ETA_AFTER, ProgressLine, TransferBar, clock_time, estimate

from .e2e_support import E2E, RDC, STOP_SECONDS, random_file, wait_for, write

BAR = re.compile(r"\[([#.]+)\]\s+(\d+)% ([\d,]+)/([\d,]+) files")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drawn(stream: io.StringIO) -> list[str]:
    return [part.rstrip() for part in stream.getvalue().replace("\n", "\r").split("\r")
            if part.strip()]


def test_the_bar_shows_totals_at_once_then_rate_and_eta() -> None:
    clock, out = Clock(), io.StringIO()
    bar = TransferBar(out, interval=0, enabled=True, clock=clock)
    progress = Progress(Options(progress=bar), 4, 4000)
    assert drawn(out) == ["[........................]   0% 0/4 files, 0 B/4.0 KB, 0 B/s, wire 0 B"]
    clock.now += 0.5
    progress.file_done("a", 1000)
    assert "ETA" not in drawn(out)[-1]  # too early to tell
    clock.now += 0.5  # one second in, a quarter of the bytes: three seconds to go
    progress.file_done("b", 0)
    progress.file_done("c", 1000)
    line = drawn(out)[-1]
    assert line.startswith("[############............]  50% 3/4 files, 2.0 KB/4.0 KB, ")
    assert "2.0 KB/s" in line and line.endswith("ETA 0:01"), line
    clock.now += 1
    progress.file_done("d", 2000)
    assert drawn(out)[-1].startswith("[########################] 100% 4/4 files")
    bar.close()
    assert out.getvalue().endswith("\n")


def test_without_sizes_the_bar_follows_the_files() -> None:
    """A plan without sizes (bytes total 0) is not a full bar from the start."""
    out = io.StringIO()
    bar = TransferBar(out, interval=0, enabled=True, clock=Clock())
    progress = Progress(Options(progress=bar), 4, 0)
    progress.file_done("a", 190)
    assert drawn(out)[-1].startswith("[######..................]  25% 1/4 files")


def test_the_bar_is_rate_limited_but_draws_the_end() -> None:
    clock, out = Clock(), io.StringIO()
    bar = TransferBar(out, interval=0.2, enabled=True, clock=clock)
    progress = Progress(Options(progress=bar), 100, 100)
    for n in range(100):
        progress.file_done(str(n), 1)
    lines = drawn(out)
    assert len(lines) == 2 and "100/100 files" in lines[-1]


def test_the_scan_line_estimates_too() -> None:
    from rdc.local.index import Progress as ScanProgress

    clock, out = Clock(), io.StringIO()
    line = ProgressLine(out, interval=0, enabled=True, clock=clock)
    line(ScanProgress(0, 10, 0, 10_000, ""))
    clock.now += 2
    line(ScanProgress(5, 10, 2_500, 10_000, "x"))
    assert drawn(out)[-1] == "signing 5/10 files, 2.5 KB of 10.0 KB, 1.2 KB/s, ETA 0:06"
    line.close()
    assert drawn(out) == [] or out.getvalue().endswith("\r")


@given(done=st.integers(0, 10**9), total=st.integers(0, 10**9),
       elapsed=st.floats(0, 10**5, allow_nan=False))
def test_estimates_are_sane(done: int, total: int, elapsed: float) -> None:
    text = estimate(done, total, elapsed)
    if elapsed < ETA_AFTER or done <= 0 or done >= total:
        assert text == ""
    else:
        seconds = (total - done) * elapsed / done
        assert text == f"ETA {clock_time(seconds)}"
        assert re.fullmatch(r"ETA (\d+:)?\d{1,2}:\d\d", text)


# ---------------------------------------------------------------- on a terminal


def run_on_pty(command: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run ``command`` with stdout and stderr on a pseudo-terminal; its status and all it
    wrote there."""
    master, slave = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                               env=env)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the other end is closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        status = process.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait(STOP_SECONDS)
    return status, b"".join(chunks).decode(errors="replace")


def bars(screen: str) -> list[tuple[str, int, int, int]]:
    """Every bar drawn: (bar, percent, files done, files total)."""
    out = []
    for part in screen.replace("\n", "\r").split("\r"):
        found = BAR.search(part)
        if found:
            out.append((found.group(1), int(found.group(2)),
                        int(found.group(3).replace(",", "")),
                        int(found.group(4).replace(",", ""))))
    return out


def assert_fills(drawn_bars: list[tuple[str, int, int, int]], total: int) -> None:
    assert drawn_bars, "no bar was drawn"
    assert drawn_bars[0][2] == 0 and drawn_bars[0][3] == total, drawn_bars[0]
    assert drawn_bars[-1][1:] == (100, total, total), drawn_bars[-1]
    assert "." not in drawn_bars[-1][0]
    for bar, percent, done, _ in drawn_bars[:-1]:
        assert "." in bar and percent < 100 and done < total, (bar, percent, done)
    done_counts = [b[2] for b in drawn_bars]
    assert done_counts == sorted(done_counts)


def source_tree(root: Path, files: int) -> None:
    root.mkdir()
    for n in range(files):
        random_file(root / f"f{n:03d}.bin", 40_000 + 97 * n, seed=n)


def test_pull_shows_the_plan_from_the_start_and_fills_on_a_terminal(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    source_tree(share, 120)
    server = e2e.serve({"s": share})
    status, screen = run_on_pty([*RDC, "pull", server.url("s"), str(e2e.tmp / "dst"),
                                 "--token-file", str(e2e.token_file), "--progress"], e2e.env)
    assert status == 0, screen
    assert_fills(bars(screen), 120)
    assert "MB/s" in screen or "KB/s" in screen
    assert screen.endswith("\r\n"), repr(screen[-200:])  # the last bar stays, then a newline


def test_sync_and_watch_show_progress_on_a_terminal(e2e: E2E) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    source_tree(share, 60)
    here.mkdir()
    server = e2e.serve({"s": share})
    env = dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "st"))
    status, screen = run_on_pty([*RDC, "sync", str(here), server.url("s"), "--token-file",
                                 str(e2e.token_file), "--progress"], env)
    assert status == 0, screen
    assert_fills(bars(screen), 60)

    watched = e2e.tmp / "watched"
    watched.mkdir()
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [*RDC, "watch", str(watched), server.url("s"), "--token-file", str(e2e.token_file),
         "--progress"], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
        env=dict(env, XDG_STATE_HOME=str(e2e.tmp / "st-watch")))
    os.close(slave)
    e2e.started.append(process)
    screen_parts: list[bytes] = []

    def read() -> str:
        while select.select([master], [], [], 0)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            screen_parts.append(data)
        return b"".join(screen_parts).decode(errors="replace")

    try:
        wait_for(lambda: "connected" in read(), 60, "the watch to connect")
        assert_fills(bars(read()), 60)
        write(share / "later.txt", b"one more\n")
        wait_for(lambda: any(b[3] == 1 and b[1] == 100 for b in bars(read())), 60,
                 "a bar for the file made later")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(STOP_SECONDS)
        os.close(master)
