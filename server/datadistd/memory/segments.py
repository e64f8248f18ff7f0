"""``SegmentTable``: a list of segments held as numpy arrays, for the data plane and local copies.

A paged KV-cache transfer names thousands of blocks in each of dozens of tensors: one Python
``Segment`` object per (tensor, run of blocks) costs about a microsecond to build, another to
check, another to cut into frames, on both daemons, before the first byte moves. A table keeps
the same list as three arrays - which handle, byte offset, length - plus the distinct handles,
so building it from a block table (``SegmentTable.blocks``), checking it, and cutting any byte
range of its concatenated stream (``cut``) are a few numpy calls whatever the block count.

It is a ``Sequence[Segment]`` (items are built on demand), so code that iterates segments keeps
working; the hot paths (``transport.tcp``, ``memory.copy``) use the arrays.
"""

from __future__ import annotations

import bisect
from itertools import accumulate
from typing import Any, Iterator, Sequence, overload

import numpy as np

from ..core.layout import BlockSpans, Span
from ..core.types import BlockList
from .base import MemoryHandle, Segment

__all__ = ["SegmentTable", "cut", "byte_view", "segments_of"]

_SMALL = 64                      # up to this many items, plain Python beats numpy's per-call overhead
_CHECK = 1 << 16                 # bounds-check slice (bounded temporaries for huge tables)
_EMPTY_I = np.zeros(0, np.intp)
_EMPTY_Q = np.zeros(0, np.int64)


