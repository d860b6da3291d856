"""Group commit: files committed from many threads at once share their syncs and index
transactions, and each still gets its own outcome."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from rdc.content.signature import signature_of_bytes
from rdc.local import commits
from rdc.local.fs import ConflictError, Expect
from rdc.local.index import IndexDatabase
from rdc.local.replica import Replica

OLD = 1_600_000_000 * 10**9


def _at_once(names: list[str], prepare, call) -> dict[str, object]:
    """For each name, on its own thread: ``prepare(name)``, then, once every thread is
    ready, ``call(name, prepared)``; what each call returned or raised."""
    outcomes: dict[str, object] = {}
    start = threading.Barrier(len(names))

    def one(name: str) -> None:
        prepared = prepare(name)
        start.wait()
        try:
            outcomes[name] = call(name, prepared)
        except Exception as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=one, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def _commit_all(replica: Replica, names: list[str], expects: dict[str, Expect] | None = None
                ) -> dict[str, object]:
    """Commit one file per name, each from its own thread, all at once."""

    def prepare(name: str):
        temp = replica.fs.create_temp(name)
        temp.write(name.encode() * 100)
        return temp

    def call(name: str, temp):
        try:
            return replica.commit_received(temp, name, 0o640, OLD, (expects or {}).get(name),
                                           signature_of_bytes(name.encode() * 100))
        finally:
            temp.abort()

    return _at_once(names, prepare, call)


def test_concurrent_commits_share_their_syncs(tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    root.mkdir()
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    syncs: list[int] = []
    real = commits.sync_all

    def slow_sync(fs, temps):  # a slow disk: the others arrive while the first syncs
        syncs.append(len(temps))
        time.sleep(0.2)
        real(fs, temps)

    monkeypatch.setattr(commits, "sync_all", slow_sync)
    names = [f"f{i}" for i in range(16)]
    outcomes = _commit_all(replica, names)
    assert sum(syncs) == 16 and len(syncs) <= 3  # not one sync per file
    for name in names:
        assert (root / name).read_bytes() == name.encode() * 100
        assert (root / name).stat().st_mode & 0o777 == 0o640
        assert outcomes[name].st_mtime_ns == OLD
    rows = replica.indexed(names)
    assert {name: rows[name].root for name in names} == {
        name: signature_of_bytes(name.encode() * 100).root for name in names}
    assert not [p for p in root.iterdir() if p.name.startswith(".rdc-tmp")]
    replica.close()


def test_each_commit_has_its_own_outcome(tmp_path) -> None:
    """A file whose destination changed fails alone; the others of its group land."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "f3").write_bytes(b"appeared meanwhile")
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    names = [f"f{i}" for i in range(6)]
    outcomes = _commit_all(replica, names, {"f3": Expect.absent()})
    assert isinstance(outcomes["f3"], ConflictError)
    assert (root / "f3").read_bytes() == b"appeared meanwhile"
    for name in names:
        if name != "f3":
            assert (root / name).read_bytes() == name.encode() * 100
    replica.close()


def test_a_failed_sync_installs_nothing(tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "f0").write_bytes(b"old")
    replica = Replica(str(root), tmp_path / "index.sqlite3")

    def failing(fs, temps):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(commits, "sync_all", failing)
    outcomes = _commit_all(replica, ["f0", "f1"])
    assert all(isinstance(o, OSError) for o in outcomes.values())
    assert (root / "f0").read_bytes() == b"old" and not (root / "f1").exists()
    assert sorted(p.name for p in root.iterdir()) == ["f0"]  # no temporary left
    replica.close()



def _record_all(replica: Replica, names: list[str]) -> dict[str, object]:
    """`Replica.record_many` of one file per name (its own content), each from its own
    thread, all at once; what each call returned (None) or raised."""
    return _at_once(
        names, lambda name: os.lstat(replica.root + "/" + name),
        lambda name, st: replica.record_many(
            [(name, st, signature_of_bytes(name.encode() * 100))]))


