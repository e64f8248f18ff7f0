"""``copy_segments`` against a numpy oracle, over mapped, unmapped and descriptor (pread/pwrite) handles."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.memory.base import FdPiece, MemoryHandle, Segment
from datadistd.memory.copy import STAGE_MAX, copy_segments
from datadistd.memory.imported import DirectHandle, FdHandle


class ViewHandle:
    """Mapped memory: a numpy array's bytes."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    @property
    def size(self) -> int:
        return self.arr.nbytes

    def view(self) -> memoryview:
        return memoryview(self.arr).cast("B")

    def read_into(self, offset: int, dst: memoryview) -> None:
        dst[:] = self.view()[offset:offset + len(dst)]

    def write_from(self, offset: int, src) -> None:  # noqa: ANN001
        src = memoryview(src).cast("B")
        self.view()[offset:offset + len(src)] = src

    def close(self) -> None:
        pass


class NoViewHandle(ViewHandle):
    """Unmapped memory reached only by read_into/write_from (like a remote handle without batching)."""

    calls = 0

    def view(self) -> None:  # type: ignore[override]
        return None

    def read_into(self, offset: int, dst: memoryview) -> None:
        NoViewHandle.calls += 1
        dst[:] = memoryview(self.arr).cast("B")[offset:offset + len(dst)]

    def write_from(self, offset: int, src) -> None:  # noqa: ANN001
        NoViewHandle.calls += 1
        src = memoryview(src).cast("B")
        memoryview(self.arr).cast("B")[offset:offset + len(src)] = src


KINDS = ["view", "noview", "fd", "direct"]
_FILES: dict[int, int] = {}     # address of a memfd-backed array -> its memfd


