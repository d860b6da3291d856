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
    connection: Connection, replica: Replica, path: str, there: bytes | None, stats: Stats
) -> bool:
    """Offer the local file at ``path`` to the server, which holds the version whose root
    starts with ``there`` (None: nothing) and must still hold it when the new one lands.
    The outcome is counted in ``stats``; True if the file arrived."""
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
        except (Refusal, SourceChanged) as exc:  # it changed since it was signed
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
            stats.failed.append((path, str(exc)))
            if not isinstance(exc, RemoteError):
                conversation.send(m.Error(code=exc.code, msg=str(exc)))
            return False
        finally:
            conversation.close()
    stats.file_done(path, done)
    return done.ok


async def pull_file(
    connection: Connection, replica: Replica, path: str, here: bytes | None, stats: Stats
) -> int | None:
    """Fetch the remote file at ``path`` into the local directory, which holds the version
    whose root starts with ``here`` (None: nothing) and must still hold it when the new one
    lands. The outcome is counted in ``stats``; returns the file's size (None if it
    failed)."""
    conversation = connection.start(m.Get(path=path, expect=_expect(here)))
    try:
        offer = await conversation.receive(m.Offer)
        outcome = await receive_file(conversation, replica, path, offer, _expect(here))
    except Refusal as exc:
        stats.failed.append((path, str(exc)))
        return None
    finally:
        conversation.close()
    stats.file_done(path, m.Done(ok=True, how=outcome.how, literal=outcome.literal,
                                 matched=outcome.matched))
    return offer.size
