"""The attach connection's binary pull/push frames (attach protocol 4): the one definition of their layout.

A worker's pull or push to its local daemon is one fixed-layout little-endian datagram instead of a protobuf
``AttachRequest`` -- or, when its block lists do not fit one datagram, a first frame and continuation frames; the
daemon answers with one fixed-layout reply. Protobuf stays on the control plane (hello, memory, pools). Every frame
starts with ``MAGIC`` (0xFF): a protobuf message never starts with it (field 31 of wire type 7, which does not
exist), so the daemon tells the two apart by the first byte. Layout and rules: ``docs/daemon.md``, "The attach
connection's transfer frames".

Request (``REQUEST``, 144 bytes, then block numbers)::

    off size field
      0  1   magic 0xFF
      1  1   op: 1 pull, 2 push (3: a continuation frame, below)
      2  1   kind: 0 cache (pull_cache / push_cache), 1 blocks, 2 extents (HIXL's TransferSync/TransferAsync: op 1
             READ, 2 WRITE; key kind 0, the key's cluster id the remote engine's and its other fields 0, local cache
             id 0; the block numbers are the extents, three each -- local_addr, remote_addr, len -- as n_remote,
             n_local 0)
      3  1   key kind: 1 CacheKey, 2 CacheKeyByIdAndIndex, 3 BlocksCacheKey
      4  1   flags: 1 src layer range, 2 dst layer range, 4 timeout_ms, 8 src offset, 16 dst offset, 32 exclusive,
                    64 more follow (continuation frames carry the rest of the block numbers)
      5  3   zero
      8  8   u64 request id (echoed in the reply; a frame of 16 bytes or more names it)
     16  8   u64 engine id
     24  8   i64 local cache id
     32 32   u64 key: cluster id, then CacheKey req_id, model_id, prefix_id | by-id cache_id (i64), batch_index, 0
                 | BlocksCacheKey model_id, 0, 0
     64  4   u32 local batch index
     68  4   u32 tensor_num_per_layer (0 = the default, 2)
     72  8   i64 size (-1 = default)
     80 16   i64 src layer range start, stop (when flag 1)
     96 16   i64 dst layer range start, stop (when flag 2)
    112  4   u32 timeout_ms (when flag 4)
    116  4   zero
    120  8   u64 src cache offset (when flag 8)
    128  8   u64 dst cache offset (when flag 16)
    136  4   u32 n_remote
    140  4   u32 n_local
    144      the block numbers (u64): n_remote remote blocks, then n_local local blocks

Without flag 64 the frame carries all ``n_remote + n_local`` block numbers. With it, ``n_remote`` and ``n_local``
are the totals, the frame carries the first ``k`` of the ``n_remote + n_local`` numbers (``0 <= k < n_remote +
n_local``) and continuation frames of the same request id carry the rest, in order, each at least one::

    off size field
      0  1   magic 0xFF
      1  1   op: 3 continuation
      2  6   zero
      8  8   u64 request id (of the first frame)
     16      block numbers (u64), the next ones of the transfer

The frames of one transfer come back to back on the connection (nothing else between them); the transfer starts
when its last number is in. ``encode_frames`` cuts a transfer into frames, ``decode_request`` reads a first (or
whole) frame, ``Partial`` assembles the rest; the daemon bounds what it assembles (``api/attach.py``).

Reply (``REPLY``, 48 bytes, then the error message as UTF-8)::

      0  1   magic 0xFF
      1  7   zero
      8  8   u64 request id
     16  8   i64 status (LLMStatusCode; 0 = success)
     24  8   u64 bytes moved
     32 16   transport name, UTF-8, NUL-padded
"""

from __future__ import annotations

import struct
from typing import List, NamedTuple, Optional, Tuple, Union

__all__ = ["MAGIC", "MAX_DATAGRAM", "PULL", "PUSH", "CONTINUE", "KIND_CACHE", "KIND_BLOCKS", "KIND_EXTENTS",
           "KEY_CACHE", "KEY_BY_ID", "KEY_BLOCKS", "REQUEST", "CONTINUATION", "REPLY", "TransferFrame", "FrameReply",
           "FrameError", "Partial", "encode_request", "encode_frames", "decode_request", "is_continuation",
           "encode_reply", "decode_reply", "request_id_of"]

#: first byte of every binary frame (never the first byte of a protobuf message)
MAGIC = 0xFF
#: the largest attach datagram either end takes (protobuf messages and binary frames alike)
MAX_DATAGRAM = 64 << 10
PULL, PUSH, CONTINUE = 1, 2, 3
KIND_CACHE, KIND_BLOCKS = 0, 1             # TransferKind (datadist.proto)
KIND_EXTENTS = 2                           # HIXL's extents (``ExtentTransferRequest``'s, as block numbers)
KEY_CACHE, KEY_BY_ID, KEY_BLOCKS = 1, 2, 3
_SRC, _DST, _TIMEOUT, _SRC_OFF, _DST_OFF, _EXCLUSIVE, _MORE = 1, 2, 4, 8, 16, 32, 64

