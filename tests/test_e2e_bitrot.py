"""End to end: bit rot. A file whose bytes change while its size and modification time
stay (one flipped byte on the disk) is found when it is read (served, verified, scrubbed,
or read again by ``--checksum``): it is re-indexed, served as it really is, logged as
"content changed without an mtime change", and repaired by the next push of a good copy."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import scaled
from .e2e_support import (
    E2E,
    assert_same_tree,
    file_hash,
    random_file,
    snapshot,
    stamp_times,
    wait_for,
    write,
)

CHANGED = "content changed without an mtime change"
MISMATCH = 8
ROTTEN = ("big.bin", "small.txt", "tiny.txt")  # per file, per batch, inline in the offer


def a_tree(root: Path) -> None:
    (root / "d").mkdir(parents=True)
    random_file(root / "big.bin", scaled(3 << 20, 300_000), seed=1)
    write(root / "small.txt", b"a small file, sent in a batch\n" * 300)
    write(root / "tiny.txt", b"tiny, inline\n")
    write(root / "d" / "fine.txt", b"never touched\n" * 50)
    stamp_times(root, seed=2)


def rot(path: Path, at: int = 100) -> None:
    """Flip one byte, keeping the size and the times."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_a_pull_gets_what_is_there_and_a_push_repairs_it(e2e: E2E) -> None:
    share, good = e2e.tmp / "share", e2e.tmp / "good"
    a_tree(share)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), good).ok()  # the server indexed every file
    for name in ROTTEN:
        rot(share / name, at=5)
    rotten = snapshot(share)

    restore = e2e.tmp / "restore"
    e2e.pull(server.url("s"), restore).ok()  # was: rc 3 and big.bin missing
    assert snapshot(restore) == rotten  # what is really there
    log = server.log()
    for name in ROTTEN:
        assert f"{name}: {CHANGED}" in log, log

    e2e.push(good, server.url("s")).ok()  # the index now says the truth: repaired
    assert_same_tree(good, share)
    assert "Traceback" not in server.log()


def test_a_rotten_file_under_a_mebibyte_is_pulled_as_it_is_in_its_batch(e2e: E2E) -> None:
    """A 300 KB file goes in a pulled batch (between peers with ``large-deltas``): rotten
    under its index row on the server, it is read whole when offered, found changed and
    offered as it is, and the batch's other files come too (offered as indexed, its read
    to be sent found the change and failed the whole batch)."""
    share = e2e.tmp / "share"
    share.mkdir()
    random_file(share / "mid.bin", 300_000, seed=3)
    write(share / "small.txt", b"a small file in the same batch\n" * 100)
    stamp_times(share, seed=4)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), e2e.tmp / "first").ok()  # the server indexed every file
    rot(share / "mid.bin", at=1000)
    e2e.pull(server.url("s"), e2e.tmp / "second").ok()
    assert snapshot(e2e.tmp / "second") == snapshot(share)
    assert f"mid.bin: {CHANGED}" in server.log()


def test_checksum_finds_it_on_both_sides(e2e: E2E) -> None:
    share, good = e2e.tmp / "share", e2e.tmp / "good"
    a_tree(good)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(good, server.url("s")).ok()
    rot(share / "big.bin")
    quiet = e2e.push(good, server.url("s")).ok()  # the index vouches for the old bytes
    assert quiet.stats["files_transferred"] == 0
    assert file_hash(share / "big.bin") != file_hash(good / "big.bin")
    repaired = e2e.push(good, server.url("s"), "--checksum").ok()
    assert repaired.stats["files_transferred"] == 1
    assert_same_tree(good, share)
    assert f"big.bin: {CHANGED} (found by --checksum)" in server.log()

    rot(good / "small.txt")  # now the client's copy rots; a pull with -c repairs it
    pulled = e2e.pull(server.url("s"), good, "-c").ok()
    assert f"small.txt: {CHANGED}" in pulled.stderr
    assert_same_tree(share, good)


def test_a_push_of_a_rotten_source_sends_what_is_there(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    a_tree(src)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s", "first")).ok()  # the client indexed every file
    for name in ROTTEN:
        rot(src / name, at=7)  # its index still vouches for the old bytes
    pushed = e2e.push(src, server.url("s", "second")).ok()
    for name in ROTTEN:
        assert f"{name}: {CHANGED}" in pushed.stderr, pushed.stderr
    assert_same_tree(src, share / "second")


def test_verify_a_directory_and_a_share(e2e: E2E) -> None:
    share, local = e2e.tmp / "share", e2e.tmp / "local"
    a_tree(share)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), local).ok()
    clean = e2e.rdc("verify", str(local)).ok()
    assert "verified 4 files" in clean.stdout and "0 mismatched" in clean.stdout

    rot(local / "d" / "fine.txt")
    found = e2e.rdc("verify", str(local))
    assert found.returncode == MISMATCH, str(found)
    assert f"mismatch: d/fine.txt: {CHANGED}" in found.stdout
    assert "1 mismatched" in found.stdout
    e2e.rdc("verify", str(local)).ok()  # re-indexed: the index says what is there now

    rot(share / "small.txt")
    url = server.url("s")
    found = e2e.rdc("verify", url, "--token-file", str(e2e.token_file))
    assert found.returncode == MISMATCH, str(found)
    assert f"mismatch: small.txt: {CHANGED}" in found.stdout
    assert f"verify: small.txt: {CHANGED}" in server.log()
    e2e.rdc("verify", url, "--token-file", str(e2e.token_file)).ok()
    e2e.pull(url, local, "--delete").ok()  # the rotten file now differs: it is fetched
    assert_same_tree(share, local)


def test_the_server_scrubs_on_a_schedule(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    a_tree(share)
    server = e2e.serve({"s": share}, None, "--scrub-every", "1s")
    wait_for(lambda: "scrub s: 4 files" in server.log(), 30, "a first scrub")
    rot(share / "big.bin")
    wait_for(lambda: f"scrub s: big.bin: {CHANGED}" in server.log(), 30,
             "the scrub to find the flipped byte")
    assert "Traceback" not in server.log()


def test_sync_with_checksum_repairs_the_rotten_side(e2e: E2E) -> None:
    share, local = e2e.tmp / "share", e2e.tmp / "local"
    a_tree(local)
    share.mkdir()
    server = e2e.serve({"s": share})

    def sync(*extra: str):
        return e2e.rdc("sync", str(local), server.url("s"), "--token-file",
                       str(e2e.token_file), *extra)

    def files(root: Path) -> dict:  # (two-way sync does not keep directories' times)
        return {rel: node for rel, node in snapshot(root).items() if node.kind != "d"}

    sync().ok()
    good = files(local)
    rot(local / "big.bin")  # this side's copy rots: the index still vouches for it
    sync().ok()
    assert file_hash(local / "big.bin") != file_hash(share / "big.bin")  # not noticed
    found = sync("--checksum").ok()
    assert f"big.bin: {CHANGED}" in found.stderr, found.stderr
    assert files(local) == files(share) == good  # the server's good copy won

    rot(share / "small.txt")  # now the server's copy rots
    sync("-c").ok()
    assert f"small.txt: {CHANGED} (found by --checksum)" in server.log()
    assert files(local) == files(share) == good  # this side's good copy won
    assert "Traceback" not in server.log()
