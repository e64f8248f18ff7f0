"""``copy_segments``: copy one scatter list of memory segments into another, inside the daemon.

Used by ``copy_blocks``/``swap_blocks``/``copy_cache`` and by same-host transfers. The source and
destination are each read as one byte stream (their segments concatenated). Both lists become
``SegmentTable`` arrays; the union of both sides' segment boundaries cuts the stream into moves
(array arithmetic, no Python object per move), and consecutive moves of the same kind are moved
together, the cheapest way:

* both handles mapped (``view()`` is a memoryview): a slice assignment per move, i.e. one
  ``memmove`` (for many small moves this is as fast as anything Python can call: a vectored
  system call pinning pages costs more than the interpreter's loop);
* one side without a view: when the handle offers ``read_raw``/``write_raw`` (cross-memory attach,
  ``host.ProcessHandle``), all the consecutive moves of that handle go to the kernel as one
  iovec array (``IOV_MAX`` per system call) straight from/into the other side's memory;
  otherwise ``read_into``/``write_from`` per move;
* neither side mapped, both device memory of one device (``access.DeviceCopy``: ``acl``): device to
  device, all the moves in one batch (``copy_moves``), never through the host;
* neither side mapped otherwise: through one bounded staging buffer (at most ``STAGE_MAX`` bytes, sized
  to stay in the CPU cache between the read and the write).

Moves are applied in order, except that moves staged together (neither side mapped) are all read
before any of them is written. So a call whose moves read bytes that an earlier move of the same
call writes has no defined result (between mapped handles one move overlapping itself is a memmove).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.errors import DataDistError, StatusCode
from . import addr
from .access import MAPPED, PLAIN, RAW, DeviceCopy, access_kind, same_device
from .base import Segment
from .segments import SegmentTable, byte_view, cut

__all__ = ["copy_segments", "STAGE_MAX", "BufferHandle", "all_mapped", "read_bytes", "write_bytes"]

#: the largest staging buffer used when neither side is mapped
STAGE_MAX = 4 << 20

_MAPPED, _RAW, _PLAIN = MAPPED, RAW, PLAIN
# modes of a move: which side is mapped
_VV, _DV, _SV, _NN = 0, 1, 2, 3   # both / only the destination / only the source / neither


def _table(segments: Sequence[Segment], side: str) -> SegmentTable:
    table = SegmentTable.of(segments)
    bad = table.first_bad()
    if bad >= 0:
        offset, length = int(table.offsets[bad]), int(table.lengths[bad])
        size = table.handles[int(table.which[bad])].size
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"{side} segment [{offset}, {offset + length}) is outside its memory of {size} bytes")
    return table


class _Side:
    """Per-handle facts of one side: view, base address of the view, kind."""

    def __init__(self, table: SegmentTable) -> None:
        self.handles = table.handles
        self.views: list[memoryview | None] = []
        kinds = []
        for h in self.handles:
            v = byte_view(h, writable=False)
            self.views.append(v)
            kinds.append(access_kind(h, v))
        self.kinds = np.array(kinds, np.int8)
        self._addrs: np.ndarray | None = None

    def addrs(self) -> np.ndarray:
        """Base address of each mapped handle's view (0 for the others)."""
        if self._addrs is None:
            self._addrs = np.array([addr.buffer_address(v)[0] if v is not None and len(v) else 0
                                    for v in self.views], np.int64)
        return self._addrs

    def release(self) -> None:
        self.views.clear()


