"""The storage contract on `LocalStore`, and what only a directory can get wrong: files on
disk, temporaries, a crash between write and rename, permissions, names that collide with
directories, and `open_store`."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rdc.storage import (
    InvalidStoreUrl,
    LocalStore,
    ObjectNotFound,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    open_store,
)
from rdc.storage.local import TEMP_PREFIX

from .storage_contract import StoreContract, listed


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return LocalStore(tmp_path / "repo", create=True)


def test_objects_are_files_under_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "r", create=True)
    store.put("data/ab/cd", b"content")
    path = tmp_path / "r" / "data" / "ab" / "cd"
    assert path.read_bytes() == b"content"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "r" / "data").stat().st_mode) == 0o700
    assert os.listdir(tmp_path / "r" / "data" / "ab") == ["cd"]  # no temporary left


def test_opening_a_missing_directory_needs_create(tmp_path: Path) -> None:
    with pytest.raises(StoreMissing, match="no such directory"):
        LocalStore(tmp_path / "nope")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreMissing, match="not a directory"):
        LocalStore(tmp_path / "file")
    assert LocalStore(tmp_path / "a" / "b", create=True).location == str(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()


def test_listing_skips_temporaries_and_foreign_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, create=True)
    store.put("snapshots/s1", b"1")
    (tmp_path / "snapshots" / f"{TEMP_PREFIX}abc").write_bytes(b"partial")
    (tmp_path / "snapshots" / "README.TXT").write_bytes(b"not ours")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x").write_bytes(b"")
    os.mkfifo(tmp_path / "snapshots" / "fifo")
    assert listed(store) == {"snapshots/s1": 1}
    with pytest.raises(ObjectNotFound):
        store.get("snapshots/fifo")  # and it does not hang on the FIFO
    with pytest.raises(ObjectNotFound):
        store.stat("snapshots/fifo")


def test_a_name_and_its_directory_cannot_both_be_objects(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, create=True)
    store.put("a/b", b"1")
    with pytest.raises(StoreError, match="directory of other objects"):
        store.put("a", b"2")
    store.put("c", b"3")
    with pytest.raises(StoreError, match="part of its path is an object"):
        store.put("c/d", b"4")
    with pytest.raises(StoreError, match="directory of other objects"):
        store.put("a", b"5", exclusive=True)
    store.delete("a")  # a directory is not an object: nothing to delete
    assert listed(store) == {"a/b": 1, "c": 1}


def test_permission_errors_are_access_denied(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    store = LocalStore(root, create=True)
    store.put("x", b"1")
    script = textwrap.dedent(f"""
        from rdc.storage import LocalStore, StoreAccessDenied
        store = LocalStore({str(root)!r})
        try:
            store.put("y", b"2")
        except StoreAccessDenied as e:
            print("denied", e.exit_code, e)
        print(store.get("x"))
    """)
    prefix = []
    if os.geteuid() == 0:  # root overrides permission bits unless it drops the capability
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permission bits do not apply")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
    os.chmod(root, 0o500)
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True,
                              text=True, timeout=60)
    finally:
        os.chmod(root, 0o700)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith(f"denied {StoreAccessDenied.exit_code} {root}: access denied")
    assert second == "b'1'"


def test_a_crash_before_the_rename_leaves_the_old_object(tmp_path: Path) -> None:
    # A writer killed after writing its temporary and before renaming it over the object
    # (here: stopped inside the fsync) leaves the old object, whole, and a temporary that
    # the store does not see; the next put works.
    root = tmp_path / "repo"
    store = LocalStore(root, create=True)
    store.put("data/pack", b"old" * 1000)
    script = textwrap.dedent(f"""
        import os, sys, time
        import rdc.storage.local as local
        real_fsync = os.fsync
        def stalled_fsync(fd):
            real_fsync(fd)
            print("in fsync", flush=True)
            time.sleep(60)
        local.os.fsync = stalled_fsync
        local.LocalStore({str(root)!r}).put("data/pack", b"new" * 3_000_000)
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "in fsync\n"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
    temporaries = [n for n in os.listdir(root / "data") if n.startswith(TEMP_PREFIX)]
    assert len(temporaries) == 1
    assert (root / "data" / temporaries[0]).stat().st_size == 9_000_000
    assert store.get("data/pack") == b"old" * 1000
    assert listed(store) == {"data/pack": 3000}
    store.put("data/pack", b"newer")
    assert store.get("data/pack") == b"newer"


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    local = open_store(str(tmp_path / "x"), create=True)
    assert isinstance(local, LocalStore)
    assert isinstance(open_store(tmp_path / "x"), LocalStore)
    for bad in ["s4://host/bucket", "file:///tmp/x", "http://host/b", ""]:
        with pytest.raises(InvalidStoreUrl) as caught:
            open_store(bad)
        assert caught.value.exit_code == 2


def test_a_delete_leaves_other_writers_directories_alone(tmp_path: Path) -> None:
    # Deleting the last object of a directory keeps the directory: a concurrent put into
    # it must not find it gone between making it and renaming into it.
    store = LocalStore(tmp_path, create=True)
    store.put("data/00/a", b"1")
    store.delete("data/00/a")
    assert (tmp_path / "data" / "00").is_dir()
    assert listed(store) == {}
    store.put("data/00/b", b"2")
    assert listed(store) == {"data/00/b": 1}
