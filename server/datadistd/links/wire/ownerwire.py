"""The one wire encoding of owner calls: fixed-layout little-endian frames, a CALL per call, a REPLY per answer
(every owner call; the peer protocol is ``peering.PROTOCOL_VERSION``).

Every CALL frame starts with the same 16 bytes, then what its call needs (one ``struct`` layout per call kind,
read with one ``unpack_from``; lists after it)::

    B tag (0xFF)  B op  H flags  I timeout_ms  Q command_id

    op 1 READ:  Q transfer_id  SPEC, then the spec's block numbers (flags bit 0: inline -- the bytes come back in
         the reply)
    op 3 OPEN_WRITE:  I hold_ms  I count, then ``count`` SPECs, then the block numbers of each spec in turn
    op 4 COMMIT_WRITE:  I count  I reserved (0), then ``count`` u64 transfer ids
    op 5 RELEASE:  KEY  I tensor_start  I tensor_count
    op 6 UNLINK, op 7 PING:  nothing more
    op 9 WRITE:  SPEC, then the spec's block numbers, then the bytes to write (exactly the spec's expected_bytes,
         at most ``INLINE_READ_MAX``: a small push in one call)
    op 10 NOTIFY:  I name length  I message length, then the name, then the message (a HIXL notify: each at most
         ``MAX_NOTIFY_NAME_LEN`` / ``MAX_NOTIFY_MSG_LEN`` bytes)

    SPEC: KEY  B mode (0 blocks, 1 slot, 2 extents: the block numbers are address, length pairs)  B reserved (0)
          I blocks  q size  Q offset  I tensor_start  I tensor_count  Q expected_bytes
    KEY:  B kind  B reserved (0)  H reserved (0)  Q a  Q b  Q c  Q d
          kind 1 CacheKey (a=cluster b=req_id c=model_id d=prefix_id), 2 CacheKeyByIdAndIndex (a=cluster
          b=cache_id, signed, c=batch_index), 3 BlocksCacheKey (a=cluster c=model_id), 4 a raw address in the
          owning worker's process (``AddrRef``: a=cluster b=addr, never 0, c=block_size); a field its kind does
          not name must be 0

REPLY (``OwnerReply``)::

    B tag  B flags (bit 0: release_needed)  H reserved  I message length  q status  Q command_id  Q nbytes
    I transfer ids  I data length
    then the transfer ids (u64 each), the message (UTF-8), the data (an inline read's bytes)

Decoding is what a hostile (authenticated) peer reaches: every count is bounded and every length checked
against the frame before anything is read or allocated, reserved fields and unknown flags must be 0, and a
frame with bytes left over is refused. A CALL that names its ``command_id`` but asks for something invalid
raises ``RefusedCall`` (the other end gets a REPLY with the code); one too short to name it, or not starting
with the tag, raises ``DataDistError`` (dropped). Nothing else is ever raised. No grpc and no protobuf here.
"""

from __future__ import annotations

import struct

import numpy as np

from datadist.hixl import MAX_NOTIFY_MSG_LEN, MAX_NOTIFY_NAME_LEN

from ...core.errors import DataDistError, StatusCode
from ...core.plan import AddrRef
from ...core.types import EXTENTS_READ, BlockList, BlocksKeyRef, CacheKeyRef, IdIndexRef, KeyRef, ReadMode, RemoteSpec
from . import ownercalls as oc

__all__ = ["TAG", "MAX_BLOCKS", "SMALL_READ_BLOCKS", "READ", "REPLY", "REPLY_DATA", "OP_READ", "SmallCall",
           "small_read_call", "small_write_call", "small_call", "small_reply", "encode_call", "decode_call",
           "parsed_size", "encode_reply", "decode_reply"]

TAG = 0xFF
#: the call ops; 2 and 8 are not given (a frame naming one is refused as unknown)
OP_READ, OP_OPEN_WRITE, OP_COMMIT_WRITE, OP_RELEASE, OP_UNLINK, OP_PING, OP_WRITE, OP_NOTIFY = 1, 3, 4, 5, 6, 7, 9, 10

