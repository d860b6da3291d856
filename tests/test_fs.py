"""SafeRoot: nothing a path can say reaches outside the tree, and no write is half done.

Every test that plants a symlink to the outside directory checks afterwards that the
outside directory is byte for byte, mode for mode, time for time as it was.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc.local import beneath, fs
from rdc.local.fs import ConflictError, Expect, SafeRoot
from rdc.local.paths import PathError, is_temporary

from .conftest import PURE

T1 = 1_234_567_891_234_567_891  # ns: exercises every digit of mtime_ns
T2 = 1_600_000_000_000_000_007


class Tree:
    """A root to sync and a directory beside it that must never change."""

    def __init__(self, base: Path) -> None:
        self.root_path = base / "root"
        self.outside = base / "outside"
        self.root_path.mkdir()
        self.outside.mkdir()
        (self.outside / "secret").write_bytes(b"secret")
        (self.outside / "sub").mkdir()
        (self.outside / "sub" / "deep").write_bytes(b"deep")
        # A temporary-looking name outside: the cleaner must not reach it through a link.
        (self.outside / ".rdc-tmp-0123456789abcdef-bait").write_bytes(b"bait")
        os.utime(self.outside / ".rdc-tmp-0123456789abcdef-bait", (0, 0))
        self.before = self.snapshot(self.outside)
        self.root = SafeRoot(self.root_path)

    @staticmethod
    def snapshot(top: Path) -> dict[str, tuple]:
        out: dict[str, tuple] = {".": (os.lstat(top).st_mode, os.lstat(top).st_mtime_ns)}
        for dirpath, dirnames, filenames in os.walk(top):
            for entry in dirnames + filenames:
                path = os.path.join(dirpath, entry)
                s = os.lstat(path)
                body = Path(path).read_bytes() if stat.S_ISREG(s.st_mode) else None
                out[os.path.relpath(path, top)] = (s.st_mode, s.st_mtime_ns, s.st_size, body)
        return out

    def outside_untouched(self) -> bool:
        return self.snapshot(self.outside) == self.before

    def temporaries(self) -> list[str]:
        return [
            os.path.join(d, n)
            for d, dirs, files in os.walk(self.root_path)
            for n in dirs + files
            if is_temporary(n)
        ]

    def put(self, rel: str, data: bytes, mode: int = 0o644, mtime_ns: int = T1) -> os.stat_result:
        with self.root.create_temp(rel) as tmp:
            tmp.write(data)
            return tmp.commit(mode, mtime_ns)


@pytest.fixture(params=["openat2", "walk"])
def tree(request: pytest.FixtureRequest, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    """Every test runs twice: directories opened in one call (openat2), and component by
    component (kernels without it, and the path that names what is refused)."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_syscall", None)
    elif not beneath.available():
        pytest.skip("openat2 is not available here")
    t = Tree(tmp_path)
    yield t
    t.root.close()


@pytest.fixture
def no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fs, "TEMP_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(fs, "FRESH_SECONDS", 0.0)


def open_descriptors() -> int:
    """This process's open descriptors, garbage collected first: an object an earlier test
    left to the collector (a replica never closed) could close one in the middle of a
    count (a test counted 26 descriptors after its work against 27 before)."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def operations(root: SafeRoot, rel: str) -> dict[str, Callable[[], object]]:
    """Every operation on ``rel``; each should refuse when ``rel`` leads outside."""
    return {
        "lstat": lambda: root.lstat(rel),
        "open_read": lambda: root.open_read(rel).close(),
        "read_whole": lambda: root.read_whole(rel, 1 << 20),
        "read_link": lambda: root.read_link(rel),
        "create_temp": lambda: root.create_temp(rel).abort(),
        "mkdir": lambda: root.mkdir(rel, 0o777),
        "makedirs": lambda: root.makedirs(rel, 0o777),
        "symlink": lambda: root.symlink(rel, "/etc/passwd"),
        "remove": lambda: root.remove(rel),
        "set_times": lambda: root.set_times(rel, 0),
        "chmod": lambda: root.chmod(rel, 0o777),
        # the same through directory descriptors held for a batch (fs.HeldDirs)
        "lstat, held": lambda: held(root, lambda h: root.lstat(rel, h)),
        "create_temp, held": lambda: held(root, lambda h: root.create_temp(rel, h).abort()),
        "set_meta, held": lambda: held(root, lambda h: root.set_meta(rel, 0o777, 0, h)),
        "read_whole, held": lambda: held(root, lambda h: root.read_whole(rel, 1 << 20, h)),
        "set_meta_many": lambda: held(
            root, lambda h: list(root.set_meta_many([(rel, 0o777, 0), (rel, None, 1)], h))),
    }


def held(root: SafeRoot, op: Callable[[fs.HeldDirs], object]) -> object:
    with fs.HeldDirs(root) as dirs:
        return op(dirs)


def test_held_directories_are_opened_once_each_and_closed_together(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's files in a few directories: each directory opened once, however many
    files go there; past HeldDirs.LIMIT directories they are closed and opened again;
    after the batch no descriptor is left open."""
    for d in range(3):
        tree.root.makedirs(f"d{d}", 0o755)
    opened: list[str] = []
    real = SafeRoot._open_dir

    def counting(self: SafeRoot, rel_dir: str, rel: str) -> int:
        opened.append(rel_dir)
        return real(self, rel_dir, rel)

    monkeypatch.setattr(SafeRoot, "_open_dir", counting)
    fds_before = open_descriptors()
    with fs.HeldDirs(tree.root) as dirs:
        temps = [tree.root.create_temp(f"d{n % 3}/f{n}", dirs) for n in range(30)]
        for n, temp in enumerate(temps):
            temp.write(b"%d" % n)
            temp.commit(0o644, T1, Expect.absent())
        assert tree.root.lstat("d1/f4", dirs) is not None
        assert tree.root.lstat("d1/nothing", dirs) is None
        assert tree.root.lstat("no/such/dir", dirs) is None
    assert sorted(opened) == ["d0", "d1", "d2", "no/such"]  # (one that fails is not held)
    assert (tree.root_path / "d2" / "f29").read_bytes() == b"29"
    assert len(os.listdir("/proc/self/fd")) == fds_before
    opened.clear()
    monkeypatch.setattr(fs.HeldDirs, "LIMIT", 2)
    with fs.HeldDirs(tree.root) as dirs:
        for n in range(6):
            tree.root.lstat(f"d{n % 3}/f{n}", dirs)
    assert len(opened) == 6  # (two held at most: each visit found its directory closed)
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert not tree.temporaries()


# --- paths that name the outside ------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../outside/secret", "/etc/passwd", "a//b", "a/./b", "a\0b",
                                 "x" * 256, b"../outside", 42])
def test_bad_paths_refused_by_every_operation(tree: Tree, bad: str) -> None:
    for op_name, op in operations(tree.root, bad).items():
        with pytest.raises(PathError):
            op()
            pytest.fail(op_name)
    assert tree.outside_untouched()
    assert os.listdir(tree.root_path) == []


