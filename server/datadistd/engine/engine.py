"""An engine: the daemon-side state of one initialized ``LLMDataDist`` (caches, keys, pools).

Local operations (allocate, register, copy, swap) and the *owner* side of transfers
(``prepare_read`` / ``prepare_write``: validate a peer's request and return the memory it
touches) live here. Linking and the requester side of transfers live in ``links/``.
Everything runs on the daemon's event-loop thread except the byte copies, which run in
worker threads on pinned caches. No grpc here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, cast

from ..core.errors import DataDistError, StatusCode, require
from ..core.layout import (
    Span,
    address_spans,
    block_copy_pairs,
    block_spans,
    describe_layout,
    owner_spans,
    slot_spans,
    swap_pairs,
    total_length,
)
from ..core.options import EngineOptions
from ..core.plan import AddrRef
from ..core.registry import CacheEntry, CacheRegistry, not_remotely_accessible
from ..core.types import (
    BlocksKeyRef,
    CacheDesc,
    CacheId,
    CacheKeyRef,
    ClusterId,
    EngineId,
    IdIndexRef,
    KeyKind,
    OwnerKey,
    Placement,
    ReadMode,
    RemoteSpec,
)
from ..guard.executor import Gate, Lane
from ..memory.base import Allocation, MemoryBackend, MemoryHandle, Pool, Segment
from ..memory.copy import copy_segments
from ..memory.segments import SegmentTable, segments_of
from .extents import AddressIndex, pairs_array
from .notifies import Notifies

__all__ = ["Engine", "CacheMemory", "Operand", "MAX_REGISTERED_ADDRS"]

log = logging.getLogger(__name__)

#: CANN: total addresses over all registrations of one engine
MAX_REGISTERED_ADDRS = 240


@dataclass
class CacheMemory:
    """Where a cache's tensors live: one whole-tensor segment per tensor."""

    tensors: tuple[Segment, ...]
    exports: tuple[tuple[str, int], ...] = ()       # (pool id, file_offset) per tensor, daemon-owned only
    allocation: Allocation | None = None
    pool: Pool | None = None
    handles: tuple[MemoryHandle, ...] = ()           # imported worker memory to close
    worker_addrs: tuple[int, ...] = ()               # where the owning worker sees each tensor (raw addressing)

    def release(self) -> None:
        if self.allocation is not None and self.pool is not None:
            self.pool.free(self.allocation)
            self.allocation = None
        for handle in self.handles:
            handle.close()
        self.handles = ()


@dataclass(frozen=True)
class Operand:
    """A cache as the operand of a local copy: a registry entry, or a transient CPU cache."""

    desc: CacheDesc
    tensors: tuple[Segment, ...]
    is_blocks: bool
    cache_id: int = -1
    handles: tuple[MemoryHandle, ...] = field(default=())


def _operand(op: "Operand | CacheEntry", role: str) -> str:
    """``"the source cache 3 has 8 tensors (block shape [...] of DT_FLOAT16, ...)"`` for a mismatch message."""
    name = f"the {role} cache {op.cache_id}" if op.cache_id >= 0 else f"the {role} CPU cache"
    return f"{name} has {op.desc.num_tensors} tensors ({describe_layout(op.desc, op.is_blocks)})"


def memory_of(entry: CacheEntry) -> CacheMemory:
    """A registry entry's memory (the registry keeps it opaque; the engine stores a ``CacheMemory``)."""
    return cast(CacheMemory, entry.memory)


def tensors_of(entry: CacheEntry) -> tuple[Segment, ...]:
    """The whole-tensor segments of a registry entry (its opaque ``memory`` is a ``CacheMemory`` here)."""
    memory = entry.memory
    assert isinstance(memory, CacheMemory)
    return memory.tensors


class PublishedView(Protocol):
    """An engine's published read view (``engine.readview.ReadView``), as ``Engine._free`` needs it."""

    generation: int                  # the registry's generation it was built at

    def release(self) -> None: ...   # its byte views of the engine's memory (under ``read_lock``)


