"""Fixed-layout frames for the owner calls on every pull's path: ``read`` and every reply (peer protocol 5).

The other owner calls (open/commit write, release, unlink, ping) stay ``peer.proto`` messages: they are per
push or per link, not per small pull. A binary frame starts with ``TAG`` (0xFF), which no protobuf message
can start with (field 31 of wire type 7 does not exist), so one CALL or REPLY payload is told apart by its
first byte. All integers little-endian; every length is checked against the payload before anything is
read, and a frame with bytes left over is refused.

READ (``ReadCmd``)::

    B tag  B op=1  B key kind  B mode  H flags (bit 0: inline)  H reserved (0)  I timeout_ms  I blocks
    Q command_id  Q transfer_id  Q key a  Q key b  Q key c  Q key d  q size  Q offset  I tensor_start
    I tensor_count  Q expected_bytes
    then ``blocks`` u64 block numbers

    key kind 1 CacheKey (a=cluster b=req_id c=model_id d=prefix_id), 2 CacheKeyByIdAndIndex (a=cluster
    b=cache_id, signed, c=batch_index), 3 BlocksCacheKey (a=cluster c=model_id)

REPLY (``OwnerReply``)::

    B tag  B flags (bit 0: release_needed)  H reserved  I message length  q status  Q command_id  Q nbytes
    I transfer ids  I grant length  I data length
    then the transfer ids (u64 each), the message (UTF-8), the grant (what a one-sided transport's read of a
    ``grant_read`` needs), the data (an inline read's bytes)

No grpc and no protobuf here.
"""

from __future__ import annotations

import struct

import numpy as np

from ...core.errors import DataDistError, StatusCode
from ...core.types import BlocksKeyRef, CacheKeyRef, IdIndexRef, ReadMode, RemoteSpec
from .ownercalls import MAX_OPEN_PER_CALL, OwnerReply, ReadCmd, RefusedCall

__all__ = ["TAG", "is_inline_read", "encode_read", "decode_read", "encode_reply", "decode_reply", "is_binary"]

TAG = 0xFF
_OP_READ = 1
_READ = struct.Struct("<BBBBHHII QQQQQQ qQ II Q")
_REPLY = struct.Struct("<BBHI qQQ III")
_INLINE = 1
_RELEASE = 1
_CACHE_KEY, _BY_ID, _BLOCKS_KEY = 1, 2, 3
#: most block numbers one read may name (as the protobuf path: ``convert.MAX_LIST``)
MAX_BLOCKS = 1 << 20
_U64 = np.dtype("<u8")
_MASK = (1 << 64) - 1


def is_binary(data: bytes) -> bool:
    return len(data) > 0 and data[0] == TAG


def is_inline_read(data: bytes) -> bool:
    """Whether ``data`` is a READ frame asking for its bytes in the reply (its header not yet checked)."""
    return len(data) >= _READ.size and data[0] == TAG and data[1] == _OP_READ and data[4] & _INLINE == _INLINE


def encode_read(cmd: ReadCmd) -> bytes:
    """The READ frame of ``cmd``."""
    spec, key = cmd.spec, cmd.spec.key
    if isinstance(key, CacheKeyRef):
        kind, a, b, c, d = _CACHE_KEY, key.cluster_id, key.req_id, key.model_id, key.prefix_id
    elif isinstance(key, IdIndexRef):   # cache_id is signed (int64 in common.proto): its two's complement
        kind, a, b, c, d = _BY_ID, key.cluster_id, key.cache_id & _MASK, key.batch_index, 0
    elif isinstance(key, BlocksKeyRef):
        kind, a, b, c, d = _BLOCKS_KEY, key.cluster_id, 0, key.model_id, 0
    else:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a read names no cache key: {key!r}")
    head = _READ.pack(TAG, _OP_READ, kind, int(spec.mode), _INLINE if cmd.inline else 0, 0,
                      cmd.timeout_ms, len(spec.blocks), cmd.command_id, cmd.transfer_id, a, b, c, d, spec.size,
                      spec.offset, spec.tensor_start, spec.tensor_count, spec.expected_bytes)
    return b"".join((head, np.asarray(spec.blocks, _U64).tobytes()))


