"""HIXL's transfers by address (docs/hixl.md): a list of byte extents between an engine's registrations and a
linked engine's, resolved against the registrations each side holds.

A HIXL registration is a cache of one tensor registered by address (``RegisterCache`` with the worker's address);
an extent names ``len`` bytes at a worker address of the engine that registered them. Both ends resolve their own
side here: the requester its local extents (``ExtentOrder``: into segments of its caches), the owner the remote ones
a peer names (a ``RemoteSpec`` in ``ReadMode.EXTENTS``: address and length pairs) -- each extent wholly inside one
registration or the whole transfer is refused with ``LLM_PARAM_INVALID`` naming the first one that is not, before a
byte moves. Resolution is a few array operations whatever the extent count (10,000 extents: one ``searchsorted``),
and segments come out as one ``SegmentTable`` -- no Python object per extent.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence, Union, cast

import numpy as np

from ..core.errors import DataDistError, StatusCode
from ..core.registry import CacheEntry
from ..core.types import BlockList
from ..memory.base import Segment
from ..memory.segments import SegmentTable

__all__ = ["ExtentOrder", "MAX_EXTENTS", "FEW", "parse_extents", "extents_of", "checked_extents", "remote_pairs",
           "pairs_array", "Regions", "AddressIndex", "Resolved"]

#: the most extents one transfer names (a 3 MiB request; the owner's frame carries 2^18 numbers of its 2^20; HIXL's
#: samples name 512)
MAX_EXTENTS = 1 << 17
#: at most this many extents are resolved as ints, more by arrays (a numpy call costs a few µs whatever its size)
FEW = 16

#: addresses or lengths: a few as a list of ints, many as a uint64 array
Numbers = Union[Sequence[int], np.ndarray]

_U64 = np.dtype("<u8")
_END = 1 << 64


@dataclass(frozen=True)
class ExtentOrder:
    """A HIXL ``TransferSync``/``TransferAsync`` as the daemon takes it: ``extents`` an ``(n, 3)`` uint64 array of
    (local_addr, remote_addr, len) rows, ``write`` False for a READ (remote -> local)."""

    remote_cluster: int
    write: bool
    extents: np.ndarray
    timeout_ms: int | None = None


def parse_extents(raw: bytes) -> np.ndarray:
    """``ExtentTransferRequest.extents`` (24 bytes an extent: u64 LE local_addr, remote_addr, len) as an ``(n, 3)``
    uint64 array, every bound checked: at least one extent, at most ``MAX_EXTENTS``, no zero address or length, no
    extent running past the end of the address space, no more than 2^63 bytes in all."""
    if len(raw) % 24:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"extents are 24 bytes each (local_addr, remote_addr, len); got {len(raw)} bytes")
    n = len(raw) // 24
    if not 0 < n <= MAX_EXTENTS:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a transfer names 1 to {MAX_EXTENTS} extents; got {n}")
    return checked_extents(np.frombuffer(raw, dtype=_U64).reshape(n, 3))


def extents_of(numbers: Sequence[int]) -> np.ndarray:
    """The extents an attach frame carries as block numbers (``datadist.fastframe.KIND_EXTENTS``: three each), as
    ``parse_extents`` takes them, every bound checked."""
    if len(numbers) % 3 or not 0 < len(numbers) <= 3 * MAX_EXTENTS:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a transfer names 1 to {MAX_EXTENTS} extents of three "
                                                          f"numbers each; got {len(numbers)} numbers")
    return checked_extents(np.array(numbers, dtype=_U64).reshape(-1, 3))


def checked_extents(ext: np.ndarray) -> np.ndarray:
    """``ext`` (an ``(n, 3)`` uint64 array) once every extent's bounds hold (``parse_extents``). A few extents are
    checked as ints, many by array (one rule: ``_bad_extent``'s)."""
    if len(ext) <= FEW:
        total = 0
        for i, (local, remote, n) in enumerate(ext.tolist()):
            _check_one(local, n, i, "local")
            _check_one(remote, n, i, "remote")
            total += n
        if total >= 1 << 63:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID, "the extents name more than 2^63 bytes in all")
        return ext
    _check_rows(ext[:, 0], ext[:, 2], "local")
    _check_rows(ext[:, 1], ext[:, 2], "remote")
    if int(ext[:, 2].sum(dtype=np.float64)) >= 1 << 63:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, "the extents name more than 2^63 bytes in all")
    return ext


