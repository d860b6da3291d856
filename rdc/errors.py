"""Errors a user can act on. Each class's docstring is its message template; each carries
the exit status the command line returns for it. Bugs are not RdcErrors."""

from __future__ import annotations

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


EXIT_OK = 0
EXIT_CODES = {
    0: "success",
    1: "error",
    2: "usage error (bad arguments or options)",
    3: "some files could not be read or written; the rest was done",
}
