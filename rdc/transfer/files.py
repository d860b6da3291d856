"""Moving one file between this machine and the server, from the client's side: a push
offers a local file (the client is the source), a pull asks for a remote one (the client
is the target). The exchanges themselves are `rdc.transfer.source` and
`rdc.transfer.target`, which the server runs in the other role."""

from __future__ import annotations

import dataclasses
import os

import trio

from rdc.errors import Refusal, RemoteError
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.local.verify import CHANGED, Finding, recheck
from rdc.transfer.descent import SourceChanged, SourceFile
from rdc.transfer.source import make_offer, serve_wants
from rdc.transfer.stats import Stats
from rdc.transfer.target import receive_file
from rdc.wire import messages as m
from rdc.wire.connection import Connection


def _expect(digest: bytes | None) -> m.Expected:
    """What the other side holds at the path: nothing, or a file with this root prefix."""
    return m.NOTHING if digest is None else m.Expected("f", digest)


async def push_file(
    connection: Connection, replica: Replica, path: str, there: bytes | None, stats: Stats,
    again: bool = True,
) -> bool:
    """Offer the local file at ``path`` to the server, which holds the version whose root
    starts with ``there`` (None: nothing) and must still hold it when the new one lands.
    The outcome is counted in ``stats``; True if the file arrived. A file found to differ
    from its index while it was sent is read again and (``again``) offered once more."""
    outcome = await _push(connection, replica, path, there, stats)
    if outcome is not _CHANGED:
        return outcome is True
    finding = await trio.to_thread.run_sync(_recheck, replica, path)
    if finding is not None:
        stats.warnings.append(f"{path}: {CHANGED} (bit rot?); read again and sent as it is")
    if again:
        return await push_file(connection, replica, path, there, stats, again=False)
    stats.failed.append((path, "vanished: it changed while it was sent"))
    return False


_CHANGED = object()  # _push: the file is not what its signature says


def _recheck(replica: Replica, path: str) -> Finding | None:
    try:
        return recheck(replica, path)
    except (OSError, PathError):
        return None


async def _push(
    connection: Connection, replica: Replica, path: str, there: bytes | None, stats: Stats
) -> object:
    """One offer of the file at ``path``: True if it arrived, False if it failed (counted
    in ``stats``), _CHANGED if it is not what its signature says (not counted)."""
    try:
        signature, st, f = await trio.to_thread.run_sync(replica.sign, path)
    except OSError as exc:
        stats.failed.append((path, exc.strerror or str(exc)))
        return False
    except PathError as exc:  # a directory on the way became a symlink since the scan
        stats.failed.append((path, str(exc)))
        return False
    with f:
        fd = f.fileno()

        def read(offset: int, length: int) -> bytes:
            return os.pread(fd, length, offset)

        try:
            offer = make_offer(signature, st, read, older_version_likely=there is not None)
        except SourceChanged:  # not what its signature says
            return _CHANGED
        except Refusal as exc:  # it changed since it was signed
            stats.failed.append((path, str(exc)))
            return False
        offer = dataclasses.replace(offer, path=path, expect=_expect(there))
        conversation = connection.start(offer)
        try:
            if offer.data is not None:
                done = await conversation.receive(m.Done)
            else:
                done = await serve_wants(conversation, SourceFile(signature.tree, read))
        except Refusal as exc:  # the file changed under us, or the server refused
            if not isinstance(exc, RemoteError):
                conversation.send(m.Error(code=exc.code, msg=str(exc)))
                if exc.code == "vanished":
                    return _CHANGED
            stats.failed.append((path, str(exc)))
            return False
        finally:
            conversation.close()
    stats.file_done(path, done)
    return done.ok


async def pull_file(
    connection: Connection, replica: Replica, path: str, here: bytes | None, stats: Stats,
    again: bool = True,
) -> int | None:
    """Fetch the remote file at ``path`` into the local directory, which holds the version
    whose root starts with ``here`` (None: nothing) and must still hold it when the new one
    lands. The outcome is counted in ``stats``; returns the file's size (None if it
    failed). A file that changed at the source while it was sent (or that the server found
    to differ from its index, and read again) is asked for once more (``again``)."""
    conversation = connection.start(m.Get(path=path, expect=_expect(here)))
    try:
        offer = await conversation.receive(m.Offer)
        outcome = await receive_file(conversation, replica, path, offer, _expect(here))
    except Refusal as exc:
        if again and exc.code == "vanished":  # (only the source says that)
            conversation.close()
            return await pull_file(connection, replica, path, here, stats, again=False)
        stats.failed.append((path, str(exc)))
        return None
    finally:
        conversation.close()
    stats.file_done(path, m.Done(ok=True, how=outcome.how, literal=outcome.literal,
                                 matched=outcome.matched))
    return offer.size
