"""The storage contract on `MemoryStore`, and the package's exports."""

from __future__ import annotations

import pytest

import rdc.storage
from rdc.storage import MemoryStore, Store

from .storage_contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> Store:
        return MemoryStore()


def test_exports_exist_and_are_listed() -> None:
    public = {name for name in dir(rdc.storage) if not name.startswith("_")}
    modules = {"base", "errors", "local", "location", "memory", "parallel", "s3", "s3config"}
    assert public - modules == set(rdc.storage.__all__)
