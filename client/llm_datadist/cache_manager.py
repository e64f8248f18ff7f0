"""``CacheManager`` (CANN v2 "cache manager mode"), obtained from ``LLMDataDist.cache_manager``.

Validation happens here first, with CANN's exception types (TypeError / ValueError /
LLMException(LLM_PARAM_INVALID)); the daemon validates again and owns every byte.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple, Union

from datadist.v1 import common_pb2, datadist_pb2

from . import _memory
from . import _validate as v
from ._rpc import RPC_MARGIN_S
from .llm_types import (
    BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex, LayerSynchronizer, MemInfo, Memtype, Placement,
    TransferConfig, TransferWithCacheKeyConfig,
)
from .status import LLMException, LLMStatusCode

__all__ = ["CacheManager"]

log = logging.getLogger(__name__)

UINT64_MAX = 2**64 - 1


def _desc_pb(desc: CacheDesc) -> common_pb2.CacheDesc:
    return common_pb2.CacheDesc(num_tensors=desc.num_tensors, shape=list(desc.shape), data_type=desc.data_type.value,
                                placement=int(desc.placement))


def _cache_key_pb(key: CacheKey) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=key.cluster_id, req_id=key.req_id, model_id=key.model_id,
                               prefix_id=key.prefix_id)


def _any_key_pb(key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey]) -> common_pb2.AnyKey:
    if isinstance(key, CacheKey):
        return common_pb2.AnyKey(cache_key=_cache_key_pb(key))
    if isinstance(key, CacheKeyByIdAndIndex):
        return common_pb2.AnyKey(by_id=common_pb2.CacheKeyByIdAndIndex(
            cluster_id=key.cluster_id, cache_id=key.cache_id, batch_index=key.batch_index))
    return common_pb2.AnyKey(blocks_key=common_pb2.BlocksCacheKey(cluster_id=key.cluster_id, model_id=key.model_id))


def _worker_memory(address: int, length: int) -> datadist_pb2.WorkerMemory:
    info = _memory.describe(address, length)
    if info["kind"] == "shared_file":
        return datadist_pb2.WorkerMemory(shared_file=datadist_pb2.SharedFileMemory(
            path=info["path"], file_offset=info["file_offset"], length=length))
    _memory.allow_ptrace()
    return datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(
        pid=info["pid"], address=address, length=length))


def _check_range(name: str, value: Optional[range]) -> None:
    v.check_isinstance(name, value, [range])
    if value is not None:
        v.raise_if_false(value.step == 1, f"{name} step must be 1, got {value.step}")
        v.raise_if_false(0 <= value.start < value.stop, f"{name} must satisfy 0 <= start < stop, got {value}")


def _range_pb(value: Optional[range]) -> Optional[common_pb2.LayerRange]:
    return None if value is None else common_pb2.LayerRange(start=value.start, stop=value.stop)


def _check_blocks(name: str, blocks: Any) -> List[int]:
    v.check_isinstance(name, blocks, [list, tuple])
    out = list(blocks or ())
    for b in out:
        v.check_uint64(f"{name} element", b)
    return out


class CacheManager:
    def __init__(self, owner: Any, options: Dict[str, str]) -> None:
        self._owner = owner
        self._initialized = True
        self._mapper = _memory.Mapper()
        self._enable_remote_cache_accessible = options.get("llm.EnableRemoteCacheAccessible") == "1"
        self._has_pool = {Placement.DEVICE: bool(options.get("llm.MemPoolConfig")),
                          Placement.HOST: bool(options.get("llm.HostMemPoolConfig"))}

    # ---- plumbing ------------------------------------------------------------------------------

    def _finalize(self) -> None:
        self._initialized = False
        self._mapper.unmap_all()

    def _call(self, method: str, request: Any, func_name: str, timeout: Optional[float] = None) -> Any:
        if not self._initialized:
            raise RuntimeError("llm datadist is not initialized")
        return self._owner._call(method, request, func_name, timeout)

    @property
    def _engine_id(self) -> int:
        return self._owner._engine_id

    def _make_cache(self, info: Any, desc: CacheDesc, is_blocks: bool, addrs: Optional[List[int]] = None) -> Cache:
        if addrs is None:
            addrs = [self._mapper.map(t.path, t.file_offset, t.length) for t in info.tensors]
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
        info = self._call("AllocateCache", datadist_pb2.AllocateCacheRequest(
            engine_id=self._engine_id, desc=_desc_pb(cache_desc), is_blocks=False,
            cache_keys=[_cache_key_pb(k) for k in keys]), "allocate_cache")
        return self._make_cache(info, cache_desc, False)

    def allocate_blocks_cache(self, cache_desc: CacheDesc, blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
        self._check_desc(cache_desc)
        v.check_isinstance("blocks_cache_key", blocks_cache_key, [BlocksCacheKey])
        req = datadist_pb2.AllocateCacheRequest(engine_id=self._engine_id, desc=_desc_pb(cache_desc), is_blocks=True)
        if blocks_cache_key is not None:
            req.blocks_key.CopyFrom(common_pb2.BlocksCacheKey(cluster_id=blocks_cache_key.cluster_id,
                                                              model_id=blocks_cache_key.model_id))
        info = self._call("AllocateCache", req, "allocate_blocks_cache")
        return self._make_cache(info, cache_desc, True)

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
        try:
            mem = [_worker_memory(a, cache_desc.size) for a in addrs]
        except ValueError as exc:
            raise LLMException(f"[{func}] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, {exc}.",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        req = datadist_pb2.RegisterCacheRequest(engine_id=self._engine_id, desc=_desc_pb(cache_desc),
                                                is_blocks=is_blocks, tensors=mem,
                                                cache_keys=[_cache_key_pb(k) for k in cache_keys])
        if blocks_key is not None:
            req.blocks_key.CopyFrom(common_pb2.BlocksCacheKey(cluster_id=blocks_key.cluster_id,
                                                              model_id=blocks_key.model_id))
        if remote_accessible is not None:
            req.remote_accessible = remote_accessible
        info = self._call("RegisterCache", req, func)
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
        self._call("DeallocateCache", datadist_pb2.CacheRef(engine_id=self._engine_id, cache_id=cache.cache_id),
                   "deallocate_cache")
        cache.tensor_addrs = []

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.raise_if_false(cache.is_blocks_cache, "deallocate_blocks_cache takes a blocks cache only")
        if cache.cache_id < 0 or getattr(cache, "_is_registered", False):
            return
        self._call("DeallocateCache", datadist_pb2.CacheRef(engine_id=self._engine_id, cache_id=cache.cache_id,
                                                            is_blocks=True), "deallocate_blocks_cache")
        cache.tensor_addrs = []

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        v.check_isinstance("cache_key", cache_key, [CacheKey], allow_none=False)
        self._call("RemoveCacheKey", datadist_pb2.RemoveCacheKeyRequest(engine_id=self._engine_id,
                                                                        cache_key=_cache_key_pb(cache_key)),
                   "remove_cache_key")

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
        self._call("CopyCache", datadist_pb2.CopyCacheRequest(
            engine_id=self._engine_id, dst_cache_id=dst.cache_id, src_cache_id=src.cache_id,
            dst_batch_index=dst_batch_index, src_batch_index=src_batch_index, offset=offset, size=size), "copy_cache")

    def copy_blocks(self, cache: Cache, copy_block_info: Dict[int, List[int]]) -> None:
        v.check_isinstance("cache", cache, [Cache], allow_none=False)
        v.check_isinstance("copy_block_info", copy_block_info, [dict], allow_none=False)
        v.raise_if_false(cache.is_blocks_cache, "copy_blocks needs a blocks cache")
        copies = []
        for src, dsts in copy_block_info.items():
            v.check_uint64("src block", src)
            v.check_isinstance("dst blocks", dsts, [list, tuple], allow_none=False)
            for d in dsts:
                v.check_uint64("dst block", d)
            copies.append(datadist_pb2.BlockCopy(src_block=src, dst_blocks=list(dsts)))
        self._call("CopyBlocks", datadist_pb2.CopyBlocksRequest(engine_id=self._engine_id, cache_id=cache.cache_id,
                                                                copies=copies), "copy_blocks")

    def _operand(self, cache: Cache) -> datadist_pb2.CacheOperand:
        if cache.cache_id >= 0:
            return datadist_pb2.CacheOperand(cache_id=cache.cache_id)
        return datadist_pb2.CacheOperand(cache_id=-1, desc=_desc_pb(cache.cache_desc),
                                         tensors=[_worker_memory(a, cache.cache_desc.size) for a in cache.tensor_addrs])

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        v.check_isinstance("dst_cache", dst_cache, [Cache], allow_none=False)
        v.check_isinstance("src_to_dst", src_to_dst, [dict], allow_none=False)
        for s, d in src_to_dst.items():
            v.check_uint64("src block", s)
            v.check_uint64("dst block", d)
        try:
            src_op, dst_op = self._operand(src_cache), self._operand(dst_cache)
        except ValueError as exc:
            raise LLMException(f"[swap_blocks] failed, error code is {LLMStatusCode.LLM_PARAM_INVALID}, {exc}.",
                               status_code=LLMStatusCode.LLM_PARAM_INVALID) from None
        self._call("SwapBlocks", datadist_pb2.SwapBlocksRequest(engine_id=self._engine_id, src=src_op, dst=dst_op,
                                                                src_to_dst=dict(src_to_dst)), "swap_blocks")

    # ---- transfers -----------------------------------------------------------------------------

    def _transfer(self, method: str, func: str, req: datadist_pb2.TransferRequest) -> None:
        timeout_s = self._owner._sync_kv_timeout_s
        self._call(method, req, func, timeout_s + RPC_MARGIN_S)

    @staticmethod
    def _layer_kwargs(kwargs: Dict[str, Any]) -> Tuple[Optional[range], Optional[range], int]:
        unknown = set(kwargs) - {"src_layer_range", "dst_layer_range", "tensor_num_per_layer"}
        v.raise_if_true(bool(unknown), f"unsupported kwargs: {sorted(unknown)}")
        src = kwargs.get("src_layer_range")
        dst = kwargs.get("dst_layer_range")
        per = kwargs.get("tensor_num_per_layer", 2)
        _check_range("src_layer_range", src)
        _check_range("dst_layer_range", dst)
        v.check_uint32("tensor_num_per_layer", per)
        v.raise_if_false(per > 0, "tensor_num_per_layer must be > 0")
        if src is not None and dst is not None:
            v.raise_if_false(len(src) == len(dst), f"src_layer_range {src} and dst_layer_range {dst} differ in length")
        return src, dst, per

    def _request(self, kind: int, remote: Any, local: Cache, remote_blocks: List[int], local_blocks: List[int],
                 batch_index: int, size: int, src: Optional[range], dst: Optional[range],
                 per: int) -> datadist_pb2.TransferRequest:
        req = datadist_pb2.TransferRequest(engine_id=self._engine_id, kind=kind, remote=_any_key_pb(remote),
                                           local_cache_id=local.cache_id, remote_blocks=remote_blocks,
                                           local_blocks=local_blocks, local_batch_index=batch_index, size=size,
                                           tensor_num_per_layer=per)
        if src is not None:
            req.src_layer_range.CopyFrom(_range_pb(src))
        if dst is not None:
            req.dst_layer_range.CopyFrom(_range_pb(dst))
        return req

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
        self._transfer("Pull", "pull_cache", self._request(
            datadist_pb2.TRANSFER_CACHE, cache_key, cache, [], [], batch_index, size, src, dst, per))

    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey], dst_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int, ...], List[int]]] = (),
                    dst_blocks: Union[Tuple[int, ...], List[int]] = (), **kwargs: Any) -> None:
        v.check_isinstance("src_cache_key", src_cache_key, [CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey],
                           allow_none=False)
        v.check_isinstance("dst_cache", dst_cache, [Cache], allow_none=False)
        src_list = _check_blocks("src_blocks", src_blocks)
        dst_list = _check_blocks("dst_blocks", dst_blocks)
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
        self._transfer("Pull", "pull_blocks", self._request(
            datadist_pb2.TRANSFER_BLOCKS, src_cache_key, dst_cache, src_list, dst_list, 0, -1, src, dst, per))

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
        self._transfer("Push", "push_cache", self._request(
            datadist_pb2.TRANSFER_CACHE, dst_cache_key, src_cache, [], [], src_batch_index, -1, src, dst, per))

    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: Optional[Union[Tuple[int, ...], List[int]]] = (),
                    dst_blocks: Union[Tuple[int, ...], List[int]] = (), src_layer_range: range = None,
                    dst_layer_range: range = None, tensor_num_per_layer: int = 2) -> None:
        v.raise_if_false(self._enable_remote_cache_accessible, "push_blocks requires enable_remote_cache_accessible")
        v.check_isinstance("dst_cache_key", dst_cache_key, [BlocksCacheKey], allow_none=False)
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        src_list = _check_blocks("src_blocks", src_blocks)
        dst_list = _check_blocks("dst_blocks", dst_blocks)
        v.raise_if_false(src_cache.is_blocks_cache, "push_blocks needs a blocks source cache")
        v.raise_if_false(len(dst_list) > 0, "dst_blocks must not be empty")
        v.raise_if_false(len(src_list) == len(dst_list), "src_blocks and dst_blocks must have the same length")
        src, dst, per = self._layer_kwargs({"src_layer_range": src_layer_range, "dst_layer_range": dst_layer_range,
                                            "tensor_num_per_layer": tensor_num_per_layer})
        self._transfer("Push", "push_blocks", self._request(
            datadist_pb2.TRANSFER_BLOCKS, dst_cache_key, src_cache, dst_list, src_list, 0, -1, src, dst, per))

    def transfer_cache_async(self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
                             transfer_configs: Union[List[Union[TransferConfig, TransferWithCacheKeyConfig]],
                                                     Tuple[Union[TransferConfig, TransferWithCacheKeyConfig], ...]],
                             src_block_indices: Optional[Union[List[int], Tuple[int, ...]]] = None,
                             dst_block_indices: Optional[Union[List[int], Tuple[int, ...]]] = None,
                             dst_block_memory_size: Optional[int] = None) -> Any:
        v.check_isinstance("src_cache", src_cache, [Cache], allow_none=False)
        v.check_isinstance("layer_synchronizer", layer_synchronizer, [LayerSynchronizer], allow_none=False)
        v.check_isinstance("transfer_configs", transfer_configs, [list, tuple], allow_none=False)
        raise LLMException("[transfer_cache_async] failed, error code is LLMStatusCode.LLM_FEATURE_NOT_ENABLED, "
                           "layer-wise asynchronous transfer is not implemented by datadist yet.",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """Reserved by CANN for UCE recovery of device memory; host memory never needs remapping."""
        items = mem_infos if isinstance(mem_infos, list) else [mem_infos]
        for info in items:
            v.check_isinstance("mem_info", info, [MemInfo], allow_none=False)
            v.raise_if_false(info.mem_type == Memtype.MEM_TYPE_DEVICE, "remap_registered_memory supports DEVICE only")
            v.raise_if_false(info.addr != 0 and info.size > 0, "mem_info needs addr != 0 and size > 0")
