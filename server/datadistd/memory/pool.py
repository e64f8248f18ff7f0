"""``PoolBase``: what every pool shares -- one region of fixed capacity carved by a page allocator.

The live-allocation table, ``allocate`` / ``free`` / ``close`` and the accounting are the same whether the
region is a sealed memfd (``host``) or one ``aclrtMalloc`` (``acl``); a backend's pool says only what a
handle on part of its region is (``_handle``) and how the region goes away (``_release``).
Thread-safe; never over-commits (``LLM_OUT_OF_MEMORY`` from the allocator).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Generic, Protocol, TypeVar

from ..core.allocator import PageAllocator
from ..core.errors import DataDistError, StatusCode, require
from ..core.types import Placement
from .base import Allocation, MemoryHandle

__all__ = ["PoolBase"]


class _Closable(MemoryHandle, Protocol):
    def close(self) -> None: ...


H = TypeVar("H", bound=_Closable)


class PoolBase(ABC, Generic[H]):
    def __init__(self, name: str, placement: Placement, capacity: int, page_shift: int) -> None:
        require(isinstance(capacity, int) and capacity > 0, f"pool capacity must be > 0 bytes, got {capacity!r}")
        self._name = name
        self._placement = Placement(placement)
        self._capacity = capacity
        self._allocator = PageAllocator(capacity, page_shift)
        self._lock = threading.Lock()
        self._live: dict[int, H] = {}
        self._closed = False

    # ---- what a backend's pool says ------------------------------------------------------------

    @abstractmethod
    def _handle(self, offset: int, size: int) -> H:
        """A handle on ``size`` bytes at ``offset`` of the region (called under the lock)."""

    def _release(self) -> None:
        """Give the region back: once, after every live handle was closed, outside the lock (every other
        use of the region's resources checks ``_closed`` under the lock first)."""

    # ---- the pool ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

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

    def _closed_error(self) -> DataDistError:
        return DataDistError(StatusCode.LLM_FAILED, f"pool {self._name!r} is closed")

    def allocate(self, size: int) -> Allocation:
        require(isinstance(size, int) and size > 0, f"allocation size must be > 0 bytes, got {size!r}")
        with self._lock:
            if self._closed:
                raise self._closed_error()
            offset = self._allocator.allocate(size)
            try:
                handle = self._handle(offset, size)
            except BaseException:
                self._allocator.free(offset)
                raise
            self._live[offset] = handle
        return Allocation(handle, self._name, offset, size)

    def free(self, allocation: Allocation) -> None:
        """Return an allocation; freeing after ``close()`` is a no-op, freeing twice is an error."""
        with self._lock:
            if self._closed:
                return
            handle = self._live.get(allocation.file_offset)
            if handle is None or handle is not allocation.handle:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"allocation at offset {allocation.file_offset} is not live in pool {self._name!r}")
            del self._live[allocation.file_offset]
            self._allocator.free(allocation.file_offset)
        handle.close()

    def close(self) -> None:
        """Invalidate every allocation, then give the region back; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._live.values())
            self._live.clear()
        for handle in handles:
            handle.close()
        self._release()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self._name!r}, placement={self._placement.name}, "
                f"capacity={self._capacity}, used={self.used})")
