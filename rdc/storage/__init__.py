"""Storage for backup repositories: the `Store` contract and its backends (memory, local
directory, S3). Imports only the standard library, `rdc.errors` and obstore (for S3)."""

from rdc.storage.base import Capabilities, Data, ObjectInfo, Store, check_name, is_name
from rdc.storage.errors import (
    InvalidStoreUrl,
    ObjectExists,
    ObjectNotFound,
    ShortObject,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreUnavailable,
)
from rdc.storage.local import LocalStore
from rdc.storage.location import open_store
from rdc.storage.memory import MemoryStore
from rdc.storage.parallel import map_parallel

# S3Store lives in rdc.storage.s3 and is not imported here: obstore loads only when used.
__all__ = [
    "Capabilities",
    "Data",
    "InvalidStoreUrl",
    "LocalStore",
    "MemoryStore",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ShortObject",
    "Store",
    "StoreAccessDenied",
    "StoreError",
    "StoreMissing",
    "StoreUnavailable",
    "check_name",
    "is_name",
    "map_parallel",
    "open_store",
]
