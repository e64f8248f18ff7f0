"""Addresses of Python buffers, and the few libc calls the memory code needs that ``mmap`` lacks.

* ``buffer_address`` gives the address of a C-contiguous buffer without copying it (for iovec
  arrays and ``memmove`` on the copy and data-plane hot paths);
* ``map_fixed`` / ``reserve`` / ``unmap`` map file descriptors at chosen addresses, which the
  ``host`` backend needs to lay several files out contiguously (memory a worker handed over in
  pieces) and which Python's ``mmap`` module cannot do.

The daemon reaches other processes' memory only through file descriptors they handed over; it
never attaches to a process (no ``ptrace``, no cross-memory attach).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from typing import Any

import numpy as np

from ..core.errors import DataDistError, StatusCode

__all__ = ["buffer_address", "reserve", "map_fixed", "unmap", "PAGE"]

PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mmap.restype = ctypes.c_void_p
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_munmap.restype = ctypes.c_int
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


def buffer_address(obj: Any) -> tuple[int, int]:
    """``(address, nbytes)`` of a C-contiguous buffer (memoryview, bytearray, mmap, bytes, ndarray), no copy.

    The caller keeps ``obj`` alive while the address is used.
    """
    if isinstance(obj, np.ndarray):
        return int(obj.ctypes.data), int(obj.nbytes)
    mv = obj if isinstance(obj, memoryview) else memoryview(obj)
    if not mv.c_contiguous:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, "buffer must be C-contiguous")
    nbytes = mv.nbytes
    if nbytes == 0:
        return 0, 0
    if not mv.readonly:
        if mv.format not in ("B", "b", "c") or mv.ndim != 1:
            mv = mv.cast("B")
        return ctypes.addressof(ctypes.c_char.from_buffer(mv)), nbytes
    # read-only (bytes, a read-only view): numpy takes an address without needing a writable export
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data), nbytes


def _check(result: int | None, what: str) -> int:
    if result is None or result == _MAP_FAILED:
        err = ctypes.get_errno() or errno.ENOMEM
        code = StatusCode.LLM_OUT_OF_MEMORY if err == errno.ENOMEM else StatusCode.LLM_PARAM_INVALID
        raise DataDistError(code, f"{what}: {os.strerror(err)}")
    return int(result)


def reserve(length: int) -> int:
    """An inaccessible address range of ``length`` bytes (page multiple) to map pieces into."""
    return _check(_mmap(None, length, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0),
                  f"cannot reserve {length} bytes of address space")


def map_fixed(address: int, length: int, fd: int, file_offset: int) -> None:
    """Map ``length`` bytes at ``file_offset`` of ``fd`` shared, read-write, at exactly ``address``."""
    _check(_mmap(address, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd, file_offset),
           f"cannot map {length} bytes at file offset {file_offset}")


def unmap(address: int, length: int) -> None:
    if _munmap(address, length) != 0:  # pragma: no cover - only with a bad address, which we never pass
        raise DataDistError(StatusCode.LLM_FAILED, f"munmap: {os.strerror(ctypes.get_errno())}")
