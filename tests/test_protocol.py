"""Push and pull over in-memory streams: the protocol logic end to end, file semantics and
what each change costs."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from rdc.errors import AccessDenied, RemoteError
from rdc.transfer import descent, metadata, oneway, serving
from rdc.transfer.stats import Options
from rdc.wire import messages as m

from .conftest import scaled
from .protocol_support import Pair, remote_answering, tree_state, write

OLD = 1_600_000_000_123_456_789


def populate(root, seed: int = 1, files: int = 30) -> None:
    rng = random.Random(seed)
    for i in range(files):
        size = rng.choice([0, 10, 300, 5_000, 40_000, 150_000])
        write(root / f"d{i % 4}" / f"sub{i % 2}" / f"f{i}.bin", rng.randbytes(size), OLD + i)
    (root / "empty" / "deeper").mkdir(parents=True)
    os.symlink("d0/sub0/f0.bin", root / "link")
    os.symlink("../../outside/target", root / "d1" / "dangling")
    os.chmod(root / "d2" / "sub0" / "f2.bin", 0o600)
    os.chmod(root / "d3", 0o750)


async def test_push_then_pull_copies_everything_exactly(tmp_path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    populate(src)
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    assert not stats.failed and stats.in_step
    assert tree_state(pair.share) == tree_state(src)
    assert stats.files_transferred == stats.files_total == 30
    stats = await pair.run("pull", dst)
    assert not stats.failed and stats.in_step
    assert tree_state(dst) == tree_state(src)
    pair.close()


async def test_nothing_changed_costs_one_round_trip(tmp_path) -> None:
    src = tmp_path / "src"
    populate(src)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    stats = await pair.run("push", src)
    assert stats.in_step and stats.files_transferred == 0 and stats.changes is None
    assert stats.bytes_sent + stats.bytes_received < 1024
    pair.close()


async def test_edit_rename_copy_delete_and_metadata(tmp_path) -> None:
    src = tmp_path / "src"
    populate(src)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    big = src / "d1" / "sub1" / "f5.bin"
    data = bytearray(big.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4] = b"EDIT"
    big.write_bytes(bytes(data))
    os.rename(src / "d2" / "sub0" / "f6.bin", src / "d3" / "moved.bin")  # moved
    shutil.copy2(src / "d1" / "sub1" / "f9.bin", src / "copy.bin")  # copied
    os.remove(src / "d0" / "sub0" / "f4.bin")
    shutil.rmtree(src / "empty")
    os.chmod(src / "d0" / "sub0" / "f0.bin", 0o640)  # mode only
    os.utime(src / "d1" / "sub1" / "f1.bin", ns=(OLD - 7, OLD - 7))  # time only
    os.unlink(src / "link")
    os.symlink("d3/moved.bin", src / "link")  # retargeted link

    stats = await pair.run("push", src, options=Options(delete=False))
    assert not stats.failed
    assert (pair.share / "d0" / "sub0" / "f4.bin").exists()  # no --delete: kept
    stats = await pair.run("push", src, options=Options(delete=True))
    assert not stats.failed and stats.in_step
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_files_kept_without_delete_cost_no_second_compare(tmp_path, monkeypatch) -> None:
    """A push into a directory that keeps files the source lacks ends with the trees
    still different; that is no reason to compare them all over again."""
    src = tmp_path / "src"
    populate(src)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    os.remove(src / "d0" / "sub0" / "f4.bin")
    write(src / "d1" / "new.bin", b"new content", OLD)
    compares: list[int] = []
    real = oneway.compare

    async def counting(*args, **kwargs):
        compares.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(oneway, "compare", counting)
    stats = await pair.run("push", src, options=Options(delete=False))
    assert not stats.failed and not stats.in_step and len(compares) == 1
    assert (pair.share / "d0" / "sub0" / "f4.bin").exists()
    assert (pair.share / "d1" / "new.bin").read_bytes() == b"new content"
    pair.close()


async def test_times_changed_in_more_directories_than_a_request_may_name(tmp_path) -> None:
    """The metadata pass asks for the directories whose metadata differs, level by level:
    4,200 of them at one level were one ``mlist`` over the limit of its paths, a protocol
    error (a share that the open race of bench/race.py had filled with directories)."""
    src = tmp_path / "src"
    for i in range(4200):
        write(src / f"d{i:04}" / "f", b"x", OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    for i in range(4200):
        os.utime(src / f"d{i:04}" / "f", ns=(OLD + 1, OLD + 1))
    stats = await pair.run("push", src)
    assert not stats.failed and stats.in_step
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_renames_and_copies_cost_no_data(tmp_path) -> None:
    src = tmp_path / "src"
    rng = random.Random(2)
    for i in range(10):
        write(src / f"f{i}", rng.randbytes(50_000), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    for i in range(5):
        os.rename(src / f"f{i}", src / f"renamed{i}")
    shutil.copy2(src / "f7", src / "copy7")
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and stats.literal_bytes == 0
    assert stats.copied_files == 6
    assert stats.bytes_sent + stats.bytes_received < 6000
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_small_edit_in_a_large_file_sends_little(tmp_path) -> None:
    src = tmp_path / "src"
    size = scaled(16 << 20, 2 << 20)
    rng = random.Random(3)
    write(src / "big.bin", b"".join(rng.randbytes(1 << 20) for _ in range(size >> 20)), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    with open(src / "big.bin", "r+b") as f:
        for offset in (1000, size // 3, size - 5000):
            f.seek(offset)
            f.write(b"a small edit")
    stats = await pair.run("push", src)
    assert stats.in_step and stats.files_transferred == 1
    assert stats.literal_bytes < 3 * 2048
    assert stats.bytes_sent + stats.bytes_received < 40_000
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_rewritten_file_and_old_phrases_in_new_surroundings(
        tmp_path, monkeypatch, verb) -> None:
    """Nothing of either file is found above the fine pieces: the rewritten one costs its
    bytes and a probe of fine lists, the other gets its old phrases from the seed after
    the probe (two rounds of fine lists, `descent.FINE_PROBE`)."""
    rounds: list[int] = []  # mids asked, per round of fine lists
    real = descent._fine_lists

    def counted(wanted, *args):
        rounds.append(len(wanted))
        return (yield from real(wanted, *args))

    monkeypatch.setattr(descent, "_fine_lists", counted)
    rng = random.Random(6)
    src = tmp_path / "src"
    phrases = [rng.randbytes(400) for _ in range(scaled(250, 100))]
    size = scaled(400_000, 100_000)
    write(src / "rewritten.bin", rng.randbytes(size), OLD)
    write(src / "phrases.bin", b"".join(phrases), OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    if verb == "pull":
        shutil.rmtree(src)
        shutil.copytree(pair.share, src)
    new = b"".join(p + rng.randbytes(100) for p in phrases)
    write((pair.share if verb == "pull" else src) / "phrases.bin", new, OLD + 1)
    write((pair.share if verb == "pull" else src) / "rewritten.bin", rng.randbytes(size),
          OLD + 1)
    rounds.clear()
    stats = await pair.run(verb, src)
    assert stats.in_step and stats.files_transferred == 2
    assert stats.literal_bytes < size + 0.4 * len(new)  # most of the phrases matched
    probes = [n for n in rounds if n == descent.FINE_PROBE]
    assert len(probes) == 2 and len(rounds) == 3, rounds  # the phrases' rest: one round
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


@pytest.mark.parametrize("server", ["levels", "unsplit", "whole", "old"])
async def test_a_pull_that_wrote_in_few_directories_walks_down_to_them(
        tmp_path, monkeypatch, server) -> None:
    """After a pull that wrote in one directory of 30, whose time moved at the source too
    (an editor that saves by rename), the metadata walk asks for no whole subtree (`mlist`
    `levels`): the vectors of the top and of that directory, not of the whole tree, and
    (`split`) of their subdirectories alone, their files' times (which the content phase
    set) by one hash each. From a server that ignores `split`, forced to take whole
    vectors, or from a server that ignores `levels` too, the pull ends the same."""
    rng = random.Random(8)
    src = tmp_path / "src"
    for d in range(30):
        for f in range(40):
            write(src / f"d{d:02}" / f"f{f:02}.txt", b"%d %d\n" % (d, f),
                  OLD + rng.randrange(10**15))
    pair = Pair(tmp_path)
    await pair.run("push", src)
    dst = tmp_path / "dst"
    await pair.run("pull", dst)
    write(pair.share / "d07" / "f03.txt", b"edited\n", OLD + 5)
    os.utime(pair.share / "d07", ns=(OLD + 6, OLD + 6))
    if server == "whole":
        monkeypatch.setattr(metadata, "TOUCHED_SHARE", 10**9)
    asked: list[bool] = []
    answered: list[m.MetaDir] = []
    real = serving.mlisting

    def mlisting(tree, path, hb, vectors, levels, split=False):
        asked.append(levels)
        answered.append(real(tree, path, hb, vectors, levels and server != "old",
                             split and server == "levels"))
        return answered[-1]

    monkeypatch.setattr(serving, "mlisting", mlisting)
    stats = await pair.run("pull", dst)
    assert stats.in_step and stats.files_transferred == 1
    assert tree_state(dst) == tree_state(pair.share)
    assert asked and all(asked) == (server != "whole")
    assert all(bool(item.files) for item in answered) == (server == "levels")
    if server == "levels":  # the top's 30 subdirectories' times, not one file's
        assert [len(item.times.decode()) for item in answered] == [30]
        assert stats.bytes_received < 2000, stats.bytes_received
    elif server == "unsplit":
        assert stats.bytes_received < 3000, stats.bytes_received
    else:  # the vectors of 1,230 entries, most of their random times
        assert stats.bytes_received > 6000, stats.bytes_received
    pair.close()


def _spy_mlisting(monkeypatch, what) -> list:
    """The server's ``mlisting`` as it is, ``what(path, levels, split)`` of each call
    recorded in the list returned."""
    asked = []
    real = serving.mlisting

    def mlisting(tree, path, hb, vectors, levels, split=False):
        asked.append(what(path, levels, split))
        return real(tree, path, hb, vectors, levels, split)

    monkeypatch.setattr(serving, "mlisting", mlisting)
    return asked


@pytest.mark.parametrize("asked", [True, False])
async def test_metadata_items_name_no_path_where_they_answer_the_one_asked(
        tmp_path, monkeypatch, asked) -> None:
    """Between peers with ``asked-meta`` an ``mlisting`` has one item per path asked for,
    in order: the path left out, nil where the path is not a directory. The client puts
    each in its place; without the feature the items name their paths and a path that is
    not a directory has none. Either way the client gets the same items."""
    from rdc.transfer.ops import ASKED_META
    from rdc.transfer.sides import Remote
    from rdc.wire import handshake

    if not asked:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != ASKED_META))
    src = tmp_path / "src"
    for d in range(3):
        write(src / f"d{d}" / "f.txt", b"%d" % d, OLD)
    write(src / "file", b"not a directory", OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    sent: list = []
    real = serving._send_split

    def spying(conversation, kind, dirs):
        if kind is m.MetaListing:
            sent.extend(dirs)
        return real(conversation, kind, dirs)

    monkeypatch.setattr(serving, "_send_split", spying)
    got: list[m.MetaDir] = []

    async def between(connection) -> None:
        remote = Remote.__new__(Remote)
        remote.connection, remote._early = connection, None
        got.extend(await remote.metadata(["d0", "file", "d2", "gone"], 8, levels=True))

    await pair.run("push", src, between=between)
    assert [item.path for item in got] == ["d0", "d2"]
    assert all(item.files and not item.times.decode() for item in got)  # (``split``)
    if asked:
        assert [None if item is None else item.path for item in sent] == [
            None, None, None, None]
        assert [item is None for item in sent] == [False, True, False, True]
    else:
        assert [item.path for item in sent] == ["d0", "d2"]
    pair.close()


async def test_more_unnamed_metadata_items_than_paths_asked_is_a_protocol_error() -> None:
    """An ``mlisting`` with more items that name no path than paths were asked for ends
    the request as a protocol error."""
    from rdc.errors import ProtocolError

    remote = remote_answering(m.MetaListing(dirs=[None, None]), set())
    with pytest.raises(ProtocolError, match="more unnamed"):
        await remote.metadata(["d"], 8)


async def test_a_split_item_whose_files_differ_is_asked_for_again_whole(
        tmp_path, monkeypatch) -> None:
    """`mlist` ``split``: where a file's mode and time changed at the source without its
    content (the content phase did not write it), the directory's hash of its files'
    metadata differs, and it is asked for again with its files' vectors (``split``
    false): the pull ends in step, that file's mode and time as the source's."""
    rng = random.Random(3)
    src = tmp_path / "src"
    for d in range(4):
        for f in range(10):
            write(src / f"d{d}" / f"f{f}.txt", b"%d %d\n" % (d, f), OLD + rng.randrange(10**15))
    pair = Pair(tmp_path)
    await pair.run("push", src)
    dst = tmp_path / "dst"
    await pair.run("pull", dst)
    write(pair.share / "d2" / "f3.txt", b"edited\n", OLD + 5)
    os.chmod(pair.share / "d2" / "f7.txt", 0o600)
    os.utime(pair.share / "d2" / "f7.txt", ns=(OLD + 7, OLD + 7))
    asked = _spy_mlisting(monkeypatch, lambda path, levels, split: (path, split))
    stats = await pair.run("pull", dst)
    assert stats.in_step and stats.files_transferred == 1
    assert tree_state(dst) == tree_state(pair.share)
    assert (dst / "d2" / "f7.txt").stat().st_mode & 0o7777 == 0o600
    assert asked == [("", True), ("d2", True), ("d2", False)]
    pair.close()


async def test_a_pull_where_every_time_changed_asks_below_the_top_for_whole_subtrees(
        tmp_path, monkeypatch) -> None:
    """A pull that wrote in one directory of 30, where every entry's time changed at the
    source too (a new release unpacked over the old): the top's one-level vector shows most
    of its entries differ, so the 30 subdirectories are asked for whole (`mlist` without
    `levels`), one vector each, not level by level below them. The pull ends in step, every
    time and mode as the source's, and its index current."""
    thirty_directories(tmp_path / "src", 40, seed=8)
    pair = Pair(tmp_path)
    await pair.run("push", tmp_path / "src")
    dst = tmp_path / "dst"
    await pair.run("pull", dst)
    for d in range(30):
        (pair.share / f"d{d:02}" / "sub").mkdir()
        write(pair.share / f"d{d:02}" / "sub" / "x.txt", b"x", OLD)
    await pair.run("pull", dst)  # (a level below each: what `levels` would descend into)
    write(pair.share / "d07" / "f03.txt", b"edited\n", OLD + 5)
    rng = random.Random(9)
    for where, dirs, files in os.walk(pair.share, topdown=False):
        for name in [*files, *dirs]:
            stamp = OLD + rng.randrange(10**15)
            os.utime(os.path.join(where, name), ns=(stamp, stamp))
    asked = _spy_mlisting(monkeypatch, lambda path, levels, split: (path, levels))
    stats = await pair.run("pull", dst)
    assert stats.in_step and stats.files_transferred == 1
    assert tree_state(dst) == tree_state(pair.share)
    assert asked == [("", True)] + [(f"d{d:02}", False) for d in range(30)], asked
    rescan = await pair.run("pull", dst)
    assert rescan.in_step and rescan.files_transferred == 0
    pair.close()


