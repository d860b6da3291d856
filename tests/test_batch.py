"""Small files in batches: a source tree's many small files cost a few conversations, not
one each; what a batch cannot settle alone (an older version to descend from, a file that
changed meanwhile) is handled per file, and a batch is written, synced and renamed as one."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

import pytest

from rdc.errors import ProtocolError, RemoteError
from rdc.local.fs import Expect, SafeRoot
from rdc.local.replica import Replica
from rdc.params import OFFER_ROOT
from rdc.transfer import batch, serving
from rdc.transfer.compare import SHORT_DIGESTS
from rdc.transfer.descent import SUBS_FROM
from rdc.transfer.stats import Options
from rdc.wire import handshake
from rdc.wire import messages as m

from .protocol_support import Pair, tree_state, write

OLD = 1_600_000_000_123_456_789


def small_tree(root, files: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(files):
        text = b"".join(b"line %d of file %d: %x\n" % (n, i, rng.getrandbits(64))
                        for n in range(rng.randrange(1, 200)))
        write(root / f"d{i % 7}" / f"f{i}.txt", text, OLD + i)


def largest_edited(root: Path, at: int) -> tuple[Path, bytes]:
    """The largest file below ``root`` and its content with 4 bytes at ``at`` replaced
    (it must be more than ``2 * at`` bytes long)."""
    path = max(root.rglob("*.txt"), key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    assert len(data) > 2 * at
    data[at : at + 4] = b"EDIT"
    return path, bytes(data)


async def test_a_first_copy_of_small_files_goes_in_batches(tmp_path, counted) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    small_tree(src, 600)
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert stats.files_transferred == stats.files_total == 600
    assert tree_state(pair.share) == tree_state(src)
    assert counted["single"] == 0
    assert 3 <= counted["batches"] <= 6  # 600 files, at most 256 and 1 MiB a batch
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed and stats.files_transferred == 600
    assert tree_state(dst) == tree_state(src)
    assert counted["single"] == 0 and 3 <= counted["gets"] <= 6
    pair.close()


async def test_renamed_small_files_are_copied_and_edited_ones_are_deltas(
    tmp_path, counted
) -> None:
    src = tmp_path / "src"
    small_tree(src, 80)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    counted.update(batches=0, single=0)
    for i in range(0, 20):  # renamed
        os.rename(src / f"d{i % 7}" / f"f{i}.txt", src / f"d{i % 7}" / f"renamed{i}.txt")
    edited = src / "d3" / "f45.txt"
    data = bytearray(edited.read_bytes())
    assert len(data) > 2000
    data[1000:1004] = b"EDIT"
    edited.write_bytes(bytes(data))
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed
    assert stats.copied_files == 20
    # The edited file, with its older version as a seed: described in its batch.
    assert counted["single"] == 0 and stats.moved["d3/f45.txt"][0] == "delta"
    assert stats.literal_bytes < 1000
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_a_renamed_and_edited_file_descends_against_its_old_self(
    tmp_path, counted
) -> None:
    """New at its path, but near-identical to a file the target holds (its own older
    version under the old name): it descends with that file as a seed instead of going
    whole; a new file only loosely like others still goes whole, in its batch."""
    src = tmp_path / "src"
    small_tree(src, 30)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    counted.update(batches=0, single=0)
    old, data = largest_edited(src, 2000)
    old.unlink()
    write(src / "moved.txt", data)
    fresh = b"".join(b"a line of its own %d\n" % n for n in range(300))
    write(src / "fresh.txt", fresh)
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed
    assert counted["single"] == 0  # moved.txt a delta, fresh.txt sent, both in the batch
    assert stats.moved["moved.txt"][0] == "delta" and stats.moved["fresh.txt"][0] == "whole"
    assert stats.literal_bytes < len(fresh) + 300  # fresh.txt whole, and the edit
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_a_file_written_moments_ago_is_still_a_seed(tmp_path, counted) -> None:
    """Files written within the index's racy window (their rows cannot vouch that the
    content is unchanged) still serve as seeds for their own next version."""
    src = tmp_path / "src"
    small_tree(src, 30)
    now = time.time_ns()
    for path in src.rglob("*.txt"):
        os.utime(path, ns=(now, now))
    pair = Pair(tmp_path)
    await pair.run("push", src)
    counted.update(batches=0, single=0)
    edited, data = largest_edited(src, 1000)
    edited.write_bytes(data)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert counted["single"] == 0 and stats.literal_bytes < 1000
    assert stats.moved[str(edited.relative_to(src))][0] == "delta"
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_an_edited_copy_descends_against_the_original(tmp_path, counted) -> None:
    """A file new at its path that is near-identical to one the target holds (an edited
    copy) descends with it as a seed: its literal is the edit, not the file."""
    src = tmp_path / "src"
    small_tree(src, 40)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    counted.update(batches=0, single=0)
    data = bytearray((src / "d3" / "f10.txt").read_bytes())
    data[100:104] = b"EDIT"
    (src / "d3" / "copy-of-f10.txt").write_bytes(bytes(data))
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert counted["single"] == 0 and counted["batches"] == 1
    assert stats.moved["d3/copy-of-f10.txt"][0] == "delta"
    assert stats.literal_bytes < 300 < len(data)
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_a_file_changed_at_the_target_meanwhile_fails_alone(tmp_path) -> None:
    src = tmp_path / "src"
    small_tree(src, 40)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    for i in (3, 4):
        (src / f"d{i % 7}" / f"f{i}.txt").write_bytes(b"x" * 3000 + bytes([i]))

    async def meanwhile(connection) -> None:
        conversation = connection.start(m.List(paths=[""], hb=8))
        await conversation.receive(m.Listings)
        (pair.share / "d3" / "f3.txt").write_bytes(b"edited on the server meanwhile")

    stats = await pair.run("push", src, between=meanwhile)
    assert [path for path, _ in stats.failed] == ["d3/f3.txt"]
    assert "conflict" in stats.failed[0][1]
    assert (pair.share / "d3" / "f3.txt").read_bytes() == b"edited on the server meanwhile"
    assert (pair.share / "d4" / "f4.txt").read_bytes() == b"x" * 3000 + bytes([4])
    pair.close()


async def test_the_tree_made_after_open_never_replaces_the_one_listings_came_from(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server makes its tree after answering ``open``, in the background. If a request
    made it first, the background one does nothing: a scan after the file changed would
    have made the offer's ``expect`` (from a listing before) look stale, and the change
    on the server would have been overwritten instead of refused."""
    import trio

    src = tmp_path / "src"
    small_tree(src, 40)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    (src / "d3" / "f3.txt").write_bytes(b"x" * 3000)
    edited = trio.Event()
    real_scan = serving.ServerSession._scan

    async def late(self, incremental=False, ahead=False):
        if ahead:
            await edited.wait()  # the background scan, as late as it can come
        return await real_scan(self, incremental, ahead)

    async def meanwhile(connection) -> None:
        conversation = connection.start(m.List(paths=[""], hb=8))
        await conversation.receive(m.Listings)
        (pair.share / "d3" / "f3.txt").write_bytes(b"edited on the server meanwhile")
        edited.set()
        await trio.sleep(0.05)

    monkeypatch.setattr(serving.ServerSession, "_scan", late)
    stats = await pair.run("push", src, between=meanwhile)
    assert [path for path, _ in stats.failed] == ["d3/f3.txt"]
    assert (pair.share / "d3" / "f3.txt").read_bytes() == b"edited on the server meanwhile"
    pair.close()


