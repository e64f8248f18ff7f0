"""The link knows its memory: ``Published``, both halves over a ``ReadTables`` transport.

Owner: ``sync`` (the engine's ``watch``: run on the event loop by every registry change -- an allocation or
registration ends with it, and ``Engine._free`` runs it before any memory goes back to its pool) publishes every
cache the engine made remotely accessible, updates an entry whose keys changed, and withdraws one that went.
``ReadTables.withdraw`` returns once no link can read the memory (its registration is gone), so a cache's memory
is reused only after its entry was withdrawn. Only ``remote_accessible`` caches are ever published.

Requester: ``resolve`` names the owner's cache for a ``RemoteSpec`` by the table its owner published to the link --
the key looked up in an index rebuilt only when the table changed -- and checks the pull's bounds with the owner's
own rule (``layout.owner_spans``; a few blocks by int arithmetic, ``_few_blocks``, held to the same answers by
tests/unit/test_published_rows.py). A key the table does not hold is ``None``: the caller asks the owner once
(a ping: the owner's table entries go before its reply on the same channel) and then refuses as the owner would.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import DataDistError, StatusCode, require
from ..core.layout import BlockSpans, address_spans, owner_spans, total_length
from ..core.plan import AddrRef
from ..core.types import BlocksKeyRef, CacheId, CacheKeyRef, IdIndexRef, KeyKind, OwnerKey, ReadMode, RemoteSpec
from ..engine.engine import Engine, memory_of, tensors_of
from ..engine.extents import Regions, pairs_array
from ..transport.base import Channel, ReadTables
from .wire.tables import CacheInfo, decode_info, encode_info

__all__ = ["Published", "Resolved"]

log = logging.getLogger("datadistd.links")


@dataclass
class _Index:
    version: int = -1
    keys: dict[OwnerKey, tuple[int, int, CacheInfo]] = field(default_factory=dict)   # key -> handle, batch, info
    ids: dict[int, tuple[int, CacheInfo]] = field(default_factory=dict)               # cache id -> handle, info
    regions: Regions | None = None   # the tensors with a worker address, by address: (handle, tensor) each


@dataclass(frozen=True)
class Resolved:
    handle: int
    spans: np.ndarray     # (tensor, offset, length) rows
    nbytes: int
    release: bool         # a CacheKey pull: the owner consumes the key once told (the RELEASE call)
    #: HIXL extents (``ReadMode.EXTENTS``): one (handle, rows, which extents -- None: all) per registration read
    parts: tuple[tuple[int, np.ndarray, np.ndarray | None], ...] = ()


class Published:
    def __init__(self, engine: Engine, tables: ReadTables) -> None:
        self.engine = engine
        self.tables = tables
        self._generation = -1
        self._handles: dict[int, tuple[int, bytes]] = {}   # cache id -> (handle, info published)
        self._index: dict[bytes, _Index] = {}               # link token -> the index of its table

    # -- owner --

    def sync(self) -> None:
        registry = self.engine.registry
        if registry.generation == self._generation:
            return
        self._generation = registry.generation
        live = {int(entry.cache_id): entry for entry in registry.entries() if entry.remote_accessible}
        for cache_id in [c for c in self._handles if c not in live]:   # withdrawn first: before any memory is freed
            handle, _ = self._handles.pop(cache_id)
            self.tables.withdraw(handle)
        for cache_id, entry in live.items():
            info = encode_info(CacheInfo(cache_id, entry.is_blocks, entry.owned, entry.desc,
                                         registry.bound_keys(entry.cache_id), memory_of(entry).worker_addrs))
            known = self._handles.get(cache_id)
            if known is not None and known[1] == info:
                continue
            try:
                if known is None:
                    handle = self.tables.publish(tensors_of(entry), entry.desc.row_size, entry.desc.rows, info)
                else:
                    handle = known[0]
                    self.tables.update(handle, info)
            except DataDistError as exc:
                log.warning("engine %s: cache %s could not be published to its links: %s", self.engine.engine_id,
                            cache_id, exc)
                continue
            self._handles[cache_id] = (handle, info)

    # -- requester --

    def resolve(self, channel: Channel, token: bytes, remote_cluster: int, spec: RemoteSpec,
                asked: bool = False) -> Resolved | None:
        """The published cache ``spec`` names on ``channel``'s link and its spans, checked as the owner checks them
        (``owner_spans``: ``DataDistError`` with the owner's code); None when the table holds no such key -- unless
        the owner was ``asked`` already (its table changes are all in): then the owner's refusal."""
        if spec.mode == ReadMode.EXTENTS:
            return self._extents(self._current(channel, token), remote_cluster, spec, asked)
        found = self._resolve(channel, token, remote_cluster, spec)
        if found is None and asked:
            if isinstance(spec.key, AddrRef):
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"address {spec.key.addr:#x} is not inside a remotely accessible cache of cluster "
                                    f"{remote_cluster}")
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST,
                                f"cluster {remote_cluster} published no cache for {spec.key}")
        return found

    def _current(self, channel: Channel, token: bytes) -> _Index:
        """The index of the table published to ``channel``'s link, rebuilt when the table changed."""
        index = self._index.get(token)
        if index is None:
            index = self._index[token] = _Index()
        version, infos = self.tables.table_of(channel, index.version)
        if infos is not None:
            self._rebuild(index, version, infos)
        return index

    @staticmethod
    def _extents(index: _Index, remote_cluster: int, spec: RemoteSpec, asked: bool) -> Resolved | None:
        """HIXL extents by the owner's published registrations (``engine.extents.Regions``: each wholly inside
        one), grouped by the registration they read; None when one is outside them all and the owner was not
        ``asked`` yet -- then its refusal."""
        key = spec.key
        if not isinstance(key, AddrRef) or key.cluster_id != remote_cluster:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                f"an extents request names {key}; the link is to cluster {remote_cluster}")
        addrs, lens = pairs_array(spec.blocks)
        regions = index.regions or Regions(())
        try:
            which, offsets = regions.locate(addrs, lens, f"cluster {remote_cluster}")
        except DataDistError:
            if asked:
                raise
            return None
        items = np.array(regions.items, dtype=np.int64).reshape(-1, 2)   # (handle, tensor) of each region
        which_a = np.asarray(which, dtype=np.intp)
        handles = items[which_a, 0]
        rows = np.stack((items[which_a, 1], np.asarray(offsets, dtype=np.int64), np.asarray(lens, dtype=np.int64)),
                        axis=1)
        firsts = np.unique(handles, return_index=True)[1]
        order = [int(handles[i]) for i in sorted(firsts.tolist())]
        parts = tuple((h, rows, None) if len(order) == 1 else (h, rows[handles == h], handles == h) for h in order)
        nbytes = int(rows[:, 2].sum())
        require(nbytes == spec.expected_bytes,
                f"size mismatch: requester expects {spec.expected_bytes} bytes, its extents name {nbytes}")
        return Resolved(order[0], rows, nbytes, False, parts)

    def _resolve(self, channel: Channel, token: bytes, remote_cluster: int, spec: RemoteSpec) -> Resolved | None:
        index = self._current(channel, token)
        key = spec.key
        if key.cluster_id != remote_cluster:   # as the owner answers a request naming another cluster
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST,
                                f"the request names a cache of cluster {key.cluster_id}; the link is to cluster "
                                f"{remote_cluster}")
        owner_key: OwnerKey | None
        if isinstance(key, BlocksKeyRef):
            hit = index.keys.get(OwnerKey.blocks(key.model_id))
            if hit is None:
                return None
            handle, batch, info = hit
            owner_key = None
        elif isinstance(key, CacheKeyRef):
            owner_key = key.owner_key()
            hit = index.keys.get(owner_key) if owner_key is not None else None
            if hit is None:
                return None
            handle, batch, info = hit
        elif isinstance(key, IdIndexRef):
            by_id = index.ids.get(key.cache_id)
            if by_id is None:
                return None
            handle, info = by_id
            batch = key.batch_index
            if not (isinstance(batch, int) and 0 <= batch < info.desc.rows):
                raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST,
                                    f"batch_index {batch} out of range [0, {info.desc.rows}) of cache {key.cache_id}")
            owner_key = next((k for k, b in info.keys.items() if b == batch and k.kind != KeyKind.BLOCKS), None)
        else:
            assert isinstance(key, AddrRef)
            return self._by_address(index, key, spec, remote_cluster)
        rows = _few_blocks(info, spec)
        if rows is not None:
            return Resolved(handle, rows, spec.expected_bytes, False)   # a blocks cache: no key to release
        spans, _ = owner_spans(info.desc, info.is_blocks, CacheId(info.cache_id), batch, spec, "src", remote_cluster)
        rows = _span_rows(spans)   # every other request, and every refusal: the owner's own rule
        release = owner_key is not None and owner_key.kind == KeyKind.REQ and info.owned and not info.is_blocks
        return Resolved(handle, rows, int(rows[:, 2].sum()) if len(rows) else 0, release)

    @staticmethod
    def _by_address(index: _Index, key: AddrRef, spec: RemoteSpec, remote_cluster: int) -> Resolved | None:
        """A raw worker address, resolved as the owner's ``Engine.resolve_address`` does (only caches in the table:
        remotely accessible ones), its spans by ``layout.address_spans``."""
        for handle, info in index.ids.values():
            size = info.desc.tensor_size
            for tensor, base in enumerate(info.addrs):
                if base and base <= key.addr < base + size:
                    spans = address_spans(info.desc, info.cache_id, tensor, key.addr - base, spec)
                    got = total_length(spans)
                    require(spec.expected_bytes == got,
                            f"size mismatch: requester expects {spec.expected_bytes} bytes, address {key.addr:#x} "
                            f"of cluster {remote_cluster} has {got} bytes for that request")
                    rows = _span_rows(spans)
                    return Resolved(handle, rows, got, False)
        return None

    @staticmethod
    def _rebuild(index: _Index, version: int, infos: dict[int, bytes]) -> None:
        index.keys.clear()
        index.ids.clear()
        regions: list[tuple[int, int, object]] = []
        for handle, raw in infos.items():
            try:
                info = decode_info(raw)
            except ValueError as exc:
                log.warning("a published cache %d could not be read (%s): not pulled from", handle, exc)
                continue
            index.ids[info.cache_id] = (handle, info)
            regions += [(base, info.desc.tensor_size, (handle, tensor)) for tensor, base in enumerate(info.addrs)]
            for owner_key, batch in info.keys.items():
                index.keys[owner_key] = (handle, batch, info)
        index.regions = Regions(regions)
        index.version = version