@pytest.mark.parametrize("where", ["link", "a/link", "a/b/link"])
def test_symlink_as_a_parent_is_never_followed(tree: Tree, where: str) -> None:
    tree.root.makedirs("a/b", 0o755)
    os.symlink(tree.outside, tree.root_path / where)
    for target in ("secret", "sub/deep", "new", "sub/new/x"):
        for op_name, op in operations(tree.root, f"{where}/{target}").items():
            with pytest.raises(PathError, match="goes through a symlink"):
                op()
                pytest.fail(op_name)
    # A relative link that climbs out is no different.
    os.symlink("../../outside", tree.root_path / "a" / "rel")
    with pytest.raises(PathError):
        tree.root.open_read("a/rel/secret")
    assert tree.outside_untouched()


def test_symlink_as_the_last_component(tree: Tree) -> None:
    os.symlink(tree.outside / "secret", tree.root_path / "f")
    os.symlink(tree.outside / "sub", tree.root_path / "d")
    r = tree.root
    with pytest.raises(PathError, match="is a symlink"):
        r.open_read("f")
    with pytest.raises(PathError, match="symlink"):
        r.chmod("f", 0o777)
    with pytest.raises(FileExistsError):
        r.mkdir("d", 0o777)
    with pytest.raises(PathError):
        r.makedirs("d", 0o777)
    assert stat.S_ISLNK(r.lstat("f").st_mode)
    assert r.read_link("f") == str(tree.outside / "secret")
    r.set_times("f", T1)  # the link's own time
    assert os.lstat(tree.root_path / "f").st_mtime_ns == T1
    # A commit replaces the link itself; the file it pointed to is not written.
    tree.put("f", b"mine")
    assert (tree.root_path / "f").read_bytes() == b"mine"
    assert not (tree.root_path / "f").is_symlink()
    assert r.remove("d") is True  # the link goes, the directory it named stays
    assert not os.path.lexists(tree.root_path / "d")
    assert tree.outside_untouched()


def test_commit_lands_in_the_directory_it_was_created_in(tree: Tree) -> None:
    """A directory swapped for a link to outside between create_temp and commit does not
    redirect the write: the directory descriptor was resolved once, safely."""
    tree.root.mkdir("a", 0o755)
    tmp = tree.root.create_temp("a/x")
    tmp.write(b"new")
    os.rename(tree.root_path / "a", tree.root_path / "a_old")
    os.symlink(tree.outside, tree.root_path / "a")
    tmp.commit(0o644, T1)
    assert (tree.root_path / "a_old" / "x").read_bytes() == b"new"
    assert tree.outside_untouched()


def test_remove_tree_with_links_out(tree: Tree) -> None:
    r = tree.root
    r.makedirs("d/sub/deeper", 0o755)
    tree.put("d/file", b"x")
    tree.put("d/sub/deeper/file", b"y")
    os.symlink(tree.outside, tree.root_path / "d" / "sub" / "out")
    os.symlink(tree.outside / "secret", tree.root_path / "d" / "secret")
    os.symlink("..", tree.root_path / "d" / "sub" / "up")
    assert r.remove("d") is True
    assert os.listdir(tree.root_path) == []
    assert tree.outside_untouched()
    assert r.remove("d") is False
    assert r.remove("missing/below") is False


def test_remove_a_tree_deeper_than_the_recursion_limit(tree: Tree) -> None:
    depth = sys.getrecursionlimit() + 100
    fd = os.open(tree.root_path, os.O_RDONLY)
    for _ in range(depth):  # built by descriptor: the path is far beyond PATH_MAX
        os.mkdir("d", dir_fd=fd)
        step = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = step
    os.close(fd)
    assert tree.root.remove("d") is True
    assert os.listdir(tree.root_path) == []


def test_racing_a_directory_against_a_link_out(tree: Tree) -> None:
    """Another process keeps swapping directory ``a`` for a link to the outside while every
    operation runs through it. Each may fail (the tree is changing under it), but none may
    touch the outside."""
    real, link = tree.root_path / "a.real", tree.root_path / "a.link"
    real.mkdir()
    (real / "f").write_bytes(b"inside")
    os.symlink(tree.outside, link)
    stop = threading.Event()

    def swap() -> None:
        here = tree.root_path / "a"
        while not stop.is_set():
            for source in (real, link):
                try:
                    os.rename(source, here)
                    os.rename(here, source)
                except OSError:
                    # makedirs made an "a" of its own in the gap: clear it away.
                    if here.is_dir() and not here.is_symlink():
                        shutil.rmtree(here, ignore_errors=True)

    swapper = threading.Thread(target=swap)
    swapper.start()
    outcomes: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            for rel in ("a/f", "a/secret", "a/sub/deep", "a/new"):
                for op_name, op in operations(tree.root, rel).items():
                    try:
                        op()
                        outcomes["ok"] += 1
                    except (PathError, ConflictError, OSError) as exc:
                        outcomes[type(exc).__name__] += 1
                    if op_name == "create_temp":
                        try:
                            with tree.root.create_temp(rel) as tmp:
                                tmp.write(b"written through a race")
                                tmp.commit(0o666, 0)
                        except (PathError, ConflictError, OSError):
                            pass
    finally:
        stop.set()
        swapper.join()
    assert outcomes["ok"] and outcomes["PathError"]  # both sides of the race were hit
    assert tree.outside_untouched()


# --- atomic replacement, interruption, cleanup ----------------------------------------------


