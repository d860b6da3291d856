"""The daemon's share registry: one replica per opened directory, whoever opens it."""

from __future__ import annotations

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
