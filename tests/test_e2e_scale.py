"""End to end: many clients at once, two pushes racing into one directory, and trees with
more entries than one message or one times vector carries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .conftest import scaled
from .e2e_support import (
    E2E,
    RUN_SECONDS,
    assert_same_tree,
    file_hash,
    random_file,
    snapshot,
    stamp_times,
    temporaries,
    write,
)


def reap(processes: list[subprocess.Popen[bytes]]) -> list[tuple[int, str]]:
    out = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
                p.communicate()
            raise AssertionError("a concurrent rdc did not finish in time") from None
        out.append((process.returncode, err.decode(errors="replace")))
    return out


def a_tree(root: Path, seed: int, files: int = 20) -> None:
    (root / "d").mkdir(parents=True)
    random_file(root / "big.bin", scaled(4 << 20, 512 << 10), seed=seed)
    for n in range(files):
        write(root / "d" / f"f{n:03}.txt", f"tree {seed}, file {n}\n".encode() * (n + 1))
    stamp_times(root, seed=seed)


def test_many_clients_at_once(e2e: E2E) -> None:
    published, inbox = e2e.tmp / "published", e2e.tmp / "inbox"
    a_tree(published, seed=1)
    inbox.mkdir()
    sources = [e2e.tmp / f"src{n}" for n in range(2)]
    for n, src in enumerate(sources):
        a_tree(src, seed=10 + n)
    server = e2e.serve({"pub": published, "in": inbox})
    dsts = [e2e.tmp / f"dst{n}" for n in range(3)]
    running = [e2e.start("pull", server.url("pub"), str(dst)) for dst in dsts]
    running += [e2e.start("push", str(src), server.url("in", f"from{n}"))
                for n, src in enumerate(sources)]
    for status, err in reap(running):
        assert status == 0 and "Traceback" not in err, err
    for dst in dsts:
        assert_same_tree(published, dst)
    for n, src in enumerate(sources):
        assert_same_tree(src, inbox / f"from{n}")
    assert "Traceback" not in server.log()


def test_two_pushes_racing_into_one_directory(e2e: E2E) -> None:
    """Each file ends up as one client's version or the other's, never a mix; a push that
    loses a race says so (exit 3, conflict) rather than overwrite blindly or fail hard."""
    a, b, share = e2e.tmp / "a", e2e.tmp / "b", e2e.tmp / "share"
    a_tree(a, seed=1, files=60)
    a_tree(b, seed=2, files=60)
    share.mkdir()
    server = e2e.serve({"s": share})
    versions = {rel: {node.digest for node in (snapshot(a)[rel], snapshot(b)[rel])}
                for rel, node in snapshot(a).items() if node.kind == "f"}

    results = reap([e2e.start("push", str(a), server.url("s")),
                    e2e.start("push", str(b), server.url("s"))])
    for status, err in results:
        assert status in (0, 3) and "Traceback" not in err, err
        if status == 3:
            assert "conflict" in err, err
    for rel, allowed in versions.items():
        assert file_hash(share / os.fsdecode(rel)) in allowed, rel
    assert "Traceback" not in server.log()

    e2e.push(a, server.url("s"), "--delete").ok()  # either can then win outright
    assert_same_tree(a, share)
    assert not temporaries(e2e.tmp)


MANY = 4200  # over MAX_ITEMS (ops per message) and WHOLE_TIMES (one times vector)


def test_a_tree_of_many_entries(e2e: E2E) -> None:
    """Links travel as ops, batched per message; one directory holds more entries than a
    times vector covers. (Regular files cost an fsync of the file and its directory each:
    a few hundred a second, too slow to test thousands of here.)"""
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    (src / "flat").mkdir(parents=True)
    for n in range(MANY):
        os.symlink(f"target-{n}", src / "flat" / f"{n:05}")
    for n in range(100):
        write(src / "flat" / f"file-{n:03}", str(n).encode())
        (src / "dirs" / f"{n:03}").mkdir(parents=True)
    stamp_times(src, seed=1)
    share.mkdir()
    server = e2e.serve({"s": share})

    pushed = e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)
    assert pushed.stats["links"] == MANY
    assert pushed.stats["files_transferred"] == 100
    assert pushed.stats["dirs_created"] == 102
    again = e2e.push(src, server.url("s")).ok()
    assert again.stats["bytes_sent"] < 10_000

    stamp_times(src, seed=2)  # every time changes, in a directory too big for one vector
    e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)

    dst = e2e.tmp / "dst"
    pulled = e2e.pull(server.url("s"), dst, "--delete").ok()
    assert_same_tree(share, dst)
    assert pulled.stats["links"] == MANY
    for n in range(0, MANY, 2):
        os.unlink(share / "flat" / f"{n:05}")
    stamp_times(share, seed=3)
    deleted = e2e.pull(server.url("s"), dst, "--delete").ok()
    assert_same_tree(share, dst)
    assert deleted.stats["deleted"] == MANY // 2