def test_a_batch_is_made_durable_once_before_any_file_is_installed(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_batch syncs the batch once, and only then renames: a failure at the sync
    leaves every destination as it was, and no temporary behind."""
    root = tmp_path / "root"
    for i in range(5):
        write(root / f"f{i}", b"old %d" % i)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    files = []
    for i in range(5):
        data = b"new content %d" % i
        offer = m.FileOffer(f"f{i}", len(data), _root(data), 2, None, 0o644, OLD)
        files.append((offer, None, data))
    calls = []
    real = batch.sync_all

    def failing(fs: SafeRoot, temps) -> None:
        calls.append(len(temps))
        raise OSError(5, "Input/output error (simulated)")

    monkeypatch.setattr(batch, "sync_all", failing)
    with pytest.raises(OSError):
        batch.write_batch(replica, files)
    assert calls == [5]
    assert [(root / f"f{i}").read_bytes() for i in range(5)] == [b"old %d" % i for i in range(5)]
    assert not [n for n in os.listdir(root) if n.startswith(".rdc-tmp")]
    monkeypatch.setattr(batch, "sync_all", real)
    assert batch.write_batch(replica, files) == [None] * 5
    assert (root / "f2").read_bytes() == b"new content 2"
    replica.close()


@pytest.mark.parametrize("named", [m.HASH_BYTES, OFFER_ROOT])
def test_content_that_does_not_have_its_root_is_refused_alone(tmp_path, named) -> None:
    """Offered by its whole root or (``short-digests``) its first OFFER_ROOT bytes, a
    file is written only if its bytes have it; the index records the whole root."""
    root = tmp_path / "root"
    root.mkdir()
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    good, bad = b"good", b"bad!"
    files = [(m.FileOffer("g", 4, _root(good)[:named], 2, None, 0o644, OLD), None, good),
             (m.FileOffer("b", 4, _root(b"else")[:named], 2, None, 0o644, OLD), None, bad)]
    results = batch.write_batch(replica, files)
    assert results[0] is None and results[1] is not None and results[1].code == "verify"
    assert (root / "g").read_bytes() == good and not (root / "b").exists()
    assert replica.indexed(["g"])["g"].root == _root(good)
    replica.close()


@pytest.mark.parametrize("keep", [True, False])
def test_a_batch_that_keeps_times_sets_its_directories_back(tmp_path, keep) -> None:
    """With ``keep_times`` the directories where a batch replaced files (not the top) have
    the times they had before it; without, the installs moved them, as they do where it
    only added files (the source's directory moved too: the metadata sets it)."""
    root = tmp_path / "root"
    for where in ("d", "e"):
        (root / where).mkdir(parents=True)
        (root / where / "f").write_bytes(b"old")
        os.utime(root / where, ns=(OLD, OLD))
    (root / "top").write_bytes(b"old")
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    files = [(m.FileOffer(path, 3, _root(b"new"), 2, None, 0o644, OLD), expect, b"new")
             for path, expect in (("d/f", Expect.file()), ("d/g", Expect.absent()),
                                  ("e/g", Expect.absent()), ("top", Expect.file()))]
    assert batch.write_batch(replica, files, keep_times=keep) == [None] * 4
    assert all((root / path).read_bytes() == b"new" for path in ("d/f", "d/g", "e/g", "top"))
    assert (os.stat(root / "d").st_mtime_ns == OLD) == keep
    assert os.stat(root / "e").st_mtime_ns != OLD
    replica.close()


def test_batches_in_flight_in_one_directory_keep_the_time_before_the_first(tmp_path) -> None:
    """Two batches writing in one directory at once: the second notes the time the first
    noted (not the one the first's writes left), and whichever ends last leaves it."""
    from rdc.local.fs import HeldDirs

    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    os.utime(root / "d", ns=(OLD, OLD))
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    with HeldDirs(replica.fs) as held:
        first = replica.keep_dir_times(held, ["d/a", "d/b"])
        (root / "d" / "a").write_bytes(b"a")  # the first batch writes
        second = replica.keep_dir_times(held, ["d/c"])
    assert first == second == ["d"]
    (root / "d" / "c").write_bytes(b"c")
    replica.put_dir_times_back(first)
    (root / "d" / "c2").write_bytes(b"c")  # the second is still writing
    assert os.stat(root / "d").st_mtime_ns != OLD
    replica.put_dir_times_back(second)
    assert os.stat(root / "d").st_mtime_ns == OLD
    with HeldDirs(replica.fs) as held:  # forgotten once none is in flight
        (root / "d" / "e").write_bytes(b"e")
        moved = os.stat(root / "d").st_mtime_ns
        replica.put_dir_times_back(replica.keep_dir_times(held, ["d/e"]))
    assert os.stat(root / "d").st_mtime_ns == moved
    replica.close()


@pytest.mark.parametrize("short", [True, False])
async def test_offers_name_roots_by_their_first_bytes_between_peers_that_can(
        tmp_path, monkeypatch, short) -> None:
    """With ``short-digests`` a batch's offers carry OFFER_ROOT bytes of each root, else
    the whole root; either way a first copy, a push of a copied file (found by its root
    where it is), of an edited one (a delta) and of one only retimed (already there) end
    in step, and a pull likewise."""
    if not short:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != SHORT_DIGESTS))
    lengths: set[int] = set()
    real = batch._offer

    def offer(*args):
        made = real(*args)
        lengths.add(len(made.root))
        return made

    monkeypatch.setattr(batch, "_offer", offer)
    src, dst = tmp_path / "src", tmp_path / "dst"
    small_tree(src, 60)
    pair = Pair(tmp_path)
    assert (await pair.run("push", src)).in_step
    write(src / "d1" / "copy.txt", (src / "d1" / "f1.txt").read_bytes(), OLD)
    path, data = largest_edited(src, 500)
    path.write_bytes(data)
    os.utime(src / "d2" / "f2.txt", ns=(OLD + 99, OLD + 99))
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed and stats.copied_files == 1
    assert tree_state(pair.share) == tree_state(src)
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed and tree_state(dst) == tree_state(src)
    assert lengths == {OFFER_ROOT if short else m.HASH_BYTES}
    pair.close()


