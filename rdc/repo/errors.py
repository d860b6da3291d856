"""What repository commands report. Each class's docstring is its message template; each
carries the exit status the command line returns for it."""

from __future__ import annotations

from rdc.errors import AccessDenied, RdcError, UsageError


class RepoError(RdcError):
    """{location}: {message}"""

    exit_code = 1


class RepoNotFound(RepoError):
    """{location}: no rdc repository here (rdc init makes one)"""


class RepoExists(RepoError):
    """{location}: {message}"""


class CorruptRepo(RepoError):
    """{location}: {message}"""


class RepoLocked(RepoError):
    """{location}: {message}"""


class SnapshotNotFound(RepoError):
    """{location}: {message}"""


class WrongPassphrase(RepoError):
    """{location}: wrong passphrase (no key of this repository opens with it)"""

    exit_code = AccessDenied.exit_code


class PassphraseNeeded(UsageError):
    """{location}: the repository is encrypted: {hint}"""

    def __init__(self, *, location: str) -> None:
        super().__init__(location=location,
                         hint="set RDC_PASSWORD or RDC_PASSWORD_FILE, or give --password-file")


class RemoteRepoNotYet(UsageError):
    """{location}: a repository behind rdc serve needs a connection: {hint}"""

    def __init__(self, *, location: str) -> None:
        super().__init__(location=location, hint="the rdc command reaches them; in "
                         "code, open rdc_client.remote_store.RemoteStore and pass it as store")


__all__ = [
    "CorruptRepo",
    "PassphraseNeeded",
    "RemoteRepoNotYet",
    "RepoError",
    "RepoExists",
    "RepoLocked",
    "RepoNotFound",
    "SnapshotNotFound",
    "WrongPassphrase",
]
