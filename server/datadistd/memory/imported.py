"""Memory a worker hands the daemon (``MemoryBackend.import_memory`` of the ``host`` backend): the handles.

Worker memory arrives as descriptors the worker sent (``FdRef``, ``import_fds``):

* every piece a memfd sealed against shrinking (``F_SEAL_SHRINK``; the client seals the memfds
  it makes): mapped ``MAP_SHARED``, zero copy (``MappedFdHandle``; several pieces are mapped
  end to end into one reserved range, ``PiecesHandle``). Nobody can truncate the file, so a
  daemon access can never fault with ``SIGBUS``;
* one piece that is not sealed (a ``/dev/shm`` file, an unsealed memfd, ``torch``'s shared
  memory): read and written with ``preadv``/``pwritev`` on the descriptor, never mapped
  (``FdHandle``), so a later truncation only makes a transfer fail with ``LLM_PARAM_INVALID``;
* several pieces not all sealed: refused.

Each descriptor must be a regular file of shmem/tmpfs (``handover.check_memory_fd``: hugetlbfs and
other file systems are refused) opened read-write that covers its piece; every descriptor the daemon
lets go is closed off the event loop (``handover.discard``). ``ProcessRef``
is accepted only for the daemon's own process (embedded mode: ``DirectHandle``, ``import_process``).

``ViewHandle`` (a handle whose bytes are mapped here) is shared with the pools' handles (``host.PoolHandle``).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
from typing import Any, Sequence

from ..core.errors import DataDistError, StatusCode, require
from . import addr
from .base import MAX_PIECES, FdPiece, FdRef, ProcessRef, Releasable
from .handover import check_memory_fd, discard

__all__ = ["ViewHandle", "MappedFdHandle", "PiecesHandle", "FdHandle", "DirectHandle", "is_sealed", "import_fds",
           "import_process", "release_view", "close_mapping"]

log = logging.getLogger(__name__)


def _check_range(handle: Any, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > handle.size:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"range [{offset}, {offset + length}) is outside memory of {handle.size} bytes")


def release_view(view: memoryview | None) -> None:
    if view is not None:
        try:
            view.release()
        except BufferError:  # someone still holds an export of it; the GC finishes the job
            pass


def close_mapping(mm: mmap.mmap | None, what: str) -> None:
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        # views of this mapping are still alive somewhere; unmapping now would leave them dangling,
        # so the mapping goes when the last of them is garbage collected
        log.warning("%s is still referenced by live views; it will be unmapped when they are released", what)


def _give_back(handle: Any) -> None:
    """Return what the importing uid was charged for ``handle``'s memory (once; ``quota.Charge``)."""
    charge, handle._charge = handle._charge, None
    if charge is not None:
        charge.release()

# ---- handles ----------------------------------------------------------------------------------

class ViewHandle:
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


class MappedFdHandle(ViewHandle):
    """One sealed descriptor mapped into the daemon: ``length`` bytes at ``offset`` of its piece."""

    def __init__(self, piece: FdPiece, offset: int, length: int, charge: Releasable | None = None) -> None:
        self.file_offset = piece.file_offset
        self._size = length
        self._view = None
        self._charge = charge
        self._mm: mmap.mmap | None = mmap.mmap(piece.fd, piece.length, mmap.MAP_SHARED,
                                               mmap.PROT_READ | mmap.PROT_WRITE, offset=piece.file_offset)
        self._view = memoryview(self._mm)[offset:offset + length]

    def close(self) -> None:
        view, self._view = self._view, None
        release_view(view)
        mm, self._mm = self._mm, None
        close_mapping(mm, "mapping of worker memory")
        _give_back(self)

    def __repr__(self) -> str:
        return f"MappedFdHandle(file_offset={self.file_offset}, size={self._size})"