def in_memfd(arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` whose bytes live in a memfd (unsealed: reached with pread/pwrite, never mapped)."""
    fd = os.memfd_create("datadist-test")
    os.ftruncate(fd, max(arr.nbytes, 1))
    out = np.frombuffer(mmap.mmap(fd, max(arr.nbytes, 1)), np.uint8)[:arr.nbytes]
    out[:] = arr
    _FILES[out.ctypes.data] = fd
    return out


def make_handle(kind: str, arr: np.ndarray) -> MemoryHandle:
    if kind == "view":
        return ViewHandle(arr)
    if kind == "noview":
        return NoViewHandle(arr)
    if kind == "fd":  # arr from in_memfd(): the batched read_raw/write_raw path through the descriptor
        return FdHandle(FdPiece(os.dup(_FILES[arr.ctypes.data]), 0, arr.nbytes), 0, arr.nbytes)
    return DirectHandle(arr.ctypes.data, arr.nbytes)


def test_handles_satisfy_protocol():
    arr = in_memfd(np.zeros(16, dtype=np.uint8))
    for kind in KINDS:
        assert isinstance(make_handle(kind, arr), MemoryHandle)


@st.composite
def scenario(draw):  # noqa: ANN001, ANN201
    total = draw(st.integers(0, 3000))
    cuts = sorted(draw(st.sets(st.integers(1, max(total - 1, 1)), max_size=40))) if total > 1 else []
    src_lengths = np.diff([0, *cuts, total]).tolist() if total else []
    cuts = sorted(draw(st.sets(st.integers(1, max(total - 1, 1)), max_size=40))) if total > 1 else []
    dst_lengths = np.diff([0, *cuts, total]).tolist() if total else []
    # sprinkle zero-length segments
    if draw(st.booleans()):
        src_lengths.insert(draw(st.integers(0, len(src_lengths))), 0)
    if draw(st.booleans()):
        dst_lengths.insert(draw(st.integers(0, len(dst_lengths))), 0)
    n_src = draw(st.integers(1, 3))
    n_dst = draw(st.integers(1, 3))
    src_kinds = [draw(st.sampled_from(KINDS)) for _ in range(n_src)]
    dst_kinds = [draw(st.sampled_from(KINDS)) for _ in range(n_dst)]
    src_segments = [(draw(st.integers(0, n_src - 1)), draw(st.integers(0, 500)), n) for n in src_lengths]
    dst_choice = [draw(st.integers(0, n_dst - 1)) for _ in dst_lengths]
    gaps = [draw(st.integers(0, 50)) for _ in dst_lengths]
    seed = draw(st.integers(0, 2**32 - 1))
    return src_kinds, dst_kinds, src_segments, dst_choice, dst_lengths, gaps, seed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_copy_matches_numpy_oracle(case):
    src_kinds, dst_kinds, src_segments, dst_choice, dst_lengths, gaps, seed = case
    rng = np.random.default_rng(seed)
    src_bufs = [rng.integers(0, 256, 4000, dtype=np.uint8) for _ in src_kinds]
    src_bufs = [in_memfd(a) if k == "fd" else a for k, a in zip(src_kinds, src_bufs, strict=True)]
    # destination segments do not overlap: each lands after the previous one in its buffer, past a gap
    cursor = [0] * len(dst_kinds)
    dst_segments = []
    for b, n, gap in zip(dst_choice, dst_lengths, gaps, strict=True):
        dst_segments.append((b, cursor[b] + gap, n))
        cursor[b] += gap + n
    dst_bufs = [rng.integers(0, 256, c + 10, dtype=np.uint8) for c in cursor]
    dst_bufs = [in_memfd(a) if k == "fd" else a for k, a in zip(dst_kinds, dst_bufs, strict=True)]
    src_handles = [make_handle(k, a) for k, a in zip(src_kinds, src_bufs, strict=True)]
    dst_handles = [make_handle(k, a) for k, a in zip(dst_kinds, dst_bufs, strict=True)]

    stream = np.concatenate([src_bufs[b][o:o + n] for b, o, n in src_segments] or [np.zeros(0, np.uint8)])
    expected = [a.copy() for a in dst_bufs]
    pos = 0
    for b, o, n in dst_segments:
        expected[b][o:o + n] = stream[pos:pos + n]
        pos += n

    src = [Segment(src_handles[b], o, n) for b, o, n in src_segments]
    dst = [Segment(dst_handles[b], o, n) for b, o, n in dst_segments]
    assert copy_segments(dst, src) == len(stream)
    for got, want in zip(dst_bufs, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_length_mismatch_and_bounds_move_nothing():
    a, b = np.arange(100, dtype=np.uint8), np.zeros(100, dtype=np.uint8)
    ha, hb = ViewHandle(a), ViewHandle(b)
    with pytest.raises(DataDistError) as e:
        copy_segments([Segment(hb, 0, 10)], [Segment(ha, 0, 11)])
    assert e.value.code == StatusCode.LLM_PARAM_INVALID
    with pytest.raises(DataDistError) as e:
        copy_segments([Segment(hb, 0, 10), Segment(hb, 95, 10)], [Segment(ha, 0, 20)])
    assert e.value.code == StatusCode.LLM_PARAM_INVALID and "outside" in e.value.message
    with pytest.raises(DataDistError):
        copy_segments([Segment(hb, 0, 10)], [Segment(ha, -1, 10)])
    assert not b.any()
    assert copy_segments([], []) == 0
    assert copy_segments([Segment(hb, 5, 0)], []) == 0


def test_overlapping_copy_within_one_handle_is_memmove():
    a = np.arange(200, dtype=np.uint8)
    want = a.copy()
    want[10:110] = a[0:100]
    h = ViewHandle(a)
    copy_segments([Segment(h, 10, 100)], [Segment(h, 0, 100)])
    np.testing.assert_array_equal(a, want)


def test_staging_larger_than_the_stage():
    n = STAGE_MAX * 2 + 12345
    src = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    for kind in ("noview", "fd"):
        s_arr = in_memfd(src) if kind == "fd" else src
        dst = np.zeros(n, dtype=np.uint8)
        dst = in_memfd(dst) if kind == "fd" else dst
        pieces = [(0, 1000), (1000, STAGE_MAX + 7), (STAGE_MAX + 1007, n - STAGE_MAX - 1007)]
        hs, hd = make_handle(kind, s_arr), make_handle(kind, dst)
        assert copy_segments([Segment(hd, o, k) for o, k in pieces], [Segment(hs, 0, n)]) == n
        np.testing.assert_array_equal(dst, src)


def test_many_small_view_segments():
    pieces = 100_000
    src = np.random.default_rng(8).integers(0, 256, pieces * 32, dtype=np.uint8)
    dst = np.zeros_like(src)
    hs, hd = DirectHandle(src.ctypes.data, src.nbytes), DirectHandle(dst.ctypes.data, dst.nbytes)
    src_segs = [Segment(hs, k * 32, 32) for k in range(pieces)]
    dst_segs = [Segment(hd, (pieces - 1 - k) * 32, 32) for k in range(pieces)]
    copy_segments(dst_segs, src_segs)
    np.testing.assert_array_equal(dst.reshape(pieces, 32), src.reshape(pieces, 32)[::-1])
