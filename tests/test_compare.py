"""The top-down comparison (rdc.transfer.compare): its listings overlap (a directory's
subdirectories are asked for while other directories' listings are still out), and the
changes still come in the order of a level-by-level walk."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc.errors import ProtocolError
from rdc.local.paths import join, to_wire
from rdc.local.snapshot import Entry, seal
from rdc.transfer import compare
from rdc.transfer.ops import listing
from rdc.transfer.sides import Local

HB = 8

# A tree as nested dicts: a name to bytes (a file), to a str (a link) or to a dict.
contents = st.one_of(st.sampled_from([b"a", b"b", b"c"]), st.sampled_from(["t", "u"]))
shapes = st.recursive(
    st.dictionaries(st.sampled_from("abcde"), contents, max_size=4),
    lambda inner: st.dictionaries(st.sampled_from("abcdef"), st.one_of(contents, inner),
                                  max_size=4),
    max_leaves=40,
)


def build(shape: dict) -> Entry:
    children = {}
    for name, value in shape.items():
        if isinstance(value, dict):
            children[name] = build(value)
        elif isinstance(value, str):
            children[name] = Entry("l", 0, 1, target=value)
        else:
            children[name] = Entry("f", 0o644, 1, len(value), value * 32)
    return Entry("d", 0o755, 1, children=children)


def tree_of(shape: dict) -> Entry:
    tree = build(shape)
    seal(tree)
    return tree


def level_by_level(source: Entry, target: Entry) -> compare.Changes:
    """The comparison as it was specified: one level at a time, nothing overlapping."""
    changes = compare.Changes()
    frontier = [("", True)]
    while frontier:
        below = []
        for path, has in frontier:
            src = {e.name: e for e in listing(source, path, HB, sizes=True) or []}
            dst = {e.name: e for e in listing(target, path, HB) or []} if has else {}
            for name in sorted(set(src) | set(dst), key=to_wire):
                rel = join(path, name)
                descend = compare._compare_entry(rel, src.get(name), dst.get(name), changes)
                if descend is not None:
                    below.append((rel, descend))
        frontier = below
    return changes


def fields(changes: compare.Changes) -> tuple:
    return (changes.replace, changes.mkdirs, changes.files, changes.links, changes.removals,
            changes.sizes, changes.digests)


@settings(max_examples=300, deadline=None)
@given(shapes, shapes)
def test_the_changes_come_in_the_order_of_a_walk_level_by_level(mine: dict, theirs: dict
                                                               ) -> None:
    source, target = tree_of(mine), tree_of(theirs)
    if source.content == target.content:
        return
    got = trio.run(compare.compare, Local(None, source), Local(None, target), HB)  # type: ignore[arg-type]
    assert fields(got) == fields(level_by_level(source, target))


class Slow(Local):
    """A target whose listings take a while (the directory ``slow`` a long while), noting
    how many are out at once and when each is asked for and answered."""

    def __init__(self, tree: Entry, slow: str) -> None:
        super().__init__(None, tree)  # type: ignore[arg-type]
        self.slow = slow
        self.out = self.most = 0
        self.events: list[tuple[str, str]] = []

    async def listings(self, paths, hb, meta=False, sizes=False, have=None, later=None):
        self.out += 1
        self.most = max(self.most, self.out)
        self.events += [("asked", path) for path in paths]
        await trio.sleep(0.5 if self.slow in paths else 0.001)
        self.events += [("answered", path) for path in paths]
        self.out -= 1
        return await super().listings(paths, hb, meta, sizes, have)


def test_listings_overlap_and_a_subdirectory_is_asked_for_before_its_level_is_done(
) -> None:
    # 100 directories, each with a chain of 5 below it, every file different.
    shape = {f"d{i:03d}": {"x": {"y": {"z": {"w": {"f": b"a"}}}}} for i in range(100)}
    other = {f"d{i:03d}": {"x": {"y": {"z": {"w": {"f": b"b"}}}}} for i in range(100)}
    source, target = tree_of(shape), Slow(tree_of(other), "d099")

    async def main() -> compare.Changes:
        return await compare.compare(Local(None, source), target, HB)  # type: ignore[arg-type]

    got = trio.run(main)
    assert fields(got) == fields(level_by_level(source, target.tree))
    assert len(got.files) == 100
    assert 2 <= target.most <= compare.IN_FLIGHT
    # The chains below the first directories were walked to their ends while the slow
    # one's listing was out: the walk does not wait for a whole level.
    assert target.events.index(("asked", "d000/x/y/z/w")) < target.events.index(
        ("answered", "d099"))


class Deferring(Local):
    """A target that answers for ``deferred`` only when asked a second time (as a remote
    side whose sketch of it did not decode), naming it in ``later`` the first time."""

    def __init__(self, tree: Entry, deferred: str) -> None:
        super().__init__(None, tree)  # type: ignore[arg-type]
        self.deferred = deferred
        self.asked: list[str] = []

    async def listings(self, paths, hb, meta=False, sizes=False, have=None, later=None):
        self.asked += paths
        got = await super().listings(paths, hb, meta, sizes, have)
        if self.deferred in paths and self.asked.count(self.deferred) == 1:
            assert later is not None
            later.append(self.deferred)
            del got[self.deferred]
        elif self.deferred in paths:
            await trio.sleep(0.3)  # (a slow second answer)
            self.asked.append("(answered again)")
        return got


def test_a_directory_asked_for_again_holds_up_only_its_own_subdirectories() -> None:
    """A directory the remote side must be asked for again (its sketch did not decode)
    is, at once; the others of its batch go on meanwhile, and the changes are those of
    the whole walk."""
    shape = {f"d{i:03d}": {"x": {"y": {"f": b"a"}}} for i in range(5)}
    other = {f"d{i:03d}": {"x": {"y": {"f": b"b"}}} for i in range(5)}
    source, target = tree_of(shape), Deferring(tree_of(other), "d002")

    async def main() -> compare.Changes:
        return await compare.compare(Local(None, source), target, HB)  # type: ignore[arg-type]

    got = trio.run(main)
    assert fields(got) == fields(level_by_level(source, target.tree))
    assert target.asked.count("d002") == 2
    assert target.asked.index("d000/x/y") < target.asked.index("(answered again)")
    assert target.asked.index("(answered again)") < target.asked.index("d002/x")


class Failing(Local):
    """A target whose listings of one directory fail as a lost connection would."""

    async def listings(self, paths, hb, meta=False, sizes=False, have=None, later=None):
        await trio.sleep(0)
        if "d003" in paths:
            raise ProtocolError(message="listing: a broken answer")
        return await super().listings(paths, hb, meta, sizes, have)


def test_a_failed_listing_raises_as_itself_not_in_a_group() -> None:
    shape = {f"d{i:03d}": {"f": b"a"} for i in range(100)}
    other = {f"d{i:03d}": {"f": b"b"} for i in range(100)}
    source, target = tree_of(shape), Failing(None, tree_of(other))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="a broken answer"):
        trio.run(compare.compare, Local(None, source), target, HB)  # type: ignore[arg-type]