_HEAD = "<BBHIQ"                       # tag op flags timeout_ms command_id
_KEY = "BBHQQQQ"                       # kind reserved reserved a b c d
_SPEC_BODY = _KEY + "BBIqQIIQ"         # KEY mode reserved blocks size offset tensor_start tensor_count expected
HEAD = struct.Struct(_HEAD)
READ = struct.Struct(_HEAD + "Q" + _SPEC_BODY)
SPEC = struct.Struct("<" + _SPEC_BODY)
OPEN = struct.Struct(_HEAD + "II")                      # hold_ms count
COMMIT = struct.Struct(_HEAD + "II")                    # count reserved
RELEASE = struct.Struct(_HEAD + _KEY + "II")            # KEY tensor_start tensor_count
WRITE = struct.Struct(_HEAD + _SPEC_BODY)               # then blocks, then the bytes
NOTIFY = struct.Struct(_HEAD + "II")                    # name length, message length; then both
_REPLY = struct.Struct("<BBHI qQQ II")
#: a REPLY's fixed head (a small pull's or push's: ``small_call``, ``small_reply``)
REPLY = _REPLY

_INLINE = _RELEASE_NEEDED = 1
_CACHE_KEY, _BY_ID, _BLOCKS_KEY, _ADDRESS = 1, 2, 3, 4
#: most block numbers one spec may name (as a worker's transfer: ``api.orders.MAX_LIST``)
MAX_BLOCKS = 1 << 20
_U64 = np.dtype("<u8")
_MASK = (1 << 64) - 1


#: the most block numbers of a small pull or push (``small_call``; more: ``decode_call``)
SMALL_READ_BLOCKS = 64
_BLOCK_LISTS = tuple(struct.Struct(f"<{n}Q") for n in range(SMALL_READ_BLOCKS + 1))
_BLOCKS_MODE = int(ReadMode.BLOCKS)
_EXTENTS_MODE = int(ReadMode.EXTENTS)


# ---- a small pull's and push's frames (``links.fast``, ``links.calls``, ``FrameCalls.take_reply``) -------------
# What ``encode_call``/``decode_call``/``encode_reply`` make of the same calls, byte for byte, with no record per
# frame: keyword-only ints in, tuples out, one ``pack``/``unpack_from`` each (the hot path: bench scenario 12).

#: where a small read's bytes start in its REPLY (``small_reply``)
REPLY_DATA = _REPLY.size
#: ``small_call``: ``(write, command_id, model_id, tensor_start, tensor_count, blocks, nbytes, at, reply)``
SmallCall = tuple[bool, int, int, int, int, tuple[int, ...], int, int, bytes]


def small_read_call(*, command_id: int, timeout_ms: int, cluster_id: int, model_id: int, blocks: bytes,
                    nbytes: int) -> bytes:
    """A small pull's CALL frame: the inline READ of the blocks whose u64 little-endian numbers are ``blocks`` (as
    the attach frame carries them) of ``BlocksCacheKey(cluster_id, model_id)``, whole tensors, ``nbytes`` expected
    -- ``encode_call(ReadCmd(command_id, 0, RemoteSpec(key, BLOCKS, numbers, -1, 0, 0, 0, nbytes), timeout_ms,
    inline=True))``."""
    return READ.pack(TAG, OP_READ, _INLINE, timeout_ms, command_id, 0, _BLOCKS_KEY, 0, 0, cluster_id, 0, model_id, 0,
                     _BLOCKS_MODE, 0, len(blocks) >> 3, -1, 0, 0, 0, nbytes) + blocks