_FEW_ROWS = 64   # rows of a blocks pull checked by int arithmetic (``_few_blocks``); more: ``owner_spans``


def _few_blocks(info: CacheInfo, spec: RemoteSpec) -> np.ndarray | None:
    """The ``(tensor, offset, length)`` rows of a pull of a few blocks of a blocks cache, by int arithmetic on its
    geometry, when every bound ``owner_spans`` checks holds (the tensor range, each block an int in range, the
    requester's byte count); None otherwise -- ``owner_spans`` then answers (with its code and message)."""
    desc, blocks = info.desc, spec.blocks
    start, rows, row = spec.tensor_start, desc.rows, desc.row_size
    count = spec.tensor_count or desc.num_tensors
    if (not info.is_blocks or spec.mode != ReadMode.BLOCKS or type(start) is not int or type(count) is not int
            or start < 0 or count <= 0 or start + count > desc.num_tensors or not blocks
            or count * len(blocks) > _FEW_ROWS or count * len(blocks) * row != spec.expected_bytes):
        return None
    for block in blocks:
        if type(block) is not int or not 0 <= block < rows:
            return None
    return np.array([(tensor, block * row, row) for tensor in range(start, start + count) for block in blocks],
                    dtype=np.int64)


def _span_rows(spans: object) -> np.ndarray:
    """``(tensor, offset, length)`` of each span, one row per block of a ``BlockSpans``."""
    if isinstance(spans, BlockSpans):
        blocks = np.asarray(spans.blocks, dtype=np.int64)
        tensors = np.asarray(spans.tensors, dtype=np.int64)
        out = np.empty((len(tensors) * len(blocks), 3), dtype=np.int64)
        out[:, 0] = np.repeat(tensors, len(blocks))
        out[:, 1] = np.tile(blocks * spans.row, len(tensors))
        out[:, 2] = spans.row
        return out
    assert isinstance(spans, (list, tuple))
    return np.array([(s.tensor, s.offset, s.length) for s in spans], dtype=np.int64).reshape(-1, 3)
