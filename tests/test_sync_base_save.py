"""A sync's base that cannot be stored is one clear error naming the path, not an
OSError's traceback (issue 14, item 2: the state directory can fail after the checks made
at the start, e.g. a full disk), and leaves no temporary behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdc.errors import FileWriteError
from rdc.transfer import sync_base
from rdc.transfer.sync_base import Known


def test_a_base_that_cannot_be_written_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"in the way\n")
    target = blocker / "sync" / "x.base"
    with pytest.raises(FileWriteError) as caught:
        sync_base.save(target, Known("d", 0o755, 0))
    assert str(caught.value).startswith(f"cannot write {blocker / 'sync'}: ")
    assert caught.value.exit_code == 3


def test_a_base_is_stored_and_read_back(tmp_path: Path) -> None:
    root = Known("d", 0o755, 5, children={"a.txt": Known("f", 0o644, 7, b"\x01" * 32)})
    path = tmp_path / "state" / "x.base"
    sync_base.save(path, root)
    assert sync_base.load(path) == root
    assert [p.name for p in path.parent.iterdir()] == ["x.base"]
