"""Turn a pull/push order into the requester's local byte spans and the ``RemoteSpec`` for the owner.

Both sides list their bytes in the same logical order (tensor by tensor in index order, and
within a tensor block by block in list order); the byte stream is the concatenation, so each
side merges adjacent blocks into runs independently. The owner checks ``expected_bytes``
against its own arithmetic before any byte moves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import DataDistError, StatusCode, require
from .layout import Span, block_spans, layer_range_to_tensor_indices, slot_spans, total_length
from .types import BlocksKeyRef, CacheDesc, CacheKeyRef, IdIndexRef, KeyRef, ReadMode, RemoteSpec

__all__ = ["TransferKind", "TransferOrder", "Plan", "plan_pull", "plan_push"]


class TransferKind(enum.IntEnum):
    CACHE = 0    # pull_cache / push_cache
    BLOCKS = 1   # pull_blocks / push_blocks


@dataclass(frozen=True)
class TransferOrder:
    kind: TransferKind
    remote: KeyRef
    local_cache_id: int
    remote_blocks: tuple[int, ...] = ()
    local_blocks: tuple[int, ...] = ()
    local_batch_index: int = 0
    size: int = -1
    src_layers: tuple[int, int] | None = None
    dst_layers: tuple[int, int] | None = None
    tensor_num_per_layer: int = 2
    timeout_ms: int | None = None


@dataclass(frozen=True)
class Plan:
    local_spans: list[Span]
    remote: RemoteSpec
    nbytes: int
    local_tensors: tuple[int, ...]


def _indices(layers: tuple[int, int] | None, per_layer: int, num_tensors: int) -> tuple[int, ...]:
    start, stop = layers if layers is not None else (None, None)
    return tuple(layer_range_to_tensor_indices(start, stop, per_layer, num_tensors))


def _remote_tensors(layers: tuple[int, int] | None, per_layer: int, local_count: int,
                    local_given: bool) -> tuple[int, int]:
    """(tensor_start, tensor_count) on the owner; count 0 = all of its tensors."""
    if layers is None:
        return 0, (local_count if local_given else 0)
    start, stop = layers
    require(per_layer >= 1, f"tensor_num_per_layer must be >= 1, got {per_layer}")
    require(0 <= start < stop, f"layer range must satisfy 0 <= start < stop, got range({start}, {stop})")
    count = (stop - start) * per_layer
    require(count == local_count,
            f"layer ranges differ in length: remote {stop - start} layers ({count} tensors), "
            f"local {local_count} tensors")
    return start * per_layer, count


def _check_remote(order: TransferOrder, own_cluster: int, verb: str) -> None:
    require(order.remote.cluster_id != own_cluster,
            f"cannot {verb} cluster {own_cluster}: that is this engine's own cluster id")


def plan_pull(order: TransferOrder, dst: CacheDesc, dst_is_blocks: bool, own_cluster: int) -> Plan:
    """Local destination ``dst``; remote source named by ``order.remote`` (src ranges are remote)."""
    _check_remote(order, own_cluster, "pull from")
    per = order.tensor_num_per_layer
    local = _indices(order.dst_layers, per, dst.num_tensors)
    t_start, t_count = _remote_tensors(order.src_layers, per, len(local), order.dst_layers is not None)
    if order.kind == TransferKind.CACHE:
        require(not dst_is_blocks, "pull_cache needs a contiguous destination cache; use pull_blocks")
        require(not isinstance(order.remote, BlocksKeyRef), "pull_cache takes a CacheKey or CacheKeyByIdAndIndex")
        size = dst.row_size if order.size == -1 else order.size
        require(order.size == -1 or 0 < order.size <= dst.row_size,
                f"size {order.size} must be -1 or in (0, {dst.row_size}]")
        spans = slot_spans(dst, local, order.local_batch_index, size)
        mode, blocks = ReadMode.SLOT, ()
    else:
        require(dst_is_blocks, "pull_blocks needs a blocks destination cache")
        require(len(order.local_blocks) > 0, "dst_blocks must not be empty")
        spans = block_spans(dst, local, order.local_blocks)
        if isinstance(order.remote, BlocksKeyRef):
            require(len(order.remote_blocks) > 0, "src_blocks must not be empty with a BlocksCacheKey")
            require(len(order.remote_blocks) == len(order.local_blocks),
                    f"src_blocks ({len(order.remote_blocks)}) and dst_blocks ({len(order.local_blocks)}) "
                    f"differ in length")
            mode, blocks, size = ReadMode.BLOCKS, tuple(order.remote_blocks), -1
        else:
            require(len(order.remote_blocks) == 0,
                    "src_blocks must be empty when pulling a contiguous cache (CacheKey) into blocks")
            mode, blocks, size = ReadMode.SLOT, (), len(order.local_blocks) * dst.row_size
    nbytes = total_length(spans)
    remote = RemoteSpec(order.remote, mode, blocks, size, 0, t_start, t_count, nbytes)
    return Plan(spans, remote, nbytes, local)


def plan_push(order: TransferOrder, src: CacheDesc, src_is_blocks: bool, own_cluster: int) -> Plan:
    """Local source ``src``; remote destination named by ``order.remote`` (dst ranges are remote)."""
    _check_remote(order, own_cluster, "push to")
    per = order.tensor_num_per_layer
    local = _indices(order.src_layers, per, src.num_tensors)
    t_start, t_count = _remote_tensors(order.dst_layers, per, len(local), order.src_layers is not None)
    if order.kind == TransferKind.CACHE:
        require(not src_is_blocks, "push_cache needs a contiguous source cache; use push_blocks")
        require(isinstance(order.remote, (IdIndexRef, CacheKeyRef)), "push_cache takes a CacheKeyByIdAndIndex")
        require(order.size == -1, f"push_cache supports size=-1 only, got {order.size}")
        spans = slot_spans(src, local, order.local_batch_index, -1)
        mode, blocks, size = ReadMode.SLOT, (), src.row_size
    else:
        require(src_is_blocks, "push_blocks needs a blocks source cache")
        require(isinstance(order.remote, BlocksKeyRef), "push_blocks takes a BlocksCacheKey")
        require(len(order.remote_blocks) > 0, "dst_blocks must not be empty")
        require(len(order.local_blocks) == len(order.remote_blocks),
                f"src_blocks ({len(order.local_blocks)}) and dst_blocks ({len(order.remote_blocks)}) differ in length")
        spans = block_spans(src, local, order.local_blocks)
        mode, blocks, size = ReadMode.BLOCKS, tuple(order.remote_blocks), -1
    nbytes = total_length(spans)
    remote = RemoteSpec(order.remote, mode, blocks, size, 0, t_start, t_count, nbytes)
    return Plan(spans, remote, nbytes, local)


_ = DataDistError, StatusCode
