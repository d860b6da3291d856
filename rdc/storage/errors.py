"""What a store reports when a call fails. Each class's docstring is its message template.

Every failure a user can meet is a `StoreError` (an `RdcError`, so the command line prints
one line and exits with the class's code). A bad object name or argument is a bug in the
caller and raises `ValueError` instead, before any I/O.
"""

from __future__ import annotations

from rdc.errors import AccessDenied, ConnectionFailed, RdcError, UsageError


class StoreError(RdcError):
    """{location}: {message}"""

    exit_code = 1


class ObjectNotFound(StoreError):
    """{location}: no object {name}"""

    def __init__(self, *, location: str, name: str) -> None:
        self.name = name
        super().__init__(location=location, name=name)


class ObjectExists(StoreError):
    """{location}: {name} exists already"""

    def __init__(self, *, location: str, name: str) -> None:
        self.name = name
        super().__init__(location=location, name=name)


class ShortObject(StoreError):
    """{location}: {name} ends before byte {end} (a read of {length} bytes at {offset})"""

    def __init__(self, *, location: str, name: str, offset: int, length: int) -> None:
        self.name = name
        super().__init__(
            location=location, name=name, offset=offset, length=length, end=offset + length
        )


class StoreMissing(StoreError):
    """{location}: {message}"""


class StoreAccessDenied(StoreError):
    """{location}: access denied: {message}"""

    exit_code = AccessDenied.exit_code


class StoreUnavailable(StoreError):
    """{location}: cannot reach the store: {message}"""

    exit_code = ConnectionFailed.exit_code


class InvalidStoreUrl(UsageError):
    """invalid store location {url!r}: {message}"""


__all__ = [
    "InvalidStoreUrl",
    "ObjectExists",
    "ObjectNotFound",
    "ShortObject",
    "StoreAccessDenied",
    "StoreError",
    "StoreMissing",
    "StoreUnavailable",
]
