"""Inputs written by hand, one per hole issue 10 names (and a few more found by fuzzing),
played through the same player and oracle as the fuzzer's: a random run may or may not
meet them within a CI budget, these always do.
"""

from __future__ import annotations

from typing import Any

from rdc.signature import signature_of_bytes
from tests.attack.inputs import Input, Planned
from tests.attack.world import RO_TOKEN, Canary
from tests.e2e_support import TOKEN

FIRST = 20_000_000  # their input indices (and so their source addresses)
DEEP = b"a/" * 2047 + b"b"  # 2,048 levels in 4,095 bytes: within the path limit


def _hello(token: str = TOKEN) -> dict[str, Any]:
    return {"t": "hello", "proto": [1, 1], "agent": "directed/0", "features": ["zstd"],
            "token": token}


def _open(path: bytes = b"", write: bool = True, create: bool = False,
          share: str = "s") -> dict[str, Any]:
    return {"t": "open", "id": 1, "share": share, "path": path, "write": write,
            "create": create, "excludes": []}


def _offer(path: bytes, data: bytes, conversation: int) -> dict[str, Any]:
    signature = signature_of_bytes(data)
    return {"t": "offer", "id": conversation, "path": path, "size": len(data),
            "root": signature.root, "depth": len(signature.tree.levels),
            "sketch": signature.sketch, "mode": 0o644, "mtime": 1_700_000_000 * 10**9,
            "data": data}


def _session(*requests: dict[str, Any], token: str = TOKEN,
             opening: dict[str, Any] | None = None) -> list[Planned]:
    frames = [Planned([_hello(token)]), Planned([opening or _open()],
                                                trigger=(None, "welcome"))]
    for request in requests:  # one at a time, each after the previous one's answer
        before = frames[-1].messages[0]
        frames.append(Planned([request], trigger=(before.get("id"), {
            "open": "opened", "ops": "oks", "get": "offer", "list": "listing",
            "offer": "done"}.get(before["t"], "error"))))
    return frames


def directed(seed: int, canary: Canary) -> list[Input]:
    """The inputs, numbered from FIRST."""
    def ops(*items: list) -> dict[str, Any]:
        return {"t": "ops", "id": 2, "ops": list(items)}

    cases: list[tuple[str, list[Planned]]] = [
        ("mode through the hard link to the outside",
         _session(ops(["mode", b"linked.txt", 0o666, None]))),
        ("meta through the hard link to the outside",
         _session(ops(["meta", b"linked.txt", [0o640, 10**18], None]))),
        ("a directory's mtime set to 2**64-1 ns",
         _session(ops(["meta", b"docs", [0o755, 2**64 - 1], None]))),
        ("a file's mtime set to 10**19 ns (2286)",
         _session(ops(["meta", b"docs/note-00.md", [0o644, 10**19], None]))),
        ("a directory 2,048 levels deep, made by open",
         _session(opening=_open(DEEP, create=True))),
        ("a non-UTF-8 name in an error (open of a file)",
         [Planned([_hello()]), Planned([_open(b"caf\xe9.txt")], trigger=(None, "welcome"))]),
        ("a non-UTF-8 name in an error (get of a path below a file)",
         _session({"t": "get", "id": 2, "path": b"caf\xe9.txt/x"})),
        ("a request with id 0",
         _session({"t": "list", "id": 0, "paths": [b""], "hb": 8})),
        ("writes after an open without write",
         _session(ops(["mkdir", b"made-read-only", 0o755, None]),
                  _offer(b"planted-read-only", b"planted\n", 3),
                  opening=_open(write=False))),
        ("writes with the read-only token",
         _session(ops(["mkdir", b"made-ro-token", 0o755, None]), token=RO_TOKEN,
                  opening=_open(write=False))),
        ("reads through links out of the share",
         _session({"t": "get", "id": 2, "path": b"evil-secret"},
                  {"t": "get", "id": 3, "path": b"evil/" + canary.secret.encode()},
                  {"t": "list", "id": 4, "paths": [b"evil", b"evil/" + canary.empty.encode()],
                   "hb": 8})),
        ("writes through links out of the share",
         _session(ops(["mkdir", b"evil/" + canary.empty.encode() + b"/x", 0o755, None],
                      ["mode", b"evil/" + canary.keep.encode(), 0o777, None],
                      ["rm", b"evil/" + canary.keep.encode(), None, None]),
                  _offer(b"evil/planted", b"planted\n", 3))),
    ]
    return [Input(seed, FIRST + n, "directed", "directed", [frames], [what])
            for n, (what, frames) in enumerate(cases)]
