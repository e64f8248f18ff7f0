"""Worker-side memory helpers: map daemon pools, describe worker memory to the daemon, raw views.

* ``Mapper`` maps the shared-memory files the daemon exports for allocated caches, so
  ``Cache.tensor_addrs`` are real addresses in this process.
* ``describe`` tells the daemon how to reach memory the worker registers: through the file
  behind a shared mapping (a ``/dev/shm`` file or a memfd), or by cross-memory attach into this
  process (``allow_ptrace`` lets the daemon do that when Yama restricts ptrace).
* ``numpy_view`` / ``address_of`` convert between addresses and numpy arrays without copying.

This module is private to ``llm_datadist`` and imports nothing of the daemon.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import math
import mmap
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Mapper", "describe", "allow_ptrace", "numpy_view", "address_of"]

_DELETED = " (deleted)"
_SHM_DIR = "/dev/shm/"


# ---- mapping daemon pools -----------------------------------------------------------------------

class Mapper:
    """Maps each daemon pool file once (``MAP_SHARED``, read-write) and hands out addresses inside it.

    The mappings stay until ``unmap_all()``; arrays made from those addresses must not be used after
    it (the memory is no longer mapped).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: Dict[str, Tuple[mmap.mmap, int]] = {}  # path -> (mapping, base address)

    def map(self, path: str, file_offset: int, length: int) -> int:
        """The address in this process of ``length`` bytes at ``file_offset`` of the file ``path``."""
        if file_offset < 0 or length < 0:
            raise ValueError(f"invalid range: file_offset={file_offset}, length={length}")
        with self._lock:
            entry = self._maps.get(path)
            if entry is None:
                entry = self._maps[path] = _map_file(path)
            mm, base = entry
            if file_offset + length > len(mm):
                raise ValueError(f"range [{file_offset}, {file_offset + length}) is outside {path!r} "
                                 f"({len(mm)} bytes)")
            return base + file_offset

    def mapped_paths(self) -> List[str]:
        with self._lock:
            return list(self._maps)

    def unmap_all(self) -> None:
        """Unmap every file; addresses handed out before are invalid afterwards."""
        with self._lock:
            maps, self._maps = self._maps, {}
        for mm, _ in maps.values():
            try:
                mm.close()
            except BufferError:  # a Python buffer still exports it; it goes when that is released
                pass


def _map_file(path: str) -> Tuple[mmap.mmap, int]:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size <= 0:
            raise ValueError(f"shared memory file {path!r} is empty")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    holder = ctypes.c_char.from_buffer(mm)
    base = ctypes.addressof(holder)
    del holder  # release the export at once so unmap_all() can close the mapping
    return mm, base


# ---- describing worker memory -------------------------------------------------------------------

class _Region:
    __slots__ = ("start", "end", "perms", "offset", "dev", "inode", "path")

    def __init__(self, line: str) -> None:
        parts = line.rstrip("\n").split(None, 5)
        lo, hi = parts[0].split("-")
        self.start, self.end = int(lo, 16), int(hi, 16)
        self.perms = parts[1]
        self.offset = int(parts[2], 16)
        self.dev = parts[3]
        self.inode = int(parts[4])
        self.path = parts[5] if len(parts) > 5 else ""

    @property
    def shareable(self) -> bool:
        """A ``MAP_SHARED`` mapping of a /dev/shm file or a memfd: the daemon can map the same pages."""
        if len(self.perms) < 4 or self.perms[3] != "s" or self.inode == 0:
            return False
        return self.path.startswith(_SHM_DIR) or self.path.startswith("/memfd:")

    @property
    def deleted(self) -> bool:
        return self.path.endswith(_DELETED)

    def continues(self, prev: "_Region") -> bool:
        """Whether this region maps the file bytes right after ``prev`` (a mapping split by mprotect etc.)."""
        return (self.start == prev.end and self.dev == prev.dev and self.inode == prev.inode
                and self.offset == prev.offset + (prev.end - prev.start))


def _regions(pid: str = "self") -> List[_Region]:
    with open(f"/proc/{pid}/maps") as f:
        return [_Region(line) for line in f]


def _dev_of(region: _Region) -> Tuple[int, int]:
    major, minor = region.dev.split(":")
    return int(major, 16), int(minor, 16)


def _fd_path(region: _Region) -> Optional[str]:
    """``/proc/<pid>/fd/<n>`` of an open descriptor of the mapped file, if this process still holds one."""
    major, minor = _dev_of(region)
    pid = os.getpid()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in sorted(fds, key=lambda s: int(s) if s.isdigit() else -1):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if st.st_ino == region.inode and os.major(st.st_dev) == major and os.minor(st.st_dev) == minor:
            return f"/proc/{pid}/fd/{name}"
    return None