def _check_rows(addrs: np.ndarray, lens: np.ndarray, side: str) -> None:
    bad = np.flatnonzero((addrs == 0) | (lens == 0) | (addrs > np.uint64(_END - 1) - lens + np.uint64(1)))
    if len(bad):
        i = int(bad[0])
        _check_one(int(addrs[i]), int(lens[i]), i, side)


def _check_one(addr: int, length: int, i: int, side: str) -> None:
    """Extent ``i``'s ``side``: a non-zero address and length, inside the address space."""
    if not addr or not length or addr + length > _END:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"extent {i}: {side} address {addr:#x}, len {length}: an address and a length must be "
                            "non-zero and the extent inside the address space")


def remote_pairs(extents: np.ndarray) -> tuple[int, ...]:
    """The remote side of ``extents`` as a ``RemoteSpec``'s ``blocks`` in ``ReadMode.EXTENTS``: address, length,
    address, length, ..."""
    return tuple(extents[:, 1:3].reshape(-1).tolist())


@dataclass(frozen=True)
class Resolved:
    """Extents resolved against one engine's registrations: their segments (stream order), the caches they touch
    (to pin) and their bytes."""

    segments: Sequence[Segment]      # a ``SegmentTable`` for many, a list for a few
    entries: tuple[CacheEntry, ...]
    nbytes: int


class Regions:
    """Address ranges (a base and a size each, any payload), sorted by base: ``locate`` finds the one holding each
    extent whole. The one copy of that rule: the owner's ``AddressIndex`` and the puller's published table
    (``links.published``) both use it."""

    def __init__(self, rows: Iterable[tuple[int, int, object]]) -> None:
        kept = sorted(((base, size, item) for base, size, item in rows if base and size), key=lambda r: r[0])
        self._bases = [r[0] for r in kept]
        self.bases = np.array(self._bases, dtype=_U64)
        self._ends = [r[0] + r[1] for r in kept]
        self._ends_u = np.array([min(e, _END - 1) for e in self._ends], dtype=_U64)
        self.items = [r[2] for r in kept]

    def __len__(self) -> int:
        return len(self.items)

    def locate(self, addrs: Numbers, lens: Numbers, whose: str) -> tuple[Numbers, Numbers]:
        """``(which, offset)`` of each extent: the index of the range holding it whole (the last one starting at or
        below it; where ranges overlap, any that holds it whole) and its byte offset into that range;
        ``LLM_PARAM_INVALID`` naming the first extent no range holds, and ``whose`` ranges those are. A few extents
        (lists of ints in, lists out) by bisection, many (arrays) by one ``searchsorted``."""
        if not isinstance(addrs, np.ndarray):
            return self._locate_few(addrs, lens.tolist() if isinstance(lens, np.ndarray) else lens, whose)
        idx = np.searchsorted(self.bases, addrs, side="right").astype(np.intp) - 1
        if len(self.bases):
            ok = (idx >= 0) & (addrs + lens <= self._ends_u[np.maximum(idx, 0)])
        else:
            ok = np.zeros(len(addrs), dtype=bool)
        for i in np.flatnonzero(~ok).tolist():   # the slow way only where the fast one did not settle it
            idx[i] = self._holder(int(addrs[i]), int(lens[i]), i, whose)
        return idx, (addrs - self.bases[idx]).astype(np.int64)

    def _locate_few(self, addrs: Sequence[int], lens: Sequence[int], whose: str) -> tuple[list[int], list[int]]:
        bases, ends = self._bases, self._ends
        which: list[int] = []
        offsets: list[int] = []
        for i, addr in enumerate(addrs):
            length = lens[i]
            k = bisect.bisect_right(bases, addr) - 1
            if k < 0 or addr + length > ends[k]:
                k = self._holder(addr, length, i, whose)
            which.append(k)
            offsets.append(addr - bases[k])
        return which, offsets

    def _holder(self, addr: int, length: int, i: int, whose: str) -> int:
        for k, end in enumerate(self._ends):
            if self._bases[k] <= addr and addr + length <= end:
                return k
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"extent {i}: {length} bytes at {addr:#x} are not inside one memory registration of "
                            f"{whose}")