def copy_segments(dst: Sequence[Segment], src: Sequence[Segment]) -> int:
    """Copy the concatenated bytes of ``src`` into the concatenated ``dst``; returns the bytes copied.

    Raises ``DataDistError(LLM_PARAM_INVALID)`` before any byte moves when a segment lies outside its
    handle or the total lengths differ.
    """
    d = _table(dst, "destination")
    s = _table(src, "source")
    total = d.nbytes
    if total != s.nbytes:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"source has {s.nbytes} bytes but destination has {total} bytes")
    if total == 0:
        return 0
    d, s = d.nonempty(), s.nonempty()
    # moves: the stream cut at every boundary of either side
    if len(d) == 1 and len(s) == 1:
        starts = np.zeros(1, np.int64)
    else:
        starts = np.union1d(d.ends[:-1], s.ends[:-1])
        starts = np.concatenate((np.zeros(1, np.int64), starts))
    lengths = np.diff(np.concatenate((starts, np.array([total], np.int64))))
    di = np.searchsorted(d.ends, starts, side="right")
    si = np.searchsorted(s.ends, starts, side="right")
    d_off = d.offsets[di] + (starts - (d.ends[di] - d.lengths[di]))
    s_off = s.offsets[si] + (starts - (s.ends[si] - s.lengths[si]))
    dw, sw = d.which[di], s.which[si]
    ds, ss = _Side(d), _Side(s)
    try:
        dk, sk = ds.kinds[dw], ss.kinds[sw]
        mode = np.where(dk == _MAPPED, np.where(sk == _MAPPED, _VV, _DV), np.where(sk == _MAPPED, _SV, _NN))
        # the handle a batch goes through: the unmapped side's (none for _VV and _NN)
        via = np.where(mode == _DV, sw, np.where(mode == _SV, dw, 0))
        key = mode.astype(np.int64) * (1 << 32) + via
        bounds = np.flatnonzero(key[1:] != key[:-1]) + 1 if len(key) > 1 else np.zeros(0, np.intp)
        edges = [0, *bounds.tolist(), len(key)]
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            m = int(mode[a])
            if m == _VV:
                _mapped(ds, ss, dw[a:b], d_off[a:b], sw[a:b], s_off[a:b], lengths[a:b])
            elif m == _DV:
                _into_mapped(ds, ss, int(sw[a]), dw[a:b], d_off[a:b], s_off[a:b], lengths[a:b])
            elif m == _SV:
                _from_mapped(ds, ss, int(dw[a]), d_off[a:b], sw[a:b], s_off[a:b], lengths[a:b])
            elif same_device([*(ds.handles[i] for i in np.unique(dw[a:b]).tolist()),
                              *(ss.handles[i] for i in np.unique(sw[a:b]).tolist())]):
                _device(ds, ss, dw[a:b], d_off[a:b], sw[a:b], s_off[a:b], lengths[a:b])
            else:
                _staged(ds, ss, dw[a:b], d_off[a:b], sw[a:b], s_off[a:b], lengths[a:b])
    finally:
        ds.release()
        ss.release()
    return total


def _mapped(ds: _Side, ss: _Side, dw: np.ndarray, d_off: np.ndarray, sw: np.ndarray, s_off: np.ndarray,
            n: np.ndarray) -> None:
    dv, sv = ds.views, ss.views
    if (dw[0] == dw[-1] and sw[0] == sw[-1] and (len(dw) < 3 or ((dw == dw[0]).all() and (sw == sw[0]).all()))):
        d, s = dv[int(dw[0])], sv[int(sw[0])]  # one handle each side (a daemon pool): no lookups per move
        for do, so, k in zip(d_off.tolist(), s_off.tolist(), n.tolist(), strict=True):
            d[do:do + k] = s[so:so + k]  # type: ignore[index]
        return
    for dh, do, sh, so, k in zip(dw.tolist(), d_off.tolist(), sw.tolist(), s_off.tolist(), n.tolist(), strict=True):
        dv[dh][do:do + k] = sv[sh][so:so + k]


def _into_mapped(ds: _Side, ss: _Side, sh: int, dw: np.ndarray, d_off: np.ndarray, s_off: np.ndarray,
                 n: np.ndarray) -> None:
    """Mapped destination, source ``sh`` without a view."""
    handle: Any = ss.handles[sh]   # a RawAccess when its kind is _RAW
    if ss.kinds[sh] == _RAW:
        handle.read_raw(np.stack((s_off, ds.addrs()[dw] + d_off, n), axis=1))
        return
    dv = ds.views
    for dh, do, so, k in zip(dw.tolist(), d_off.tolist(), s_off.tolist(), n.tolist(), strict=True):
        handle.read_into(so, dv[dh][do:do + k])


def _from_mapped(ds: _Side, ss: _Side, dh: int, d_off: np.ndarray, sw: np.ndarray, s_off: np.ndarray,
                 n: np.ndarray) -> None:
    """Destination ``dh`` without a view, mapped source."""
    handle: Any = ds.handles[dh]   # a RawAccess when its kind is _RAW
    if ds.kinds[dh] == _RAW:
        handle.write_raw(np.stack((d_off, ss.addrs()[sw] + s_off, n), axis=1))
        return
    sv = ss.views
    for sh, do, so, k in zip(sw.tolist(), d_off.tolist(), s_off.tolist(), n.tolist(), strict=True):
        handle.write_from(do, sv[sh][so:so + k])


def _device(ds: _Side, ss: _Side, dw: np.ndarray, d_off: np.ndarray, sw: np.ndarray, s_off: np.ndarray,
            n: np.ndarray) -> None:
    """Both sides device memory of one device: one ``copy_moves`` batch of absolute addresses."""
    d_base = np.array([h.address if isinstance(h, DeviceCopy) else 0 for h in ds.handles], np.int64)
    s_base = np.array([h.address if isinstance(h, DeviceCopy) else 0 for h in ss.handles], np.int64)
    moves = np.stack((d_base[dw] + d_off, s_base[sw] + s_off, n), axis=1)
    handle = ss.handles[int(sw[0])]
    assert isinstance(handle, DeviceCopy)
    handle.copy_moves(moves.tolist())