def _file_path(region: _Region) -> str:
    """A path another process can open to reach the file behind ``region``."""
    if region.path.startswith(_SHM_DIR) and not region.deleted:
        return region.path
    # memfds and unlinked files have no name: an open descriptor of ours, or the mapping itself
    # (``map_files`` needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the opener, as a root daemon has)
    return _fd_path(region) or f"/proc/{os.getpid()}/map_files/{region.start:x}-{region.end:x}"


def describe(address: int, length: int) -> Dict[str, Any]:
    """How the daemon can reach ``length`` bytes at ``address`` of this process.

    ``{"kind": "shared_file", "path", "file_offset", "length"}`` for memory in a shared mapping of a
    /dev/shm file or a memfd; ``{"kind": "process", "pid", "address", "length"}`` for anything else
    (anonymous memory, heap, stack, private file mappings), reached by cross-memory attach.

    Raises ``ValueError`` when the range is not mapped, or spans a shared mapping and something else.
    """
    if not isinstance(address, int) or not isinstance(length, int) or address <= 0 or length <= 0:
        raise ValueError(f"invalid memory range: address={address!r}, length={length!r}")
    end = address + length
    regions = _regions()
    i = bisect.bisect_right([r.start for r in regions], address) - 1
    if i < 0 or regions[i].end <= address:
        raise ValueError(f"memory 0x{address:x}..0x{end:x} ({length} bytes) is not mapped in this process")
    first = regions[i]
    covered = [first]
    while covered[-1].end < end:
        i += 1
        if i >= len(regions) or regions[i].start != covered[-1].end:
            raise ValueError(f"memory 0x{address:x}..0x{end:x} ({length} bytes) is not fully mapped in this "
                             f"process: the mapping ends at 0x{covered[-1].end:x}")
        covered.append(regions[i])
    shared = [r.shareable for r in covered]
    if all(shared) and all(b.continues(a) for a, b in itertools.pairwise(covered)):
        return {"kind": "shared_file", "path": _file_path(first),
                "file_offset": first.offset + (address - first.start), "length": length}
    if any(shared):
        raise ValueError(f"memory 0x{address:x}..0x{end:x} ({length} bytes) spans mappings with different "
                         f"backing ({', '.join(r.path or '[anonymous]' for r in covered)}); register each "
                         "mapping separately")
    return {"kind": "process", "pid": os.getpid(), "address": address, "length": length}


# ---- letting the daemon attach ------------------------------------------------------------------

PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value

_ptracer_pid: Optional[int] = None
_ptracer_lock = threading.Lock()


def allow_ptrace() -> bool:
    """Let any process of our user attach (``PR_SET_PTRACER_ANY``) for ``process_vm_readv``/``writev``.

    Needed where Yama's ``ptrace_scope`` is 1. Returns whether the call succeeded; ``False`` when
    Yama is absent (then nothing is needed) or refuses. Cheap to call again (per process: a forked
    child calls prctl itself).
    """
    global _ptracer_pid
    pid = os.getpid()
    with _ptracer_lock:
        if _ptracer_pid == pid:
            return True
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            prctl = libc.prctl
            prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            prctl.restype = ctypes.c_int
            ok = prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0
        except (OSError, AttributeError):
            return False
        if ok:
            _ptracer_pid = pid
        return ok


# ---- addresses and numpy ------------------------------------------------------------------------

def numpy_view(address: int, shape: Tuple[int, ...], np_dtype: Any) -> np.ndarray:
    """A writable array of ``shape``/``np_dtype`` over the memory at ``address`` (no copy, no ownership)."""
    dtype = np.dtype(np_dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    if not isinstance(address, int) or address <= 0:
        raise ValueError(f"invalid address {address!r}")
    buf = (ctypes.c_char * nbytes).from_address(address)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def address_of(obj: Any) -> int:
    """The address of the first byte of a numpy array or a C-contiguous buffer (bytearray, mmap, ...)."""
    if isinstance(obj, np.ndarray):
        return int(obj.ctypes.data)
    mv = obj if isinstance(obj, memoryview) else memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("buffer is not C-contiguous")
    if mv.nbytes == 0:
        raise ValueError("buffer is empty")
    if not mv.readonly:
        if mv.format not in ("B", "b", "c") or mv.ndim != 1:
            mv = mv.cast("B")
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)
