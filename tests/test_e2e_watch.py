"""End to end: ``rdc sync`` and ``rdc watch`` with the real daemon and real clients.

Every wait polls a condition against a deadline (`wait_for`); watchers are killed at the
end of each test whatever happens.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attack.world import make_deep, remove

from .e2e_support import E2E, RDC, TEMP, snapshot, wait_for, write

SETTLE = 30.0  # seconds a change may take to reach everyone (the pure run is slow)


def same_content(a: Path, b: Path) -> bool:
    """Both trees hold the same entries, contents, modes and file times (two-way sync
    leaves directory times alone; conflict copies count as entries). A tree that changes
    under the walk (a sync at work) is not the same yet."""
    def view(root: Path) -> dict:
        in_flight = lambda rel: TEMP.match(rel.rpartition(b"/")[2]) is not None  # noqa: E731
        return {rel: (n.kind, n.mode, n.digest, n.mtime_ns if n.kind != "d" else 0)
                for rel, n in snapshot(root, in_flight).items()}
    try:
        return view(a) == view(b)
    except FileNotFoundError:
        return False


class Watchers:
    """``rdc watch`` processes, each with its own state and cache directories."""

    def __init__(self, e2e: E2E) -> None:
        self.e2e = e2e
        self.processes: list[subprocess.Popen[bytes]] = []

    def env(self, name: str) -> dict[str, str]:
        env = dict(self.e2e.env)
        env["XDG_STATE_HOME"] = str(self.e2e.tmp / f"state-{name}")
        env["XDG_CACHE_HOME"] = str(self.e2e.tmp / f"cache-{name}")
        return env

    def sync(self, local: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*RDC, "sync", str(local), url, "--token-file", str(self.e2e.token_file), *extra],
            capture_output=True, env=self.env(local.name), timeout=60,
        )

    def start(self, local: Path, url: str) -> subprocess.Popen[bytes]:
        log = open(self.e2e.tmp / f"watch-{local.name}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            [*RDC, "watch", str(local), url, "--token-file", str(self.e2e.token_file), "-v"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env(local.name),
        )
        log.close()
        self.processes.append(process)
        return process

    def log(self, local: Path) -> str:
        path = self.e2e.tmp / f"watch-{local.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for log in sorted(self.e2e.tmp.glob("watch-*.log")):  # shown if the test failed
            print(f"==== {log.name}\n{log.read_text(errors='replace')}")
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@pytest.fixture
def watchers(e2e: E2E) -> Iterator[Watchers]:
    w = Watchers(e2e)
    try:
        yield w
    finally:
        w.stop_all()


def test_sync_both_ways_with_a_conflict(e2e: E2E, watchers: Watchers) -> None:
    share, local = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    local.mkdir()
    server = e2e.serve({"s": share})
    url = server.url("s")
    write(local / "notes.txt", b"first\n")
    write(local / "both.txt", b"common\n")
    assert watchers.sync(local, url).returncode == 0
    assert same_content(local, share)
    write(local / "notes.txt", b"first\nedited here\n")
    write(share / "there.txt", b"made on the server\n")
    write(local / "both.txt", b"local version\n")
    write(share / "both.txt", b"server version\n")
    os.utime(share / "both.txt", ns=(2_000_000_000 * 10**9,) * 2)  # the newer one
    done = watchers.sync(local, url)
    assert done.returncode == 0, done.stderr
    assert b"conflict: both.txt" in done.stderr
    assert same_content(local, share)
    assert (share / "notes.txt").read_bytes().endswith(b"edited here\n")
    assert (local / "there.txt").exists()
    copies = [n for n in os.listdir(local) if n.startswith("both.sync-conflict-")]
    assert len(copies) == 1 and copies[0].endswith(".txt")
    assert (local / copies[0]).read_bytes() == b"local version\n"
    assert (local / "both.txt").read_bytes() == b"server version\n"


def test_watch_propagates_create_modify_delete_rename(e2e: E2E, watchers: Watchers) -> None:
    share = e2e.tmp / "share"
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    for d in (share, a, b):
        d.mkdir()
    server = e2e.serve({"s": share})
    watchers.start(a, server.url("s"))
    watchers.start(b, server.url("s"))
    wait_for(lambda: "connected" in watchers.log(a) and "connected" in watchers.log(b),
             SETTLE, "both watchers to connect")

    write(a / "created.txt", b"made in a\n")
    wait_for(lambda: (b / "created.txt").exists(), SETTLE, "a's new file to reach b")
    write(b / "created.txt", b"made in a\nmodified in b\n")
    wait_for(lambda: (a / "created.txt").read_bytes().endswith(b"modified in b\n"), SETTLE,
             "b's edit to reach a")
    (a / "sub").mkdir()
    os.rename(a / "created.txt", a / "sub" / "moved.txt")
    wait_for(lambda: (b / "sub" / "moved.txt").exists() and not (b / "created.txt").exists(),
             SETTLE, "the rename to reach b")
    write(share / "from-server.txt", b"edited on the server's own disk\n")
    wait_for(lambda: (a / "from-server.txt").exists() and (b / "from-server.txt").exists(),
             SETTLE, "a server-side edit to reach both")
    os.remove(b / "sub" / "moved.txt")
    wait_for(lambda: not (a / "sub" / "moved.txt").exists(), SETTLE, "b's deletion to reach a")
    wait_for(lambda: same_content(a, share) and same_content(b, share), SETTLE, "convergence")
    assert "Traceback" not in watchers.log(a) + watchers.log(b)


def test_three_watchers_with_random_edits_converge(e2e: E2E, watchers: Watchers) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    clients = [e2e.tmp / f"c{i}" for i in range(3)]
    for c in clients:
        c.mkdir()
        watchers.start(c, server.url("s"))
    wait_for(lambda: all("connected" in watchers.log(c) for c in clients), SETTLE,
             "three watchers to connect")
    rng = random.Random(7)
    for step in range(24):
        c = rng.choice(clients)
        name = f"f{rng.randrange(8)}.txt"
        if rng.random() < 0.2 and (c / name).exists():
            os.remove(c / name)
        else:
            write(c / name, f"step {step} by {c.name}\n".encode() * rng.randint(1, 300))
        if step % 6 == 5:  # let some changes cross, others pile up
            wait_for(lambda: all(same_content(x, share) for x in clients), 3 * SETTLE,
                     f"convergence after step {step}")
    wait_for(lambda: all(same_content(x, share) for x in clients), 3 * SETTLE, "convergence",
             interval=0.2)
    logs = "".join(watchers.log(c) for c in clients)
    assert "Traceback" not in logs


def test_watchers_catch_up_after_the_server_restarts(e2e: E2E, watchers: Watchers) -> None:
    share = e2e.tmp / "share"
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    for d in (share, a, b):
        d.mkdir()
    server = e2e.serve({"s": share})
    port = server.port
    watchers.start(a, server.url("s"))
    watchers.start(b, server.url("s"))
    write(a / "before.txt", b"before the restart\n")
    wait_for(lambda: (b / "before.txt").exists(), SETTLE, "a first change to cross")

    assert server.stop(signal.SIGTERM) == 0
    write(a / "while-away.txt", b"made while the server was down\n")
    os.remove(b / "before.txt")
    again = e2e.serve({"s": share}, None, "--listen", f"127.0.0.1:{port}")
    assert again.port == port
    wait_for(lambda: (b / "while-away.txt").exists() and not (a / "before.txt").exists(),
             3 * SETTLE, "both watchers to reconnect and catch up", interval=0.2)
    wait_for(lambda: same_content(a, share) and same_content(b, share), SETTLE, "convergence")
    assert "trying again" in watchers.log(a) + watchers.log(b)


def test_ctrl_c_stops_a_watch_cleanly(e2e: E2E, watchers: Watchers) -> None:
    share, local = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    local.mkdir()
    server = e2e.serve({"s": share})
    process = watchers.start(local, server.url("s"))
    wait_for(lambda: "connected" in watchers.log(local), SETTLE, "the watcher to connect")
    process.send_signal(signal.SIGINT)
    assert process.wait(15) == 130
    assert "interrupted" in watchers.log(local) and "Traceback" not in watchers.log(local)


MOVED_IN = """
import os, sys, trio
from rdc_server.watcher import ShareWatcher