def decode_read(data: bytes) -> ReadCmd:
    """A READ frame; ``DataDistError`` when it does not even name its call, ``RefusedCall`` when it names it but
    asks for something invalid."""
    if len(data) < _READ.size:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a read frame of {len(data)} bytes is cut short")
    (_, op, kind, mode, flags, reserved, timeout_ms, nblocks, cid, tid, a, b, c, d, size, offset, tensor_start,
     tensor_count, expected) = _READ.unpack_from(data)
    if op != _OP_READ:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"unknown binary owner call {op}")
    if reserved or nblocks > MAX_BLOCKS or flags & ~_INLINE:
        raise RefusedCall(cid, StatusCode.LLM_PARAM_INVALID,
                          f"a read of {nblocks} blocks (at most {MAX_BLOCKS}), reserved {reserved} (must be 0), "
                          f"flags {flags:#x}")
    end = _READ.size + 8 * nblocks
    if len(data) != end:
        raise RefusedCall(cid, StatusCode.LLM_PARAM_INVALID,
                          f"a read frame of {len(data)} bytes; its header says {end}")
    try:
        read_mode = ReadMode(mode)
    except ValueError:
        raise RefusedCall(cid, StatusCode.LLM_PARAM_INVALID, f"unknown mode value {mode}") from None
    if kind == _CACHE_KEY:
        key: CacheKeyRef | IdIndexRef | BlocksKeyRef = CacheKeyRef(a, b, c, d)
    elif kind == _BY_ID:
        key = IdIndexRef(a, b - (1 << 64) if b >> 63 else b, c)
    elif kind == _BLOCKS_KEY:
        key = BlocksKeyRef(a, c)
    else:
        raise RefusedCall(cid, StatusCode.LLM_PARAM_INVALID, f"unknown key kind {kind}")
    blocks = tuple(np.frombuffer(data, _U64, nblocks, _READ.size).tolist()) if nblocks else ()
    spec = RemoteSpec(key, read_mode, blocks, size, offset, tensor_start, tensor_count, expected)
    return ReadCmd(cid, tid, spec, timeout_ms, bool(flags & _INLINE))


def encode_reply(reply: OwnerReply) -> bytes:
    message = reply.message.encode("utf-8", "replace")
    head = _REPLY.pack(TAG, _RELEASE if reply.release_needed else 0, 0, len(message), reply.status,
                       reply.command_id, reply.nbytes, len(reply.transfer_ids), len(reply.grant), len(reply.data))
    ids = np.asarray(reply.transfer_ids, _U64).tobytes() if reply.transfer_ids else b""
    return b"".join((head, ids, message, reply.grant, reply.data))


def decode_reply(data: bytes) -> OwnerReply:
    if len(data) < _REPLY.size:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a reply frame of {len(data)} bytes is cut short")
    _, flags, _, message_len, status, cid, nbytes, nids, grant_len, data_len = _REPLY.unpack_from(data)
    if nids > MAX_OPEN_PER_CALL or _REPLY.size + 8 * nids + message_len + grant_len + data_len != len(data):
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a malformed reply frame ({len(data)} bytes, {nids} "
                                                          f"transfers, {message_len} + {grant_len} + {data_len} "
                                                          f"bytes after them)")
    at = _REPLY.size
    ids = tuple(np.frombuffer(data, _U64, nids, at).tolist()) if nids else ()
    at += 8 * nids
    message = data[at:at + message_len].decode("utf-8", "replace")
    at += message_len
    grant = data[at:at + grant_len]
    return OwnerReply(cid, status, message, ids, nbytes, bool(flags & _RELEASE), data[at + grant_len:], grant)
