"""Tree operations and listings that both roles share: the server applies a pushing
client's ``ops`` and ``mset`` with these, a pulling client applies the same changes to its
own directory with them, and listings are built and compared here."""

from __future__ import annotations

import stat
from typing import Any

from rdc.errors import Refusal
from rdc.fs import ConflictError, Expect
from rdc.paths import PathError, join, to_wire
from rdc.replica import Replica
from rdc.snapshot import Entry, decode_times, encode_times, iter_entries, lookup, times_of

# A subtree with at most this many entries travels as one times vector.
WHOLE_TIMES = 4096


def expectation(replica: Replica, path: str, spec: Any) -> Expect | None:
    """An ``expect`` of docs/protocol.md (nil: no check; []: nothing there; [kind, hash]:
    a listing entry) as a check of what is at ``path`` now."""
    if spec is None:
        return None
    if spec == []:
        return Expect.absent()
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], bytes)):
        raise Refusal("protocol", message=f"bad expect {spec!r}")
    kind, digest = spec
    if kind == "d":
        return Expect.directory()
    if kind == "l":
        return Expect.link(digest)
    if kind == "f":
        try:
            signature, st, f = replica.sign(path)
        except FileNotFoundError:
            raise ConflictError(path=path, expected="a file", found="nothing") from None
        f.close()
        if not signature.root.startswith(digest):
            raise ConflictError(path=path, expected="the listed version", found="another")
        return Expect.from_stat(st)
    raise Refusal("protocol", message=f"bad expect kind {kind!r}")


def apply_op(replica: Replica, op: str, path: str, arg: Any, expect: Any) -> None:
    """One of ``mkdir``, ``link``, ``rm``, ``mode`` (blocking; raises Refusal, ConflictError,
    PathError or OSError)."""
    if not path:
        raise PathError(path=path, reason="the opened directory itself cannot be changed")
    check = expectation(replica, path, expect)
    fs = replica.fs
    if op == "mkdir":
        if not isinstance(arg, int) or not 0 <= arg <= 0o7777:
            raise Refusal("protocol", message="mkdir needs a mode")
        st = fs.lstat(path)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            if check is None or check.kind == "directory":
                raise Refusal("path", message=f"{path} exists and is not a directory")
            fs.remove(path, expect=check)
            replica.forget(path)
            st = None
        if st is None:
            fs.mkdir(path, arg)
        fs.chmod(path, arg)
    elif op == "link":
        if not isinstance(arg, bytes) or not arg or b"\0" in arg or len(arg) > 4096:
            raise Refusal("protocol", message="link needs a target")
        fs.symlink(path, arg, expect=check)
        replica.forget(path)
    elif op == "rm":
        fs.remove(path, expect=check)
        replica.forget(path)
    elif op == "mode":
        if not isinstance(arg, int) or not 0 <= arg <= 0o7777:
            raise Refusal("protocol", message="mode needs a mode")
        fs.chmod(path, arg)
    else:  # pragma: no cover - the schema allows no other op
        raise Refusal("protocol", message=f"unknown op {op!r}")


def apply_ops(replica: Replica, ops: list[tuple[str, str, Any, Any]]) -> list[list[str] | None]:
    """Apply ``ops`` in order; one result per op (None, or [code, message])."""
    results: list[list[str] | None] = []
    for op, path, arg, expect in ops:
        try:
            apply_op(replica, op, path, arg, expect)
            results.append(None)
        except ConflictError as exc:
            results.append(["conflict", str(exc)])
        except PathError as exc:
            results.append(["path", str(exc)])
        except Refusal as exc:
            results.append([exc.code, str(exc)])
        except OSError as exc:
            results.append(["io", f"{path}: {exc.strerror or exc}"])
    return results


# ---------------------------------------------------------------- listings


def listing(tree: Entry, path: str, hb: int) -> list | None:
    """``entries`` of a ``listing`` for the directory at ``path`` (None if it is not one)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d":
        return None
    out = []
    for name, entry in directory.sorted_children():
        digest = entry.digest()
        out.append(
            [to_wire(name), entry.kind, entry.mode, digest if entry.kind == "l" else digest[:hb]]
        )
    return out


def mlisting(tree: Entry, path: str, hb: int) -> list | None:
    """One ``mlisting`` item for the directory at ``path``: its content hash prefix,
    whether the times vector covers the whole subtree, the vector, and the meta hashes of
    its subdirectories (when it does not)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d":
        return None
    whole = directory.count <= WHOLE_TIMES
    table, index = encode_times(times_of(directory, whole))
    metas = b"" if whole else b"".join(
        entry.meta[:hb] for _, entry in directory.sorted_children() if entry.kind == "d"
    )
    return [to_wire(path), directory.content[:hb], whole, [table, index], metas]


def apply_times(
    replica: Replica, tree: Entry, path: str, content: bytes, whole: bool, times: Any
) -> tuple[int, int]:
    """Set the modification times of a times vector where the directory's content is the
    one the vector describes. Returns (applied, skipped)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d" or not directory.content.startswith(content):
        return 0, 1
    try:
        values = decode_times(times[0], times[1])
    except ValueError as exc:
        raise Refusal("protocol", message=f"bad times vector: {exc}") from None
    if whole:
        entries = list(iter_entries(directory))
    else:
        entries = [(name, entry) for name, entry in directory.sorted_children()]
    if len(values) != len(entries):
        return 0, 1
    applied = 0
    for (rel, entry), mtime in zip(entries, values, strict=True):
        if entry.mtime_ns != mtime:
            replica.fs.set_times(join(path, rel), mtime)
            entry.mtime_ns = mtime
            applied += 1
    return applied, 0
