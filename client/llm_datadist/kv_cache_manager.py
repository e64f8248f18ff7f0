"""v1 ``KvCacheManager`` ("KvCacheManager mode", CANN GE's ``llm_datadist_v1``).

Obtained from ``LLMDataDist.kv_cache_manager`` when cache-manager mode is off (docs/spec.md §0, §8).
Memory comes from the engine's pool (``ge.flowGraphMemMaxSize`` x ``mem_utilization``), every
allocation is ``Placement.DEVICE``, and roles matter: only the DECODER pulls, only the PROMPT
binds ``CacheKey``s, removes them and pushes layer-wise. The daemon side is the one
``CacheManager`` uses (``_cache_ops``); only the argument rules here are v1's.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _validate as v
from ._cache_ops import KIND_BLOCKS, KIND_CACHE, PULL, UINT64_MAX, CacheOps, TransferFrame, layer_kwargs
from ._task import CacheTask
from .configs import LLMRole
from .llm_types import (
    BlocksCacheKey,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    KvCache,
    LayerSynchronizer,
    Placement,
    TransferConfig,
)
from .status import LLMStatusCode

__all__ = ["KvCacheManager"]

log = logging.getLogger(__name__)


class KvCacheManager(CacheOps):
    """``LLMDataDist.kv_cache_manager`` (v1). Not constructed by users."""

    def __init__(self, llm_engine: Any, role: LLMRole) -> None:
        """Made by ``LLMDataDist.init`` without cache-manager mode; reached as ``LLMDataDist.kv_cache_manager``.

        Args:
            llm_engine: the ``LLMDataDist`` whose engine this manages.
            role: its role (pulls are DECODER's, keys and layer-wise pushes PROMPT's).
        """
        super().__init__(llm_engine)
        self._role = role

    def is_initialized(self) -> bool:
        """Whether the manager can be used (False after ``LLMDataDist.finalize``).

        Returns:
            True until finalize.
        """
        return self._initialized

    # ---- helpers -------------------------------------------------------------------------------

    def _check_role(self, func_name: str, role: LLMRole) -> None:
        v.raise_if_false(self._role == role, "{0} is not supported by {1}", func_name, self._role)

    def _switch_role(self, role: LLMRole) -> None:
        self._role = role

    @staticmethod
    def _is_cpu_cache(cache: KvCache) -> bool:
        return cache.cache_desc.placement == Placement.HOST

    @staticmethod
    def _check_allocate(cache_desc: CacheDesc) -> None:
        v.check_isinstance("cache_desc", cache_desc, [CacheDesc], allow_none=False)
        v.raise_if_false(cache_desc.num_tensors > 0, "num_tensors should be bigger than zero.")
        v.raise_if_false(cache_desc.placement == Placement.DEVICE, "Only support allocate device cache")
        v.raise_if_false(len(cache_desc.shape) > 0 and all(d > 0 for d in cache_desc.shape),
                         f"cache_desc.shape must be non-empty with positive dims, got {cache_desc.shape}")

    def _kv_cache(self, info: Any, desc: CacheDesc, is_blocks: bool, addrs: List[int]) -> KvCache:
        desc._is_blocks = is_blocks
        return KvCache(info.cache_id, desc, [addrs], self)

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
        v.raise_if_true(not valid_req and not valid_prefix,
                        f"one of req id and prefix id should contain valid value:[0, 2**64-1), req id:"
                        f"{cache_key.req_id},prefix id{cache_key.prefix_id}.")
        v.raise_if_true(valid_req and valid_prefix,
                        f"only one of req id and prefix id should contain valid value:[0, 2**64-1), req id:"
                        f"{cache_key.req_id}, prefix id{cache_key.prefix_id}.")

    # ---- memory --------------------------------------------------------------------------------

    def allocate_blocks_cache(self, cache_desc: CacheDesc,
                              blocks_cache_key: Optional[BlocksCacheKey] = None) -> KvCache:
        """Allocate a paged (blocks) cache from the engine's memory (DEVICE placement).

        Args:
            cache_desc: ``num_tensors`` tensors of ``shape``; ``shape[0]`` is the number of blocks.
            blocks_cache_key: makes it pullable by peers (PROMPT only).

        Returns:
            The ``KvCache``; free it with ``deallocate_cache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not DEVICE placement, a key on DECODER, a description the checks
                refuse), ``LLM_OUT_OF_MEMORY`` (the engine's memory is full).
        """
        self._check_allocate(cache_desc)
        v.check_isinstance("blocks_cache_key", blocks_cache_key, [BlocksCacheKey])
        if self._role == LLMRole.DECODER:
            v.raise_if_false(blocks_cache_key is None, "blocks_cache_key is not supported by DECODER")
        info, addrs = self._allocate_rpc("allocate_blocks_cache", cache_desc, True, (), blocks_cache_key)
        return self._kv_cache(info, cache_desc, True, addrs)

    def allocate_cache(self, cache_desc: CacheDesc,
                       cache_keys: Union[Tuple[CacheKey, ...], List[CacheKey]] = ()) -> KvCache:
        """Allocate a contiguous cache from the engine's memory (DEVICE placement).

        Args:
            cache_desc: ``num_tensors`` tensors of ``shape``; ``shape[0]`` is the batch size.
            cache_keys: keys of batch slots (PROMPT only; at most ``shape[0]``), as in ``CacheManager.allocate_cache``.

        Returns:
            The ``KvCache``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not DEVICE placement, keys on DECODER, a key already bound),
                ``LLM_OUT_OF_MEMORY`` (the engine's memory is full).
        """
        self._check_allocate(cache_desc)
        v.check_isinstance("cache_keys", cache_keys, [list, tuple], inner_class=CacheKey, allow_none=False)
        if self._role != LLMRole.PROMPT:
            v.raise_if_false(len(cache_keys) == 0, "cache_keys is not supported by {0}", self._role.name)
        v.raise_if_false(len(cache_keys) <= cache_desc.shape[0],
                         f"{len(cache_keys)} cache keys for batch size {cache_desc.shape[0]}")
        info, addrs = self._allocate_rpc("allocate_cache", cache_desc, False, list(cache_keys))
        return self._kv_cache(info, cache_desc, False, addrs)

    def deallocate_cache(self, cache: KvCache) -> None:
        """Free a cache (its memory goes once no key holds it); a freed cache is a no-op.

        Args:
            cache: a ``KvCache`` of this manager.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache`` not a ``KvCache``.
            LLMException: ``LLM_PARAM_INVALID`` (a HOST cache of ``create_cpu_cache``).
        """
        v.check_isinstance("cache", cache, [KvCache], allow_none=False)
        v.raise_if_true(self._is_cpu_cache(cache), "Only support device cache")
        if cache.cache_id >= 0 and getattr(cache, "_valid", True):
            self._deallocate_rpc("deallocate_cache", cache.cache_id, bool(getattr(cache.cache_desc, "_is_blocks",
                                                                                   False)))
        cache.per_device_tensor_addrs = []
        cache._valid = False

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Unbind a key: peers can no longer pull it (PROMPT only).

        Args:
            cache_key: the ``CacheKey`` to remove.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache_key`` not a ``CacheKey``.
            LLMException: ``LLM_PARAM_INVALID`` (not PROMPT).
        """
        self._check_role("[remove_cache_key]", LLMRole.PROMPT)
        v.check_isinstance("cache_key", cache_key, [CacheKey], allow_none=False)
        self._remove_key_rpc("remove_cache_key", cache_key)

    # ---- pulls (DECODER) -----------------------------------------------------------------------

    def _transfer_checked(self, func: str, req: TransferFrame) -> None:
        v.raise_if_true(req.key[0] == self._owner.cluster_id, "cannot pull from this node's own cluster id")
        # v1: "not concurrent with itself ... on the same link" (LLM_LINK_BUSY)
        self._transfer(func, req._replace(exclusive=True))

    def pull_cache(self, cache_key: Union[CacheKey, CacheKeyByIdAndIndex], kv_cache: KvCache, batch_index: int = 0,
                   size: int = -1, **kwargs: Any) -> None:
        """Pull one batch slot of the prompt's cache into ``kv_cache`` (DECODER only).

        Args:
            cache_key: the remote slot: a ``CacheKey`` or a ``CacheKeyByIdAndIndex``.
            kv_cache: the local contiguous ``KvCache``.
            batch_index: the local slot (uint32).
            size: bytes per tensor, -1 for the whole slot (after ``dst_cache_offset``).
            **kwargs: ``src_layer_range``, ``dst_layer_range``, ``tensor_num_per_layer``, and ``src_cache_offset`` /
                ``dst_cache_offset`` (bytes, >= 0).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not DECODER, arguments the checks refuse, this node's own cluster id, a
                HOST cache), ``LLM_NOT_YET_LINK`` (no link to the key's cluster), ``LLM_KV_CACHE_NOT_EXIST`` (the peer
                has no such key, cache or blocks), ``LLM_LINK_BUSY`` (another pull holds the link: v1 pulls one at a
                time per link), ``LLM_TIMEOUT`` (not done within ``sync_kv_timeout``), ``LLM_LINK_FAILED`` (the link
                broke during the transfer).
        """
        self._check_role("[pull_cache]", LLMRole.DECODER)
        v.check_isinstance("cache_key", cache_key, [CacheKey, CacheKeyByIdAndIndex], allow_none=False)
        v.check_isinstance("kv_cache", kv_cache, [KvCache], allow_none=False)
        v.raise_if_true(self._is_cpu_cache(kv_cache), "Only support device cache")
        v.check_int64("size", size)
        v.check_uint32("batch_index", batch_index)
        v.raise_if_false(size == -1 or size > 0,
                         "[pull_cache] param check failed, size ({0}) is invalid, should be = -1 or > 0", size)
        src_off = v.check_positive_or_set_default("src_cache_offset", kwargs.get("src_cache_offset"))
        dst_off = v.check_positive_or_set_default("dst_cache_offset", kwargs.get("dst_cache_offset"))
        if isinstance(cache_key, CacheKey):
            self.check_cache_key(cache_key)
        v.raise_if_true(bool(getattr(kv_cache.cache_desc, "_is_blocks", False)),
                        "pull_cache needs a contiguous cache; use pull_blocks")
        src, dst, per = layer_kwargs(kwargs, extra=("src_cache_offset", "dst_cache_offset"))
        req = self._request(PULL, KIND_CACHE, cache_key, kv_cache.cache_id, [], [], batch_index, size, src, dst, per,
                            src_off if src_off >= 0 else None, dst_off if dst_off >= 0 else None)
        self._transfer_checked("pull_cache", req)

    def pull_blocks(self, prompt_cache_key: BlocksCacheKey, decoder_kv_cache: KvCache, prompt_blocks: List[int],
                    decoder_blocks: List[int], **kwargs: Any) -> None:
        """Pull blocks of the prompt's blocks cache into blocks of ``decoder_kv_cache`` (DECODER only).

        Args:
            prompt_cache_key: the remote cache, a ``BlocksCacheKey``.
            decoder_kv_cache: the local blocks ``KvCache``.
            prompt_blocks: the remote blocks, non-empty; ``prompt_blocks[i]`` goes to ``decoder_blocks[i]``.
            decoder_blocks: the local blocks, as many.
            **kwargs: ``src_layer_range``, ``dst_layer_range``, ``tensor_num_per_layer``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not DECODER, arguments the checks refuse, this node's own cluster id, a
                HOST cache), ``LLM_NOT_YET_LINK`` (no link to the key's cluster), ``LLM_KV_CACHE_NOT_EXIST`` (the peer
                has no such key, cache or blocks), ``LLM_LINK_BUSY`` (another pull holds the link: v1 pulls one at a
                time per link), ``LLM_TIMEOUT`` (not done within ``sync_kv_timeout``), ``LLM_LINK_FAILED`` (the link
                broke during the transfer).
        """
        self._check_role("[pull_blocks]", LLMRole.DECODER)
        v.check_isinstance("prompt_cache_key", prompt_cache_key, [BlocksCacheKey], allow_none=False)
        v.check_isinstance("decoder_kv_cache", decoder_kv_cache, [KvCache], allow_none=False)
        v.check_isinstance("prompt_blocks", prompt_blocks, [list], inner_class=int, allow_none=False)
        v.check_isinstance("decoder_blocks", decoder_blocks, [list], inner_class=int, allow_none=False)
        v.raise_if_true(self._is_cpu_cache(decoder_kv_cache), "Only support device cache")
        v.raise_if_false(len(prompt_blocks) > 0, "prompt_blocks can not be empty.")
        v.raise_if_false(len(decoder_blocks) > 0, "decoder_blocks can not be empty.")
        v.raise_if_false(len(prompt_blocks) == len(decoder_blocks),
                         "Param prompt_blocks and decoder_blocks size should be same.")
        v.check_list_uint64("prompt_blocks", prompt_blocks)
        v.check_list_uint64("decoder_blocks", decoder_blocks)
        v.raise_if_false(bool(getattr(decoder_kv_cache.cache_desc, "_is_blocks", False)),
                         "pull_blocks needs a blocks cache (allocate_blocks_cache)")
        src, dst, per = layer_kwargs(kwargs)
        self._transfer_checked("pull_blocks", self._request(
            PULL, KIND_BLOCKS, prompt_cache_key, decoder_kv_cache.cache_id, prompt_blocks, decoder_blocks,
            0, -1, src, dst, per))

    # ---- local copies --------------------------------------------------------------------------

    def copy_cache(self, dst: KvCache, src: KvCache, dst_batch_index: int = 0, src_batch_index: int = 0,
                   offset: int = 0, size: int = -1, req_id: Optional[int] = None) -> None:
        """Copy one batch slot of ``src`` into one of ``dst``, per tensor (a local copy).

        Args:
            dst: the destination ``KvCache`` (destination first).
            src: the source ``KvCache``.
            dst_batch_index: the slot of ``dst`` (uint32).
            src_batch_index: the slot of ``src`` (uint32).
            offset: bytes into each slot (uint64).
            size: bytes per tensor, -1 for the rest of the slot.
            req_id: only logged.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (a HOST cache, a size or slot out of range),
                ``LLM_KV_CACHE_NOT_EXIST`` (a cache this engine does not have).
        """
        v.check_isinstance("dst", dst, [KvCache], allow_none=False)
        v.raise_if_true(self._is_cpu_cache(dst), "Only support device cache")
        v.check_isinstance("src", src, [KvCache], allow_none=False)
        v.raise_if_true(self._is_cpu_cache(src), "Only support device cache")
        v.check_uint32("dst_batch_index", dst_batch_index)
        v.check_uint32("src_batch_index", src_batch_index)
        v.check_uint64("offset", offset)
        v.check_int64("size", size)
        v.raise_if_false(size == -1 or size > 0,
                         "[copy_cache] param check failed, size ({0}) is invalid, should be = -1 or > 0", size)
        v.check_isinstance("req_id", req_id, [int])
        self._copy_cache_rpc("copy_cache", dst.cache_id, src.cache_id, dst_batch_index, src_batch_index, offset,
                             size)

    def copy_blocks(self, cache: KvCache, copy_block_info: Dict[int, List[int]]) -> None:
        """Copy blocks within one blocks cache, for every tensor.

        Args:
            cache: the blocks ``KvCache``.
            copy_block_info: source block -> the destination blocks it is copied to.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``cache`` not a ``KvCache``, ``copy_block_info`` not a ``dict[int, list[int]]``.
            LLMException: ``LLM_PARAM_INVALID`` (a HOST cache, a block out of range).
        """
        v.check_isinstance("cache", cache, [KvCache], allow_none=False)
        v.check_dict("copy_block_info", copy_block_info, int, list, int, allow_none=False)
        v.raise_if_true(self._is_cpu_cache(cache), "Only support device cache")
        self._copy_blocks_rpc("copy_blocks", cache.cache_id, copy_block_info)

    def get_cache_tensors(self, cache: KvCache, tensor_index: int = 0) -> List[Any]:
        """Host copies of tensor ``tensor_index``: one ``Tensor`` per device (one device here); NPU
        memory (daemon backend ``acl``) is copied by ``aclrtMemcpy``.

        Args:
            cache: the ``KvCache``.
            tensor_index: which tensor, in ``[0, num_tensors)``.

        Returns:
            A list with one ``Tensor`` per device.

        Raises:
            TypeError, ValueError: ``cache`` not a ``KvCache``, ``tensor_index`` not an int32.
            LLMException: ``LLM_PARAM_INVALID`` (``tensor_index`` out of range), ``LLM_KV_CACHE_NOT_EXIST`` (the cache
                was deallocated).
        """
        from ._cache_ops import device_to_host
        from ._memory import numpy_view
        from .data_type import dtype_to_np_dtype
        from .tensor import Tensor, TensorDesc

        v.check_isinstance("cache", cache, [KvCache], allow_none=False)
        v.check_int32("tensor_index", tensor_index)
        v.raise_if_false(0 <= tensor_index < cache.cache_desc.num_tensors,
                         "[get_cache_tensors] param check failed, tensor_index ({0}) out of range, [0, {1})",
                         tensor_index, cache.cache_desc.num_tensors)
        v.raise_if_false(len(cache.per_device_tensor_addrs) > 0, "the cache was deallocated",
                         status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        desc = cache.cache_desc
        shape, dtype = tuple(desc.shape), dtype_to_np_dtype(desc.data_type)
        npu = self._in_npu_memory(desc.placement)
        out = []
        for addrs in cache.per_device_tensor_addrs:
            arr = device_to_host(addrs[tensor_index], shape, dtype, "get_cache_tensors", self._owner._device_id) \
                if npu else \
                numpy_view(addrs[tensor_index], shape, dtype).copy()
            out.append(Tensor(arr, TensorDesc(desc.data_type, list(desc.shape))))
        return out

    def swap_blocks(self, src: KvCache, dst: KvCache, src_to_dst: Dict[int, int]) -> None:
        """Copy blocks between a host and a device blocks cache (swap in or out).

        Args:
            src: the source ``KvCache`` (one of the two usually from ``KvCache.create_cpu_cache``).
            dst: the destination ``KvCache``.
            src_to_dst: source block -> destination block.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: a cache not a ``KvCache``, ``src_to_dst`` not a ``dict[int, int]``.
            LLMException: ``LLM_PARAM_INVALID`` (host to host or device to device, block sizes or tensor counts that
                differ, a block out of range).
        """
        v.check_isinstance("src", src, [KvCache], allow_none=False)
        v.check_isinstance("dst", dst, [KvCache], allow_none=False)
        v.check_dict("src_to_dst", src_to_dst, int, int, allow_none=False)
        sdesc, ddesc = src.cache_desc, dst.cache_desc
        v.raise_if_false(sdesc.size // sdesc.batch_size == ddesc.size // ddesc.batch_size,
                         f"src block size:{sdesc.size // sdesc.batch_size} and dst block size:"
                         f"{ddesc.size // ddesc.batch_size} must be equal")
        v.raise_if_false(sdesc.num_tensors == ddesc.num_tensors,
                         f"src num_tensors:{sdesc.num_tensors} and dst num_tensors:{ddesc.num_tensors} must be equal")
        for s, d in src_to_dst.items():
            v.raise_if_false(0 <= s < sdesc.batch_size, f"src_block_index:{s} must be in [0, {sdesc.batch_size})")
            v.raise_if_false(0 <= d < ddesc.batch_size, f"dst_block_index:{d} must be in [0, {ddesc.batch_size})")
        swap_in = sdesc.placement == Placement.HOST and ddesc.placement == Placement.DEVICE
        swap_out = sdesc.placement == Placement.DEVICE and ddesc.placement == Placement.HOST
        v.raise_if_false(swap_in or swap_out,
                         f"swap src placement:{sdesc.placement} to dst placement:{ddesc.placement} is not support")
        # v1 swaps by addresses (CANN passes per_device_tensor_addrs): rows are blocks on both sides
        self._swap_rpc("swap_blocks", (_operand_id(src), sdesc, src.per_device_tensor_addrs[0]),
                       (_operand_id(dst), ddesc, dst.per_device_tensor_addrs[0]), src_to_dst)

    # ---- layer-wise push (PROMPT) --------------------------------------------------------------

    def transfer_cache_async(self, src_cache: KvCache, layer_synchronizer: LayerSynchronizer,
                             transfer_configs: Union[List[TransferConfig], Tuple[TransferConfig, ...]],
                             src_block_indices: Optional[Union[List[int], Tuple[int, ...]]] = None,
                             dst_block_indices: Optional[Union[List[int], Tuple[int, ...]]] = None,
                             dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Push ``src_cache`` layer by layer while the model computes (PROMPT only).

        Args:
            src_cache: the local ``KvCache`` (DEVICE placement).
            layer_synchronizer: says when each layer is computed (False aborts).
            transfer_configs: a ``TransferConfig`` (raw remote addresses) per target.
            src_block_indices: blocks of a blocks ``src_cache`` to send (then ``dst_block_indices`` too, same length).
            dst_block_indices: the remote blocks they go to.
            dst_block_memory_size: bytes of one remote block, for a contiguous source into remote blocks.

        Returns:
            A ``CacheTask`` (``LLM_WAIT_PROCESS_TIMEOUT`` when asked before the task ended).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not PROMPT, HOST placement, configs or block lists that do not
                match). Transfer failures go to the task's results, not raised.
        """
        self._check_role("[transfer_cache_async]", LLMRole.PROMPT)
        v.check_isinstance("src_cache", src_cache, [KvCache], allow_none=False)
        v.raise_if_true(self._is_cpu_cache(src_cache), "src cache not support placement HOST")
        return self._transfer_async(src_cache.cache_id, src_cache.cache_desc, layer_synchronizer, transfer_configs,
                                    src_block_indices, dst_block_indices, dst_block_memory_size,
                                    LLMStatusCode.LLM_WAIT_PROCESS_TIMEOUT, remote_cache_accessible=False, v1=True)


def _operand_id(cache: KvCache) -> int:
    """A daemon-owned KvCache is addressed by id; its (blocks) view must match, else by its addresses."""
    if cache.cache_id >= 0 and getattr(cache.cache_desc, "_is_blocks", False):
        return cache.cache_id
    return -1
