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

from dataclasses import dataclass
from typing import Iterable, Sequence, cast

import numpy as np

from ..core.errors import DataDistError, StatusCode
from ..core.registry import CacheEntry
from ..core.types import BlockList
from ..memory.base import Segment
from ..memory.segments import SegmentTable

__all__ = ["ExtentOrder", "MAX_EXTENTS", "parse_extents", "remote_pairs", "pairs_array", "Regions", "AddressIndex",
           "Resolved"]

#: the most extents one transfer names (a 3 MiB request; the owner's frame carries 2^18 numbers of its 2^20; HIXL's
#: samples name 512)
MAX_EXTENTS = 1 << 17

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

    @property
    def nbytes(self) -> int:
        return int(self.extents[:, 2].sum(dtype=np.uint64))


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
    ext = np.frombuffer(raw, dtype=_U64).reshape(n, 3)
    _check_rows(ext[:, 0], ext[:, 2], "local")
    _check_rows(ext[:, 1], ext[:, 2], "remote")
    if int(ext[:, 2].sum(dtype=np.float64)) >= 1 << 63:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, "the extents name more than 2^63 bytes in all")
    return ext


def _check_rows(addrs: np.ndarray, lens: np.ndarray, side: str) -> None:
    bad = np.flatnonzero((addrs == 0) | (lens == 0) | (addrs > np.uint64(_END - 1) - lens + np.uint64(1)))
    if len(bad):
        i = int(bad[0])
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"extent {i}: {side} address {int(addrs[i]):#x}, len {int(lens[i])}: an address and a "
                            "length must be non-zero and the extent inside the address space")


def remote_pairs(extents: np.ndarray) -> tuple[int, ...]:
    """The remote side of ``extents`` as a ``RemoteSpec``'s ``blocks`` in ``ReadMode.EXTENTS``: address, length,
    address, length, ..."""
    return tuple(extents[:, 1:3].reshape(-1).tolist())


@dataclass(frozen=True)
class Resolved:
    """Extents resolved against one engine's registrations: their segments (stream order), the caches they touch
    (to pin) and their bytes."""

    segments: SegmentTable
    entries: tuple[CacheEntry, ...]
    nbytes: int


class Regions:
    """Address ranges (a base and a size each, any payload), sorted by base: ``locate`` finds the one holding each
    extent whole. The one copy of that rule: the owner's ``AddressIndex`` and the puller's published table
    (``links.published``) both use it."""

    def __init__(self, rows: Iterable[tuple[int, int, object]]) -> None:
        kept = sorted(((base, size, item) for base, size, item in rows if base and size), key=lambda r: r[0])
        self.bases = np.array([r[0] for r in kept], dtype=_U64)
        self._ends = [r[0] + r[1] for r in kept]
        self._ends_u = np.array([min(e, _END - 1) for e in self._ends], dtype=_U64)
        self.items = [r[2] for r in kept]

    def __len__(self) -> int:
        return len(self.items)

    def locate(self, addrs: np.ndarray, lens: np.ndarray, whose: str) -> tuple[np.ndarray, np.ndarray]:
        """``(which, offset)`` of each extent: the index of the range holding it whole (the last one starting at or
        below it; where ranges overlap, any that holds it whole) and its byte offset into that range;
        ``LLM_PARAM_INVALID`` naming the first extent no range holds, and ``whose`` ranges those are."""
        idx = np.searchsorted(self.bases, addrs, side="right").astype(np.intp) - 1
        if len(self.bases):
            ok = (idx >= 0) & (addrs + lens <= self._ends_u[np.maximum(idx, 0)])
        else:
            ok = np.zeros(len(addrs), dtype=bool)
        for i in np.flatnonzero(~ok).tolist():   # the slow way only where the fast one did not settle it
            idx[i] = self._holder(int(addrs[i]), int(lens[i]), i, whose)
        return idx, (addrs - self.bases[idx]).astype(np.int64)

    def _holder(self, addr: int, length: int, i: int, whose: str) -> int:
        for k, end in enumerate(self._ends):
            if int(self.bases[k]) <= addr and addr + length <= end:
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
        self._offsets = np.array([seg.offset for seg in segs], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._regions)

    def resolve(self, addrs: np.ndarray, lens: np.ndarray, whose: str) -> Resolved:
        """The segments of ``lens[i]`` bytes at ``addrs[i]``, each wholly inside one registration
        (``Regions.locate``: else ``LLM_PARAM_INVALID`` naming it)."""
        which, offsets = self._regions.locate(addrs, lens, whose)
        nbytes = int(lens.sum(dtype=np.uint64))
        table = SegmentTable(self._handles, which, self._offsets[which] + offsets, lens.astype(np.int64), nbytes)
        items = self._regions.items
        entries = tuple(dict.fromkeys(items[int(k)][0] for k in np.unique(which)))   # type: ignore[index]
        return Resolved(table, entries, nbytes)


def pairs_array(pairs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """A ``ReadMode.EXTENTS`` spec's ``blocks`` (address, length, ...) as two uint64 arrays."""
    flat = np.asarray(pairs.values if isinstance(pairs, BlockList) else pairs, dtype=_U64)
    if len(flat) % 2 or not 0 < len(flat) <= 2 * MAX_EXTENTS:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"an extents request names 1 to {MAX_EXTENTS} address and "
                                                          f"length pairs; got {len(flat)} numbers")
    addrs, lens = flat[0::2], flat[1::2]
    _check_rows(addrs, lens, "remote")
    return addrs, lens
