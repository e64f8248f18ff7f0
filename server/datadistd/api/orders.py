"""Pull/push orders from the attach connection's binary frames (``datadist.fastframe``), and the checks every
way in shares: ``convert.order_from_pb`` (protobuf, the gRPC Pull/Push) builds its ``TransferOrder`` with the same
bounds as ``order_from_frame`` here (no protobuf on this path); ``transfers.start_transfer`` runs either."""

from __future__ import annotations

from typing import Sequence

from datadist.fastframe import KEY_BLOCKS, KEY_BY_ID, KEY_CACHE, KIND_EXTENTS, PUSH, TransferFrame

from ..core.errors import DataDistError, StatusCode, require
from ..core.plan import TransferKind, TransferOrder
from ..core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, KeyRef
from ..engine.extents import ExtentOrder, extents_of

__all__ = ["MAX_LIST", "enum_of", "blocks", "layer_range", "order_from_frame"]

MAX_LIST = 1 << 20  # a block list longer than this is refused before any work


def enum_of(kind: type, value: int, what: str):  # noqa: ANN201
    try:
        return kind(value)
    except ValueError:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unknown {what} value {value}") from None


def blocks(values: Sequence[int], what: str) -> tuple[int, ...]:
    seq = tuple(values)
    require(len(seq) <= MAX_LIST, f"{what} has {len(seq)} entries; at most {MAX_LIST} per call")
    return seq


def layer_range(start: int, stop: int) -> tuple[int, int]:
    require(0 <= start < stop, f"layer range must satisfy 0 <= start < stop, got range({start}, {stop})")
    return start, stop


def _key(kind: int, fields: tuple[int, int, int, int]) -> KeyRef:
    cluster, a, b, c = fields
    if kind == KEY_CACHE:
        return CacheKeyRef(cluster, a, b, c)
    if kind == KEY_BY_ID:
        require(b < 1 << 32 and c == 0, "a CacheKeyByIdAndIndex has a u32 batch index and nothing more")
        return IdIndexRef(cluster, a, b)
    if kind == KEY_BLOCKS:
        require(b == 0 and c == 0, "a BlocksCacheKey has a cluster id and a model id only")
        return BlocksKeyRef(cluster, a)
    raise DataDistError(StatusCode.LLM_PARAM_INVALID, "a cache key is required")


def order_from_frame(f: TransferFrame) -> TransferOrder | ExtentOrder:
    """The order a decoded frame asks for, with the bounds ``convert.order_from_pb`` checks (the frame's fixed
    widths bound the rest, as protobuf's field types do there); HIXL's extents (``KIND_EXTENTS``) as
    ``convert.extents_from_pb`` takes them."""
    if f.kind == KIND_EXTENTS:
        return _extents_from_frame(f)
    src, dst = f.src_layers, f.dst_layers
    return TransferOrder(
        kind=enum_of(TransferKind, f.kind, "kind"),
        remote=_key(f.key_kind, f.key),
        local_cache_id=f.local_cache_id,
        remote_blocks=blocks(f.remote_blocks, "remote_blocks"),
        local_blocks=blocks(f.local_blocks, "local_blocks"),
        local_batch_index=f.local_batch_index,
        size=f.size,
        src_layers=None if src is None else layer_range(*src),
        dst_layers=None if dst is None else layer_range(*dst),
        tensor_num_per_layer=f.tensor_num_per_layer or 2,
        timeout_ms=f.timeout_ms,
        src_offset=f.src_offset or 0,
        dst_offset=f.dst_offset or 0,
        exclusive=f.exclusive,
    )


def _extents_from_frame(f: TransferFrame) -> ExtentOrder:
    """A ``KIND_EXTENTS`` frame: its fields other than the remote cluster, the extents and the timeout must be
    unset (``datadist.fastframe``)."""
    unset = (f.key_kind, *f.key[1:], f.local_cache_id, len(f.local_blocks), f.local_batch_index,
             f.tensor_num_per_layer, f.src_offset or 0, f.dst_offset or 0)
    require(not any(unset) and f.size == -1 and f.src_layers is None and f.dst_layers is None and not f.exclusive,
            "an extents frame names the remote engine's cluster, its extents and a timeout only")
    return ExtentOrder(f.key[0], f.op == PUSH, extents_of(f.remote_blocks), f.timeout_ms)
