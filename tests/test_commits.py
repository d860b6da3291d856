"""Group commit: files committed from many threads at once share their syncs and index
transactions, and each still gets its own outcome."""

from __future__ import annotations

import threading
import time

from rdc.content.signature import signature_of_bytes
from rdc.local import commits
from rdc.local.fs import ConflictError, Expect
from rdc.local.replica import Replica

OLD = 1_600_000_000 * 10**9


def _commit_all(replica: Replica, names: list[str], expects: dict[str, Expect] | None = None
                ) -> dict[str, object]:
    """Commit one file per name, each from its own thread, all at once."""
    outcomes: dict[str, object] = {}
    start = threading.Barrier(len(names))

    def one(name: str) -> None:
        data = name.encode() * 100
        temp = replica.fs.create_temp(name)
        temp.write(data)
        start.wait()
        try:
            outcomes[name] = replica.commit_received(
                temp, name, 0o640, OLD, (expects or {}).get(name), signature_of_bytes(data))
        except Exception as exc:
            outcomes[name] = exc
        finally:
            temp.abort()

    threads = [threading.Thread(target=one, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


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

