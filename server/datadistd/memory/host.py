"""The ``host`` memory backend: pools in private memfds, worker memory by file descriptor.

Pools. ``create_pool`` makes one memfd of ``capacity`` bytes, reserves its pages
(``posix_fallocate``, so a full shmem fails now with ``LLM_OUT_OF_MEMORY`` instead of a ``SIGBUS``
on first touch), seals its size (``F_SEAL_SHRINK | F_SEAL_GROW``, then ``F_SEAL_SEAL``), maps it
``MAP_SHARED`` and hands out page-aligned allocations with ``PageAllocator``. The memfd has no name in
any file system: no other process can open it. The engine's own worker gets its descriptor over
the attach socket (``export_fd``) and maps it, so its tensors and the daemon's handles alias the
same pages; the seals mean that worker cannot shrink it under the daemon's mapping.

**Both placements are host RAM here.** A ``DEVICE`` pool of this backend is emulated with host
shared memory, exactly like a ``HOST`` pool; real device memory is the job of the ``acl``
backend. This keeps the whole API usable (and testable) on any Linux machine.

Worker memory (``import_memory``) arrives as descriptors the worker sent; its handles and checks are
``imported.py``'s job (``import_fds``, ``import_process``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import threading

from ..core.errors import DataDistError, StatusCode, require
from ..core.types import Placement
from .base import FdRef, MemoryRef, ProcessRef
from .imported import (
    DirectHandle,
    FdHandle,
    MappedFdHandle,
    PiecesHandle,
    ViewHandle,
    close_mapping,
    import_fds,
    import_process,
    release_view,
)
from .pool import PoolBase

__all__ = ["HostBackend", "HostPool", "PoolHandle"]

log = logging.getLogger(__name__)

_DEFAULT_SHM_DIR = "/dev/shm"


# ---- pools ------------------------------------------------------------------------------------

class PoolHandle(ViewHandle):
    """One allocation of a ``HostPool``: a zero-copy slice of the pool's mapping."""

    def __init__(self, pool: "HostPool", offset: int, length: int, view: memoryview) -> None:
        self.pool = pool
        self.offset = offset
        self._size = length
        self._view = view

    def close(self) -> None:
        view, self._view = self._view, None
        release_view(view)

    def __repr__(self) -> str:
        return f"PoolHandle({self.pool.name!r}, offset={self.offset}, size={self._size})"


class HostPool(PoolBase[PoolHandle]):
    """A fixed-capacity pool in one sealed memfd; thread-safe; never over-commits."""

    def __init__(self, name: str, placement: Placement, capacity: int, page_shift: int = 16,
                 reserve: bool = True) -> None:
        super().__init__(name, placement, capacity, page_shift)   # name: the pool's id (a memfd: no file name)
        self._mm: mmap.mmap | None = None
        self._root: memoryview | None = None
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise DataDistError(StatusCode.LLM_FAILED, f"cannot create memfd for pool {name!r}: "
                                                       f"{os.strerror(exc.errno or 0)}") from None
        try:
            os.ftruncate(fd, capacity)
            _reserve(fd, capacity, name, reserve)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._mm = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass  # shmem huge pages disabled: plain pages are fine
        self._root = memoryview(self._mm)

    def export_fd(self) -> int:
        """The pool's memfd (still owned by the pool: the caller sends a copy, never closes it)."""
        with self._lock:
            if self._closed or self._fd is None:
                raise self._closed_error()
            return self._fd

    def _handle(self, offset: int, size: int) -> PoolHandle:
        assert self._root is not None   # open (PoolBase checked)
        return PoolHandle(self, offset, size, self._root[offset:offset + size])

    def _release(self) -> None:
        """Unmap the pool and close its memfd: the memory goes back to the system once the worker that
        mapped it unmaps it too."""
        root, self._root = self._root, None
        mm, self._mm = self._mm, None
        fd, self._fd = self._fd, None
        release_view(root)
        close_mapping(mm, f"pool {self._name!r}")
        if fd is not None:
            os.close(fd)


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


# ---- the backend ------------------------------------------------------------------------------

class HostBackend:
    """Memfd pools and worker memory by file descriptor (see the module doc)."""

    name = "host"

    def __init__(self, shm_dir: str = _DEFAULT_SHM_DIR, prefix: str = "datadist", reserve: bool = True) -> None:
        """``shm_dir``: the node's shared-memory directory (pools themselves are memfds, in no directory)."""
        require(bool(prefix) and "/" not in prefix, f"prefix must be a non-empty file name part, got {prefix!r}")
        self.shm_dir = shm_dir
        self.prefix = prefix
        self.reserve = reserve
        self._pools: list[HostPool] = []
        self._lock = threading.Lock()

    def create_pool(self, placement: Placement, capacity: int, page_shift: int = 16) -> HostPool:
        placement = Placement(placement)
        name = f"{self.prefix}-{os.getpid()}-{placement.name.lower()}-{secrets.token_hex(8)}"
        pool = HostPool(name, placement, capacity, page_shift, self.reserve)
        with self._lock:
            self._pools = [p for p in self._pools if not p.closed]
            self._pools.append(pool)
        log.debug("created %s pool %s of %d bytes", placement.name, name, capacity)
        return pool

    def import_memory(self, ref: MemoryRef) -> MappedFdHandle | PiecesHandle | FdHandle | DirectHandle:
        if isinstance(ref, FdRef):
            return import_fds(ref)
        if isinstance(ref, ProcessRef):
            return import_process(ref)
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
