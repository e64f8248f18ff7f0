"""The ``host`` memory backend: pools in POSIX shared memory, worker memory by mapping or attach.

Pools. ``create_pool`` makes one file ``{shm_dir}/{prefix}-{daemon pid}-{placement}-{random hex}``
of ``capacity`` bytes, reserves its pages (``posix_fallocate``, so a full ``/dev/shm`` fails now
with ``LLM_OUT_OF_MEMORY`` instead of a ``SIGBUS`` on first touch), maps it ``MAP_SHARED`` and
hands out page-aligned pieces with ``PageAllocator``. A worker maps the same file (``Allocation.path``
at ``Allocation.file_offset``), so its tensors and the daemon's handles alias the same pages.

**Both placements are host RAM here.** A ``DEVICE`` pool of this backend is emulated with host
shared memory, exactly like a ``HOST`` pool; real device memory is the job of the ``acl`` and
``cuda`` backends. This keeps the whole API usable (and testable) on any Linux machine.

Worker memory (``import_memory``):

* ``SharedFileRef`` - a file under ``/dev/shm`` (or the configured ``shm_dir``), or a memfd reached
  through ``/proc/<pid>/fd/<n>`` / ``/proc/<pid>/map_files/<range>``: mapped ``MAP_SHARED``, zero copy.
  Other paths are refused, so a worker cannot make the daemon write into arbitrary files.
* ``ProcessRef`` of the daemon's own process (embedded mode): a direct view of that address range.
* ``ProcessRef`` of another process: cross-memory attach (``process_vm_readv``/``writev``, see
  ``xmem``); ``view()`` is ``None``. The first and last byte are probed at import so a bad pid,
  address or permission fails at registration with a message that says what to do.

``HostBackend.cleanup_stale`` removes pool files of daemons that died without closing them.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import re
import secrets
import stat
import threading
from typing import Any, Sequence

import numpy as np

from ..core.allocator import PageAllocator
from ..core.errors import DataDistError, StatusCode, require
from ..core.types import Placement
from . import xmem
from .base import Allocation, MemoryRef, ProcessRef, SharedFileRef

__all__ = ["HostBackend", "HostPool", "PoolHandle", "MappedFileHandle", "DirectHandle", "ProcessHandle"]

log = logging.getLogger(__name__)

_PAGE = mmap.ALLOCATIONGRANULARITY
_DEFAULT_SHM_DIR = "/dev/shm"
_DELETED = " (deleted)"


def _check_range(handle: Any, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > handle.size:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"range [{offset}, {offset + length}) is outside memory of {handle.size} bytes")


def _release(view: memoryview | None) -> None:
    if view is not None:
        try:
            view.release()
        except BufferError:  # someone still holds an export of it; the GC finishes the job
            pass


def _close_mmap(mm: mmap.mmap | None, what: str) -> None:
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        # views of this mapping are still alive somewhere; unmapping now would leave them dangling,
        # so the mapping goes when the last of them is garbage collected
        log.warning("%s is still referenced by live views; it will be unmapped when they are released", what)


# ---- handles ----------------------------------------------------------------------------------

class _ViewHandle:
    """A handle whose memory is mapped in the daemon: reads and writes are slice copies of ``view()``."""

    _view: memoryview | None
    _size: int

    @property
    def size(self) -> int:
        return self._size

    def _live_view(self) -> memoryview:
        if self._view is None:
            raise DataDistError(StatusCode.LLM_FAILED, f"{type(self).__name__} is closed")
        return self._view

    def view(self) -> memoryview | None:
        return self._live_view()

    def read_into(self, offset: int, dst: memoryview) -> None:
        out = memoryview(dst).cast("B")
        n = len(out)
        _check_range(self, offset, n)
        out[:] = self._live_view()[offset:offset + n]

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        data = memoryview(src).cast("B")
        n = len(data)
        _check_range(self, offset, n)
        self._live_view()[offset:offset + n] = data


class PoolHandle(_ViewHandle):
    """One allocation of a ``HostPool``: a zero-copy slice of the pool's mapping."""

    def __init__(self, pool: "HostPool", offset: int, length: int, view: memoryview) -> None:
        self.pool = pool
        self.offset = offset
        self._size = length
        self._view = view

    def close(self) -> None:
        view, self._view = self._view, None
        _release(view)

    def __repr__(self) -> str:
        return f"PoolHandle({self.pool.path!r}, offset={self.offset}, size={self._size})"


