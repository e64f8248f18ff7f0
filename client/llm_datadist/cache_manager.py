"""``CacheManager`` (CANN v2 "cache manager mode"), obtained from ``LLMDataDist.cache_manager``.

Validation happens here first, with CANN's exception types (TypeError / ValueError /
LLMException(LLM_PARAM_INVALID)); the daemon validates again and owns every byte.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _validate as v
from ._cache_ops import (
    ALL_LAYERS,
    KIND_BLOCKS,
    KIND_CACHE,
    PULL,
    PUSH,
    UINT64_MAX,
    CacheOps,
    check_block_lists,
    check_blocks,
    layer_kwargs,
)
from ._engine import EngineView
from ._task import CacheTask
from .llm_types import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    LayerSynchronizer,
    MemInfo,
    Memtype,
    Placement,
    TransferConfig,
    TransferWithCacheKeyConfig,
)
from .status import LLMException, LLMStatusCode

__all__ = ["CacheManager"]

log = logging.getLogger(__name__)

_CACHE_KEYS = (CacheKey, CacheKeyByIdAndIndex)
_PULL_KEYS = (CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey)


class CacheManager(CacheOps):
    """The caches of an ``LLMDataDist`` in cache-manager mode (``llm.EnableCacheManager``): allocate, register,
    copy, swap, pull, push; reached as ``LLMDataDist.cache_manager``, not made by hand (not exported, as in CANN)."""

    def __init__(self, owner: EngineView, options: Dict[str, str]) -> None:
        """Made by ``LLMDataDist.init`` in cache-manager mode; reached as ``LLMDataDist.cache_manager``.

        Args:
            owner: the ``LLMDataDist`` whose engine this manages.
            options: its init options (which pools exist, ``llm.EnableRemoteCacheAccessible``).
        """
        super().__init__(owner)
        self._enable_remote_cache_accessible = options.get("llm.EnableRemoteCacheAccessible") == "1"
        self._has_pool = {Placement.DEVICE: bool(options.get("llm.MemPoolConfig")),
                          Placement.HOST: bool(options.get("llm.HostMemPoolConfig"))}

    # ---- plumbing ------------------------------------------------------------------------------

    def _make_cache(self, info: Any, desc: CacheDesc, is_blocks: bool, addrs: List[int]) -> Cache:
        desc._is_blocks = is_blocks
        return Cache(info.cache_id, desc, addrs, self, is_registered=info.registered, is_blocks_cache=is_blocks)

    @staticmethod
    def _check_desc(cache_desc: CacheDesc) -> None:
        v.check_isinstance("cache_desc", cache_desc, [CacheDesc], allow_none=False)
        v.raise_if_false(cache_desc.num_tensors > 0, "cache_desc.num_tensors must be > 0")
        v.raise_if_false(len(cache_desc.shape) > 0 and all(d > 0 for d in cache_desc.shape),
                         f"cache_desc.shape must be non-empty with positive dims, got {cache_desc.shape}")

    @staticmethod
    def _check_cache_keys(cache_keys: Any) -> List[CacheKey]:
        v.check_isinstance("cache_keys", cache_keys, [list, tuple])
        keys = list(cache_keys or ())
        for key in keys:
            v.check_isinstance("cache_key", key, [CacheKey], allow_none=False)
        return keys

    @staticmethod
    def check_cache_key(cache_key: CacheKey) -> None:
        """Check that exactly one of ``req_id`` and ``prefix_id`` is valid (in ``[0, 2**64 - 1)``).

        Args:
            cache_key: the ``CacheKey`` to check.

        Raises:
            LLMException: ``LLM_PARAM_INVALID`` when both or neither are valid.
        """
        valid_req = 0 <= cache_key.req_id < UINT64_MAX
        valid_prefix = 0 <= cache_key.prefix_id < UINT64_MAX
        v.raise_if_false(valid_req != valid_prefix, "exactly one of req_id and prefix_id must be valid")

    # ---- memory --------------------------------------------------------------------------------

    def allocate_cache(self, cache_desc: CacheDesc,
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = ()) -> Cache:
        """Allocate a contiguous cache from the engine's pool (deprecated by CANN: prefer ``register_cache``).

        Args:
            cache_desc: ``num_tensors`` tensors of ``shape``; ``shape[0]`` is the batch size.
            cache_keys: ``cache_keys[i]`` makes batch slot ``i`` pullable by peers (at most ``shape[0]``; a key with
                ``req_id = 2**64 - 1`` leaves its slot unkeyed).

        Returns:
            The ``Cache``; its memory is freed after ``deallocate_cache`` and once every key is pulled or removed.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (a description or keys the checks refuse; a key already bound),
                ``LLM_FEATURE_NOT_ENABLED`` (no pool of the placement: ``mem_pool_cfg`` / ``host_mem_pool_cfg``),
                ``LLM_OUT_OF_MEMORY`` (the pool or the node's cap is full).
        """
        self._check_desc(cache_desc)
        keys = self._check_cache_keys(cache_keys)
        v.raise_if_false(len(keys) <= cache_desc.shape[0],
                         f"{len(keys)} cache keys for batch size {cache_desc.shape[0]}")
        info, addrs = self._allocate_rpc("allocate_cache", cache_desc, False, keys)
        return self._make_cache(info, cache_desc, False, addrs)

    def allocate_blocks_cache(self, cache_desc: CacheDesc, blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
        """Allocate a paged (blocks) cache from the engine's pool (deprecated by CANN: prefer
        ``register_blocks_cache``).

        Args:
            cache_desc: ``num_tensors`` tensors of ``shape``; ``shape[0]`` is the number of blocks.
            blocks_cache_key: makes the cache pullable by peers as ``BlocksCacheKey(<this cluster>, model_id)``.

        Returns:
            The blocks ``Cache``; free it with ``deallocate_blocks_cache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (a description or keys the checks refuse; a key already bound),
                ``LLM_FEATURE_NOT_ENABLED`` (no pool of the placement: ``mem_pool_cfg`` / ``host_mem_pool_cfg``),
                ``LLM_OUT_OF_MEMORY`` (the pool or the node's cap is full).
        """
        self._check_desc(cache_desc)
        v.check_isinstance("blocks_cache_key", blocks_cache_key, [BlocksCacheKey])
        info, addrs = self._allocate_rpc("allocate_blocks_cache", cache_desc, True, (), blocks_cache_key)
        return self._make_cache(info, cache_desc, True, addrs)

    def _register(self, func: str, cache_desc: CacheDesc, addrs: List[int], is_blocks: bool,
                  cache_keys: List[CacheKey], blocks_key: Optional[BlocksCacheKey],
                  remote_accessible: Optional[bool]) -> Cache:
        self._check_desc(cache_desc)
        v.check_isinstance("addrs", addrs, [list, tuple], allow_none=False)
        for addr in addrs:
            v.check_uint64("addr", addr)
        v.check_isinstance("remote_accessible", remote_accessible, [bool])
        v.raise_if_false(len(addrs) == cache_desc.num_tensors,
                         f"addrs has {len(addrs)} entries but num_tensors is {cache_desc.num_tensors}")
        v.raise_if_true(any(a == 0 for a in addrs), "addrs must not contain 0")
        if remote_accessible and self._owner._is_call_linked:
            raise LLMException("remote_accessible=True is not allowed after link()",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID)
        info = self._register_rpc(func, cache_desc, addrs, is_blocks, cache_keys, blocks_key, remote_accessible)
        return self._make_cache(info, cache_desc, is_blocks, list(addrs))

    def register_cache(self, cache_desc: CacheDesc, addrs: List[int],
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = (),
                       remote_accessible: Optional[bool] = None) -> Cache:
        """Register the worker's own contiguous memory as a cache (one address per tensor).

        Args:
            cache_desc: ``num_tensors`` tensors of ``shape``; ``shape[0]`` is the batch size.
            addrs: the address of each tensor (uint64, none 0), in this process's memory (host, or NPU memory with the
                ``acl`` backend).
            cache_keys: keys of batch slots, as in ``allocate_cache``.
            remote_accessible: whether peers may read it by id (default: True for DEVICE, False for HOST, and False
                once ``link`` was called).

        Returns:
            The registered ``Cache`` (``unregister_cache`` ends it; the memory stays the worker's).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (``len(addrs) != num_tensors``, a zero address,
                ``remote_accessible=True`` after ``link``, memory this process may not hand over), ``LLM_OUT_OF_MEMORY``
                (more registrations than the daemon takes).
        """
        keys = self._check_cache_keys(cache_keys)
        return self._register("register_cache", cache_desc, addrs, False, keys, None, remote_accessible)

    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: List[int],
                              blocks_cache_key: Optional[BlocksCacheKey] = None,
                              remote_accessible: Optional[bool] = None) -> Cache:
        """Register the worker's own paged (blocks) memory as a cache.

        Args:
            cache_desc: ``num_tensors`` tensors of ``shape``; ``shape[0]`` is the number of blocks.
            addrs: the address of each tensor (uint64, none 0).
            blocks_cache_key: makes it pullable by peers as ``BlocksCacheKey(<this cluster>, model_id)``; a key already
                bound is re-pointed to this cache.
            remote_accessible: as in ``register_cache``.

        Returns:
            The registered blocks ``Cache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (``len(addrs) != num_tensors``, a zero address,
                ``remote_accessible=True`` after ``link``, memory this process may not hand over), ``LLM_OUT_OF_MEMORY``
                (more registrations than the daemon takes).
        """
        v.check_isinstance("blocks_cache_key", blocks_cache_key, [BlocksCacheKey])
        return self._register("register_blocks_cache", cache_desc, addrs, True, [], blocks_cache_key,
                              remote_accessible)

    def unregister_cache(self, cache_id: int) -> None:
        """End a registration; an unknown id succeeds.

        Args:
            cache_id: the ``Cache.cache_id`` of a registered cache.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (the cache is not a registered one).
        """
        v.check_int64("cache_id", cache_id)
        self._unregister_rpc("unregister_cache", cache_id)

    def deallocate_cache(self, cache: Cache) -> None:
        """Drop an allocated contiguous cache; its memory goes once no key holds it. A registered or
        already freed cache is a no-op. Sets ``cache.tensor_addrs`` to ``[]``.

        Args:
            cache: a ``Cache`` of ``allocate_cache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache`` not a ``Cache``.
            LLMException: ``LLM_PARAM_INVALID`` (a blocks cache: use ``deallocate_blocks_cache``).
        """
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.raise_if_true(cache.is_blocks_cache, "deallocate_cache does not take a blocks cache; "
                                               "use deallocate_blocks_cache")
        if cache.cache_id < 0 or getattr(cache, "_is_registered", False):
            return
        self._deallocate_rpc("deallocate_cache", cache.cache_id, False)
        cache.tensor_addrs = []

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        """Free an allocated blocks cache and its key at once. A registered or already freed
        cache is a no-op. Sets ``cache.tensor_addrs`` to ``[]``.

        Args:
            cache: a ``Cache`` of ``allocate_blocks_cache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache`` not a ``Cache``.
            LLMException: ``LLM_PARAM_INVALID`` (not a blocks cache).
        """
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.raise_if_false(cache.is_blocks_cache, "deallocate_blocks_cache takes a blocks cache only")
        if cache.cache_id < 0 or getattr(cache, "_is_registered", False):
            return
        self._deallocate_rpc("deallocate_blocks_cache", cache.cache_id, True)
        cache.tensor_addrs = []

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Unbind a key: peers can no longer pull it (a deallocated cache it held is freed). A
        missing key is a no-op.

        Args:
            cache_key: the ``CacheKey`` to remove.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache_key`` not a ``CacheKey``.
        """
        v.check_isinstance("cache_key", cache_key, [CacheKey], allow_none=False)
        self._remove_key_rpc("remove_cache_key", cache_key)

    # ---- local copies --------------------------------------------------------------------------

    def copy_cache(self, dst: Cache, src: Cache, dst_batch_index: int = 0, src_batch_index: int = 0,
                   offset: int = 0, size: int = -1, req_id: Optional[int] = None) -> None:
        """Copy one batch slot of ``src`` into one of ``dst``, per tensor (a local copy).

        Args:
            dst: the destination contiguous ``Cache`` (note: destination first).
            src: the source contiguous ``Cache``.
            dst_batch_index: the slot of ``dst`` (uint32).
            src_batch_index: the slot of ``src`` (uint32).
            offset: bytes into each slot (uint64).
            size: bytes per tensor, -1 for the rest of the slot after ``offset``.
            req_id: only logged.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (blocks caches, a size or slot out of range, tensor counts that differ),
                ``LLM_KV_CACHE_NOT_EXIST`` (an id this engine does not have).
        """
        v.check_isinstance("dst", dst, [Cache], allow_none=False)
        v.check_isinstance("src", src, [Cache], allow_none=False)
        v.check_uint32("dst_batch_index", dst_batch_index)
        v.check_uint32("src_batch_index", src_batch_index)
        v.check_uint64("offset", offset)
        v.check_int64("size", size)
        v.check_uint64("req_id", req_id) if req_id is not None else None
        v.raise_if_true(dst.is_blocks_cache or src.is_blocks_cache, "copy_cache does not take blocks caches")
        v.raise_if_false(size == -1 or size > 0, f"size must be -1 or > 0, got {size}")
        self._copy_cache_rpc("copy_cache", dst.cache_id, src.cache_id, dst_batch_index, src_batch_index, offset, size)

    def copy_blocks(self, cache: Cache, copy_block_info: Dict[int, List[int]]) -> None:
        """Copy blocks within one blocks cache, for every tensor.

        Args:
            cache: the blocks ``Cache``.
            copy_block_info: source block -> the destination blocks it is copied to.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache`` not a ``Cache``, ``copy_block_info`` not a ``dict``.
            LLMException: ``LLM_PARAM_INVALID`` (not a blocks cache, a block out of range),
                ``LLM_KV_CACHE_NOT_EXIST`` (an id this engine does not have).
        """
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.check_isinstance("copy_block_info", copy_block_info, [dict], allow_none=False)
        v.raise_if_false(cache.is_blocks_cache, "copy_blocks needs a blocks cache")
        self._copy_blocks_rpc("copy_blocks", cache.cache_id, copy_block_info)

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
        """Copy blocks between a host and a device blocks cache (swap in or out).

        Args:
            src_cache: the source blocks ``Cache`` (one of the two may come from ``Cache.create_cpu_cache``).
            dst_cache: the destination blocks ``Cache``.
            src_to_dst: source block -> destination block.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: a cache not a ``Cache``.
            LLMException: ``LLM_PARAM_INVALID`` (host to host or device to device, block sizes or tensor counts that
                differ, a block out of range).
        """
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        v.check_isinstance("dst_cache", dst_cache, [Cache], allow_none=False)
        self._swap_rpc("swap_blocks", (src_cache.cache_id, src_cache.cache_desc, src_cache.tensor_addrs),
                       (dst_cache.cache_id, dst_cache.cache_desc, dst_cache.tensor_addrs), src_to_dst)

    # ---- transfers -----------------------------------------------------------------------------

    @staticmethod
    def _layer_kwargs(kwargs: Dict[str, Any]) -> Tuple[Optional[range], Optional[range], int]:
        return layer_kwargs(kwargs)

    def pull_cache(self, cache_key: Union[CacheKey, CacheKeyByIdAndIndex], cache: Cache, batch_index: int = 0,
                   size: int = -1, **kwargs: Any) -> None:
        """Pull one batch slot of a peer's cache into ``cache`` at ``batch_index``.

        Args:
            cache_key: the remote slot: a ``CacheKey`` (consumed at the peer once pulled, for an allocated cache) or a
                ``CacheKeyByIdAndIndex`` (the only kind with ``enable_remote_cache_accessible``).
            cache: the local contiguous ``Cache``.
            batch_index: the local slot (uint32).
            size: bytes per tensor, -1 for the whole slot.
            **kwargs: ``src_layer_range``, ``dst_layer_range`` (``range``, step 1) and ``tensor_num_per_layer``
                (default 2): pull only those layers.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (arguments the checks refuse, this node's own cluster id),
                ``LLM_NOT_YET_LINK`` (no link to the key's cluster), ``LLM_KV_CACHE_NOT_EXIST`` (the peer has no such
                key, cache or blocks), ``LLM_LINK_BUSY`` (the link is at its limit of transfers), ``LLM_TIMEOUT`` (not
                done within ``sync_kv_timeout``), ``LLM_LINK_FAILED`` (the link broke during the transfer).
        """
        # each check's fast test inline (no call when the argument is as usual); the full check words any refusal
        if self._enable_remote_cache_accessible:
            if type(cache_key) is not CacheKeyByIdAndIndex:
                v.check_isinstance("cache_key", cache_key, [CacheKeyByIdAndIndex], allow_none=False)
        elif type(cache_key) not in _CACHE_KEYS:
            v.check_isinstance("cache_key", cache_key, [CacheKey, CacheKeyByIdAndIndex], allow_none=False)
        if type(cache) is not Cache:
            v.check_isinstance("cache", cache, [Cache], allow_none=False)
        if type(batch_index) is not int or not 0 <= batch_index <= v.UINT32_MAX:
            v.check_uint32("batch_index", batch_index)
        if type(size) is not int or size != -1:
            v.check_int64("size", size)
            v.raise_if_false(size > 0, f"size must be -1 or > 0, got {size}")
        if cache._is_blocks_cache:
            v.refuse("pull_cache needs a contiguous cache; use pull_blocks")
        if isinstance(cache_key, CacheKey):
            self.check_cache_key(cache_key)
        if cache_key._cluster_id == self._cluster_id:
            v.refuse("cannot pull from this node's own cluster id")
        src, dst, per = self._layer_kwargs(kwargs) if kwargs else ALL_LAYERS
        self._transfer("pull_cache", self._request(
            PULL, KIND_CACHE, cache_key, cache._cache_id, (), (), batch_index, size, src, dst, per))

    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey], dst_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int, ...], List[int]]] = (),
                    dst_blocks: Union[Tuple[int, ...], List[int]] = (), **kwargs: Any) -> None:
        """Pull blocks of a peer's cache into blocks of ``dst_cache``.

        Args:
            src_cache_key: a ``BlocksCacheKey`` (block ``src_blocks[i]`` goes to ``dst_blocks[i]``), or a ``CacheKey`` /
                ``CacheKeyByIdAndIndex`` (a contiguous slot spread over ``dst_blocks``; ``src_blocks`` empty).
            dst_cache: the local blocks ``Cache``.
            src_blocks: the remote blocks (non-empty with a ``BlocksCacheKey``, empty otherwise).
            dst_blocks: the local blocks, non-empty.
            **kwargs: ``src_layer_range``, ``dst_layer_range``, ``tensor_num_per_layer``, as in ``pull_cache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (arguments the checks refuse, this node's own cluster id),
                ``LLM_NOT_YET_LINK`` (no link to the key's cluster), ``LLM_KV_CACHE_NOT_EXIST`` (the peer has no such
                key, cache or blocks), ``LLM_LINK_BUSY`` (the link is at its limit of transfers), ``LLM_TIMEOUT`` (not
                done within ``sync_kv_timeout``), ``LLM_LINK_FAILED`` (the link broke during the transfer).
        """
        # each check's fast test inline (no call when the argument is as usual); the full check words any refusal
        if type(src_cache_key) not in _PULL_KEYS:
            v.check_isinstance("src_cache_key", src_cache_key, [CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey],
                               allow_none=False)
        if type(dst_cache) is not Cache:
            v.check_isinstance("dst_cache", dst_cache, [Cache], allow_none=False)
        src_list, dst_list = check_block_lists(src_blocks, dst_blocks)
        if not dst_cache._is_blocks_cache:
            v.refuse("pull_blocks needs a blocks destination cache")
        if not dst_list:
            v.refuse("dst_blocks must not be empty")
        if isinstance(src_cache_key, BlocksCacheKey):
            if not src_list:
                v.refuse("src_blocks must not be empty with a BlocksCacheKey")
            if len(src_list) != len(dst_list):
                v.refuse("src_blocks and dst_blocks must have the same length")
        else:
            if src_list:
                v.refuse("src_blocks must be empty when pulling a CacheKey into blocks")
            if isinstance(src_cache_key, CacheKey):
                self.check_cache_key(src_cache_key)
        if src_cache_key._cluster_id == self._cluster_id:
            v.refuse("cannot pull from this node's own cluster id")
        src, dst, per = self._layer_kwargs(kwargs) if kwargs else ALL_LAYERS
        self._transfer("pull_blocks", self._request(
            PULL, KIND_BLOCKS, src_cache_key, dst_cache._cache_id, src_list, dst_list, 0, -1, src, dst, per))

    def push_cache(self, dst_cache_key: CacheKeyByIdAndIndex, src_cache: Cache, src_batch_index: int = 0,
                   src_layer_range: Optional[range] = None, dst_layer_range: Optional[range] = None, size: int = -1,
                   tensor_num_per_layer: int = 2) -> None:
        """Push one slot of ``src_cache`` into a peer's cache (needs ``enable_remote_cache_accessible``).

        Args:
            dst_cache_key: the remote slot, a ``CacheKeyByIdAndIndex``.
            src_cache: the local contiguous ``Cache``.
            src_batch_index: the local slot (uint32).
            src_layer_range: the local layers (default all), step 1.
            dst_layer_range: the remote layers, as long as ``src_layer_range``.
            size: must be -1 (whole slots).
            tensor_num_per_layer: tensors per layer (default 2: K and V).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (arguments the checks refuse, this node's own cluster id),
                ``LLM_NOT_YET_LINK`` (no link to the key's cluster), ``LLM_KV_CACHE_NOT_EXIST`` (the peer has no such
                key, cache or blocks), ``LLM_LINK_BUSY`` (the link is at its limit of transfers), ``LLM_TIMEOUT`` (not
                done within ``sync_kv_timeout``), ``LLM_LINK_FAILED`` (the link broke during the transfer).
        """
        v.raise_if_false(self._enable_remote_cache_accessible, "push_cache requires enable_remote_cache_accessible")
        v.check_isinstance("dst_cache_key", dst_cache_key, [CacheKeyByIdAndIndex], allow_none=False)
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        v.check_uint32("src_batch_index", src_batch_index)
        v.check_int64("size", size)
        v.raise_if_false(size == -1, "push_cache supports size=-1 only")
        v.raise_if_true(src_cache.is_blocks_cache, "push_cache needs a contiguous source cache")
        src, dst, per = self._layer_kwargs({"src_layer_range": src_layer_range, "dst_layer_range": dst_layer_range,
                                            "tensor_num_per_layer": tensor_num_per_layer})
        self._transfer("push_cache", self._request(
            PUSH, KIND_CACHE, dst_cache_key, src_cache.cache_id, [], [], src_batch_index, -1, src, dst, per))

    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int, ...], List[int]]] = (),
                    dst_blocks: Union[Tuple[int, ...], List[int]] = (), src_layer_range: Optional[range] = None,
                    dst_layer_range: Optional[range] = None, tensor_num_per_layer: int = 2) -> None:
        """Push blocks of ``src_cache`` into a peer's blocks cache (needs
        ``enable_remote_cache_accessible``).

        Args:
            dst_cache_key: the remote cache, a ``BlocksCacheKey``.
            src_cache: the local blocks ``Cache``.
            src_blocks: the local blocks; ``src_blocks[i]`` goes to ``dst_blocks[i]``.
            dst_blocks: the remote blocks, non-empty, as many as ``src_blocks``.
            src_layer_range: the local layers (default all), step 1.
            dst_layer_range: the remote layers, as long as ``src_layer_range``.
            tensor_num_per_layer: tensors per layer (default 2).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (arguments the checks refuse, this node's own cluster id),
                ``LLM_NOT_YET_LINK`` (no link to the key's cluster), ``LLM_KV_CACHE_NOT_EXIST`` (the peer has no such
                key, cache or blocks), ``LLM_LINK_BUSY`` (the link is at its limit of transfers), ``LLM_TIMEOUT`` (not
                done within ``sync_kv_timeout``), ``LLM_LINK_FAILED`` (the link broke during the transfer).
        """
        v.raise_if_false(self._enable_remote_cache_accessible, "push_blocks requires enable_remote_cache_accessible")
        v.check_isinstance("dst_cache_key", dst_cache_key, [BlocksCacheKey], allow_none=False)
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        src_list = check_blocks("src_blocks", src_blocks)
        dst_list = check_blocks("dst_blocks", dst_blocks)
        v.raise_if_false(src_cache.is_blocks_cache, "push_blocks needs a blocks source cache")
        v.raise_if_false(len(dst_list) > 0, "dst_blocks must not be empty")
        v.raise_if_false(len(src_list) == len(dst_list), "src_blocks and dst_blocks must have the same length")
        src, dst, per = self._layer_kwargs({"src_layer_range": src_layer_range, "dst_layer_range": dst_layer_range,
                                            "tensor_num_per_layer": tensor_num_per_layer})
        self._transfer("push_blocks", self._request(
            PUSH, KIND_BLOCKS, dst_cache_key, src_cache.cache_id, dst_list, src_list, 0, -1, src, dst, per))

    def transfer_cache_async(self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
                             transfer_configs: Union[List[Union[TransferConfig, TransferWithCacheKeyConfig]],
                                                     Tuple[Union[TransferConfig, TransferWithCacheKeyConfig], ...]],
                             src_block_indices: Optional[Union[List[int], Tuple[int, ...]]] = None,
                             dst_block_indices: Optional[Union[List[int], Tuple[int, ...]]] = None,
                             dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Push ``src_cache`` layer by layer while the model computes (docs/spec.md §5.7, §7).

        For each layer ``l`` it calls ``layer_synchronizer.synchronize_layer(l, None)``, then sends that layer to every
        config whose ``src_layer_range`` holds it, from a thread of its own.

        Args:
            src_cache: the local ``Cache`` (DEVICE placement, an even number of tensors).
            layer_synchronizer: says when each layer is computed (False aborts).
            transfer_configs: ``TransferWithCacheKeyConfig`` per target with ``enable_remote_cache_accessible``,
                ``TransferConfig`` (raw remote addresses) without.
            src_block_indices: blocks of a blocks ``src_cache`` to send (then ``dst_block_indices`` too, same length).
            dst_block_indices: the remote blocks they go to.
            dst_block_memory_size: bytes of one remote block, for a contiguous source into remote blocks.

        Returns:
            A ``CacheTask``: ``synchronize`` waits for all, ``get_results`` gives one ``LLMStatusCode`` per config
            (``LLM_TIMEOUT`` when asked before the task ended).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (HOST placement, an odd tensor count, configs of the wrong kind, block
                lists that do not match). Transfer failures go to the task's results, not raised.
        """
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        v.raise_if_true(src_cache.cache_desc.placement == Placement.HOST, "src cache not support placement HOST")
        return self._transfer_async(src_cache.cache_id, src_cache.cache_desc, layer_synchronizer, transfer_configs,
                                    src_block_indices, dst_block_indices, dst_block_memory_size,
                                    LLMStatusCode.LLM_TIMEOUT, self._enable_remote_cache_accessible, v1=False)

    def set_is_call_linked(self) -> None:
        """Record that ``link`` was called: ``remote_accessible=True`` registrations are refused from
        now on (CANN's internal hook, called by ``LLMDataDist.link``).
        """
        self._owner._is_call_linked = True

    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """Reserved by CANN for UCE recovery of device memory; checks its arguments, does nothing else.

        Args:
            mem_infos: one ``MemInfo`` or a list of them.

        Raises:
            TypeError: an item not a ``MemInfo``.
            LLMException: ``LLM_PARAM_INVALID`` (not DEVICE memory, address 0 or size <= 0).
        """
        items = mem_infos if isinstance(mem_infos, list) else [mem_infos]
        for info in items:
            v.check_isinstance("mem_info", info, [MemInfo], allow_none=False)
            v.raise_if_false(info.mem_type == Memtype.MEM_TYPE_DEVICE, "remap_registered_memory supports DEVICE only")
            v.raise_if_false(info.addr != 0 and info.size > 0, "mem_info needs addr != 0 and size > 0")