changes = 0

def changed() -> None:
    global changes
    changes += 1

async def main(share: str, aside: str) -> None:
    watcher = ShareWatcher("s", share, changed)
    await trio.sleep(0.3)
    os.rename(aside, os.path.join(share, "a"))
    await trio.sleep(2)
    before = changes
    with open(os.path.join(share, "later.txt"), "w") as f:
        f.write("a local edit")
    for _ in range(100):
        await trio.sleep(0.05)
        if changes > before:
            break
    watcher.stop()
    print(changes - before)

trio.run(main, sys.argv[1], sys.argv[2])
"""


def test_the_share_watcher_survives_a_deep_tree_moved_in(tmp_path: Path) -> None:
    """A tree 1,500 levels deep moved into a watched share: watchdog walked it with
    os.walk, which recursed past Python's limit and killed its thread; a local edit after
    it went unnoticed for the daemon's lifetime."""
    (tmp_path / "share").mkdir()
    (tmp_path / "aside").mkdir()
    make_deep(tmp_path / "aside", 1500)
    try:
        done = subprocess.run([sys.executable, "-c", MOVED_IN, str(tmp_path / "share"),
                               str(tmp_path / "aside" / "a")], capture_output=True,
                              timeout=60)
    finally:  # pytest's clean-up (shutil.rmtree) recurses per level
        remove(tmp_path / "share")
        remove(tmp_path / "aside")  # where the tree stays if it was never moved
    assert b"Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0 and int(done.stdout) >= 1, done
