"""Inputs written by hand, one per hole issue 10 names (and a few more found by fuzzing),
played through the same player and oracle as the fuzzer's: a random run may or may not
meet them within a CI budget, these always do.

Each hole is aimed at in every shape protocol 2 gives it: a metadata change reaches a file
by the ``meta`` op, by ``mset`` vectors, and by an offer of the content it already has
(``have``, single or in a batch, sets the offer's mode and time); a write by ``ops``,
``offer``, ``offers`` and ``mset``; a read by ``get``, ``gets``, ``list`` and ``mlist``.
"""

from __future__ import annotations

import os
from typing import Any

from rdc.content.signature import signature_of_bytes
from rdc.wire import messages as m
from rdc.wire.handshake import HELLO_FRAME
from tests.attack.inputs import OPENED_CONTENT, Input, Planned
from tests.attack.wire import hello
from tests.attack.world import RO_TOKEN, World
from tests.e2e_support import TOKEN

FIRST = 20_000_000  # their input indices (and so their source addresses)
DEEP = b"a/" * 2047 + b"b"  # 2,048 levels in 4,095 bytes: within the path limit
INT64_MAX = (1 << 63) - 1
TIME = 1_700_000_000 * 10**9
# The server's last word in each conversation a request starts (what the next request of
# a directed session waits for).
ANSWER = {"open": "opened", "ops": "oks", "get": "offer", "gets": "offers", "list": "listing",
          "mlist": "mlisting", "offer": "done", "offers": "verdicts", "mset": "ok"}


def _open(path: bytes = b"", write: bool = True, create: bool = False,
          share: str = "s") -> dict[str, Any]:
    return {"t": "open", "id": 1, "share": share, "path": path, "write": write,
            "create": create, "excludes": []}


def _file(path: bytes, data: bytes, mode: int = 0o644, mtime: int = TIME) -> m.FileOffer:
    """A file of a batch, with its content inline if it is small enough."""
    signature = signature_of_bytes(data)
    return m.FileOffer(os.fsdecode(path), len(data), signature.root, len(signature.tree.levels),
                       signature.sketch, mode, mtime, None, data if len(data) < 256 else None)


def _offer(path: bytes, data: bytes, conversation: int, mode: int = 0o644,
           mtime: int = TIME) -> dict[str, Any]:
    """A push of one file (``offer``), its content inline if small enough."""
    f = _file(path, data, mode, mtime)
    return m.encode(m.Offer(size=f.size, root=f.root, depth=f.depth, sketch=f.sketch,
                            mode=mode, mtime_ns=mtime, path=f.path, data=f.data),
                    conversation)


def _offers(conversation: int, *files: m.FileOffer) -> dict[str, Any]:
    return m.encode(m.Offers(files=list(files)), conversation)


def _session(*requests: dict[str, Any], token: str = TOKEN,
             opening: dict[str, Any] | None = None) -> list[Planned]:
    frames = [Planned([hello(token, "directed/0")]),
              Planned([opening or _open()], trigger=(None, "welcome"))]
    for request in requests:  # one at a time, each after the previous one's answer
        before = frames[-1].messages[0]
        frames.append(Planned([request], trigger=(before.get("id"),
                                                   ANSWER.get(before["t"], "error"))))
    return frames


def _ops(conversation: int, *items: list) -> dict[str, Any]:
    return {"t": "ops", "id": conversation, "ops": list(items)}


def _mset_all(conversation: int, entries: int, mode: int, mtime: int) -> dict[str, Any]:
    """Every entry of the opened directory to ``mode`` and ``mtime``, by one vector pair
    whose content hash is the one ``opened`` gave (the player puts it in)."""
    same = [mtime] * entries
    return m.encode(m.MetaSet(dirs=[m.MetaDir("", OPENED_CONTENT, False, m.Vector.encode(same),
                                              m.Vector.encode([mode] * entries))]),
                    conversation)


