"""Worker-side memory helpers: map daemon pools, hand registered memory to the daemon, raw views.

* ``Mapper`` maps the pools the daemon allocated caches in (private memfds whose descriptors it
  hands us over the attach socket), so ``Cache.tensor_addrs`` are real addresses in this process.
* ``share`` turns a registered range of this process into file descriptors the daemon can map:
  the daemon never reaches into our process (no ptrace) and never opens a path we name.

  - memory already in a shared mapping of a memfd or a ``/dev/shm`` file: that file;
  - plain private memory (numpy arrays, torch CPU tensors, the heap): **re-backed** -- the pages
    covering the range are copied into a new memfd that is then mapped ``MAP_SHARED|MAP_FIXED`` over
    them, at the same virtual address, with the same contents; the memfd is sealed against
    shrinking so the daemon's mapping of it can never fault. Afterwards the process and the daemon
    see the same pages: zero copy on both sides.

  Limits of re-backing (docs/security.md has the full list): whole pages are re-backed, so objects
  sharing the first or last page with the range are shared with the daemon too (the daemon only
  touches the registered bytes); a thread that writes into those pages *while* registration
  copies them may lose that write (Python threads cannot: the copy and the remap run with the GIL
  held; native threads can); the pages stay shared memory after the array is freed; a child made
  with ``os.fork`` gets private copies again (a fork handler copies them back), one made by a C
  ``fork()`` that bypasses Python shares them with the parent.
* ``numpy_view`` / ``address_of`` convert between addresses and numpy arrays without copying.

This module is private to ``llm_datadist`` and imports nothing of the daemon.
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import math
import mmap
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

__all__ = ["Mapper", "Shared", "share", "numpy_view", "address_of", "PAGE"]

PAGE = mmap.PAGESIZE
_DELETED = " (deleted)"
_SHM_DIR = "/dev/shm/"
_ANON_NAMES = ("", "[heap]")

# libc through PyDLL: these calls keep the GIL, so no Python thread runs between copying the pages and
# mapping the copy over them
_pylibc = ctypes.PyDLL(None, use_errno=True)
_mmap = _pylibc.mmap
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mmap.restype = ctypes.c_void_p
_mremap = _pylibc.mremap
_mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
_mremap.restype = ctypes.c_void_p
_memcpy = _pylibc.memcpy
_memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_memcpy.restype = ctypes.c_void_p
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_RW = mmap.PROT_READ | mmap.PROT_WRITE


# ---- mapping daemon pools -----------------------------------------------------------------------

class Mapper:
    """Maps each daemon pool once (``MAP_SHARED``, read-write) and hands out addresses inside it.

    ``fetch(pool)`` returns ``(fd, size)`` of a pool (the attach socket's ``export_pool``); the
    descriptor is closed once mapped. The mappings stay until ``unmap_all()``; arrays made from those
    addresses must not be used after it (the memory is no longer mapped).
    """

    def __init__(self, fetch: Callable[[str], Tuple[int, int, str, int]]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._maps: Dict[str, Tuple[Any, int]] = {}  # pool -> (mapping, base address)

    def map(self, pool: str, file_offset: int, length: int) -> int:
        """The address in this process of ``length`` bytes at ``file_offset`` of ``pool``."""
        if file_offset < 0 or length < 0:
            raise ValueError(f"invalid range: file_offset={file_offset}, length={length}")
        with self._lock:
            entry = self._maps.get(pool)
            if entry is None:
                fd, size, key, device = self._fetch(pool)
                if file_offset + length > size:       # checked before anything is mapped
                    if fd >= 0:
                        os.close(fd)
                    raise ValueError(_outside(pool, file_offset, length, size))
                entry = self._maps[pool] = _import_device(key, device, size) if key else _map_fd(fd, size)
            mm, base = entry
            if file_offset + length > len(mm):
                raise ValueError(_outside(pool, file_offset, length, len(mm)))
            return base + file_offset

    def mapped_pools(self) -> List[str]:
        with self._lock:
            return list(self._maps)

    def unmap_all(self) -> None:
        """Unmap every pool; addresses handed out before are invalid afterwards."""
        with self._lock:
            maps, self._maps = self._maps, {}
        for mm, _ in maps.values():
            try:
                mm.close()
            except BufferError:  # a Python buffer still exports it; it goes when that is released
                pass


def _outside(pool: str, file_offset: int, length: int, size: int) -> str:
    return f"range [{file_offset}, {file_offset + length}) is outside pool {pool!r} ({size} bytes)"


class _DeviceImport:
    """An NPU pool imported by IPC key: its length, and ``close()`` (``aclrtIpcMemClose``) like an mmap's."""

    def __init__(self, key: str, size: int, device: int) -> None:
        self.key = key
        self.size = size
        self.device = device

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        from datadist_ascend.acl import acl

        with acl().on_device(self.device):   # the caller's thread keeps its own device
            acl().ipc_close(self.device, self.key)


def _import_device(key: str, physical: int, size: int) -> Tuple[_DeviceImport, int]:
    """This process's address of an NPU pool the daemon exported for it on physical NPU ``physical`` (CANN's
    runtime: ``datadist_ascend``), imported on this process's logical id of that NPU."""
    from datadist_ascend.acl import acl

    device = acl().logical_id(physical)
    if device is None:
        raise ValueError(f"datadistd exported the pool on NPU {physical} (physical id), which this process does not "
                         "see (ASCEND_RT_VISIBLE_DEVICES)")
    with acl().on_device(device):   # the caller's thread keeps its own device
        return _DeviceImport(key, size, device), acl().ipc_import(device, key)


#: a pool is mapped only when its size can change no more: a pool that shrinks under the mapping faults (SIGBUS)
#: at the next touch of a page past its new end (the daemon's pools are sealed so: ``memory/host.py``)
_SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def _map_fd(fd: int, size: int) -> Tuple[mmap.mmap, int]:
    """Map a pool descriptor the daemon handed over (closed here); ValueError saying why when it is not a pool
    of ``size`` bytes sealed against shrinking and growing."""
    try:
        # the seals first: only once the size can change no more does the size read next stay true (the sender
        # may still hold the descriptor, shrink it after a size check and seal it then)
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0         # not a memfd: nothing can be sealed
        if seals & _SIZE_SEALS != _SIZE_SEALS:
            raise ValueError("the pool descriptor is not sealed against shrinking and growing (F_SEAL_SHRINK | "
                             f"F_SEAL_GROW; seals {seals:#x}): its size could change under the mapping")
        if size <= 0 or os.fstat(fd).st_size < size:
            raise ValueError(f"the pool descriptor does not hold {size} bytes")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, _RW)
    finally:
        os.close(fd)
    holder = ctypes.c_char.from_buffer(mm)
    base = ctypes.addressof(holder)
    del holder  # release the export at once so unmap_all() can close the mapping
    return mm, base


