"""A peer's small read of a blocks cache answered by the engine's **published read view**: from the data reader
thread that read the frame, with no hop to the event loop, or from the loop or an executor thread.

The registry, its keys, pins and the pools are the event loop's (docs/daemon.md). A reader thread reads by a
published read view of one engine instead: built on the loop (``publish``), immutable once published (the
engine's ``read_view`` attribute is swapped whole), it maps each ``BlocksCacheKey`` model id to the bound,
remotely accessible blocks cache -- its geometry, computed once here: per tensor a byte view of its memory when
the daemon maps it (else its handle and offset), the bytes per block, the number of blocks and of tensors -- and
records the registry's ``generation`` it was built at. The registry bumps the generation on the loop at every
change to what a peer may read (an entry added or retired, a key bound or unbound, ``clear``), never on
pin/unpin. So ``read`` resolves a few blocks by integer arithmetic, with no object per block, table or pin.

Safety: ``read`` holds the engine's ``read_lock`` from "this view is the engine's, of its registry's generation,
and the engine is open" until the last byte of the cache was copied or handed to the kernel (``send``: a
non-blocking ``sendmsg``; a frame the socket took only in part has its rest copied before the lock is let go,
``TcpChannel.try_control_parts``). The loop takes the same lock in ``Engine._free`` (and ``close``) before any
memory goes back to its pool or its handles close -- and there drops the published view and releases its byte
views (``ReadView.release``), so no view of freed memory outlives it -- and the registry bumped the generation
before (``CacheRegistry._retire`` / ``clear``). So a read that passed the check copies or sends before the memory
can be freed or reused (the loop waits in ``_free`` for one read of at most 64 KiB), and a read after the bump or
the drop sees a stale view and returns None. Nothing here pins. Anything the view does not settle -- no view or a
stale one, an unknown model id, a tensor or block out of range, a byte count that is not the request's, too many
pieces -- is None: the caller's general path answers it (``links/owner.Owner.read_small``, with ``prepare_read``'s
exact status code and message).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..core.errors import DataDistError
from ..core.types import EXTENTS_READ, KeyKind
from ..memory.base import MemoryHandle
from ..memory.imported import release_view
from ..memory.segments import byte_view
from .engine import Engine, memory_of, tensors_of
from .extents import Regions

__all__ = ["ReadView", "publish", "current", "read", "write", "SENT", "BUSY", "UNMAPPED", "WRITTEN", "MOST_PIECES"]

#: ``read`` with ``send``: the reply went out whole (or its rest copied and being finished); the connection was
#: busy or the socket took nothing (nothing sent, copy it); the memory is not mapped here (copy it in a thread)
SENT, BUSY, UNMAPPED = 1, 2, 3
#: ``write``: every byte is in the destination rows
WRITTEN = 4
#: the most pieces (tensors x blocks) ``read`` answers: more -- tiny blocks in a long list -- take the general path
MOST_PIECES = 256

#: ``send(parts, unlock)``: one frame of ``parts`` without blocking -- True when it went (or its rest was
#: copied), False when nothing went -- calling ``unlock`` exactly once as soon as the parts are no longer read
Send = Callable[[list, Callable[[], None]], bool]


class _Cache:
    """One published blocks cache: its geometry (``publish``)."""

    __slots__ = ("cache_id", "views", "handles", "offsets", "row", "rows", "tensors", "mapped", "writable")

    def __init__(self, cache_id: int, views: tuple[memoryview | None, ...], handles: tuple[MemoryHandle, ...],
                 offsets: tuple[int, ...], row: int, rows: int) -> None:
        self.cache_id = cache_id
        self.views = views          # per tensor: its bytes mapped here, or None
        self.handles = handles      # per tensor: its handle and the tensor's offset in it (unmapped reads)
        self.offsets = offsets
        self.row = row              # bytes per block and tensor
        self.rows = rows            # blocks per tensor
        self.tensors = len(views)
        self.mapped = all(v is not None for v in views)
        self.writable = all(v is not None and not v.readonly for v in views)   # ``write`` copies into the views


class ReadView:
    """What a peer may read of one engine at registry generation ``generation``, by ``BlocksCacheKey`` model id, and
    by worker address (``regions``: every tensor of a remotely accessible cache registered with its worker's
    address, HIXL's registrations; each item its bytes mapped here, or None) (never mutated once published)."""

    __slots__ = ("generation", "blocks", "regions")

    def __init__(self, generation: int, blocks: dict[int, _Cache], regions: Regions) -> None:
        self.generation = generation
        self.blocks = blocks
        self.regions = regions

    def release(self) -> None:
        """Release every byte view this view made (``Engine._free`` / ``close``, under ``read_lock``, before memory
        goes): nobody can read through them after, and a mapping they viewed can close at once."""
        for cache in self.blocks.values():
            for v in cache.views:
                if v is not None:
                    release_view(v)
        for item in self.regions.items:
            if isinstance(item, memoryview):
                release_view(item)


def _cache(cache_id: int, tensors: Sequence, row: int, rows: int) -> _Cache:
    views: list[memoryview | None] = []
    for seg in tensors:
        whole = byte_view(seg.handle, writable=True) or byte_view(seg.handle, writable=False)
        if whole is None:
            views.append(None)
            continue
        views.append(whole[seg.offset:seg.offset + seg.length])
        whole.release()
    return _Cache(cache_id, tuple(views), tuple(s.handle for s in tensors), tuple(s.offset for s in tensors), row,
                  rows)


def publish(engine: Engine) -> ReadView:
    """Build and publish ``engine``'s view (the event loop only); the one it replaces is released."""
    registry = engine.registry
    blocks: dict[int, _Cache] = {}
    for entry in registry.entries():
        if not (entry.is_blocks and entry.remote_accessible):
            continue
        models = [key.model_id for key in registry.keys_of(entry.cache_id) if key.kind == KeyKind.BLOCKS]
        if not models:
            continue
        desc = entry.desc
        try:
            cache = _cache(int(entry.cache_id), tensors_of(entry), desc.row_size, desc.rows)
        except DataDistError:   # a handle already closed: the general path answers (and refuses) its reads
            continue
        for model_id in models:
            blocks[model_id] = cache
    view = ReadView(registry.generation, blocks, _regions(engine))
    with engine.read_lock:   # a reader holding the old one sees it is no longer the engine's
        old, engine.read_view = engine.read_view, view
        if old is not None:
            old.release()
    return view


def _regions(engine: Engine) -> Regions:
    """The engine's remotely accessible tensors by worker address, each with its bytes mapped here (or None)."""
    rows: list[tuple[int, int, object]] = []
    for entry in engine.registry.entries():
        addrs = memory_of(entry).worker_addrs
        if not entry.remote_accessible or not any(addrs):   # a cache the daemon allocated has no worker address
            continue
        for base, seg in zip(addrs, tensors_of(entry), strict=True):
            if not base:
                continue
            try:
                whole = byte_view(seg.handle, writable=False)
            except DataDistError:   # a handle already closed: the general path answers (and refuses) its reads
                whole = None
            rows.append((base, seg.length, None if whole is None else _slice(whole, seg.offset, seg.length)))
    return Regions(rows)


def _slice(whole: memoryview, offset: int, length: int) -> memoryview:
    view = whole[offset:offset + length]
    whole.release()
    return view


def current(engine: Engine) -> bool:
    """Whether ``engine``'s published view is of its registry's generation (the event loop)."""
    view = engine.read_view
    return isinstance(view, ReadView) and view.generation == engine.registry.generation


def read(engine: Engine, model_id: int, tensor_start: int, tensor_count: int, blocks: Sequence[int], expected: int,
         send: Send | None = None, head: bytes = b"", unmapped: bool = False) -> int | bytes | None:
    """A small read of blocks cache ``model_id`` by the published view, from any thread: tensors
    ``[tensor_start, tensor_start + tensor_count)`` (count 0: every tensor), in each the rows ``blocks`` (non-negative
    ints, list order, repeats allowed), ``expected`` bytes in all (the caller bounds it: an inline read's).

    With ``send``: ``head`` and then views of the memory, straight from it, as one frame (``send``, the lock let go
    by it): ``SENT``, or ``BUSY`` (nothing sent), or ``UNMAPPED`` when a tensor is not mapped here. Without: the
    bytes, copied out -- of mapped memory, or also of unmapped memory (``unmapped``: a system call or device copy
    per block, for an executor thread), else ``UNMAPPED``. None: the view does not settle it (module docstring)."""
    if model_id == EXTENTS_READ:
        return _read_extents(engine, blocks, expected, send, head)
    settled = _settled(engine, model_id, tensor_start, tensor_count, blocks, expected)
    if settled is None:
        return None
    view, cache, count = settled
    row = cache.row
    if not (cache.mapped or (unmapped and send is None)):
        return UNMAPPED
    views = cache.views
    lock = engine.read_lock
    lock.acquire()
    held = True
    try:
        if engine.read_view is not view or view.generation != engine.registry.generation or engine.closed:
            return None
        if send is None:
            return _copy(cache, tensor_start, count, blocks, expected)
        parts: list = [head]
        for t in range(tensor_start, tensor_start + count):
            v = views[t]
            for b in blocks:
                a = b * row
                parts.append(v[a:a + row])  # type: ignore[index]
        held = False   # ``send`` lets it go, exactly once, whatever happens
        return SENT if send(parts, lock.release) else BUSY
    finally:
        if held:
            lock.release()


def _read_extents(engine: Engine, pairs: Sequence[int], expected: int, send: Send | None,
                  head: bytes) -> int | bytes | None:
    """``read`` of HIXL's extents (``pairs``: address, length, ...) by the view's ``regions``: each wholly inside one
    mapped registration (``engine.extents.Regions``, the owner's rule), ``expected`` their bytes, at most
    ``MOST_PIECES``; else None (the general path answers: ``Engine.prepare_read``)."""
    view: ReadView | None = engine.read_view  # type: ignore[assignment]
    addrs, lens = list(pairs[0::2]), list(pairs[1::2])
    if view is None or not 0 < len(lens) <= MOST_PIECES or 0 in addrs or 0 in lens or sum(lens) != expected:
        return None
    try:
        which, offsets = view.regions.locate(addrs, lens, "")
    except DataDistError:
        return None
    items = view.regions.items
    views = [items[k] for k in which]
    if any(v is None for v in views):
        return UNMAPPED if send is not None else None
    lock = engine.read_lock
    lock.acquire()
    held = True
    try:
        if engine.read_view is not view or view.generation != engine.registry.generation or engine.closed:
            return None
        parts = [v[o:o + n] for v, o, n in zip(views, offsets, lens, strict=True)]  # type: ignore[index]
        if send is None:
            return b"".join(parts)
        held = False   # ``send`` lets it go, exactly once, whatever happens
        return SENT if send([head, *parts], lock.release) else BUSY
    finally:
        if held:
            lock.release()


def _settled(engine: Engine, model_id: int, tensor_start: int, tensor_count: int, blocks: Sequence[int],
             expected: int) -> tuple[ReadView, _Cache, int] | None:
    """The published view, the cache ``model_id`` names in it and the tensor count, when every bound holds (the
    tensors, every block, ``expected`` the bytes those name, at most ``MOST_PIECES`` pieces); else None."""
    view: ReadView | None = engine.read_view  # type: ignore[assignment]
    if view is None:
        return None
    cache = view.blocks.get(model_id)
    if cache is None:
        return None
    count = tensor_count or cache.tensors
    rows = cache.rows
    if (tensor_start + count > cache.tensors or count * len(blocks) * cache.row != expected
            or count * len(blocks) > MOST_PIECES):
        return None
    for b in blocks:
        if b >= rows:
            return None
    return view, cache, count


def write(engine: Engine, model_id: int, tensor_start: int, tensor_count: int, blocks: Sequence[int],
          data: memoryview) -> int | None:
    """A peer's small push into blocks cache ``model_id`` by the published view, from any thread: ``data`` (every
    byte: the bytes the spec names, tensor by tensor, each tensor's rows in ``blocks`` order) copied into the rows
    under ``read_lock`` once the view is checked current -- the argument of ``read``: a deallocate takes that lock
    before memory goes, so no byte lands in memory another cache took. ``WRITTEN``; ``UNMAPPED`` (nothing written)
    when a tensor is not mapped writable here; None when the view does not settle it (the caller's general path:
    ``links/owner.Owner.write_small``, by ``prepare_write``). The view holds exactly the caches a peer may write:
    those ``prepare_write`` accepts by ``BlocksCacheKey`` (bound, remotely accessible, blocks) -- it checks the
    same as for a read (``core.layout.owner_spans``)."""
    settled = _settled(engine, model_id, tensor_start, tensor_count, blocks, len(data))
    if settled is None:
        return None
    view, cache, count = settled
    if not cache.writable:
        return UNMAPPED
    views, row, at = cache.views, cache.row, 0
    with engine.read_lock:
        if engine.read_view is not view or view.generation != engine.registry.generation or engine.closed:
            return None
        for t in range(tensor_start, tensor_start + count):
            v = views[t]
            for b in blocks:
                a = b * row
                v[a:a + row] = data[at:at + row]  # type: ignore[index]
                at += row
    return WRITTEN


def _copy(cache: _Cache, tensor_start: int, count: int, blocks: Sequence[int], expected: int) -> bytes:
    """Under ``read_lock``: the bytes of the blocks, tensor by tensor."""
    out = bytearray(expected)
    dst = memoryview(out)
    row, at = cache.row, 0
    for t in range(tensor_start, tensor_start + count):
        v, handle, base = cache.views[t], cache.handles[t], cache.offsets[t]
        for b in blocks:
            a = b * row
            if v is not None:
                dst[at:at + row] = v[a:a + row]
            else:
                handle.read_into(base + a, dst[at:at + row])
            at += row
    dst.release()
    return bytes(out)