@pytest.mark.parametrize("asked", [True, False])
async def test_offers_answering_gets_leave_out_the_paths_asked_for(
        tmp_path, monkeypatch, asked) -> None:
    """With ``asked-paths`` the server's offers answering a pull's ``gets`` name no path
    (each is the one asked for in its place), else each names its own; the pull ends in
    step either way."""
    if not asked:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != batch.ASKED_PATHS))
    named: list[str] = []
    real = batch._as_asked

    def as_asked(offers, files):
        named.extend(o.path for o in offers if isinstance(o, m.FileOffer))
        return real(offers, files)

    monkeypatch.setattr(batch, "_as_asked", as_asked)
    src, dst = tmp_path / "src", tmp_path / "dst"
    small_tree(src, 60)
    pair = Pair(tmp_path)
    assert (await pair.run("push", src)).in_step
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed and tree_state(dst) == tree_state(src)
    assert len(named) == 60
    assert set(named) == {""} if asked else "" not in named
    pair.close()


def test_offers_that_name_another_path_or_count_are_refused() -> None:
    asked = [("a.txt", None), ("d/b.txt", None)]
    offer = m.FileOffer("", 1, b"r" * OFFER_ROOT, 1, None, 0o644, OLD)
    failure = m.Failure("vanished", "gone")
    got = batch._as_asked([offer, failure], asked)
    assert isinstance(got[0], m.FileOffer) and got[0].path == "a.txt" and got[1] == failure
    named = [offer, dataclasses.replace(offer, path="d/b.txt")]
    assert [o.path for o in batch._as_asked(named, asked)] == ["a.txt", "d/b.txt"]
    with pytest.raises(ProtocolError, match="do not match"):
        batch._as_asked([offer, dataclasses.replace(offer, path="d/other.txt")], asked)
    with pytest.raises(ProtocolError, match="do not match"):
        batch._as_asked([offer], asked)