# ---- the process's mappings ---------------------------------------------------------------------

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
        """A ``MAP_SHARED`` mapping of a /dev/shm file or a memfd: the daemon can map the same file."""
        if len(self.perms) < 4 or self.perms[3] != "s" or self.inode == 0:
            return False
        return self.path.startswith(_SHM_DIR) or self.path.startswith("/memfd:")

    @property
    def anonymous(self) -> bool:
        """Private anonymous read-write memory (heap, malloc'd arenas, numpy/torch buffers)."""
        return (self.perms[:2] == "rw" and self.perms[3:4] == "p" and self.inode == 0
                and (self.path in _ANON_NAMES or self.path.startswith("[anon:")))

    @property
    def deleted(self) -> bool:
        return self.path.endswith(_DELETED)

    @property
    def key(self) -> Tuple[int, int, int]:
        major, minor = self.dev.split(":")
        return int(major, 16), int(minor, 16), self.inode


def _regions() -> List[_Region]:
    with open("/proc/self/maps") as f:
        return [_Region(line) for line in f]


# ---- re-backing private memory ------------------------------------------------------------------

@dataclass
class _Rebacked:
    start: int
    end: int
    fd: int                     # our memfd, kept open: later registrations of the same pages send it again


_rebacked: Dict[Tuple[int, int, int], _Rebacked] = {}    # (dev major, minor, inode) -> region
_lock = threading.Lock()


