"""The storage contract on `RemoteStore`, through a real ``rdc serve`` on 127.0.0.1 that
exports a directory repository; and what the server refuses whatever the client sends:
names that would leave the repository, writes with a read-only token, unknown names,
oversized puts."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdc.storage import Store, StoreAccessDenied, StoreError, StoreMissing
from rdc.wire import messages as m
from rdc_client.remote_store import RemoteStore, parse_repo_url
from rdc_server.storeserving import MAX_OBJECT

from .e2e_support import E2E, OTHER_TOKEN, TOKEN, Server
from .storage_contract import StoreContract, listed

HOSTILE_NAMES = ["../escape", "../../tmp/escape", "/tmp/escape", "a/../../escape", "..",
                 "a/./b", ".tmp-x", "A", "a//b", ""]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[E2E, Server, Path]]:
    """One server for the module: repository ``bk`` (read-write for TOKEN, read-only for
    OTHER_TOKEN) in a directory that each test empties."""
    tmp = tmp_path_factory.mktemp("remote")
    world = E2E(tmp)
    (tmp / "tokens").write_text(f"{TOKEN}\n{OTHER_TOKEN} bk:ro\n")
    repo = tmp / "srv" / "bk"
    server = world.serve({}, None, "--repo", f"bk={repo}")
    try:
        yield world, server, repo
    finally:
        world.close()


def connect(server: Server, name: str = "bk", token: str = TOKEN) -> RemoteStore:
    return RemoteStore(parse_repo_url(server.url(name)), token)


@pytest.fixture
def remote(world: tuple[E2E, Server, Path]) -> Iterator[tuple[RemoteStore, Path]]:
    _, server, repo = world
    if repo.exists():
        for entry in repo.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    store = connect(server)
    try:
        yield store, repo
    finally:
        store.close()


class TestRemoteStore(StoreContract):
    @pytest.fixture
    def store(self, remote: tuple[RemoteStore, Path]) -> Store:
        return remote[0]


def test_objects_land_in_the_repository_directory(remote: tuple[RemoteStore, Path]) -> None:
    store, repo = remote
    store.put("data/ab/x", b"content")
    assert (repo / "data" / "ab" / "x").read_bytes() == b"content"


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_name_that_would_leave_the_repository_is_refused(
    remote: tuple[RemoteStore, Path], name: str
) -> None:
    """The client's own check is bypassed (a hostile client sends what it likes): the
    server refuses every call with the name, and nothing appears outside the repository."""
    store, repo = remote
    outside = repo.parent / "escape"
    before = sorted(p.name for p in repo.parent.parent.rglob("*"))
    calls = [(store._call_put, name, memoryview(b"evil"), False),
             (store._receive_object, m.StoreGet(name=name), 100),
             (store._request, m.StoreStat(name=name), m.Objects),
             (store._request, m.StoreDelete(name=name), m.Ok)]
    if name:  # "" is every object, a valid prefix
        calls.append((store._request, m.StoreList(prefix=name), m.Objects))
    for call in calls:
        with pytest.raises(StoreError, match="the server refused a name"):
            store._run(*call)
    assert not outside.exists() and not Path("/tmp/escape").exists()
    assert sorted(p.name for p in repo.parent.parent.rglob("*")) == before
    store.put("still/works", b"ok")  # the connection goes on
    assert store.get("still/works") == b"ok"


def test_a_read_only_token_reads_but_cannot_write(
    world: tuple[E2E, Server, Path], remote: tuple[RemoteStore, Path]
) -> None:
    _, server, _ = world
    writer, _ = remote
    writer.put("snapshots/one", b"snap")
    with connect(server, token=OTHER_TOKEN) as reader:
        assert not reader.writable and writer.writable
        assert reader.get("snapshots/one") == b"snap"
        assert reader.get_range("snapshots/one", 1, 2) == b"na"
        assert reader.stat("snapshots/one").size == 4
        assert listed(reader) == {"snapshots/one": 4}
        for call in (lambda: reader.put("snapshots/two", b"x"),
                     lambda: reader.put("locks/l", b"x", exclusive=True),
                     lambda: reader.delete("snapshots/one")):
            with pytest.raises(StoreAccessDenied, match="read-only for this token"):
                call()
    assert listed(writer) == {"snapshots/one": 4}


def test_an_unknown_repository_is_refused_by_name(world: tuple[E2E, Server, Path]) -> None:
    _, server, _ = world
    with pytest.raises(StoreMissing, match="no repository 'nope'"):
        connect(server, "nope")


def test_a_put_over_the_limit_is_refused_before_it_travels(
    remote: tuple[RemoteStore, Path]
) -> None:
    store, repo = remote
    assert store.opened is not None and store.opened.max_object == MAX_OBJECT
    # Announce more than the limit with a small body: the server refuses on the size.
    async def announce() -> None:
        conversation = store._connection.start(
            m.StorePut(name="data/big", size=MAX_OBJECT + 1))
        try:
            await conversation.receive(m.Ok)
        finally:
            conversation.close()

    with pytest.raises(StoreError, match="at most"):
        store._run(announce)
    assert not (repo / "data").exists()


def test_calls_after_close_are_unavailable(world: tuple[E2E, Server, Path]) -> None:
    _, server, _ = world
    store = connect(server)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get("config")