class MappedFileHandle(_ViewHandle):
    """Worker memory in a shared file, mapped into the daemon (``SharedFileRef``)."""

    def __init__(self, path: str, file_offset: int, length: int, fd: int) -> None:
        """Map ``length`` bytes at ``file_offset`` of the open file ``fd`` (closed here, mapped or not)."""
        self.path = path
        self.file_offset = file_offset
        self._size = length
        self._mm: mmap.mmap | None = None
        self._view = None
        delta = file_offset % _PAGE
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"shared memory {path!r} is not a regular file")
            if file_offset + length > st.st_size:
                raise DataDistError(
                    StatusCode.LLM_PARAM_INVALID,
                    f"shared memory {path!r} is {st.st_size} bytes; range [{file_offset}, {file_offset + length}) "
                    "does not fit")
            try:
                self._mm = mmap.mmap(fd, delta + length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                     offset=file_offset - delta)
            except OSError as exc:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"cannot map shared memory {path!r}: {os.strerror(exc.errno or 0)}") from None
        finally:
            os.close(fd)
        self._view = memoryview(self._mm)[delta:delta + length]

    def close(self) -> None:
        view, self._view = self._view, None
        _release(view)
        mm, self._mm = self._mm, None
        _close_mmap(mm, f"mapping of {self.path!r}")

    def __repr__(self) -> str:
        return f"MappedFileHandle({self.path!r}, file_offset={self.file_offset}, size={self._size})"


class DirectHandle(_ViewHandle):
    """Memory of the daemon's own process (embedded mode), viewed in place by address."""

    def __init__(self, address: int, length: int) -> None:
        self.address = address
        self._size = length
        self._buf: Any = (ctypes.c_char * length).from_address(address)
        self._view = memoryview(self._buf).cast("B")

    def close(self) -> None:
        view, self._view = self._view, None
        _release(view)
        self._buf = None

    def __repr__(self) -> str:
        return f"DirectHandle(address=0x{self.address:x}, size={self._size})"


class ProcessHandle:
    """Memory of another process, reached with ``process_vm_readv``/``writev``; ``view()`` is ``None``.

    Besides the ``MemoryHandle`` methods it offers ``read_raw``/``write_raw``: many pieces in few
    system calls, used by ``copy_segments``.
    """

    def __init__(self, pid: int, address: int, length: int) -> None:
        self.pid = pid
        self.address = address
        self._size = length
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    def view(self) -> memoryview | None:
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise DataDistError(StatusCode.LLM_FAILED, f"{self!r} is closed")

    def read_into(self, offset: int, dst: memoryview) -> None:
        self._check_open()
        nbytes = memoryview(dst).nbytes
        _check_range(self, offset, nbytes)
        xmem.read_remote(self.pid, self.address + offset, dst)

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        self._check_open()
        nbytes = memoryview(src).nbytes
        _check_range(self, offset, nbytes)
        xmem.write_remote(self.pid, self.address + offset, src)

    def read_raw(self, pieces: Sequence[tuple[int, int, int]]) -> int:
        """Copy ``(offset, local_addr, length)`` pieces of this memory to local addresses."""
        self._check_open()
        return xmem.readv_raw(self.pid, self._remote(pieces))

    def write_raw(self, pieces: Sequence[tuple[int, int, int]]) -> int:
        """Copy local addresses into ``(offset, local_addr, length)`` pieces of this memory."""
        self._check_open()
        return xmem.writev_raw(self.pid, self._remote(pieces))

    def _remote(self, pieces: Sequence[tuple[int, int, int]]) -> np.ndarray:
        """``(offset, local, length)`` rows -> ``(remote_addr, local, length)`` rows, bounds-checked."""
        arr = np.array(pieces, dtype=np.int64).reshape(-1, 3)
        if len(arr):
            offsets, lengths = arr[:, 0], arr[:, 2]
            bad = (offsets < 0) | (lengths < 0) | (offsets + lengths > self._size)
            if bad.any():
                k = int(np.argmax(bad))
                _check_range(self, int(offsets[k]), int(lengths[k]))
            arr[:, 0] += self.address
        return arr

    def probe(self) -> None:
        """Read the first and the last byte: fails now if the pid, the address or the permission is wrong."""
        one = bytearray(1)
        for addr in {self.address, self.address + self._size - 1}:
            try:
                xmem.read_remote(self.pid, addr, one)
            except DataDistError as exc:
                raise DataDistError(
                    StatusCode.LLM_PARAM_INVALID,
                    f"cannot reach memory 0x{self.address:x}+{self._size} of worker process {self.pid} by "
                    f"cross-memory attach: {exc.message}") from None

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"ProcessHandle(pid={self.pid}, address=0x{self.address:x}, size={self._size})"


# ---- pools ------------------------------------------------------------------------------------

