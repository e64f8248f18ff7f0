"""``PageAllocator``: a fixed-capacity, page-granular allocator for the daemon's memory pools.

The allocator only does the bookkeeping (byte offsets inside one pool); the memory itself
belongs to a ``MemoryBackend``. Allocations are contiguous runs of whole pages, chosen by
best fit (the smallest free run that is large enough, the lowest address among equals) so
large requests keep finding room. Freed runs coalesce with their free neighbours at once, so
the free list never holds two adjacent runs.

Free runs are indexed three ways: by start page, by end page (both dicts, for O(1)
coalescing) and in a list sorted by ``(length, start)`` that ``bisect`` searches for the best
fit. Thread safety is the caller's job.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from .errors import DataDistError, StatusCode, require

__all__ = ["PageAllocator", "MIN_PAGE_SHIFT", "MAX_PAGE_SHIFT"]

#: smallest page: 1 KiB
MIN_PAGE_SHIFT = 10
#: pages must be smaller than 2 GiB (``page_shift < MAX_PAGE_SHIFT``)
MAX_PAGE_SHIFT = 31


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PageAllocator:
    """Hands out page-aligned byte offsets inside a pool of ``capacity`` bytes; never over-commits."""

    def __init__(self, capacity: int, page_shift: int = 16) -> None:
        require(_is_int(page_shift) and MIN_PAGE_SHIFT <= page_shift < MAX_PAGE_SHIFT,
                f"page_shift must be an int in [{MIN_PAGE_SHIFT}, {MAX_PAGE_SHIFT}), got {page_shift!r}")
        require(_is_int(capacity) and capacity >= 0, f"capacity must be an int >= 0 bytes, got {capacity!r}")
        self._shift = page_shift
        self._pages = capacity >> page_shift
        self._used_pages = 0
        self._allocated: dict[int, int] = {}        # start page -> page count of a live allocation
        self._free_by_start: dict[int, int] = {}    # start page -> page count of a free run
        self._free_by_end: dict[int, int] = {}      # end page (exclusive) -> start page of a free run
        self._free_sorted: list[tuple[int, int]] = []  # (page count, start page), ascending
        if self._pages:
            self._add_free(0, self._pages)

    # ---- sizes -------------------------------------------------------------------------------

    @property
    def page_size(self) -> int:
        return 1 << self._shift

    @property
    def capacity(self) -> int:
        """Usable bytes: whole pages only."""
        return self._pages << self._shift

    @property
    def used(self) -> int:
        """Bytes in allocated pages."""
        return self._used_pages << self._shift

    @property
    def free_bytes(self) -> int:
        return (self._pages - self._used_pages) << self._shift

    @property
    def largest_free(self) -> int:
        """Bytes of the largest contiguous free run (the largest allocation that can succeed now)."""
        return self._free_sorted[-1][0] << self._shift if self._free_sorted else 0

    def __repr__(self) -> str:
        return (f"PageAllocator(capacity={self.capacity}, page_size={self.page_size}, used={self.used}, "
                f"allocations={len(self._allocated)}, free_runs={len(self._free_sorted)})")

    # ---- operations --------------------------------------------------------------------------

    def allocate(self, size: int) -> int:
        """Reserve ``ceil(size / page_size)`` contiguous pages; return the byte offset of the first."""
        require(_is_int(size) and size > 0, f"allocation size must be an int > 0 bytes, got {size!r}")
        need = -(-size >> self._shift)
        i = bisect_left(self._free_sorted, (need, -1))
        if i == len(self._free_sorted):
            raise DataDistError(
                StatusCode.LLM_OUT_OF_MEMORY,
                f"cannot allocate {size} bytes ({need} pages of {self.page_size}): pool of {self.capacity} bytes "
                f"has {self.free_bytes} bytes free, largest contiguous run {self.largest_free} bytes")
        length, start = self._free_sorted[i]
        self._remove_free(start, length, i)
        if length > need:
            self._add_free(start + need, length - need)
        self._allocated[start] = need
        self._used_pages += need
        return start << self._shift

    def free(self, offset: int) -> None:
        """Return the allocation that starts at ``offset``; adjacent free runs merge."""
        start = self._start_of(offset)
        length = self._allocated.pop(start)
        self._used_pages -= length
        after = self._free_by_start.get(start + length)
        if after is not None:
            self._remove_free(start + length, after)
            length += after
        before = self._free_by_end.get(start)
        if before is not None:
            self._remove_free(before, start - before)
            length += start - before
            start = before
        self._add_free(start, length)

    def size_of(self, offset: int) -> int:
        """Bytes reserved for the allocation that starts at ``offset`` (whole pages)."""
        return self._allocated[self._start_of(offset)] << self._shift

    # ---- internals ---------------------------------------------------------------------------

    def _start_of(self, offset: int) -> int:
        ok = _is_int(offset) and offset >= 0 and offset & (self.page_size - 1) == 0
        start = offset >> self._shift if ok else -1
        if start not in self._allocated:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"offset {offset!r} is not the start of a live allocation of this pool")
        return start

    def _add_free(self, start: int, length: int) -> None:
        self._free_by_start[start] = length
        self._free_by_end[start + length] = start
        insort(self._free_sorted, (length, start))

    def _remove_free(self, start: int, length: int, index: int | None = None) -> None:
        del self._free_by_start[start]
        del self._free_by_end[start + length]
        if index is None:
            index = bisect_left(self._free_sorted, (length, start))
        del self._free_sorted[index]
