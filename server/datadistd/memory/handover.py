"""Descriptors a worker handed over: which kinds the daemon holds, and how it lets them go.

Whatever arrives over ``SCM_RIGHTS`` is already a descriptor in the daemon before any check runs,
and closing one can block: the last ``close`` of a TCP socket with ``SO_LINGER`` set waits up to the
linger time (settable to unlimited) for unsent data, a FUSE file's flush waits for its server. So:

* ``check_memory_fd``: the only kind kept is a regular file of shmem/tmpfs (a memfd, a ``/dev/shm``
  file), by the file system's magic (``fstatfs``). hugetlbfs is refused: a hole punched in a sealed
  hugetlb memfd (only ``F_SEAL_WRITE`` forbids it) lets its pages go, and a mapping of it faults
  with ``SIGBUS``; other file systems are refused because nothing bounds their ``close``.
* ``discard``: every handed-over descriptor the daemon lets go is closed on one closer thread, never
  on the event loop; a socket is reset first (``SO_LINGER`` on with a zero timeout), so its close
  does not wait for a peer that never reads. A worker that races to set the linger again between the
  reset and the close stalls the closer thread only: descriptors queue behind it, the loop runs on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import queue
import socket
import stat
import struct
import threading

from ..core.errors import DataDistError, StatusCode

__all__ = ["check_memory_fd", "fs_magic", "discard", "settle", "TMPFS_MAGIC", "HUGETLBFS_MAGIC"]

log = logging.getLogger(__name__)

TMPFS_MAGIC = 0x01021994        # tmpfs, shmem, memfd (linux/magic.h)
HUGETLBFS_MAGIC = 0x958458F6

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)
_libc.fstatfs.restype = ctypes.c_int
_STATFS_SIZE = 256              # struct statfs is 120 bytes on 64-bit Linux; f_type (a long) comes first


def fs_magic(fd: int) -> int:
    """The magic number of the file system ``fd`` lives on (``fstatfs`` ``f_type``)."""
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ctypes.c_ulong.from_buffer(buf).value) & 0xFFFFFFFF


def check_memory_fd(fd: int, where: str) -> os.stat_result:
    """``fd``'s ``fstat`` if it is a regular file of shmem/tmpfs, else ``LLM_PARAM_INVALID`` naming what it is."""
    try:
        st = os.fstat(fd)
        magic = fs_magic(fd) if stat.S_ISREG(st.st_mode) else 0
    except OSError as exc:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"{where}: {os.strerror(exc.errno or 0)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"{where} is not a regular file (memfd or shared-memory file)")
    if magic == HUGETLBFS_MAGIC:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"{where} is hugetlbfs memory: its pages can vanish under any seal; "
                            "register memfd or /dev/shm (tmpfs) memory")
    if magic != TMPFS_MAGIC:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"{where} is not shared memory (file system 0x{magic:x}); register memfd or "
                            "/dev/shm (tmpfs) memory")
    return st


# ---- closing off the loop ------------------------------------------------------------------------

_RESET = struct.pack("ii", 1, 0)     # struct linger {l_onoff = 1, l_linger = 0}: close sends RST, never waits
_queue: queue.SimpleQueue[int | threading.Event] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _reset_if_socket(fd: int) -> None:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return
        with socket.socket(fileno=os.dup(fd)) as sock:     # a dup: closing it drops no last reference
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass    # not a TCP socket (no linger to reset) or already gone: the close cannot wait on it


def _closer() -> None:
    while True:
        item = _queue.get()
        if isinstance(item, threading.Event):
            item.set()
            continue
        try:
            os.close(item)
        except OSError:
            pass


def _start() -> None:
    global _thread
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_closer, name="datadist-fd-closer", daemon=True)
            _thread.start()


def discard(fds: list[int] | tuple[int, ...]) -> None:
    """Let go of descriptors a worker handed over: sockets reset, every close on the closer thread."""
    if not fds:
        return
    _start()
    for fd in fds:
        _reset_if_socket(fd)
        _queue.put(fd)


def settle(timeout: float) -> bool:
    """Whether every descriptor discarded so far is closed within ``timeout`` seconds (tests, shutdown)."""
    _start()
    done = threading.Event()
    _queue.put(done)
    return done.wait(timeout)