def small_write_call(*, command_id: int, timeout_ms: int, cluster_id: int, model_id: int, blocks: bytes,
                     nbytes: int) -> tuple[bytearray, int]:
    """A small push's CALL frame, as ``small_read_call`` names its blocks: the WRITE with room for its ``nbytes``
    bytes, and where they go (the caller copies them in, straight from the rows) -- then it is ``encode_call`` of
    ``WriteCmd(command_id, RemoteSpec(key, BLOCKS, numbers, -1, 0, 0, 0, nbytes), timeout_ms, those bytes)``."""
    at = WRITE.size + len(blocks)
    frame = bytearray(at + nbytes)
    WRITE.pack_into(frame, 0, TAG, OP_WRITE, 0, timeout_ms, command_id, _BLOCKS_KEY, 0, 0, cluster_id, 0, model_id, 0,
                    _BLOCKS_MODE, 0, len(blocks) >> 3, -1, 0, 0, 0, nbytes)
    frame[WRITE.size:at] = blocks
    return frame, at


def small_call(data: bytes, cluster_id: int) -> SmallCall | None:
    """A small pull's READ (inline) or a small push's WRITE (carrying exactly its ``expected_bytes``) by
    ``BlocksCacheKey`` of cluster ``cluster_id``, in BLOCKS mode, of at most ``SMALL_READ_BLOCKS`` blocks and
    ``INLINE_READ_MAX`` bytes, with every reserved field, flag and length as ``decode_call`` accepts them (transfer
    id, key fields b and d 0), or a small READ (inline) of HIXL's extents by address (``ReadMode.EXTENTS``: model
    id ``core.types.EXTENTS_READ``, the blocks its address, length pairs): ``(write, command_id, model_id,
    tensor_start, tensor_count, blocks, nbytes, at, reply)`` -- a WRITE's bytes are ``data[at:]`` (a READ's ``at``
    is 0) and ``reply`` is the head of the call's REPLY of success (``encode_reply(OwnerReply(command_id,
    nbytes=nbytes, data=...))`` less the data: a read's ``nbytes`` bytes follow it, a write's none) -- read with one
    ``unpack_from`` (and one for the blocks). None for anything else, well formed or not: ``decode_call`` then
    decides (the data reader thread's path, ``links/calls.py``)."""
    if len(data) < WRITE.size:   # the smaller of the two
        return None
    if data[1] == OP_WRITE:
        (tag, _, flags, _, cid, kind, r1, r2, a, b, c, d, mode, r3, n, _, _, tensor_start, tensor_count,
         expected) = WRITE.unpack_from(data)
        at = WRITE.size + 8 * n
        if (flags or kind != _BLOCKS_KEY or r1 or r2 or r3 or b or d or mode != _BLOCKS_MODE or a != cluster_id
                or n > SMALL_READ_BLOCKS or expected > oc.INLINE_READ_MAX or len(data) != at + expected or tag != TAG):
            return None
        return (True, cid, c, tensor_start, tensor_count, _BLOCK_LISTS[n].unpack_from(data, WRITE.size), expected, at,
                _REPLY.pack(TAG, 0, 0, 0, 0, cid, expected, 0, 0))
    if len(data) < READ.size:
        return None
    (tag, op, flags, _, cid, tid, kind, r1, r2, a, b, c, d, mode, r3, n, _, _, tensor_start, tensor_count,
     expected) = READ.unpack_from(data)
    if (tag != TAG or op != OP_READ or flags != _INLINE or tid or r1 or r2 or r3 or d or a != cluster_id
            or n > SMALL_READ_BLOCKS or len(data) != READ.size + 8 * n or expected > oc.INLINE_READ_MAX):
        return None
    if kind == _BLOCKS_KEY and mode == _BLOCKS_MODE and not b:
        model_id = c
    elif kind == _ADDRESS and mode == _EXTENTS_MODE and b and not c and n and not n % 2 and not tensor_start \
            and not tensor_count:
        model_id = EXTENTS_READ   # HIXL's extents by address: ``blocks`` holds address, length pairs
    else:
        return None
    return (False, cid, model_id, tensor_start, tensor_count, _BLOCK_LISTS[n].unpack_from(data, READ.size), expected,
            0, _REPLY.pack(TAG, 0, 0, 0, 0, cid, expected, 0, expected))


