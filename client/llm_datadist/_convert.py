"""Private: client types -> the daemon's protobuf messages and the fields of a pull/push frame, in one place
(``_cache_ops``, ``_layerwise`` and the managers build their requests from these; nothing here imports them back)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

from datadist import fastframe
from datadist.v1 import common_pb2, datadist_pb2

from .llm_types import BlocksCacheKey, CacheDesc, CacheKey, CacheKeyByIdAndIndex

__all__ = ["desc_pb", "cache_key_pb", "blocks_key_pb", "any_key_pb", "range_pb", "frame_key", "transfer_pb"]


def desc_pb(desc: CacheDesc) -> common_pb2.CacheDesc:
    return common_pb2.CacheDesc(num_tensors=desc.num_tensors, shape=list(desc.shape), data_type=desc.data_type.value,
                                placement=int(desc.placement))


def cache_key_pb(key: CacheKey) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=key.cluster_id, req_id=key.req_id, model_id=key.model_id,
                               prefix_id=key.prefix_id)


def blocks_key_pb(key: BlocksCacheKey) -> common_pb2.BlocksCacheKey:
    return common_pb2.BlocksCacheKey(cluster_id=key.cluster_id, model_id=key.model_id)


def any_key_pb(key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey]) -> common_pb2.AnyKey:
    if isinstance(key, CacheKey):
        return common_pb2.AnyKey(cache_key=cache_key_pb(key))
    if isinstance(key, CacheKeyByIdAndIndex):
        return common_pb2.AnyKey(by_id=common_pb2.CacheKeyByIdAndIndex(
            cluster_id=key.cluster_id, cache_id=key.cache_id, batch_index=key.batch_index))
    return common_pb2.AnyKey(blocks_key=blocks_key_pb(key))


def range_pb(value: Optional[range]) -> Optional[common_pb2.LayerRange]:
    return None if value is None else common_pb2.LayerRange(start=value.start, stop=value.stop)


AnyKey = Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey]


def frame_key(key: AnyKey) -> Tuple[int, Tuple[int, int, int, int]]:
    """``(key kind, fields)`` of a pull/push frame (``datadist.fastframe``); the keys' fields read directly (no
    property call: a pull's hot path)."""
    if isinstance(key, CacheKey):
        return fastframe.KEY_CACHE, (key._cluster_id, key._req_id, key._model_id, key._prefix_id)
    if isinstance(key, CacheKeyByIdAndIndex):
        return fastframe.KEY_BY_ID, (key._cluster_id, key._cache_id, key._batch_index, 0)
    return fastframe.KEY_BLOCKS, (key._cluster_id, key._model_id, 0, 0)


def _frame_key_pb(kind: int, fields: Tuple[int, int, int, int]) -> common_pb2.AnyKey:
    cluster, a, b, c = fields
    if kind == fastframe.KEY_CACHE:
        return common_pb2.AnyKey(cache_key=common_pb2.CacheKey(cluster_id=cluster, req_id=a, model_id=b, prefix_id=c))
    if kind == fastframe.KEY_BY_ID:
        return common_pb2.AnyKey(by_id=common_pb2.CacheKeyByIdAndIndex(cluster_id=cluster, cache_id=a, batch_index=b))
    return common_pb2.AnyKey(blocks_key=common_pb2.BlocksCacheKey(cluster_id=cluster, model_id=a))


def transfer_pb(f: fastframe.TransferFrame) -> datadist_pb2.TransferRequest:
    """The same pull/push as a protobuf ``TransferRequest``: the gRPC Pull/Push."""
    req = datadist_pb2.TransferRequest(engine_id=f.engine_id, kind=f.kind, remote=_frame_key_pb(f.key_kind, f.key),
                                       local_cache_id=f.local_cache_id, remote_blocks=list(f.remote_blocks),
                                       local_blocks=list(f.local_blocks), local_batch_index=f.local_batch_index,
                                       size=f.size, tensor_num_per_layer=f.tensor_num_per_layer,
                                       exclusive=f.exclusive)
    if f.src_layers is not None:
        req.src_layer_range.CopyFrom(common_pb2.LayerRange(start=f.src_layers[0], stop=f.src_layers[1]))
    if f.dst_layers is not None:
        req.dst_layer_range.CopyFrom(common_pb2.LayerRange(start=f.dst_layers[0], stop=f.dst_layers[1]))
    if f.timeout_ms is not None:
        req.timeout_ms = f.timeout_ms
    if f.src_offset is not None:
        req.src_cache_offset = f.src_offset
    if f.dst_offset is not None:
        req.dst_cache_offset = f.dst_offset
    return req
