"""Staging: where bytes wait when a memory handle has no mapping the sockets can read or write in place.

``Buffers`` holds a transport's send staging buffers (reused across sends) and each reader thread's
receive staging and discard buffers. ``SendPlan`` is the source of one send, gathered into the buffers of
one ``sendmsg`` (views of mapped memory; the other segments read into a staging buffer first, ``read_raw``
batches). ``write_out`` writes received staged segments into their destination handles. Nothing here
knows a socket, a channel or a receipt.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from datadist.status import LLMStatusCode

from ...memory import addr as memaddr
from ...memory.access import has_raw
from ...memory.base import MemoryHandle
from ...memory.segments import SegmentTable, byte_view
from .wire import _DISCARD, _FEW, _FRAME_SEGMENTS, _SPARE_BYTES, _SPARES, _STAGING, _SendError

__all__ = ["Buffers", "SendPlan", "by_handle", "write_out", "frame_cuts"]


class Buffers:
    """The staging buffers of one transport: send buffers to reuse, and per reader thread a receive
    staging buffer and a discard buffer."""

    def __init__(self, chunk_size: int) -> None:
        self._chunk_size = chunk_size
        self._lock = threading.Lock()
        self._spare: list[memoryview] = []     # send staging buffers to reuse
        self._local = threading.local()

    def discard(self) -> memoryview:
        """This reader thread's buffer for bytes nobody waits for."""
        buf = getattr(self._local, "discard", None)
        if buf is None:
            buf = self._local.discard = memoryview(bytearray(_DISCARD))
        return buf

    def staging(self) -> tuple[memoryview, int]:
        """This reader thread's receive staging buffer and its address."""
        buf = getattr(self._local, "staging", None)
        if buf is None:
            view = memoryview(bytearray(_STAGING))
            buf = self._local.staging = (view, memaddr.buffer_address(view)[0])
        return buf

    def take(self, n: int) -> memoryview:
        """A send staging buffer of at least ``n`` bytes (reused across sends; ``give`` it back)."""
        with self._lock:
            for i, buf in enumerate(self._spare):
                if len(buf) >= n:
                    return self._spare.pop(i)
        return memoryview(bytearray(max(n, min(self._chunk_size, _SPARE_BYTES))))

    def give(self, buf: memoryview) -> None:
        with self._lock:
            if len(self._spare) < _SPARES and len(buf) <= _SPARE_BYTES:
                self._spare.append(buf)


class SendPlan:
    """The source of one send: its segment table, one readable view per handle (``None``: no mapping)."""

    def __init__(self, table: SegmentTable) -> None:
        self.table = table.nonempty()
        self.total = self.table.nbytes
        self.views: list[memoryview | None] = [byte_view(h, writable=False) for h in self.table.handles]
        self.mapped_l = [v is not None for v in self.views]
        self.mapped = np.array(self.mapped_l, bool)
        self.all_mapped = all(self.mapped_l)
        self.raw = [has_raw(h) for h in self.table.handles]

    def gather(self, offset: int, length: int, staging: memoryview | None, bufs: list[memoryview]) -> None:
        """Append the buffers holding stream bytes ``[offset, offset + length)`` to ``bufs``: views of mapped
        memory, and for the rest ``staging`` (filled here; segment k sits at its stream position - offset)."""
        which, offs, lens = self.table.cut(offset, offset + length)
        views = self.views
        if self.all_mapped:
            hs = which.tolist()
            if hs[0] == hs[-1] and (len(hs) < 3 or not (which != hs[0]).any()):
                v = views[hs[0]]
                bufs += [v[a:b] for a, b in zip(offs.tolist(), (offs + lens).tolist(), strict=True)]
            else:
                bufs += [views[h][a:b] for h, a, b in zip(hs, offs.tolist(), (offs + lens).tolist(), strict=True)]
            return
        if staging is None or len(staging) < length:
            raise _SendError(LLMStatusCode.LLM_FAILED, "internal: staging buffer too small", unusable=False)
        if len(lens) <= _FEW:  # a few segments: one read_into each beats building a batch
            handles, mapped_l = self.table.handles, self.mapped_l
            pos, run = 0, -1
            for h, a, n in zip(which.tolist(), offs.tolist(), lens.tolist(), strict=True):
                if mapped_l[h]:
                    if run >= 0:
                        bufs.append(staging[run:pos])
                        run = -1
                    bufs.append(views[h][a:a + n])
                else:
                    handles[h].read_into(a, staging[pos:pos + n])
                    if run < 0:
                        run = pos
                pos += n
            if run >= 0:
                bufs.append(staging[run:pos])
            return
        mapped = self.mapped[which]
        local = np.cumsum(lens) - lens           # where each segment sits in the staging buffer
        base = memaddr.buffer_address(staging)[0]
        handles = self.table.handles
        unmapped = ~mapped
        for h, sel in by_handle(which, unmapped):
            if self.raw[h]:
                handles[h].read_raw(np.stack((offs[sel], base + local[sel], lens[sel]), axis=1))
                continue
            for off, loc, n in zip(offs[sel].tolist(), local[sel].tolist(), lens[sel].tolist(), strict=True):
                handles[h].read_into(off, staging[loc:loc + n])
        if not mapped.any():
            bufs.append(staging[:length])
            return
        run = -1  # start (in staging) of the current run of staged segments
        segments = zip(which.tolist(), offs.tolist(), lens.tolist(), local.tolist(), mapped.tolist(), strict=True)
        for h, a, n, loc, m in segments:
            if m:
                if run >= 0:
                    bufs.append(staging[run:loc])
                    run = -1
                bufs.append(views[h][a:a + n])
            elif run < 0:
                run = loc
        if run >= 0:
            bufs.append(staging[run:length])

    def release(self) -> None:
        self.views = []