def test_replace_is_atomic_for_readers(tree: Tree) -> None:
    tree.put("f", b"old" * 1000)
    reader = tree.root.open_read("f")
    with tree.root.create_temp("f") as tmp:
        tmp.write(b"new")
        assert (tree.root_path / "f").read_bytes() == b"old" * 1000  # not yet
        tmp.commit(0o644, T2)
    assert reader.read() == b"old" * 1000
    reader.close()
    with tree.root.open_read("f") as f:
        assert f.read() == b"new"
    assert tree.temporaries() == []


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from rdc.local.fs import SafeRoot
    tmp = SafeRoot(sys.argv[1]).create_temp("f")
    tmp.write(b"half of the new")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_killed_writer_leaves_the_old_file_and_a_temporary(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.put("f", b"old")
    run = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tree.root_path)], check=False)
    assert run.returncode == -signal.SIGKILL
    assert (tree.root_path / "f").read_bytes() == b"old"
    [left] = tree.temporaries()
    assert Path(left).read_bytes() == b"half of the new"
    assert tree.root.clean_temporaries() == 0  # young: a writer might still own it
    monkeypatch.setattr(fs, "TEMP_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(fs, "FRESH_SECONDS", 0.0)
    assert tree.root.clean_temporaries() == 1  # its owner is dead: no lock held
    assert tree.temporaries() == []
    assert (tree.root_path / "f").read_bytes() == b"old"


def test_cleaner_spares_a_live_temporary(tree: Tree, no_grace: None) -> None:
    tree.root.mkdir("a", 0o755)
    tmp = tree.root.create_temp("a/f")
    tmp.write(b"in flight")
    assert tree.root.clean_temporaries() == 0
    tmp.commit(0o644, T1)
    assert (tree.root_path / "a" / "f").read_bytes() == b"in flight"


def test_cleaner_removes_stale_links_and_trees_without_following(
    tree: Tree, no_grace: None
) -> None:
    r = tree.root
    r.makedirs("a/b", 0o755)
    os.symlink(tree.outside, tree.root_path / "a" / "out")  # holds a temporary-looking name
    os.symlink(tree.outside, tree.root_path / "a" / ".rdc-tmp-00000000000000aa-l")
    aside = tree.root_path / "a" / "b" / ".rdc-tmp-00000000000000bb-d"
    aside.mkdir()
    os.symlink(tree.outside, aside / "out")
    (aside / "x").write_bytes(b"x")
    (tree.root_path / ".rdc-tmp-00000000000000cc-f").write_bytes(b"f")
    (tree.root_path / ".rdc-tmp-notes").write_bytes(b"a user's file")
    assert r.clean_temporaries() == 3
    assert tree.temporaries() == []
    assert (tree.root_path / ".rdc-tmp-notes").exists()
    assert os.path.islink(tree.root_path / "a" / "out")
    assert tree.outside_untouched()


def test_context_manager_aborts(tree: Tree) -> None:
    tree.put("f", b"old")
    with pytest.raises(RuntimeError), tree.root.create_temp("f") as tmp:
        tmp.write(b"new")
        raise RuntimeError("transfer failed")
    assert tmp.closed
    assert (tree.root_path / "f").read_bytes() == b"old"
    assert tree.temporaries() == []
    with pytest.raises(ValueError, match="already committed or aborted"):
        tmp.commit(0o644, T1)
    tmp.abort()  # idempotent


def test_enospc_during_write_monkeypatched(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    tree.put("f", b"old")
    tmp = tree.root.create_temp("f")
    real_write = os.write
    calls = []

    def write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if fd == tmp.fileno() and len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data[:100])  # short writes too: write() must loop

    monkeypatch.setattr(os, "write", write)
    tmp.write(b"a" * 100)
    with pytest.raises(OSError) as info:
        tmp.write(b"b" * 1000)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert tmp.closed
    assert (tree.root_path / "f").read_bytes() == b"old"
    assert tree.temporaries() == []


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, where root may mount one."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_enospc_on_a_full_file_system(small_fs: Path) -> None:
    with SafeRoot(small_fs) as root:
        with root.create_temp("f") as tmp:
            tmp.write(b"old" * 1000)
            tmp.commit(0o644, T1)
        tmp = root.create_temp("f")
        with pytest.raises(OSError) as info:
            tmp.write(os.urandom(1 << 20))
        assert info.value.errno == errno.ENOSPC
        assert (small_fs / "f").read_bytes() == b"old" * 1000
        assert os.listdir(small_fs) == ["f"]


def test_a_batch_of_temporaries_on_a_full_file_system(small_fs: Path) -> None:
    """A file that does not fit gets ENOSPC and leaves nothing behind; the files around it
    in the batch are made (in one native call where there is one)."""
    with SafeRoot(small_fs) as root, fs.HeldDirs(root) as dirs:
        made = list(root.create_temps([("a", b"a" * 100, 0o644, T1),
                                       ("big", os.urandom(1 << 20), 0o644, T1),
                                       ("b", b"b" * 100, 0o600, T2)], dirs))
        assert isinstance(made[1], OSError) and made[1].errno == errno.ENOSPC
        assert made[1].filename == "big"
        for temp in (made[0], made[2]):
            assert isinstance(temp, fs.TempFile)
            temp.install(Expect.absent())
        assert sorted(os.listdir(small_fs)) == ["a", "b"]
        assert (small_fs / "b").read_bytes() == b"b" * 100


def test_remove_does_not_cross_into_a_mount(tree: Tree, small_fs: Path) -> None:
    tree.root.makedirs("d/m", 0o755)
    subprocess.run(["mount", "--bind", str(small_fs), str(tree.root_path / "d" / "m")],
                   check=True)
    try:
        (small_fs / "keep").write_bytes(b"keep")
        tree.put("d/other", b"other")
        with pytest.raises(OSError) as info:
            tree.root.remove("d")
        assert info.value.errno == errno.EXDEV
        assert (small_fs / "keep").read_bytes() == b"keep"
        # What is left is back at its path, not hidden under a temporary name.
        assert os.listdir(tree.root_path) == ["d"]
        assert os.listdir(tree.root_path / "d") == ["m"]
    finally:
        subprocess.run(["umount", str(tree.root_path / "d" / "m")], check=True)


def test_fsync_failure_in_commit(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    tree.put("f", b"old")
    tmp = tree.root.create_temp("f")
    tmp.write(b"new")

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as info:
        tmp.commit(0o644, T1)
    assert info.value.errno == errno.EIO
    assert info.value.filename == "f"
    assert (tree.root_path / "f").read_bytes() == b"old"
    assert tree.temporaries() == []


def test_swapped_temporary_is_not_installed(tree: Tree) -> None:
    tree.put("f", b"old")
    tmp = tree.root.create_temp("f")
    tmp.write(b"checked content")
    (tree.root_path / "intruder").write_bytes(b"unchecked")
    os.rename(tree.root_path / "intruder", tree.root_path / tmp.temp_name)
    with pytest.raises(ConflictError):
        tmp.commit(0o644, T1)
    assert (tree.root_path / "f").read_bytes() == b"old"
    # Not ours, so not deleted either.
    assert (tree.root_path / tmp.temp_name).read_bytes() == b"unchecked"


# --- expectations ---------------------------------------------------------------------------


def test_expectations_that_hold(tree: Tree) -> None:
    r = tree.root
    with r.create_temp("f") as tmp:
        tmp.write(b"1")
        first = tmp.commit(0o644, T1, Expect.absent())
    with r.create_temp("f") as tmp:
        tmp.write(b"22")
        second = tmp.commit(0o644, T1, Expect.from_stat(first))
    with r.create_temp("f") as tmp:
        tmp.write(b"333")
        tmp.commit(0o644, T1, Expect.file(size=2, inode=second.st_ino))
    with r.create_temp("f") as tmp:
        tmp.write(b"4444")
        tmp.commit(0o644, T1, Expect.file())
    r.symlink("l", "t", Expect.absent())
    r.symlink("l", "u", Expect.link("t"))
    r.symlink("l", "v", Expect.link())
    assert r.remove("l", Expect.link(b"v")) is True
    assert (tree.root_path / "f").read_bytes() == b"4444"


@pytest.mark.parametrize(
    ("expect", "found"),
    [
        (Expect.absent(), "a regular file"),
        (Expect.file(size=2), "a regular file"),
        (Expect.file(mtime_ns=T2), "a regular file"),
        (Expect.file(inode=1), "a regular file"),
        (Expect.link(), "a regular file"),
        (Expect.directory(), "a regular file"),
    ],
)
def test_expectation_mismatch_changes_nothing(tree: Tree, expect: Expect, found: str) -> None:
    tree.put("f", b"old", 0o600, T1)
    # Entries, bodies, modes and times; not the root's own mtime, which a temporary
    # coming and going moves.
    before = Tree.snapshot(tree.root_path)
    del before["."]
    message = f"'f' changed meanwhile: expected .* found {found}"
    with pytest.raises(ConflictError, match=message), tree.root.create_temp("f") as tmp:
        tmp.write(b"new")
        tmp.commit(0o644, T2, expect)
    with pytest.raises(ConflictError):
        tree.root.symlink("f", "x", expect)
    with pytest.raises(ConflictError):
        tree.root.remove("f", expect)
    after = Tree.snapshot(tree.root_path)
    del after["."]
    assert after == before


def test_stale_stat_is_a_conflict(tree: Tree) -> None:
    seen = tree.put("f", b"old")
    tree.put("f", b"changed by someone else", mtime_ns=T2)
    tmp = tree.root.create_temp("f")
    tmp.write(b"mine")
    with pytest.raises(ConflictError):
        tmp.commit(0o644, T1, Expect.from_stat(seen))
    assert (tree.root_path / "f").read_bytes() == b"changed by someone else"
    assert tree.temporaries() == []


def test_link_expectations(tree: Tree) -> None:
    tree.root.symlink("l", "t")
    with pytest.raises(ConflictError, match="found a symlink to 't'"):
        tree.root.symlink("l", "u", Expect.link("other"))
    with pytest.raises(ConflictError):
        tree.root.remove("l", Expect.file())
    assert tree.root.read_link("l") == "t"
    assert tree.root.remove("gone", Expect.file()) is False  # absent is absent


def test_absent_expectation_is_exact(tree: Tree) -> None:
    """The file appears after the late check but before the install: link(2) refuses."""
    tmp = tree.root.create_temp("f")
    tmp.write(b"mine")
    real_lstat = fs._lstat_at

    def lstat_then_race(dfd: int, leaf: str) -> os.stat_result | None:
        st = real_lstat(dfd, leaf)
        if leaf == "f":
            (tree.root_path / "f").write_bytes(b"theirs")
        return st

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fs, "_lstat_at", lstat_then_race)
        with pytest.raises(ConflictError):
            tmp.commit(0o644, T1, Expect.absent())
    assert (tree.root_path / "f").read_bytes() == b"theirs"
    assert tree.temporaries() == []


def test_absent_without_hard_links_falls_back_to_rename(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    with tree.root.create_temp("f") as tmp:
        tmp.write(b"new")
        st = tmp.commit(0o644, T1, Expect.absent())
    assert st.st_nlink == 1
    assert (tree.root_path / "f").read_bytes() == b"new"
    with pytest.raises(ConflictError), tree.root.create_temp("f") as tmp:
        tmp.commit(0o644, T1, Expect.absent())
    assert tree.temporaries() == []


# --- metadata -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755, 0o444, 0o000, 0o1777])
@pytest.mark.parametrize("mtime_ns", [T1, 0, -1_500_000_000_123_456_789, 1])
def test_mode_and_mtime_exact(tree: Tree, mode: int, mtime_ns: int) -> None:
    old_umask = os.umask(0o077)
    try:
        returned = tree.put("f", b"x", mode, mtime_ns)
    finally:
        os.umask(old_umask)
    on_disk = os.lstat(tree.root_path / "f")
    assert stat.S_IMODE(on_disk.st_mode) == mode
    assert on_disk.st_mtime_ns == mtime_ns
    assert (returned.st_ino, returned.st_mode, returned.st_mtime_ns) == (
        on_disk.st_ino, on_disk.st_mode, on_disk.st_mtime_ns)


def test_setid_bits_dropped_unless_allowed(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stat.S_IMODE(tree.put("f", b"x", 0o6755).st_mode) == 0o755
    tree.root.chmod("f", 0o4755)
    assert stat.S_IMODE(os.lstat(tree.root_path / "f").st_mode) == 0o755
    tree.root.mkdir("d", 0o2775)  # a setgid directory is harmless and common
    assert stat.S_IMODE(os.lstat(tree.root_path / "d").st_mode) == 0o2775
    monkeypatch.setattr(fs, "ALLOW_SETID", True)
    assert stat.S_IMODE(tree.put("f", b"x", 0o4755).st_mode) == 0o4755


def test_chmod_and_set_times(tree: Tree) -> None:
    r = tree.root
    tree.put("f", b"x")
    r.mkdir("d", 0o755)
    r.chmod("f", 0o600)
    r.chmod("d", 0o700)
    r.chmod("", 0o750)
    assert stat.S_IMODE(os.lstat(tree.root_path / "f").st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(tree.root_path / "d").st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(tree.root_path).st_mode) == 0o750
    r.chmod("f", 0o000)  # no read permission needed to change it back
    r.chmod("f", 0o644)
    for rel in ("f", "d", ""):
        r.set_times(rel, T2)
        assert r.lstat(rel).st_mtime_ns == T2
    os.mkfifo(tree.root_path / "p")
    with pytest.raises(PathError, match="is a FIFO, not a regular file, directory or link"):
        r.chmod("p", 0o600)
    with pytest.raises(FileNotFoundError):
        r.chmod("missing", 0o600)


# --- symlinks, directories ------------------------------------------------------------------


def test_symlink_replace(tree: Tree) -> None:
    r = tree.root
    st1 = r.symlink("l", "first", mtime_ns=T1)
    assert st1.st_mtime_ns == T1
    r.symlink("l", b"second\xff")
    assert r.read_link("l") == "second\udcff"
    assert os.readlink(os.fsencode(tree.root_path / "l")) == b"second\xff"
    tree.put("f", b"x")
    r.symlink("f", "../../../etc/passwd")  # stored as given, a file replaced
    assert os.readlink(tree.root_path / "f") == "../../../etc/passwd"
    tree.put("l", b"file again")  # and back
    assert (tree.root_path / "l").read_bytes() == b"file again"
    with pytest.raises(PathError, match="bad link target"):
        r.symlink("l", "a\0b")
    assert tree.temporaries() == []


def test_directory_is_not_replaced_unless_asked(tree: Tree) -> None:
    r = tree.root
    r.makedirs("d/sub", 0o755)
    tree.put("d/sub/f", b"x")
    tmp = r.create_temp("d")
    tmp.write(b"file")
    with pytest.raises(IsADirectoryError) as info:
        tmp.commit(0o644, T1)
    assert info.value.filename == "d"
    assert (tree.root_path / "d" / "sub" / "f").read_bytes() == b"x"
    with pytest.raises(IsADirectoryError):
        r.symlink("d", "t")
    assert tree.temporaries() == []
    with r.create_temp("d") as tmp:
        tmp.write(b"file")
        tmp.commit(0o644, T1, Expect.directory(), replace_dir=True)
    assert (tree.root_path / "d").read_bytes() == b"file"
    r.mkdir("e", 0o755)
    r.symlink("e", "t", replace_dir=True)
    assert r.read_link("e") == "t"
    assert sorted(os.listdir(tree.root_path)) == ["d", "e"]


def test_mkdir_and_makedirs(tree: Tree) -> None:
    r = tree.root
    old_umask = os.umask(0o077)
    try:
        assert r.makedirs("a/b/c", 0o755) is True
        assert r.makedirs("a/b/c", 0o700) is False
        assert r.mkdir("a/x", 0o775) is True
    finally:
        os.umask(old_umask)
    for rel, mode in (("a", 0o755), ("a/b/c", 0o755), ("a/x", 0o775)):
        assert stat.S_IMODE(r.lstat(rel).st_mode) == mode
    assert r.mkdir("a", 0o755) is False
    with pytest.raises(FileExistsError):
        r.mkdir("a", 0o755, exist_ok=False)
    tree.put("a/f", b"x")
    with pytest.raises(FileExistsError):
        r.mkdir("a/f", 0o755)
    with pytest.raises(NotADirectoryError) as info:
        r.makedirs("a/f/g", 0o755)
    assert info.value.filename == "a/f/g"
    with pytest.raises(FileNotFoundError):
        r.mkdir("missing/d", 0o755)


# --- reading, errors ------------------------------------------------------------------------


def test_open_read_refuses_what_is_not_a_file(tree: Tree) -> None:
    r = tree.root
    r.mkdir("d", 0o755)
    os.mkfifo(tree.root_path / "p")  # opening must not hang
    with pytest.raises(IsADirectoryError):
        r.open_read("d")
    with pytest.raises(PathError, match="is a FIFO"):
        r.open_read("p")
    with pytest.raises(FileNotFoundError) as info:
        r.open_read("d/missing")
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == "d/missing"
    with pytest.raises(PathError):
        r.open_read("")


def test_read_whole_reads_a_small_file_and_refuses_what_open_read_refuses(
    tree: Tree,
) -> None:
    """`read_whole` is `open_read` plus one read: the bytes and the fstat before and after
    for a file within the limit, None for a larger one, and the same refusals (a FIFO is
    refused, not opened: the call returns)."""
    r = tree.root
    r.mkdir("d", 0o755)
    tree.put("d/f", b"x" * 100)
    tree.put("e", b"")
    r.mkdir("sub", 0o755)
    os.mkfifo(tree.root_path / "p")
    os.symlink("d/f", tree.root_path / "link")
    with fs.HeldDirs(r) as dirs:
        for held_dirs in (None, dirs):
            before, data, after = r.read_whole("d/f", 100, held_dirs)
            assert data == b"x" * 100 and before.st_size == after.st_size == 100
            assert os.path.samestat(before, os.lstat(tree.root_path / "d" / "f"))
            assert r.read_whole("d/f", 99, held_dirs) is None  # larger than the limit
            assert r.read_whole("e", 0, held_dirs)[1] == b""
    with pytest.raises(IsADirectoryError):
        r.read_whole("sub", 10)
    with pytest.raises(PathError, match="is a FIFO"):
        r.read_whole("p", 10)
    with pytest.raises(PathError, match="is a symlink"):
        r.read_whole("link", 10)
    with pytest.raises(FileNotFoundError) as info:
        r.read_whole("d/missing", 10)
    assert info.value.filename == "d/missing"


def test_read_whole_of_a_file_that_grows_past_the_limit_while_read_is_none(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its size is read before the read; a file that grew past the limit meanwhile (the
    read finds more than its fstat said) is left to the streaming reader."""
    tree.put("f", b"y" * 10)
    real = os.read
    grown = []

    def read_and_grow(fd: int, n: int) -> bytes:
        if not grown:
            grown.append(True)
            with open(tree.root_path / "f", "ab") as out:
                out.write(b"z" * 50)
        return real(fd, n)

    monkeypatch.setattr(fs.os, "read", read_and_grow)
    assert tree.root.read_whole("f", 20) is None
    assert grown
    assert tree.root.read_whole("f", 60)[1] == b"y" * 10 + b"z" * 50


def test_lstat(tree: Tree) -> None:
    r = tree.root
    assert stat.S_ISDIR(r.lstat("").st_mode)
    assert r.lstat("missing") is None
    assert r.lstat("missing/below") is None
    tree.put("f", b"x")
    assert r.lstat("f/below") is None
    assert r.lstat("f").st_size == 1
    with pytest.raises(OSError) as info:
        r.read_link("f")
    assert info.value.errno == errno.EINVAL


def test_create_temp_needs_the_directory(tree: Tree) -> None:
    with pytest.raises(FileNotFoundError) as info:
        tree.root.create_temp("no/such/dir/f")
    assert info.value.filename == "no/such/dir/f"
    tmp = tree.root.create_temp("f")
    assert is_temporary(tmp.temp_name)
    assert stat.S_IMODE(os.lstat(tree.root_path / tmp.temp_name).st_mode) == 0o600
    tmp.abort()
    assert tree.temporaries() == []


def test_non_utf8_names_round_trip(tree: Tree) -> None:
    r = tree.root
    raw_dir, raw_file = b"caf\xe9", b"\xff\xfe na\xefve.bin"
    rel = os.fsdecode(raw_dir + b"/" + raw_file)
    r.mkdir(os.fsdecode(raw_dir), 0o755)
    tree.put(rel, b"latin-1 names")
    assert os.listdir(os.fsencode(tree.root_path)) == [raw_dir]
    assert os.listdir(os.fsencode(tree.root_path) + b"/" + raw_dir) == [raw_file]
    with r.open_read(raw_dir + b"/" + raw_file) as f:  # bytes in, as from the wire
        assert f.read() == b"latin-1 names"
    assert r.lstat(rel).st_size == len(b"latin-1 names")
    assert r.remove(raw_dir) is True
    assert os.listdir(tree.root_path) == []


def _valid_name(raw: bytes) -> bool:
    return b"/" not in raw and b"\0" not in raw and raw not in (b".", b"..") and not is_temporary(
        os.fsdecode(raw))


@given(st.binary(min_size=1, max_size=255).filter(_valid_name), st.binary(max_size=64))
def test_any_name_round_trips(raw: bytes, body: bytes) -> None:
    with tempfile.TemporaryDirectory() as base, SafeRoot(base) as root:
        with root.create_temp(raw) as tmp:
            tmp.write(body)
            tmp.commit(0o644, T1)
        assert os.listdir(os.fsencode(base)) == [raw]
        with root.open_read(raw) as f:
            assert f.read() == body
        assert root.remove(os.fsdecode(raw)) is True


def test_errors_are_oserrors_or_rdc_errors(tree: Tree) -> None:
    """No bare ValueError/TypeError/RecursionError from anything a path can say."""
    hostile = ["", "..", "/", "a/../../b", "\udcff" * 300, b"\xff" * 255, "a\0", None, 3.5]
    for rel in hostile:
        for op in operations(tree.root, rel).values():  # type: ignore[arg-type]
            with contextlib.suppress(OSError, PathError):
                op()
    assert tree.outside_untouched()


# --- sub-roots and hard links ------------------------------------------------------------


def test_a_subroot_is_the_directory_it_was_reached_as(tree: Tree) -> None:
    """A sub-root keeps its directory by descriptor: replaced by a symlink to the outside
    afterwards, the path is refused to a new sub-root, and the old one still works on the
    directory it had (now unlinked), never the outside."""
    tree.root.mkdir("d", 0o755)
    tree.put("d/x", b"x")
    sub = tree.root.subroot("d")
    assert sub.listdir("") == ["x"]
    os.rename(tree.root_path / "d", tree.root_path / "gone")
    os.symlink(tree.outside, tree.root_path / "d")
    with pytest.raises(PathError):
        tree.root.subroot("d")
    assert sub.listdir("") == ["x"]
    assert sub.identity() == tree.root.subroot("gone").identity()
    with sub.create_temp("new") as temp:
        temp.write(b"inside")
        temp.commit(0o644, T1)
    assert (tree.root_path / "gone" / "new").read_bytes() == b"inside"
    made = tree.root.subroot("a/b", create=True)
    assert made.listdir("") == [] and (tree.root_path / "a" / "b").is_dir()
    for r in (sub, made):
        r.close()
    assert tree.outside_untouched()


@pytest.mark.parametrize("change", ["mode", "time", "both"])
def test_metadata_never_changes_an_inode_with_other_links(tree: Tree, change: str) -> None:
    """A file linked from outside the root is replaced by a copy of itself with the new
    mode or time; the outside link keeps its inode, mode, time and content."""
    tree.put("f", b"shared content", 0o600, T1)
    os.link(tree.root_path / "f", tree.outside / "linked")
    tree.before = tree.snapshot(tree.outside)
    mode = 0o644 if change in ("mode", "both") else None
    mtime = T2 if change in ("time", "both") else None
    before, after = tree.root.set_meta("f", mode, mtime)
    assert before is not None and after is not None
    assert after.st_ino != before.st_ino and after.st_nlink == 1
    inside = os.lstat(tree.root_path / "f")
    assert stat.S_IMODE(inside.st_mode) == (mode or 0o600)
    assert inside.st_mtime_ns == (mtime or T1)
    assert (tree.root_path / "f").read_bytes() == b"shared content"
    assert tree.outside_untouched()
    assert os.lstat(tree.outside / "linked").st_nlink == 1


def test_a_link_linked_twice_gets_its_own_time(tree: Tree) -> None:
    tree.root.symlink("l", "target")
    os.link(tree.root_path / "l", tree.outside / "l2", follow_symlinks=False)
    tree.before = tree.snapshot(tree.outside)
    tree.root.set_meta("l", mtime_ns=T2)
    assert os.lstat(tree.root_path / "l").st_mtime_ns == T2
    assert os.readlink(tree.root_path / "l") == "target"
    assert tree.outside_untouched()


def test_an_unchanged_multiply_linked_file_is_left_alone(tree: Tree) -> None:
    st = tree.put("f", b"x", 0o644, T1)
    os.link(tree.root_path / "f", tree.root_path / "g")
    before, after = tree.root.set_meta("f", 0o644, T1)
    assert before is not None and after is not None
    assert after.st_ino == st.st_ino == os.lstat(tree.root_path / "g").st_ino


def _meta_tree(top: Path, outside: Path) -> list[tuple[str, int | None, int | None]]:
    """A tree of every kind of entry a metadata vector meets, and changes to all of them:
    files and directories (deepest first), setid bits asked for, a file linked from
    outside, a symlink, nothing there, the root, and a time before 1970."""
    (top / "d" / "e").mkdir(parents=True)
    for rel in ("a", "d/b", "d/e/c", "d/e/same", "linked"):
        (top / rel).write_bytes(rel.encode())
        os.utime(top / rel, ns=(T1, T1))
    os.chmod(top / "d/e/same", 0o600)
    os.link(top / "linked", outside / f"link-{top.name}")
    os.symlink("a", top / "l")
    os.utime(top / "d", ns=(T1, T1))
    return [("d/e/c", 0o4755, T2), ("d/e/same", 0o600, T1), ("d/e", 0o2750, T2),
            ("d/b", None, -T2), ("d", 0o700, None), ("linked", 0o640, T2), ("l", 0o777, T2),
            ("missing", 0o644, T2), ("a", 0o600, None), ("", 0o755, T2)]


def test_a_metadata_vector_set_at_once_is_set_as_one_by_one(tree: Tree) -> None:
    """`set_meta_many` (runs of entries in one native call) yields what `set_meta` returns
    for each entry, and leaves the same tree: the same modes and times, setid bits
    stripped from files, the outside link's inode untouched (a copy made), nothing made
    where nothing was."""
    results = {}
    for way in ("many", "one"):
        top = tree.root_path / way
        top.mkdir()
        changes = _meta_tree(top, tree.outside)
        sub = tree.root.subroot(way)
        with fs.HeldDirs(sub) as dirs:
            if way == "many":
                got = list(sub.set_meta_many(changes, dirs))
            else:
                got = [sub.set_meta(rel, mode, mtime, dirs) for rel, mode, mtime in changes]
        sub.close()
        results[way] = ([None if after is None else (after.st_mode, after.st_size,
                                                     after.st_mtime_ns)
                         for _, after in got], Tree.snapshot(top))
    assert results["many"] == results["one"]
    many_state = results["many"][1]
    assert many_state["d/e/c"][0] & 0o7777 == 0o755 and many_state["d/e"][0] & 0o7777 == 0o2750
    assert many_state["d/b"][1] == -T2 and "missing" not in many_state
    for way in ("many", "one"):
        assert os.lstat(tree.outside / f"link-{way}").st_nlink == 1  # the share has a copy
        assert (tree.outside / f"link-{way}").read_bytes() == b"linked"


def test_a_metadata_vector_goes_natively_up_to_what_it_cannot_do(tree: Tree, monkeypatch
                                                                 ) -> None:
    """The native call takes the runs between the entries `set_meta` must do (the root, a
    hard-linked file); a refused path in the vector raises as `set_meta` does, after the
    entries before it are done."""
    from rdc import _native

    calls: list[int] = []
    real = _native.set_meta
    if real is None:
        pytest.skip("no native code in the pure run")

    def counted(run, setid):
        done = real(run, setid)
        calls.append(len(done))
        return done

    monkeypatch.setattr(_native, "set_meta", counted)
    changes = _meta_tree(tree.root_path, tree.outside)
    tree.before = tree.snapshot(tree.outside)
    with fs.HeldDirs(tree.root) as dirs:
        done = list(tree.root.set_meta_many(changes, dirs))
    assert len(done) == len(changes)
    # Up to the linked file; then a run of one entry, doubling while whole, to the root.
    assert calls == [5, 1, 2]
    with fs.HeldDirs(tree.root) as dirs, pytest.raises(PathError):
        for _ in tree.root.set_meta_many([("a", 0o644, T1), ("d/../..", 0o777, 0)], dirs):
            pass
    assert os.lstat(tree.root_path / "a").st_mtime_ns == T1
    assert tree.outside_untouched()


def test_a_metadata_vector_of_linked_files_prepares_each_entry_a_few_times(
    tree: Tree, monkeypatch
) -> None:
    """Entries `set_meta` must do (files with other links, each replaced by a copy) cut
    the native runs short; the next run starts small, so the entries prepared for native
    calls stay in proportion to the vector, not its square."""
    from rdc import _native

    real = _native.set_meta
    if real is None:
        pytest.skip("no native code in the pure run")
    prepared: list[int] = []
    monkeypatch.setattr(_native, "set_meta",
                        lambda run, setid: prepared.append(len(run)) or real(run, setid))
    changes = []
    for i in range(300):
        tree.put(f"f{i}", b"x", 0o600, T1)
        if i % 3 == 0:
            os.link(tree.root_path / f"f{i}", tree.outside / f"l{i}")
        changes.append((f"f{i}", 0o640, T2 + i))
    with fs.HeldDirs(tree.root) as dirs:
        assert len(list(tree.root.set_meta_many(changes, dirs))) == len(changes)
    for rel, mode, mtime in changes:
        st = os.lstat(tree.root_path / rel)
        assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_nlink) == (mode, mtime, 1)
    assert sum(prepared) <= 3 * len(changes)


def test_a_metadata_vector_over_more_directories_than_are_held_at_once(
    tree: Tree, monkeypatch
) -> None:
    """A vector whose entries span more directories than `HeldDirs` keeps open is cut into
    runs there (a descriptor in use is never closed under a run): every entry is set."""
    from rdc import _native

    calls: list[int] = []
    real = _native.set_meta
    if real is not None:
        monkeypatch.setattr(_native, "set_meta",
                            lambda run, setid: calls.append(len(run)) or real(run, setid))
    changes = []
    for i in range(fs.HeldDirs.LIMIT + 10):
        (tree.root_path / f"d{i}").mkdir()
        (tree.root_path / f"d{i}" / "f").write_bytes(b"x")
        changes += [(f"d{i}/f", 0o600, T1 + i), (f"d{i}", 0o700, T2 + i)]
    with fs.HeldDirs(tree.root) as dirs:
        done = list(tree.root.set_meta_many(changes, dirs))
    assert len(done) == len(changes) and all(after is not None for _, after in done)
    for rel, mode, mtime in changes:
        st = os.lstat(tree.root_path / rel)
        assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (mode, mtime)
    if real is not None:
        assert len(calls) >= 2 and max(calls) <= 2 * fs.HeldDirs.LIMIT


def test_a_batch_of_temporaries_is_made_as_one_at_a_time_would(tree: Tree, monkeypatch
                                                                ) -> None:
    """`create_temps` (natively, a run at a time) against `create_temp`, `write` and
    `prepare`: the same temporaries (name, content, mode without set-id bits, times before
    1970 too), each installed; over more directories than are held at once; a file whose
    directory is gone says why, and the others are made."""
    from rdc import _native
    from rdc.local.paths import MAX_NAME

    calls: list[int] = []
    real = _native.make_temps
    if real is not None:
        monkeypatch.setattr(_native, "make_temps",
                            lambda run, *a: calls.append(len(run)) or real(run, *a))
    long = "n" * MAX_NAME  # (cut to fit the temporary's name)
    files = []
    for i in range(fs.HeldDirs.LIMIT + 6):
        (tree.root_path / f"d{i}").mkdir()
        files.append((f"d{i}/{long if i == 3 else 'f'}", b"%d" % i * i, 0o4755 if i == 5
                      else 0o640, -T1 - i if i == 7 else T1 + i))
    files.insert(10, ("gone/f", b"x", 0o644, T1))
    with fs.HeldDirs(tree.root) as dirs:
        made = list(tree.root.create_temps(files, dirs))
    assert len(made) == len(files)
    assert isinstance(made[10], FileNotFoundError) and made[10].filename == "gone/f"
    for (rel, data, mode, mtime), temp in zip(files, made, strict=True):
        if rel == "gone/f":
            continue
        assert isinstance(temp, fs.TempFile) and temp.path == rel
        name = temp.temp_name
        assert is_temporary(name) and len(os.fsencode(name)) <= MAX_NAME
        st = os.lstat(tree.root_path / os.path.dirname(rel) / name)
        assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (mode & 0o777, mtime)
        assert temp.install(Expect.absent()).st_ino == st.st_ino
        assert (tree.root_path / rel).read_bytes() == data
    assert not tree.temporaries() and tree.outside_untouched()
    if real is not None:
        assert len(calls) >= 2 and max(calls) <= fs.HeldDirs.LIMIT


def test_temporaries_installed_together_as_one_at_a_time(tree: Tree, monkeypatch) -> None:
    """`install_all`: where nothing may be, linked into place in one native call, with
    the stat after; something there meanwhile, or a temporary swapped for another file,
    fails as `TempFile.install` says (nothing replaced); other expectations replace what
    is there. No descriptor or temporary is left."""
    from rdc import _native

    calls: list[int] = []
    real = _native.install_new
    if real is not None:
        monkeypatch.setattr(_native, "install_new",
                            lambda items: calls.append(len(items)) or real(items))
    (tree.root_path / "d").mkdir()
    fds_before = open_descriptors()
    names = ["d/new1", "d/taken", "d/swapped", "d/new2", "d/over"]
    with fs.HeldDirs(tree.root) as dirs:
        temps = list(tree.root.create_temps([(rel, rel.encode(), 0o644, T1) for rel in names],
                                            dirs))
    tree.put("d/taken", b"was here first")
    tree.put("d/over", b"old")
    swapped = tree.root_path / "d" / temps[2].temp_name
    os.unlink(swapped)
    swapped.write_bytes(b"someone else's")
    absent = Expect.absent()
    done = fs.install_all([(temps[0], absent), (temps[1], absent), (temps[2], absent),
                           (temps[3], absent), (temps[4], None)])
    for k in (0, 3, 4):
        st = os.lstat(tree.root_path / names[k])
        assert (done[k].st_ino, done[k].st_size, done[k].st_mtime_ns) == (
            st.st_ino, st.st_size, T1)
        assert (tree.root_path / names[k]).read_bytes() == names[k].encode()
    assert isinstance(done[1], ConflictError) and isinstance(done[2], ConflictError)
    assert (tree.root_path / "d" / "taken").read_bytes() == b"was here first"
    assert not (tree.root_path / "d" / "swapped").exists()
    assert all(temp.closed for temp in temps)
    os.unlink(swapped)  # (not ours: left where it was)
    assert not tree.temporaries() and len(os.listdir("/proc/self/fd")) == fds_before
    if real is not None:
        assert calls == [4]


def test_native_temporaries_refuse_what_is_not_one_name(tmp_path: Path) -> None:
    """The native call takes one path component and gives a failed file's errno (here: a
    directory descriptor that is not one), leaving nothing behind."""
    from rdc import _native

    if _native.make_temps is None:
        pytest.skip("no native code in the pure run")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for bad in (b"a/b", b"", b"a\0b"):
            with pytest.raises(ValueError, match="one path component"):
                _native.make_temps([(fd, bad, b"x", 0o644, T1)], b".rdc-tmp-", 255)
        assert _native.make_temps([(-1, b"f", b"x", 0o644, T1)], b".rdc-tmp-", 255) == [
            errno.EBADF]
        with pytest.raises(ValueError, match="no room"):
            _native.make_temps([], b".rdc-tmp-", 20)
        before = os.fstat(0)  # (a call refused early once closed descriptor 0, unopened)
        with pytest.raises(TypeError):
            _native.make_temps([(fd, b"ok", b"x", 0o644, T1), ("bad",)], b".rdc-tmp-", 255)
        assert os.path.samestat(os.fstat(0), before)
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []


def test_native_directories_are_made_with_their_mode_or_say_why(tmp_path: Path) -> None:
    """`make_dirs` makes each directory with exactly its mode (umask or not) and gives its
    stat; one that exists, or whose directory descriptor is not one, gives its errno and
    leaves nothing; a name must be one path component."""
    from rdc import _native

    if _native.make_dirs is None:
        pytest.skip("no native code in the pure run")
    (tmp_path / "there").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    old = os.umask(0o077)
    try:
        made = _native.make_dirs([(fd, b"a", 0o775), (fd, b"there", 0o755), (-1, b"b", 0o755),
                                  (fd, b"c", 0o7777 | 0o10000)])
        for bad in (b"a/b", b"", b"a\0b"):
            with pytest.raises(ValueError, match="one path component"):
                _native.make_dirs([(fd, bad, 0o755)])
    finally:
        os.umask(old)
        os.close(fd)
    assert made[1:3] == [errno.EEXIST, errno.EBADF]
    for name, index, mode in (("a", 0, 0o775), ("c", 3, 0o7777)):
        st = os.lstat(tmp_path / name)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == mode
        assert made[index] == (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
    assert sorted(os.listdir(tmp_path)) == ["a", "c", "there"]


# --- the walk -----------------------------------------------------------------------------


def test_a_walk_that_fails_midway_closes_every_descriptor(tmp_path: Path) -> None:
    from rdc.local.snapshot import walk

    for n in range(30):
        (tmp_path / "t" / f"d{n}" / "e" / "f").mkdir(parents=True)
    calls = 0

    def exclude(rel: str, is_dir: bool) -> bool:
        nonlocal calls
        calls += 1
        if calls == 40:
            raise RuntimeError("a failure in the middle of the walk")
        return False

    before = open_descriptors()
    with pytest.raises(RuntimeError):
        walk(str(tmp_path / "t"), exclude)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_wide_directory_is_walked_with_few_descriptors(tmp_path: Path) -> None:
    """One descriptor per level, not one per directory seen: a directory with more
    subdirectories than the process may open files is walked whole."""
    import resource

    from rdc.local.snapshot import walk

    for n in range(300):
        (tmp_path / "t" / f"d{n:03}").mkdir(parents=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = open_descriptors()
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 40, hard))
    try:
        walked = walk(str(tmp_path / "t"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(walked.tree.children) == 300 and not walked.errors


def test_a_tree_deeper_than_the_limit_is_walked_without_its_deepest_part(
        tmp_path: Path) -> None:
    """A peer can make 2,048 levels within the path limit (``open`` with create): the walk
    leaves out what is below MAX_DEPTH, with an error, and every pass over the tree works
    (it raised RecursionError in the walk's stamp, and every later open failed)."""
    from rdc.local.snapshot import MAX_DEPTH, entries_below, fingerprint, seal, walk
    from tests.attack.world import make_deep, remove

    (tmp_path / "t").mkdir()
    make_deep(tmp_path / "t", 2048)
    try:
        walked = walk(str(tmp_path / "t"))
        assert walked.errors == [("a/" * MAX_DEPTH + "a", f"more than {MAX_DEPTH} levels deep")]
        assert len(list(entries_below(walked.tree))) == MAX_DEPTH
        seal(walked.tree)
        assert walked.tree.count == MAX_DEPTH
        assert fingerprint(walked.tree, b"") == walked.fingerprint
    finally:  # pytest's clean-up (shutil.rmtree) recurses once per level: even a failed
        remove(tmp_path / "t")  # run must not leave the tree to it


def test_times_beyond_64_bits_of_nanoseconds_are_clamped(tmp_path: Path) -> None:
    from rdc.local.filestat import NS_MAX
    from rdc.local.snapshot import seal, walk

    (tmp_path / "t" / "d").mkdir(parents=True)
    (tmp_path / "t" / "d" / "f").write_bytes(b"x")
    future = 10_413_792_000_000_000_000  # 2300-01-01
    os.utime(tmp_path / "t" / "d" / "f", ns=(future, future))
    os.utime(tmp_path / "t" / "d", ns=(future, future))
    walked = walk(str(tmp_path / "t"))
    d = walked.tree.children["d"]
    assert d.mtime_ns == d.children["f"].mtime_ns == NS_MAX
    d.children["f"].root = b"\0" * 32
    seal(walked.tree)  # hashes of the clamped times


@pytest.mark.skipif(not beneath.available(), reason="openat2 is not available here")
def test_open_beneath_refuses_links_and_escapes(tmp_path: Path) -> None:
    """openat2 opens a directory below the held one and nothing else: a symlink anywhere
    on the path, or a path that climbs out, is refused (None: the caller walks and names
    the reason); a missing component is FileNotFoundError."""
    (tmp_path / "root" / "a" / "b").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "root" / "a" / "out")
    os.symlink("b", tmp_path / "root" / "a" / "inside")
    held = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = beneath.open_dir(held, "a/b")
        assert fd is not None
        try:
            assert os.fstat(fd).st_ino == os.stat(tmp_path / "root" / "a" / "b").st_ino
        finally:
            os.close(fd)
        for refused in ("a/out", "a/inside", "a/inside/.", "../outside", "a/../../outside"):
            assert beneath.open_dir(held, refused) is None, refused
        with pytest.raises(FileNotFoundError):
            beneath.open_dir(held, "a/missing/c")
    finally:
        os.close(held)


def test_a_large_temporary_starts_its_writeback_in_steps_and_keeps_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each WRITEBACK_STEP written starts the writeback of exactly the range not started
    yet; the hint changes no byte of the file (with the real call, where there is one)."""
    from rdc import _native

    real = _native.start_writeback
    started: list[tuple[int, int]] = []

    def record(fd: int, offset: int, length: int) -> bool:
        started.append((offset, length))
        return real(fd, offset, length) if real else False

    monkeypatch.setattr(fs, "WRITEBACK_STEP", 1000)
    monkeypatch.setattr(_native, "start_writeback", record)
    root = SafeRoot(tmp_path)
    data = os.urandom(4500)
    with root.create_temp("big") as tmp:
        for at in range(0, len(data), 700):
            tmp.write(data[at : at + 700])
        tmp.commit(0o644, T1)
    root.close()
    assert started == [(0, 1400), (1400, 1400), (2800, 1400)]
    assert (tmp_path / "big").read_bytes() == data


@pytest.mark.skipif(PURE or sys.platform != "linux", reason="Linux's sync_file_range, native")
def test_start_writeback_is_taken_on_a_regular_file(tmp_path: Path) -> None:
    from rdc import _native

    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 65536)
        assert _native.start_writeback(fd, 0, 65536) is True
        assert _native.start_writeback(-1, 0, 1) is False  # a hint: never raises
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 65536


@pytest.mark.parametrize("depth", [3, 40, 300])  # (300: under the recursion limit of
# shutil.rmtree, with which pytest clears old temporaries, should this run be killed)
def test_makedirs_syncs_the_directories_that_gained_an_entry_once_at_the_end(
        tree: Tree, monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    """Each directory that gained an entry is synced once, after all are made (an fsync
    each where they are few, one syncfs where they are more than SYNCFS_FROM: a path
    2,048 levels deep cost 2,048 fsyncs); what was there already is not synced."""
    from rdc.local import fs

    synced: list[tuple[int, int]] = []  # (device, inode) of each directory fsynced
    whole: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real_fsync(fd)

    def syncfs(fd: int) -> int:
        whole.append(fd)
        return 0

    monkeypatch.setattr(os, "fsync", fsync)
    if fs._syncfs is not None:
        monkeypatch.setattr(fs, "_syncfs", syncfs)
    tree.root.makedirs("old", 0o755)
    synced.clear()
    rel = "old/" + "/".join(["d"] * depth)
    try:
        _synced_once(tree, rel, depth, synced, whole)
    finally:
        tree.root.remove("old")


def _synced_once(tree: Tree, rel: str, depth: int, synced: list, whole: list) -> None:
    from rdc.local import fs

    assert tree.root.makedirs(rel, 0o755) is True
    parents, fd = [], os.open(tree.root_path / "old", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):  # (by descriptor: deep paths are past PATH_MAX)
            st = os.fstat(fd)
            parents.append((st.st_dev, st.st_ino))
            step = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = step
    finally:
        os.close(fd)
    if depth > fs.SYNCFS_FROM and fs._syncfs is not None:
        assert len(whole) == 1 and synced == []
    else:
        assert whole == [] and sorted(synced) == sorted(parents)
    assert tree.root.makedirs(rel, 0o755) is False and len(whole) <= 1