class AddressIndex:
    """The registrations of one engine by address: every tensor of every cache with a worker address (built once
    per registry generation, ``Engine.address_index``)."""

    def __init__(self, regions: Iterable[tuple[int, int, CacheEntry, Segment]]) -> None:
        self._regions = Regions((base, size, (entry, seg)) for base, size, entry, seg in regions)
        segs = [cast(tuple[CacheEntry, Segment], item)[1] for item in self._regions.items]
        self._handles = [seg.handle for seg in segs]
        self._base_offsets = [seg.offset for seg in segs]
        self._offsets = np.array(self._base_offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._regions)

    def resolve(self, addrs: Numbers, lens: Numbers, whose: str) -> Resolved:
        """The segments of ``lens[i]`` bytes at ``addrs[i]``, each wholly inside one registration
        (``Regions.locate``: else ``LLM_PARAM_INVALID`` naming it); ``FEW`` or fewer as a list, with no array."""
        items = self._regions.items
        if len(addrs) <= FEW:
            few_addrs = addrs.tolist() if isinstance(addrs, np.ndarray) else addrs
            few_lens = lens.tolist() if isinstance(lens, np.ndarray) else lens
            ks, offs = self._regions.locate(few_addrs, few_lens, whose)
            segs = [Segment(self._handles[k], self._base_offsets[k] + off, n)
                    for k, off, n in zip(ks, offs, few_lens, strict=True)]
            entries = tuple(dict.fromkeys(items[k][0] for k in ks))   # type: ignore[index]
            return Resolved(segs, entries, sum(few_lens))
        which, offsets = self._regions.locate(addrs, lens, whose)
        nbytes = int(np.asarray(lens).sum(dtype=np.uint64))
        which = np.asarray(which, dtype=np.intp)
        table = SegmentTable(self._handles, which, self._offsets[which] + offsets,
                             np.asarray(lens).astype(np.int64), nbytes)
        entries = tuple(dict.fromkeys(items[int(k)][0] for k in np.unique(which)))   # type: ignore[index]
        return Resolved(table, entries, nbytes)


def pairs_array(pairs: Sequence[int]) -> tuple[Numbers, Numbers]:
    """A ``ReadMode.EXTENTS`` spec's ``blocks`` (address, length, ...) as addresses and lengths (``Numbers``), every
    bound checked."""
    if len(pairs) <= 2 * FEW and len(pairs) % 2 == 0 and pairs and not isinstance(pairs, BlockList):
        few_addrs, few_lens = list(pairs[0::2]), list(pairs[1::2])
        for i, addr in enumerate(few_addrs):
            _check_one(addr, few_lens[i], i, "remote")
        return few_addrs, few_lens   # a few as lists (``Regions.locate``)
    flat = np.asarray(pairs.values if isinstance(pairs, BlockList) else pairs, dtype=_U64)
    if len(flat) % 2 or not 0 < len(flat) <= 2 * MAX_EXTENTS:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"an extents request names 1 to {MAX_EXTENTS} address and "
                                                          f"length pairs; got {len(flat)} numbers")
    addrs, lens = flat[0::2], flat[1::2]
    _check_rows(addrs, lens, "remote")
    return addrs, lens
