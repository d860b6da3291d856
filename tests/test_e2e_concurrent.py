"""End to end: two clients pushing the same content into one directory at the same time
both succeed: where the other got there first with exactly what this one wanted, that is
not a conflict."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .conftest import scaled
from .e2e_support import E2E, assert_same_tree, random_file, stamp_times, temporaries, write
from .test_e2e_scale import reap

ROUNDS = 3


def identical_tree(root: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    random_file(root / "big.bin", scaled(3 << 20, 512 << 10), seed=3)
    random_file(root / "mid.bin", 200_000, seed=4)
    for n in range(80):
        write(root / "d" / f"f{n:03}.txt", f"file {n}\n".encode() * (n + 1))
    write(root / "d" / "e" / "tiny", b"t")
    os.symlink("../big.bin", root / "d" / "link")
    (root / "empty").mkdir()
    stamp_times(root, seed=5)


def test_two_pushes_of_identical_content_both_succeed(e2e: E2E) -> None:
    a, b, share = e2e.tmp / "a", e2e.tmp / "b", e2e.tmp / "share"
    identical_tree(a)
    shutil.copytree(a, b, symlinks=True)
    assert_same_tree(a, b)
    share.mkdir()
    server = e2e.serve({"s": share})
    for n in range(ROUNDS):
        url = server.url("s", f"round{n}")
        results = reap([e2e.start("push", str(a), url), e2e.start("push", str(b), url)])
        for status, err in results:
            assert status == 0 and "Traceback" not in err, (status, err)
            assert "conflict" not in err, err
        assert_same_tree(a, share / f"round{n}")
    assert not temporaries(share)
    assert "Traceback" not in server.log()
