"""Typed ids, enums and frozen records shared by every part of the daemon."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, NewType, Sequence, Union

from datadist.dtypes import ITEMSIZE, DataType

from .errors import DataDistError, StatusCode, require

__all__ = [
    "UINT64_MAX", "ClusterId", "CacheId", "CommId", "EngineId", "TransferId",
    "Role", "Placement", "DType", "CacheDesc", "KeyKind", "OwnerKey",
    "CacheKeyRef", "IdIndexRef", "BlocksKeyRef", "KeyRef", "ReadMode", "RemoteSpec", "BlockList",
]

UINT64_MAX = 2**64 - 1

ClusterId = NewType("ClusterId", int)
CacheId = NewType("CacheId", int)      # per engine, counter from 1 (clients hard-code it)
CommId = NewType("CommId", int)        # per engine, counter from 1
EngineId = NewType("EngineId", int)    # per daemon, one per initialized LLMDataDist
TransferId = NewType("TransferId", int)


class Role(enum.IntEnum):
    PROMPT = 1
    DECODER = 2
    MIX = 3


class Placement(enum.IntEnum):
    HOST = 0
    DEVICE = 1


#: ``ge::DataType`` values of the 14 types CANN exposes in Python, as ints: the shared ``datadist.dtypes`` table
DType = enum.IntEnum("DType", [(m.name, m.value) for m in DataType], module=__name__)  # type: ignore[misc]  # members from a table


_ITEMSIZE: dict[DType, int] = {DType[t.name]: size for t, size in ITEMSIZE.items()}


def _itemsize(dtype: DType) -> int:
    """Bytes per element; LLM_PARAM_INVALID for ``DT_STRING``, which has no fixed size."""
    size = _ITEMSIZE.get(dtype)
    if size is None:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"data type {dtype.name} has no fixed size")
    return size


MAX_RANK = 32


@dataclass(frozen=True)
class CacheDesc:
    """N equally shaped tensors. ``shape[0]`` is the batch size (contiguous) or block count (blocks)."""

    num_tensors: int
    shape: tuple[int, ...]
    dtype: DType
    placement: Placement = Placement.DEVICE

    def __post_init__(self) -> None:
        require(isinstance(self.num_tensors, int) and self.num_tensors > 0,
                f"num_tensors must be > 0, got {self.num_tensors}")
        require(0 < len(self.shape) <= MAX_RANK, f"shape rank must be in [1, {MAX_RANK}], got {list(self.shape)}")
        require(all(isinstance(d, int) and d > 0 for d in self.shape),
                f"shape dims must be positive, got {list(self.shape)}")
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "placement", Placement(self.placement))
        _itemsize(self.dtype)  # raises for DT_STRING

    @property
    def tensor_size(self) -> int:
        """Bytes of one tensor."""
        return math.prod(self.shape) * _itemsize(self.dtype)

    @property
    def rows(self) -> int:
        """``shape[0]``: batch size of a contiguous cache, block count of a blocks cache."""
        return self.shape[0]

    @property
    def row_size(self) -> int:
        """Bytes of one batch slot / one block of one tensor."""
        return self.tensor_size // self.shape[0]

    @property
    def total_size(self) -> int:
        return self.tensor_size * self.num_tensors


class KeyKind(enum.IntEnum):
    REQ = 0      # CacheKey with a valid req_id  -> (cache, batch index)
    PREFIX = 1   # CacheKey with a valid prefix_id -> (cache, batch index)
    BLOCKS = 2   # BlocksCacheKey -> blocks cache (one per model_id per engine)


@dataclass(frozen=True)
class OwnerKey:
    """How a key is indexed on the node that owns the cache (cluster ids are not part of it)."""

    kind: KeyKind
    ident: int      # req_id, prefix_id, or UINT64_MAX for blocks keys
    model_id: int

    @staticmethod
    def blocks(model_id: int) -> "OwnerKey":
        return OwnerKey(KeyKind.BLOCKS, UINT64_MAX, model_id)

    @staticmethod
    def from_cache_key(req_id: int, prefix_id: int, model_id: int) -> "OwnerKey | None":
        """The owner index of a CacheKey; ``None`` for a placeholder (no valid req_id or prefix_id)."""
        if prefix_id != UINT64_MAX:
            return OwnerKey(KeyKind.PREFIX, prefix_id, model_id)
        if req_id != UINT64_MAX:
            return OwnerKey(KeyKind.REQ, req_id, model_id)
        return None


# ---- keys as a requester names them (cluster id = the owner to route to) -----------------------

@dataclass(frozen=True)
class CacheKeyRef:
    """CANN ``CacheKey``: a batch slot on its owner by (req_id | prefix_id, model_id)."""

    cluster_id: int
    req_id: int = UINT64_MAX
    model_id: int = 0
    prefix_id: int = UINT64_MAX

    def owner_key(self) -> OwnerKey:
        key = OwnerKey.from_cache_key(self.req_id, self.prefix_id, self.model_id)
        if key is None:
            raise DataDistError(StatusCode.LLM_PARAM_INVALID,
                                "CacheKey needs exactly one valid req_id or prefix_id to address a cache")
        return key


@dataclass(frozen=True)
class IdIndexRef:
    """CANN ``CacheKeyByIdAndIndex``: a batch slot by the owner's cache id."""

    cluster_id: int
    cache_id: int
    batch_index: int = 0


@dataclass(frozen=True)
class BlocksKeyRef:
    """CANN ``BlocksCacheKey``: the blocks cache bound to ``model_id`` on its owner."""

    cluster_id: int
    model_id: int = 0


KeyRef = Union[CacheKeyRef, IdIndexRef, BlocksKeyRef]


class ReadMode(enum.IntEnum):
    BLOCKS = 0   # blocks of a blocks cache
    SLOT = 1     # bytes from the start (+offset) of a batch slot of a contiguous cache
    EXTENTS = 2  # HIXL: ``blocks`` holds address, length pairs of the owner's registrations (``engine.extents``)


#: the model id a small read of HIXL's extents goes by (``links.wire.ownerwire.small_call``, ``engine.readview.read``):
#: never a ``BlocksCacheKey``'s (those are u64)
EXTENTS_READ = -1


class BlockList(tuple[int, ...]):
    """Block numbers a peer's frame named (``links.wire.ownerwire`` decodes long lists into one, off the event loop),
    with what their bound check needs worked out there: every number is an int >= 0, ``high`` the largest, ``peaks``
    a non-decreasing sequence whose item ``i`` is the largest of the first ``i + 1`` numbers -- so the first number
    at or past a bound is found by bisection (``core.layout``), never by a loop over a million of them on the loop --
    and ``values`` the same numbers as an array the memory layer reads at once (opaque here: core has no numpy)."""

    high: int
    peaks: Any      # a Sequence[int] (numpy's array, bisected by ``core.layout``)
    values: Any

    def __new__(cls, numbers: Sequence[int], high: int, peaks: Any, values: Any) -> "BlockList":
        self = super().__new__(cls, numbers)
        self.high, self.peaks, self.values = high, peaks, values
        return self


@dataclass(frozen=True)
class RemoteSpec:
    """What a requester asks of an owner: which bytes of which cache, in stream order."""

    key: KeyRef
    mode: ReadMode
    blocks: tuple[int, ...] = ()
    size: int = -1              # SLOT: bytes per tensor, -1 = whole slot (minus offset)
    offset: int = 0             # SLOT: byte offset inside the slot
    tensor_start: int = 0
    tensor_count: int = 0       # 0 = all tensors
    expected_bytes: int = 0