class PiecesHandle(ViewHandle):
    """Several sealed descriptors mapped end to end into one reserved address range, viewed as one.

    The range stays mapped until ``close``; like every handle, it is closed only once no copy or
    transfer uses it (the engine drains its in-flight work before it frees memory)."""

    def __init__(self, pieces: Sequence[FdPiece], offset: int, length: int, charge: Releasable | None = None) -> None:
        self._charge = charge
        self._total = sum(p.length for p in pieces)
        self._size = length
        self._base = addr.reserve(self._total)
        try:
            at = self._base
            for p in pieces:
                addr.map_fixed(at, p.length, p.fd, p.file_offset)
                at += p.length
        except BaseException:
            addr.unmap(self._base, self._total)
            raise
        self._view = memoryview((ctypes.c_char * length).from_address(self._base + offset)).cast("B")

    def close(self) -> None:
        view, self._view = self._view, None
        if view is None:
            return
        release_view(view)
        addr.unmap(self._base, self._total)
        _give_back(self)

    def __repr__(self) -> str:
        return f"PiecesHandle(size={self._size}, mapped={self._total})"


class DirectHandle(ViewHandle):
    """Memory of the daemon's own process (embedded mode), viewed in place by address."""

    def __init__(self, address: int, length: int) -> None:
        self.address = address
        self._size = length
        self._buf: Any = (ctypes.c_char * length).from_address(address)
        self._view = memoryview(self._buf).cast("B")

    def close(self) -> None:
        view, self._view = self._view, None
        release_view(view)
        self._buf = None

    def __repr__(self) -> str:
        return f"DirectHandle(address=0x{self.address:x}, size={self._size})"


class FdHandle:
    """Worker memory reached through its descriptor with ``preadv``/``pwritev``; ``view()`` is ``None``.

    For files that are not sealed against shrinking: mapping them would let the worker kill the
    daemon with ``SIGBUS`` by truncating the file; a short read or write here is an error instead.
    Besides the ``MemoryHandle`` methods it offers ``read_raw``/``write_raw`` (many pieces from or
    to local addresses), used by ``copy_segments`` and the data plane.
    """

    def __init__(self, piece: FdPiece, offset: int, length: int, charge: Releasable | None = None) -> None:
        self._charge = charge
        self._fd: int | None = piece.fd
        self._base = piece.file_offset + offset
        self._size = length

    @property
    def size(self) -> int:
        return self._size

    def view(self) -> memoryview | None:
        return None

    def _live_fd(self) -> int:
        if self._fd is None:
            raise DataDistError(StatusCode.LLM_FAILED, f"{self!r} is closed")
        return self._fd

    def _io(self, write: bool, offset: int, buf: memoryview) -> None:
        fd = self._live_fd()
        n = buf.nbytes
        _check_range(self, offset, n)
        done = 0
        while done < n:
            try:
                got = (os.pwritev if write else os.preadv)(fd, [buf[done:]], self._base + offset + done)
            except InterruptedError:
                continue
            except OSError as exc:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"worker memory: {'pwritev' if write else 'preadv'} at "
                                    f"{self._base + offset + done}: {os.strerror(exc.errno or 0)}") from None
            if got <= 0:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"worker memory ended at file offset {self._base + offset + done}: the worker "
                                    "shrank the file it registered")
            done += got

    def read_into(self, offset: int, dst: memoryview) -> None:
        self._io(False, offset, memoryview(dst).cast("B"))

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        self._io(True, offset, memoryview(src).cast("B"))

    def _raw(self, write: bool, pieces: Any) -> int:
        total = 0
        for offset, local, length in pieces:
            length = int(length)
            if length:
                self._io(write, int(offset), memoryview((ctypes.c_char * length).from_address(int(local))).cast("B"))
                total += length
        return total

    def read_raw(self, moves: Sequence[tuple[int, int, int]]) -> int:
        """Copy ``(offset, local_addr, length)`` moves of this memory to local addresses."""
        return self._raw(False, moves)

    def write_raw(self, moves: Sequence[tuple[int, int, int]]) -> int:
        """Copy local addresses into ``(offset, local_addr, length)`` moves of this memory."""
        return self._raw(True, moves)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            discard([fd])
        _give_back(self)

    def __repr__(self) -> str:
        return f"FdHandle(file_offset={self._base}, size={self._size})"


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


# ---- importing worker descriptors -------------------------------------------------------------

