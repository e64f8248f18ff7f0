"""Pure conversions between protobuf messages and domain records (no I/O, no state)."""

from __future__ import annotations

from datadist.v1 import common_pb2, datadist_pb2, peer_pb2

from ...core.errors import DataDistError, StatusCode, require
from ...core.plan import AddrRef, LayerTarget, TransferKind, TransferOrder
from ...core.types import (
    UINT64_MAX,
    BlocksKeyRef,
    CacheDesc,
    CacheKeyRef,
    DType,
    IdIndexRef,
    KeyKind,
    KeyRef,
    OwnerKey,
    Placement,
    Role,
)
from ...engine.extents import ExtentOrder, parse_extents
from ...links import ClusterSpec
from ...links.wire.peering import HandshakeAnswer, HandshakeOffer
from ..orders import blocks as _blocks
from ..orders import enum_of as _enum
from ..orders import layer_range


def desc_from_pb(msg: common_pb2.CacheDesc) -> CacheDesc:
    return CacheDesc(int(msg.num_tensors), tuple(int(d) for d in msg.shape),
                     _enum(DType, msg.data_type, "data_type"), _enum(Placement, msg.placement, "placement"))


def desc_to_pb(desc: CacheDesc) -> common_pb2.CacheDesc:
    return common_pb2.CacheDesc(num_tensors=desc.num_tensors, shape=list(desc.shape), data_type=int(desc.dtype),
                                placement=int(desc.placement))


def role_from_pb(value: int) -> Role:
    require(value != 0, "role is required (ROLE_PROMPT, ROLE_DECODER or ROLE_MIX)")
    return _enum(Role, value, "role")


def cache_key_from_pb(msg: common_pb2.CacheKey) -> CacheKeyRef:
    return CacheKeyRef(msg.cluster_id, msg.req_id, msg.model_id, msg.prefix_id)


def cache_key_to_pb(key: CacheKeyRef) -> common_pb2.CacheKey:
    return common_pb2.CacheKey(cluster_id=key.cluster_id, req_id=key.req_id, model_id=key.model_id,
                               prefix_id=key.prefix_id)


def key_from_pb(msg: common_pb2.AnyKey) -> KeyRef:
    which = msg.WhichOneof("key")
    if which == "cache_key":
        return cache_key_from_pb(msg.cache_key)
    if which == "by_id":
        return IdIndexRef(msg.by_id.cluster_id, msg.by_id.cache_id, msg.by_id.batch_index)
    if which == "blocks_key":
        return BlocksKeyRef(msg.blocks_key.cluster_id, msg.blocks_key.model_id)
    if which == "address":
        require(msg.address.addr != 0, "a raw address must not be 0")
        return AddrRef(msg.address.cluster_id, msg.address.addr, msg.address.block_size)  # type: ignore[return-value]
    raise DataDistError(StatusCode.LLM_PARAM_INVALID, "a cache key is required")


def key_to_pb(key: KeyRef | AddrRef) -> common_pb2.AnyKey:
    if isinstance(key, AddrRef):
        return common_pb2.AnyKey(address=common_pb2.WorkerAddress(cluster_id=key.cluster_id, addr=key.addr,
                                                                  block_size=key.block_size))
    if isinstance(key, CacheKeyRef):
        return common_pb2.AnyKey(cache_key=cache_key_to_pb(key))
    if isinstance(key, IdIndexRef):
        return common_pb2.AnyKey(by_id=common_pb2.CacheKeyByIdAndIndex(
            cluster_id=key.cluster_id, cache_id=key.cache_id, batch_index=key.batch_index))
    return common_pb2.AnyKey(blocks_key=common_pb2.BlocksCacheKey(cluster_id=key.cluster_id, model_id=key.model_id))


def owner_key_to_pb(key: OwnerKey, cluster_id: int) -> common_pb2.AnyKey:
    if key.kind == KeyKind.BLOCKS:
        return key_to_pb(BlocksKeyRef(cluster_id, key.model_id))
    if key.kind == KeyKind.PREFIX:
        return key_to_pb(CacheKeyRef(cluster_id, UINT64_MAX, key.model_id, key.ident))
    return key_to_pb(CacheKeyRef(cluster_id, key.ident, key.model_id, UINT64_MAX))


