"""Which files a push or pull with --delete moves at the receiver instead of sending:
new at their path, with a root prefix the receiver holds at a path it is to remove."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rdc.transfer.compare import Changes, moves
from rdc.wire import messages as m

digests = st.sampled_from([b"A" * 8, b"B" * 8, b"C" * 8])
paths = st.text(alphabet="abc/", min_size=1, max_size=6)


@given(files=st.dictionaries(paths, st.tuples(st.none() | digests, digests), max_size=8),
       removals=st.dictionaries(paths, st.tuples(st.sampled_from("fdl"), digests),
                                max_size=8))
def test_each_removed_file_moves_to_at_most_one_new_path_with_its_content(
        files: dict, removals: dict) -> None:
    changes = Changes(
        files=[(path, there) for path, (there, _) in files.items()],
        removals=[(path, m.Expected(kind, digest)) for path, (kind, digest) in
                  removals.items()],
        digests={path: digest for path, (there, digest) in files.items() if there is None},
    )
    planned = moves(changes)
    olds = [old for old, _, _ in planned]
    news = [new for _, new, _ in planned]
    assert len(set(olds)) == len(olds) and len(set(news)) == len(news)
    for old, new, expect in planned:
        kind, digest = removals[old]
        assert kind == "f" and expect == m.Expected("f", digest)
        assert files[new] == (None, digest)  # new at its path, the same content
    # As many moves as the contents allow: per digest, min(new files, removed files).
    for digest in {b"A" * 8, b"B" * 8, b"C" * 8}:
        new = sum(1 for there, d in files.values() if there is None and d == digest)
        held = sum(1 for kind, d in removals.values() if kind == "f" and d == digest)
        assert sum(1 for _, n, _ in planned if files[n][1] == digest) == min(new, held)


def test_no_removals_no_moves() -> None:
    changes = Changes(files=[("a", None)], digests={"a": b"A" * 8})
    assert moves(changes) == []


class _Target:
    """A target side whose ``mv`` of the listed paths fails (changed meanwhile)."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.applied: list[m.Op] = []

    async def apply(self, ops: list[m.Op]) -> list[m.Failure | None]:
        self.applied += ops
        return [m.Failure("conflict", f"{op.path} changed") if op.path in self.failing
                else None for op in ops]


async def test_a_file_that_cannot_be_moved_is_sent_and_its_old_name_removed() -> None:
    from rdc.transfer.compare import moves
    from rdc.transfer.oneway import _move_instead
    from rdc.transfer.stats import Stats

    digest_a, digest_b = b"A" * 8, b"B" * 8
    changes = Changes(
        files=[("new-a", None), ("new-b", None), ("edited", b"C" * 8)],
        removals=[("old-a", m.Expected("f", digest_a)), ("old-b", m.Expected("f", digest_b)),
                  ("gone", m.Expected("f", b"D" * 8))],
        digests={"new-a": digest_a, "new-b": digest_b},
        sizes={"new-a": 10, "new-b": 20, "edited": 30},
    )
    target, stats = _Target({"old-b"}), Stats()
    done = await _move_instead(target, moves(changes), changes, stats)
    assert [(op.kind, op.path, op.destination) for op in target.applied] == [
        ("mv", "old-a", "new-a"), ("mv", "old-b", "new-b")]
    assert done == [("new-a", 10)]
    assert changes.files == [("new-b", None), ("edited", b"C" * 8)]  # sent as before
    assert [p for p, _ in changes.removals] == ["old-b", "gone"]
    assert stats.moved == {"new-a": ("move", 0, 10)} and not stats.failed


async def test_files_go_while_the_moves_are_made(tmp_path, monkeypatch) -> None:
    """A push with --delete of renamed files and new ones: the new ones are offered while
    the target makes the moves (its ops wait here, up to 10 s, for the first batch of
    files to be decided), and the target ends as the source is, the renamed files moved,
    not sent."""
    import os
    import threading

    from rdc.transfer import batch, serving
    from rdc.transfer.stats import Options

    from .protocol_support import Pair, tree_state, write

    src = tmp_path / "src"
    for i in range(10):
        write(src / f"f{i}.bin", os.urandom(3000 + i), 1_600_000_000_000_000_000 + i)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    for i in range(10):
        (src / f"f{i}.bin").rename(src / f"g{i}.bin")
        write(src / f"n{i}.bin", os.urandom(2000 + i), 1_700_000_000_000_000_000 + i)
    offered, moved_after = threading.Event(), []
    real_decide, real_apply = batch.decide_batch, serving.apply_ops

    def decide(*args, **kwargs):
        offered.set()
        return real_decide(*args, **kwargs)

    def apply_ops(replica, ops, *args):
        if any(op.kind == "mv" for op in ops):
            moved_after.append(offered.wait(10))
        return real_apply(replica, ops, *args)

    monkeypatch.setattr(batch, "decide_batch", decide)
    monkeypatch.setattr(serving, "apply_ops", apply_ops)
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert moved_after == [True]
    assert {p: how for p, (how, _, _) in stats.moved.items() if p.startswith("g")} == {
        f"g{i}.bin": "move" for i in range(10)}
    pair.close()
