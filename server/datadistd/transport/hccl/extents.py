"""Extents of an HCCL batch cut at registrations: HCCL wants each descriptor inside ONE buffer bound at Prepare, on
both sides (the simulation's rule R4), and extents merged because they were contiguous on both sides may span two.
Pure arithmetic (``HcclAgent._batch`` calls it)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["split_extents"]


def _bounds(ranges: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.array([b for b, _ in ranges], dtype=np.uint64)
    return starts, starts + np.array([n for _, n in ranges], dtype=np.uint64)


def _room(addr: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bytes from each address to the end of the range it lies in (ranges sorted, disjoint); 0 outside them."""
    if not len(starts):
        return np.zeros(len(addr), dtype=np.uint64)
    idx = np.searchsorted(starts, addr, side="right").astype(np.int64) - 1
    ok = idx >= 0
    safe = np.where(ok, idx, 0)
    inside = ok & (addr < ends[safe])
    return np.where(inside, ends[safe] - addr, np.uint64(0))


def split_extents(local: np.ndarray, remote: np.ndarray, mine: Sequence[tuple[int, int]],
                  theirs: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Paired extents ``(address, length)`` cut so that each lies inside ONE range of ``mine`` (local side) and one of
    ``theirs`` (remote side): extents merged because they were contiguous on both sides may span two registrations.
    Returns the extents and ``None``, or ``(…, why)`` naming the first extent outside every range of its side."""
    ls, le = _bounds(mine)
    rs, re_ = _bounds(theirs)
    la, ra, n = local[:, 0], remote[:, 0], local[:, 1]
    lroom, rroom = _room(la, ls, le), _room(ra, rs, re_)
    if not lroom.all() or not rroom.all():
        i = int(np.flatnonzero((lroom == 0) | (rroom == 0))[0])
        side = "local" if lroom[i] == 0 else "remote"
        return local, remote, f"extent {i} ({side} address {int((la if side == 'local' else ra)[i]):#x})"
    cross = np.flatnonzero((n > lroom) | (n > rroom))
    if not len(cross):
        return local, remote, None
    out_l: list[tuple[int, int]] = []
    out_r: list[tuple[int, int]] = []
    start = 0
    for i in cross.tolist():    # rare: extents merged across two registrations
        out_l.extend(map(tuple, local[start:i].tolist()))
        out_r.extend(map(tuple, remote[start:i].tolist()))
        a, b, left = int(la[i]), int(ra[i]), int(n[i])
        while left:
            lr = int(_room(np.array([a], np.uint64), ls, le)[0])
            rr = int(_room(np.array([b], np.uint64), rs, re_)[0])
            if not lr or not rr:
                return local, remote, f"extent {i} (continues past the {'local' if not lr else 'remote'} range)"
            step = min(left, lr, rr)
            out_l.append((a, step))
            out_r.append((b, step))
            a, b, left = a + step, b + step, left - step
        start = i + 1
    out_l.extend(map(tuple, local[start:].tolist()))
    out_r.extend(map(tuple, remote[start:].tolist()))
    return np.array(out_l, dtype=np.uint64), np.array(out_r, dtype=np.uint64), None
