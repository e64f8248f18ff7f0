"""Cross-memory attach: ``process_vm_readv`` / ``process_vm_writev`` through ctypes.

The daemon reaches a worker's plain (anonymous) memory with these two system calls: one call
moves many pieces (up to ``IOV_MAX`` iovecs on each side), the kernel copies straight between
the two address spaces, and nothing is mapped. The worker must allow it: same user and Yama's
``ptrace_scope`` permitting (the client calls ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``), or
the daemon holds ``CAP_SYS_PTRACE``.

Two layers:

* ``readv_raw`` / ``writev_raw`` take ``(remote_addr, local_addr, length)`` triples: no Python
  object per piece beyond the tuple, for the copy hot path (``memory.copy``);
* ``read_remote`` / ``write_remote`` / ``readv_remote`` / ``writev_remote`` take memoryviews
  (or any buffer) for the local side and resolve their addresses without copying.

Partial transfers are resumed where they stopped; a failure raises
``DataDistError(LLM_PARAM_INVALID)`` naming the pid, the address, ``os.strerror`` and what to do.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any, Sequence

import numpy as np

from ..core.errors import DataDistError, StatusCode

__all__ = [
    "IOV_MAX", "available", "buffer_address", "read_remote", "write_remote", "readv_remote", "writev_remote",
    "readv_raw", "writev_raw",
]

#: the kernel's limit of iovecs per call (``UIO_MAXIOV``), on each side
IOV_MAX = 1024

_PTR_BITS = ctypes.sizeof(ctypes.c_void_p) * 8


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind() -> tuple[Any, Any]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        readv, writev = libc.process_vm_readv, libc.process_vm_writev
    except (OSError, AttributeError):  # pragma: no cover - non-Linux or an old libc
        return None, None
    for fn in (readv, writev):
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                       ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
    return readv, writev


_READV, _WRITEV = _bind()
# an iovec is {void *, size_t}: two machine words; on 64-bit they are uint64 pairs numpy can build
_IOV_DTYPE = np.uint64 if _PTR_BITS == 64 else np.uint32


def available() -> bool:
    """Whether this libc exposes ``process_vm_readv``/``process_vm_writev`` (Linux >= 3.2, glibc >= 2.15)."""
    return _READV is not None


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


_HINTS = {
    errno.EPERM: ("not permitted to access its memory: the worker must allow it with "
                  "prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) (llm_datadist does this when it registers plain "
                  "memory), run as the daemon's user, or the daemon needs CAP_SYS_PTRACE; alternatively register "
                  "memory from a shared mapping (/dev/shm file or memfd)"),
    errno.ESRCH: "no such process: the worker has exited",
    errno.EFAULT: "the address range is not mapped (or not writable) in that process",
    errno.ENOMEM: "the kernel could not allocate memory for the iovecs",
    errno.EINVAL: "invalid arguments (too many iovecs or a length overflow)",
    errno.ENOSYS: "process_vm_readv/writev is not available in this kernel",
}


def _fail(op: str, pid: int, remote_addr: int, length: int, err: int) -> DataDistError:
    hint = _HINTS.get(err, "")
    return DataDistError(
        StatusCode.LLM_PARAM_INVALID,
        f"{op}(pid={pid}, address=0x{remote_addr:x}, length={length}) failed: {os.strerror(err)}"
        + (f" - {hint}" if hint else ""))


def _transfer(fn: Any, op: str, pid: int, pieces: Sequence[tuple[int, int, int]] | np.ndarray) -> int:
    """Move every ``(remote_addr, local_addr, length)`` piece (or rows of an (n, 3) int64 array)."""
    if fn is None:  # pragma: no cover
        raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED, f"{op} is not available on this platform")
    if len(pieces) == 0:
        return 0
    if len(pieces) == 1:
        return _transfer_one(fn, op, pid, *(int(x) for x in pieces[0]))
    arr = np.asarray(pieces, dtype=np.int64).reshape(-1, 3)
    lengths = arr[:, 2]
    if (lengths < 0).any():
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"{op}: negative length")
    if not lengths.all():
        arr = arr[lengths > 0]
    n = len(arr)
    # the iovec arrays of every piece, built once (fresh copies: the partial-transfer fix-up edits them)
    remote = np.empty((n, 2), _IOV_DTYPE)
    local = np.empty((n, 2), _IOV_DTYPE)
    remote[:, 0] = arr[:, 0]
    remote[:, 1] = arr[:, 2]
    local[:, 0] = arr[:, 1]
    local[:, 1] = arr[:, 2]
    total = int(arr[:, 2].sum())
    r_base, l_base, stride = remote.ctypes.data, local.ctypes.data, remote.strides[0]
    i = 0
    while i < n:  # one system call per pass (IOV_MAX pieces); a partial one resumes where it stopped
        count = min(IOV_MAX, n - i)
        want = int(local[i:i + count, 1].sum())
        done = fn(pid, l_base + i * stride, count, r_base + i * stride, count, 0)
        if done < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            raise _fail(op, pid, int(remote[i, 0]), want, err)
        if done == want:
            i += count
            continue
        if done == 0:  # no progress and no error: the kernel would loop forever; report the first piece
            raise _fail(op, pid, int(remote[i, 0]), want, errno.EFAULT)
        # partial: skip the pieces completed, shorten the one cut in the middle, and go again
        ends = np.cumsum(local[i:i + count, 1].astype(np.int64))
        k = int(np.searchsorted(ends, done, side="right"))
        if k < count:
            cut = done - (int(ends[k - 1]) if k else 0)
            remote[i + k, 0] += cut
            local[i + k, 0] += cut
            remote[i + k, 1] -= cut
            local[i + k, 1] -= cut
        i += k
    return total


def _transfer_one(fn: Any, op: str, pid: int, remote_addr: int, local_addr: int, length: int) -> int:
    """One piece with ctypes iovecs (cheaper than building arrays for a single call)."""
    if length < 0:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"{op}: negative length")
    local, remote = _IOVec(), _IOVec()
    moved = 0
    while moved < length:
        local.iov_base, local.iov_len = local_addr + moved, length - moved
        remote.iov_base, remote.iov_len = remote_addr + moved, length - moved
        done = fn(pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
        if done < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            raise _fail(op, pid, remote_addr + moved, length - moved, err)
        if done == 0:
            raise _fail(op, pid, remote_addr + moved, length - moved, errno.EFAULT)
        moved += done
    return length


def readv_raw(pid: int, pieces: Sequence[tuple[int, int, int]] | np.ndarray) -> int:
    """Copy remote ``(remote_addr, local_addr, length)`` pieces of process ``pid`` into local memory."""
    return _transfer(_READV, "process_vm_readv", pid, pieces)


def writev_raw(pid: int, pieces: Sequence[tuple[int, int, int]] | np.ndarray) -> int:
    """Copy local memory into ``(remote_addr, local_addr, length)`` pieces of process ``pid``."""
    return _transfer(_WRITEV, "process_vm_writev", pid, pieces)


def _local_pieces(pieces: Sequence[tuple[int, Any]], writable: bool) -> tuple[list[tuple[int, int, int]], list]:
    raw: list[tuple[int, int, int]] = []
    keep: list[Any] = []
    for remote_addr, buf in pieces:
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        if writable and mv.readonly:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, "destination buffer is read-only")
        addr, nbytes = buffer_address(mv)
        if nbytes:
            raw.append((remote_addr, addr, nbytes))
            keep.append(mv)
    return raw, keep


def readv_remote(pid: int, pieces: Sequence[tuple[int, Any]]) -> int:
    """Fill each local buffer from ``remote_addr`` in process ``pid``; ``pieces`` = ``[(remote_addr, buf)]``."""
    raw, keep = _local_pieces(pieces, writable=True)
    done = readv_raw(pid, raw)
    del keep
    return done


def writev_remote(pid: int, pieces: Sequence[tuple[int, Any]]) -> int:
    """Write each local buffer to ``remote_addr`` in process ``pid``; ``pieces`` = ``[(remote_addr, buf)]``."""
    raw, keep = _local_pieces(pieces, writable=False)
    done = writev_raw(pid, raw)
    del keep
    return done


def read_remote(pid: int, remote_addr: int, dst: Any) -> int:
    """Copy ``len(dst)`` bytes at ``remote_addr`` of process ``pid`` into the writable buffer ``dst``."""
    return readv_remote(pid, [(remote_addr, dst)])


def write_remote(pid: int, remote_addr: int, src: Any) -> int:
    """Copy the buffer ``src`` to ``remote_addr`` of process ``pid``."""
    return writev_remote(pid, [(remote_addr, src)])
