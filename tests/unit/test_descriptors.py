"""The one-sided transports' per-block arithmetic (nixl and hccl) against brute-force per-block oracles.

Extents of a transfer (``RegistrationTable.extents``), their pairing with the peer's extents (``pair_extents``)
and HCCL's descriptor array (``datadist_ascend.hccl.descriptors``) are built with numpy, no Python object per
block; each must equal what a plain loop over the blocks builds. No NIXL or CANN needed: the engines' calls are faked.
"""

from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datadist_ascend.hccl import DATA_TYPE_UINT8, DESC_DTYPE, OneSideOpDesc, descriptors
from datadistd.memory.base import Segment
from datadistd.memory.segments import SegmentTable
from datadistd.transport.onesided.pairing import pair_extents
from datadistd.transport.registrations import Registration, RegistrationTable


class Mem:
    """A handle stand-in: only its identity and size matter (the fake engine gives it a base address)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def view(self) -> None:
        return None


HANDLES = [Mem(1 << 24) for _ in range(3)]
BASES = {id(h): (k + 1) << 32 for k, h in enumerate(HANDLES)}


def _table() -> RegistrationTable:
    return RegistrationTable(lambda h: (BASES[id(h)], h.size, id(h)), lambda reg: None)


# -- extents of segments --

def oracle_extents(segments: list[Segment]) -> list[tuple[int, int]]:
    return [(BASES[id(s.handle)] + s.offset, s.length) for s in segments if s.length > 0]


segment_lists = st.lists(st.builds(Segment, st.sampled_from(HANDLES), st.integers(0, 1 << 20),
                                   st.integers(0, 5000)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(segments=segment_lists, as_table=st.booleans())
def test_extents_equal_the_per_segment_oracle(segments: list[Segment], as_table: bool) -> None:
    extents, used, new = _table().extents(SegmentTable.of(segments) if as_table else segments)
    assert extents.dtype == np.uint64 and extents.shape == (len(oracle_extents(segments)), 2)
    assert [tuple(r) for r in extents.tolist()] == oracle_extents(segments)
    handles = {id(s.handle) for s in segments}
    assert sorted(r.base for r in used) == sorted(BASES[k] for k in handles)
    assert sorted(r.base for r in new) == sorted(BASES[k] for k in handles)


@settings(max_examples=100, deadline=None)
@given(tensors=st.lists(st.integers(0, 3), min_size=1, max_size=4),
       blocks=st.lists(st.integers(0, 200), min_size=1, max_size=300), row=st.sampled_from([16, 4096, 16384]))
def test_extents_of_a_block_table_equal_the_per_block_oracle(tensors: list[int], blocks: list[int], row: int) -> None:
    """Both of ``SegmentTable.blocks``'s paths (short and numpy), read as arrays, against one extent per block run."""
    bases = [Segment(HANDLES[t % 2], t * (1 << 22), 1 << 22) for t in range(4)]
    table = SegmentTable.blocks(bases, tensors, blocks, row)
    want: list[tuple[int, int]] = []
    for t in tensors:
        prev = -2
        for b in blocks:
            if b == prev + 1:     # the next block of a run: its extent grows
                want[-1] = (want[-1][0], want[-1][1] + row)
            else:
                want.append((BASES[id(bases[t].handle)] + bases[t].offset + b * row, row))
            prev = b
    extents, _, _ = _table().extents(table)
    assert [tuple(r) for r in extents.tolist()] == want


def test_a_new_registration_is_reported_once_and_used_every_time() -> None:
    table = _table()
    a, b = HANDLES[0], HANDLES[1]
    _, used, new = table.extents(SegmentTable.of([Segment(a, 0, 1), Segment(b, 0, 0), Segment(a, 5, 1)]))
    assert [r.base for r in new] == [BASES[id(a)], BASES[id(b)]] and len(used) == 2
    _, used, new = table.extents([Segment(a, 0, 1)])
    assert new == [] and [r.base for r in used] == [BASES[id(a)]]
    assert all(isinstance(r, Registration) for r in used)


# -- pairing the two sides' extents --

