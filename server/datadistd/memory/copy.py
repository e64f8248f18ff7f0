"""``copy_segments``: copy one scatter list of memory segments into another, inside the daemon.

Used by ``copy_blocks``/``swap_blocks``/``copy_cache`` and by same-host transfers. The source and
destination are each read as one byte stream (their segments concatenated); two cursors walk both
lists and cut pieces where either side's segment ends. Each piece is moved the cheapest way:

* both handles mapped (``view()`` is a memoryview): a slice assignment, i.e. one ``memmove``;
* one side without a view: ``read_into``/``write_from`` straight from/into the other side's view,
  or, when the handle offers ``read_raw``/``write_raw`` (cross-memory attach, ``host.ProcessHandle``),
  consecutive pieces go to the kernel in batches (``IOV_MAX`` per system call);
* neither side mapped: through one bounded staging buffer (at most ``STAGE_MAX`` bytes).

Pieces are applied in order, except that pieces staged together (neither side mapped) are all read
before any of them is written. So a call whose pieces read bytes that an earlier piece of the same
call writes has no defined result (between mapped handles one piece overlapping itself is a memmove).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core.errors import DataDistError, StatusCode
from . import xmem
from .base import Segment

__all__ = ["copy_segments", "STAGE_MAX"]

#: the largest staging buffer used when neither side is mapped
STAGE_MAX = 4 << 20

_READ, _WRITE = 1, 2


def _total(segments: Sequence[Segment], side: str) -> int:
    total = 0
    for seg in segments:
        offset, length = seg.offset, seg.length
        if offset < 0 or length < 0 or offset + length > seg.handle.size:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"{side} segment [{offset}, {offset + length}) is outside its memory of "
                                f"{seg.handle.size} bytes")
        total += length
    return total


class _Copier:
    """Executes pieces in order, batching those that go through a handle without a view."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.views: dict[int, memoryview | None] = {}
        self.addrs: dict[int, int] = {}
        # pending batch: kind, the unmapped handle, and its (offset, local_addr, length) pieces
        self.kind = 0
        self.handle: Any = None
        self.pieces: list[tuple[int, int, int]] = []
        # staging (neither side mapped)
        self.stage: bytearray | None = None
        self.stage_view = memoryview(b"")
        self.stage_addr = 0
        self.stage_used = 0
        # staged pieces as runs per handle: (handle, [(offset, stage address, length)])
        self.reads: list[tuple[Any, list[tuple[int, int, int]]]] = []
        self.writes: list[tuple[Any, list[tuple[int, int, int]]]] = []
        self.read_handle: Any = None
        self.write_handle: Any = None
        self.read_list: list[tuple[int, int, int]] = []
        self.write_list: list[tuple[int, int, int]] = []

    def view(self, handle: Any) -> memoryview | None:
        key = id(handle)
        try:
            return self.views[key]
        except KeyError:
            v = handle.view()
            if v is not None and (v.format != "B" or v.ndim != 1):
                v = v.cast("B")
            self.views[key] = v
            return v

    def addr(self, handle: Any, view: memoryview) -> int:
        key = id(handle)
        a = self.addrs.get(key)
        if a is None:
            a = self.addrs[key] = xmem.buffer_address(view)[0]
        return a

    # ---- batches through an unmapped handle ----------------------------------------------------

    def start(self, kind: int, handle: Any) -> None:
        """Begin a new batch of ``kind`` through ``handle`` after finishing whatever is pending."""
        self.flush_stage()
        self.flush()
        self.kind, self.handle = kind, handle

    def flush(self) -> None:
        if self.pieces:
            if self.kind == _READ:
                self.handle.read_raw(self.pieces)
            else:
                self.handle.write_raw(self.pieces)
            self.pieces = []
        self.kind, self.handle = 0, None

    # ---- staging ------------------------------------------------------------------------------

    def add_staged(self, sh: Any, s_off: int, dh: Any, d_off: int, n: int) -> None:
        """Queue a piece between two unmapped handles: read into the stage, later write out of it."""
        if self.pieces:
            self.flush()
        if self.stage is None:
            self.stage = bytearray(min(self.total, STAGE_MAX))
            self.stage_view = memoryview(self.stage)
            self.stage_addr = xmem.buffer_address(self.stage_view)[0]
        cap = len(self.stage)
        while n > 0:
            if self.stage_used == cap:
                self.flush_stage()
            take = min(n, cap - self.stage_used)
            local = self.stage_addr + self.stage_used
            if self.read_handle is not sh:
                self.read_handle, self.read_list = sh, []
                self.reads.append((sh, self.read_list))
            self.read_list.append((s_off, local, take))
            if self.write_handle is not dh:
                self.write_handle, self.write_list = dh, []
                self.writes.append((dh, self.write_list))
            self.write_list.append((d_off, local, take))
            self.stage_used += take
            s_off += take
            d_off += take
            n -= take

    def flush_stage(self) -> None:
        if not self.stage_used:
            return
        reads, writes = self.reads, self.writes
        self.reads, self.writes = [], []
        self.read_handle = self.write_handle = None
        self.stage_used = 0
        sv, base = self.stage_view, self.stage_addr
        for handle, pieces in reads:
            if hasattr(handle, "read_raw"):
                handle.read_raw(pieces)
            else:
                for off, local, n in pieces:
                    handle.read_into(off, sv[local - base:local - base + n])
        for handle, pieces in writes:
            if hasattr(handle, "write_raw"):
                handle.write_raw(pieces)
            else:
                for off, local, n in pieces:
                    handle.write_from(off, sv[local - base:local - base + n])

    def finish(self) -> None:
        self.flush()
        self.flush_stage()
        self.stage_view.release()


