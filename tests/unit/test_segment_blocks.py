"""``SegmentTable.blocks``: the pure-Python path for short block lists (``_blocks_small``) and the numpy path
(``_blocks_large``) build the same table -- same handles, same arrays (values and dtypes), same byte count --
and the small path's ``nonempty`` answers as the numpy one does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datadistd.memory.base import Segment
from datadistd.memory.segments import _SMALL, SegmentTable, cut


class _Handle:
    def __init__(self, size: int) -> None:
        self.size = size


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[Segment], list[int], list[int], int]:
    nh = draw(st.integers(1, 3))
    handles = [_Handle(1 << 30) for _ in range(nh)]
    nt = draw(st.integers(1, 5))
    tensors = [Segment(handles[draw(st.integers(0, nh - 1))], draw(st.integers(0, 1 << 20)), 1 << 20)
               for _ in range(nt)]
    indices = draw(st.lists(st.integers(0, nt - 1), max_size=6))
    # runs of consecutive blocks and repeats, so merging is exercised
    blocks = draw(st.lists(st.integers(0, 40), max_size=_SMALL))
    if blocks and draw(st.booleans()):
        start = blocks[0]
        blocks = list(range(start, start + len(blocks)))
    row = draw(st.sampled_from([0, 1, 7, 4096]))
    return tensors, indices, blocks, row


def _same(a: SegmentTable, b: SegmentTable) -> None:
    assert a.handles == b.handles
    assert a.nbytes == b.nbytes == int(b.lengths.sum())
    for x, y in ((a.which, b.which), (a.offsets, b.offsets), (a.lengths, b.lengths)):
        assert x.dtype == y.dtype
        assert np.array_equal(x, y)
    assert list(a) == list(b)
    assert a.ends.dtype == np.cumsum(b.lengths).dtype
    assert np.array_equal(a.ends, np.cumsum(b.lengths))


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_small_and_numpy_paths_agree(case: tuple[list[Segment], list[int], list[int], int]) -> None:
    tensors, indices, blocks, row = case
    small = SegmentTable._blocks_small(tensors, indices, blocks, row)
    large = SegmentTable._blocks_large(tensors, indices, blocks, row)
    _same(small, large)
    _same(SegmentTable.blocks(tensors, indices, blocks, row), large)
    ns, nl = small.nonempty(), large.nonempty()
    _same(ns, nl)
    assert (ns is small) == (nl is large)
    total = nl.nbytes
    if total:   # every byte range of the stream: the short tables' cut as the numpy one
        for lo, hi in {(0, total), (0, 1), (total - 1, total), (total // 3, max(total // 3 + 1, 2 * total // 3))}:
            got = ns.cut(lo, hi)
            i0, i1, lens, (offs,) = cut(nl.ends, nl.lengths, lo, hi, nl.offsets)
            for x, y in zip(got, (nl.which[i0:i1], offs, lens), strict=True):
                assert x.dtype == y.dtype
                assert np.array_equal(x, y)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=_SMALL), st.data())
def test_small_cut_any_range(lengths: list[int], data: st.DataObject) -> None:
    h = _Handle(1 << 30)
    offsets = data.draw(st.lists(st.integers(0, 1 << 20), min_size=len(lengths), max_size=len(lengths)))
    t = SegmentTable.of([Segment(h, o, n) for o, n in zip(offsets, lengths, strict=True)])
    lo = data.draw(st.integers(0, t.nbytes - 1))
    hi = data.draw(st.integers(lo + 1, t.nbytes))
    i0, i1, lens, (offs,) = cut(t.ends, t.lengths, lo, hi, t.offsets)
    for x, y in zip(t.cut(lo, hi), (t.which[i0:i1], offs, lens), strict=True):
        assert x.dtype == y.dtype
        assert np.array_equal(x, y)
