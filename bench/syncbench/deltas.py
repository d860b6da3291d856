"""The delta bound: what compressors that hold both versions need to turn OLD into NEW,
xdelta3 -9 and ``zstd -19 --patch-from``, on one file per side (a tar of each tree).

A sync protocol never holds both versions, so these sizes are a floor, not a rival
(issue 18). The figures are a function of the inputs, so they are cached by the inputs'
identity (path, size, mtime of a file; a digest of a tree's listing); zstd -19 takes about
12 s per 50 MB, 13 minutes for the 1 GB tar of 100,000 generated files.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from .trees import fingerprint, make_tar

TOOLS = ("xdelta3", "zstd")


class DeltaBound:
    """Builds deterministic tars of trees and measures delta sizes, keeping both in
    ``cache`` (a directory) across runs."""

    def __init__(self, cache: Path, tools: tuple[str, ...] = TOOLS,
                 cached_only: tuple[str, ...] = (), zstd_max: int | None = None) -> None:
        self.cache = cache
        self.zstd_max = zstd_max  # NEW larger than this: zstd only from the cache
        self.cache.mkdir(parents=True, exist_ok=True)
        self.tools, self.cached_only = tools, cached_only
        self.file = cache / "deltas.json"
        self.known: dict[str, int] = {}
        self._reload()

    def _reload(self) -> None:
        """Take in what another run has measured meanwhile (the file is replaced whole)."""
        if self.file.is_file():
            self.known.update(json.loads(self.file.read_text()))

    def tar_of(self, tree: Path, corpus_tar: Path | None = None) -> Path:
        """One file that stands for ``tree``: the corpus's own tar when it is there, else
        a tar made once and kept under the cache."""
        if corpus_tar is not None and corpus_tar.is_file():
            return corpus_tar
        if tree.is_file():
            return tree
        out = self.cache / f"tree-{fingerprint(tree)}.tar"
        if not out.is_file():
            make_tar(tree, out)
        return out

    def sizes(self, old: Path | None, new: Path) -> dict[str, int | None]:
        """Delta sizes in bytes per tool (None: not measured); ``old`` None: NEW alone,
        compressed (the bound for a first copy)."""
        return {tool: self._size(tool, old, new) for tool in self.tools}

    def _size(self, tool: str, old: Path | None, new: Path) -> int | None:
        key = f"{tool} {identity(old)} {identity(new)}"
        self._reload()
        if key in self.known:
            return self.known[key]
        if tool in self.cached_only:
            return None
        if tool == "zstd" and self.zstd_max is not None and new.stat().st_size > self.zstd_max:
            return None
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            out = Path(tmp) / "delta"
            stdin: Path | None = None
            if tool == "xdelta3":
                # -B: the source window covers all of OLD, so no match is out of reach.
                window = 1 << max(26, min(31, (old.stat().st_size - 1).bit_length())) \
                    if old else 1 << 26
                cmd = ["xdelta3", "-e", "-9", "-f", "-B", str(window)]
                cmd += ["-s", str(old)] if old else []
                cmd += [str(new), str(out)]
            else:
                cmd = ["zstd", "-q", "-f", "-19", "--long=31"]
                cmd += [f"--patch-from={old}"] if old else []
                if old is not None and old.samefile(new):
                    # zstd will not read one file as input and dictionary: NEW from stdin.
                    cmd += [f"--stream-size={new.stat().st_size}", "-", "-o", str(out)]
                    stdin = new
                else:
                    cmd += [str(new), "-o", str(out)]
            with open(stdin or os.devnull, "rb") as feed:
                proc = subprocess.run(cmd, stdin=feed, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr}")
            size = out.stat().st_size
        self._reload()
        self.known[key] = size
        tmp_file = self.file.with_suffix(f".{os.getpid()}.tmp")
        tmp_file.write_text(json.dumps(self.known, indent=1, sort_keys=True))
        os.replace(tmp_file, self.file)
        return size


def identity(path: Path | None) -> str:
    if path is None:
        return "-"
    if path.name.startswith("tree-"):  # a tar of ours: its name is its tree's digest
        return path.name
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
