"""Ops applied against what is there now: a compare and swap that fails because another
client made exactly what this op wanted is no conflict; anything else still is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdc.local.fs import SafeRoot
from rdc.local.ignore import Excludes
from rdc.local.replica import Replica
from rdc.transfer.ops import apply_ops
from rdc.wire import messages as m


@pytest.fixture
def replica(tmp_path: Path):
    (tmp_path / "root").mkdir()
    replica = Replica(str(tmp_path / "root"), tmp_path / "index.sqlite3", Excludes(()))
    yield replica
    replica.close()


def racing_link(monkeypatch: pytest.MonkeyPatch, root: Path, target: str) -> None:
    """Another client makes ``l`` (a link to ``target``) just before this one's swap."""
    real = SafeRoot.symlink

    def late(self: SafeRoot, rel: str, *args: object, **kwargs: object) -> os.stat_result:
        if not os.path.lexists(root / rel):
            os.symlink(target, root / rel)
        return real(self, rel, *args, **kwargs)

    monkeypatch.setattr(SafeRoot, "symlink", late)


def test_a_link_made_meanwhile_as_wanted_is_no_conflict(replica, tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    racing_link(monkeypatch, root, "../big.bin")
    results = apply_ops(replica, [m.Op("link", "l", target=b"../big.bin", expect=m.NOTHING)])
    assert results == [None]
    assert os.readlink(root / "l") == "../big.bin"


def test_a_link_made_meanwhile_elsewhere_is_a_conflict(replica, tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    racing_link(monkeypatch, root, "other")
    [failure] = apply_ops(replica, [m.Op("link", "l", target=b"../big.bin", expect=m.NOTHING)])
    assert failure is not None and failure.code == "conflict"
    assert os.readlink(root / "l") == "other"