class HostPool:
    """A fixed-capacity pool in one shared-memory file; thread-safe; never over-commits."""

    def __init__(self, path: str, placement: Placement, capacity: int, page_shift: int = 16,
                 file_mode: int = 0o600, reserve: bool = True) -> None:
        require(isinstance(capacity, int) and capacity > 0, f"pool capacity must be > 0 bytes, got {capacity!r}")
        self.path = path
        self._placement = Placement(placement)
        self._capacity = capacity
        self._allocator = PageAllocator(capacity, page_shift)
        self._lock = threading.Lock()
        self._live: dict[int, PoolHandle] = {}
        self._closed = False
        self._mm: mmap.mmap | None = None
        self._root: memoryview | None = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode)
        except OSError as exc:
            raise DataDistError(StatusCode.LLM_FAILED,
                                f"cannot create shared-memory file {path!r}: {os.strerror(exc.errno or 0)}") from None
        try:
            os.fchmod(fd, file_mode)  # the umask must not narrow what workers need
            os.ftruncate(fd, capacity)
            _reserve(fd, capacity, path, reserve)
            self._mm = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass  # shmem huge pages disabled: plain pages are fine
        self._root = memoryview(self._mm)

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def used(self) -> int:
        """Bytes in allocated pages (allocations are rounded up to whole pages)."""
        return self._allocator.used

    @property
    def page_size(self) -> int:
        return self._allocator.page_size

    @property
    def closed(self) -> bool:
        return self._closed

    def allocate(self, size: int) -> Allocation:
        require(isinstance(size, int) and size > 0, f"allocation size must be > 0 bytes, got {size!r}")
        with self._lock:
            if self._closed or self._root is None:
                raise DataDistError(StatusCode.LLM_FAILED, f"pool {self.path!r} is closed")
            offset = self._allocator.allocate(size)
            handle = PoolHandle(self, offset, size, self._root[offset:offset + size])
            self._live[offset] = handle
        return Allocation(handle, self.path, offset, size)

    def free(self, allocation: Allocation) -> None:
        """Return an allocation; freeing after ``close()`` is a no-op, freeing twice is an error."""
        with self._lock:
            if self._closed:
                return
            handle = self._live.get(allocation.file_offset)
            if handle is None or handle is not allocation.handle:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"allocation at offset {allocation.file_offset} is not live in pool {self.path!r}")
            del self._live[allocation.file_offset]
            self._allocator.free(allocation.file_offset)
        handle.close()

    def close(self) -> None:
        """Invalidate every allocation, unmap and unlink the file; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._live.values())
            self._live.clear()
            root, self._root = self._root, None
            mm, self._mm = self._mm, None
        for handle in handles:
            handle.close()
        _release(root)
        _close_mmap(mm, f"pool {self.path!r}")
        _unlink(self.path)

    def __repr__(self) -> str:
        return (f"HostPool({self.path!r}, placement={self._placement.name}, capacity={self._capacity}, "
                f"used={self.used})")


def _reserve(fd: int, capacity: int, path: str, reserve: bool) -> None:
    if not reserve or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, capacity)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise DataDistError(
                StatusCode.LLM_OUT_OF_MEMORY,
                f"cannot reserve {capacity} bytes of shared memory for {path!r}: {os.strerror(exc.errno)} "
                "(enlarge the shm filesystem or lower the pool size)") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise DataDistError(StatusCode.LLM_FAILED,
                                f"cannot reserve shared memory for {path!r}: {os.strerror(exc.errno or 0)}") from None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove shared-memory file %s: %s", path, os.strerror(exc.errno or 0))


# ---- opening worker files ---------------------------------------------------------------------

_PROC_LINK = re.compile(r"^/proc/(\d+|self)/(fd|map_files)/[0-9a-fA-F-]+$")


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _shareable_target(target: str, allowed_dirs: Sequence[str]) -> bool:
    """A memfd, or a file inside an allowed shared-memory directory (possibly unlinked)."""
    if target.endswith(_DELETED):
        target = target[:-len(_DELETED)]
    if target.startswith("/memfd:"):
        return True
    return any(_under(target, d) for d in allowed_dirs)


def _open_shared(path: str, allowed_dirs: Sequence[str]) -> int:
    """Open a worker's shared memory read-write, refusing anything but shm files and memfds."""
    if _PROC_LINK.match(path):
        try:
            target = os.readlink(path)
        except OSError as exc:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"cannot resolve shared memory {path!r}: {os.strerror(exc.errno or 0)} (the worker "
                                "must keep the memfd open, or the daemon needs CAP_SYS_ADMIN for map_files)") from None
        if not _shareable_target(target, allowed_dirs):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"{path!r} points to {target!r}, which is neither a memfd nor a shared-memory file")
        open_path, flags = path, 0
    else:
        real = os.path.realpath(path)
        if not os.path.isabs(path) or not _shareable_target(real, allowed_dirs):
            raise DataDistError(
                StatusCode.LLM_PARAM_INVALID,
                f"shared memory {path!r} is not under {' or '.join(allowed_dirs)}: register memory from "
                "/dev/shm, a memfd, or plain process memory")
        open_path, flags = real, os.O_NOFOLLOW
    try:
        return os.open(open_path, os.O_RDWR | os.O_CLOEXEC | flags)
    except OSError as exc:
        raise DataDistError(
            StatusCode.LLM_PARAM_INVALID,
            f"cannot open shared memory {path!r} read-write: {os.strerror(exc.errno or 0)} (the daemon's user needs "
            "read-write access to it)") from None