def _staged(ds: _Side, ss: _Side, dw: np.ndarray, d_off: np.ndarray, sw: np.ndarray, s_off: np.ndarray,
            n: np.ndarray) -> None:
    """Neither side mapped: windows of at most ``STAGE_MAX`` bytes, each read whole, then written."""
    total = int(n.sum())
    cap = min(total, STAGE_MAX)
    stage = bytearray(cap)
    view = memoryview(stage)
    base = addr.buffer_address(view)[0]
    ends = np.cumsum(n)
    pos = ends - n                                 # stream position of each move
    try:
        for lo in range(0, total, cap):  # one window per pass
            hi = min(lo + cap, total)
            i0, i1, k, (so, do, p) = cut(ends, n, lo, hi, s_off, d_off, pos)
            local = base + (p - lo)
            _stage_io(ss, sw[i0:i1], so, local, k, view, base, read=True)
            _stage_io(ds, dw[i0:i1], do, local, k, view, base, read=False)
    finally:
        view.release()


def _stage_io(side: _Side, which: np.ndarray, offsets: np.ndarray, local: np.ndarray, n: np.ndarray,
              view: memoryview, base: int, read: bool) -> None:
    """Make the moves of one window between the stage and their handles, one batch per handle."""
    for h in np.unique(which).tolist():
        sel = which == h
        handle: Any = side.handles[h]
        if side.kinds[h] == _RAW:
            moves = np.stack((offsets[sel], local[sel], n[sel]), axis=1)
            (handle.read_raw if read else handle.write_raw)(moves)
            continue
        for off, loc, k in zip(offsets[sel].tolist(), local[sel].tolist(), n[sel].tolist(), strict=True):
            part = view[loc - base:loc - base + k]
            if read:
                handle.read_into(off, part)
            else:
                handle.write_from(off, part)


class BufferHandle:
    """Bytes of the daemon's own as a ``MemoryHandle``: the payload of an inline read, on either side."""

    def __init__(self, buf: bytes | bytearray) -> None:
        self._view = memoryview(buf).cast("B")

    @property
    def size(self) -> int:
        return len(self._view)

    def view(self) -> memoryview | None:
        return self._view

    def read_into(self, offset: int, dst: memoryview) -> None:
        out = memoryview(dst).cast("B")
        out[:] = self._view[offset:offset + len(out)]

    def write_from(self, offset: int, src: memoryview | bytes) -> None:
        data = memoryview(src).cast("B")
        self._view[offset:offset + len(data)] = data

    def close(self) -> None:
        pass


def all_mapped(segments: Sequence[Segment]) -> bool:
    """Whether every handle of ``segments`` is mapped in the daemon (so copying them is a ``memmove`` that
    nothing but the CPU can hold up: safe on the event loop)."""
    return all(h.view() is not None for h in SegmentTable.of(segments).handles)


#: the most segments ``read_bytes`` / ``write_bytes`` slice one by one (more: ``copy_segments``' array arithmetic)
_FEW = 64


def _views(table: SegmentTable, writable: bool) -> list[memoryview] | None:
    """Byte views of every handle of a small table, or None (a handle without one, or too many segments)."""
    if len(table) > _FEW:
        return None
    views = []
    for h in table.handles:
        v = byte_view(h, writable)
        if v is None:
            return None
        views.append(v)
    return views


def _segment_views(table: SegmentTable, views: list[memoryview], side: str) -> list[tuple[memoryview, int, int]]:
    out = []
    for w, o, n in zip(table.which.tolist(), table.offsets.tolist(), table.lengths.tolist(), strict=True):
        v = views[w]
        if o < 0 or n < 0 or o + n > len(v):
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"{side} segment [{o}, {o + n}) is outside its memory of {len(v)} bytes")
        out.append((v, o, n))
    return out


def read_bytes(src: Sequence[Segment]) -> bytes:
    """The concatenated bytes of ``src``, copied out (the owner's side of an inline read). A few mapped segments
    are sliced directly (the usual small read: no tables, no staging); anything else goes through
    ``copy_segments``."""
    table = SegmentTable.of(src)
    views = _views(table, writable=False)
    if views is not None:
        return b"".join([v[o:o + n] for v, o, n in _segment_views(table, views, "source")])
    buf = bytearray(table.nbytes)
    copy_segments([Segment(BufferHandle(buf), 0, len(buf))], src)
    return bytes(buf)


def write_bytes(dst: Sequence[Segment], data: bytes) -> None:
    """Copy ``data`` into the concatenated ``dst`` (the requester's side of an inline read); the lengths must
    agree (``LLM_PARAM_INVALID`` before any byte moves)."""
    table = SegmentTable.of(dst)
    views = _views(table, writable=True)
    if views is None:
        copy_segments(dst, [Segment(BufferHandle(data), 0, len(data))])
        return
    segs = _segment_views(table, views, "destination")
    if table.nbytes != len(data):
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"source has {len(data)} bytes but destination has {table.nbytes} bytes")
    src = memoryview(data)
    at = 0
    for v, o, n in segs:
        v[o:o + n] = src[at:at + n]
        at += n