def oracle_pairs(src: np.ndarray, dst: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Byte by byte: the i-th byte of one side lands on the i-th byte of the other; maximal runs of bytes that
    continue on both sides are one extent."""
    s_bytes = [int(a) + k for a, n in src for k in range(int(n))]
    d_bytes = [int(a) + k for a, n in dst for k in range(int(n))]
    assert len(s_bytes) == len(d_bytes)
    s_out: list[tuple[int, int]] = []
    d_out: list[tuple[int, int]] = []
    for i, (s, d) in enumerate(zip(s_bytes, d_bytes, strict=True)):
        if i and s == s_bytes[i - 1] + 1 and d == d_bytes[i - 1] + 1:
            s_out[-1] = (s_out[-1][0], s_out[-1][1] + 1)
            d_out[-1] = (d_out[-1][0], d_out[-1][1] + 1)
        else:
            s_out.append((s, 1))
            d_out.append((d, 1))
    return s_out, d_out


@st.composite
def two_sides(draw):  # noqa: ANN001, ANN201
    """Both sides' extents of one stream: cut at the same places (the usual case, blocks of one size), or each its
    own way; extents placed with gaps or back to back, in shuffled order, zero-length extents mixed in."""
    total = draw(st.integers(1, 300))
    shared = sorted(set(draw(st.lists(st.integers(1, total - 1), max_size=12)))) if total > 1 else []

    def side(base: int) -> np.ndarray:
        same = draw(st.booleans())
        cuts = shared if same else (sorted(set(draw(st.lists(st.integers(1, total - 1), max_size=12))))
                                    if total > 1 else [])
        bounds = [0, *cuts, total]
        lengths = [hi - lo for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        slots = draw(st.permutations(range(len(lengths))))     # where each piece lives in memory
        gap = draw(st.sampled_from([0, 0, 7]))
        width = max(lengths) + gap
        extents = [(base + slots[k] * width, n) for k, n in enumerate(lengths)]
        if draw(st.booleans()):
            extents.insert(draw(st.integers(0, len(extents))), (base, 0))
        return np.array(extents, dtype=np.uint64)

    return side(1000), side(1 << 20)


@settings(max_examples=300, deadline=None)
@given(two_sides())
def test_pair_extents_equals_the_byte_by_byte_oracle(case: tuple[np.ndarray, np.ndarray]) -> None:
    src, dst = case
    s, d = pair_extents(src, dst)
    want_s, want_d = oracle_pairs(src, dst)
    assert s.dtype == d.dtype == np.uint64
    assert [tuple(r) for r in s.tolist()] == want_s and [tuple(r) for r in d.tolist()] == want_d


@st.composite
def block_sides(draw):  # noqa: ANN001, ANN201
    """Both sides' extents of a stream of blocks of one size (a power of two or not): each side merges runs of
    adjacent blocks into one extent at its own places, extents shuffled in memory, a zero-length extent at times --
    the moves are then the blocks (``pairing._units``), or the sorted cuts when extents are long."""
    unit = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    nblocks = draw(st.integers(1, 40))

    def side(base: int) -> np.ndarray:
        cuts = sorted(set(draw(st.lists(st.integers(1, nblocks - 1), max_size=nblocks)))) if nblocks > 1 else []
        bounds = [0, *cuts, nblocks]
        lengths = [(hi - lo) * unit for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        slots = draw(st.permutations(range(len(lengths))))
        width = max(lengths) + draw(st.sampled_from([0, unit, 5]))
        extents = [(base + slots[k] * width, n) for k, n in enumerate(lengths)]
        if draw(st.booleans()):
            extents.insert(draw(st.integers(0, len(extents))), (base, 0))
        return np.array(extents, dtype=np.uint64)

    return side(1000), side(1 << 20)


@settings(max_examples=300, deadline=None)
@given(block_sides())
def test_pair_extents_of_merged_block_runs_equals_the_oracle(case: tuple[np.ndarray, np.ndarray]) -> None:
    src, dst = case
    s, d = pair_extents(src, dst)
    want_s, want_d = oracle_pairs(src, dst)
    assert s.dtype == d.dtype == np.uint64
    assert [tuple(r) for r in s.tolist()] == want_s and [tuple(r) for r in d.tolist()] == want_d


def test_pair_extents_of_runs_cut_apart_in_one_row_each() -> None:
    """Long extents cut at different places (more units than ``_UNITS_PER_EXTENT`` an extent): the sorted cuts,
    same extents."""
    src = np.array([[1 << 30, 4096 * 100], [3 << 30, 4096 * 100]], dtype=np.uint64)
    dst = np.array([[5 << 30, 4096], [7 << 30, 4096 * 199]], dtype=np.uint64)
    s, d = pair_extents(src, dst)
    assert s.tolist() == [[1 << 30, 4096], [(1 << 30) + 4096, 4096 * 99], [3 << 30, 4096 * 100]]
    assert d.tolist() == [[5 << 30, 4096], [7 << 30, 4096 * 99], [(7 << 30) + 4096 * 99, 4096 * 100]]


def test_pair_extents_of_shuffled_blocks_keeps_one_row_per_block() -> None:
    rng = np.random.default_rng(3)
    n, block = 5000, 16384
    src = np.column_stack([(1 << 32) + rng.permutation(n) * block, np.full(n, block)]).astype(np.uint64)
    dst = np.column_stack([(2 << 32) + rng.permutation(n) * block, np.full(n, block)]).astype(np.uint64)
    s, d = pair_extents(src, dst)
    np.testing.assert_array_equal(s, src)
    np.testing.assert_array_equal(d, dst)


# -- HCCL's descriptor array --

def oracle_descs(local: list[int], remote: list[int], lengths: list[int]) -> ctypes.Array:
    """The binding's former loop: one ``OneSideOpDesc`` at a time."""
    descs = (OneSideOpDesc * max(len(lengths), 1))()
    for i, n in enumerate(lengths):
        descs[i].localAddr = local[i]
        descs[i].remoteAddr = remote[i]
        descs[i].count = n
        descs[i].dataType = DATA_TYPE_UINT8
    return descs


addresses = st.integers(1, (1 << 64) - 1)


@settings(max_examples=200, deadline=None)
@given(extents=st.lists(st.tuples(addresses, addresses, st.integers(0, (1 << 64) - 1)), max_size=60),
       strided=st.booleans())
def test_hccl_descriptors_equal_the_ctypes_loop(extents: list[tuple[int, int, int]], strided: bool) -> None:
    local, remote, lengths = ([r[k] for r in extents] for k in range(3))
    if strided:    # as the agent passes them: columns of (N, 2) extent arrays
        loc2 = np.array([[a, n] for a, n in zip(local, lengths, strict=True)], dtype=np.uint64).reshape(-1, 2)
        rem2 = np.array([[a, n] for a, n in zip(remote, lengths, strict=True)], dtype=np.uint64).reshape(-1, 2)
        got = descriptors(loc2[:, 0], rem2[:, 0], loc2[:, 1])
    else:
        got = descriptors(local, remote, lengths)
    assert got.dtype == DESC_DTYPE and got.itemsize == ctypes.sizeof(OneSideOpDesc) and len(got) == len(extents)
    as_c = (OneSideOpDesc * len(got)).from_buffer(got) if len(got) else []
    want = oracle_descs(local, remote, lengths)
    for i in range(len(extents)):
        g, w = as_c[i], want[i]
        assert (g.localAddr, g.remoteAddr, g.count, g.dataType) == (w.localAddr, w.remoteAddr, w.count, w.dataType)


def test_hccl_descriptors_take_one_length_for_all() -> None:
    got = descriptors([1, 2, 3], [4, 5, 6], 16384)
    assert got["count"].tolist() == [16384] * 3 and got["dataType"].tolist() == [DATA_TYPE_UINT8] * 3


def test_hccl_batch_hands_the_array_over_64_descriptors_a_call() -> None:
    """``Hccl.batch`` calls the library with pointers into one array laid out as the C struct, at most
    ``DESCS_PER_CALL`` (64, LLM-DataDist's; HCCL refuses more than 256) descriptors a call, in order."""
    from datadist_ascend.hccl import DESCS_PER_CALL, Hccl

    calls: list[tuple[str, list[tuple[int, int, int, int]]]] = []

    def fake(name: str):  # noqa: ANN202
        def call(comm, rank, descs, n, stream) -> int:  # noqa: ANN001
            calls.append((name, [(descs[i].localAddr, descs[i].remoteAddr, descs[i].count, descs[i].dataType)
                                 for i in range(n)]))
            return 0
        return call

    h = Hccl.__new__(Hccl)
    h._fn = {"HcclBatchPut": fake("put"), "HcclBatchGet": fake("get")}
    extents = np.array([[4096, 16], [8192, 32]], dtype=np.uint64)
    h.batch(True, 1, 1, extents[:, 0], extents[:, 0] + 1, extents[:, 1], 2)
    h.batch(False, 1, 1, [7], [9], [3], 2)
    assert calls == [("put", [(4096, 4097, 16, DATA_TYPE_UINT8), (8192, 8193, 32, DATA_TYPE_UINT8)]),
                     ("get", [(7, 9, 3, DATA_TYPE_UINT8)])]
    calls.clear()
    n = 2 * DESCS_PER_CALL + 22
    h.batch(False, 1, 1, np.arange(n) * 16 + 4096, np.arange(n) * 16 + 8, 16, 2)
    assert [len(c) for _, c in calls] == [64, 64, 22] and DESCS_PER_CALL == 64
    assert [d[0] for _, c in calls for d in c] == (np.arange(n) * 16 + 4096).tolist()