def _files_indexed_later(tmp_path, count: int) -> tuple[Replica, list[str]]:
    """A replica of ``count`` files f0, f1, ..., not yet in its index."""
    root = tmp_path / "root"
    root.mkdir()
    names = [f"f{i}" for i in range(count)]
    for name in names:
        (root / name).write_bytes(name.encode() * 100)
    return Replica(str(root), tmp_path / "index.sqlite3"), names


def test_rows_stored_from_many_threads_at_once_share_transactions(tmp_path,
                                                                  monkeypatch) -> None:
    """Threads that store index rows while another's transaction runs wait for it, then
    store theirs in one transaction together; each returns once its rows are committed
    (another connection sees them)."""
    replica, names = _files_indexed_later(tmp_path, 16)
    transactions: list[int] = []
    real = replica.db.put_rows

    def slow_put(rows):  # a slow disk: the others arrive while the first commits
        transactions.append(len(rows))
        time.sleep(0.2)
        real(rows)

    monkeypatch.setattr(replica.db, "put_rows", slow_put)
    outcomes = _record_all(replica, names)
    assert outcomes == {name: None for name in names}
    assert sum(transactions) == 16 and len(transactions) <= 3  # not one a thread
    other = IndexDatabase(tmp_path / "index.sqlite3")
    try:
        assert {f.path: f.root for f in other.files()} == {
            name: signature_of_bytes(name.encode() * 100).root for name in names}
    finally:
        other.close()
    replica.close()


def test_a_failed_transaction_fails_every_thread_whose_rows_it_held(tmp_path,
                                                                   monkeypatch) -> None:
    """A full disk in a shared transaction is raised in each thread whose rows were in it,
    and none of them is stored."""
    replica, names = _files_indexed_later(tmp_path, 8)
    real = replica.db.put_rows
    calls: list[int] = []

    def failing_put(rows):
        calls.append(len(rows))
        time.sleep(0.2)
        if len(calls) > 1:  # (the first holds one thread's rows; the rest come together)
            raise sqlite3.OperationalError("database or disk is full")
        real(rows)

    monkeypatch.setattr(replica.db, "put_rows", failing_put)
    outcomes = _record_all(replica, names)
    stored = {f.path for f in replica.db.files()}
    failed = {name for name, o in outcomes.items() if isinstance(o, sqlite3.OperationalError)}
    assert failed and failed | stored == set(names) and not failed & stored
    assert len(failed) == sum(calls[1:]) and len(stored) == calls[0]
    replica.close()


def test_gathered_gives_each_item_its_result_or_error() -> None:
    """`commits.Gathered`: items that arrive during a flush go together in the next; each
    thread gets its own item's result or error, and a flush that fails fails them all."""
    flushed: list[list[int]] = []
    gate = threading.Event()

    def flush(items: list[int]) -> list[object]:
        flushed.append(items)
        gate.wait(10)
        if 99 in items:
            raise RuntimeError("the whole flush failed")
        return [ValueError(str(i)) if i % 3 == 0 else i * 10 for i in items]

    gathered: commits.Gathered[int, int] = commits.Gathered(flush)
    outcomes: dict[int, object] = {}

    def one(i: int) -> None:
        try:
            outcomes[i] = gathered.join(i)
        except Exception as exc:
            outcomes[i] = exc

    first = threading.Thread(target=one, args=(1,))
    first.start()
    while not flushed:
        time.sleep(0.01)
    rest = [threading.Thread(target=one, args=(i,)) for i in (2, 3, 4)]
    for thread in rest:
        thread.start()
    time.sleep(0.2)  # (all three wait behind the first flush)
    gate.set()
    for thread in [first, *rest]:
        thread.join(30)
    one(99)
    assert flushed[0] == [1] and sorted(flushed[1]) == [2, 3, 4] and flushed[2] == [99]
    assert (outcomes[1], outcomes[2], outcomes[4]) == (10, 20, 40)
    assert isinstance(outcomes[3], ValueError) and str(outcomes[3]) == "3"
    assert isinstance(outcomes[99], RuntimeError)
