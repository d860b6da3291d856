"""Trees on disk: fresh copies for a receiver, and the check that a receiver equals its
sender (paths, types, contents, modes, mtimes of files, symlink targets)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from rdc.local.marker import MARKER

# Where `discard` moves the trees a bench is done with (None: it deletes them).
_trash: Path | None = None


def keep_deletions_for_the_end(trash: Path) -> None:
    """From now on `discard` moves trees into ``trash`` (same file system), which the
    caller deletes once every timed run is over. Why: on this project's test machines
    (ext4 without a journal) the inode allocator skips every inode freed in the last
    minute (five, while its table block is dirty), looking each one up as it goes
    (``recently_deleted``); creating files right after a tree of 100,000 was deleted cost
    rsync 77% of its time in ``__ext4_new_inode`` (perf). Each tool's timed run came
    right after the previous one's receiver was deleted, so the order of the runs, not
    the tools, decided much of a first copy's time."""
    global _trash
    trash.mkdir(parents=True, exist_ok=True)
    _trash = trash


def discard(path: Path) -> None:
    """Remove ``path`` from where it is: deleted, or moved to the trash (see above)."""
    if _trash is None:
        shutil.rmtree(path)
        return
    path.rename(_trash / f"{len(os.listdir(_trash)):05d}")


def reset(old: Path | None, dst: Path) -> None:
    """``dst`` becomes a fresh copy of ``old`` (new inodes, mtimes kept), or an empty
    directory if ``old`` is None."""
    if dst.exists():
        discard(dst)
    if old is None:
        dst.mkdir()
    else:
        subprocess.run(["cp", "-a", str(old), str(dst)], check=True)
    os.sync()  # no writeback of the copy inside a timed run


def link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_tree(src: Path, dst: Path) -> None:
    """``dst`` becomes a copy of ``src`` whose files are hard links (cheap, and the same
    inodes: a sender's tree that later changes in place, file by file)."""
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True)


def replace_by_links(src: Path, dst: Path, paths: list[str]) -> None:
    """Each path of ``dst`` becomes a hard link to the same path of ``src``, swapped in
    by rename (as an editor saves), so what else links the old inode is untouched."""
    for rel in paths:
        if (dst / rel).exists() and os.path.samefile(src / rel, dst / rel):
            continue  # a rename between two links of one file would leave the temporary
        tmp = dst / (rel + ".bench-tmp")
        os.link(src / rel, tmp)
        os.replace(tmp, dst / rel)


def entries(root: Path) -> dict[str, os.stat_result]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path)
    return out


def fingerprint(root: Path) -> str:
    """A digest of a tree's names, sizes, modes and mtimes (not its contents): enough to
    tell whether a cached figure about the tree is stale."""
    h = hashlib.blake2b(digest_size=16)
    for rel, st in sorted(entries(root).items()):
        h.update(f"{rel}\0{st.st_size}\0{st.st_mode}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def tree_diff(want: Path, got: Path) -> str:
    """'ok', or what differs between the sender's tree and the receiver's (by kind, with
    the first example). Each root's folder marker is its own (rdc.local.marker): left out."""
    a, b = entries(want), entries(got)
    for side in (a, b):
        side.pop(MARKER, None)
    problems: dict[str, list[str]] = {}
    for path in sorted(a.keys() - b.keys()):
        problems.setdefault("missing", []).append(path)
    for path in sorted(b.keys() - a.keys()):
        problems.setdefault("extra", []).append(path)
    for path in sorted(a.keys() & b.keys()):
        sa, sb = a[path], b[path]
        kind = stat.S_IFMT(sa.st_mode)
        if kind != stat.S_IFMT(sb.st_mode):
            problems.setdefault("type", []).append(path)
        elif stat.S_ISLNK(sa.st_mode):
            if os.readlink(want / path) != os.readlink(got / path):
                problems.setdefault("link", []).append(path)
        elif stat.S_ISREG(sa.st_mode):
            if sa.st_size != sb.st_size or not same_bytes(str(want / path), str(got / path)):
                problems.setdefault("content", []).append(path)
            if sa.st_mtime_ns != sb.st_mtime_ns:
                problems.setdefault("mtime", []).append(path)
            if stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
                problems.setdefault("mode", []).append(path)
    if not problems:
        return "ok"
    return "; ".join(f"{k} {len(v)} (e.g. {v[0]})" for k, v in problems.items())


def make_tar(tree: Path, out: Path) -> None:
    """A deterministic tar of ``tree`` (as ../shared/bench/make_corpus.sh makes the corpus
    tars): names sorted, owner 0, the files' own modes and mtimes."""
    tmp = out.with_suffix(".tmp")
    subprocess.run(["tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
                    "--format=gnu", "-C", str(tree), "-cf", str(tmp), "."], check=True)
    os.replace(tmp, out)
