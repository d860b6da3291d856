"""The daemon's share registry: one replica per opened directory, whoever opens it."""

from __future__ import annotations

import pytest
import trio

from rdc_server.shares import Registry, Rights, Share


def test_connections_opening_one_directory_at_once_share_its_replica(tmp_path) -> None:
    """Its lock is what keeps the connections' writes apart: two replicas would mean two
    locks and two index connections racing to create one database."""
    (tmp_path / "share" / "sub").mkdir(parents=True)
    registry = Registry({"s": Share("s", str(tmp_path / "share"))}, tmp_path / "state")
    shares = registry.for_client(Rights())

    async def main() -> list:
        opened: list = []

        async def open_one(path: str) -> None:
            opened.append(await shares.open("s", path, write=True, create=False))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(open_one, "sub")
                nursery.start_soon(open_one, "")
        return opened

    try:
        for _ in range(5):
            opened = trio.run(main)
            for path in ("sub", ""):
                mine = [o for o in opened if o.replica.root.endswith(path or "share")]
                assert len(mine) == 8
                assert len({id(o.replica) for o in mine}) == 1
                assert len({id(o.lock) for o in mine}) == 1
    finally:
        registry.close()


def test_a_replaced_directory_gets_a_new_replica_and_a_symlink_none(tmp_path) -> None:
    """The registry reaches the opened directory anew at every open: the cached replica
    is reused only while it is still that directory. A symlink put in its place is
    refused; a new directory in its place gets a replica of its own."""
    import os

    import pytest

    from rdc.errors import Refusal

    share, outside = tmp_path / "share", tmp_path / "outside"
    (share / "sub").mkdir(parents=True)
    outside.mkdir()
    registry = Registry({"s": Share("s", str(share))}, tmp_path / "state")
    shares = registry.for_client(Rights())

    async def main() -> None:
        first = await shares.open("s", "sub", write=True, create=False)
        again = await shares.open("s", "sub", write=True, create=False)
        assert first.replica is again.replica
        os.rename(share / "sub", share / "old")
        os.symlink(outside, share / "sub")
        with pytest.raises(Refusal, match="symlink"):
            await shares.open("s", "sub", write=True, create=False)
        os.unlink(share / "sub")
        (share / "sub").mkdir()
        fresh = await shares.open("s", "sub", write=True, create=False)
        assert fresh.replica is not first.replica
        assert first.replica.fs.identity() == (os.stat(share / "old").st_dev,
                                               os.stat(share / "old").st_ino)
        for opened in (first, again, fresh):
            opened.release()
        assert not registry._open  # the last user closed each replica

    try:
        trio.run(main)
    finally:
        registry.close()


def test_a_read_only_open_with_a_read_write_token_is_not_writable(tmp_path) -> None:
    (tmp_path / "share").mkdir()
    registry = Registry({"s": Share("s", str(tmp_path / "share"))}, tmp_path / "state")

    async def main() -> None:
        shares = registry.for_client(Rights())
        reading = await shares.open("s", "", write=False, create=False)
        writing = await shares.open("s", "", write=True, create=False)
        assert (reading.writable, writing.writable) == (False, True)
        reading.release()
        writing.release()

    try:
        trio.run(main)
    finally:
        registry.close()


def test_connection_limits() -> None:
    from rdc_server.limits import MAX_UNAUTHENTICATED_PER_ADDRESS, Limits

    limits = Limits(total=5, per_address=3)
    for _ in range(3):
        assert limits.admit("a") is None
        limits.authenticated("a")
    assert "from a" in limits.admit("a")
    assert limits.admit("b") is None and limits.admit("c") is None
    assert "too many connections" in limits.admit("d")
    limits.leave("b", authenticated=False)
    limits.leave("a", authenticated=True)
    assert limits.open.total() == 3 and limits.unauthenticated.total() == 1
    wide = Limits(total=1000, per_address=1000)
    for _ in range(MAX_UNAUTHENTICATED_PER_ADDRESS):
        assert wide.admit("x") is None
    assert "logging in" in wide.admit("x")


def test_the_daemon_raises_its_descriptor_limit_and_says_when_it_is_short(caplog) -> None:
    """Started with the usual soft limit of 1,024, the daemon takes the hard limit (four
    batch writes alone hold 2,048 descriptors); below what its connections may need, it
    warns."""
    import resource

    from rdc_server import limits

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip("the hard limit leaves nothing to raise")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        with caplog.at_level("WARNING", logger="rdc.serve"):
            got = limits.raise_descriptor_limit(1)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == got > 1024
        assert not caplog.records
        with caplog.at_level("WARNING", logger="rdc.serve"):
            limits.raise_descriptor_limit(got)  # more connections than it could hold
        assert "lower --max-connections" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
