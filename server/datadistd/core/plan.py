"""Turn a pull/push order into the requester's local byte spans and the ``RemoteSpec`` for the owner.

Both sides list their bytes in the same logical order (tensor by tensor in index order, and
within a tensor block by block in list order); the byte stream is the concatenation, so each
side merges adjacent blocks into runs independently. The owner checks ``expected_bytes``
against its own arithmetic before any byte moves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from .errors import DataDistError, StatusCode, require
from .layout import Span, block_spans, layer_range_to_tensor_indices, slot_spans, total_length
from .types import BlocksKeyRef, CacheDesc, CacheKeyRef, IdIndexRef, KeyRef, ReadMode, RemoteSpec

__all__ = [
    "TransferKind", "TransferOrder", "Plan", "plan_pull", "plan_push", "AddrRef", "LayerTarget", "LayerTask",
    "check_layer_task", "plan_layer", "LAYER_TENSORS",
]


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
    src_offset: int = 0          # v1 pull_cache src_cache_offset: bytes into the remote batch slot
    dst_offset: int = 0          # v1 pull_cache dst_cache_offset: bytes into the local batch slot
    exclusive: bool = False      # v1: no other pull may run on the link at the same time


@dataclass(frozen=True)
class Plan:
    local_spans: Sequence[Span]
    remote: RemoteSpec
    nbytes: int
    local_tensors: tuple[int, ...]


def _indices(layers: tuple[int, int] | None, per_layer: int, num_tensors: int) -> tuple[int, ...]:
    start, stop = layers if layers is not None else (None, None)
    return tuple(layer_range_to_tensor_indices(start, stop, per_layer, num_tensors))


def _remote_tensors(layers: tuple[int, int] | None, per_layer: int, local_count: int,
                    local_given: bool, remote_side: str) -> tuple[int, int]:
    """(tensor_start, tensor_count) on the owner; count 0 = all of its tensors. ``remote_side``: "src" (a pull)
    or "dst" (a push), for the message naming the two ranges."""
    if layers is None:
        return 0, (local_count if local_given else 0)
    start, stop = layers
    require(per_layer >= 1, f"tensor_num_per_layer must be >= 1, got {per_layer}")
    require(0 <= start < stop, f"layer range must satisfy 0 <= start < stop, got range({start}, {stop})")
    count = (stop - start) * per_layer
    if count != local_count:
        local_side = "dst" if remote_side == "src" else "src"
        local = (f"{local_side}_layer_range covers {local_count} tensors" if local_given else
                 f"no {local_side}_layer_range: all {local_count} tensors of the local cache")
        raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                            f"layer ranges differ in length: {remote_side}_layer_range=range({start}, {stop}) covers "
                            f"{stop - start} layers = {count} tensors at tensor_num_per_layer={per_layer}, {local} "
                            f"({local_count / per_layer:g} layers); give src_layer_range and dst_layer_range the same "
                            "length")
    return start * per_layer, count


def _check_remote(order: TransferOrder, own_cluster: int, verb: str) -> None:
    require(order.remote.cluster_id != own_cluster,
            f"cannot {verb} cluster {own_cluster}: that is this engine's own cluster id")


def plan_pull(order: TransferOrder, dst: CacheDesc, dst_is_blocks: bool, own_cluster: int) -> Plan:
    """Local destination ``dst``; remote source named by ``order.remote`` (src ranges are remote)."""
    _check_remote(order, own_cluster, "pull from")
    per = order.tensor_num_per_layer
    local = _indices(order.dst_layers, per, dst.num_tensors)
    t_start, t_count = _remote_tensors(order.src_layers, per, len(local), order.dst_layers is not None, "src")
    spans: Sequence[Span]
    blocks: tuple[int, ...]
    if order.kind == TransferKind.CACHE:
        require(not dst_is_blocks, "pull_cache needs a contiguous destination cache; use pull_blocks")
        require(not isinstance(order.remote, BlocksKeyRef), "pull_cache takes a CacheKey or CacheKeyByIdAndIndex")
        require(0 <= order.dst_offset < dst.row_size and order.src_offset >= 0,
                f"dst_cache_offset {order.dst_offset} must be in [0, {dst.row_size}) and src_cache_offset "
                f"{order.src_offset} >= 0")
        room = dst.row_size - order.dst_offset
        size = room if order.size == -1 else order.size
        require(order.size == -1 or 0 < order.size <= room,
                f"size {order.size} must be -1 or in (0, {room}] (batch slot of {dst.row_size} bytes, "
                f"dst_cache_offset {order.dst_offset})")
        spans = slot_spans(dst, local, order.local_batch_index, size, order.dst_offset)
        mode, blocks = ReadMode.SLOT, ()
    else:
        require(order.src_offset == 0 and order.dst_offset == 0, "cache offsets apply to pull_cache only")
        require(dst_is_blocks, "pull_blocks needs a blocks destination cache")
        require(len(order.local_blocks) > 0, "dst_blocks must not be empty")
        spans = block_spans(dst, local, order.local_blocks, "dst")
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
    offset = order.src_offset if mode == ReadMode.SLOT else 0
    remote = RemoteSpec(order.remote, mode, blocks, size, offset, t_start, t_count, nbytes)
    return Plan(spans, remote, nbytes, local)


def plan_push(order: TransferOrder, src: CacheDesc, src_is_blocks: bool, own_cluster: int) -> Plan:
    """Local source ``src``; remote destination named by ``order.remote`` (dst ranges are remote)."""
    _check_remote(order, own_cluster, "push to")
    per = order.tensor_num_per_layer
    local = _indices(order.src_layers, per, src.num_tensors)
    t_start, t_count = _remote_tensors(order.dst_layers, per, len(local), order.src_layers is not None, "dst")
    spans: Sequence[Span]
    blocks: tuple[int, ...]
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
        spans = block_spans(src, local, order.local_blocks, "src")
        mode, blocks, size = ReadMode.BLOCKS, tuple(order.remote_blocks), -1
    nbytes = total_length(spans)
    remote = RemoteSpec(order.remote, mode, blocks, size, 0, t_start, t_count, nbytes)
    return Plan(spans, remote, nbytes, local)


# ---- layer-wise push (transfer_cache_async) ------------------------------------------------------

LAYER_TENSORS = 2  # transfer_cache_async always moves K and V of a layer (docs/spec.md §5.7)


@dataclass(frozen=True)
class AddrRef:
    """A raw tensor address in the owning worker's process (CANN ``TransferConfig.dst_addrs``).

    The owner resolves it to (cache, tensor, byte offset) of a cache it holds; ``block_size > 0``
    means the address is the base of a blocks tensor whose blocks are ``block_size`` bytes.
    """

    cluster_id: int
    addr: int
    block_size: int = 0


@dataclass(frozen=True)
class LayerTarget:
    """One ``TransferConfig`` (``dst_addrs``) or ``TransferWithCacheKeyConfig`` (``key``)."""

    dst_cluster: int
    src_layers: tuple[int, int]                   # half-open
    key: KeyRef | None = None                     # BlocksKeyRef / IdIndexRef
    dst_addrs: tuple[int, ...] = ()
    dst_layers: tuple[int, int] | None = None     # None: destination layer = source layer
    src_batch_index: int = 0

    def holds(self, layer: int) -> bool:
        return self.src_layers[0] <= layer < self.src_layers[1]

    def dst_layer(self, layer: int) -> int:
        if self.dst_layers is None:
            return layer
        return self.dst_layers[0] + (layer - self.src_layers[0])


@dataclass(frozen=True)
class LayerTask:
    src: CacheDesc
    src_is_blocks: bool
    targets: tuple[LayerTarget, ...]
    src_blocks: tuple[int, ...] = ()
    dst_blocks: tuple[int, ...] = ()
    dst_block_size: int = 0                       # 0 = unset

    @property
    def num_layers(self) -> int:
        return self.src.num_tensors // LAYER_TENSORS


def check_layer_task(task: LayerTask, own_cluster: int) -> None:
    """Every rule of docs/spec.md §5.7/§7 that the source side can check, before any byte moves."""
    src = task.src
    require(src.num_tensors % LAYER_TENSORS == 0, f"cache_desc.num_tensors ({src.num_tensors}) is not even")
    require(len(task.targets) > 0, "transfer_configs must not be empty")
    layers = task.num_layers
    if task.src_blocks:
        require(len(task.dst_blocks) > 0, "transfer from blocks to cache is not supported")
        require(len(task.src_blocks) == len(task.dst_blocks),
                f"num_block_indices mismatches, src_num = {len(task.src_blocks)}, dst_num = {len(task.dst_blocks)}")
        block_spans(src, (), task.src_blocks, "src")  # range check of the source blocks
    elif task.dst_blocks:
        require(task.dst_block_size > 0, "dst_block_memory_size must be set when transfer from cache to blocks")
        need = len(task.dst_blocks) * task.dst_block_size
        require(need <= src.row_size,
                f"{len(task.dst_blocks)} destination blocks of {task.dst_block_size} bytes need {need} bytes, "
                f"the source batch slot holds {src.row_size}")
    else:
        require(task.dst_block_size == 0,
                f"dst_block_memory_size ({task.dst_block_size}) is neither None nor 0 while dst is not blocks")
    for i, t in enumerate(task.targets):
        start, stop = t.src_layers
        require(0 <= start < stop <= layers, f"transfer_configs[{i}]: src_layer_range range({start}, {stop}) "
                                              f"out of range, src_layer_num = {layers}")
        require(t.dst_cluster != own_cluster,
                f"transfer_configs[{i}]: cannot transfer to cluster {own_cluster}, this engine's own cluster id")
        if task.src_blocks:
            require(t.src_batch_index == 0,
                    f"transfer_configs[{i}]: src_batch_index ({t.src_batch_index}) != 0 while src is blocks")
        else:
            require(t.src_batch_index < src.rows,
                    f"transfer_configs[{i}]: src_batch_index ({t.src_batch_index}) out of range: [0, {src.rows})")
        if t.key is None:
            expected = LAYER_TENSORS * (stop - start)
            require(len(t.dst_addrs) == expected,
                    f"transfer_configs[{i}]: expect {expected} dst_addrs, but len(dst_addrs) = {len(t.dst_addrs)}")
            require(all(a > 0 for a in t.dst_addrs), f"transfer_configs[{i}]: dst_addrs must not contain 0")
        else:
            require(isinstance(t.key, (BlocksKeyRef, IdIndexRef)),
                    f"transfer_configs[{i}]: the cache key must be a BlocksCacheKey or CacheKeyByIdAndIndex")
            require(t.dst_layers is not None and t.dst_layers[1] - t.dst_layers[0] == stop - start
                    and t.dst_layers[0] >= 0,
                    f"transfer_configs[{i}]: dst_layer_range must have the length of src_layer_range")
            if isinstance(t.key, BlocksKeyRef):
                require(t.src_batch_index == 0, "src_batch_index should be 0 when cache_key is BlocksCacheKey.")


def plan_layer(task: LayerTask, target: int, layer: int) -> list[tuple[Sequence[Span], RemoteSpec]]:
    """The parts (local spans, owner spec) that send source layer ``layer`` to ``task.targets[target]``."""
    t = task.targets[target]
    require(t.holds(layer), f"layer {layer} is outside src_layer_range {t.src_layers} of target {target}")
    src = task.src
    tensors = (LAYER_TENSORS * layer, LAYER_TENSORS * layer + 1)

    def local(tensor_indices: tuple[int, ...]) -> Sequence[Span]:
        if task.src_blocks:
            return block_spans(src, tensor_indices, task.src_blocks, "src")
        if task.dst_blocks:
            return slot_spans(src, tensor_indices, t.src_batch_index, len(task.dst_blocks) * task.dst_block_size)
        return slot_spans(src, tensor_indices, t.src_batch_index, -1)

    blocks: tuple[int, ...]
    if task.dst_blocks:
        mode, blocks, size = ReadMode.BLOCKS, tuple(task.dst_blocks), -1
    elif isinstance(t.key, BlocksKeyRef):
        # CANN's cache-to-cache path (no dst_block_indices): one source stride per tensor to the start of the
        # destination tensor, i.e. its block 0 (LayerWiseTransferJob::GenerateCacheToCacheTask)
        mode, blocks, size = ReadMode.BLOCKS, (0,), -1
    else:
        mode, blocks, size = ReadMode.SLOT, (), src.row_size
    if t.key is not None:
        spans = local(tensors)
        nbytes = total_length(spans)
        dl = t.dst_layer(layer)
        spec = RemoteSpec(t.key, mode, blocks, size, 0, LAYER_TENSORS * dl, LAYER_TENSORS, nbytes)
        return [(spans, spec)]
    block_size = 0
    if task.dst_blocks:
        block_size = task.dst_block_size or src.row_size
        require(not task.src_blocks or block_size == src.row_size,
                f"dst_block_memory_size {block_size} differs from the source block size {src.row_size}")
    k = layer - t.src_layers[0]
    parts = []
    for j, tensor in enumerate(tensors):
        spans = local((tensor,))
        addr = AddrRef(t.dst_cluster, t.dst_addrs[LAYER_TENSORS * k + j], block_size)
        parts.append((spans, RemoteSpec(addr, mode, blocks, size, 0, 0, 0, total_length(spans))))  # type: ignore[arg-type]
    return parts


_ = DataDistError, StatusCode
