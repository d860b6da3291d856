"""A mirror's follower rescans after a round: it lists again the directories of the paths
the share's watcher, paused while the round wrote, saw meanwhile (its own writes, and an
edit made on the replica's own disk, which is then undone too); it scans in full when the
watcher cannot vouch for what changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from rdc.local.rescan import to_list
from rdc.local.snapshot import Entry
from rdc.transfer import twoway
from rdc.wire.address import parse_url
from rdc_server.config import Upstream
from rdc_server.follow import Follower, _list_again
from rdc_server.shares import Registry, Share

WAIT_SECONDS = 10.0


def entry(tree: Entry, path: str) -> Entry | None:
    node: Entry | None = tree
    for part in path.split("/"):
        node = node.children.get(part) if node is not None else None
    return node


def counting(calls: list[str], name: str, method: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        calls.append(name)
        return method(*args, **kwargs)
    return wrapper


def make_tree(root: Path) -> None:
    for rel in ("sub/a.txt", "sub/c.txt", "sub/d.txt", "other/b.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{rel}\n")


async def seen_by_paused_watcher(registry: Registry, share: str, *paths: str) -> None:
    """Wait (bounded) until the paused watcher has noted ``paths``."""
    watcher = registry._watchers[share]
    with trio.fail_after(WAIT_SECONDS):
        while watcher.seen_paused is not None and not set(paths) <= watcher.seen_paused:
            await trio.sleep(0.02)


def test_a_round_is_rescanned_with_the_directories_of_edits_made_beside_it(tmp_path):
    root = tmp_path / "mirror"
    make_tree(root)
    share = Share("m", str(root), readonly=True)
    registry = Registry({"m": share}, tmp_path / "state")
    upstream = Upstream(parse_url("rdc://127.0.0.1:1/s"), "t" * 20, twoway.RECEIVE_ONLY)
    follower = Follower(registry, share, upstream, tmp_path / "state")

    async def main() -> None:
        registry.watch("m")
        directory = await trio.to_thread.run_sync(registry.acquire, share, "", False)
        replica = directory.replica
        calls: list[str] = []
        replica.scan = counting(calls, "scan", replica.scan)
        try:
            first = await follower._scan(directory)
            assert calls == ["scan"]
            before = registry.sequence("m")

            # The round removes sub/a.txt; meanwhile sub/d.txt is edited on this disk: the
            # watcher saw both, so the rescan lists sub again (the removal alone it would
            # patch in) and sees the edit.
            with registry.writing("m"):
                replica.fs.remove("sub/a.txt")
                (root / "sub" / "d.txt").write_text("edited on the replica's disk\n")
                await seen_by_paused_watcher(registry, "m", "sub/a.txt", "sub/d.txt")
            calls.clear()
            tree = await follower._scan(directory)
            assert calls == []  # a rescan
            assert entry(tree, "sub/a.txt") is None
            d_now, d_before = entry(tree, "sub/d.txt"), entry(first, "sub/d.txt")
            assert d_now is not None and d_before is not None
            assert d_now.root != d_before.root
            assert registry.sequence("m") == before  # the paused watcher moved nothing

            # Now the edit is in a directory the round did not write into: listed too.
            with registry.writing("m"):
                replica.fs.remove("sub/c.txt")
                (root / "other" / "b.txt").write_text("edited elsewhere, much longer\n")
                await seen_by_paused_watcher(registry, "m", "sub/c.txt", "other/b.txt")
            calls.clear()
            tree2 = await follower._scan(directory)
            assert calls == []  # a rescan
            b_now, b_before = entry(tree2, "other/b.txt"), entry(tree, "other/b.txt")
            assert b_now is not None and b_before is not None
            assert b_now.root != b_before.root
            assert entry(tree2, "sub/c.txt") is None
        finally:
            registry.release(directory)

    try:
        trio.run(main)
    finally:
        registry.close()


def test_only_a_mirror_with_nothing_announced_since_its_scan_is_rescanned(tmp_path):
    root = tmp_path / "share"
    make_tree(root)
    share = Share("s", str(root))
    registry = Registry({"s": share}, tmp_path / "state")

    def follower(mode: str) -> Follower:
        upstream = Upstream(parse_url("rdc://127.0.0.1:1/s"), "t" * 20, mode)
        return Follower(registry, share, upstream, tmp_path / "state")

    directory = registry.acquire(share, "", False)
    try:
        replica = directory.replica
        tree = replica.scan()
        replica.fs.remove("sub/a.txt")  # noted: patched in, no directory listed again
        mirror, pair = follower(twoway.RECEIVE_ONLY), follower(twoway.TWO_WAY)
        for one in (mirror, pair):
            one._scanned = (5, tree)
        assert mirror._covered(5, {"sub/a.txt", "other/b.txt"}, replica)
        _list_again(replica, {"sub/a.txt", "other/b.txt"})
        assert to_list(replica.tree, replica.fs.changed) == {"", "sub", "other"}
        assert not mirror._covered(6, set(), replica)  # someone announced a change
        assert not mirror._covered(5, None, replica)  # not watched, or too many events
        assert not pair._covered(5, set(), replica)  # clients write to a two-way share
    finally:
        registry.release(directory)
        registry.close()
