"""End to end: a full disk. The server's state directory full, the share full (a file
whose name is not UTF-8 among those written), this machine's disk full on a pull: one
clear line that says what is full and where, exit 9, no traceback in the server's log, and
every old file intact. The disks fill by rdc.local.faults (see there why not for real)."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import scaled
from .e2e_support import (
    E2E,
    TEMP,
    Result,
    assert_same_tree,
    random_file,
    snapshot,
    stamp_times,
    temporaries,
    write,
)

FULL = 9


def a_tree(root: Path, seed: int) -> None:
    (root / "d").mkdir(parents=True, exist_ok=True)
    random_file(root / "big.bin", scaled(2 << 20, 300_000), seed=seed)
    for n in range(40):
        write(root / "d" / f"f{n:02}.txt", f"version {seed} of file {n}\n".encode() * 20)
    write(os.fsencode(root) + b"/caf\xe9-\xff.bin", f"latin-1, {seed}\n".encode() * 5000)
    stamp_times(root, seed=seed)


def one_clear_line(result: Result, *words: str) -> None:
    assert result.returncode == FULL, str(result)
    assert "Traceback" not in result.stderr, str(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rdc: no space left"), str(result)
    for word in words:
        assert word in lines[0], lines[0]


def files(tree: Path | dict) -> dict:
    """The files and links of a tree (a full disk may still touch a directory's time: a
    temporary was made there, and removed; the server may not have removed it yet when
    the client has already said why it stopped: the next run does)."""
    nodes = snapshot(tree) if isinstance(tree, Path) else tree
    return {rel: node for rel, node in nodes.items()
            if node.kind != "d" and not TEMP.match(rel.rsplit(b"/", 1)[-1])}


def with_env(e2e: E2E, **extra: str) -> None:
    e2e.env.update(extra)


def test_the_servers_state_directory_full(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    a_tree(src, seed=1)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    before = snapshot(share)
    server.stop()
    a_tree(src, seed=2)  # every file changes, and more come: the index must grow
    (src / "more").mkdir()
    for n in range(300):
        write(src / "more" / f"m{n:03}.txt", f"a new file, number {n}\n".encode() * 40)
    client_env = dict(e2e.env)
    with_env(e2e, RDC_TEST_INDEX_PAGES="1")  # the server's index cannot grow
    server = e2e.serve({"s": share})
    e2e.env = client_env
    result = e2e.push(src, server.url("s"))
    one_clear_line(result, "on the server: its state directory is full")
    log = server.log()
    assert "Traceback" not in log and "database or disk is full" in log, log
    assert str(e2e.tmp / "state") in log  # where, for the one who can free it
    server.stop()  # (it may still be removing its temporaries)
    new = snapshot(src)
    for rel, node in files(share).items():  # each file old or new, never a mix
        assert node == before.get(rel) or node == new.get(rel), rel
    server = e2e.serve({"s": share})  # room again: the next push completes
    e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)
    assert not temporaries(e2e.tmp)


def test_a_full_share_with_a_name_that_is_not_utf8(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    a_tree(src, seed=1)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    before = snapshot(share)
    server.stop()
    # Only the file whose name is not UTF-8 changes: it is the one that cannot be written.
    write(os.fsencode(src) + b"/caf\xe9-\xff.bin", b"a new version\n" * 9000)
    client_env = dict(e2e.env)
    with_env(e2e, RDC_TEST_FULL=str(share))
    server = e2e.serve({"s": share})
    e2e.env = client_env
    result = e2e.push(src, server.url("s"))
    one_clear_line(result, "on the server: share 's' is full", "caf\\xe9-\\xff.bin")
    assert "Traceback" not in server.log()
    assert "no space left in share s" in server.log()
    server.stop()  # (it may still be removing its temporaries)
    assert files(share) == files(before)  # nothing written, nothing lost
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)


def test_this_machines_disk_full_on_a_pull(e2e: E2E) -> None:
    share, local = e2e.tmp / "share", e2e.tmp / "local"
    a_tree(share, seed=1)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), local).ok()
    before = snapshot(local)
    a_tree(share, seed=2)
    e2e.env["RDC_TEST_FULL"] = str(local)
    result = e2e.pull(server.url("s"), local)
    one_clear_line(result, "on this machine: cannot write", str(local))
    assert files(local) == files(before)
    del e2e.env["RDC_TEST_FULL"]
    e2e.pull(server.url("s"), local).ok()
    assert_same_tree(share, local)
    assert "Traceback" not in server.log()
