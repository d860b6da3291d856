"""Tree operations and listings that both roles share: the server applies a pushing
client's ``ops`` and ``mset`` with these, a pulling client applies the same changes to its
own directory with them, and listings are built here."""

from __future__ import annotations

import errno
import stat
from typing import Any

from rdc.errors import Refusal
from rdc.local.filestat import clamp_ns
from rdc.local.fs import ConflictError, Expect
from rdc.local.ignore import Excludes
from rdc.local.paths import PathError, check_relpath, join, to_wire
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, decode_values, encode_values, iter_entries, lookup, meta_of

# A subtree with at most this many entries travels as one metadata vector.
WHOLE_META = 4096


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
        return replica.expect_version(path, digest)
    raise Refusal("protocol", message=f"bad expect kind {kind!r}")


def apply_op(
    replica: Replica,
    op: str,
    path: str,
    arg: Any,
    expect: Any,
    excludes: Excludes | None = None,
    top: bool = False,
) -> None:
    """One of ``mkdir``, ``link``, ``rm``, ``rmdir`` (only if empty), ``mode``, ``mv``,
    ``meta`` (blocking; raises Refusal, ConflictError, PathError or OSError). ``top``: the
    opened directory's own mode and time may be set (``meta`` with the empty path)."""
    if not path and not (op == "meta" and top):
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
            # Owner rwx while it is filled; the metadata phase sets the final mode.
            fs.mkdir(path, arg | 0o700)
    elif op == "link":
        if not isinstance(arg, bytes) or not arg or b"\0" in arg or len(arg) > 4096:
            raise Refusal("protocol", message="link needs a target")
        fs.symlink(path, arg, expect=check)
        replica.forget(path)
    elif op == "rm":
        st = fs.lstat(path)
        if excludes and excludes.patterns and st is not None and stat.S_ISDIR(st.st_mode):
            if check is not None and check.kind != "directory":
                raise ConflictError(path=path, expected=str(check), found="a directory")
            _remove_except(replica, path, excludes)
        else:
            fs.remove(path, expect=check)
        replica.forget(path)
    elif op == "rmdir":
        fs.rmdir(path)
    elif op == "mv":
        if not isinstance(arg, bytes):
            raise Refusal("protocol", message="mv needs a destination path")
        destination = check_relpath(arg)
        fs.rename(path, destination, expect=check)
        replica.forget(path)
        replica.forget(destination)
    elif op == "mode":
        if not isinstance(arg, int) or not 0 <= arg <= 0o7777:
            raise Refusal("protocol", message="mode needs a mode")
        fs.chmod(path, arg)
    elif op == "meta":
        if not (isinstance(arg, list) and len(arg) == 2 and all(type(x) is int for x in arg)
                and 0 <= arg[0] <= 0o7777):
            raise Refusal("protocol", message="meta needs [mode, mtime]")
        if arg[1] != clamp_ns(arg[1]):
            raise Refusal("protocol", message="meta: mtime out of range")
        if fs.lstat(path) is None:
            raise FileNotFoundError(errno.ENOENT, "no such entry", path)
        replica.set_meta(path, arg[0], arg[1])
    else:  # pragma: no cover - the schema allows no other op
        raise Refusal("protocol", message=f"unknown op {op!r}")


def _remove_except(replica: Replica, path: str, excludes: Excludes) -> bool:
    """Remove the directory at ``path`` but what ``excludes`` matches inside it (with the
    directories that hold it): excluded paths are neither sent nor deleted. True if the
    directory went."""
    fs = replica.fs
    kept = False
    for name in fs.listdir(path):
        child = join(path, name)
        st = fs.lstat(child)
        is_dir = st is not None and stat.S_ISDIR(st.st_mode)
        if excludes(child, is_dir):
            kept = True
        elif is_dir:
            kept = not _remove_except(replica, child, excludes) or kept
        else:
            fs.remove(child)
    if not kept:
        fs.rmdir(path)
    return not kept


def apply_ops(
    replica: Replica,
    ops: list[tuple[str, str, Any, Any]],
    excludes: Excludes | None = None,
    top: bool = False,
) -> list[list[str] | None]:
    """Apply ``ops`` in order; one result per op (None, or [code, message]). ``excludes``:
    the connection's, which a recursive removal spares; ``top`` as for `apply_op`."""
    results: list[list[str] | None] = []
    for op, path, arg, expect in ops:
        try:
            apply_op(replica, op, path, arg, expect, excludes, top)
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


def listing(tree: Entry, path: str, hb: int, meta: bool = False) -> list | None:
    """``entries`` of a ``listing`` for the directory at ``path`` (None if it is not one);
    with ``meta`` each entry also carries its mtime and (directories) meta and sync meta
    hash prefixes."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d":
        return None
    out = []
    for name, entry in directory.sorted_children():
        digest = entry.digest()
        item = [to_wire(name), entry.kind, entry.mode, digest if entry.kind == "l" else digest[:hb]]
        if meta:
            item += [entry.mtime_ns, entry.meta[:hb], entry.smeta[:hb]]
        out.append(item)
    return out


def mlisting(tree: Entry, path: str, hb: int) -> list | None:
    """One ``mlisting`` item for the directory at ``path``: its content hash prefix,
    whether the vectors cover the whole subtree, the times and modes vectors, and the meta
    hashes of its subdirectories (when they do not)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d":
        return None
    whole = directory.count <= WHOLE_META
    times, modes = meta_of(directory, whole)
    metas = b"" if whole else b"".join(
        entry.meta[:hb] for _, entry in directory.sorted_children() if entry.kind == "d"
    )
    return [
        to_wire(path), directory.content[:hb], whole,
        list(encode_values(times)), list(encode_values(modes)), metas,
    ]


def apply_meta(
    replica: Replica, tree: Entry, path: str, content: bytes, whole: bool, times: Any, modes: Any
) -> tuple[int, int]:
    """Set the modification times and modes of a metadata vector where the directory's
    content is the one the vector describes. Returns (entries changed, vectors skipped)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d" or not directory.content.startswith(content):
        return 0, 1
    try:
        new_times = decode_values(times[0], times[1])
        new_modes = decode_values(modes[0], modes[1])
    except ValueError as exc:
        raise Refusal("protocol", message=f"bad metadata vector: {exc}") from None
    if whole:
        entries = list(iter_entries(directory))
    else:
        entries = [(name, entry) for name, entry in directory.sorted_children()]
    if not len(new_times) == len(new_modes) == len(entries):
        return 0, 1
    changed = 0
    retimed: list = []  # recorded in the index in one transaction
    try:
        # Deepest first, so that a directory's own time is set after its children changed.
        for (rel, entry), mtime, mode in reversed(list(zip(entries, new_times, new_modes,
                                                            strict=True))):
            full = join(path, rel)
            new_mode = entry.kind != "l" and entry.mode != mode
            if new_mode and not 0 <= mode <= 0o7777:
                raise Refusal("protocol", message=f"bad mode {mode:o}")
            new_time = entry.mtime_ns != mtime
            if new_mode or new_time:
                replica.set_meta(full, mode if new_mode else None,
                                 mtime if new_time else None, retimed)
                entry.mode, entry.mtime_ns = (mode if new_mode else entry.mode), mtime
                changed += new_mode + new_time
    finally:
        replica.record_times(retimed)
    return changed, 0