def by_handle(which: np.ndarray, among: np.ndarray | None = None) -> list[tuple[int, Any]]:
    """``(handle index, selector)`` for each distinct handle of the segments (``among``: only those segments)."""
    if among is None:
        first = int(which[0])
        if int(which[-1]) == first and (len(which) < 3 or bool((which == first).all())):
            return [(first, slice(None))]       # the common case: one handle (one tensor) per window
        return [(h, which == h) for h in np.unique(which).tolist()]
    return [(h, among & (which == h)) for h in np.unique(which[among]).tolist()]


def write_out(handles: Sequence[MemoryHandle], raw: Sequence[bool], which: np.ndarray, offs: np.ndarray,
              local: np.ndarray, lens: np.ndarray, staging: memoryview, base: int) -> None:
    """Staged segments into their (unmapped) destination ``handles``, one batch per handle (``raw[h]``: handle
    ``h`` takes ``write_raw``). The caller is inside the receipt's ``_begin_io``."""
    if len(which) <= _FEW:  # a few segments: one write_from each beats building a batch
        for h, off, loc, n in zip(which.tolist(), offs.tolist(), local.tolist(), lens.tolist(), strict=True):
            handles[h].write_from(off, staging[loc - base:loc - base + n])
        return
    for h, sel in by_handle(which):
        handle = handles[h]
        if raw[h]:
            handle.write_raw(np.stack((offs[sel], local[sel], lens[sel]), axis=1))
            continue
        for off, loc, n in zip(offs[sel].tolist(), local[sel].tolist(), lens[sel].tolist(), strict=True):
            handle.write_from(off, staging[loc - base:loc - base + n])


def frame_cuts(table: SegmentTable, chunk_size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each frame: ``chunk_size`` bytes, or fewer when ``_FRAME_SEGMENTS`` segments end
    first (tiny blocks: one ``sendmsg`` per frame, and no per-frame list or array of more than that many)."""
    total = table.nbytes
    if len(table) <= _FRAME_SEGMENTS:
        return [(offset, min(chunk_size, total - offset)) for offset in range(0, total, chunk_size)]
    segment_cuts = table.ends[_FRAME_SEGMENTS - 1::_FRAME_SEGMENTS]
    cuts = np.union1d(np.arange(chunk_size, total, chunk_size, dtype=np.int64), segment_cuts[segment_cuts < total])
    starts = np.concatenate((np.zeros(1, np.int64), cuts))
    lengths = np.diff(np.concatenate((starts, np.array([total], np.int64))))
    return list(zip(starts.tolist(), lengths.tolist(), strict=True))