def test_the_target_checks_the_root_and_keeps_the_offered_sketch(tmp_path) -> None:
    """The root is checked against the bytes; the sketch (a second pass over a small
    file's sub-chunks) is the source's: it only steers which seeds a later descent reads,
    and their bytes are checked as they are used."""
    from rdc.content.signature import signature_of_bytes

    root = tmp_path / "root"
    root.mkdir()
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    data = random.Random(4).randbytes(20_000)
    made = signature_of_bytes(data)
    offered = bytes(63 - t for t in made.sketch)  # not what the bytes would give
    offer = m.FileOffer("f", len(data), made.root, len(made.tree.levels), offered, 0o644, OLD)
    assert batch.write_batch(replica, [(offer, None, data)]) == [None]
    row = replica.indexed(["f"])["f"]
    assert row.root == made.root and row.sketch == offered
    replica.close()


def test_a_new_file_is_described_against_files_held_before_the_transfer_only(
    tmp_path,
) -> None:
    """A file new at its path that is near-identical to a file the target held when the
    transfer started (renamed or copied, then edited) is described against it; one like a
    file written since (by this transfer, in a first copy) is sent: the compression stream
    sees what those share, and the look-up cost a first copy a tenth of its CPU."""
    from rdc.content.signature import signature_of_bytes

    rng = random.Random(8)
    root = tmp_path / "root"
    root.mkdir()
    before, since = rng.randbytes(30_000), rng.randbytes(30_000)
    (root / "before.bin").write_bytes(before)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    replica.warm()  # a transfer starts
    (root / "since.bin").write_bytes(since)
    replica.scan()

    def offer(path: str, data: bytes) -> tuple[m.FileOffer, None]:
        made = signature_of_bytes(data)
        return m.FileOffer(path, len(data), made.root, len(made.tree.levels), made.sketch,
                           0o644, OLD), None

    offers = [offer("renamed.bin", before[:20_000] + b"edit" + before[20_000:]),
              offer("copied.bin", since[:20_000] + b"edit" + since[20_000:])]
    assert [d.verdict for d in batch.decide_batch(replica, offers, deltas=True)] == [
        "delta", "send"]
    replica.close()
    fresh = Replica(str(root), tmp_path / "index.sqlite3")  # no transfer started: any file
    assert [d.verdict for d in batch.decide_batch(fresh, offers, deltas=True)] == [
        "delta", "delta"]
    fresh.close()


def test_files_are_cut_into_batches_by_count_and_bytes() -> None:
    files = [(f"f{i}", None) for i in range(600)]
    sizes = {f"f{i}": 1000 for i in range(600)}
    sizes["f10"] = 5_000_000  # large: alone
    del sizes["f11"]  # size unknown: alone
    groups, alone = batch.batches(files, sizes)
    assert [p for p, _ in alone] == ["f10", "f11"]
    assert [len(g) for g in groups] == [256, 256, 86]
    sizes = {f"f{i}": 60_000 for i in range(600)}
    groups, _ = batch.batches(files, sizes)
    assert all(sum(sizes[p] for p, _ in g) <= batch.BATCH_BYTES for g in groups)


def test_a_file_to_descend_against_its_older_version_skips_the_batch() -> None:
    old = b"\x01" * 8
    files = [("new", None), ("tiny", old), ("edited", old), ("edited-big", old)]
    sizes = {"new": 5000, "tiny": SUBS_FROM - 1, "edited": SUBS_FROM, "edited-big": 50_000}
    groups, alone = batch.batches(files, sizes)
    assert groups == [[("new", None), ("tiny", old)]]  # sent whole either way
    assert alone == [("edited", old), ("edited-big", old)]


def _root(data: bytes) -> bytes:
    from rdc.content.signature import signature_of_bytes

    return signature_of_bytes(data).root


