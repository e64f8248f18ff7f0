"""The cache registry of one engine: cache ids, key tables and the references that keep memory alive.

Spec §7 and §10.2 in one place:

* cache ids count from 1 per registry (CANN's process-local counter; clients hard-code ``1``);
* contiguous caches are indexed by ``(req_id | prefix_id, model_id)`` -> ``(cache_id, batch)``;
  a blocks cache by ``(UINT64_MAX, model_id)``, so one blocks key per ``model_id``;
* the allocate path checks keys (``check_allocate_keys``), the register path does not: a
  contiguous key keeps its first binding, a blocks key is re-pointed to the newest cache;
* an *owned* (allocated) contiguous cache lives while any of these references remains: its
  cache id (dropped by ``deallocate_cache``), one of its keys (dropped by ``remove_cache_key``
  or consumed by a successful remote pull of a REQ key), an in-flight transfer (a pin);
* registered caches and blocks caches live until ``unregister_cache`` /
  ``deallocate_blocks_cache`` (``remove_cache``), and then until their last pin goes.

"Freed" means the entry leaves the registry and is returned, exactly once, in the list some
method returns; the caller then gives its memory back. An entry is never returned while
pinned, except by ``clear`` (engine finalize). Not thread-safe: the caller serializes calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import DataDistError, StatusCode, require
from .types import CacheDesc, CacheId, KeyKind, OwnerKey, Placement

__all__ = ["CacheEntry", "CacheRegistry", "describe_key", "not_remotely_accessible"]


@dataclass(eq=False)
class CacheEntry:
    """One cache of an engine. Compared by identity: two entries are never the same cache."""

    cache_id: CacheId
    desc: CacheDesc
    is_blocks: bool
    owned: bool                 # allocated from the daemon pool; False = registered worker memory
    remote_accessible: bool
    memory: object              # opaque payload: the engine keeps its memory handles here
    id_held: bool = True        # the cache-id reference (dropped by deallocate / remove_cache)
    pins: int = 0               # in-flight transfers


def describe_key(key: OwnerKey) -> str:
    if key.kind == KeyKind.BLOCKS:
        return f"BlocksCacheKey(model_id={key.model_id})"
    name = "req_id" if key.kind == KeyKind.REQ else "prefix_id"
    return f"CacheKey({name}={key.ident}, model_id={key.model_id})"


def not_remotely_accessible(entry: CacheEntry, cluster: int) -> str:
    """The owner's refusal of a peer's pull or push of ``entry``: why it is not remotely accessible, and the fix
    (remote_accessible's defaults, docs/spec.md ``register_cache``)."""
    why = ("a HOST cache is not by default" if entry.desc.placement == Placement.HOST else
           "it was registered with remote_accessible=False, or after link() (then False by default)")
    return (f"cache {entry.cache_id} of cluster {cluster} is not remotely accessible: {why}; its owner registers it "
            f"with remote_accessible=True, before linking")


class CacheRegistry:
    """Caches, keys and reference counts of one engine (see the module docstring for the rules)."""

    def __init__(self) -> None:
        self._next_id = 1
        self._live: dict[CacheId, CacheEntry] = {}
        self._draining: dict[CacheId, CacheEntry] = {}      # no longer addressable, waiting for pins
        self._keys: dict[OwnerKey, tuple[CacheId, int]] = {}  # key -> (cache id, batch index)
        self._cache_keys: dict[CacheId, dict[OwnerKey, int]] = {}  # cache id -> its keys -> batch index
        self._slot_keys: dict[CacheId, dict[int, OwnerKey]] = {}   # contiguous: batch index -> key
        self._pulled: dict[OwnerKey, set[int]] = {}          # REQ key -> tensor indices pulled so far
        self._bytes_owned = 0
        #: bumped by every change to what a peer may read (an entry added or retired, a key bound or unbound,
        #: ``clear``) -- not by pin/unpin. A published read view (``readview``) is good while it is unchanged.
        self.generation = 0

    # ---- entries -------------------------------------------------------------------------------

    def add(self, desc: CacheDesc, *, is_blocks: bool, owned: bool, remote_accessible: bool,
            memory: object) -> CacheEntry:
        require(isinstance(desc, CacheDesc), f"a cache needs a CacheDesc, got {type(desc).__name__}")
        cache_id = CacheId(self._next_id)
        self._next_id += 1
        self.generation += 1
        entry = CacheEntry(cache_id, desc, bool(is_blocks), bool(owned), bool(remote_accessible), memory)
        self._live[cache_id] = entry
        self._cache_keys[cache_id] = {}
        if not entry.is_blocks:
            self._slot_keys[cache_id] = {}
        if entry.owned:
            self._bytes_owned += desc.total_size
        return entry

    def get(self, cache_id: CacheId) -> CacheEntry:
        entry = self._live.get(cache_id)
        if entry is None:
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST, f"cache {cache_id} does not exist")
        return entry

    def find(self, cache_id: CacheId) -> CacheEntry | None:
        return self._live.get(cache_id)

    def entries(self) -> list[CacheEntry]:
        """Addressable caches (not those that only wait for their last in-flight transfer)."""
        return list(self._live.values())

    @property
    def bytes_owned(self) -> int:
        """Bytes of owned (pool) caches not yet freed, including ones that wait for a pin."""
        return self._bytes_owned

    # ---- keys ----------------------------------------------------------------------------------

    def check_allocate_keys(self, desc: CacheDesc, keys: Sequence[OwnerKey | None]) -> None:
        """``CheckCacheKeys`` of the allocate path: fits the batch, none bound yet, no duplicates.

        ``None`` is a placeholder: it only skips a batch index and is not duplicate-checked
        (CANN's v2 engine checks placeholders as ``(UINT64_MAX, model_id)``; we do not).
        """
        require(len(keys) <= desc.rows, f"{len(keys)} cache keys for a batch size of {desc.rows}")
        seen: set[OwnerKey] = set()
        for i, key in enumerate(keys):
            if key is None:
                continue
            self._check_contiguous_key(key, i)
            bound = self._keys.get(key)
            if bound is not None:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"{describe_key(key)} (position {i}) is already bound to cache {bound[0]} "
                                    f"batch index {bound[1]}")
            require(key not in seen, f"{describe_key(key)} appears more than once in cache_keys (position {i})")
            seen.add(key)

    def bind_keys(self, cache_id: CacheId, keys: Sequence[OwnerKey | None]) -> None:
        """Bind ``keys[i]`` to batch index ``i`` of a contiguous cache; ``None`` skips a slot.

        A key that is already bound keeps its first binding (``emplace``; the allocate path has
        run ``check_allocate_keys`` first, the register path does not check).
        """
        entry = self.get(cache_id)
        require(not entry.is_blocks, f"cache {cache_id} is a blocks cache; it takes a BlocksCacheKey")
        require(len(keys) <= entry.desc.rows, f"{len(keys)} cache keys for a batch size of {entry.desc.rows}")
        for i, key in enumerate(keys):
            if key is not None:
                self._check_contiguous_key(key, i)
        slots = self._slot_keys[entry.cache_id]
        for i, key in enumerate(keys):
            if key is None or key in self._keys or i in slots:
                continue
            self._bind(key, entry.cache_id, i)
            slots[i] = key

    def bind_blocks_key(self, cache_id: CacheId, model_id: int, *, overwrite: bool) -> None:
        """Make a blocks cache pullable as ``BlocksCacheKey(<this cluster>, model_id)``.

        ``overwrite=False`` (allocate): an already bound key is PARAM_INVALID; ``overwrite=True``
        (register): the key is re-pointed to this cache.
        """
        entry = self.get(cache_id)
        require(entry.is_blocks, f"cache {cache_id} is not a blocks cache; it takes CacheKeys")
        key = OwnerKey.blocks(model_id)
        bound = self._keys.get(key)
        if bound is not None:
            if bound[0] == entry.cache_id:
                return
            if not overwrite:
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"{describe_key(key)} is already bound to cache {bound[0]}")
            # The previous holder is a blocks cache: losing its key never frees it.
            self._unbind(key)
        self._bind(key, entry.cache_id, 0)

    def lookup(self, key: OwnerKey) -> tuple[CacheEntry, int]:
        """``(entry, batch_index)`` of a key (batch index 0 for blocks keys)."""
        bound = self._keys.get(key)
        if bound is None:
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST, f"no cache is bound to {describe_key(key)}")
        return self._live[bound[0]], bound[1]

    def lookup_by_id(self, cache_id: CacheId, batch_index: int) -> tuple[CacheEntry, OwnerKey | None]:
        """A slot addressed as ``CacheKeyByIdAndIndex``: the entry and the key bound to that slot, if any."""
        entry = self.get(cache_id)
        if not (isinstance(batch_index, int) and 0 <= batch_index < entry.desc.rows):
            raise DataDistError(StatusCode.LLM_KV_CACHE_NOT_EXIST,
                                f"batch_index {batch_index} out of range [0, {entry.desc.rows}) of cache {cache_id}")
        slots = self._slot_keys.get(entry.cache_id)
        return entry, (slots.get(batch_index) if slots is not None else None)

    def keys_of(self, cache_id: CacheId) -> list[OwnerKey]:
        return list(self._cache_keys.get(cache_id, ()))

    def bound_keys(self, cache_id: CacheId) -> dict[OwnerKey, int]:
        """The keys bound to ``cache_id`` and the batch index each names (a copy)."""
        return dict(self._cache_keys.get(cache_id, {}))

    def remove_key(self, key: OwnerKey) -> list[CacheEntry]:
        """``remove_cache_key``: unbind; may free the cache. Missing keys and registered caches: no-op."""
        bound = self._keys.get(key)
        if bound is None:
            return []
        entry = self._live[bound[0]]
        if not entry.owned:
            return []
        self._unbind(key)
        return self._maybe_retire(entry)

    def consume_pulled(self, key: OwnerKey, tensor_indices: Iterable[int]) -> list[CacheEntry]:
        """After a successful remote pull by ``key``: drop it once every tensor index was pulled.

        Only REQ keys of owned contiguous caches are consumed; PREFIX and BLOCKS keys and keys of
        registered caches stay. Returns the entries to free (the cache, if nothing else holds it).
        """
        bound = self._keys.get(key)
        if bound is None or key.kind != KeyKind.REQ:
            return []
        entry = self._live[bound[0]]
        if not entry.owned or entry.is_blocks:
            return []
        n = entry.desc.num_tensors
        indices = []
        for t in tensor_indices:   # checked as they come: a peer's huge range stops at its first bad index
            if not (isinstance(t, int) and 0 <= t < n):
                raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                    f"pulled tensor index {t!r} out of range [0, {n}) of cache {entry.cache_id}")
            indices.append(t)
        pulled = self._pulled.setdefault(key, set())
        pulled.update(indices)
        if len(pulled) < n:
            return []
        self._unbind(key)
        return self._maybe_retire(entry)

    # ---- references ----------------------------------------------------------------------------

    def release_id(self, cache_id: CacheId) -> list[CacheEntry]:
        """``deallocate_cache``: drop the cache-id reference; frees once no key and no pin remains."""
        entry = self._live.get(cache_id)
        if entry is None:
            return []
        require(not entry.is_blocks, f"cache {cache_id} is a blocks cache; use deallocate_blocks_cache")
        if not entry.owned or not entry.id_held:
            return []
        entry.id_held = False
        return self._maybe_retire(entry)

    def remove_cache(self, cache_id: CacheId) -> list[CacheEntry]:
        """``unregister_cache`` / ``deallocate_blocks_cache``: drop the cache and every key pointing to it."""
        entry = self._live.get(cache_id)
        if entry is None:
            return []
        return self._retire(entry)

    def pin(self, cache_id: CacheId) -> CacheEntry:
        """An in-flight transfer starts: the memory stays until the matching ``unpin``."""
        entry = self.get(cache_id)
        entry.pins += 1
        return entry

    def unpin(self, cache_id: CacheId) -> list[CacheEntry]:
        """An in-flight transfer ended; frees the cache if that was its last reference.

        Unknown ids (e.g. after ``clear``) are a no-op.
        """
        entry = self._live.get(cache_id) or self._draining.get(cache_id)
        if entry is None:
            return []
        if entry.pins <= 0:
            raise DataDistError(StatusCode.LLM_FAILED, f"cache {cache_id} unpinned more often than pinned")
        entry.pins -= 1
        if entry.pins == 0 and entry.cache_id in self._draining:
            return self._release(entry)
        return []

    def clear(self) -> list[CacheEntry]:
        """Engine finalize: every entry, pinned or not, leaves the registry and is returned."""
        self.generation += 1
        out = list(self._live.values()) + list(self._draining.values())
        for entry in out:
            entry.id_held = False
        self._live.clear()
        self._draining.clear()
        self._keys.clear()
        self._cache_keys.clear()
        self._slot_keys.clear()
        self._pulled.clear()
        self._bytes_owned = 0
        return out

    # ---- internals -----------------------------------------------------------------------------

    @staticmethod
    def _check_contiguous_key(key: OwnerKey, position: int) -> None:
        require(isinstance(key, OwnerKey) and key.kind in (KeyKind.REQ, KeyKind.PREFIX),
                f"cache key at position {position} must be a CacheKey (req_id or prefix_id), got {key!r}")

    def _bind(self, key: OwnerKey, cache_id: CacheId, batch_index: int) -> None:
        self.generation += 1
        self._keys[key] = (cache_id, batch_index)
        self._cache_keys[cache_id][key] = batch_index

    def _unbind(self, key: OwnerKey) -> None:
        self.generation += 1
        cache_id, batch_index = self._keys.pop(key)
        del self._cache_keys[cache_id][key]
        slots = self._slot_keys.get(cache_id)
        if slots is not None and slots.get(batch_index) == key:
            del slots[batch_index]
        self._pulled.pop(key, None)

    def _maybe_retire(self, entry: CacheEntry) -> list[CacheEntry]:
        """An owned contiguous cache goes once neither its id nor any key holds it."""
        if (entry.owned and not entry.is_blocks and not entry.id_held
                and not self._cache_keys[entry.cache_id]):
            return self._retire(entry)
        return []

    def _retire(self, entry: CacheEntry) -> list[CacheEntry]:
        """Make the entry unaddressable; free it now or when its last pin goes."""
        cache_id = entry.cache_id
        self.generation += 1   # before anything can be freed (``Engine._free``: see ``readview``)
        for key in list(self._cache_keys[cache_id]):
            self._unbind(key)
        del self._cache_keys[cache_id]
        self._slot_keys.pop(cache_id, None)
        del self._live[cache_id]
        entry.id_held = False
        self._draining[cache_id] = entry
        if entry.pins == 0:
            return self._release(entry)
        return []

    def _release(self, entry: CacheEntry) -> list[CacheEntry]:
        del self._draining[entry.cache_id]
        if entry.owned:
            self._bytes_owned -= entry.desc.total_size
        return [entry]