def small_reply(data: bytes) -> tuple[int, int] | None:
    """``(command_id, data length)`` of a REPLY that is a whole success carrying nothing but data (no flag, message,
    transfer id): a small pull's or push's answer (its data at ``REPLY_DATA``), read with one
    ``unpack_from``. None for any other: ``decode_reply`` then decides (``FrameCalls.take_reply``)."""
    if len(data) < _REPLY.size:
        return None
    tag, flags, _, mlen, status, cid, _, nids, dlen = _REPLY.unpack_from(data)
    if tag != TAG or flags or mlen or status or nids or len(data) != _REPLY.size + dlen:
        return None
    return cid, dlen


# ---- encoding ---------------------------------------------------------------------------------------------

def _key_fields(key: object) -> tuple[int, int, int, int, int, int, int]:
    if isinstance(key, CacheKeyRef):
        return _CACHE_KEY, 0, 0, key.cluster_id, key.req_id, key.model_id, key.prefix_id
    if isinstance(key, IdIndexRef):   # cache_id is signed (int64 in common.proto): its two's complement
        return _BY_ID, 0, 0, key.cluster_id, key.cache_id & _MASK, key.batch_index, 0
    if isinstance(key, BlocksKeyRef):
        return _BLOCKS_KEY, 0, 0, key.cluster_id, 0, key.model_id, 0
    if isinstance(key, AddrRef):
        return _ADDRESS, 0, 0, key.cluster_id, key.addr, key.block_size, 0
    raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"an owner call names no cache key: {key!r}")


def _spec_fields(spec: RemoteSpec) -> tuple[int, ...]:
    return (*_key_fields(spec.key), int(spec.mode), 0, len(spec.blocks), spec.size, spec.offset, spec.tensor_start,
            spec.tensor_count, spec.expected_bytes)


def _blocks(spec: RemoteSpec) -> bytes:
    return np.asarray(spec.blocks, _U64).tobytes() if spec.blocks else b""


def encode_call(cmd: oc.OwnerCall) -> bytes:
    """The CALL frame of ``cmd``."""
    cid = cmd.command_id
    if isinstance(cmd, oc.ReadCmd):
        return READ.pack(TAG, OP_READ, _INLINE if cmd.inline else 0, cmd.timeout_ms, cid, cmd.transfer_id,
                         *_spec_fields(cmd.spec)) + _blocks(cmd.spec)
    if isinstance(cmd, oc.WriteCmd):
        return b"".join((WRITE.pack(TAG, OP_WRITE, 0, cmd.timeout_ms, cid, *_spec_fields(cmd.spec)), _blocks(cmd.spec),
                         cmd.data))
    if isinstance(cmd, oc.OpenWriteCmd):
        return b"".join((OPEN.pack(TAG, OP_OPEN_WRITE, 0, cmd.timeout_ms, cid, cmd.hold_ms, len(cmd.specs)),
                         *(SPEC.pack(*_spec_fields(s)) for s in cmd.specs), *(_blocks(s) for s in cmd.specs)))
    if isinstance(cmd, oc.CommitWriteCmd):
        ids = np.asarray(cmd.transfer_ids, _U64).tobytes() if cmd.transfer_ids else b""
        return COMMIT.pack(TAG, OP_COMMIT_WRITE, 0, cmd.timeout_ms, cid, len(cmd.transfer_ids), 0) + ids
    if isinstance(cmd, oc.ReleaseCmd):
        return RELEASE.pack(TAG, OP_RELEASE, 0, 0, cid, *_key_fields(cmd.key), cmd.tensor_start, cmd.tensor_count)
    if isinstance(cmd, oc.UnlinkCmd):
        return HEAD.pack(TAG, OP_UNLINK, 0, 0, cid)
    if isinstance(cmd, oc.NotifyCmd):
        return b"".join((NOTIFY.pack(TAG, OP_NOTIFY, 0, 0, cid, len(cmd.name), len(cmd.msg)), cmd.name, cmd.msg))
    assert isinstance(cmd, oc.PingCmd), cmd
    return HEAD.pack(TAG, OP_PING, 0, 0, cid)


