"""A peer's small read answered by the data reader thread that read it: no hop to the event loop.

The registry, its keys, pins and the pools are the event loop's (docs/daemon.md). A reader thread reads by a
**published read view** of one engine instead: built on the loop (``publish``), immutable once published (the
engine's ``read_view`` attribute is swapped whole), it maps each ``BlocksCacheKey`` model id to the bound,
remotely accessible blocks cache whose memory is mapped in the daemon -- its description and tensors -- and
records the registry's ``generation`` it was built at. The registry bumps the generation on the loop at every
change to what a peer may read (an entry added or retired, a key bound or unbound, ``clear``), never on
pin/unpin.

Safety: ``read_now`` holds the engine's ``read_lock`` from "the view's generation is the registry's" through
its copy; the loop takes the same lock in ``Engine._free`` (and ``close``) before any memory goes back to its
pool or its handles close, and it bumped the generation before (``CacheRegistry._retire`` / ``clear``). So a
reader that passed the check copies before the memory can be freed or reused (the loop waits microseconds in
``_free``), and a reader after the bump sees a stale view and hands the frame to the loop. The reader never
pins. Anything the view does not settle -- stale, unknown key, another key kind or mode, any refusal of
``layout.owner_spans`` -- is None: the loop answers it as before, with its exact status code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import DataDistError
from ..core.layout import owner_spans
from ..core.types import BlocksKeyRef, CacheDesc, KeyKind, ReadMode, RemoteSpec
from ..memory.base import Segment
from ..memory.copy import all_mapped, read_bytes
from .engine import Engine, segments_of, tensors_of

__all__ = ["ReadView", "publish", "current", "read_now"]

@dataclass(frozen=True)
class _Cache:
    cache_id: int
    desc: CacheDesc
    tensors: tuple[Segment, ...]


@dataclass(frozen=True)
class ReadView:
    generation: int
    blocks: dict[int, _Cache]   # BlocksCacheKey model id -> its cache (never mutated once published)


def publish(engine: Engine) -> ReadView:
    """Build and publish ``engine``'s view (the event loop only)."""
    registry = engine.registry
    blocks: dict[int, _Cache] = {}
    for entry in registry.entries():
        if not (entry.is_blocks and entry.remote_accessible):
            continue
        tensors = tensors_of(entry)
        if not all_mapped(tensors):
            continue
        for key in registry.keys_of(entry.cache_id):
            if key.kind == KeyKind.BLOCKS:
                blocks[key.model_id] = _Cache(int(entry.cache_id), entry.desc, tensors)
    view = ReadView(registry.generation, blocks)
    engine.read_view = view
    return view


def current(engine: Engine) -> bool:
    """Whether ``engine``'s published view is of its registry's generation (the event loop)."""
    view = engine.read_view
    return isinstance(view, ReadView) and view.generation == engine.registry.generation


def read_now(engine: Engine, spec: RemoteSpec, limit: int) -> bytes | None:
    """The bytes of ``spec`` (at most ``limit``) read by the published view from any thread, or None: the loop
    answers it (see the module docstring)."""
    view = engine.read_view
    key = spec.key
    if (not isinstance(view, ReadView) or engine.closed or not isinstance(key, BlocksKeyRef)
            or spec.mode != ReadMode.BLOCKS or key.cluster_id != engine.cluster_id or spec.expected_bytes > limit):
        return None
    cache = view.blocks.get(key.model_id)
    if cache is None:
        return None
    try:
        spans, _ = owner_spans(cache.desc, True, cache.cache_id, 0, spec, "src", engine.cluster_id)
    except DataDistError:
        return None
    src = segments_of(cache.tensors, spans)
    with engine.read_lock:
        if engine.closed or view.generation != engine.registry.generation:
            return None
        return read_bytes(src)
