"""Errors a user can act on. Each class's docstring is its message template; each carries
the exit status the command line returns for it. Bugs are not RdcErrors."""

from __future__ import annotations

import errno
from typing import ClassVar


class RdcError(Exception):
    """{message}"""

    exit_code: ClassVar[int] = 1

    def __init__(self, **fields: object) -> None:
        self.fields = fields
        super().__init__(self.render())

    def render(self) -> str:
        return (self.__doc__ or "{message}").strip().format(**self.fields)


class UsageError(RdcError):
    """{message}"""

    exit_code = 2


class FileAccessError(RdcError):
    """cannot read {path}: {reason}"""

    exit_code = 3


class FileWriteError(RdcError):
    """cannot write {path}: {reason}"""

    exit_code = 3


class ProtocolError(RdcError):
    """protocol error: {message}"""

    exit_code = 6


class ConnectionFailed(RdcError):
    """{message}"""

    exit_code = 5


class AccessDenied(RdcError):
    """{message}"""

    exit_code = 4


class Refusal(RdcError):
    """{message}"""

    # Exit status by wire error code (docs/protocol.md section 4); others exit 1.
    CODE_EXIT: ClassVar[dict[str, int]] = {
        "auth": 4, "share": 4, "readonly": 4, "protocol": 6, "version": 6, "busy": 5,
        "full": 9,
    }

    def __init__(self, code: str = "internal", **fields: object) -> None:
        self.code = code
        self.exit_code = self.CODE_EXIT.get(code, 1)  # type: ignore[misc]
        super().__init__(**fields)


class RemoteError(Refusal):
    """{message}"""


# The exit status of a run in which some files could not be read or written (the rest was
# done); the others are the error classes' own (the README lists them all).
EXIT_PARTIAL = 3
# A deletion guard stopped a run's deletions (rdc.transfer.guards); the rest was done.
EXIT_DELETE_REFUSED = 7
# ``rdc verify`` found files whose content does not match their index.
EXIT_MISMATCH = 8


class NoSpace(RdcError):
    """no space left {message}"""

    exit_code = 9
    code = "full"  # its code on the wire (docs/protocol.md section 4)


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says a disk is full: ENOSPC or EDQUOT, or SQLite's SQLITE_FULL
    ("database or disk is full"). Such an error is no one file's: it ends the run."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == 13  # SQLITE_FULL