def encode_reply(reply: oc.OwnerReply) -> bytes:
    message = reply.message.encode("utf-8", "replace")
    head = _REPLY.pack(TAG, _RELEASE_NEEDED if reply.release_needed else 0, 0, len(message), reply.status,
                       reply.command_id, reply.nbytes, len(reply.transfer_ids), len(reply.data))
    ids = np.asarray(reply.transfer_ids, _U64).tobytes() if reply.transfer_ids else b""
    return b"".join((head, ids, message, reply.data))


# ---- decoding (attacker-facing) --------------------------------------------------------------------------

class _Bad(Exception):
    """A field out of range: refused with the call's id (``decode_call`` adds it)."""


def _key(kind: int, reserved: int, a: int, b: int, c: int, d: int) -> KeyRef:
    if reserved:
        raise _Bad(f"key reserved bits {reserved:#x} (must be 0)")
    if kind == _BLOCKS_KEY:
        if b or d:
            raise _Bad(f"a BlocksCacheKey with fields b={b}, d={d} set (must be 0)")
        return BlocksKeyRef(a, c)
    if kind == _CACHE_KEY:
        return CacheKeyRef(a, b, c, d)
    if kind == _BY_ID:
        if d:
            raise _Bad(f"a CacheKeyByIdAndIndex with field d={d} set (must be 0)")
        return IdIndexRef(a, b - (1 << 64) if b >> 63 else b, c)
    if kind == _ADDRESS:
        if not b or d:
            raise _Bad(f"a raw address {b:#x} (must not be 0), reserved {d} (must be 0)")
        return AddrRef(a, b, c)  # type: ignore[return-value]   # as api.grpc.convert.key_from_pb
    raise _Bad(f"unknown key kind {kind}")


#: mode value -> ReadMode (a dict: cheaper than the enum's call on every read)
_MODES = {int(m): m for m in ReadMode}


def _spec(fields: tuple[int, ...], blocks: tuple[int, ...]) -> RemoteSpec:
    kind, r1, r2, a, b, c, d, mode, r3, _, size, offset, tensor_start, tensor_count, expected = fields
    key = _key(kind, r1 | r2 | r3, a, b, c, d)
    read_mode = _MODES.get(mode)
    if read_mode is None:
        raise _Bad(f"unknown mode value {mode}")
    return RemoteSpec(key, read_mode, blocks, size, offset, tensor_start, tensor_count, expected)


def _checked_count(n: int, most: int, what: str) -> int:
    if n > most:
        raise _Bad(f"{n} {what} in one call; at most {most}")
    return n


def _u64s(data: bytes, count: int, at: int) -> tuple[int, ...]:
    return tuple(np.frombuffer(data, _U64, count, at).tolist()) if count else ()


#: block lists longer than this decode into a ``BlockList`` (their bounds worked out here, ``_block_numbers``)
_LONG_LIST = SMALL_READ_BLOCKS
#: numbers turned into ints per C call of a long list (``_block_numbers``): the GIL is free between two
_TO_INTS = 1 << 16


def _block_numbers(data: bytes, count: int, at: int) -> tuple[int, ...]:
    """A spec's ``count`` block numbers at ``at``. A long list is a ``core.types.BlockList``: its running maxima and
    largest number worked out here, so the owner's bound check (``core.layout``) is O(log n) on the event loop; made
    ``_TO_INTS`` numbers at a time, so a decoding thread (a list of 2^20: ``links.calls`` decodes it off the loop)
    never holds the GIL for long."""
    if count <= _LONG_LIST:
        return _u64s(data, count, at)
    values = np.frombuffer(data, _U64, count, at)
    numbers: list[int] = []
    for start in range(0, count, _TO_INTS):
        numbers += values[start:start + _TO_INTS].tolist()
    peaks = np.maximum.accumulate(values)
    return BlockList(numbers, int(peaks[-1]), peaks, values)


def _exact(data: bytes, end: int) -> None:
    if len(data) != end:
        raise _Bad(f"a frame of {len(data)} bytes; its fields say {end}")


def _flags(flags: int, allowed: int) -> None:
    if flags & ~allowed:
        raise _Bad(f"flags {flags:#x}")


