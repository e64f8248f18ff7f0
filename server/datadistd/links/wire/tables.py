"""What an owner says about a cache it publishes to a link (``transport.base.ReadTables``'s ``info``): enough for
the puller to resolve a key to the cache and to check a pull's bounds as the owner does (``layout.owner_spans``).

Little-endian: ``u64 cache id, u8 blocks, u8 owned, u32 tensors, u16 dtype, u8 placement, u8 rank``, the shape
(``u64`` per dimension), the worker's address of each tensor (``u64`` each, 0: none; raw addressing), ``u32`` key
count, then per key ``u8 kind, u64 ident, u64 model id, u32 batch index``.
Every count is bounded; a bad one is ``ValueError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...core.errors import DataDistError
from ...core.types import MAX_RANK, CacheDesc, DType, KeyKind, OwnerKey, Placement

__all__ = ["CacheInfo", "encode_info", "decode_info", "MAX_KEYS"]

_HEAD = struct.Struct("<QBBIHBB")
_COUNT = struct.Struct("<I")
_KEY = struct.Struct("<BQQI")
MAX_KEYS = 1 << 16   # keys of one cache (a contiguous cache has one per batch slot at most)
MAX_TENSORS = 1 << 12


@dataclass(frozen=True)
class CacheInfo:
    cache_id: int
    is_blocks: bool
    owned: bool
    desc: CacheDesc
    keys: dict[OwnerKey, int]   # key -> batch index
    addrs: tuple[int, ...] = ()  # where the owning worker sees each tensor (0: not given)


def encode_info(info: CacheInfo) -> bytes:
    desc = info.desc
    return b"".join((_HEAD.pack(info.cache_id, info.is_blocks, info.owned, desc.num_tensors, int(desc.dtype),
                                int(desc.placement), len(desc.shape)),
                     struct.pack(f"<{len(desc.shape)}Q", *desc.shape),
                     struct.pack(f"<{desc.num_tensors}Q", *(info.addrs or (0,) * desc.num_tensors)),
                     _COUNT.pack(len(info.keys)),
                     *(_KEY.pack(int(k.kind), k.ident, k.model_id, batch) for k, batch in info.keys.items())))


def decode_info(data: bytes) -> CacheInfo:
    try:
        cache_id, blocks, owned, tensors, dtype, placement, rank = _HEAD.unpack_from(data)
        if not 0 < rank <= MAX_RANK:
            raise ValueError(f"rank {rank}")
        at = _HEAD.size
        shape = struct.unpack_from(f"<{rank}Q", data, at)
        at += 8 * rank
        if tensors > MAX_TENSORS:
            raise ValueError(f"{tensors} tensors")
        addrs = struct.unpack_from(f"<{tensors}Q", data, at)
        at += 8 * tensors
        (count,) = _COUNT.unpack_from(data, at)
        at += _COUNT.size
        if count > MAX_KEYS or at + count * _KEY.size != len(data):
            raise ValueError(f"{count} keys in {len(data)} bytes")
        keys = {}
        for kind, ident, model_id, batch in _KEY.iter_unpack(data[at:]):
            keys[OwnerKey(KeyKind(kind), ident, model_id)] = batch
        desc = CacheDesc(tensors, tuple(shape), DType(dtype), Placement(placement))
    except (struct.error, ValueError, TypeError, DataDistError) as exc:   # CacheDesc refuses with DataDistError
        raise ValueError(f"a malformed cache description ({exc})") from None
    return CacheInfo(cache_id, bool(blocks), bool(owned), desc, keys, addrs if any(addrs) else ())