def thirty_directories(root, files: int, seed: int) -> None:
    """``root``/d00 .. d29, each with ``files`` small files, every file a time of its own."""
    rng = random.Random(seed)
    for d in range(30):
        for f in range(files):
            write(root / f"d{d:02}" / f"f{f:02}.txt", b"%d %d\n" % (d, f),
                  OLD + rng.randrange(10**15))


def mlists_asked(monkeypatch) -> list[str]:
    """The paths the server is asked ``mlist`` of, in order, from now on."""
    asked: list[str] = []
    real = serving.mlisting

    def mlisting(tree, path, *args):
        asked.append(path)
        return real(tree, path, *args)

    monkeypatch.setattr(serving, "mlisting", mlisting)
    return asked


async def test_a_first_copy_sets_its_directories_times_before_the_metadata_walk(
        tmp_path, monkeypatch) -> None:
    """A push into an empty directory (streamed) of 31 directories among 1,231 entries
    sets their times while it scans its tree, then asks the metadata walk's first
    question: asked once, its answer shows those times. (Asked before them, the answer was
    dropped and the question asked again: a second rescan and listing on the server.)"""
    src = tmp_path / "src"
    thirty_directories(src / "top", 40, seed=10)
    pair = Pair(tmp_path)
    asked = mlists_asked(monkeypatch)
    stats = await pair.run("push", src)
    assert stats.in_step and stats.files_transferred == 1200
    assert tree_state(pair.share) == tree_state(src)  # directory times too
    assert asked == [""], asked
    pair.close()


