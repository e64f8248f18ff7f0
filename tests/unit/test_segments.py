"""``SegmentTable`` and ``BlockSpans``: the array form of segment lists against plain-Python oracles."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datadistd.core.layout import BlockSpans, Span, block_runs, block_spans, total_length
from datadistd.core.types import CacheDesc, DType
from datadistd.memory import segments as seg_mod
from datadistd.memory.base import Segment
from datadistd.memory.segments import SegmentTable, cut


class Mem:
    """A handle stand-in: only its identity and size matter here."""

    def __init__(self, size: int) -> None:
        self.size = size

    def view(self) -> None:
        return None


HANDLES = [Mem(1 << 20), Mem(1 << 20), Mem(1 << 20)]
TENSORS = [Segment(HANDLES[i % 2], 1000 * i, 50_000) for i in range(4)]  # two tensors share a handle


def oracle_blocks(tensor_indices: list[int], blocks: list[int], row: int) -> list[tuple[int, int, int]]:
    out = []
    for t in tensor_indices:
        base = TENSORS[t]
        for first, count in block_runs(blocks):
            out.append((id(base.handle), base.offset + first * row, count * row))
    return out


def as_tuples(table: SegmentTable) -> list[tuple[int, int, int]]:
    return [(id(s.handle), s.offset, s.length) for s in table]


@settings(max_examples=200, deadline=None)
@given(tensors=st.lists(st.integers(0, 3), max_size=4), blocks=st.lists(st.integers(0, 40), max_size=150),
       row=st.sampled_from([1, 16, 4096]), sort=st.booleans())
def test_blocks_match_the_run_oracle_on_both_paths(tensors: list[int], blocks: list[int], row: int,
                                                  sort: bool) -> None:
    if sort:
        blocks = sorted(set(blocks))
    want = oracle_blocks(tensors, blocks, row)
    assert as_tuples(SegmentTable.blocks(TENSORS, tensors, blocks, row)) == want
    small = seg_mod._SMALL
    seg_mod._SMALL = -1  # force the numpy path for short lists too
    try:
        assert as_tuples(SegmentTable.blocks(TENSORS, tensors, blocks, row)) == want
    finally:
        seg_mod._SMALL = small


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=30), data=st.data())
def test_cut_matches_a_byte_by_byte_oracle(lengths: list[int], data) -> None:  # noqa: ANN001
    offsets = [1000 * i + 7 for i in range(len(lengths))]
    table = SegmentTable.of([Segment(HANDLES[i % 3], o, n) for i, (o, n) in enumerate(zip(offsets, lengths,
                                                                                          strict=True))])
    total = sum(lengths)
    lo = data.draw(st.integers(0, total - 1))
    hi = data.draw(st.integers(lo + 1, total))
    stream = [(i % 3, o + k) for i, (o, n) in enumerate(zip(offsets, lengths, strict=True)) for k in range(n)]
    which, offs, lens = table.cut(lo, hi)
    got = [(int(w), int(o) + k) for w, o, n in zip(which, offs, lens, strict=True) for k in range(int(n))]
    assert got == stream[lo:hi]
    assert (lens > 0).all()


def test_cut_helper_trims_parallel_arrays() -> None:
    lengths = np.array([4, 4, 4], np.int64)
    i0, i1, n, (a, b) = cut(np.cumsum(lengths), lengths, 2, 9, np.array([0, 10, 20]), np.array([5, 6, 7]))
    assert (i0, i1) == (0, 3) and n.tolist() == [2, 4, 1] and a.tolist() == [2, 10, 20] and b.tolist() == [7, 6, 7]


def test_of_checks_and_sequence_protocol() -> None:
    segs = [Segment(HANDLES[0], 10, 5), Segment(HANDLES[1], 0, 0), Segment(HANDLES[0], 20, 3)]
    table = SegmentTable.of(segs)
    assert SegmentTable.of(table) is table
    assert len(table) == 3 and list(table) == segs and table[2] == segs[2] and table[0:2] == segs[:2]
    assert table.nbytes == 8 and len(table.handles) == 2
    assert table.first_bad() == -1
    assert list(table.nonempty()) == [segs[0], segs[2]]
    bad = SegmentTable.of([Segment(HANDLES[0], 0, 1), Segment(HANDLES[1], (1 << 20) - 2, 3)])
    assert bad.first_bad() == 1
    assert SegmentTable.of([Segment(HANDLES[0], -1, 1)]).first_bad() == 0
    big = SegmentTable.of([Segment(HANDLES[0], i, 1) for i in range(200)] + [Segment(HANDLES[0], 1 << 20, 1)])
    assert big.first_bad() == 200  # the numpy path
    empty = SegmentTable.of([])
    assert len(empty) == 0 and empty.nbytes == 0 and empty.first_bad() == -1


DESC = CacheDesc(num_tensors=3, shape=(10, 4, 2), dtype=DType.DT_FLOAT16)  # 16-byte rows


def test_block_spans_is_a_lazy_list_of_spans() -> None:
    spans = block_spans(DESC, [2, 0], [3, 4, 5, 9, 1])
    assert isinstance(spans, BlockSpans)
    want = [Span(2, 48, 48), Span(2, 144, 16), Span(2, 16, 16), Span(0, 48, 48), Span(0, 144, 16), Span(0, 16, 16)]
    assert spans == want and list(spans) == want and len(spans) == 6
    assert spans[4] == want[4] and spans[-1] == want[-1] and spans[1:3] == want[1:3]
    assert total_length(spans) == spans.nbytes == 2 * 5 * 16
    assert spans == block_spans(DESC, [2, 0], (3, 4, 5, 9, 1))
    assert block_spans(DESC, [0], []) == [] and len(block_spans(DESC, [], [1, 2])) == 0