async def test_a_push_into_an_empty_directory_reads_each_file_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into an empty directory the client does not scan (read and sign) its whole tree
    before sending: the scan stops when the server says it has nothing, and each file is
    read once, as it is offered. The end is as in step as ever. (The scan is made slow
    here, as a large tree's is, so that the server's answer comes first.)"""
    src = tmp_path / "src"
    small_tree(src, 120)
    os.symlink("d1/f1.txt", src / "link")
    scan = Replica.scan

    def slow_scan(self, excludes=None, progress=None, walked=None):
        if progress is not None and walked is not None:
            for _ in range(2000):  # until the stop: ScanAbandoned out of the callback
                progress(None)
                time.sleep(0.005)
        return scan(self, excludes, progress, walked)

    reads: list[str] = []  # opened to be streamed, or small and read whole
    open_read, read_whole = SafeRoot.open_read, SafeRoot.read_whole

    def counting(self, rel):
        reads.append(rel)
        return open_read(self, rel)

    def counting_whole(self, rel, *args, **kwargs):
        reads.append(rel)
        return read_whole(self, rel, *args, **kwargs)

    sign_small_many = Replica.sign_small_many

    def counting_many(self, paths, *args):  # (small files read in one native call)
        done = sign_small_many(self, paths, *args)
        reads.extend(path for path, one in zip(paths, done, strict=True) if one is not None)
        return done

    monkeypatch.setattr(Replica, "scan", slow_scan)
    monkeypatch.setattr(SafeRoot, "open_read", counting)
    monkeypatch.setattr(SafeRoot, "read_whole", counting_whole)
    monkeypatch.setattr(Replica, "sign_small_many", counting_many)
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 120
    assert tree_state(pair.share) == tree_state(src)
    assert len(reads) == len(set(reads)) == 120  # (the server reads none: all are new)
    reads.clear()
    stats = await pair.run("push", src)  # nothing to do, and nothing read again
    assert stats.in_step and stats.files_transferred == 0 and reads == []
    pair.close()


async def test_a_batch_of_more_files_than_a_batch_holds_is_refused() -> None:
    """A peer's batch is cut as this side cuts its own: each file written holds two
    descriptors until the batch is installed, each file offered its content in memory."""
    offers = m.Offers(files=[m.FileOffer(f"f{i}", 1, bytes(32), 2, None, 0o644, 0)
                             for i in range(batch.BATCH_FILES + 1)])
    with pytest.raises(ProtocolError, match="at most 256"):
        await batch.receive_offers(None, None, offers)  # type: ignore[arg-type]
    gets = m.Gets(files=[m.FileRequest("f", None)] * (batch.BATCH_FILES + 1))
    with pytest.raises(ProtocolError, match="at most 256"):
        await batch.serve_gets(None, None, gets)  # type: ignore[arg-type]


def _large_small_files(root: Path, files: int, size: int = 60_000, seed: int = 5) -> None:
    rng = random.Random(seed)
    for i in range(files):
        write(root / f"f{i:03}.bin", rng.randbytes(size), OLD + i)


async def test_a_peers_batch_of_more_content_than_a_batch_holds_is_held_in_part(
    tmp_path, monkeypatch: pytest.MonkeyPatch, counted
) -> None:
    """A peer may name 256 files of 64 KiB in one batch (16 MiB): neither end holds more
    than HELD_BYTES of it. The pushing side's extra files go one by one (the server says
    ``descend``); the pulling side's are read by the server only as their turn to be sent
    comes. Both end in step, every file once."""
    monkeypatch.setattr(batch, "BATCH_BYTES", 64 << 20)  # a client that cuts huge batches
    src, dst = tmp_path / "src", tmp_path / "dst"
    _large_small_files(src, 40)  # 2.4 MB: one batch of this client's
    held: list[int] = []
    real_write = batch.write_batch

    def writing(replica, files, signatures=(), keep_times=False):
        held.append(sum(len(data) for _, _, data in files))
        return real_write(replica, files, signatures, keep_times)

    monkeypatch.setattr(batch, "write_batch", writing)
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 40
    assert tree_state(pair.share) == tree_state(src)
    assert counted["batches"] == 1 and held[0] <= batch.HELD_BYTES
    assert counted["single"] == 40 - held[0] // 60_000

    reads: list[str] = []
    real_read = batch.read_offered

    def reading(replica, offer):
        reads.append(offer.path)
        return real_read(replica, offer)

    real_decide = batch.decide_batch

    def lenient(replica, offers, deltas, large=False):  # a client taking it all at once
        limit, batch.HELD_BYTES = batch.HELD_BYTES, 64 << 20
        try:
            return real_decide(replica, offers, deltas, large)
        finally:
            batch.HELD_BYTES = limit

    monkeypatch.setattr(batch, "read_offered", reading)
    monkeypatch.setattr(batch, "decide_batch", lenient)
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed and stats.files_transferred == 40
    assert tree_state(dst) == tree_state(src)
    assert counted["gets"] == 1 and len(reads) == 40 - batch.HELD_BYTES // 60_000
    pair.close()


def test_a_file_offered_without_its_content_is_sent_only_as_offered(tmp_path) -> None:
    """offer_batch with ``hold`` reads no more than that; the rest is read when asked for,
    and a file changed since its offer is refused (``vanished``), never sent as another."""
    from rdc.errors import Refusal

    root = tmp_path / "root"
    _large_small_files(root, 5)
    write(root / "tiny", b"tiny", OLD)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    names = [f"f{i:03}.bin" for i in range(5)] + ["tiny"]
    signed = batch.offer_batch(replica, [(n, None) for n in names], hold=130_000)
    assert [data is not None for _, data, _ in signed] == [True, True, False, False, False,
                                                           True]
    offer = signed[3][0]
    assert isinstance(offer, m.FileOffer)
    assert batch.read_offered(replica, offer) == (root / "f003.bin").read_bytes()
    write(root / "f003.bin", b"x" * 60_000, OLD + 3)
    with pytest.raises(Refusal, match="changed while it was read"):
        batch.read_offered(replica, offer)
    replica.close()


async def test_a_connection_serves_a_bounded_number_of_files_and_batches_at_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past FILES_AT_ONCE files and BATCHES_AT_ONCE batches, a connection's requests wait
    their turn (a peer's 256 conversations hold no more descriptors or memory than that),
    and a client that sends more at a time still finishes."""
    monkeypatch.setattr(serving, "FILES_AT_ONCE", 2)
    monkeypatch.setattr(serving, "BATCHES_AT_ONCE", 1)
    monkeypatch.setattr(batch, "BATCH_FILES", 3)  # many batches
    src, dst = tmp_path / "src", tmp_path / "dst"
    small_tree(src, 30)
    _large_small_files(src / "big", 6, size=batch.DELTA_FILE + 1000)  # per-file exchanges
    busy = {"files": 0, "batches": 0}
    peak = {"files": 0, "batches": 0}

    def counting(kind, real):
        async def wrapped(*args):
            busy[kind] += 1
            peak[kind] = max(peak[kind], busy[kind])
            try:
                await trio.sleep(0.001)  # give the others a chance to pile up
                return await real(*args)
            finally:
                busy[kind] -= 1
        return wrapped

    import trio

    monkeypatch.setattr(serving, "receive_file", counting("files", serving.receive_file))
    monkeypatch.setattr(serving, "receive_offers", counting("batches", serving.receive_offers))
    monkeypatch.setattr(serving, "serve_gets", counting("batches", serving.serve_gets))
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed
    assert tree_state(dst) == tree_state(src)
    assert peak == {"files": 2, "batches": 1}
    pair.close()