class Engine:
    def __init__(self, engine_id: EngineId, options: EngineOptions, backend: MemoryBackend,
                 pools: dict[Placement, Pool], lane: Lane) -> None:
        self.engine_id = engine_id
        self.options = options
        self.cluster_id = ClusterId(options.cluster_id)
        self.role = options.role
        self.backend = backend
        self.pools = pools
        self.registry = CacheRegistry()
        self.registered_addrs = 0
        self.linked_once = False   # remote_accessible defaults to False after the first comm-domain link
        self.closed = False
        self.lane = lane            # its worker's share of the daemon's threads
        self.gate = Gate()          # every job on this engine's memory in a worker thread, links' included
        # peers' small reads answered from a data reader thread (``readview``): the view they read by, and the
        # lock they hold from checking it through their copy; ``_free`` and ``close`` take it before memory goes
        self.read_view: PublishedView | None = None   # ``engine.readview`` (published by the event loop)
        #: run (the event loop) after every change of the registry and before any memory is freed: the link
        #: table's ``changed`` -- what peers read is published anew (``readview``, ``Published.sync`` over a
        #: transport that reads tables: a withdrawn cache is unreadable before its memory can be reused), and
        #: the local rows the engine's own transfers land in (``pullview``)
        self.watch: Callable[[], None] | None = None
        self.read_lock = threading.Lock()
        self.notifies = Notifies()   # HIXL notifies other engines sent this one (``SendNotify``)
        self._indexes: dict[bool, tuple[int, AddressIndex]] = {}   # remote? -> (generation, registrations)
        self._groups: dict[int, tuple[CacheId, ...]] = {}   # ``pin_many``'s ids (negative) -> the caches pinned
        self._next_group = -2   # -1 names no cache (``Operand``)

    # ---- helpers -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise DataDistError(StatusCode.LLM_ENGINE_FINALIZED, f"engine {self.engine_id} is finalized")

    def _free(self, entries: Sequence[CacheEntry]) -> None:
        if self.watch is not None:   # every path that changes what a peer may read ends here or in ``watch``
            self.watch()
        if not entries:
            return
        with self.read_lock:   # a reader thread that passed the view check copies first (``readview``)
            view = self.read_view
            if view is not None and view.generation != self.registry.generation:
                self._drop_read_view()   # not republished by ``watch`` (an engine with no links): it may view them
            for entry in entries:
                memory = memory_of(entry)
                memory.release()
        for entry in entries:
            log.debug("engine %s freed cache %s (%d bytes)", self.engine_id, entry.cache_id, entry.desc.total_size)

    def _drop_read_view(self) -> None:
        """Under ``read_lock``, before memory goes: the published read view is dropped and its byte views released
        (``readview``): no reader reaches freed memory through it, and a mapping it viewed can close at once."""
        view, self.read_view = self.read_view, None
        if view is not None:
            view.release()

    def entry(self, cache_id: int) -> CacheEntry:
        self._check_open()
        return self.registry.get(CacheId(cache_id))

    @staticmethod
    def _owner_keys(keys: Sequence[CacheKeyRef]) -> list[OwnerKey | None]:
        return [OwnerKey.from_cache_key(k.req_id, k.prefix_id, k.model_id) for k in keys]

    # ---- cache memory ------------------------------------------------------------------------

    def allocate_cache(self, desc: CacheDesc, *, is_blocks: bool, keys: Sequence[CacheKeyRef] = (),
                       blocks_key: BlocksKeyRef | None = None) -> CacheEntry:
        self._check_open()
        pool = self.pools.get(desc.placement)
        if pool is None:
            option = "mem_pool_cfg" if desc.placement == Placement.DEVICE else "host_mem_pool_cfg"
            raise DataDistError(StatusCode.LLM_FEATURE_NOT_ENABLED,
                                f"no {desc.placement.name} memory pool: set LLMConfig.{option} to allocate "
                                f"{desc.placement.name} caches")
        owner_keys = self._owner_keys(keys)
        if is_blocks:
            require(not keys, "a blocks cache takes a BlocksCacheKey, not CacheKeys")
            if blocks_key is not None:
                self._check_blocks_key_free(blocks_key.model_id)
        else:
            require(blocks_key is None, "a contiguous cache takes CacheKeys, not a BlocksCacheKey")
            self.registry.check_allocate_keys(desc, owner_keys)
        try:
            allocation = pool.allocate(desc.total_size)
        except DataDistError as exc:
            if exc.code == StatusCode.LLM_OUT_OF_MEMORY and not self.options.cache_manager:
                # v1 (KvCacheManager mode) reports a full engine pool as LLM_DEVICE_OUT_OF_MEMORY
                raise DataDistError(StatusCode.LLM_DEVICE_OUT_OF_MEMORY, exc.message) from None
            raise
        size = desc.tensor_size
        tensors = tuple(Segment(allocation.handle, i * size, size) for i in range(desc.num_tensors))
        exports = tuple((allocation.pool, allocation.file_offset + i * size) for i in range(desc.num_tensors))
        memory = CacheMemory(tensors, exports, allocation, pool)
        entry = self.registry.add(desc, is_blocks=is_blocks, owned=True, remote_accessible=True, memory=memory)
        if is_blocks and blocks_key is not None:
            self.registry.bind_blocks_key(entry.cache_id, blocks_key.model_id, overwrite=False)
        elif owner_keys:
            self.registry.bind_keys(entry.cache_id, owner_keys)
        log.info("engine %s cluster %s allocated %s cache %s: %d x %s %s (%d bytes)", self.engine_id,
                 self.cluster_id, "blocks" if is_blocks else "contiguous", entry.cache_id, desc.num_tensors,
                 list(desc.shape), desc.dtype.name, desc.total_size)
        if self.watch is not None:
            self.watch()
        return entry

    def _check_blocks_key_free(self, model_id: int) -> None:
        try:
            self.registry.lookup(OwnerKey.blocks(model_id))
        except DataDistError:
            return
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"BlocksCacheKey model_id={model_id} is already bound")

    def pool_named(self, name: str) -> Pool:
        """One of this engine's pools by its id (what a worker asks for to map an allocated cache)."""
        for pool in self.pools.values():
            if pool.name == name:
                return pool
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"engine {self.engine_id} has no pool {name!r}")

    def register_cache(self, desc: CacheDesc, *, is_blocks: bool, handles: Sequence[MemoryHandle],
                       keys: Sequence[CacheKeyRef] = (), blocks_key: BlocksKeyRef | None = None,
                       remote_accessible: bool | None = None, worker_addrs: Sequence[int] = ()) -> CacheEntry:
        """Register worker memory the worker handed over (``handles``: the engine owns them from now on,
        closes them when the cache goes, or at once when registration fails)."""
        try:
            return self._register(desc, is_blocks, handles, keys, blocks_key, remote_accessible, worker_addrs)
        except BaseException:
            for handle in handles:
                handle.close()
            raise

    def _register(self, desc: CacheDesc, is_blocks: bool, handles: Sequence[MemoryHandle],
                  keys: Sequence[CacheKeyRef], blocks_key: BlocksKeyRef | None, remote_accessible: bool | None,
                  worker_addrs: Sequence[int]) -> CacheEntry:
        self._check_open()
        require(not worker_addrs or len(worker_addrs) == len(handles),
                f"worker_addrs has {len(worker_addrs)} entries for {len(handles)} tensors")
        require(len(handles) == desc.num_tensors,
                f"register needs one address per tensor: {len(handles)} addresses for num_tensors={desc.num_tensors}")
        require(self.registered_addrs + len(handles) <= MAX_REGISTERED_ADDRS,
                f"at most {MAX_REGISTERED_ADDRS} addresses may be registered per engine "
                f"({self.registered_addrs} already, {len(handles)} more asked)")
        if remote_accessible is None:
            remote_accessible = desc.placement == Placement.DEVICE and not self.linked_once
        elif remote_accessible and self.linked_once:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                "remote_accessible=True is not allowed after link(); register before linking")
        for handle in handles:
            require(handle.size >= desc.tensor_size,
                    f"registered memory of {handle.size} bytes is smaller than one tensor ({desc.tensor_size} bytes)")
        tensors = tuple(Segment(h, 0, desc.tensor_size) for h in handles)
        if not worker_addrs:
            worker_addrs = [0] * len(handles)
        memory = CacheMemory(tensors, handles=tuple(handles), worker_addrs=tuple(int(a) for a in worker_addrs))
        entry = self.registry.add(desc, is_blocks=is_blocks, owned=False, remote_accessible=remote_accessible,
                                  memory=memory)
        self.registered_addrs += len(handles)
        if is_blocks and blocks_key is not None:
            self.registry.bind_blocks_key(entry.cache_id, blocks_key.model_id, overwrite=True)
        elif not is_blocks and keys:
            require(len(keys) <= desc.rows, f"{len(keys)} cache keys for batch size {desc.rows}")
            self.registry.bind_keys(entry.cache_id, self._owner_keys(keys))
        log.info("engine %s cluster %s registered %s cache %s: %d x %s %s remote_accessible=%s", self.engine_id,
                 self.cluster_id, "blocks" if is_blocks else "contiguous", entry.cache_id, desc.num_tensors,
                 list(desc.shape), desc.dtype.name, remote_accessible)
        if self.watch is not None:
            self.watch()
        return entry

    def deallocate_cache(self, cache_id: int, *, is_blocks: bool) -> None:
        self._check_open()
        entry = self.registry.find(CacheId(cache_id))
        if entry is None:
            return
        if is_blocks:
            require(entry.is_blocks, f"cache {cache_id} is not a blocks cache; use deallocate_cache")
            if entry.owned:
                self._free(self.registry.remove_cache(entry.cache_id))
            return
        require(not entry.is_blocks, f"cache {cache_id} is a blocks cache; use deallocate_blocks_cache")
        self._free(self.registry.release_id(entry.cache_id))

    def unregister_cache(self, cache_id: int) -> None:
        self._check_open()
        entry = self.registry.find(CacheId(cache_id))
        if entry is None:
            return
        require(not entry.owned, f"cache {cache_id} was allocated, not registered; deallocate it instead")
        self.registered_addrs -= entry.desc.num_tensors
        self._free(self.registry.remove_cache(entry.cache_id))

    def remove_cache_key(self, key: CacheKeyRef) -> None:
        self._check_open()
        owner_key = OwnerKey.from_cache_key(key.req_id, key.prefix_id, key.model_id)
        if owner_key is not None:
            self._free(self.registry.remove_key(owner_key))

    def set_worker_addrs(self, cache_id: int, addrs: Sequence[int]) -> None:
        """Where the owning worker mapped a cache's tensors, so peers may name them by raw address."""
        entry = self.entry(cache_id)
        require(len(addrs) == entry.desc.num_tensors,
                f"cache {cache_id} has {entry.desc.num_tensors} tensors, got {len(addrs)} addresses")
        memory_of(entry).worker_addrs = tuple(int(a) for a in addrs)
        self.registry.generation += 1   # what a peer may name changed: its raw addresses
        if self.watch is not None:
            self.watch()

    def resolve_address(self, addr: int) -> tuple[CacheEntry, int, int]:
        """A raw worker address -> (cache, tensor index, byte offset); others are refused (LLM_PARAM_INVALID)."""
        self._check_open()
        for entry in self.registry.entries():
            size = entry.desc.tensor_size
            for tensor, base in enumerate(memory_of(entry).worker_addrs):
                if base and base <= addr < base + size:
                    if not entry.remote_accessible:
                        break
                    return entry, tensor, addr - base
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"address {addr:#x} is not inside a remotely accessible cache of cluster {self.cluster_id}")

    def _address_spans(self, spec: RemoteSpec) -> tuple[CacheEntry, list[Span]]:
        entry, tensor, offset = self.resolve_address(spec.key.addr)  # type: ignore[union-attr]
        return entry, address_spans(entry.desc, entry.cache_id, tensor, offset, spec)

    # ---- local copies --------------------------------------------------------------------------

    def operand(self, cache_id: int) -> Operand:
        entry = self.entry(cache_id)
        return Operand(entry.desc, memory_of(entry).tensors, entry.is_blocks, entry.cache_id)

    async def _copy_pinned(self, cache_ids: Sequence[int], dst: Sequence[Segment], src: Sequence[Segment]) -> int:
        pinned = [self.registry.pin(CacheId(c)) for c in cache_ids if c >= 0]
        try:
            return await self.gate.run(self.lane, copy_segments, dst, src)
        finally:
            for entry in pinned:
                self.unpin(entry.cache_id)

    async def drain(self, timeout: float) -> bool:
        """Wait (bounded) until no job runs on this engine's memory; call before ``close``."""
        if await self.gate.drained(timeout):
            return True
        log.warning("engine %s: %d jobs still running after %.1fs; freeing anyway", self.engine_id,
                    self.gate.busy, timeout)
        return False

    async def copy_cache(self, dst_id: int, src_id: int, dst_batch: int, src_batch: int, offset: int,
                         size: int) -> int:
        dst, src = self.entry(dst_id), self.entry(src_id)
        require(not dst.is_blocks and not src.is_blocks, "copy_cache works on contiguous caches only")
        require(dst.desc.num_tensors == src.desc.num_tensors,
                f"copy_cache: tensor counts differ: {_operand(src, 'source')}, {_operand(dst, 'destination')}; "
                "copy between caches of the same CacheDesc num_tensors")
        stride = min(dst.desc.row_size, src.desc.row_size)
        require(0 <= offset < stride, f"offset {offset} outside the batch stride {stride}")
        nbytes = stride - offset if size == -1 else size
        require(size == -1 or 0 < size <= stride - offset, f"size {size} must be -1 or in (0, {stride - offset}]")
        indices = range(dst.desc.num_tensors)
        dst_spans = slot_spans(dst.desc, indices, dst_batch, nbytes, offset)
        src_spans = slot_spans(src.desc, indices, src_batch, nbytes, offset)
        return await self._copy_pinned([dst_id, src_id], segments_of(memory_of(dst).tensors, dst_spans),
                                       segments_of(memory_of(src).tensors, src_spans))

    async def copy_blocks(self, cache_id: int, copies: dict[int, list[int]]) -> int:
        entry = self.entry(cache_id)
        require(entry.is_blocks, f"copy_blocks needs a blocks cache; cache {cache_id} is contiguous")
        pairs = block_copy_pairs(copies, entry.desc.rows)
        indices = range(entry.desc.num_tensors)
        src_blocks = [s for s, _ in pairs]
        dst_blocks = [d for _, d in pairs]
        src = segments_of(memory_of(entry).tensors, block_spans(entry.desc, indices, src_blocks, "src"))
        dst = segments_of(memory_of(entry).tensors, block_spans(entry.desc, indices, dst_blocks, "dst"))
        return await self._copy_pinned([cache_id], dst, src)

    async def swap_blocks(self, src: Operand, dst: Operand, src_to_dst: dict[int, int]) -> int:
        require(src.is_blocks and dst.is_blocks, "swap_blocks needs two blocks caches")
        require({src.desc.placement, dst.desc.placement} == {Placement.HOST, Placement.DEVICE},
                f"swap_blocks copies between HOST and DEVICE; got {src.desc.placement.name} -> "
                f"{dst.desc.placement.name}")
        if src.desc.num_tensors != dst.desc.num_tensors or src.desc.row_size != dst.desc.row_size:
            what = "tensor counts" if src.desc.num_tensors != dst.desc.num_tensors else "block sizes"
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"swap_blocks: {what} differ: {_operand(src, 'source')}, {_operand(dst, 'destination')}"
                                "; swap between caches of the same CacheDesc num_tensors and block size (shape[1:] "
                                "and data_type)")
        pairs = swap_pairs(src_to_dst, src.desc.rows, dst.desc.rows)
        indices = range(src.desc.num_tensors)
        src_segs = segments_of(src.tensors, block_spans(src.desc, indices, [s for s, _ in pairs], "src"))
        dst_segs = segments_of(dst.tensors, block_spans(dst.desc, indices, [d for _, d in pairs], "dst"))
        return await self._copy_pinned([src.cache_id, dst.cache_id], dst_segs, src_segs)

    # ---- owner side of transfers ---------------------------------------------------------------

    def _resolve(self, spec: RemoteSpec) -> tuple[CacheEntry, int, OwnerKey | None]:
        """The cache a peer names, its batch index and the key to consume after a pull (if any)."""
        key = spec.key
        if isinstance(key, BlocksKeyRef):
            entry, _ = self.registry.lookup(OwnerKey.blocks(key.model_id))
            return entry, 0, None
        if isinstance(key, CacheKeyRef):
            owner_key = key.owner_key()
            entry, batch = self.registry.lookup(owner_key)
            return entry, batch, owner_key
        assert isinstance(key, IdIndexRef)
        entry, by_id = self.registry.lookup_by_id(CacheId(key.cache_id), key.batch_index)
        return entry, key.batch_index, by_id

    def _owner_spans(self, spec: RemoteSpec, side: str
                     ) -> tuple[CacheEntry, Sequence[Span], OwnerKey | None, list[int]]:
        self._check_open()
        if spec.key.cluster_id != self.cluster_id:  # every legitimate request names its owner's cluster
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST,
                                f"the request names a cache of cluster {spec.key.cluster_id}; this is cluster "
                                f"{self.cluster_id}")
        spans: Sequence[Span]
        if isinstance(spec.key, AddrRef):
            entry, spans = self._address_spans(spec)
            got = total_length(spans)
            require(spec.expected_bytes == got,
                    f"size mismatch: requester expects {spec.expected_bytes} bytes, address {spec.key.addr:#x} "
                    f"of cluster {self.cluster_id} has {got} bytes for that request")
            return entry, spans, None, sorted({s.tensor for s in spans})
        entry, batch, owner_key = self._resolve(spec)
        if not entry.remote_accessible:
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST, not_remotely_accessible(entry, self.cluster_id))
        spans, indices = owner_spans(entry.desc, entry.is_blocks, entry.cache_id, batch, spec, side, self.cluster_id)
        return entry, spans, owner_key, indices

    def address_index(self, remote: bool) -> AddressIndex:
        """This engine's registrations by address (``engine.extents``): every tensor of a cache registered with a
        worker address -- for a peer (``remote``) the remotely accessible ones only -- built once per registry
        generation (``LLM_ENGINE_FINALIZED`` once closed)."""
        self._check_open()
        generation = self.registry.generation
        cached = self._indexes.get(remote)
        if cached is not None and cached[0] == generation:
            return cached[1]
        index = AddressIndex((base, entry.desc.tensor_size, entry, seg) for entry in self.registry.entries()
                             if (entry.remote_accessible or not remote) and any(memory_of(entry).worker_addrs)
                             for base, seg in zip(memory_of(entry).worker_addrs, memory_of(entry).tensors, strict=True))
        self._indexes[remote] = (generation, index)
        return index

    def _pin_extents(self, spec: RemoteSpec) -> tuple[int, tuple[Segment, ...], Sequence[Span] | SegmentTable, bool]:
        """``pin`` of a peer's ``ReadMode.EXTENTS`` request: each extent resolved against this engine's remotely
        accessible registrations (``AddressIndex.resolve``: every one wholly inside one, or the whole request is
        refused naming the first that is not), its segments as the spans (``segments_of`` passes them through)."""
        self._check_open()
        key = spec.key
        if not isinstance(key, AddrRef) or key.cluster_id != self.cluster_id:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"an extents request names {key}; this is cluster {self.cluster_id}")
        addrs, lens = pairs_array(spec.blocks)
        found = self.address_index(remote=True).resolve(addrs, lens, f"cluster {self.cluster_id}")
        require(found.nbytes == spec.expected_bytes,
                f"size mismatch: requester expects {spec.expected_bytes} bytes, its extents name {found.nbytes}")
        return self.pin_many(found.entries), (), SegmentTable.of(found.segments), False

    def pin_many(self, entries: Sequence[CacheEntry]) -> int:
        """Pin ``entries`` as one (a HIXL transfer's extents may touch several registrations): the id ``unpin``
        takes -- the cache's own for one, a negative group id (never a cache id) for more."""
        for entry in entries:
            self.registry.pin(entry.cache_id)
        if len(entries) == 1:
            return int(entries[0].cache_id)
        group = self._next_group
        self._next_group -= 1
        self._groups[group] = tuple(e.cache_id for e in entries)
        return group

    def prepare_read(self, spec: RemoteSpec) -> tuple[int, Sequence[Segment], bool]:
        """Validate a peer's read; pin the cache. Returns (cache_id, segments, release_needed)."""
        cache_id, tensors, spans, release = self.pin(spec, "src")   # a pull reads the source
        return cache_id, segments_of(tensors, spans), release

    def prepare_write(self, spec: RemoteSpec) -> tuple[int, Sequence[Segment]]:
        """Validate a peer's write (push); pin the cache. Returns (cache_id, segments)."""
        cache_id, tensors, spans, _ = self.pin(spec, "dst")   # a push writes the destination
        return cache_id, segments_of(tensors, spans)

    def pin(self, spec: RemoteSpec, side: str) -> tuple[int, tuple[Segment, ...], Sequence[Span] | SegmentTable, bool]:
        """``prepare_read`` (``side`` "src") or ``prepare_write`` ("dst") but the segments: (cache_id, tensors, spans,
        release_needed). ``segments_of`` grows with the blocks (2^20: tens of ms): ``links.owner`` runs it off the
        loop for a long list."""
        if spec.mode == ReadMode.EXTENTS:
            return self._pin_extents(spec)
        entry, spans, key, _ = self._owner_spans(spec, side)
        release = side == "src" and key is not None and key.kind == KeyKind.REQ and entry.owned and not entry.is_blocks
        self.registry.pin(entry.cache_id)
        return entry.cache_id, memory_of(entry).tensors, spans, release

    def unpin(self, cache_id: int) -> None:
        """The end of a ``pin`` (``prepare_read``/``prepare_write``) or ``pin_many``: by the id it gave."""
        if self.closed:
            return
        group = self._groups.pop(cache_id, None) if cache_id < -1 else None
        if group is None:
            self._free(self.registry.unpin(CacheId(cache_id)))
            return
        freed: list[CacheEntry] = []
        for one in group:
            freed += self.registry.unpin(one)
        self._free(freed)

    def release_pulled(self, spec_key: CacheKeyRef | IdIndexRef, tensor_start: int, tensor_count: int) -> None:
        """A requester confirmed a pull: consume the key once all tensors were pulled (docs/spec.md §10.2)."""
        self._check_open()
        owner_key: OwnerKey | None
        if isinstance(spec_key, CacheKeyRef):
            owner_key = spec_key.owner_key()
            entry, _ = self.registry.lookup(owner_key)
        else:
            entry, owner_key = self.registry.lookup_by_id(CacheId(spec_key.cache_id), spec_key.batch_index)
        if owner_key is None:
            return
        count = tensor_count or entry.desc.num_tensors
        self._free(self.registry.consume_pulled(owner_key, range(tensor_start, tensor_start + count)))

    # ---- life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free every cache and pool of this engine (finalize, or the worker died)."""
        if self.closed:
            return
        self.closed = True
        self._free(self.registry.clear())
        with self.read_lock:
            self._drop_read_view()
            for pool in self.pools.values():
                pool.close()
        self.pools = {}

    def pool_usage(self) -> list[tuple[Placement, int, int]]:
        return [(p, pool.capacity, pool.used) for p, pool in self.pools.items()]

