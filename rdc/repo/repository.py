"""A repository opened: its store, config and keys, the local index kept in step with its
index objects, reading blobs (checked against their ids), snapshots, and locks."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import blake3

from rdc.content.tree import node_hash
from rdc.params import FORMAT, mismatch
from rdc.repo import codec, msg
from rdc.repo.blobs import READ_DEPTH, Encoding, Kind, meta_id
from rdc.repo.cache import LocalIndex, Location, default_location
from rdc.repo.crypto import (
    Crypto,
    MasterKeys,
    Plain,
    Sealed,
    Unauthentic,
    make_key_object,
    open_key_object,
)
from rdc.repo.errors import (
    CorruptRepo,
    PassphraseNeeded,
    RemoteRepoNotYet,
    RepoError,
    RepoExists,
    RepoNotFound,
    SnapshotNotFound,
    WrongPassphrase,
)
from rdc.repo.indexfile import decode_index
from rdc.repo.locks import Lock
from rdc.repo.packs import pack_name, record_aad
from rdc.repo.snapshots import PREFIX, Snapshot, decode_snapshot, encode_snapshot, find
from rdc.repo.trees import DirEntry, content_hash, decode_dir, decode_node
from rdc.storage import ObjectNotFound, Store, StoreMissing, map_parallel, open_store

CONFIG = "config"
FORMAT_NAME = "rdc-repository"
VERSION = 1
CIPHER = "chacha20-poly1305"
# Decoded blobs kept for reuse: delta bases, and tree blobs met again.
LRU_BYTES = 64 << 20
DIRS_KEPT = 4096  # parsed dir blobs kept
# Tree packs are read whole and kept: a walk reads thousands of small tree blobs, which on
# object storage would be as many requests.
TREE_PACK_BYTES = 64 << 20

Passphrase = Callable[[], bytes]


def _store(location: str, create: bool = False) -> Store:
    if location.startswith("rdc://"):
        raise RemoteRepoNotYet(location=location)
    try:
        return open_store(location, create=create)
    except StoreMissing:
        raise RepoNotFound(location=location) from None


def plain_id_of(kind: Kind, content: bytes, dirs: dict | None = None) -> bytes:
    """The plain id a blob of ``kind`` with ``content`` has; ValueError if malformed. A dir
    blob's decoded entries are put in ``dirs`` (by plain id), so they are parsed once."""
    if kind is Kind.CHUNK:
        return blake3.blake3(content).digest()
    if kind is Kind.NODE:
        level, hashes, lengths = decode_node(content)
        return node_hash(level, hashes, lengths)
    if kind is Kind.DIR:
        entries = decode_dir(content)
        plain_id = content_hash(entries)
        if dirs is not None:
            dirs[plain_id] = entries
        return plain_id
    return meta_id(content)


