"""Pairing a transfer's source extents with its destination extents (pure arithmetic, no NIXL).

A transfer is the concatenation of its source segments landing on the concatenation of the
destination segments, as on the tcp data plane; the two sides cut the stream differently (a
block of the prompt cache may be two ranges at the decoder). NIXL wants descriptor lists of equal
length extent by extent, so both are cut at the union of their boundaries, and extents that continue the
previous extent on both sides are merged again.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pair_extents"]

_U64_MAX = (1 << 64) - 1
_UNITS_PER_EXTENT = 4   # at most this many units per extent of both sides, else the sorted cuts (``_units``)


def pair_extents(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``src``/``dst``: ``(N, 2)`` arrays of ``(address, length)`` whose lengths add up to the same total.
    Returns two ``(M, 2)`` uint64 arrays with equal lengths extent by extent that cover the same bytes in
    the same order, with no empty extent and no extent that continues its predecessor on both sides (the
    inputs themselves when they pair up one to one already: the usual shuffled blocks of one size).

    Array operations only, linear in the extents: when both sides cut the stream at the same places
    their extents pair up as they are; when every extent is whole blocks of one size (runs of adjacent blocks
    merged at different places on the two sides) the extents are spread over the blocks (``_units``);
    otherwise the two sorted lists of cut points are merged."""
    src = np.asarray(src, dtype=np.uint64).reshape(-1, 2)
    dst = np.asarray(dst, dtype=np.uint64).reshape(-1, 2)
    n = len(src)
    if n and n == len(dst):
        lengths = src[:, 1]
        # the usual case, in a few array operations: the same non-empty lengths extent by extent (so the same cuts),
        # none so long that the sum of n of them could wrap 64 bits
        if (lengths == dst[:, 1]).all() and lengths.min() > 0 and int(lengths.max()) <= _U64_MAX // n:
            return _joined(src, dst, lengths, src[:, 0], dst[:, 0], True)
    if len(src) and not src[:, 1].all():
        src = src[src[:, 1] > 0]
    if len(dst) and not dst[:, 1].all():
        dst = dst[dst[:, 1] > 0]
    s_end = np.cumsum(src[:, 1], dtype=np.uint64)
    d_end = np.cumsum(dst[:, 1], dtype=np.uint64)
    # extents of the other daemon: lengths that wrap the 64-bit sum around would pass the totals' check below and cut
    # this side's extents outside themselves; a sum that never wraps only grows (each extent is not empty)
    if (len(s_end) > 1 and (s_end[1:] <= s_end[:-1]).any()) or (len(d_end) > 1 and (d_end[1:] <= d_end[:-1]).any()):
        raise ValueError("the extent lengths add up past 2**64 bytes")
    total = int(s_end[-1]) if len(s_end) else 0
    if total != (int(d_end[-1]) if len(d_end) else 0):
        raise ValueError(f"source has {total} bytes, destination {int(d_end[-1]) if len(d_end) else 0}")
    if total == 0:
        empty = np.empty((0, 2), dtype=np.uint64)
        return empty, empty.copy()
    same_cuts = len(s_end) == len(d_end) and np.array_equal(s_end, d_end)
    if same_cuts:
        # both sides cut the stream at the same places (the usual case: blocks of one size on both sides)
        lengths, s_addr, d_addr = src[:, 1], src[:, 0], dst[:, 0]
    elif (units := _units(src, dst, total)) is not None:
        # runs of blocks of one size, cut differently on the two sides (adjacent blocks merged into one extent on
        # one side only): the moves are the blocks, each side's extents spread over them -- no search
        lengths, s_addr, d_addr = units
    else:
        # sorted ends of the moves: two sorted runs, which a stable sort (timsort) merges in linear time
        both = np.sort(np.concatenate([s_end, d_end]), kind="stable")
        cuts = both[np.concatenate([[True], both[1:] != both[:-1]])]
        starts = np.concatenate([np.zeros(1, dtype=np.uint64), cuts[:-1]])
        lengths = cuts - starts

        def place(extents: np.ndarray, ends: np.ndarray) -> np.ndarray:
            i = np.searchsorted(ends, starts, side="right")   # the extent each move starts in
            extent_start = ends[i] - extents[i, 1]
            return extents[i, 0] + (starts - extent_start)

        s_addr, d_addr = place(src, s_end), place(dst, d_end)
    return _joined(src, dst, lengths, s_addr, d_addr, same_cuts)


def _units(src: np.ndarray, dst: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The stream cut into units of ``g``, a common divisor of every extent length (each extent is whole units, so every
    cut of either side is a unit boundary): ``(lengths, s_addr, d_addr)`` of the units, or None when there would
    be more than ``_UNITS_PER_EXTENT`` units per extent of both sides (long extents whose lengths share only a small
    divisor: the sorted cuts are cheaper then). ``g`` is the shortest extent when it is a power of two dividing
    every length (blocks of one size: masks and shifts), else the greatest common divisor."""
    lengths = np.concatenate([src[:, 1], dst[:, 1]])
    g = int(lengths.min())
    if g & (g - 1) == 0 and not (lengths & np.uint64(g - 1)).any():
        counts = lengths >> np.uint64(g.bit_length() - 1)
    else:
        g = int(np.gcd.reduce(lengths))
        counts = lengths // np.uint64(g)
    units = total // g
    if units > _UNITS_PER_EXTENT * len(lengths):
        return None
    step = np.arange(units, dtype=np.uint64) * np.uint64(g)

    def spread(extents: np.ndarray, counts: np.ndarray) -> np.ndarray:
        first = np.cumsum(counts) - counts     # each extent's first unit
        # a unit's address: its extent's address + (unit - the extent's first unit) * g, in modular uint64 arithmetic
        return np.repeat(extents[:, 0] - first * np.uint64(g), counts.astype(np.intp)) + step

    return np.full(units, g, dtype=np.uint64), spread(src, counts[:len(src)]), spread(dst, counts[len(src):])


def _joined(src: np.ndarray, dst: np.ndarray, lengths: np.ndarray, s_addr: np.ndarray, d_addr: np.ndarray,
            same_cuts: bool) -> tuple[np.ndarray, np.ndarray]:
    """The moves ``lengths`` at ``s_addr`` / ``d_addr`` as extents, each move that continues the previous one on
    both sides merged into it (``src``, ``dst`` themselves when they are the moves and none merges)."""
    joined = np.zeros(len(lengths), dtype=bool)
    joined[1:] = (s_addr[1:] == s_addr[:-1] + lengths[:-1]) & (d_addr[1:] == d_addr[:-1] + lengths[:-1])
    if same_cuts and not joined.any():
        return src, dst          # the extents pair up one to one already
    heads = np.flatnonzero(~joined)
    merged = np.add.reduceat(lengths, heads)
    out_src = np.empty((len(heads), 2), dtype=np.uint64)
    out_dst = np.empty((len(heads), 2), dtype=np.uint64)
    out_src[:, 0], out_dst[:, 0] = s_addr[heads], d_addr[heads]
    out_src[:, 1] = out_dst[:, 1] = merged
    return out_src, out_dst