def is_sealed(fd: int) -> bool:
    """Whether ``fd`` is a memfd sealed against shrinking (so a mapping of it can never fault)."""
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
    except OSError:  # not a memfd (EINVAL), or no seal support
        return False


def _check_piece(piece: FdPiece, index: int) -> None:
    """A regular file opened read-write that covers the piece; the offset page-aligned for mapping."""
    where = f"memory piece {index}"
    require(piece.length > 0, f"{where}: length must be > 0, got {piece.length}")
    require(0 <= piece.file_offset < 1 << 62 and piece.length < 1 << 62,
            f"{where}: file_offset {piece.file_offset} + length {piece.length} is out of range")
    require(piece.file_offset % addr.PAGE == 0, f"{where}: file_offset {piece.file_offset} is not page-aligned")
    st = check_memory_fd(piece.fd, where)
    try:
        flags = fcntl.fcntl(piece.fd, fcntl.F_GETFL)
    except OSError as exc:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"{where}: {os.strerror(exc.errno or 0)}") from None
    require(flags & os.O_ACCMODE == os.O_RDWR, f"{where} was not opened read-write")
    require(piece.file_offset + piece.length <= st.st_size,
            f"{where}: the file has {st.st_size} bytes; [{piece.file_offset}, {piece.file_offset + piece.length}) "
            "does not fit")


def import_fds(ref: FdRef) -> MappedFdHandle | PiecesHandle | FdHandle:
    """The handle for memory handed over as descriptors (see the module doc); owns the descriptors."""
    pieces = ref.pieces
    keep = False
    charge: Releasable | None = None
    handed = False       # the charge went to a handle (which gives it back when closed)
    try:
        require(0 < len(pieces) <= MAX_PIECES, f"memory must come in 1..{MAX_PIECES} pieces, got {len(pieces)}")
        for i, piece in enumerate(pieces):
            _check_piece(piece, i)
        total = sum(p.length for p in pieces)
        require(ref.length > 0, f"length must be > 0, got {ref.length}")
        require(0 <= ref.offset and ref.offset + ref.length <= total,
                f"range [{ref.offset}, {ref.offset + ref.length}) is outside the {total} bytes handed over")
        sealed = [is_sealed(p.fd) for p in pieces]
        if ref.pay is not None:
            charge = ref.pay(total, len(pieces))
        if len(pieces) == 1 and not sealed[0]:
            keep = handed = True
            return FdHandle(pieces[0], ref.offset, ref.length, charge)
        require(all(sealed), f"memory in {len(pieces)} pieces needs every piece to be a memfd sealed with "
                             f"F_SEAL_SHRINK (pieces {[i for i, s in enumerate(sealed) if not s]} are not)")
        for p in pieces[:-1]:
            require(p.length % addr.PAGE == 0, "every piece but the last must be whole pages")
        try:
            handle: MappedFdHandle | PiecesHandle = (
                MappedFdHandle(pieces[0], ref.offset, ref.length, charge) if len(pieces) == 1
                else PiecesHandle(pieces, ref.offset, ref.length, charge))
            handed = True
            return handle
        except OSError as exc:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"cannot map worker memory: {os.strerror(exc.errno or 0)}") from None
    finally:
        if not keep:
            discard([p.fd for p in pieces])     # off the event loop: a refused one may be a lingering socket
        if not handed and charge is not None:
            charge.release()


def import_process(ref: ProcessRef) -> DirectHandle:
    """The handle for memory of the daemon's own process (embedded mode); any other process is refused."""
    require(ref.pid == os.getpid(),
            f"memory of process {ref.pid} cannot be reached: the daemon never attaches to a process; "
            "hand memory over as a file descriptor")
    require(ref.address > 0, f"address must be > 0, got 0x{ref.address:x}")
    require(ref.length > 0, f"length must be > 0, got {ref.length}")
    require(ref.address + ref.length <= 1 << 64,
            f"address 0x{ref.address:x} + length {ref.length} overflows the address space")
    why = _self_range_writable(ref.address, ref.length)
    if why is not None:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"cannot use memory 0x{ref.address:x}+{ref.length}: {why}")
    return DirectHandle(ref.address, ref.length)