class Repository:
    """One repository. Blocking calls; safe to share between threads."""

    def __init__(self, location: str, store: Store, config: dict, crypto: Crypto) -> None:
        self.location = location
        self.store = store
        self.config = config
        self.id: str = config["id"]
        self.crypto = crypto
        self._index: LocalIndex | None = None
        self._lru: OrderedDict[bytes, bytes] = OrderedDict()
        self._lru_bytes = 0
        self._dirs: OrderedDict[bytes, list[DirEntry]] = OrderedDict()
        self._tree_packs: OrderedDict[bytes, bytes] = OrderedDict()
        self._tree_pack_bytes = 0
        self._pack_lock = threading.Lock()
        self._synced = False

    # ------------------------------------------------------------ opening

    @classmethod
    def init(cls, location: str, passphrase: bytes | None = None,
             store: Store | None = None) -> Repository:
        """Make a new repository at ``location`` (encrypted if a passphrase is given), or in
        ``store`` if given (an ``rdc://`` one, which the client opens)."""
        store = store or _store(location, create=True)
        if store.exists(CONFIG) or next(iter(store.list()), None) is not None:
            raise RepoExists(location=store.location,
                             message="not empty: a repository, or other objects, are here")
        repo_id = secrets.token_hex(16)
        crypto: Crypto = Plain()
        if passphrase is not None:
            keys = MasterKeys.generate()
            store.put(f"keys/{secrets.token_hex(16)}", make_key_object(passphrase, repo_id, keys))
            crypto = Sealed(keys)
        config = {"format": FORMAT_NAME, "version": VERSION, "id": repo_id, "params": FORMAT,
                  "encryption": CIPHER if passphrase is not None else "none",
                  "created": time.time_ns()}
        store.put(CONFIG, msg.pack(config))  # last: its presence marks a repository
        return cls(store.location, store, config, crypto)

    @classmethod
    def open(cls, location: str, passphrase: Passphrase | None = None,
             store: Store | None = None) -> Repository:
        """Open the repository at ``location`` (or in ``store``, if given); ``passphrase``
        is asked for only if it is encrypted."""
        store = store or _store(location)
        try:
            raw = store.get(CONFIG)
        except ObjectNotFound:
            raise RepoNotFound(location=store.location) from None
        config = _parse_config(store.location, raw)
        crypto: Crypto = Plain()
        if config["encryption"] != "none":
            if passphrase is None:
                raise PassphraseNeeded(location=store.location)
            crypto = Sealed(_unlock(store, config["id"], passphrase()))
        return cls(store.location, store, config, crypto)

    @property
    def index(self) -> LocalIndex:
        if self._index is None:
            self._index = LocalIndex(default_location(self.id), self.id)
        return self._index

    def close(self) -> None:
        """Close the local index, and the store if it holds a connection."""
        if self._index is not None:
            self._index.close()
            self._index = None
        close_store = getattr(self.store, "close", None)
        if close_store is not None:
            close_store()

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lock(self, kind: str, command: str) -> Lock:
        return Lock(self.store, kind, command)

    # ------------------------------------------------------------ the local index

    def sync_index(self) -> None:
        """Bring the local index in step with the repository's index objects: drop what
        left, read what is new (in parallel)."""
        names = {info.name for info in self.store.list("index")}
        known = self.index.index_objects()
        self.index.drop_indexes(known - names)
        new = sorted(names - known)
        workers = self.store.capabilities.connections

        def fetch(name: str) -> tuple[str, list]:
            try:
                return name, decode_index(self.store.get(name), self.crypto)
            except ObjectNotFound:
                return name, []  # deleted meanwhile (a prune)
            except (ValueError, Unauthentic) as exc:
                raise CorruptRepo(location=self.location,
                                  message=f"{name} does not read: {exc}") from None

        for start in range(0, len(new), 64):
            for name, packs in map_parallel(fetch, new[start : start + 64], workers=workers):
                if packs:
                    self.index.add_index(name, packs)
        self._synced = True

    # ------------------------------------------------------------ reading blobs

    def locate(self, sid: bytes) -> Location:
        location = self.index.locate(sid)
        if location is None:
            raise CorruptRepo(location=self.location,
                              message=f"blob {sid.hex()[:16]} is not in the index")
        return location

    def read_record(self, location: Location) -> bytes:
        """The sealed record at ``location`` (a tree blob's from its whole pack, kept)."""
        entry = location.entry
        if entry.kind is not Kind.CHUNK:
            pack = self._tree_pack(location.pack_id)
            if pack is not None and entry.end <= len(pack):
                return pack[entry.offset : entry.end]
        return self.store.get_range(pack_name(location.pack_id), entry.offset, entry.length)

    def _tree_pack(self, pack_id: bytes) -> bytes | None:
        with self._pack_lock:
            data = self._tree_packs.get(pack_id)
            if data is not None:
                self._tree_packs.move_to_end(pack_id)
                return data
        size = self.index.pack_size(pack_id)
        if size is None or size > TREE_PACK_BYTES // 4:
            return None
        data = self.store.get(pack_name(pack_id))
        with self._pack_lock:
            self._tree_packs[pack_id] = data
            self._tree_pack_bytes += len(data)
            while self._tree_pack_bytes > TREE_PACK_BYTES:
                _, old = self._tree_packs.popitem(last=False)
                self._tree_pack_bytes -= len(old)
        return data

    def decode(self, location: Location, sealed: bytes,
               base_of: Callable[[bytes], bytes] | None = None) -> bytes:
        """The blob a sealed record holds, checked against its storage id. Deltas get their
        base from ``base_of`` (default: `load_sid`)."""
        entry = location.entry
        try:
            record = self.crypto.open(sealed, record_aad(entry.kind, entry.sid))
            base = None
            if entry.encoding is Encoding.DELTA:
                assert entry.base is not None
                base = (base_of or self.load_sid)(entry.base)
            plain = codec.decode(entry.encoding, record, entry.size, base)
            if self.crypto.storage_id(plain_id_of(entry.kind, plain, self._dirs)) != entry.sid:
                raise ValueError("content does not match its id")
        except (ValueError, Unauthentic) as exc:
            raise CorruptRepo(
                location=self.location,
                message=f"{pack_name(location.pack_id)}: {entry.kind.name.lower()} "
                f"{entry.sid.hex()[:16]} at byte {entry.offset}: {exc}") from None
        return plain

    def load_sid(self, sid: bytes, kind: Kind | None = None, _depth: int = 0) -> bytes:
        """The blob stored under ``sid`` (of ``kind``, if given), checked, deltas resolved
        through their bases."""
        cached = self._lru.get(sid)
        if cached is not None:
            self._lru.move_to_end(sid)
            return cached
        if _depth > READ_DEPTH:
            raise CorruptRepo(location=self.location,
                              message=f"delta chain through {sid.hex()[:16]} is too deep")
        location = self.locate(sid)
        if kind is not None and location.entry.kind is not kind:
            raise CorruptRepo(location=self.location,
                              message=f"blob {sid.hex()[:16]} is a "
                              f"{location.entry.kind.name.lower()}, not a {kind.name.lower()}")
        plain = self.decode(location, self.read_record(location),
                            lambda base: self.load_sid(base, None, _depth + 1))
        self.remember(sid, plain)
        return plain

    def remember(self, sid: bytes, plain: bytes) -> None:
        self._lru[sid] = plain
        self._lru_bytes += len(plain)
        while self._lru_bytes > LRU_BYTES and self._lru:
            _, old = self._lru.popitem(last=False)
            self._lru_bytes -= len(old)

    def load_dir(self, plain_id: bytes) -> list[DirEntry]:
        """The entries of a dir blob, checked (parsed once: decoding checks the id)."""
        entries = self._dirs.pop(plain_id, None)
        if entries is None:
            self.load_sid(self.crypto.storage_id(plain_id), Kind.DIR)
            entries = self._dirs.pop(plain_id, None)
            if entries is None:  # it came from the LRU: parse it again
                entries = decode_dir(self.load(Kind.DIR, plain_id))
        self._dirs[plain_id] = entries
        while len(self._dirs) > DIRS_KEPT:
            self._dirs.popitem(last=False)
        return entries

    def load(self, kind: Kind, plain_id: bytes) -> bytes:
        """The blob of ``kind`` whose plain id is ``plain_id`` (a `trees.BlobLoader`)."""
        return self.load_sid(self.crypto.storage_id(plain_id), kind)

    # ------------------------------------------------------------ snapshots

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot, records cached locally once read."""
        names = {info.name[len(PREFIX):] for info in self.store.list(PREFIX.rstrip("/"))}
        cached = self.index.snapshot_records()
        self.index.drop_snapshots(set(cached) - names)
        missing = sorted(names - set(cached))

        def fetch(name: str) -> tuple[str, bytes | None]:
            try:
                return name, self.store.get(PREFIX + name)
            except ObjectNotFound:
                return name, None

        fetched = {n: d for n, d in map_parallel(fetch, missing,
                                                 workers=self.store.capabilities.connections)
                   if d is not None}
        self.index.put_snapshots(fetched)
        out = []
        for name, data in {**{n: cached[n] for n in names & set(cached)}, **fetched}.items():
            try:
                out.append(decode_snapshot(name, data, self.crypto))
            except (ValueError, Unauthentic) as exc:
                raise CorruptRepo(location=self.location,
                                  message=f"{PREFIX}{name} does not read: {exc}") from None
        return out

    def find_snapshot(self, spec: str, snapshots: list[Snapshot] | None = None) -> Snapshot:
        found = find(self.snapshots() if snapshots is None else snapshots, spec)
        if isinstance(found, str):
            raise SnapshotNotFound(location=self.location, message=found)
        return found

    def write_snapshot(self, snap: Snapshot) -> str:
        name, data = encode_snapshot(snap, self.crypto)
        self.store.put(PREFIX + name, data)
        snap.name = name
        self.index.put_snapshots({name: data})
        return name

    def delete_snapshot(self, name: str) -> None:
        self.store.delete(PREFIX + name)
        self.index.drop_snapshots([name])


def _parse_config(location: str, raw: bytes) -> dict:
    try:
        config = msg.unpack(raw)
    except ValueError:
        config = None
    if not isinstance(config, dict) or config.get("format") != FORMAT_NAME:
        raise RepoError(location=location, message="config is not an rdc repository's")
    if config.get("version") != VERSION:
        raise RepoError(location=location,
                        message=f"repository format {config.get('version')}: this rdc reads "
                        f"format {VERSION}")
    if config.get("params") != FORMAT:
        raise RepoError(location=location,
                        message="made with other format parameters: "
                        + mismatch(FORMAT, str(config.get("params"))))
    if config.get("encryption") not in ("none", CIPHER) or not isinstance(config.get("id"), str):
        raise RepoError(location=location, message="config with unknown encryption or no id")
    return config


def _unlock(store: Store, repo_id: str, passphrase: bytes) -> MasterKeys:
    names = sorted(info.name for info in store.list("keys"))
    if not names:
        raise CorruptRepo(location=store.location, message="encrypted, but no key is stored")
    for name in names:
        try:
            keys = open_key_object(store.get(name), passphrase, repo_id)
        except ValueError as exc:
            raise CorruptRepo(location=store.location, message=f"{name}: {exc}") from None
        if keys is not None:
            return keys
    raise WrongPassphrase(location=store.location)