_HEAD = "<BBBBB3xQQqQQQQIIqqqqqI4xQQII"
REQUEST = struct.Struct(_HEAD)
CONTINUATION = struct.Struct("<BB6xQ")
REPLY = struct.Struct("<B7xQqQ16s")
_ID = struct.Struct("<8xQ")
_U64 = 1 << 64
_NO_RANGE = (0, 0)
#: block numbers a first frame and a continuation frame carry at most
_FIRST_ROOM = (MAX_DATAGRAM - REQUEST.size) // 8
_NEXT_ROOM = (MAX_DATAGRAM - CONTINUATION.size) // 8


class TransferFrame(NamedTuple):
    """What a pull/push frame carries: ``TransferRequest``'s fields (``datadist.proto``)."""
    op: int                                   # PULL or PUSH
    engine_id: int
    kind: int                                 # TransferKind: 0 cache, 1 blocks; KIND_EXTENTS
    key_kind: int                             # KEY_CACHE, KEY_BY_ID or KEY_BLOCKS
    key: Tuple[int, int, int, int]            # cluster id and the kind's fields (by-id cache_id signed)
    local_cache_id: int
    remote_blocks: Tuple[int, ...] = ()
    local_blocks: Tuple[int, ...] = ()
    local_batch_index: int = 0
    size: int = -1
    tensor_num_per_layer: int = 0
    src_layers: Optional[Tuple[int, int]] = None
    dst_layers: Optional[Tuple[int, int]] = None
    timeout_ms: Optional[int] = None
    src_offset: Optional[int] = None
    dst_offset: Optional[int] = None
    exclusive: bool = False


class FrameReply(NamedTuple):
    request_id: int
    status: int
    nbytes: int
    transport: str
    message: str