def _read(data: bytes) -> oc.ReadCmd:
    """READ: every pull's path over tcp, so its checks are inline."""
    fields = READ.unpack_from(data)
    flags, timeout_ms, cid, tid, nblocks = fields[2], fields[3], fields[4], fields[5], fields[15]
    if nblocks > MAX_BLOCKS:
        raise _Bad(f"a read of {nblocks} blocks; at most {MAX_BLOCKS}")
    if len(data) != READ.size + 8 * nblocks:
        raise _Bad(f"a frame of {len(data)} bytes; its fields say {READ.size + 8 * nblocks}")
    _flags(flags, _INLINE)
    spec = _spec(fields[6:], _block_numbers(data, nblocks, READ.size))
    return oc.ReadCmd(cid, tid, spec, timeout_ms, bool(flags & _INLINE))


def _write(data: bytes) -> oc.WriteCmd:
    fields = WRITE.unpack_from(data)
    flags, timeout_ms, cid, nblocks, expected = fields[2], fields[3], fields[4], fields[14], fields[19]
    _flags(flags, 0)
    _checked_count(nblocks, MAX_BLOCKS, "blocks")
    at = WRITE.size + 8 * nblocks
    if len(data) < at:
        raise _Bad(f"a frame of {len(data)} bytes; its {nblocks} blocks need {at}")
    if expected > oc.INLINE_READ_MAX or len(data) - at != expected:
        raise _Bad(f"a write carrying {len(data) - at} bytes for a spec of {expected} (they must agree, at most "
                   f"{oc.INLINE_READ_MAX}; more is pushed by OpenWrite)")
    return oc.WriteCmd(cid, _spec(fields[5:], _block_numbers(data, nblocks, WRITE.size)), timeout_ms, bytes(data[at:]))


def _open_write(data: bytes) -> oc.OpenWriteCmd:
    _, _, flags, timeout_ms, cid, hold_ms, count = OPEN.unpack_from(data)
    _flags(flags, 0)
    if not 0 < count <= oc.MAX_OPEN_PER_CALL:
        raise _Bad(f"an open write of {count} pieces; 1 to {oc.MAX_OPEN_PER_CALL} per call")
    at = OPEN.size + count * SPEC.size
    if len(data) < at:
        raise _Bad(f"a frame of {len(data)} bytes; its {count} pieces need {at} before their blocks")
    heads = list(SPEC.iter_unpack(data[OPEN.size:at]))
    sizes = [_checked_count(h[9], MAX_BLOCKS, "blocks") for h in heads]
    _exact(data, at + 8 * sum(sizes))
    specs = []
    for head, n in zip(heads, sizes, strict=True):
        specs.append(_spec(head, _block_numbers(data, n, at)))
        at += 8 * n
    return oc.OpenWriteCmd(cid, tuple(specs), timeout_ms, hold_ms)


def _commit_write(data: bytes) -> oc.CommitWriteCmd:
    _, _, flags, timeout_ms, cid, count, reserved = COMMIT.unpack_from(data)
    _flags(flags | reserved, 0)
    _checked_count(count, oc.MAX_OPEN_PER_CALL, "transfers")
    _exact(data, COMMIT.size + 8 * count)
    return oc.CommitWriteCmd(cid, _u64s(data, count, COMMIT.size), timeout_ms)


def _release(data: bytes) -> oc.ReleaseCmd:
    _, _, flags, timeout_ms, cid, kind, r1, r2, a, b, c, d, tensor_start, tensor_count = RELEASE.unpack_from(data)
    _flags(flags | timeout_ms, 0)
    _exact(data, RELEASE.size)
    key = _key(kind, r1 | r2, a, b, c, d)
    if not isinstance(key, (CacheKeyRef, IdIndexRef)):
        raise _Bad("only CacheKey / CacheKeyByIdAndIndex pulls are released")
    return oc.ReleaseCmd(cid, key, tensor_start, tensor_count)


def _bare(data: bytes, op: int) -> oc.UnlinkCmd | oc.PingCmd:
    _, _, flags, timeout_ms, cid = HEAD.unpack_from(data)
    _flags(flags | timeout_ms, 0)
    _exact(data, HEAD.size)
    return oc.UnlinkCmd(cid) if op == OP_UNLINK else oc.PingCmd(cid)


