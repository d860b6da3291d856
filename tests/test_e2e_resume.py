"""End to end: a large transfer interrupted in the middle of a file (the client or the
server killed, pushing or pulling) resumes from what had arrived: the next run sends
about what was still missing, not the whole file again (counted on the client's socket),
and leaves the file whole and checked, with no temporaries."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import scaled
from .e2e_support import (
    E2E,
    RUN_SECONDS,
    assert_same_tree,
    random_file,
    stamp_times,
    temporaries,
    wait_for,
    wait_until_stale,
)

SIZE = scaled(96 << 20, 8 << 20)  # random: compression does not shrink it
CAUGHT = 0.3  # the share of the file on the target when the transfer is cut


def partial_size(target: Path) -> int:
    """The bytes in the largest rdc temporary under ``target`` (0 if none)."""
    sizes = [0]
    for path in temporaries(target):
        with contextlib.suppress(FileNotFoundError):
            sizes.append(os.path.getsize(path))
    return max(sizes)


def cut(process: subprocess.Popen[bytes], target: Path) -> bool:
    """True once the file's temporary holds CAUGHT of it; fails the test if the transfer
    ended first."""
    if process.poll() is not None:
        _, err = process.communicate()
        pytest.fail(f"the transfer ended ({process.returncode}) before it could be cut: "
                    f"{err.decode(errors='replace')}")
    return partial_size(target) >= CAUGHT * SIZE


@pytest.mark.slow
@pytest.mark.parametrize(("verb", "victim"), [("push", "client"), ("push", "server"),
                                               ("pull", "client"), ("pull", "server")])
def test_an_interrupted_transfer_resumes(e2e: E2E, verb: str, victim: str) -> None:
    share, local = e2e.tmp / "share", e2e.tmp / "local"
    share.mkdir()
    local.mkdir()
    source, target = (local, share) if verb == "push" else (share, local)
    random_file(source / "big.bin", SIZE, seed=7)
    stamp_times(source, seed=8)
    server = e2e.serve({"s": share})
    args = (str(local), server.url("s")) if verb == "push" else (server.url("s"), str(local))
    process = e2e.start(verb, *args)
    wait_for(lambda: cut(process, target), RUN_SECONDS, "the file to be part-way over",
             interval=0.001)
    if victim == "client":
        process.kill()
    else:
        server.kill()
    process.communicate(timeout=RUN_SECONDS)
    if victim == "client" and verb == "push":  # the server keeps it once it saw the end
        wait_for(lambda: not _locked(target), 30, "the server to let go of the file")
    else:
        server = server if victim == "client" else e2e.serve({"s": share})
    kept = partial_size(target)
    assert kept >= CAUGHT * SIZE, f"only {kept} of {SIZE} bytes were kept"
    assert not (target / "big.bin").exists()
    if verb == "pull" and victim == "client":
        wait_until_stale(target)

    run = e2e.push(local, server.url("s")) if verb == "push" else e2e.pull(server.url("s"),
                                                                           local)
    run.ok()
    assert_same_tree(source, target)
    assert not temporaries(e2e.tmp)
    moved = run.stats["bytes_sent"] if verb == "push" else run.stats["bytes_received"]
    missing = SIZE - kept
    print(f"resume {verb}, {victim} killed: {kept:,} of {SIZE:,} bytes kept, {moved:,} moved")
    # What was missing, plus the file's tree (about 10 bytes per 8 KiB chunk) and framing.
    assert moved < missing + SIZE // 50 + 200_000, (moved, missing, SIZE)
    # The chunk that the partial's end cuts is sent again, whole.
    assert run.stats["literal_bytes"] <= missing + (64 << 10)
    assert "Traceback" not in server.log()


def _locked(target: Path) -> bool:
    """Whether a live writer still holds a temporary under ``target``."""
    import fcntl

    for path in temporaries(target):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


def test_a_partial_file_is_kept_only_so_long(e2e: E2E) -> None:
    """clean_temporaries keeps a partial (a regular temporary of PARTIAL_BYTES or more)
    and removes a smaller one, and a partial past its age."""
    from rdc.local import fs

    root = e2e.tmp / "root"
    root.mkdir()
    (root / ".rdc-tmp-0123456789abcdef-big.bin").write_bytes(b"x" * fs.PARTIAL_BYTES)
    (root / ".rdc-tmp-0123456789abcdee-small.bin").write_bytes(b"x" * 100)
    old = root / ".rdc-tmp-0123456789abcded-old.bin"
    old.write_bytes(b"x" * fs.PARTIAL_BYTES)
    wait_until_stale(root)
    saved = fs.PARTIAL_SECONDS
    with fs.SafeRoot(root) as tree:
        assert tree.clean_temporaries() == 1
        assert sorted(os.listdir(root)) == [old.name, ".rdc-tmp-0123456789abcdef-big.bin"]
        fs.PARTIAL_SECONDS = 0.0
        try:
            assert tree.clean_temporaries() == 2
        finally:
            fs.PARTIAL_SECONDS = saved
    assert os.listdir(root) == []