class FrameError(ValueError):
    """A frame that cannot be decoded; ``request_id`` when it names one (answer it), else None (drop the sender)."""

    def __init__(self, message: str, request_id: Optional[int] = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def _head(request_id: int, f: TransferFrame, more: bool) -> bytes:
    flags = ((_SRC if f.src_layers is not None else 0) | (_DST if f.dst_layers is not None else 0)
             | (_TIMEOUT if f.timeout_ms is not None else 0) | (_SRC_OFF if f.src_offset is not None else 0)
             | (_DST_OFF if f.dst_offset is not None else 0) | (_EXCLUSIVE if f.exclusive else 0)
             | (_MORE if more else 0))
    cluster, a, b, c = f.key
    if f.key_kind == KEY_BY_ID and a < 0:
        a += _U64                             # the i64 cache id as its two's complement
    src = f.src_layers or _NO_RANGE
    dst = f.dst_layers or _NO_RANGE
    return REQUEST.pack(MAGIC, f.op, f.kind, f.key_kind, flags, request_id, f.engine_id, f.local_cache_id, cluster,
                        a, b, c, f.local_batch_index, f.tensor_num_per_layer, f.size, src[0], src[1], dst[0], dst[1],
                        f.timeout_ms or 0, f.src_offset or 0, f.dst_offset or 0, len(f.remote_blocks),
                        len(f.local_blocks))


def _words(values: Tuple[int, ...]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def encode_request(request_id: int, f: TransferFrame) -> bytes:
    """The one datagram of ``f`` (whatever its length: ``encode_frames`` cuts it to the datagram cap); ValueError
    when a field is out of its type's range."""
    try:
        return _head(request_id, f, False) + _words(f.remote_blocks + f.local_blocks)
    except struct.error as exc:
        raise ValueError(f"a transfer frame field is out of its range: {exc}") from None


def encode_frames(request_id: int, f: TransferFrame) -> List[bytes]:
    """The datagrams of ``f``, each at most ``MAX_DATAGRAM`` bytes: one frame when its block lists fit, else a
    first frame (flag "more follow") and continuation frames; ValueError when a field is out of its type's range."""
    numbers = f.remote_blocks + f.local_blocks
    try:
        if len(numbers) <= _FIRST_ROOM:
            return [_head(request_id, f, False) + struct.pack(f"<{len(numbers)}Q", *numbers)]
        frames = [_head(request_id, f, True) + _words(numbers[:_FIRST_ROOM])]
        cont = CONTINUATION.pack(MAGIC, CONTINUE, request_id)
        frames += [cont + _words(numbers[at:at + _NEXT_ROOM]) for at in range(_FIRST_ROOM, len(numbers), _NEXT_ROOM)]
    except struct.error as exc:
        raise ValueError(f"a transfer frame field is out of its range: {exc}") from None
    return frames


def request_id_of(data: bytes) -> Optional[int]:
    """The request id a (possibly malformed) frame names, or None when it is too short to name one."""
    return _ID.unpack_from(data)[0] if len(data) >= _ID.size else None


def is_continuation(data: bytes) -> bool:
    """Whether ``data`` (a frame: its first byte is ``MAGIC``) claims to be a continuation frame."""
    return len(data) >= 2 and data[1] == CONTINUE


class Partial:
    """A transfer whose block numbers continue in continuation frames: ``add`` each, ``frame`` once ``missing`` is
    0. ``total`` is what the first frame announced (the daemon bounds it before it takes a continuation)."""
    __slots__ = ("request_id", "head", "n_remote", "total", "words")

    def __init__(self, request_id: int, head: TransferFrame, n_remote: int, total: int, first: bytes) -> None:
        self.request_id = request_id
        self.head = head                      # the frame's fields, without blocks
        self.n_remote = n_remote
        self.total = total
        self.words = bytearray(first)         # the block numbers in so far, as they came (u64 little-endian)

    @property
    def missing(self) -> int:
        return self.total - len(self.words) // 8

    def add(self, data: bytes) -> None:
        """The next continuation frame; FrameError (naming its request id) when it is not one of this transfer or
        carries more than is missing."""
        rid = request_id_of(data)
        if len(data) < CONTINUATION.size or not is_continuation(data) or data[0] != MAGIC:
            raise FrameError(f"not a continuation frame ({len(data)} bytes)", rid)
        if rid != self.request_id:
            raise FrameError(f"a continuation of request {rid} while request {self.request_id} is being assembled",
                             rid)
        body = len(data) - CONTINUATION.size
        if body == 0 or body % 8 or data[2:8] != bytes(6):
            raise FrameError(f"a continuation frame carries whole block numbers, at least one: got {body} bytes", rid)
        if body // 8 > self.missing:
            raise FrameError(f"continuation frames carry more than the {self.total} block numbers the first frame "
                             "announced", rid)
        self.words += data[CONTINUATION.size:]

    def frame(self) -> TransferFrame:
        """The whole transfer (every number in)."""
        assert self.missing == 0
        numbers = struct.unpack(f"<{self.total}Q", self.words)
        return self.head._replace(remote_blocks=numbers[:self.n_remote], local_blocks=numbers[self.n_remote:])


def decode_request(data: bytes) -> Tuple[int, Union[TransferFrame, Partial]]:
    """``(request_id, frame)`` of a whole frame, ``(request_id, Partial)`` of a first frame whose blocks continue;
    FrameError when ``data`` is not a whole, well-formed request frame."""
    if len(data) < REQUEST.size:
        raise FrameError(f"a transfer frame is at least {REQUEST.size} bytes, got {len(data)}", request_id_of(data))
    (magic, op, kind, key_kind, flags, rid, engine_id, cache_id, cluster, a, b, c, batch, per, size, s0, s1, d0, d1,
     timeout, src_off, dst_off, nr, nl) = REQUEST.unpack_from(data)
    if magic != MAGIC or op not in (PULL, PUSH):
        raise FrameError(f"not a transfer frame (magic {magic:#x}, op {op})", rid)
    if flags >> 7:
        raise FrameError(f"unknown transfer frame flags {flags:#x}", rid)
    more = bool(flags & _MORE)
    carried, rest = divmod(len(data) - REQUEST.size, 8)
    if not more and carried != nr + nl or rest:
        raise FrameError(f"a transfer frame of {nr} + {nl} blocks is {REQUEST.size + 8 * (nr + nl)} bytes, "
                         f"got {len(data)}", rid)
    if more and carried >= nr + nl:
        raise FrameError(f"a first frame of {nr} + {nl} blocks says more follow but carries {carried}", rid)
    if key_kind == KEY_BY_ID and a >= 1 << 63:
        a -= _U64
    head = TransferFrame(
        op, engine_id, kind, key_kind, (cluster, a, b, c), cache_id, (), (), batch, size, per,
        (s0, s1) if flags & _SRC else None, (d0, d1) if flags & _DST else None,
        timeout if flags & _TIMEOUT else None, src_off if flags & _SRC_OFF else None,
        dst_off if flags & _DST_OFF else None, bool(flags & _EXCLUSIVE))
    if more:
        return rid, Partial(rid, head, nr, nr + nl, data[REQUEST.size:])
    end = REQUEST.size + 8 * nr
    return rid, head._replace(remote_blocks=struct.unpack_from(f"<{nr}Q", data, REQUEST.size) if nr else (),
                              local_blocks=struct.unpack_from(f"<{nl}Q", data, end) if nl else ())


def encode_reply(request_id: int, status: int = 0, nbytes: int = 0, transport: str = "", message: str = "") -> bytes:
    head = REPLY.pack(MAGIC, request_id, status, nbytes, transport.encode()[:16])
    return head + message.encode() if message else head


def decode_reply(data: bytes) -> FrameReply:
    """FrameError when ``data`` is not a reply frame."""
    if len(data) < REPLY.size or data[0] != MAGIC:
        raise FrameError(f"not a transfer reply ({len(data)} bytes)", request_id_of(data))
    _, rid, status, nbytes, transport = REPLY.unpack_from(data)
    return FrameReply(rid, status, nbytes, transport.rstrip(b"\0").decode(errors="replace"),
                      data[REPLY.size:].decode(errors="replace"))
