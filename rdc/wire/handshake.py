"""The handshake (docs/protocol.md section 2): versions, features, the token."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

import trio

from rdc import __version__
from rdc.errors import AccessDenied, ConnectionFailed, ProtocolError, RemoteError
from rdc.params import FORMAT, mismatch
from rdc.wire import messages as m
from rdc.wire.codec import MAX_FRAME
from rdc.wire.frames import ConnectionClosed, FrameStream

PROTOCOL_MIN = 2
PROTOCOL_MAX = 2
# zstd: compressed frames; health: the report and status requests (rdc status);
# batch-deltas: edited small files described in their batch (rdc.transfer.lockstep);
# short-prefixes: sub-chunk lists in the prefix length a want names (rdc.content.subchunks);
# short-fingerprints: a list's ``have`` sized by its count (rdc.transfer.reconcile);
# short-digests: listings and metadata hashes in 5-byte prefixes, offers' roots in 16 (rdc.params);
# asked-paths: the offers answering a gets name no path; kept-dir-times: a pushed batch
# leaves the times of the directories it wrote in as they were (both rdc.transfer.batch);
# asked-listings: a listing names no path where it is the directory asked for in its place
# (rdc.transfer.serving); split-meta: an mlist's vectors of subdirectories alone, the
# other entries by one hash (rdc.transfer.ops.mlisting); listing-sketch: a list names what
# the client has in a large directory by a set sketch (rdc.transfer.reconcile); asked-meta:
# an mlisting's items name no path, one per path asked for (rdc.transfer.ops); stamp-roots:
# a client with a cold index may sync by stamp roots (rdc.local.stamproots); warm-stamps:
# so may a client with a warm index, into a share whose index is cold
# (rdc.transfer.quickcheck).
FEATURES = ("zstd", "health", "same-format", "batch-deltas", "short-prefixes",
            "short-fingerprints", "short-digests", "asked-paths", "kept-dir-times",
            "asked-listings", "large-deltas", "split-meta", "listing-sketch", "asked-meta",
            "stamp-roots", "warm-stamps")
HANDSHAKE_SECONDS = 10
M = TypeVar("M", bound=m.Message)
T = TypeVar("T")
# The largest frame a server reads before the token checked out: a hello (token, agent,
# features) fits in a few KiB.
HELLO_FRAME = 16 << 10


def agent() -> str:
    return f"rdc/{__version__}"


async def _one(frames: FrameStream, expected: type[M]) -> M:
    batch = await frames.receive()
    if len(batch) != 1:
        raise ProtocolError(message="the handshake is one message per frame")
    conversation, message = m.decode(batch[0])
    if conversation is not None:
        raise ProtocolError(message="the handshake has no conversations")
    if isinstance(message, m.Error):
        text = message.msg or message.code
        if message.code in ("auth", "share", "readonly"):
            raise AccessDenied(message=f"server: {text}")
        raise RemoteError(code=message.code, message=f"server: {text}")
    if not isinstance(message, expected):
        raise ProtocolError(message=f"expected {expected.TYPE!r}, got {message.TYPE!r}")
    return message


async def _send(frames: FrameStream, message: m.Message) -> None:
    await frames.send([m.encode(message)])


async def client_handshake(frames: FrameStream, token: str, compress: bool = True) -> m.Welcome:
    """Say hello; return the server's welcome. Compression is switched on if both sides
    have it (and ``compress``)."""
    features = [f for f in FEATURES if compress or f != "zstd"]
    said = time.monotonic()
    await _send(frames, m.Hello(proto=(PROTOCOL_MIN, PROTOCOL_MAX), agent=agent(),
                                features=features, token=token, format=FORMAT))
    try:
        welcome = await _one(frames, m.Welcome)
    except ConnectionClosed:
        raise ConnectionFailed(
            message="the server closed the connection during the handshake"
        ) from None
    frames.rtt = time.monotonic() - said
    if not PROTOCOL_MIN <= welcome.proto <= PROTOCOL_MAX:
        raise ProtocolError(message=f"the server chose protocol {welcome.proto}")
    vouched = not welcome.format and "same-format" in welcome.features
    if welcome.format != FORMAT and not vouched:  # (a server that checked ours says so)
        raise ProtocolError(message="the server uses other format parameters: "
                            + mismatch(FORMAT, welcome.format))
    frames.compress = "zstd" in welcome.features and "zstd" in features
    frames.features = frozenset(welcome.features) & frozenset(features)
    return welcome


async def server_handshake(
    frames: FrameStream, token_ok: Callable[[str], T | None], compress: bool = True,
    host: str = "",
) -> tuple[m.Hello, T]:
    """Wait for hello (at most HANDSHAKE_SECONDS), check the version and the token; send
    welcome (naming this machine, ``host``, whose versions conflict copies name). Returns
    the hello and what ``token_ok`` returned for the token (the client's rights). A bad
    token gets ``error auth`` and nothing else."""
    frames.max_receive = HELLO_FRAME  # a peer that has not authenticated sends little
    with trio.fail_after(HANDSHAKE_SECONDS):
        try:
            hello = await _one(frames, m.Hello)
        except ProtocolError as exc:  # tell the peer why, if it still listens (section 1)
            with trio.move_on_after(2), contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, OSError
            ):
                await _send(frames, m.Error(code="protocol", msg=str(exc)))
            raise
    low, high = hello.proto
    chosen = min(high, PROTOCOL_MAX)
    rights = token_ok(hello.token)
    if not rights:
        await _send(frames, m.Error(code="auth", msg="authentication failed"))
        raise AccessDenied(message="authentication failed")
    if hello.format != FORMAT:
        differs = mismatch(FORMAT, hello.format)
        await _send(frames, m.Error(
            code="version", msg=f"this server uses other format parameters: {differs}"))
        raise ProtocolError(message=f"client with other format parameters: {differs}")
    if chosen < max(low, PROTOCOL_MIN):
        await _send(frames, m.Error(
            code="version", msg=f"this server speaks protocol {PROTOCOL_MIN}..{PROTOCOL_MAX}"))
        raise ProtocolError(message=f"client speaks protocol {low}..{high}")
    features = [f for f in hello.features if f in FEATURES and (compress or f != "zstd")]
    # The client's format was checked above: one that knows ``same-format`` is told so
    # by the feature, without this side's 210-byte format string.
    said = "" if "same-format" in features else FORMAT
    await _send(frames, m.Welcome(proto=chosen, agent=agent(), features=features, format=said,
                                  host=host))
    frames.compress = "zstd" in features
    frames.features = frozenset(features)
    frames.max_receive = MAX_FRAME
    return hello, rights
