"""`open_store`: from a location the user typed to a `Store`."""

from __future__ import annotations

import os

from rdc.storage.base import Store
from rdc.storage.errors import InvalidStoreUrl
from rdc.storage.local import LocalStore

S3_SCHEMES = ("s3://", "s3+https://")


def open_store(location: str | os.PathLike[str], *, create: bool = False) -> Store:
    """The store at `location`: `s3://HOST[:PORT]/BUCKET[/PREFIX]` (HTTP),
    `s3+https://...`, or a local directory path (`file://` is not needed and not taken).

    With `create`, a missing directory or bucket is made; without, it is `StoreMissing`.
    Other URL schemes are `InvalidStoreUrl` (exit code 2), so a typo such as `s4://` is
    not taken for a relative path.
    """
    text = os.fspath(location)
    if text.startswith(S3_SCHEMES):
        from rdc.storage.s3 import S3Store  # obstore only loads when S3 is used

        return S3Store(text, create=create)
    scheme, sep, _ = text.partition("://")
    if sep and scheme.replace("+", "").isalnum():
        raise InvalidStoreUrl(url=text, message="use s3://, s3+https:// or a directory path")
    if not text:
        raise InvalidStoreUrl(url=text, message="empty location")
    return LocalStore(text, create=create)
