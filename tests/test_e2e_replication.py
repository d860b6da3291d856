"""End to end: file-server replication with real ``rdc serve`` processes on loopback. A
primary and two replicas, a chain of three, a two-way pair with a conflict, a replica
killed mid-round, a partition of 1,000 changes, a receive-only mirror whose local edits are
undone and kept, status and versions.

Every wait polls a condition against a deadline (`wait_for`); every process is stopped at
the end of its test whatever happens.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import scaled
from .e2e_support import (
    E2E,
    OTHER_TOKEN,
    RDC,
    TEMP,
    TOKEN,
    Server,
    random_file,
    snapshot,
    temporaries,
    wait_for,
    write,
)

SETTLE = 30.0  # seconds a change may take to reach every replica (the pure run is slow)


def view(root: Path) -> dict[bytes, tuple]:
    """What replication keeps equal: entries, file contents, modes and times (directory
    times are each machine's own)."""
    def skip(rel: bytes) -> bool:
        return TEMP.match(rel.rpartition(b"/")[2]) is not None
    return {rel: (n.kind, n.mode, n.digest, n.mtime_ns if n.kind != "d" else 0)
            for rel, n in snapshot(root, skip).items()}


def same(*roots: Path) -> bool:
    try:
        first = view(roots[0])
        return all(view(root) == first for root in roots[1:])
    except FileNotFoundError:  # a tree changing under the walk is not the same yet
        return False


class World:
    """Servers whose shares follow each other, and ``rdc`` commands with their own state
    directory (sync bases, versions)."""

    def __init__(self, e2e: E2E) -> None:
        self.e2e = e2e
        self.env = dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "client-state"))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.configs: dict[str, Path] = {}

    def primary(self, name: str, share: Path, *extra: str, tokens: Path | None = None
                ) -> Server:
        share.mkdir(exist_ok=True)
        return self.e2e.serve({"s": share}, None, *extra, state=self.e2e.tmp / f"st-{name}",
                              token_file=tokens)

    def replica(self, name: str, share: Path, upstream: str, mode: str = "receive-only",
                *extra: str, listen: str = "127.0.0.1:0", **settings: str) -> Server:
        """A server whose share ``m`` follows ``upstream``; ``settings`` go in its follow
        table (``versions`` in the share's)."""
        share.mkdir(exist_ok=True)
        config = self.e2e.tmp / f"{name}.toml"
        versions = settings.pop("versions", None)
        lines = ["[shares.m]", f'path = "{share}"']
        if versions:
            lines.append(f'versions = "{versions}"')
        lines += ["[shares.m.follow]", f'url = "{upstream}"',
                  f'token_file = "{self.e2e.token_file}"', f'mode = "{mode}"']
        lines += [f'{key} = "{value}"' for key, value in settings.items()]
        config.write_text("\n".join(lines) + "\n")
        self.configs[name] = config
        return self.e2e.serve(None, None, "--config", str(config), "--listen", listen, *extra,
                              state=self.e2e.tmp / f"st-{name}")

    def again(self, name: str, server: Server) -> Server:
        """``server`` (a replica) started again on its port, with its config and state."""
        return self.e2e.serve(None, None, "--config", str(self.configs[name]), "--listen",
                              f"127.0.0.1:{server.port}", state=self.e2e.tmp / f"st-{name}")

    def rdc(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*RDC, *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def status(self, url: str) -> dict:
        done = self.rdc("status", url, "--json", "--token-file", str(self.e2e.token_file))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def watch(self, local: Path, url: str, *extra: str, token_file: Path | None = None
              ) -> subprocess.Popen[bytes]:
        log = open(self.e2e.tmp / f"watch-{local.name}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            [*RDC, "watch", str(local), url, "--token-file",
             str(token_file or self.e2e.token_file), *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env,
        )
        log.close()
        self.processes.append(process)
        return process

    def watch_log(self, local: Path) -> str:
        path = self.e2e.tmp / f"watch-{local.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for log in sorted(self.e2e.tmp.glob("watch-*.log")):
            print(f"==== {log.name}\n{log.read_text(errors='replace')}")


@pytest.fixture
def world(e2e: E2E) -> Iterator[World]:
    w = World(e2e)
    try:
        yield w
    finally:
        w.close()


def follower(status: dict) -> dict:
    [entry] = [p for p in status["peers"] if p["role"] == "follows"]
    return entry


def some_files(root: Path, seed: int, count: int = 12) -> None:
    rng = random.Random(seed)
    (root / "sub" / "deeper").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        where = root / ("sub" if i % 3 else "") / ("deeper" if i % 3 and i % 4 == 0 else "")
        write(where / f"file-{i}.txt", f"{seed} {i}\n".encode() * rng.randint(1, 4000))
    os.symlink("sub/file-1.txt", root / "link")


# ---------------------------------------------------------------- topologies


def test_a_primary_and_two_replicas(e2e: E2E, world: World) -> None:
    a, b, c = (e2e.tmp / n for n in "abc")
    primary = world.primary("a", a)
    some_files(a, 1)
    one = world.replica("b", b, primary.url("s"))
    two = world.replica("c", c, primary.url("s"))
    wait_for(lambda: same(a, b, c), SETTLE, "both replicas to copy the primary")

    write(a / "sub" / "file-1.txt", b"edited on the primary\n")
    os.rename(a / "sub" / "file-2.txt", a / "renamed.txt")
    os.remove(a / "sub" / "deeper" / "file-4.txt")
    (a / "new-dir").mkdir()
    write(a / "new-dir" / "new.txt", b"created\n")
    wait_for(lambda: same(a, b, c), SETTLE, "the changes to reach both replicas")

    local = e2e.tmp / "client"
    local.mkdir()
    write(local / "x.txt", b"a client's write\n")
    refused = e2e.push(local, one.url("m"))
    assert refused.returncode == 4 and "read-only replica of" in refused.stderr, refused
    assert not (b / "x.txt").exists()
    pushed = e2e.push(local, primary.url("s", "from-client")).ok()
    assert pushed.stats["files_transferred"] == 1
    wait_for(lambda: (b / "from-client" / "x.txt").exists() and same(a, b, c), SETTLE,
             "a client's push to the primary to reach both replicas")

    def both_in_step() -> bool:
        replicas = [p for p in world.status(primary.url("s"))["peers"]
                    if p["role"] == "replica"]
        return len(replicas) == 2 and all(p["state"] == "in step" for p in replicas)

    wait_for(both_in_step, SETTLE, "the primary's status to show two replicas in step")
    mine = follower(world.status(two.url("m")))
    assert mine["state"] == "in step" and mine["name"] == primary.url("s")
    assert mine["last_ok_seconds_ago"] is not None and mine["pending"] == 0
    text = world.rdc("status", primary.url("s"), "--token-file", str(e2e.token_file))
    assert text.returncode == 0 and text.stdout.count("replica") == 2, text.stdout
    assert "Traceback" not in primary.log() + one.log() + two.log()


def test_a_chain_of_three(e2e: E2E, world: World) -> None:
    a, b, c = (e2e.tmp / n for n in "abc")
    primary = world.primary("a", a)
    some_files(a, 2)
    middle = world.replica("b", b, primary.url("s"))
    world.replica("c", c, middle.url("m"))
    wait_for(lambda: same(a, b, c), SETTLE, "the end of the chain to copy the primary")
    write(a / "file-0.txt", b"edited at the head of the chain\n")
    os.remove(a / "sub" / "file-5.txt")
    wait_for(lambda: same(a, b, c), SETTLE, "a change to run down the chain")
    assert (c / "file-0.txt").read_bytes() == b"edited at the head of the chain\n"


def test_a_two_way_pair_with_a_conflict(e2e: E2E, world: World) -> None:
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    primary = world.primary("a", a)
    some_files(a, 3)
    pair = world.replica("b", b, primary.url("s"), "two-way")
    wait_for(lambda: same(a, b), SETTLE, "the pair to start in step")
    write(b / "made-on-b.txt", b"b's own file\n")
    wait_for(lambda: (a / "made-on-b.txt").exists(), SETTLE, "b's change to reach a")
    write(a / "made-on-a.txt", b"a's own file\n")
    wait_for(lambda: (b / "made-on-a.txt").exists(), SETTLE, "a's change to reach b")
    wait_for(lambda: same(a, b), SETTLE, "the pair in step")

    assert pair.stop() == 0  # both sides edit the same file while apart
    write(a / "file-0.txt", b"a's version\n")
    os.utime(a / "file-0.txt", ns=(1_700_000_000 * 10**9,) * 2)  # the older one
    write(b / "file-0.txt", b"b's version\n")
    world.again("b", pair)
    copies = lambda root: [n for n in os.listdir(root)  # noqa: E731
                           if n.startswith("file-0.sync-conflict-")]
    wait_for(lambda: copies(a) and copies(b) and same(a, b), SETTLE,
             "the conflict copy on both sides")
    assert (a / "file-0.txt").read_bytes() == b"b's version\n"  # the newer one stays
    [copy] = copies(a)
    assert (a / copy).read_bytes() == b"a's version\n" and copy.endswith(".txt")


# ---------------------------------------------------------------- failures


def test_a_replica_killed_mid_round_catches_up(e2e: E2E, world: World) -> None:
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    primary = world.primary("a", a)
    for i in range(40):
        random_file(a / f"part-{i:02}.bin", 64 << 10, seed=i)
    random_file(a / "big.bin", 3 << 20, seed=99)
    # 2 MiB/s each way: the first round takes a few seconds, so it can be cut.
    replica = world.replica("b", b, primary.url("s"), bwlimit="2M")
    wait_for(lambda: len(os.listdir(b)) >= 3, SETTLE, "the first round to be under way",
             interval=0.02)
    replica.kill()
    assert not same(a, b)
    again = world.again("b", replica)
    wait_for(lambda: same(a, b), 2 * SETTLE, "the restarted replica to catch up")
    wait_for(lambda: not temporaries(b), SETTLE, "no temporaries left")
    assert "connected" in again.log() and "Traceback" not in again.log()


@pytest.mark.slow
def test_a_partition_of_1000_changes_is_caught_up_by_a_sync(e2e: E2E, world: World) -> None:
    """A replica stopped while 1,000 changes land on the primary converges when it
    returns, receiving what a sync sends, not a copy of the tree. (The pure-Python run
    makes a quarter of them: its hashing is a hundred times slower.)"""
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    primary = world.primary("a", a)
    files, changes = scaled(2000, 600), scaled(1000, 250)
    size = 8 << 10
    for i in range(files):
        (a / f"d{i % 40:02}").mkdir(exist_ok=True)
        random_file(a / f"d{i % 40:02}" / f"f{i:04}.bin", size, seed=i)
    replica = world.replica("b", b, primary.url("s"))
    wait_for(lambda: same(a, b), 3 * SETTLE, "the first copy", interval=0.2)
    assert replica.stop() == 0

    rng = random.Random(5)
    names = sorted((d / n).relative_to(a) for d in a.iterdir() if d.is_dir()  # (not .rdc-folder)
                   for n in os.listdir(d))
    rng.shuffle(names)
    tenth = changes // 10
    edits, renames = names[: 7 * tenth], names[7 * tenth : 8 * tenth]
    deletes = names[8 * tenth : 9 * tenth]
    for rel in edits:  # a few bytes inserted into each
        path = a / rel
        data = path.read_bytes()
        at = rng.randrange(len(data))
        path.write_bytes(data[:at] + b"edit!" + data[at:])
    for rel in renames:
        os.rename(a / rel, a / rel.parent / f"renamed-{rel.name}")
    for rel in deletes:
        os.remove(a / rel)
    (a / "new").mkdir()
    for i in range(tenth):
        random_file(a / "new" / f"n{i:03}.bin", size, seed=10_000 + i)

    again = world.again("b", replica)
    wait_for(lambda: same(a, b), 3 * SETTLE, "the replica to catch up", interval=0.2)
    received = follower(world.status(again.url("m")))["bytes"]
    tree = files * size
    new_data = tenth * size  # what no sync can avoid sending
    assert received < new_data + 0.15 * tree, (received, tree)
    assert "Traceback" not in again.log()


# ---------------------------------------------------------------- mirrors and versions


def test_a_receive_only_mirror_undoes_local_edits_and_keeps_them(
    e2e: E2E, world: World
) -> None:
    share, mirror = e2e.tmp / "share", e2e.tmp / "mirror"
    mirror.mkdir()
    tokens, readonly = e2e.tmp / "server-tokens", e2e.tmp / "ro-token"
    tokens.write_text(f"{TOKEN}\n{OTHER_TOKEN} s:ro\n")
    readonly.write_text(f"{OTHER_TOKEN}\n")
    server = world.primary("a", share, tokens=tokens)
    some_files(share, 4)
    world.watch(mirror, server.url("s"), "--mode", "receive-only", token_file=readonly)
    wait_for(lambda: same(share, mirror), SETTLE, "the mirror to copy the share")

    write(mirror / "file-0.txt", b"a local edit\n")
    write(mirror / "local-only.txt", b"made in the mirror\n")
    os.remove(mirror / "sub" / "file-1.txt")
    wait_for(lambda: same(share, mirror), SETTLE, "the local changes to be undone")
    assert not (share / "local-only.txt").exists()

    listed = world.rdc("versions", "list", str(mirror), "--json")
    assert listed.returncode == 0, listed.stderr
    kept = {v["path"] for v in json.loads(listed.stdout)}
    assert kept == {"file-0.txt", "local-only.txt"}
    out = e2e.tmp / "restored.txt"
    back = world.rdc("versions", "restore", str(mirror), "file-0.txt", "--to", str(out))
    assert back.returncode == 0, back.stderr
    assert out.read_bytes() == b"a local edit\n"

    def watching() -> bool:
        peers = world.status(server.url("s"))["peers"]
        return any(p["role"] == "watch" and p["mode"] == "receive-only"
                   and p["state"] == "in step" for p in peers)

    wait_for(watching, SETTLE, "the watcher in the server's status")
    assert "Traceback" not in world.watch_log(mirror)


def test_a_share_with_versions_keeps_what_a_push_deletes(e2e: E2E, world: World) -> None:
    share, src = e2e.tmp / "share", e2e.tmp / "src"
    share.mkdir()
    config = e2e.tmp / "versions.toml"
    config.write_text(f'[shares.v]\npath = "{share}"\nversions = "3"\n')
    server = e2e.serve(None, None, "--config", str(config), state=e2e.tmp / "st")
    some_files(src, 6)
    e2e.push(src, server.url("v")).ok()
    deleted = (src / "sub" / "file-2.txt").read_bytes()
    write(src / "file-0.txt", b"the new version\n")
    os.remove(src / "sub" / "file-2.txt")
    e2e.push(src, server.url("v"), "--delete").ok()
    store = e2e.tmp / "st" / "versions" / "v"
    listed = world.rdc("versions", "list", str(store), "--json")
    assert listed.returncode == 0, listed.stderr
    assert {v["path"] for v in json.loads(listed.stdout)} == {"file-0.txt", "sub/file-2.txt"}
    back = world.rdc("versions", "restore", str(store), "sub/file-2.txt")
    assert back.returncode == 0, back.stderr
    assert (share / "sub" / "file-2.txt").read_bytes() == deleted


def test_sync_modes_and_client_versions_from_the_command_line(e2e: E2E, world: World) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    here.mkdir()
    tokens, readonly = e2e.tmp / "server-tokens", e2e.tmp / "ro-token"
    tokens.write_text(f"{TOKEN}\n{OTHER_TOKEN} s:ro\n")
    readonly.write_text(f"{OTHER_TOKEN}\n")
    server = world.primary("a", share, tokens=tokens)
    some_files(share, 7)
    url, ro = server.url("s"), ["--token-file", str(readonly)]
    two_way = world.rdc("sync", str(here), url, *ro)
    assert two_way.returncode == 4 and "read-only" in two_way.stderr  # needs writing
    mirror = world.rdc("sync", str(here), url, "--mode", "receive-only", *ro)
    assert mirror.returncode == 0, mirror.stderr
    assert same(share, here)

    rw = ["--token-file", str(e2e.token_file)]
    write(here / "file-0.txt", b"sent up\n")
    write(share / "sub" / "file-1.txt", b"changed on the server\n")
    sent = world.rdc("sync", str(here), url, "--mode", "send-only", *rw)
    assert sent.returncode == 0, sent.stderr
    assert (share / "file-0.txt").read_bytes() == b"sent up\n"
    assert (here / "sub" / "file-1.txt").read_bytes() != b"changed on the server\n"

    before = (here / "sub" / "file-1.txt").read_bytes()
    both = world.rdc("sync", str(here), url, "--versions", "2", *rw)
    assert both.returncode == 0, both.stderr
    assert (here / "sub" / "file-1.txt").read_bytes() == b"changed on the server\n"
    listed = world.rdc("versions", "list", str(here), "sub", "--json")
    [kept] = json.loads(listed.stdout)
    assert kept["path"] == "sub/file-1.txt" and kept["size"] == len(before)
    back = world.rdc("versions", "restore", str(here), "sub/file-1.txt")
    assert back.returncode == 0, back.stderr
    assert (here / "sub" / "file-1.txt").read_bytes() == before
    assert len(json.loads(world.rdc("versions", "list", str(here), "--json").stdout)) == 2

    missing = world.rdc("versions", "list", str(e2e.tmp / "nowhere"))
    assert missing.returncode == 3 and "not a directory" in missing.stderr
    none = world.rdc("versions", "list", str(share))
    assert none.returncode == 2 and "no versions kept" in none.stderr
    bad = world.rdc("sync", str(here), url, "--versions", "forever", *rw)
    assert bad.returncode == 2 and "bad versions policy" in bad.stderr
    for output in (two_way, mirror, sent, both, back, missing, none, bad):
        assert "Traceback" not in output.stderr


def test_bwlimit_holds_a_push_to_its_rate(e2e: E2E, world: World) -> None:
    share, src = e2e.tmp / "share", e2e.tmp / "src"
    src.mkdir()
    server = world.primary("a", share)
    random_file(src / "one.bin", 1 << 20, seed=3)
    pushed = e2e.push(src, server.url("s"), "--bwlimit", "256K").ok()
    assert (share / "one.bin").read_bytes() == (src / "one.bin").read_bytes()
    # 1 MiB at 256 KiB/s: at least about 4 s whatever the machine (a lower bound only).
    assert pushed.stats["seconds"] >= 3.5, pushed.stats
    bad = e2e.push(src, server.url("s"), "--bwlimit", "fast")
    assert bad.returncode == 2 and "bad rate" in bad.stderr