@pytest.mark.parametrize("source_dir", ["kept", "moved"])
async def test_a_pull_puts_back_the_times_of_the_directories_it_wrote_in(
        tmp_path, monkeypatch, source_dir) -> None:
    """Files edited in place at the source, in 3 directories of 30 (one level down): the
    pull's writes move those directories' times here, and it puts them back to what its
    scan saw before the walk. Where the source's directories kept their times, the walk
    ends at the top, one ``mlist`` and no vectors; where one moved (a new file in it), the
    walk goes down to it and sets it."""
    src = tmp_path / "src"
    thirty_directories(src / "top", 40, seed=9)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    dst = tmp_path / "dst"
    await pair.run("pull", dst)
    for d in (3, 11, 27):
        write(pair.share / "top" / f"d{d:02}" / "f05.txt", b"edited\n", OLD + d)
    if source_dir == "moved":
        write(pair.share / "top" / "d11" / "new.txt", b"new\n", OLD)
        os.utime(pair.share / "top" / "d11", ns=(OLD + 7, OLD + 7))
    asked = mlists_asked(monkeypatch)
    stats = await pair.run("pull", dst)
    assert stats.in_step and stats.files_transferred == (3 if source_dir == "kept" else 4)
    assert tree_state(dst) == tree_state(pair.share)  # directory times too
    if source_dir == "kept":
        assert asked == [""]
        assert stats.bytes_received < 2000, stats.bytes_received
    else:
        assert asked == ["", "top"]
        assert os.stat(dst / "top" / "d11").st_mtime_ns == OLD + 7
    pair.close()


