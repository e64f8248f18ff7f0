"""The ``MemoryBackend`` seam and the records that cross it.

A *handle* is a piece of memory the daemon can touch: part of a daemon-owned pool, or
worker-owned memory the worker registered. Handles that are mapped into the daemon give a
zero-copy ``memoryview``; handles reached only by cross-memory attach give ``None`` from
``view()`` and are read/written with copies (``read_into`` / ``write_from``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

from ..core.types import Placement

__all__ = [
    "MemoryHandle", "Segment", "SharedFileRef", "ProcessRef", "MemoryRef", "Allocation", "Pool",
    "MemoryBackend",
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


@dataclass(frozen=True)
class SharedFileRef:
    """Worker memory inside a shareable mapping: the daemon maps ``path`` at ``file_offset``."""

    path: str
    file_offset: int
    length: int


@dataclass(frozen=True)
class ProcessRef:
    """Plain (anonymous) worker memory, reached by cross-memory attach into process ``pid``."""

    pid: int
    address: int
    length: int


MemoryRef = Union[SharedFileRef, ProcessRef]


@dataclass(frozen=True)
class Allocation:
    """Daemon-owned memory from a pool, and how a worker maps it (``path`` at ``file_offset``)."""

    handle: MemoryHandle
    path: str
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

    def allocate(self, size: int) -> Allocation:
        """Raise ``DataDistError(LLM_OUT_OF_MEMORY)`` when ``size`` does not fit."""

    def free(self, allocation: Allocation) -> None: ...

    def close(self) -> None:
        """Release the pool's memory and remove its shared-memory file."""


class MemoryBackend(Protocol):
    name: str

    def create_pool(self, placement: Placement, capacity: int, page_shift: int = 16) -> Pool: ...

    def import_memory(self, ref: MemoryRef) -> MemoryHandle:
        """Reach worker-owned memory; ``DataDistError(LLM_PARAM_INVALID)`` saying why when impossible."""

    def close(self) -> None: ...
