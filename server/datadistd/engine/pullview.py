"""Where a small pull's bytes land: a **published view** of one engine's local blocks caches, read without the loop.

The requester's small pull (the quick shape: ``links.transfer``, ``links.paths.StreamPath``) starts on a reactor
thread and ends on the data reader thread that reads the owner's reply: that thread copies the bytes into the
destination rows itself. It finds them by this view instead of the registry (the event loop's): built on the loop
(``publish``) at every change of the registry (``LinkTable.changed``), immutable once published, it maps each cache
id of a blocks cache whose every tensor is mapped writable memory in the daemon to its ``Dest``: per tensor the
memory's own view (the handle's ``view()`` object itself, no export of it: closing the handle releases it, and a
released view refuses every access) and the tensor's offset in it, the block size and the block count, and the
registry entry. HIXL's registrations are in it by worker address too (``regions``): where a small read of a few
extents lands, by the same rule.

Safety (the argument of ``readview``, on the other side): the reader thread copies under the engine's
``read_lock`` after checking that the view's generation is still the registry's (``landable``). The registry bumps
the generation on the loop at every change to its caches (an entry added or retired, ``clear``) before any memory
is freed, and the loop takes ``read_lock`` in ``Engine._free`` / ``close`` before memory goes back to its pool or
its handles close. So a copy that passed the check ends before the memory can be freed or reused, and one after
the bump sees a stale view and hands the reply to the loop, which looks the cache up again (gone: the pull fails as
a pull into a missing cache does). The reader never pins. Block numbers are range-checked against ``rows`` when
the pull starts; a row is ``row`` bytes at ``base + block * row`` of its tensor's view, inside the tensor's
segment (checked here once).

A small push reads its source rows by the same view (``links.paths._move_rows``, where it starts): under
``read_lock``, after the same generation check, into the WRITE frame it sends -- the bytes are copied before the
push is in flight, so a deallocate after that cannot reach them, and one before it left a stale view (republished:
the cache is gone, the general path refuses the push as one from a missing cache).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ..core.registry import CacheEntry
from ..memory.base import Segment
from .engine import Engine, memory_of, tensors_of
from .extents import Regions

__all__ = ["Dest", "PullView", "Pieces", "pieces", "publish"]


class Dest(NamedTuple):
    tensors: tuple[tuple[memoryview, int], ...]   # per tensor: its memory's view and the tensor's offset in it
    row: int                                      # bytes per tensor and block
    rows: int                                     # blocks
    entry: CacheEntry


class PullView(NamedTuple):
    generation: int
    caches: dict[int, Dest]   # cache id -> where its rows are (never mutated once published)
    #: HIXL's registrations by worker address (``engine.extents.Regions``), each item ``(view, offset, entry)``: the
    #: tensor's memory, mapped writable, and its offset in it -- where a small extents read lands
    regions: Regions


def _dest(entry: CacheEntry) -> Dest | None:
    desc = entry.desc
    row, rows = desc.row_size, desc.rows
    tensors = []
    for seg in tensors_of(entry):
        view = _writable(seg)
        if view is None or rows * row > seg.length:
            return None
        tensors.append((view, seg.offset))
    return Dest(tuple(tensors), row, rows, entry)


def _writable(seg: Segment) -> memoryview | None:
    """The memory of ``seg`` mapped writable here, as one flat view holding the segment; else None."""
    view = seg.handle.view()
    if (view is None or view.readonly or view.ndim != 1 or view.format != "B" or not view.contiguous
            or seg.offset < 0 or seg.offset + seg.length > len(view)):
        return None
    return view


def _regions(engine: Engine) -> Regions:
    rows: list[tuple[int, int, object]] = []
    for entry in engine.registry.entries():
        addrs = memory_of(entry).worker_addrs
        if not any(addrs):   # a cache the daemon allocated has no worker address
            continue
        for base, seg in zip(addrs, tensors_of(entry), strict=True):
            view = _writable(seg) if base else None
            if view is not None:
                rows.append((base, seg.length, (view, seg.offset, entry)))
    return Regions(rows)


#: where a small extents read lands: per extent ``(view, offset, length)`` of the local rows
Pieces = tuple[tuple[memoryview, int, int], ...]


def pieces(view: PullView, addrs: Sequence[int], lens: Sequence[int], whose: str) -> tuple[Pieces, CacheEntry]:
    """Where local extents ``lens[i]`` bytes at ``addrs[i]`` land by ``view``'s registrations, and the registration
    of the first; ``LLM_PARAM_INVALID`` naming the first extent no registration mapped here holds whole
    (``Regions.locate``)."""
    which, offsets = view.regions.locate(addrs, lens, whose)
    items = view.regions.items
    found = tuple((items[k][0], items[k][1] + off, n)
                  for k, off, n in zip(which, offsets, lens, strict=True))
    return found, items[which[0]][2]  # type: ignore[index]


def publish(engine: Engine) -> PullView:
    """``engine``'s view of its registry's generation now (the event loop only)."""
    registry = engine.registry
    caches: dict[int, Dest] = {}
    if not engine.closed:
        for entry in registry.entries():
            if entry.is_blocks:
                dest = _dest(entry)
                if dest is not None:
                    caches[int(entry.cache_id)] = dest
    return PullView(registry.generation, caches, _regions(engine) if not engine.closed else Regions(()))