def _reback(lo: int, hi: int) -> _Rebacked:
    """Replace the private pages [lo, hi) by a sealed memfd holding the same bytes, at the same address."""
    n = hi - lo
    fd = os.memfd_create("datadist-registered", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, n)
        tmp = mmap.mmap(fd, n, mmap.MAP_SHARED, _RW)
        try:
            holder = ctypes.c_char.from_buffer(tmp)
            tmp_addr = ctypes.addressof(holder)
            del holder
            _memcpy(tmp_addr, lo, n)                                        # GIL held from here ...
            res = _mmap(lo, n, _RW, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)    # ... to here
        finally:
            tmp.close()
        if res is None or res == _MAP_FAILED:
            raise ValueError(f"cannot re-back memory 0x{lo:x}..0x{hi:x} with shared memory: "
                             f"{os.strerror(ctypes.get_errno())}")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    region = _Rebacked(lo, hi, fd)
    _rebacked[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = region
    return region


def _private_again_in_child() -> None:
    """After ``os.fork`` in the child: give it private copies of what is still mapped of every re-backed
    range (fork semantics: the child's writes must never reach the parent's pages)."""
    global _rebacked
    mine, _rebacked = _rebacked, {}
    if not mine:
        return
    for r in _regions():
        if r.key in mine and r.perms.startswith("r"):
            n = r.end - r.start
            tmp = _mmap(None, n, _RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
            if tmp is not None and tmp != _MAP_FAILED:
                _memcpy(tmp, r.start, n)
                _mremap(tmp, n, n, _MREMAP_MAYMOVE | _MREMAP_FIXED, r.start)
    for region in mine.values():
        os.close(region.fd)


def _forget_unmapped(regions: List[_Region]) -> None:
    """Close our memfds whose every mapping is gone (the registered array was freed)."""
    live = {r.key for r in regions}
    for key in [k for k in _rebacked if k not in live]:
        os.close(_rebacked.pop(key).fd)


os.register_at_fork(after_in_child=_private_again_in_child)


# ---- sharing registered memory ------------------------------------------------------------------

@dataclass
class Shared:
    """Registered memory as descriptors: piece i is ``pieces[i]`` = (file_offset, length) of ``fds[i]``,
    the pieces laid end to end hold the range at ``offset``. Close with ``close()`` once sent."""

    fds: List[int]
    pieces: List[Tuple[int, int]]
    offset: int
    length: int
    _own: List[int] = field(default_factory=list)     # descriptors opened for this call only

    def close(self) -> None:
        for fd in self._own:
            os.close(fd)
        self._own = []


def _fd_of(region: _Region, own: List[int]) -> int:
    """A read-write descriptor of the file behind a shared mapping of ours."""
    mine = _rebacked.get(region.key)
    if mine is not None:
        return mine.fd
    if region.path.startswith(_SHM_DIR) and not region.deleted:
        fd = os.open(region.path, os.O_RDWR | os.O_CLOEXEC)
        own.append(fd)
        return fd
    major, minor, inode = region.key
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = []
    for name in names:
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if st.st_ino == inode and os.major(st.st_dev) == major and os.minor(st.st_dev) == minor:
            fd = os.open(f"/proc/self/fd/{name}", os.O_RDWR | os.O_CLOEXEC)   # read-write, whatever it was
            own.append(fd)
            return fd
    raise ValueError(f"memory 0x{region.start:x}..0x{region.end:x} is a shared mapping of {region.path!r}, but this "
                     "process holds no descriptor of it any more; keep the memfd open while it is registered")


def share(address: int, length: int) -> Shared:
    """Descriptors through which the daemon reaches ``length`` bytes at ``address`` (see the module doc).

    Raises ``ValueError`` when the range is not fully mapped, or covers memory that is neither a
    shared memfd/``/dev/shm`` mapping nor private anonymous read-write memory (a file mapping, the
    stack, read-only memory).
    """
    if not isinstance(address, int) or not isinstance(length, int) or address <= 0 or length <= 0:
        raise ValueError(f"invalid memory range: address={address!r}, length={length!r}")
    if address + length > 1 << 64:
        raise ValueError(f"memory 0x{address:x} + {length} bytes overflows the address space")
    lo = address - address % PAGE
    hi = -(-(address + length) // PAGE) * PAGE
    with _lock:
        regions = _regions()
        _forget_unmapped(regions)
        starts = [r.start for r in regions]
        i = bisect.bisect_right(starts, lo) - 1
        if i < 0 or regions[i].end <= lo:
            raise ValueError(f"memory 0x{address:x}..0x{address + length:x} ({length} bytes) is not mapped in this "
                             "process")
        out = Shared([], [], address - lo, length)
        cursor = lo
        try:
            while cursor < hi:
                if i >= len(regions) or regions[i].start > cursor:
                    raise ValueError(f"memory 0x{address:x}..0x{address + length:x} ({length} bytes) is not fully "
                                     f"mapped in this process: nothing is mapped at 0x{cursor:x}")
                r = regions[i]
                if r.shareable:
                    end = min(r.end, hi)
                    fd = _fd_of(r, out._own)
                    _add(out, fd, r.offset + (cursor - r.start), end - cursor)
                elif r.anonymous:
                    # one memfd over the whole run of private anonymous regions from here
                    j, end = i, min(r.end, hi)
                    while end < hi and j + 1 < len(regions) and regions[j + 1].start == end \
                            and regions[j + 1].anonymous:
                        j += 1
                        end = min(regions[j].end, hi)
                    _add(out, _reback(cursor, end).fd, 0, end - cursor)
                    i = j
                else:
                    raise ValueError(
                        f"memory at 0x{cursor:x} ({r.path or 'anonymous'}, {r.perms}) cannot be handed to the "
                        "daemon: register private read-write memory (numpy, torch CPU tensors), a memfd or a "
                        "/dev/shm mapping")
                cursor = end
                i += 1
            if len(out.fds) > 16:
                raise ValueError(f"memory 0x{address:x}+{length} spans {len(out.fds)} separately shared pieces; "
                                 "at most 16 per registered address")
        except BaseException:
            out.close()
            raise
    return out


def _add(out: Shared, fd: int, file_offset: int, length: int) -> None:
    """Append a piece, merging it into the previous one when it continues the same descriptor."""
    if out.fds and out.fds[-1] == fd:
        prev_off, prev_len = out.pieces[-1]
        if prev_off + prev_len == file_offset:
            out.pieces[-1] = (prev_off, prev_len + length)
            return
    out.fds.append(fd)
    out.pieces.append((file_offset, length))


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
