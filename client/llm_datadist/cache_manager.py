"""``CacheManager`` (CANN v2 "cache manager mode"), obtained from ``LLMDataDist.cache_manager``.

Validation happens here first, with CANN's exception types (TypeError / ValueError /
LLMException(LLM_PARAM_INVALID)); the daemon validates again and owns every byte.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple, Union

from datadist.v1 import datadist_pb2

from . import _validate as v
from ._cache_ops import KIND_BLOCKS, KIND_CACHE, PULL, PUSH, UINT64_MAX, CacheOps, check_blocks, layer_kwargs
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


class CacheManager(CacheOps):
    def __init__(self, owner: EngineView, options: Dict[str, str]) -> None:
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
        valid_req = 0 <= cache_key.req_id < UINT64_MAX
        valid_prefix = 0 <= cache_key.prefix_id < UINT64_MAX
        v.raise_if_false(valid_req != valid_prefix, "exactly one of req_id and prefix_id must be valid")

    # ---- memory --------------------------------------------------------------------------------

    def allocate_cache(self, cache_desc: CacheDesc,
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = ()) -> Cache:
        self._check_desc(cache_desc)
        keys = self._check_cache_keys(cache_keys)
        v.raise_if_false(len(keys) <= cache_desc.shape[0],
                         f"{len(keys)} cache keys for batch size {cache_desc.shape[0]}")
        info, addrs = self._allocate_rpc("allocate_cache", cache_desc, False, keys)
        return self._make_cache(info, cache_desc, False, addrs)

    def allocate_blocks_cache(self, cache_desc: CacheDesc, blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
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
        keys = self._check_cache_keys(cache_keys)
        return self._register("register_cache", cache_desc, addrs, False, keys, None, remote_accessible)

    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: List[int],
                              blocks_cache_key: Optional[BlocksCacheKey] = None,
                              remote_accessible: Optional[bool] = None) -> Cache:
        v.check_isinstance("blocks_cache_key", blocks_cache_key, [BlocksCacheKey])
        return self._register("register_blocks_cache", cache_desc, addrs, True, [], blocks_cache_key,
                              remote_accessible)

    def unregister_cache(self, cache_id: int) -> None:
        v.check_int64("cache_id", cache_id)
        self._call("UnregisterCache", datadist_pb2.CacheRef(engine_id=self._engine_id, cache_id=cache_id),
                   "unregister_cache")

    def deallocate_cache(self, cache: Cache) -> None:
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.raise_if_true(cache.is_blocks_cache, "deallocate_cache does not take a blocks cache; "
                                               "use deallocate_blocks_cache")
        if cache.cache_id < 0 or getattr(cache, "_is_registered", False):
            return
        self._deallocate_rpc("deallocate_cache", cache.cache_id, False)
        cache.tensor_addrs = []

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.raise_if_false(cache.is_blocks_cache, "deallocate_blocks_cache takes a blocks cache only")
        if cache.cache_id < 0 or getattr(cache, "_is_registered", False):
            return
        self._deallocate_rpc("deallocate_blocks_cache", cache.cache_id, True)
        cache.tensor_addrs = []

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        v.check_isinstance("cache_key", cache_key, [CacheKey], allow_none=False)
        self._remove_key_rpc("remove_cache_key", cache_key)

    # ---- local copies --------------------------------------------------------------------------

    def copy_cache(self, dst: Cache, src: Cache, dst_batch_index: int = 0, src_batch_index: int = 0,
                   offset: int = 0, size: int = -1, req_id: Optional[int] = None) -> None:
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
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.check_isinstance("copy_block_info", copy_block_info, [dict], allow_none=False)
        v.raise_if_false(cache.is_blocks_cache, "copy_blocks needs a blocks cache")
        self._copy_blocks_rpc("copy_blocks", cache.cache_id, copy_block_info)

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
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
        if self._enable_remote_cache_accessible:
            v.check_isinstance("cache_key", cache_key, [CacheKeyByIdAndIndex], allow_none=False)
        else:
            v.check_isinstance("cache_key", cache_key, [CacheKey, CacheKeyByIdAndIndex], allow_none=False)
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.check_uint32("batch_index", batch_index)
        v.check_int64("size", size)
        v.raise_if_false(size == -1 or size > 0, f"size must be -1 or > 0, got {size}")
        v.raise_if_true(cache.is_blocks_cache, "pull_cache needs a contiguous cache; use pull_blocks")
        if isinstance(cache_key, CacheKey):
            self.check_cache_key(cache_key)
        v.raise_if_true(cache_key.cluster_id == self._owner.cluster_id, "cannot pull from this node's own cluster id")
        src, dst, per = self._layer_kwargs(kwargs)
        self._transfer("pull_cache", self._request(
            PULL, KIND_CACHE, cache_key, cache.cache_id, [], [], batch_index, size, src, dst, per))

    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey], dst_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int, ...], List[int]]] = (),
                    dst_blocks: Union[Tuple[int, ...], List[int]] = (), **kwargs: Any) -> None:
        v.check_isinstance("src_cache_key", src_cache_key, [CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey],
                           allow_none=False)
        v.check_isinstance("dst_cache", dst_cache, [Cache], allow_none=False)
        src_list = check_blocks("src_blocks", src_blocks)
        dst_list = check_blocks("dst_blocks", dst_blocks)
        v.raise_if_false(dst_cache.is_blocks_cache, "pull_blocks needs a blocks destination cache")
        v.raise_if_false(len(dst_list) > 0, "dst_blocks must not be empty")
        if isinstance(src_cache_key, BlocksCacheKey):
            v.raise_if_false(len(src_list) > 0, "src_blocks must not be empty with a BlocksCacheKey")
            v.raise_if_false(len(src_list) == len(dst_list), "src_blocks and dst_blocks must have the same length")
        else:
            v.raise_if_false(len(src_list) == 0, "src_blocks must be empty when pulling a CacheKey into blocks")
            if isinstance(src_cache_key, CacheKey):
                self.check_cache_key(src_cache_key)
        v.raise_if_true(src_cache_key.cluster_id == self._owner.cluster_id,
                        "cannot pull from this node's own cluster id")
        src, dst, per = self._layer_kwargs(kwargs)
        self._transfer("pull_blocks", self._request(
            PULL, KIND_BLOCKS, src_cache_key, dst_cache.cache_id, src_list, dst_list, 0, -1, src, dst, per))

    def push_cache(self, dst_cache_key: CacheKeyByIdAndIndex, src_cache: Cache, src_batch_index: int = 0,
                   src_layer_range: range = None, dst_layer_range: range = None, size: int = -1,
                   tensor_num_per_layer: int = 2) -> None:
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
                    dst_blocks: Union[Tuple[int, ...], List[int]] = (), src_layer_range: range = None,
                    dst_layer_range: range = None, tensor_num_per_layer: int = 2) -> None:
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
        """Layer-wise asynchronous push (docs/spec.md §5.7, §7): one ``CacheTask`` with a result per config."""
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        v.raise_if_true(src_cache.cache_desc.placement == Placement.HOST, "src cache not support placement HOST")
        return self._transfer_async(src_cache.cache_id, src_cache.cache_desc, layer_synchronizer, transfer_configs,
                                    src_block_indices, dst_block_indices, dst_block_memory_size,
                                    LLMStatusCode.LLM_TIMEOUT, self._enable_remote_cache_accessible, v1=False)

    def set_is_call_linked(self) -> None:
        """Internal (CANN): ``link()`` was called; ``remote_accessible=True`` registrations are refused from now."""
        self._owner._is_call_linked = True

    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """Reserved by CANN for UCE recovery of device memory; host memory never needs remapping."""
        items = mem_infos if isinstance(mem_infos, list) else [mem_infos]
        for info in items:
            v.check_isinstance("mem_info", info, [MemInfo], allow_none=False)
            v.raise_if_false(info.mem_type == Memtype.MEM_TYPE_DEVICE, "remap_registered_memory supports DEVICE only")
            v.raise_if_false(info.addr != 0 and info.size > 0, "mem_info needs addr != 0 and size > 0")