def copy_segments(dst: Sequence[Segment], src: Sequence[Segment]) -> int:
    """Copy the concatenated bytes of ``src`` into the concatenated ``dst``; returns the bytes copied.

    Raises ``DataDistError(LLM_PARAM_INVALID)`` before any byte moves when a segment lies outside its
    handle or the total lengths differ.
    """
    total = _total(dst, "destination")
    src_total = _total(src, "source")
    if total != src_total:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"source has {src_total} bytes but destination has {total} bytes")
    if total == 0:
        return 0
    c = _Copier(total)
    view = c.view
    di = si = -1
    d_left = s_left = 0
    d_off = s_off = 0
    dh: Any = None      # current destination handle, its view, its base address (-1: not yet known)
    sh: Any = None
    dv: memoryview | None = None
    sv: memoryview | None = None
    d_addr = s_addr = -1
    d_raw = s_raw = False  # whether the current handle batches pieces (write_raw / read_raw)
    pending = False        # whether the copier holds a batch or staged pieces
    remaining = total
    try:
        while remaining:
            while d_left == 0:
                di += 1
                seg = dst[di]
                d_left, d_off = seg.length, seg.offset
                if seg.handle is not dh:
                    dh = seg.handle
                    dv, d_addr = view(dh), -1
                    d_raw = dv is None and hasattr(dh, "write_raw")
            while s_left == 0:
                si += 1
                seg = src[si]
                s_left, s_off = seg.length, seg.offset
                if seg.handle is not sh:
                    sh = seg.handle
                    sv, s_addr = view(sh), -1
                    s_raw = sv is None and hasattr(sh, "read_raw")
            n = d_left if d_left < s_left else s_left
            if dv is not None:
                if sv is not None:
                    if pending:
                        c.flush()
                        c.flush_stage()
                        pending = False
                    dv[d_off:d_off + n] = sv[s_off:s_off + n]
                elif s_raw:
                    if d_addr < 0:
                        d_addr = c.addr(dh, dv)
                    if c.kind != _READ or c.handle is not sh:
                        c.start(_READ, sh)
                    c.pieces.append((s_off, d_addr + d_off, n))
                    pending = True
                else:
                    if pending:
                        c.flush()
                        c.flush_stage()
                        pending = False
                    sh.read_into(s_off, dv[d_off:d_off + n])
            elif sv is not None:
                if d_raw:
                    if s_addr < 0:
                        s_addr = c.addr(sh, sv)
                    if c.kind != _WRITE or c.handle is not dh:
                        c.start(_WRITE, dh)
                    c.pieces.append((d_off, s_addr + s_off, n))
                    pending = True
                else:
                    if pending:
                        c.flush()
                        c.flush_stage()
                        pending = False
                    dh.write_from(d_off, sv[s_off:s_off + n])
            else:
                c.add_staged(sh, s_off, dh, d_off, n)
                pending = True
            d_off += n
            s_off += n
            d_left -= n
            s_left -= n
            remaining -= n
        c.finish()
    finally:
        c.views.clear()
    return total
