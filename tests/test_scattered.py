"""Scattered small edits across a tree: where rsync's 700-byte blocks are at their best,
rdc's sub-chunk level must not lose (rdc delta's whole cost against rsync's literal data)."""

from __future__ import annotations

import os
import shutil

import pytest

from rdc.local.replica import Replica
from rdc.transfer.delta import delta_tree

from .conftest import scaled
from .corpus import make_source_tree, scatter_edits
from .rsync_model import literal_bytes


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scattered_edits_cost_no_more_than_rsyncs_literal_data(tmp_path, seed: int) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    make_source_tree(old, files=scaled(300, 80), seed=seed)
    shutil.copytree(old, new)
    edited = scatter_edits(new, seed=seed + 2)
    assert edited > 5
    rsync = 0
    for dirpath, _, names in os.walk(new):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f, open(path.replace(str(new), str(old)), "rb") as g:
                a, b = g.read(), f.read()
            if a != b:
                rsync += literal_bytes(a, b)
    old_replica = Replica(str(old), tmp_path / "old.sqlite3")
    new_replica = Replica(str(new), tmp_path / "new.sqlite3")
    old_replica.scan()
    new_replica.scan()
    report, offered = delta_tree(old_replica, new_replica, verify=True)
    old_replica.close()
    new_replica.close()
    assert offered == edited
    assert report.total_bytes <= rsync, (report.total_bytes, rsync, report.literal_bytes)
