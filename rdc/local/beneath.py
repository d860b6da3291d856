"""A directory below a held one, opened in one system call where the kernel can.

`SafeRoot` reaches a directory one component at a time (an ``openat`` with O_NOFOLLOW per
component), which at six levels is a dozen system calls and as many Python steps, paid
several times per file written. Linux's ``openat2`` (5.6 and later) does the same walk in
the kernel with the same guarantees: RESOLVE_NO_SYMLINKS refuses a symlink anywhere on the
path and RESOLVE_BENEATH refuses to leave the held directory. It reports only *that* the
path is refused, not where; the caller then walks component by component for the precise
error. Where the call is missing (another kernel, a seccomp filter), it is never tried again.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
# openat2's number in the shared table of the architectures listed (alpha, mips and ia64
# number it otherwise: they walk).
_SYS_OPENAT2 = 437
_SHARED_TABLE = {"x86_64", "aarch64", "riscv64", "ppc64le", "ppc64", "s390x", "armv7l", "i686"}
# What ends the use of openat2 in this process: the call is not there or not allowed.
_UNAVAILABLE = {errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG}


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_HOW = _OpenHow(_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if platform.system() != "Linux" or platform.machine() not in _SHARED_TABLE:
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall


_syscall = _load()


def open_dir(dfd: int, rel: str) -> int | None:
    """A new descriptor on directory ``rel`` (a checked relative path, not empty) below
    ``dfd``, reached without following any symlink; FileNotFoundError if a component is
    missing; None if openat2 refused for another reason or is not available (the caller
    walks, and reports what stands in the way)."""
    global _syscall
    call = _syscall
    if call is None:
        return None
    fd = call(_SYS_OPENAT2, dfd, os.fsencode(rel), ctypes.byref(_HOW), ctypes.sizeof(_HOW))
    if fd >= 0:
        return fd
    code = ctypes.get_errno()
    if code == errno.ENOENT:
        raise FileNotFoundError(code, os.strerror(code), rel)
    if code in _UNAVAILABLE:
        _syscall = None
    return None



def available() -> bool:
    """Whether directories are opened in one call here (tests set ``_syscall`` to None to
    check the walk)."""
    return _syscall is not None
