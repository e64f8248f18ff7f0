"""Private: client types -> the daemon's protobuf messages, in one place (``_cache_ops``, ``_layerwise`` and
the managers build their requests from these; nothing here imports them back)."""

from __future__ import annotations

from typing import Optional, Union

from datadist.v1 import common_pb2

from .llm_types import BlocksCacheKey, CacheDesc, CacheKey, CacheKeyByIdAndIndex

__all__ = ["desc_pb", "cache_key_pb", "blocks_key_pb", "any_key_pb", "range_pb"]


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
