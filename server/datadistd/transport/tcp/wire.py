"""The TCP data plane's wire format and the small helpers every part of it shares (see the package doc)."""

from __future__ import annotations

import logging
import socket
import struct
import time
from typing import Callable, Sequence

from datadist.status import LLMStatusCode, code_2_status

from ...core.errors import DataDistError
from ...memory.base import Segment
from ...memory.segments import SegmentTable
from ..base import CONTROL_CALL, CONTROL_KINDS, CONTROL_REPLY, CONTROL_TRANSPORT

log = logging.getLogger("datadistd.transport.tcp")

PROTOCOL_VERSION = 1
HELLO = struct.Struct("<4sBBHH")
HELLO_MAGIC = b"DDHL"
ACK = b"\x01"
MAX_TOKEN = 64
MAX_STREAMS = 64

HEADER = struct.Struct("<4sBxxxQQQ")
FRAME_MAGIC = b"DDFR"
KIND_DATA, KIND_ABORT, KIND_PING = 1, 2, 3
KIND_CALL, KIND_REPLY, KIND_TRANSPORT = CONTROL_CALL, CONTROL_REPLY, CONTROL_TRANSPORT
KIND_CONTROL = CONTROL_KINDS
MAX_FRAME = 1 << 30          # a DATA frame longer than this is a protocol error
MAX_CONTROL = 16 << 20       # a CALL/REPLY/TRANSPORT payload longer than this is a protocol error (2**20 block ids fit)
_U64 = (1 << 64) - 1

_POLL = 0.2                  # receive timeout inside a frame: a reader notices a cancel (mapped memory), a close
_STALL = 10.0                # a peer that sends nothing of a frame it began for this long loses the connection
_TURN_FRAMES = 64            # frames one reactor turn reads off a connection before it lets the others have a go
_READ_AHEAD = 16 << 10       # a reader's read-ahead buffer: small control frames come whole in one receive call
_QUIESCE = 1.0               # how long wait()/cancel() wait for a reader to leave the memory
_DISCARD = 256 << 10         # discard buffer of a reader thread
_STAGING = 4 << 20           # receive staging buffer for handles without a view
_RECV_MAX = 1 << 20          # bytes asked of one receive call (see DataConn._recv_mapped)
_IOV_MAX = 1024              # buffers per sendmsg/recvmsg_into call (Linux IOV_MAX)
_SPARES = 8                  # send staging buffers kept for reuse ...
_SPARE_BYTES = 16 << 20      # ... of at most this size
_JOIN = 2.0                  # bound on joining threads at stop()
_ABORT_TIMEOUT = 0.5
# socket's MSG_* are IntFlag members: plain ints here, as every ``|``/``&`` on a member builds a new member
# (an enum call, ~1 us) -- and these are used once per frame
_SEND_FLAGS = int(getattr(socket, "MSG_NOSIGNAL", 0))
_DONTWAIT = int(getattr(socket, "MSG_DONTWAIT", 0))
_SEND_NOWAIT = _SEND_FLAGS | _DONTWAIT
_INLINE_MAX = 256 << 10      # try_send: the largest transfer sent from the caller's thread
_FEW = 4                     # up to this many staged segments: per-segment read_into/write_from, no batch
_FRAME_SEGMENTS = _IOV_MAX     # at most this many segments per DATA frame (see staging.frame_cuts)
_INLINE_FINISH = 0.05        # try_send: how long a frame cut short by a full socket may take to finish
_WAITALL = int(socket.MSG_WAITALL)


def _timeval(seconds: float) -> bytes:
    """``struct timeval`` for SO_RCVTIMEO/SO_SNDTIMEO; at least 1 ms (zero would mean 'forever')."""
    seconds = max(seconds, 1e-3)
    return struct.pack("@ll", int(seconds), int((seconds % 1) * 1e6))


def _table(segments: Sequence[Segment]) -> SegmentTable:
    """The segments as a table; ``LLM_PARAM_INVALID`` naming the first one outside its memory.

    The check and the stream positions are cached on the table, so when the event loop called this
    first (``expect``, ``try_send``) a worker thread's ``send`` allocates nothing big."""
    table = SegmentTable.of(segments)
    table.ends  # noqa: B018 - computed (and cached) here, on the caller's thread
    bad = table.first_bad()
    if bad >= 0:
        offset, length = int(table.offsets[bad]), int(table.lengths[bad])
        raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID,
                            f"segment {bad} [{offset}, {offset + length}) lies outside its memory "
                            f"of {table.handles[int(table.which[bad])].size} bytes")
    return table


def _configure(sock: socket.socket, nodelay: bool, sndbuf: int | None, rcvbuf: int | None) -> None:
    if nodelay and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """``n`` bytes, ``None`` on EOF; ``TimeoutError`` at the deadline."""
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:  # each pass receives >= 1 byte, ends at EOF, or times out
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(remaining)
        k = sock.recv_into(mv[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def drop_sent(bufs: list[memoryview], sent: int) -> None:
    """Drop from ``bufs`` (in place) the first ``sent`` bytes, which went out -- and any empty buffer they reach:
    what a partial ``sendmsg`` of a frame leaves to send."""
    i = 0
    while i < len(bufs) and sent >= len(bufs[i]):
        sent -= len(bufs[i])
        i += 1
    if sent:
        bufs[i] = bufs[i][sent:]
    del bufs[:i]


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    scheme, sep, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if not sep or scheme != "tcp" or not host or not port.isdigit():
        raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"bad data endpoint {endpoint!r}; want tcp://host:port")
    return host.strip("[]"), int(port)


def _encode_code(code: int) -> int:
    return int(code) & _U64


def _decode_code(value: int) -> LLMStatusCode:
    return code_2_status(value - (1 << 64) if value >= 1 << 63 else value)


class _Closed(Exception):
    """The local side closed the connection; the reader leaves quietly."""


class _ProtocolError(Exception):
    pass


class _SendError(Exception):
    def __init__(self, code: LLMStatusCode, message: str, unusable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.unusable = unusable  # a partial frame was written or the socket failed


# ---- receipts --------------------------------------------------------------------------------

_PENDING, _DONE, _FAILED = 0, 1, 2


ControlHandler = Callable[[int, bytes], None]