def _notify(data: bytes) -> oc.NotifyCmd:
    _, _, flags, timeout_ms, cid, name_len, msg_len = NOTIFY.unpack_from(data)
    _flags(flags | timeout_ms, 0)
    if name_len > MAX_NOTIFY_NAME_LEN or msg_len > MAX_NOTIFY_MSG_LEN:
        raise _Bad(f"a notify of a {name_len}-byte name and a {msg_len}-byte message (at most "
                   f"{MAX_NOTIFY_NAME_LEN} and {MAX_NOTIFY_MSG_LEN})")
    _exact(data, NOTIFY.size + name_len + msg_len)
    at = NOTIFY.size
    return oc.NotifyCmd(cid, bytes(data[at:at + name_len]), bytes(data[at + name_len:at + name_len + msg_len]))


#: op -> the smallest frame of that op
_SMALLEST = {OP_READ: READ.size, OP_OPEN_WRITE: OPEN.size, OP_COMMIT_WRITE: COMMIT.size, OP_RELEASE: RELEASE.size,
             OP_UNLINK: HEAD.size, OP_PING: HEAD.size, OP_WRITE: WRITE.size, OP_NOTIFY: NOTIFY.size}


def parsed_size(data: bytes) -> int:
    """The bytes of a CALL frame that ``decode_call`` reads number by number: all of it but what a WRITE carries
    (copied whole). What decides where a frame is decoded (``links.calls``: a long block list off the event loop)."""
    if len(data) >= WRITE.size and data[0] == TAG and data[1] == OP_WRITE:
        return WRITE.size + 8 * WRITE.unpack_from(data)[14]
    return len(data)


def decode_call(data: bytes) -> oc.OwnerCall:
    """A CALL frame: the call; ``RefusedCall`` when it names its ``command_id`` but not a valid call,
    ``DataDistError`` (``LLM_PARAM_INVALID``) when it does not even name that."""
    if len(data) < HEAD.size or data[0] != TAG:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"not an owner call frame ({len(data)} bytes)")
    op = data[1]
    try:
        smallest = _SMALLEST.get(op)
        if smallest is None:
            raise _Bad(f"unknown owner call {op}")
        if len(data) < smallest:
            raise _Bad(f"a frame of op {op} of {len(data)} bytes is cut short (at least {smallest})")
        if op == OP_READ:
            return _read(data)
        if op == OP_OPEN_WRITE:
            return _open_write(data)
        if op == OP_COMMIT_WRITE:
            return _commit_write(data)
        if op == OP_RELEASE:
            return _release(data)
        if op == OP_WRITE:
            return _write(data)
        if op == OP_NOTIFY:
            return _notify(data)
        return _bare(data, op)
    except _Bad as exc:
        raise oc.RefusedCall(HEAD.unpack_from(data)[4], StatusCode.LLM_PARAM_INVALID, str(exc)) from None


def decode_reply(data: bytes) -> oc.OwnerReply:
    """A REPLY frame; ``DataDistError`` (``LLM_PARAM_INVALID``) when it is malformed."""
    if len(data) < _REPLY.size or data[0] != TAG:
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a reply frame of {len(data)} bytes is cut short")
    _, flags, _, message_len, status, cid, nbytes, nids, data_len = _REPLY.unpack_from(data)
    if nids > oc.MAX_OPEN_PER_CALL or _REPLY.size + 8 * nids + message_len + data_len != len(data):
        raise DataDistError(StatusCode.LLM_PARAM_INVALID, f"a malformed reply frame ({len(data)} bytes, {nids} "
                                                          f"transfers, {message_len} + {data_len} bytes after them)")
    at = _REPLY.size
    ids = _u64s(data, nids, at)
    at += 8 * nids
    message = data[at:at + message_len].decode("utf-8", "replace")
    at += message_len
    return oc.OwnerReply(cid, status, message, ids, nbytes, bool(flags & _RELEASE_NEEDED), data[at:])