class SegmentTable(Sequence[Segment]):
    """Segment ``i`` is ``lengths[i]`` bytes at ``offsets[i]`` of ``handles[which[i]]``; immutable by convention."""

    __slots__ = ("handles", "which", "offsets", "lengths", "nbytes", "_ends", "_bad", "_small")

    def __init__(self, handles: Sequence[MemoryHandle], which: np.ndarray, offsets: np.ndarray,
                 lengths: np.ndarray, nbytes: int | None = None) -> None:
        """``nbytes``: the sum of ``lengths`` when the caller has it already (else it is summed here)."""
        self.handles = tuple(handles)
        self.which = which
        self.offsets = offsets
        self.lengths = lengths
        self.nbytes = nbytes if nbytes is not None else int(lengths.sum()) if len(lengths) else 0
        self._ends: np.ndarray | None = None
        self._bad: int | None = None
        self._small: tuple[list[int], list[int]] | None = None   # (ends, lengths) as lists: short tables' cut

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def of(cls, segments: Sequence[Segment]) -> "SegmentTable":
        """The table of any segment sequence (a table is returned as is)."""
        if isinstance(segments, SegmentTable):
            return segments
        index: dict[int, int] = {}
        handles: list[MemoryHandle] = []
        which: list[int] = []
        offsets: list[int] = []
        lengths: list[int] = []
        for seg in segments:
            handle = seg.handle
            k = index.get(id(handle))
            if k is None:
                k = index[id(handle)] = len(handles)
                handles.append(handle)
            which.append(k)
            offsets.append(seg.offset)
            lengths.append(seg.length)
        if not which:
            return cls((), _EMPTY_I, _EMPTY_Q, _EMPTY_Q)
        return cls(handles, np.array(which, np.intp), np.array(offsets, np.int64), np.array(lengths, np.int64))

    @classmethod
    def blocks(cls, tensors: Sequence[Segment], tensor_indices: Sequence[int], blocks: Sequence[int],
               row: int) -> "SegmentTable":
        """Rows ``blocks`` (list order) of each tensor ``tensors[t]`` for ``t`` in ``tensor_indices`` (given
        order), ``row`` bytes per row; consecutive ascending blocks become one segment.

        The caller has checked the indices (``core.layout.block_spans``); this only does the arithmetic.
        """
        if len(blocks) <= _SMALL:
            return cls._blocks_small(tensors, tensor_indices, blocks, row)
        return cls._blocks_large(tensors, tensor_indices, blocks, row)

    @classmethod
    def _blocks_large(cls, tensors: Sequence[Segment], tensor_indices: Sequence[int], blocks: Sequence[int],
                      row: int) -> "SegmentTable":
        """``blocks`` with numpy: a few array operations whatever the block count."""
        # a peer's long list carries its numbers as an array already (``core.types.BlockList``): no pass over ints
        b = np.asarray(blocks.values if isinstance(blocks, BlockList) else blocks, dtype=np.int64)
        if b.size == 0 or len(tensor_indices) == 0:
            return cls((), _EMPTY_I, _EMPTY_Q, _EMPTY_Q)
        if b.size > 1:
            first = np.flatnonzero(np.diff(b) != 1) + 1
            first = np.concatenate((np.zeros(1, np.intp), first))
            count = np.diff(np.concatenate((first, np.array([b.size], np.intp))))
        else:
            first = np.zeros(1, np.intp)
            count = np.ones(1, np.intp)
        run_off = b[first] * row
        run_len = count.astype(np.int64) * row
        index: dict[int, int] = {}
        handles: list[MemoryHandle] = []
        hid = []
        base = []
        for t in tensor_indices:
            seg = tensors[t]
            k = index.get(id(seg.handle))
            if k is None:
                k = index[id(seg.handle)] = len(handles)
                handles.append(seg.handle)
            hid.append(k)
            base.append(seg.offset)
        runs = run_off.size
        offsets = (np.array(base, np.int64)[:, None] + run_off[None, :]).reshape(-1)
        lengths = np.tile(run_len, len(hid))
        which = np.repeat(np.array(hid, np.intp), runs)
        return cls(handles, which, offsets, lengths)

    @classmethod
    def _blocks_small(cls, tensors: Sequence[Segment], tensor_indices: Sequence[int], blocks: Sequence[int],
                      row: int) -> "SegmentTable":
        """``blocks`` for short block lists: plain Python arithmetic, three arrays at the end and no numpy
        reduction (numpy's per-call overhead would cost more than the work); the same table as
        ``_blocks_large`` (a property test holds them equal)."""
        runs: list[tuple[int, int]] = []
        prev = first = -2
        for b in blocks:
            if b == prev + 1:
                prev = b
                continue
            if first >= 0 or prev >= 0:
                runs.append((first * row, (prev - first + 1) * row))
            first = prev = b
        if blocks:
            runs.append((first * row, (prev - first + 1) * row))
        if not runs or not tensor_indices:
            return cls((), _EMPTY_I, _EMPTY_Q, _EMPTY_Q)
        index: dict[int, int] = {}
        handles: list[MemoryHandle] = []
        which: list[int] = []
        offsets: list[int] = []
        for t in tensor_indices:
            seg = tensors[t]
            k = index.get(id(seg.handle))
            if k is None:
                k = index[id(seg.handle)] = len(handles)
                handles.append(seg.handle)
            base = seg.offset
            which += [k] * len(runs)
            offsets += [base + off for off, _ in runs]
        run_lengths = [n for _, n in runs]
        lengths = run_lengths * len(tensor_indices)
        return cls(handles, np.array(which, np.intp), np.array(offsets, np.int64), np.array(lengths, np.int64),
                   sum(run_lengths) * len(tensor_indices))

    # ---- the Sequence protocol ---------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.lengths)

    @overload
    def __getitem__(self, i: int) -> Segment: ...

    @overload
    def __getitem__(self, i: slice) -> list[Segment]: ...

    def __getitem__(self, i: int | slice) -> Segment | list[Segment]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return Segment(self.handles[int(self.which[i])], int(self.offsets[i]), int(self.lengths[i]))

    def __iter__(self) -> Iterator[Segment]:
        handles = self.handles
        for h, o, n in zip(self.which.tolist(), self.offsets.tolist(), self.lengths.tolist(), strict=True):
            yield Segment(handles[h], o, n)

    def __repr__(self) -> str:
        return f"SegmentTable({len(self)} segments, {self.nbytes} bytes, {len(self.handles)} handles)"

    # ---- checks and views --------------------------------------------------------------------

    def first_bad(self) -> int:
        """Index of the first segment outside its handle (negative offset or length, or past its end), or -1.

        Computed once per table (it is immutable), in slices of ``_CHECK`` items so a huge table needs no
        huge temporaries (large short-lived arrays would inflate the allocator's high-water mark)."""
        if self._bad is None:
            self._bad = self._first_bad()
        return self._bad

    def _first_bad(self) -> int:
        n = len(self)
        if not n:
            return -1
        if n <= _SMALL:
            sizes_l = [h.size for h in self.handles]
            for i, (h, o, k) in enumerate(zip(self.which.tolist(), self.offsets.tolist(), self.lengths.tolist(),
                                              strict=True)):
                if o < 0 or k < 0 or o + k > sizes_l[h]:
                    return i
            return -1
        sizes = np.array([h.size for h in self.handles], np.int64)
        for lo in range(0, n, _CHECK):  # one slice per pass
            off, ln = self.offsets[lo:lo + _CHECK], self.lengths[lo:lo + _CHECK]
            bad = (off < 0) | (ln < 0) | (off + ln > sizes[self.which[lo:lo + _CHECK]])
            if bad.any():
                return lo + int(np.argmax(bad))
        return -1

    def nonempty(self) -> "SegmentTable":
        """The same table without its zero-length segments (itself when there are none)."""
        if len(self.lengths) <= _SMALL:
            if min(self.lengths.tolist(), default=1) > 0:   # a numpy reduction costs more on a few items
                return self
        elif self.lengths.min(initial=1) > 0:
            return self
        keep = self.lengths > 0
        out = SegmentTable(self.handles, self.which[keep], self.offsets[keep], self.lengths[keep])
        out._bad = -1 if self._bad == -1 else None
        return out

    @property
    def ends(self) -> np.ndarray:
        """Stream position where each segment ends (the stream is the segments concatenated)."""
        if self._ends is None:
            if len(self.lengths) <= _SMALL:   # a numpy reduction costs more on a few items
                self._ends = np.array(list(accumulate(self.lengths.tolist())), np.int64)
            else:
                self._ends = np.cumsum(self.lengths)
        return self._ends

    def cut(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(which, offsets, lengths)`` of the segments that make up stream bytes ``[lo, hi)``, in order.

        Needs a table without zero-length segments (``nonempty``) and ``0 <= lo < hi <= nbytes``.
        """
        if len(self.lengths) <= _SMALL:
            return self._cut_small(lo, hi)
        i0, i1, lengths, (offsets,) = cut(self.ends, self.lengths, lo, hi, self.offsets)
        return self.which[i0:i1], offsets, lengths


    def _cut_small(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``cut`` of a short table: the search in Python lists (numpy's per-call overhead would cost more
        than the work); the same arrays as ``cut`` (a property test holds them equal)."""
        if self._small is None:
            self._small = (self.ends.tolist(), self.lengths.tolist())
        ends, lengths = self._small
        i0 = bisect.bisect_right(ends, lo)
        i1 = bisect.bisect_left(ends, hi) + 1
        n = self.lengths[i0:i1].copy()
        offsets = self.offsets[i0:i1].copy()
        head = lo - (ends[i0] - lengths[i0])     # bytes of the first segment before lo
        if head:
            n[0] -= head
            offsets[0] += head
        tail = ends[i1 - 1] - hi                 # bytes of the last segment after hi
        if tail:
            n[-1] -= tail
        return self.which[i0:i1], offsets, n


def cut(ends: np.ndarray, lengths: np.ndarray, lo: int, hi: int,
        *offsets: np.ndarray) -> tuple[int, int, np.ndarray, tuple[np.ndarray, ...]]:
    """Segments ``i0:i1`` of a stream of non-empty segments (``lengths``, cumulative ``ends``) that cover
    ``[lo, hi)``: their lengths and each of ``offsets`` trimmed to the range (fresh arrays)."""
    i0 = int(np.searchsorted(ends, lo, side="right"))
    i1 = int(np.searchsorted(ends, hi, side="left")) + 1
    n = lengths[i0:i1].copy()
    out = tuple(o[i0:i1].copy() for o in offsets)
    head = lo - (int(ends[i0]) - int(lengths[i0]))     # bytes of the first segment before lo
    if head:
        n[0] -= head
        for o in out:
            o[0] += head
    tail = int(ends[i1 - 1]) - hi                        # bytes of the last segment after hi
    if tail:
        n[-1] -= tail
    return i0, i1, n, out


def byte_view(handle: Any, writable: bool) -> memoryview | None:
    """The handle's memory as a flat writable (or readable) byte view, or ``None`` without a usable one.

    Always a view of its own (never the handle's object), so the caller may ``release()`` it."""
    view = handle.view()
    if view is None or not view.contiguous:
        return None
    if writable and view.readonly:
        return None
    if view.format != "B" or view.ndim != 1:
        return view.cast("B")
    return view[:]


def segments_of(tensors: Sequence[Segment], spans: "Sequence[Span] | SegmentTable") -> Sequence[Segment]:
    """Turn byte spans inside tensors into segments of the tensors' memory.

    Block spans become a ``SegmentTable`` (arrays, no object per span); a ``SegmentTable`` is segments already
    (extents resolved by address, ``engine.extents``) and comes back as it is."""
    if isinstance(spans, SegmentTable):
        return spans
    if isinstance(spans, BlockSpans):
        return SegmentTable.blocks(tensors, spans.tensors, spans.blocks, spans.row)
    out = []
    for span in spans:
        base = tensors[span.tensor]
        out.append(Segment(base.handle, base.offset + span.offset, span.length))
    return out