# ---- /proc/self/maps --------------------------------------------------------------------------

def _self_range_writable(address: int, length: int) -> str | None:
    """``None`` if [address, address+length) is mapped readable and writable here, else why not."""
    end = address + length
    cursor = address
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            span, perms = line.split(None, 2)[:2]
            lo_s, hi_s = span.split(b"-")
            lo, hi = int(lo_s, 16), int(hi_s, 16)
            if hi <= cursor:
                continue
            if lo > cursor:
                break
            if not perms.startswith(b"rw"):
                return f"memory at 0x{cursor:x} is not writable ({perms.decode()})"
            cursor = hi
            if cursor >= end:
                return None
    return f"memory at 0x{cursor:x} is not mapped in the daemon process"


# ---- the backend ------------------------------------------------------------------------------

class HostBackend:
    """Shared-memory pools and worker memory by mapping or cross-memory attach (see the module doc)."""

    name = "host"

    def __init__(self, shm_dir: str = _DEFAULT_SHM_DIR, prefix: str = "datadist", file_mode: int = 0o600,
                 reserve: bool = True) -> None:
        require(bool(prefix) and "/" not in prefix, f"prefix must be a non-empty file name part, got {prefix!r}")
        self.shm_dir = shm_dir
        self.prefix = prefix
        self.file_mode = file_mode
        self.reserve = reserve
        self._pools: list[HostPool] = []
        self._lock = threading.Lock()
        # where worker shared files may live: /dev/shm and our own shm_dir (memfds are always fine)
        self._allowed_dirs = tuple(dict.fromkeys(os.path.realpath(d) for d in (_DEFAULT_SHM_DIR, shm_dir)))

    def create_pool(self, placement: Placement, capacity: int, page_shift: int = 16) -> HostPool:
        placement = Placement(placement)
        path = os.path.join(self.shm_dir,
                            f"{self.prefix}-{os.getpid()}-{placement.name.lower()}-{secrets.token_hex(8)}")
        pool = HostPool(path, placement, capacity, page_shift, self.file_mode, self.reserve)
        with self._lock:
            self._pools = [p for p in self._pools if not p.closed]
            self._pools.append(pool)
        log.debug("created %s pool %s of %d bytes", placement.name, path, capacity)
        return pool

    def import_memory(self, ref: MemoryRef) -> MappedFileHandle | DirectHandle | ProcessHandle:
        if isinstance(ref, SharedFileRef):
            require(isinstance(ref.path, str) and ref.path != "", "shared memory path is empty")
            require(ref.file_offset >= 0, f"file_offset must be >= 0, got {ref.file_offset}")
            require(ref.length > 0, f"length must be > 0, got {ref.length}")
            fd = _open_shared(ref.path, self._allowed_dirs)
            return MappedFileHandle(ref.path, ref.file_offset, ref.length, fd)
        if isinstance(ref, ProcessRef):
            require(ref.pid > 0, f"pid must be > 0, got {ref.pid}")
            require(ref.address > 0, f"address must be > 0, got 0x{ref.address:x}")
            require(ref.length > 0, f"length must be > 0, got {ref.length}")
            if ref.pid == os.getpid():
                why = _self_range_writable(ref.address, ref.length)
                if why is not None:
                    raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                        f"cannot use memory 0x{ref.address:x}+{ref.length}: {why}")
                return DirectHandle(ref.address, ref.length)
            handle = ProcessHandle(ref.pid, ref.address, ref.length)
            handle.probe()
            return handle
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unsupported memory reference {type(ref).__name__}")

    @staticmethod
    def cleanup_stale(shm_dir: str = _DEFAULT_SHM_DIR, prefix: str = "datadist") -> list[str]:
        """Remove ``{prefix}-{pid}-*`` files of ``shm_dir`` whose daemon pid is dead; returns the paths removed."""
        pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-")
        removed: list[str] = []
        try:
            names = os.listdir(shm_dir)
        except OSError:
            return removed
        for name in names:
            m = pattern.match(name)
            if m is None:
                continue
            pid = int(m.group(1))
            if pid == os.getpid() or _alive(pid):
                continue
            path = os.path.join(shm_dir, name)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                os.unlink(path)
            except OSError:
                continue
            removed.append(path)
        if removed:
            log.info("removed %d stale shared-memory files from %s", len(removed), shm_dir)
        return removed

    def close(self) -> None:
        """Close every pool this backend created (idempotent)."""
        with self._lock:
            pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
