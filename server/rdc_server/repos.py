"""Repositories the daemon exports (``--repo NAME=LOCATION``, ``[repos]``): each is a
`Store` (a directory or an S3 location, as `open_store` takes it) that clients reach as
``rdc://HOST[:PORT]/NAME`` and use through `rdc_server.storeserving`."""

from __future__ import annotations

import os
import threading

import trio

from rdc.errors import Refusal, UsageError
from rdc.records import record
from rdc.storage import Store, StoreError, open_store
from rdc.storage.location import S3_SCHEMES
from rdc_server.shares import Rights


@record
class Repo:
    """An exported repository: its name, where its store is, and whether it is read-only
    for everyone (a token's grant can only narrow it)."""

    name: str
    location: str  # an absolute directory path or an s3:// URL
    readonly: bool = False


def parse_repo(text: str, readonly: bool = False) -> Repo:
    """``NAME=LOCATION``."""
    name, sep, location = text.partition("=")
    if not sep or not name or not location:
        raise UsageError(message=f"a repository is NAME=LOCATION, not {text!r}")
    return make_repo(name, location, readonly)


def make_repo(name: str, location: str, readonly: bool) -> Repo:
    if "/" in name or name in (".", "..") or len(name.encode()) > 255 or not name.isprintable():
        raise UsageError(message=f"bad repository name {name!r}")
    if not location.startswith(S3_SCHEMES):
        _, sep, _ = location.partition("://")
        if sep:
            raise UsageError(message=f"repository {name!r}: {location} is neither a directory "
                             "nor an s3:// or s3+https:// URL")
        location = os.path.abspath(os.path.expanduser(location))
        if os.path.exists(location) and not os.path.isdir(location):
            raise UsageError(message=f"repository {name!r}: {location} is not a directory")
    return Repo(name, location, readonly)


class RepoRegistry:
    """The exported repositories and their stores, each opened on first use (made if
    missing: ``rdc init`` over the network needs the directory or bucket) and then kept."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self._stores: dict[str, Store] = {}
        self._lock = threading.Lock()

    def store(self, repo: Repo) -> Store:
        """The store of ``repo`` (blocking: run it on a worker thread). Refusal ``io`` if
        it cannot be opened."""
        with self._lock:
            store = self._stores.get(repo.name)
            if store is None:
                try:
                    store = open_store(repo.location, create=not repo.readonly)
                except StoreError as exc:
                    raise Refusal("io", message=f"repository {repo.name!r}: {exc}") from None
                self._stores[repo.name] = store
            return store

    def for_client(self, rights: Rights) -> ClientRepos:
        return ClientRepos(self, rights)


@record
class OpenedRepo:
    """One connection's repository: its store and whether this token may write it."""

    name: str
    store: Store
    writable: bool


class ClientRepos:
    """The repositories as one client's token sees them."""

    def __init__(self, registry: RepoRegistry, rights: Rights) -> None:
        self.registry = registry
        self.rights = rights

    async def open(self, name: str) -> OpenedRepo:
        """The repository ``name``; Refusal ``repo`` if there is none or not for this
        token (the same words either way: a token learns nothing of others' names)."""
        repo = self.registry.repos.get(name)
        mode = self.rights.mode(repo) if repo is not None else None  # type: ignore[arg-type]
        if repo is None or mode is None:
            raise Refusal("repo", message=f"no repository {name!r} (or not for this token)")
        store = await trio.to_thread.run_sync(self.registry.store, repo)
        return OpenedRepo(name, store, writable=mode == "rw")