def directed(seed: int, world: World) -> list[Input]:
    """The inputs, numbered from FIRST (``world``: its share as the fuzzer resets it, and
    its canary)."""
    canary = world.canary
    linked = (world.outside / canary.linked).read_bytes()
    entries = len(os.listdir(world.template))  # of the share's top directory
    secret = b"evil/" + canary.secret.encode()
    keep = b"evil/" + canary.keep.encode()
    empty = b"evil/" + canary.empty.encode()

    def writes(n: int) -> list[dict[str, Any]]:
        """A request of each kind that writes, from conversation ``n`` on."""
        return [_ops(n, ["mkdir", b"made-%d" % n, 0o755, None]),
                _ops(n + 1, ["meta", b"docs", [0o700, TIME], None]),
                _offer(b"planted-%d" % n, b"planted\n", n + 2),
                _offers(n + 3, _file(b"planted-batch-%d" % n, b"planted in a batch\n")),
                _mset_all(n + 4, entries, 0o600, TIME)]

    cases: list[tuple[str, list[Planned]]] = [
        # Item 4: a file of the share hard-linked to one outside.
        ("meta through the hard link to the outside",
         _session(_ops(2, ["meta", b"linked.txt", [0o666, 10**18], None]))),
        ("mset through the hard link to the outside",
         _session(_mset_all(2, entries, 0o666, 10**18))),
        ("a batch offer of the content the hard link has (have: mode and time set)",
         _session(_offers(2, _file(b"linked.txt", linked, 0o666, 10**18)))),
        ("an offer of the content the hard link has (have: mode and time set)",
         _session(_offer(b"linked.txt", linked, 2, 0o666, 10**18))),
        # Item 2: times that no 64-bit nanosecond count holds, and the edges of those that
        # do (the probe after each input opens the share: the walk must take them).
        ("a directory's mtime set to 2**64-1 ns (outside the field: a protocol error)",
         _session(_ops(2, ["meta", b"docs", [0o755, 2**64 - 1], None]))),
        ("a directory's mtime set to 2**63-1 ns, the latest there is",
         _session(_ops(2, ["meta", b"docs", [0o755, INT64_MAX], None]))),
        ("a file's mtime set to -2**63 ns, the earliest there is",
         _session(_ops(2, ["meta", b"docs/note-00.md", [0o644, -INT64_MAX - 1], None]))),
        ("every mtime of the top directory's entries set to 2**63-1 ns by mset",
         _session(_mset_all(2, entries, 0o755, INT64_MAX))),
        ("a directory 2,048 levels deep, made by open",
         _session(opening=_open(DEEP, create=True))),
        # Item 5: smaller holes.
        ("a non-UTF-8 name in an error (open of a file)",
         _session(opening=_open(b"caf\xe9.txt"))),
        ("a non-UTF-8 name in an error (get of a path below a file)",
         _session({"t": "get", "id": 2, "path": b"caf\xe9.txt/x"})),
        ("a non-UTF-8 name in an error (a batch get of a path below a file)",
         _session({"t": "gets", "id": 2, "files": [[b"caf\xe9.txt/x", None]]})),
        ("a batch offer of 4,096 tiny files (a batch holds 256: two descriptors each)",
         _session(_offers(2, *[_file(b"flood-%d" % i, b"x") for i in range(4096)]))),
        ("a batch get of 4,096 paths",
         _session({"t": "gets", "id": 2,
                   "files": [[b"docs/note-00.md", None]] * 4096})),
        ("a request with id 0",
         _session({"t": "list", "id": 0, "paths": [b""], "hb": 8})),
        ("writes after an open without write",
         _session(*writes(2), opening=_open(write=False))),
        ("writes with the read-only token",
         _session(*writes(2), token=RO_TOKEN, opening=_open(write=False))),
        ("writes with the read-only token, asking to write",
         _session(*writes(2), token=RO_TOKEN)),
        # Item 3: before the token, a first frame larger than a hello needs.
        ("a first frame over the limit before the handshake",
         [Planned([{**hello(TOKEN, "directed/0"), "pad": b"\0" * HELLO_FRAME}]),
          Planned([_open()], trigger=(None, "welcome"))]),
        # Item 1, by protocol alone: the links out of the share.
        ("reads through links out of the share",
         _session({"t": "get", "id": 2, "path": b"evil-secret"},
                  {"t": "get", "id": 3, "path": secret},
                  {"t": "gets", "id": 4, "files": [[b"evil-secret", None], [secret, None]]},
                  {"t": "list", "id": 5, "paths": [b"evil", empty], "hb": 8},
                  {"t": "mlist", "id": 6, "paths": [b"evil", empty], "hb": 8})),
        ("writes through links out of the share",
         _session(_ops(2, ["mkdir", empty + b"/x", 0o755, None],
                       ["meta", keep, [0o777, TIME], None],
                       ["mv", b"linked.txt", empty + b"/moved", None],
                       ["rm", keep, None, None]),
                  _offer(b"evil/planted", b"planted\n", 3),
                  _offers(4, _file(b"evil/planted-batch", b"planted in a batch\n"),
                          _file(keep, b"overwritten\n")))),
    ]
    return [Input(seed, FIRST + n, "directed", "directed", [frames], [what])
            for n, (what, frames) in enumerate(cases)]