async def test_pull_updates_in_place_and_deletes_only_when_asked(tmp_path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    populate(src)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    await pair.run("pull", dst)
    write(dst / "local-only.txt", b"mine")
    (pair.share / "d0" / "sub0" / "f0.bin").write_bytes(b"changed on the server")
    stats = await pair.run("pull", dst)
    assert (dst / "local-only.txt").exists() and not stats.failed
    assert (dst / "d0" / "sub0" / "f0.bin").read_bytes() == b"changed on the server"
    stats = await pair.run("pull", dst, options=Options(delete=True))
    assert not (dst / "local-only.txt").exists()
    assert tree_state(dst) == tree_state(pair.share)
    pair.close()


async def test_kind_changes_replace_entries(tmp_path) -> None:
    src = tmp_path / "src"
    write(src / "a", b"file a")
    (src / "b").mkdir()
    write(src / "b" / "inner", b"inner")
    os.symlink("a", src / "c")
    pair = Pair(tmp_path)
    await pair.run("push", src)
    os.remove(src / "a")
    (src / "a").mkdir()
    write(src / "a" / "x", b"now a directory")
    shutil.rmtree(src / "b")
    write(src / "b", b"now a file")
    os.remove(src / "c")
    write(src / "c", b"was a link")
    stats = await pair.run("push", src)
    assert not stats.failed and stats.in_step
    assert tree_state(pair.share) == tree_state(src)
    pair.close()


async def test_excludes_apply_on_both_sides(tmp_path) -> None:
    src = tmp_path / "src"
    write(src / "keep.txt", b"keep")
    write(src / "build" / "out.o", b"object")
    write(src / "notes.tmp", b"temp")
    pair = Pair(tmp_path)
    write(pair.share / "server.tmp", b"server's own temp file")
    stats = await pair.run("push", src, excludes=["build/", "*.tmp"],
                           options=Options(delete=True))
    assert stats.in_step and not stats.failed
    assert sorted(os.listdir(pair.share)) == [".rdc-folder", "keep.txt", "server.tmp"]
    pair.close()


async def test_a_subdirectory_of_a_share(tmp_path) -> None:
    src = tmp_path / "src"
    write(src / "x", b"x")
    pair = Pair(tmp_path)
    await pair.run("push", src, path="deep/inside")
    assert (pair.share / "deep" / "inside" / "x").read_bytes() == b"x"
    pair.close()


async def test_read_only_share_refuses_pushes_and_serves_pulls(tmp_path) -> None:
    pair = Pair(tmp_path, readonly=True)
    write(pair.share / "data", b"served")
    src = tmp_path / "src"
    write(src / "new", b"x")
    with pytest.raises(RemoteError) as refused:
        await pair.run("push", src)
    assert refused.value.code == "readonly" and refused.value.exit_code == 4
    dst = tmp_path / "dst"
    stats = await pair.run("pull", dst)
    assert stats.in_step and (dst / "data").read_bytes() == b"served"
    pair.close()


async def test_bad_token_is_refused(tmp_path) -> None:
    pair = Pair(tmp_path)
    with pytest.raises(AccessDenied):
        await pair.run("push", tmp_path, token="wrong-token-of-some-length")
    pair.close()


async def test_dry_run_changes_nothing(tmp_path) -> None:
    src = tmp_path / "src"
    populate(src)
    pair = Pair(tmp_path)
    before = tree_state(pair.share)
    stats = await pair.run("push", src, options=Options(dry_run=True, delete=True))
    assert tree_state(pair.share) == before
    assert len(stats.changes.files) == 30 and stats.changes.mkdirs
    pair.close()


async def test_a_concurrent_change_at_the_target_is_not_overwritten(tmp_path) -> None:
    """The push compares against the listing; the file changed after it: conflict."""
    src = tmp_path / "src"
    write(src / "doc.txt", b"version one" * 100)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    write(src / "doc.txt", b"version two" * 100)

    async def meanwhile(connection) -> None:
        conversation = connection.start(m.List(paths=[""], hb=8))
        await conversation.receive(m.Listings)  # the server has scanned; now change it
        conversation.close()
        (pair.share / "doc.txt").write_bytes(b"edited on the server meanwhile")

    stats = await pair.run("push", src, between=meanwhile)
    assert stats.failed and "conflict" in stats.failed[0][1]
    assert (pair.share / "doc.txt").read_bytes() == b"edited on the server meanwhile"
    pair.close()


async def test_a_leaf_with_wrongly_matched_sub_chunks_is_fetched_whole(
    tmp_path, monkeypatch
) -> None:
    """Sub-chunk lookups in a seed region that name wrong bytes (as a short prefix shared
    by another piece of the same length would; made to happen here: every piece found is
    taken one byte off): the leaf check catches each, and only that leaf is fetched
    again."""
    from rdc.content import subchunks
    from rdc.transfer import target

    real_find = subchunks.Pieces.find

    def one_off(self, key: bytes, length: int) -> int | None:
        hit = real_find(self, key, length)
        return hit - 1 if hit else hit

    monkeypatch.setattr(subchunks.Pieces, "find", one_off)
    refetched = []
    real_leaf = target._Literal.leaf

    async def counting(self, leaf, length):
        refetched.append(leaf)
        return await real_leaf(self, leaf, length)

    monkeypatch.setattr(target._Literal, "leaf", counting)
    src = tmp_path / "src"
    rng = random.Random(12)
    text = b"".join(b"line %d of some text that repeats a little\n" % rng.randrange(10**6)
                    for _ in range(20_000))
    write(src / "doc.txt", text, OLD)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    edited = bytearray(text)
    for at in range(5_000, len(edited), 50_000):
        edited[at : at + 3] = b"XYZ"
    write(src / "doc.txt", bytes(edited), OLD + 1)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert (pair.share / "doc.txt").read_bytes() == bytes(edited)
    assert refetched, "no sub-chunk matched the wrong bytes: the test proves nothing"
    assert stats.literal_bytes < len(edited) // 4  # leaves, not the whole file
    pair.close()


class _Answer:
    """Stands in for the ``open`` conversation: answers at once, or refuses at once."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    async def receive(self, *kinds: type) -> m.Opened:
        if self.refuse:
            raise RemoteError(code="share", message="no such share")
        return m.Opened(content=b"c" * 32, meta=b"m" * 32)

    def close(self) -> None:
        pass


async def test_the_local_scan_runs_while_the_server_opens_and_stops_if_refused(
    tmp_path,
) -> None:
    from rdc.local.replica import Replica
    from rdc.transfer.oneway import scan_while_opening

    src = tmp_path / "src"
    for i in range(600):
        write(src / f"d{i % 7}" / f"f{i}", os.urandom(64))
    replica = Replica(str(src), tmp_path / "index.sqlite3")
    try:
        with pytest.raises(RemoteError, match="no such share"):  # itself, not in a group
            await scan_while_opening(replica, _Answer(refuse=True))  # type: ignore[arg-type]
        assert replica.db.count() < 600  # the scan stopped at its first file
        answer, tree = await scan_while_opening(replica, _Answer(refuse=False))  # type: ignore[arg-type]
        assert answer.content == b"c" * 32
        assert replica.db.count() == 600 and tree.content == replica.scan().content
    finally:
        replica.close()


def _subtrees(src, times: int) -> None:
    for d in range(3):
        for i in range(12):
            write(src / f"top{d}" / f"sub{i % 2}" / f"f{i}", b"x" * i, OLD + times)


@pytest.mark.parametrize("old_server", [False, True])
async def test_a_push_sends_its_times_for_changed_subtrees_without_the_servers(
        tmp_path, monkeypatch, old_server) -> None:
    """A pushing client does not need the server's vectors of a whole subtree, only
    whether its meta hash differs: the server sends the hash, the client its own vectors
    for the subtrees that differ and nothing for the others. A server that ignores the
    request's ``vectors`` field (and sends them) is still brought in step."""
    from rdc.transfer import ops, serving, sides

    monkeypatch.setattr(ops, "WHOLE_META", 10)  # each topN/ (14 entries) is split in two
    src = tmp_path / "src"
    _subtrees(src, 0)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    for i in range(12):
        os.utime(src / "top1" / f"sub{i % 2}" / f"f{i}", ns=(OLD + 9, OLD + 9))
    os.chmod(src / "top1" / "sub0" / "f0", 0o600)

    listed: list[m.MetaDir] = []
    real = ops.mlisting

    def spying(tree, path, hb, vectors=True, levels=False, split=False):
        item = real(tree, path, hb, True if old_server else vectors, levels, split)
        listed.append(item)
        return item

    monkeypatch.setattr(serving, "mlisting", spying)
    sent: list[m.MetaDir] = []
    real_set = sides.Remote.set_vectors

    async def recording(self, items):
        sent.extend(items)
        return await real_set(self, items)

    monkeypatch.setattr(sides.Remote, "set_vectors", recording)
    stats = await pair.run("push", src)
    assert not stats.failed and stats.in_step
    assert tree_state(pair.share) == tree_state(src)
    wholes = [item for item in listed if item is not None and item.whole]
    assert {item.path for item in wholes} == {"top1/sub0", "top1/sub1"}
    assert all(bool(item.times.index) == old_server for item in wholes)
    assert sorted(item.path for item in sent) == ["top1/sub0", "top1/sub1"]
    pair.close()


@pytest.mark.parametrize("kept", [True, False])
async def test_a_push_of_files_edited_in_place_leaves_the_server_no_directory_to_set(
        tmp_path, monkeypatch, kept: bool) -> None:
    """Files edited in place in 3 directories of 30, which keep their times at the source:
    with ``kept-dir-times`` the server sets those directories back to their times before
    each batch, so the client sends no op for them and the walk ends at the top; without
    it the client sets them (an op each). Either way the trees end equal, directory times
    too."""
    from rdc.transfer import batch
    from rdc.wire import handshake

    if not kept:
        monkeypatch.setattr(handshake, "FEATURES", tuple(
            f for f in handshake.FEATURES if f != batch.KEPT_TIMES))
    src = tmp_path / "src"
    thirty_directories(src / "top", 20, seed=10)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    edited = [f"top/d{d:02}" for d in (4, 15, 22)]
    for where in edited:
        before = os.stat(src / where).st_mtime_ns
        write(src / where / "f07.txt", b"edited in place\n")  # its time: now
        assert os.stat(src / where).st_mtime_ns == before
    ops, sent = recorded_metadata(monkeypatch)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed and stats.files_transferred == 3
    assert tree_state(pair.share) == tree_state(src)
    set_dirs = {op.path for op in ops if op.kind == "meta" and op.path}
    assert set_dirs == (set() if kept else set(edited))
    assert not sent  # the walk found the trees' metadata equal at the top
    pair.close()


def recorded_metadata(monkeypatch) -> tuple[list[m.Op], list[m.MetaDir]]:
    """The ops and the vectors a push sends the server from now on, as lists that fill."""
    from rdc.transfer import sides

    ops: list[m.Op] = []
    sent: list[m.MetaDir] = []
    real_apply, real_set = sides.Remote.apply, sides.Remote.set_vectors

    async def recording_ops(self, batch):
        ops.extend(batch)
        return await real_apply(self, batch)

    async def recording_vectors(self, items):
        sent.extend(items)
        return await real_set(self, items)

    monkeypatch.setattr(sides.Remote, "apply", recording_ops)
    monkeypatch.setattr(sides.Remote, "set_vectors", recording_vectors)
    return ops, sent


def test_kept_dirs_are_those_where_only_files_newer_than_them_were_replaced() -> None:
    """A directory needs no op only where every write in it replaced a file, by a pushed
    batch whose server kept the time, that is newer than the directory (edited in place);
    a new file, a removal, a file older than its directory (saved by rename: the
    directory's time moved with it) or one that went alone each leave the op."""
    from rdc.local.snapshot import Entry
    from rdc.transfer.compare import Changes

    def file(t: int) -> Entry:
        return Entry("f", 0o644, t)

    def directory(t: int, **children: Entry) -> Entry:
        return Entry("d", 0o755, t, children=dict(children))

    tree = directory(0, **{
        "in_place": directory(5, a=file(9), b=file(8)),
        "renamed": directory(9, a=file(7)),
        "new": directory(5, a=file(9), n=file(9)),
        "gone": directory(5, a=file(9)),
        "alone": directory(5, a=file(9)),
    })
    changes = Changes(
        files=[("in_place/a", b"r"), ("in_place/b", b"r"), ("renamed/a", b"r"),
               ("new/a", b"r"), ("new/n", None), ("gone/a", b"r"), ("alone/a", b"r")],
        removals=[("gone/old", m.NOTHING)])
    kept = {"in_place/a", "in_place/b", "renamed/a", "new/a", "new/n", "gone/a"}
    assert metadata.kept_dirs(changes, kept, tree) == {"in_place"}


@pytest.mark.parametrize("subdirs, files, walked", [(4, 30, False), (12, 2, True)])
async def test_a_push_sets_the_directories_it_wrote_in_before_the_metadata_walk(
        tmp_path, monkeypatch, subdirs: int, files: int, walked: bool) -> None:
    """Every entry with a time of its own, and one file edited in each subdirectory: the
    push sets the times of the directories it wrote in first, so the metadata walk finds
    the tree in step and sends no vectors (which would carry every entry's time). Where
    it wrote in most directories of a small tree, it leaves them to the walk's vectors,
    which cost less than an op per directory."""
    from rdc.transfer import metadata

    src = tmp_path / "src"
    for d in range(subdirs):
        for i in range(files):
            write(src / "top" / f"sub{d}" / f"f{i}", b"x" * (d * files + i), OLD + d * files + i)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    for d in range(subdirs):
        write(src / "top" / f"sub{d}" / "f0", b"edited", OLD - d)
        os.utime(src / "top" / f"sub{d}", ns=(OLD + 7 * d, OLD + 7 * d))
    ops, sent = recorded_metadata(monkeypatch)
    stats = await pair.run("push", src)
    assert not stats.failed and stats.in_step and stats.files_transferred == subdirs
    assert tree_state(pair.share) == tree_state(src)
    set_first = {op.path for op in ops if op.kind == "meta"}
    if walked:
        assert sent and not set_first & {f"top/sub{d}" for d in range(subdirs)}
    else:
        assert not sent
        assert set_first == {f"top/sub{d}" for d in range(subdirs)}
    assert metadata.touched(stats.carried[-1]) == sorted(f"top/sub{d}" for d in range(subdirs))
    pair.close()


@pytest.mark.parametrize("nested", [True, False])
async def test_a_first_copy_asks_the_servers_metadata_while_it_seals_its_own_tree(
        tmp_path, monkeypatch, nested: bool) -> None:
    """After streaming a first copy, the client asks the top's metadata while it scans
    its tree for the hashes (the server rescans meanwhile), and the walk takes that answer
    rather than asking again. Where the directories are few enough to be set by ops first
    (not ``nested``), those ops go first, beside the scan, and the question after them,
    so that its answer shows them; else the question goes before the scan. The push ends
    in step either way."""
    import time

    from rdc.local.replica import Replica
    from rdc.wire.connection import Connection

    src = tmp_path / "src"
    for d in range(6):
        for i in range(5):
            where = src / f"d{d}" / f"e{i % 2}" if nested else src / "all"
            write(where / f"f{d}-{i}.txt", b"file %d %d\n" % (d, i))
    events: list[str] = []
    scan, start = Replica.scan, Connection.start

    def slow_scan(self, excludes=None, progress=None, walked=None, checksum=False):
        if self.root == str(src.resolve()):
            if progress is not None and walked is not None:  # the scan streaming stops
                for _ in range(2000):
                    progress(None)
                    time.sleep(0.005)
            events.append("local scan")
        return scan(self, excludes, progress, walked, checksum)

    def recording_start(self, message):
        if isinstance(message, m.MetaList):
            events.append(f"mlist {message.paths}")
        if isinstance(message, m.Ops) and all(op.kind == "meta" for op in message.ops):
            events.append("meta ops")
        return start(self, message)

    monkeypatch.setattr(Replica, "scan", slow_scan)
    monkeypatch.setattr(Connection, "start", recording_start)
    pair = Pair(tmp_path)
    stats = await pair.run("push", src)
    assert stats.in_step and stats.files_transferred == 30
    assert tree_state(pair.share) == tree_state(src)
    assert events.count("mlist ['']") == 1
    if nested:
        assert events.index("mlist ['']") < events.index("local scan")
        assert "meta ops" not in events
    else:
        assert events.index("meta ops") < events.index("mlist ['']")


@pytest.mark.parametrize("retimed", ["every entry", "one deep directory"])
async def test_a_push_asks_the_metadata_levels_below_a_widespread_change_at_once(
        tmp_path, monkeypatch, retimed: str) -> None:
    """Where most of a directory's subdirectories differ in metadata (a new release: every
    time changed), the push's walk asks for the levels the server would split all in its
    next request (`metadata._split_below`), not one round trip each: fewer ``mlist``
    rounds, the same vectors sent, the same tree. Where only one deep directory differs,
    the walk follows it level by level as before, and what it asked ahead for the others
    is left unused."""
    from rdc.transfer import ops as ops_module
    from rdc.wire.connection import Connection

    monkeypatch.setattr(ops_module, "WHOLE_META", 3)  # (so a small tree splits, both ends)
    monkeypatch.setattr(metadata, "WHOLE_META", 3)
    src = tmp_path / "src"
    for a in range(3):
        for b in range(3):
            for c in range(2):
                write(src / f"a{a}" / f"b{b}" / f"c{c}" / "f.txt", b"%d%d%d" % (a, b, c),
                      OLD + 10 * a + b)
    rounds: list[list[str]] = []
    start = Connection.start

    def recording_start(self, message):
        if isinstance(message, m.MetaList):
            rounds.append(list(message.paths))
        return start(self, message)

    monkeypatch.setattr(Connection, "start", recording_start)
    sent_by: dict[int, list[str]] = {}
    rounds_by: dict[int, int] = {}
    for ahead in (0, metadata.AHEAD_MAX):
        monkeypatch.setattr(metadata, "AHEAD_MAX", ahead)
        (tmp_path / f"pair{ahead}").mkdir()
        pair = Pair(tmp_path / f"pair{ahead}")
        await pair.run("push", src)
        stamp = OLD + 1_000_000 * (ahead + 1)
        retime = ([p for p in sorted(src.rglob("*"))] if retimed == "every entry"
                  else [src / "a1" / "b2" / "c0" / "f.txt"])
        for path in reversed(retime):  # (a directory after what is in it)
            os.utime(path, ns=(stamp, stamp))
        rounds.clear()
        _, sent = recorded_metadata(monkeypatch)
        stats = await pair.run("push", src)
        assert stats.in_step and not stats.failed
        assert tree_state(pair.share) == tree_state(src)
        sent_by[ahead] = sorted(item.path for item in sent)
        rounds_by[ahead] = len(rounds)
        pair.close()
    level_by_level, asked_ahead = (rounds_by[k] for k in sorted(rounds_by))
    assert sent_by[0] and sent_by[0] == sent_by[metadata.AHEAD_MAX]
    if retimed == "every entry":
        assert (level_by_level, asked_ahead) == (4, 2)
    else:
        assert asked_ahead == level_by_level == 4
