"""The ``MemoryBackend`` seam and the records that cross it.

A *handle* is memory the daemon can touch: part of a daemon-owned pool, or
worker-owned memory the worker handed over. Handles that are mapped into the daemon give a
zero-copy ``memoryview``; handles reached through a file descriptor only (files that could be
shrunk under a mapping) give ``None`` from ``view()`` and are read/written with copies
(``read_into`` / ``write_from``).

Worker memory reaches the daemon only as file descriptors the worker sent over the attach
socket (``FdRef``), or, in embedded mode, as addresses of the daemon's own process
(``ProcessRef``). The daemon never opens a path a worker names and never attaches to a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Union, runtime_checkable

from ..core.types import Placement

__all__ = [
    "StaleCleanup",
    "MemoryHandle", "Segment", "FdPiece", "FdRef", "ProcessRef", "DeviceRef", "MemoryRef", "Allocation", "Pool",
    "KeyExport",
    "MemoryBackend", "MAX_PIECES",
]


@runtime_checkable
class MemoryHandle(Protocol):
    """Memory the daemon can read and write; offsets are relative to the handle's start."""

    @property
    def size(self) -> int: ...

    def view(self) -> memoryview | None:
        """A writable, byte-formatted view of the whole handle, or ``None`` without a mapping."""

    def read_into(self, offset: int, dst: memoryview) -> None:
        """Copy ``len(dst)`` bytes starting at ``offset`` into ``dst``."""

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        """Copy ``src`` to ``offset``."""

    def close(self) -> None:
        """Drop the daemon's mapping/reference (not the worker's memory)."""


@dataclass(frozen=True)
class Segment:
    """``length`` bytes at ``offset`` of ``handle``: the unit every copy and transfer works on."""

    handle: MemoryHandle
    offset: int
    length: int


#: pieces (file descriptors) one handed-over memory may consist of
MAX_PIECES = 16


@dataclass(frozen=True)
class FdPiece:
    """``length`` bytes at ``file_offset`` of the open file ``fd`` (a descriptor the daemon owns)."""

    fd: int
    file_offset: int
    length: int


class Releasable(Protocol):
    """Something booked for memory, given back once when that memory goes (``quota.Charge``)."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class FdRef:
    """Memory a worker handed over: its pieces laid end to end, and the range ``[offset, offset+length)``
    of that concatenation that is registered (the worker's pages around an unaligned range)."""

    pieces: tuple[FdPiece, ...]
    offset: int
    length: int
    #: books ``(bytes, descriptors)`` to the importing uid once the pieces are checked, before anything is
    #: mapped (``quota.QuotaBook.take``); the handle gives the ``Releasable`` back when it is closed
    pay: Callable[[int, int], Releasable] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ProcessRef:
    """Memory of the daemon's own process: only in embedded mode, where the worker is this process."""

    pid: int
    address: int
    length: int


@dataclass(frozen=True)
class DeviceRef:
    """Worker NPU memory (backend ``acl``): ``length`` bytes behind the IPC ``key`` the worker exported on
    ``device`` with only the daemon's pid on its white list; ``proof``: what its first bytes must hold while
    it is handed over (``datadist_ascend.proof``: the key is a name, anyone who learned it could present it)."""

    key: str
    device: int
    length: int
    proof: bytes


MemoryRef = Union[FdRef, ProcessRef, DeviceRef]


@dataclass(frozen=True)
class Allocation:
    """Daemon-owned memory from a pool, and how its worker maps it (``file_offset`` in pool ``pool``)."""

    handle: MemoryHandle
    pool: str
    file_offset: int
    length: int


class Pool(Protocol):
    """A fixed-capacity pool of one placement; never over-commits."""

    @property
    def placement(self) -> Placement: ...

    @property
    def capacity(self) -> int: ...

    @property
    def used(self) -> int: ...

    @property
    def name(self) -> str:
        """The pool's id, as workers name it when they ask for its descriptor."""

    def export_fd(self) -> int:
        """A descriptor of the pool's memory for the engine's own worker (sealed: it cannot shrink it)."""

    def allocate(self, size: int) -> Allocation:
        """Raise ``DataDistError(LLM_OUT_OF_MEMORY)`` when ``size`` does not fit."""

    def free(self, allocation: Allocation) -> None: ...

    def close(self) -> None:
        """Release the pool's memory (workers that mapped it keep their mapping until they unmap)."""


class MemoryBackend(Protocol):
    name: str

    def create_pool(self, placement: Placement, capacity: int, page_shift: int = 16) -> Pool: ...

    def import_memory(self, ref: MemoryRef) -> MemoryHandle:
        """Reach worker-owned memory; ``DataDistError(LLM_PARAM_INVALID)`` saying why when impossible.

        Takes ownership of the descriptors of an ``FdRef``: they are closed here, or by the handle."""

    def close(self) -> None: ...


@runtime_checkable
class KeyExport(Protocol):
    """Declared capability of a pool in device memory (``acl``): workers import it by an IPC key, not a
    descriptor (``export_fd`` refuses)."""

    @property
    def device(self) -> int: ...

    def export_key(self, pid: int) -> str:
        """A key of the whole pool that only process ``pid`` may import."""


@runtime_checkable
class DeviceMemory(Protocol):
    """Declared capability of a handle in NPU memory (``acl``): the device it is on, its address there (in
    this process), and the allocation it lies in -- ``region``, ``(base, size)``: its pool, or itself when
    imported -- the range HCCL registered (``hccl`` binds and checks by it)."""

    @property
    def device(self) -> int: ...

    @property
    def address(self) -> int: ...

    @property
    def region(self) -> tuple[int, int]: ...


@runtime_checkable
class DeviceBackend(Protocol):
    """Declared capability of a backend whose DEVICE pools live in NPU memory (``acl``), on the NPU of the engine
    that owns them."""

    @property
    def device_id(self) -> int:
        """The NPU of engines whose options name none."""

    def check_device(self, device: int) -> None:
        """``DataDistError(LLM_PARAM_INVALID)`` unless ``device`` is an NPU of this host."""

    def physical(self, device: int) -> int:
        """The physical id of this process's logical NPU ``device`` (how NPUs are named between processes)."""

    def local_device(self, physical: int) -> int:
        """This process's logical id of physical NPU ``physical``; ``LLM_PARAM_INVALID`` naming it when unseen."""

    def create_pool_on(self, device: int, placement: Placement, capacity: int, page_shift: int = 16) -> Pool:
        """``create_pool``, DEVICE pools on NPU ``device``."""

    @property
    def bare_tgid(self) -> int:
        """This process's pid as the NPU driver sees it (what IPC allow lists name)."""

    @property
    def pid_is_bare_tgid(self) -> bool:
        """This process's pid is its bare tgid: it runs in the PID namespace the driver uses, where the kernel's
        word for a peer's pid (``SO_PEERCRED``) is the driver's too."""


@runtime_checkable
class StaleCleanup(Protocol):
    """Declared capability of a backend that leaves files behind a crashed daemon (``host`` before memfd
    pools): the daemon calls it once at start."""

    def cleanup_stale(self, shm_dir: str) -> list[str]:
        """Remove what dead daemons left in ``shm_dir``; the paths removed."""