def test_a_batchs_files_signed_one_by_one_are_indexed_in_one_transaction(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first push signs each small file as it offers it: the batch's index rows are
    stored together at its end (a commit per file was 5 SQL statements and most of the
    index's time), and they are all there after."""
    root = tmp_path / "root"
    small_tree(root, 20)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    names = [str(p.relative_to(root)) for p in sorted(root.rglob("*.txt"))]
    transactions = []
    real = type(replica.db).transaction

    def counting(db):
        transactions.append(1)
        return real(db)

    monkeypatch.setattr(type(replica.db), "transaction", counting)
    signed = batch.offer_batch(replica, [(n, None) for n in names])
    assert all(isinstance(offer, m.FileOffer) for offer, _, _ in signed)
    assert len(transactions) == 1
    rows = replica.indexed(names)
    assert sorted(rows) == sorted(names)
    assert all(rows[offer.path].root == offer.root for offer, _, _ in signed)
    replica.close()


def _text(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out = b"".join(b"line %d: %x %x\n" % (n, rng.getrandbits(64), rng.getrandbits(64))
                   for n in range(size // 30 + 1))
    return out[:size]


def _pushed_four(stats, pair: Pair, src: Path, counted: dict[str, int], large: bool,
                 how: str) -> None:
    """A push of files of 100 KB, 300 KB, 900 KB and 1.5 MB went as ``how``: the first
    three in 2 batches with ``large-deltas`` (1 MiB of them a batch), else all alone."""
    assert stats.in_step and not stats.failed and stats.files_transferred == 4
    assert tree_state(pair.share) == tree_state(src)
    assert counted["single"] == (1 if large else 4)
    assert counted["batches"] == (2 if large else 0)
    assert {stats.moved[name][0] for name in stats.moved} == {how}


@pytest.mark.parametrize("large", [True, False])
async def test_edited_files_under_a_mebibyte_are_described_in_their_batch(
        tmp_path, counted, monkeypatch, large: bool) -> None:
    """Files of 100 KB, 300 KB and 900 KB edited at the source, whose older versions the
    server holds: between peers with ``large-deltas`` they are described in a batch (no
    per-file exchange), and one of 1.5 MB still goes alone; without the feature all four
    go alone. The same trees and the same literal either way."""
    if not large:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != batch.LARGE_DELTAS))
    src = tmp_path / "src"
    sizes = {"a.txt": 100_000, "b.txt": 300_000, "c.txt": 900_000, "d.txt": 1_500_000}
    for k, (name, size) in enumerate(sizes.items()):
        write(src / name, _text(size, k), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    counted.update(batches=0, single=0)
    for name, size in sizes.items():
        data = bytearray((src / name).read_bytes())
        data[size // 2 : size // 2 + 4] = b"EDIT"
        write(src / name, bytes(data), OLD + 1)
    stats = await pair.run("push", src)
    _pushed_four(stats, pair, src, counted, large, "delta")
    assert stats.literal_bytes < 4 * 2000
    pair.close()


def test_files_under_a_mebibyte_go_in_batches_only_where_the_peer_takes_them() -> None:
    from rdc.local.fs import PARTIAL_BYTES

    assert batch.DELTA_FILE <= PARTIAL_BYTES  # (a file that can be resumed goes alone)
    old = b"\x01" * 8
    files = [("edited", old), ("edited-1m", old), ("new-100k", None), ("edited-2m", old),
             ("new-1m", None)]
    sizes = {"edited": 100_000, "edited-1m": batch.DELTA_FILE - 1, "new-100k": 100_000,
             "edited-2m": 2 << 20, "new-1m": batch.DELTA_FILE}
    groups, alone = batch.batches(files, sizes, deltas=True, large=True)
    # 1 MiB of deltas a batch, and 1 MiB of files sent whole (new at their path)
    assert groups == [[("edited", old)], [("edited-1m", old), ("new-100k", None)]]
    assert alone == [("edited-2m", old), ("new-1m", None)]
    groups, alone = batch.batches(files, sizes, deltas=True)
    assert not groups and alone == files


def test_a_target_describes_a_large_file_in_a_batch_only_with_the_feature(tmp_path) -> None:
    """An offer of a 100 KB file whose older version the target holds: ``delta`` between
    peers with ``large-deltas`` (``large``), else ``descend`` (its own exchange), as a
    target without the feature answers; 1 MiB or more: ``descend`` either way."""
    from rdc.content.signature import signature_of_bytes

    root = tmp_path / "root"
    write(root / "f", _text(100_000, 1), OLD)
    write(root / "g", _text(1_100_000, 2), OLD)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    tree = replica.scan()

    def offer(name: str, data: bytes) -> m.FileOffer:
        signature = signature_of_bytes(data)
        return m.FileOffer(name, len(data), signature.root, len(signature.tree.levels),
                           signature.sketch, 0o644, OLD + 1,
                           m.Expected("f", tree.children[name].root[:8]), None)

    offers = [(o, o.expect) for o in (offer("f", _text(100_000, 1)[:-9] + b"edited!!\n"),
                                      offer("g", _text(1_100_000, 2)[:-9] + b"edited!!\n"))]
    assert [d.verdict for d in batch.decide_batch(replica, offers, True, True)] == [
        "delta", "descend"]
    assert [d.verdict for d in batch.decide_batch(replica, offers, True)] == [
        "descend", "descend"]
    replica.close()


async def test_a_file_grown_past_a_mebibyte_since_the_scan_goes_alone(
        tmp_path, counted, monkeypatch) -> None:
    """A 300 KB file edited at the source and, after the scan put it in a batch, grown to
    1.2 MB before its batch read it: the source does not offer it in the batch without its
    content (a peer with ``large-deltas`` may answer ``delta`` for it), it goes by its own
    exchange, and the server ends with what the file holds now (the sync is not in step:
    the tree it compared is the one scanned, as for any file changed while synced)."""
    src = tmp_path / "src"
    write(src / "f.txt", _text(300_000, 3), OLD)
    write(src / "g.txt", _text(5_000, 4), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    counted.update(batches=0, single=0)
    write(src / "f.txt", _text(300_000, 3)[:-4] + b"EDIT", OLD + 1)
    write(src / "g.txt", _text(5_000, 4)[:-4] + b"EDIT", OLD + 1)
    grown = _text(1_200_000, 5)
    real = batch.offer_batch

    def growing(replica, files, *args):
        write(src / "f.txt", grown, OLD + 2)
        return real(replica, files, *args)

    monkeypatch.setattr(batch, "offer_batch", growing)
    stats = await pair.run("push", src)
    assert not stats.failed
    # (its own exchange meets a file other than the one scanned, and asks again)
    assert counted["batches"] == 1 and counted["single"] >= 1
    assert (pair.share / "f.txt").read_bytes() == grown
    pair.close()


@pytest.mark.parametrize("large", [True, False])
async def test_edited_files_under_a_mebibyte_are_pulled_in_their_batch(
        tmp_path, counted, monkeypatch, large: bool) -> None:
    """The same in a pull: files of 100 KB, 300 KB and 900 KB edited on the server, whose
    older versions the client holds, come in batches the client describes (no per-file
    ``get``), and one of 1.5 MB alone; without ``large-deltas`` all four alone."""
    if not large:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != batch.LARGE_DELTAS))
    pair = Pair(tmp_path)
    dst = tmp_path / "dst"
    sizes = {"a.txt": 100_000, "b.txt": 300_000, "c.txt": 900_000, "d.txt": 1_500_000}
    for k, (name, size) in enumerate(sizes.items()):
        write(pair.share / name, _text(size, k), OLD)
    await pair.run("pull", dst)
    counted.update(gets=0, alone=0)
    for name, size in sizes.items():
        data = bytearray((pair.share / name).read_bytes())
        data[size // 2 : size // 2 + 4] = b"EDIT"
        write(pair.share / name, bytes(data), OLD + 1)
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed and stats.files_transferred == 4
    assert tree_state(dst) == tree_state(pair.share)
    assert counted["alone"] == (1 if large else 4)
    assert counted["gets"] == (2 if large else 0)  # 1 MiB of them a batch
    assert {stats.moved[name][0] for name in sizes} == {"delta"}
    assert stats.literal_bytes < 4 * 2000
    pair.close()


@pytest.mark.parametrize("large", [True, False])
async def test_new_files_under_a_mebibyte_go_in_batches(
        tmp_path, counted, monkeypatch, large: bool) -> None:
    """A first copy of files of 100 KB, 300 KB and 900 KB and one of 1.5 MB: between
    peers with ``large-deltas`` the first three go in batches (no per-file exchange), sent
    whole, the 1.5 MB one alone; then a copy of the 300 KB one, pushed, is copied from it
    by its batch (no data sent). A pull of the tree into an empty directory the same.
    Without the feature each of them goes alone, as before."""
    if not large:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != batch.LARGE_DELTAS))
    src, dst = tmp_path / "src", tmp_path / "dst"
    sizes = {"a.txt": 100_000, "b.txt": 300_000, "c.txt": 900_000, "d.txt": 1_500_000}
    for k, (name, size) in enumerate(sizes.items()):
        write(src / name, _text(size, k), OLD)
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    _pushed_four(stats, pair, src, counted, large, "whole")
    write(src / "sub" / "copy-of-b.txt", _text(300_000, 1), OLD)
    counted.update(batches=0, single=0)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 1
    assert tree_state(pair.share) == tree_state(src)
    assert stats.moved["sub/copy-of-b.txt"][0] == "copy" and stats.literal_bytes == 0
    assert counted == {"batches": int(large), "single": int(not large), "gets": 0,
                       "alone": 0}
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed and stats.files_transferred == 5
    assert tree_state(dst) == tree_state(src)
    assert counted["alone"] == (1 if large else 5)
    assert counted["gets"] == (3 if large else 0)  # a and b, c, the copy: 1 MiB a batch
    pair.close()


async def test_a_source_refuses_deltas_of_more_than_a_batch_holds(
        tmp_path, monkeypatch) -> None:
    """A pulling peer that asks for three edited files of 400 KB in one batch and answers
    ``delta`` for all three (more than 1 MiB + 64 KiB) is refused before the server reads
    them: the pull fails, and the server serves the next one."""
    pair = Pair(tmp_path)
    for k in range(3):
        write(pair.share / f"f{k}.txt", _text(400_000, k), OLD)
    dst = tmp_path / "dst"
    await pair.run("pull", dst)
    for k in range(3):
        write(pair.share / f"f{k}.txt", _text(400_000, k)[:-4] + b"EDIT", OLD + 1)
    with monkeypatch.context() as peer:  # (a client that ignores both budgets)
        peer.setattr(batch, "DELTA_BYTES", 4 << 20)
        peer.setattr(batch, "_within_budget", lambda decision, offer, held: decision)
        with pytest.raises(RemoteError) as refused:
            await pair.run("pull", dst)
    assert "protocol error: deltas of more content than a batch holds" in str(refused.value)
    stats = await pair.run("pull", dst)
    assert stats.in_step and tree_state(dst) == tree_state(pair.share)
    pair.close()


def test_batches_in_flight_cover_a_slow_links_round_trips() -> None:
    """A fast link keeps the floor (the target's writers are the limit); a slower one more,
    enough for two round trips at the target's rate; never past the memory bound."""
    rtts = [0.0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 5.0]
    counts = [batch.batches_in_flight(rtt) for rtt in rtts]
    assert counts[:4] == [batch.BATCHES_IN_FLIGHT] * 4
    assert counts == sorted(counts)
    assert counts[-1] == batch.MOST_BATCHES_IN_FLIGHT
    at_200ms = batch.batches_in_flight(0.2)
    assert batch.BATCHES_IN_FLIGHT < at_200ms < batch.MOST_BATCHES_IN_FLIGHT
    assert at_200ms * batch.BATCH_BYTES >= 2 * 0.2 * batch.TARGET_RATE