def _range(msg: common_pb2.LayerRange, present: bool) -> tuple[int, int] | None:
    return layer_range(int(msg.start), int(msg.stop)) if present else None


def order_from_pb(msg: datadist_pb2.TransferRequest) -> TransferOrder:
    return TransferOrder(
        kind=_enum(TransferKind, msg.kind, "kind"),
        remote=key_from_pb(msg.remote),
        local_cache_id=msg.local_cache_id,
        remote_blocks=_blocks(msg.remote_blocks, "remote_blocks"),
        local_blocks=_blocks(msg.local_blocks, "local_blocks"),
        local_batch_index=msg.local_batch_index,
        size=msg.size,
        src_layers=_range(msg.src_layer_range, msg.HasField("src_layer_range")),
        dst_layers=_range(msg.dst_layer_range, msg.HasField("dst_layer_range")),
        tensor_num_per_layer=msg.tensor_num_per_layer or 2,
        timeout_ms=msg.timeout_ms if msg.HasField("timeout_ms") else None,
        src_offset=msg.src_cache_offset if msg.HasField("src_cache_offset") else 0,
        dst_offset=msg.dst_cache_offset if msg.HasField("dst_cache_offset") else 0,
        exclusive=msg.exclusive,
    )


def layer_target_from_pb(msg: datadist_pb2.LayerTransferTarget) -> LayerTarget:
    src = _range(msg.src_layer_range, True)
    assert src is not None
    key = key_from_pb(msg.cache_key) if msg.HasField("cache_key") else None
    require(key is None or not msg.dst_addrs, "a transfer config has either a cache key or dst_addrs")
    return LayerTarget(dst_cluster=msg.dst_cluster_id, src_layers=src, key=key,
                       dst_addrs=_blocks(msg.dst_addrs, "dst_addrs"),
                       dst_layers=_range(msg.dst_layer_range, msg.HasField("dst_layer_range")),
                       src_batch_index=msg.src_batch_index)


def cluster_from_pb(msg: datadist_pb2.ClusterLink) -> ClusterSpec:
    remote = msg.remote_ip_info[0] if msg.remote_ip_info else None
    local = msg.local_ip_info[0] if msg.local_ip_info else None
    return ClusterSpec(msg.remote_cluster_id, remote.ip if remote else "", remote.port if remote else 0,
                       local.ip if local else "")


# ---- Peer service --------------------------------------------------------------------------------

def offer_to_pb(offer: HandshakeOffer) -> peer_pb2.HandshakeRequest:
    return peer_pb2.HandshakeRequest(protocol_version=offer.protocol_version,
                                     client_cluster_id=offer.client_cluster_id,
                                     server_cluster_id=offer.server_cluster_id, challenge=offer.challenge,
                                     timestamp_ms=offer.timestamp_ms, mac=offer.mac,
                                     client_version=offer.client_version, daemon_id=offer.daemon_id)


def offer_from_pb(msg: peer_pb2.HandshakeRequest) -> HandshakeOffer:
    return HandshakeOffer(msg.protocol_version, msg.client_cluster_id, msg.server_cluster_id, msg.challenge,
                          msg.timestamp_ms, msg.mac, msg.client_version, msg.daemon_id)


def answer_to_pb(answer: HandshakeAnswer) -> peer_pb2.HandshakeResponse:
    return peer_pb2.HandshakeResponse(protocol_version=answer.protocol_version,
                                      server_cluster_id=answer.server_cluster_id, link_nonce=answer.link_nonce,
                                      data_endpoint=answer.data_endpoint, streams=answer.streams, mac=answer.mac,
                                      server_version=answer.server_version, daemon_id=answer.daemon_id)


def answer_from_pb(msg: peer_pb2.HandshakeResponse) -> HandshakeAnswer:
    return HandshakeAnswer(msg.protocol_version, msg.server_cluster_id, msg.link_nonce, msg.data_endpoint, msg.streams,
                           msg.mac, msg.server_version, msg.daemon_id)


def extents_from_pb(msg: datadist_pb2.ExtentTransferRequest) -> ExtentOrder:
    """HIXL's ``TransferExtents`` as the daemon's order (``engine.extents``: every bound checked there)."""
    return ExtentOrder(msg.remote_cluster_id, msg.write, parse_extents(msg.extents),
                       msg.timeout_ms if msg.HasField("timeout_ms") else None)
