"""The daemon's log stays short (issue 14, item 18): a line is capped, a message's
newlines are folded, Python warnings go through the log, and watchdog's warning about a
directory it registers twice (which dumped every watched path, up to 900 KB a line, dozens
of times a minute under ``rdc watch`` clients) is not written at all."""

from __future__ import annotations

import io
import logging
import shutil
import signal
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdc_server import logs
from rdc_server.watcher import ignore_repeated_registration

from .e2e_support import E2E, RDC, STOP_SECONDS, wait_for, write


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger set up as the daemon does, into a buffer; restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    logs.setup(False, stream)
    try:
        yield stream
    finally:
        logging.captureWarnings(False)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_a_long_message_is_capped_and_folded(captured: io.StringIO) -> None:
    log = logging.getLogger("rdc.serve")
    log.info("#1: %s", "x" * 5000)
    log.warning("first line\nsecond line\n")
    lines = captured.getvalue().splitlines()
    assert len(lines) == 2
    assert len(lines[0]) <= logs.MAX_LINE + len("... (9,999 more characters)")
    assert lines[0].endswith(" more characters)")
    assert lines[1].endswith("rdc serve: first line | second line")


def test_a_bug_keeps_its_traceback(captured: io.StringIO) -> None:
    try:
        raise ValueError("a bug")
    except ValueError:
        logging.getLogger("rdc.serve").exception("#3 failed")
    text = captured.getvalue()
    assert "#3 failed\nTraceback (most recent call last):" in text and "ValueError: a bug" in text


def test_warnings_go_through_the_log(captured: io.StringIO) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("something a library thought worth saying", UserWarning, stacklevel=1)
    lines = captured.getvalue().splitlines()
    assert len(lines) == 1 and "UserWarning: something a library thought" in lines[0]


def test_only_the_repeated_registration_warning_is_silenced() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_repeated_registration()
        warnings.warn("Callback with id '140421890557584' already exists for watch <bound "
                      "method Watch.short_str of Watch(wd=36, ...)>. It will be Overwritten.",
                      RuntimeWarning, stacklevel=1)
        warnings.warn("another RuntimeWarning", RuntimeWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another RuntimeWarning"]


def nested_tree(root: Path, tops: int, depth: int) -> None:
    """``tops`` directories, each a chain ``depth`` deep with a file at the bottom, made as
    fast as ``mkdir -p`` makes them."""
    for t in range(tops):
        path = root.joinpath(f"top{t:03d}", *(f"d{level}" for level in range(depth)))
        path.mkdir(parents=True)
        write(path / "f.txt", f"{t}\n".encode())


def test_many_new_directories_in_a_watched_share_keep_the_logs_short(e2e: E2E) -> None:
    """Chains of new directories on the server's disk, in a share a client watches: the
    daemon's watcher sees them appear (watchdog registered some twice, and warned with
    every path it watched), and so does the client's, which receives them all."""
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    server = e2e.serve({"s": share})
    watch_log = e2e.tmp / "watch.log"
    with open(watch_log, "wb") as out:
        watcher = subprocess.Popen(
            [*RDC, "watch", str(here), server.url("s"), "--token-file", str(e2e.token_file),
             "--force"],  # the share is emptied on purpose: no deletion guard
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            env=dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "st")))
    e2e.started.append(watcher)
    tops, depth = 150, 5
    last = here.joinpath(f"top{tops - 1:03d}", *(f"d{level}" for level in range(depth)), "f.txt")
    try:
        wait_for(lambda: "connected" in watch_log.read_text(), 30, "the watch to connect")
        for _ in range(2):  # made, removed, made again
            nested_tree(share, tops, depth)
            wait_for(last.exists, 60, "the directories to reach the watcher")
            for top in share.iterdir():
                shutil.rmtree(top)
            wait_for(lambda: not any(here.iterdir()), 60, "the removal to reach it")
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(STOP_SECONDS)
    for text in (server.log(), watch_log.read_text()):
        assert "already exists for watch" not in text
        assert max(len(line) for line in text.splitlines()) <= logs.MAX_LINE + 40
        assert "Traceback" not in text
