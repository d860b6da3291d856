"""The storage contract as tests, run by every backend (memory, local directory, S3 on
SeaweedFS): a backend's test class inherits `StoreContract` and supplies a `store`
fixture that gives each test a fresh, empty store."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdc.errors import RdcError
from rdc.storage import (
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ShortObject,
    Store,
    StoreError,
    map_parallel,
)
from rdc.storage.s3 import MULTIPART_THRESHOLD, PART_SIZE

# Larger than S3's multipart threshold, with a part boundary inside it.
LARGE = MULTIPART_THRESHOLD + PART_SIZE // 2 + 12345


def blob(size: int, seed: int = 0) -> bytes:
    """`size` deterministic pseudo-random bytes (different seeds, different bytes)."""
    return random.Random(seed).randbytes(size)


def listed(store: Store, prefix: str = "") -> dict[str, int]:
    found = [(info.name, info.size) for info in store.list(prefix)]
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), f"listed twice: {sorted(names)}"
    return dict(found)


ODD_NAMES = [
    "a", "0", "-", "_", "a.b", "a..b", "a.", "x-", "--help", "_x_", "9" * 128,
    "deep/" * 20 + "leaf", "d/" + "e" * 128, "dot.dir/x", "mixed-._/0-._9",
]
BAD_NAMES = [
    "", "/", "/a", "a/", "a//b", ".", "..", "a/./b", "a/../b", ".hidden", "a/.tmp-1",
    "A", "a/B", "a b", "a\\b", "é", "a\x00b", "a\nb", "a:b", "x" * 129, "a/" * 300 + "b",
]


class StoreContract:
    """Tests every store must pass. Subclasses set `exclusive_create` to what the backend
    is expected to report, and provide the `store` fixture."""

    exclusive_create = True
    # Rounds of the exclusive-create race, and racers per round.
    race_rounds, racers = 5, 8

    # ------------------------------------------------------------ whole objects

    def test_put_then_get_returns_the_bytes(self, store: Store) -> None:
        data = blob(100_000, 1)
        store.put("packs/one", data)
        assert store.get("packs/one") == data
        store.put("packs/two", bytearray(b"from a bytearray"))
        store.put("packs/three", memoryview(data)[10:20])
        assert store.get("packs/two") == b"from a bytearray"
        assert store.get("packs/three") == data[10:20]
        assert isinstance(store.get("packs/three"), bytes)
        assert store.stat("packs/one") == ObjectInfo("packs/one", 100_000)
        assert store.exists("packs/one")

    def test_a_put_replaces_the_whole_object(self, store: Store) -> None:
        store.put("index/i", b"x" * 5000)
        store.put("index/i", b"short")
        assert store.get("index/i") == b"short"
        assert store.stat("index/i").size == 5
        store.put("index/i", b"y" * 7000)
        assert store.get("index/i") == b"y" * 7000
        assert listed(store) == {"index/i": 7000}

    def test_empty_object(self, store: Store) -> None:
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.stat("empty").size == 0
        assert listed(store) == {"empty": 0}
        with pytest.raises(ShortObject):
            store.get_range("empty", 0, 1)

    def test_missing_object_is_object_not_found_everywhere(self, store: Store) -> None:
        store.put("present/x", b"x")
        for call in (
            lambda: store.get("absent"),
            lambda: store.get_range("absent", 0, 1),
            lambda: store.stat("absent"),
            lambda: store.get("present"),  # a directory of objects is not an object
            lambda: store.stat("present"),
            lambda: store.get("present/x/y"),  # below an object
        ):
            with pytest.raises(ObjectNotFound) as caught:
                call()
            assert isinstance(caught.value, StoreError)
            assert isinstance(caught.value, RdcError)
            assert caught.value.exit_code == 1
            assert caught.value.name in ("absent", "present", "present/x/y")
            assert store.location in str(caught.value)
        assert not store.exists("absent")
        assert not store.exists("present")
        assert store.exists("present/x")

    def test_delete_is_idempotent_and_final(self, store: Store) -> None:
        store.put("locks/l1", b"lock")
        store.put("locks/l2", b"lock")
        store.delete("locks/l1")
        store.delete("locks/l1")
        store.delete("never/was")
        assert not store.exists("locks/l1")
        with pytest.raises(ObjectNotFound):
            store.get("locks/l1")
        assert listed(store) == {"locks/l2": 4}
        store.put("locks/l1", b"again")
        assert store.get("locks/l1") == b"again"

    # ------------------------------------------------------------ ranges

    @pytest.mark.parametrize(
        ("offset", "length"),
        [(0, 1), (0, 1000), (999, 1), (998, 2), (500, 500), (1, 998), (123, 456)],
    )
    def test_get_range_inside_the_object(self, store: Store, offset: int, length: int) -> None:
        data = blob(1000, 2)
        store.put("r", data)
        assert store.get_range("r", offset, length) == data[offset : offset + length]

    @pytest.mark.parametrize(("offset", "length"), [(0, 1001), (999, 2), (1000, 1), (5000, 10)])
    def test_get_range_past_the_end_is_short_object(
        self, store: Store, offset: int, length: int
    ) -> None:
        store.put("r", blob(1000, 2))
        with pytest.raises(ShortObject) as caught:
            store.get_range("r", offset, length)
        assert caught.value.name == "r"
        assert f"before byte {offset + length}" in str(caught.value)

    @pytest.mark.parametrize(("offset", "length"), [(-1, 5), (0, 0), (3, -2)])
    def test_bad_ranges_are_value_errors(self, store: Store, offset: int, length: int) -> None:
        store.put("r", b"abcdef")
        with pytest.raises(ValueError, match="range"):
            store.get_range("r", offset, length)

    # ------------------------------------------------------------ names and listing

    def test_odd_but_valid_names(self, store: Store) -> None:
        for i, name in enumerate(ODD_NAMES):
            store.put(name, name.encode() + bytes([i]))
        for i, name in enumerate(ODD_NAMES):
            assert store.get(name) == name.encode() + bytes([i])
        assert listed(store) == {n: len(n) + 1 for n in ODD_NAMES}

    @pytest.mark.parametrize("name", BAD_NAMES)
    def test_invalid_names_are_value_errors_before_any_io(self, store: Store, name: str) -> None:
        calls = [
            lambda: store.put(name, b"x"), lambda: store.get(name),
            lambda: store.get_range(name, 0, 1), lambda: store.stat(name),
            lambda: store.exists(name), lambda: store.delete(name),
        ]
        for call in calls:
            with pytest.raises(ValueError):
                call()
        if name:
            with pytest.raises(ValueError):
                store.list(name)
        assert listed(store) == {}

    def test_list_is_by_directory(self, store: Store) -> None:
        sizes = {"data/ab/1": 1, "data/ab/2": 2, "data/ac/3": 3, "data-x/4": 4, "database": 5,
                 "data.old/6": 6, "config": 7}
        for name, size in sizes.items():
            store.put(name, b"z" * size)
        assert listed(store) == sizes
        assert listed(store, "data") == {"data/ab/1": 1, "data/ab/2": 2, "data/ac/3": 3}
        assert listed(store, "data/ab") == {"data/ab/1": 1, "data/ab/2": 2}
        assert listed(store, "data/a") == {}
        assert listed(store, "config") == {}  # an object is not a directory
        assert listed(store, "nothing/here") == {}

    def test_list_after_delete(self, store: Store) -> None:
        names = [f"snapshots/{i:02d}" for i in range(12)]
        map_parallel(lambda n: store.put(n, n.encode()), names, workers=4)
        for name in names[::3]:
            store.delete(name)
        assert listed(store, "snapshots") == {n: len(n) for i, n in enumerate(names) if i % 3}
        for name in names:
            store.delete(name)
        assert listed(store) == {}

    def test_list_beyond_one_page(self, store: Store) -> None:
        # S3 answers a listing 1000 keys at a time: the iterator must follow the pages.
        names = [f"index/{i:04x}" for i in range(1050)]
        workers = max(store.capabilities.connections, 8)
        map_parallel(lambda n: store.put(n, b"i"), names, workers=workers)
        assert listed(store, "index") == dict.fromkeys(names, 1)

    # ------------------------------------------------------------ large objects

    def test_large_object_whole_and_by_range(self, store: Store, tmp_path: Path) -> None:
        data = blob(LARGE, 3)
        store.put("data/large", data)
        assert store.stat("data/large").size == LARGE
        assert hashlib.sha256(store.get("data/large")).digest() == hashlib.sha256(data).digest()
        for offset, length in [(PART_SIZE - 10, 20), (0, PART_SIZE + 1), (LARGE - 7, 7)]:
            assert store.get_range("data/large", offset, length) == data[offset : offset + length]
        with pytest.raises(ShortObject):
            store.get_range("data/large", LARGE - 7, 8)
        # From a file, as packs assembled on disk are stored.
        path = tmp_path / "pack"
        path.write_bytes(data[::-1])
        store.put_file("data/from-file", path)
        assert store.get("data/from-file") == data[::-1]
        assert listed(store, "data") == {"data/large": LARGE, "data/from-file": LARGE}

    def test_put_file_small_and_missing(self, store: Store, tmp_path: Path) -> None:
        path = tmp_path / "small"
        path.write_bytes(b"small file")
        store.put_file("f", path)
        assert store.get("f") == b"small file"
        with pytest.raises(FileNotFoundError):
            store.put_file("g", tmp_path / "missing")
        assert not store.exists("g")

    # ------------------------------------------------------------ exclusive create

    def test_capabilities(self, store: Store) -> None:
        caps = store.capabilities
        assert caps.exclusive_create is self.exclusive_create
        assert caps.connections >= 1

    def test_exclusive_put(self, store: Store) -> None:
        if not self.exclusive_create:
            with pytest.raises(NotImplementedError):
                store.put("locks/x", b"mine", exclusive=True)
            return
        store.put("locks/x", b"first", exclusive=True)
        with pytest.raises(ObjectExists) as caught:
            store.put("locks/x", b"second", exclusive=True)
        assert caught.value.name == "locks/x"
        assert store.get("locks/x") == b"first"
        store.delete("locks/x")
        store.put("locks/x", b"third", exclusive=True)
        assert store.get("locks/x") == b"third"
        assert listed(store) == {"locks/x": 5}

    def test_exclusive_put_race_has_one_winner(self, store: Store) -> None:
        if not self.exclusive_create:
            pytest.skip("the backend reports no exclusive create")  # never for ours
        for round_ in range(self.race_rounds):
            name = f"locks/race-{round_}"
            start = threading.Barrier(self.racers)

            def attempt(i: int, name: str = name, start: threading.Barrier = start) -> int | None:
                start.wait(timeout=10)
                try:
                    store.put(name, f"writer {i}".encode() * 50, exclusive=True)
                except ObjectExists:
                    return None
                return i

            outcomes = map_parallel(attempt, range(self.racers), workers=self.racers)
            winners = [w for w in outcomes if w is not None]
            assert len(winners) == 1, winners
            assert store.get(name) == f"writer {winners[0]}".encode() * 50

    # ------------------------------------------------------------ concurrency

    def test_many_threads_write_and_read_distinct_objects(self, store: Store) -> None:
        sizes = {f"data/{i:02x}": random.Random(i).randrange(0, 300_000) for i in range(48)}
        seeds = {name: i for i, name in enumerate(sizes)}
        map_parallel(lambda n: store.put(n, blob(sizes[n], seeds[n])), sizes, workers=8)
        got = map_parallel(store.get, list(sizes), workers=8)
        for (name, size), data in zip(sizes.items(), got, strict=True):
            assert data == blob(size, seeds[name])
        assert listed(store, "data") == sizes

    def test_readers_never_see_a_partial_object(self, store: Store) -> None:
        # Writers overwrite one name with whole versions of different sizes while readers
        # read it: every read must be exactly one version, never a mix or a prefix.
        versions = [bytes([v]) * (200_000 + 50_000 * v) for v in range(8)]
        store.put("hot", versions[0])
        stop = threading.Event()
        seen: list[int] = []

        def write(v: int) -> None:
            store.put("hot", versions[v])

        def read() -> None:
            while not stop.is_set():
                data = store.get("hot")
                assert data in versions, f"partial or mixed read of {len(data)} bytes"
                seen.append(data[0])

        with ThreadPoolExecutor(3) as pool:
            readers = [pool.submit(read) for _ in range(3)]
            try:
                map_parallel(write, [v for _ in range(3) for v in range(1, 8)], workers=4)
            finally:
                stop.set()
            for reader in readers:
                reader.result(timeout=60)
        assert len(set(seen)) > 1, "the readers saw no write happen"
        assert store.get("hot") in versions

    # ------------------------------------------------------------ against a model

    # One test run by each backend's class: an example saved by one backend and replayed
    # on another is as good a test there (differing_executors), and every example works
    # in a directory of its own of the one store the fixture gives (function_scoped_fixture).
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture, HealthCheck.differing_executors
        ],
    )
    @given(st.data())
    def test_behaves_like_a_dict(self, store: Store, data: st.DataObject) -> None:
        # Random puts, deletes and reads under a fresh directory, checked against a dict.
        # Leaves and directories use different words, so no name is both.
        root = f"model-{os.urandom(4).hex()}"
        leaves = st.sampled_from(["x", "y.z", "_w", "0"])
        dirs = st.lists(st.sampled_from(["d1", "d-2"]), max_size=2)
        names = st.builds(lambda d, leaf: "/".join([root, *d, leaf]), dirs, leaves)
        model: dict[str, bytes] = {}
        for _ in range(data.draw(st.integers(1, 12), label="steps")):
            op = data.draw(st.sampled_from(["put", "delete", "get", "range"]), label="op")
            name = data.draw(names, label="name")
            if op == "put":
                content = data.draw(st.binary(max_size=300), label="content")
                store.put(name, content)
                model[name] = content
            elif op == "delete":
                store.delete(name)
                model.pop(name, None)
            elif op == "get":
                if name in model:
                    assert store.get(name) == model[name]
                else:
                    with pytest.raises(ObjectNotFound):
                        store.get(name)
            else:
                offset = data.draw(st.integers(0, 310), label="offset")
                length = data.draw(st.integers(1, 310), label="length")
                content = model.get(name)
                if content is None:
                    with pytest.raises(ObjectNotFound):
                        store.get_range(name, offset, length)
                elif offset + length > len(content):
                    with pytest.raises(ShortObject):
                        store.get_range(name, offset, length)
                else:
                    assert store.get_range(name, offset, length) == content[offset:][:length]
        assert listed(store, root) == {n: len(c) for n, c in model.items()}


__all__ = ["BAD_NAMES", "LARGE", "ODD_NAMES", "StoreContract", "blob", "listed"]
