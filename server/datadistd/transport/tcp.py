"""The TCP data plane: plain sockets, threads, scatter/gather, no staging copy for mapped memory.

Wire format (little endian, ``struct``):

* **Hello** (connecting side, once per socket): ``<4sBBHH`` = magic ``DDHL``, protocol version,
  token length (1..64), stream index, stream count; then the token bytes. The accepting side
  compares the token with every ``allow()``-ed token (``hmac.compare_digest``) and answers one
  ``ACK`` byte, or closes the socket without a word (bad token, garbage, or no hello within
  ``connect_timeout``).
* **Frames** (both directions, after the ack): ``<4sBxxxQQQ`` = magic ``DDFR``, kind,
  transfer id, stream offset, length; then the payload.

  - ``DATA``: ``length`` payload bytes that belong at byte ``offset`` of the concatenated
    stream of transfer ``transfer_id`` (the receiver's ``expect`` segments);
  - ``ABORT``: the sender gave up on ``transfer_id``; ``length`` carries the status code;
  - ``PING``: no payload; ignored (keeps the door open for liveness probes);
  - ``CALL`` / ``REPLY``: ``length`` (at most ``MAX_CONTROL``) bytes of a control message for the
    link manager (an owner call of ``reverse.FrameCalls`` and its answer); ``transfer id`` and
    ``offset`` are 0. The reader hands the payload to the channel's control handler (``on_control``)
    in its own thread; frames that arrive before a handler is set wait for it (at most
    ``_CONTROL_BACKLOG``). Peers that handshook with peer protocol 2 speak these.

  A malformed header closes that connection and marks its channel broken.

Segments travel as a ``memory.segments.SegmentTable`` (numpy arrays: handle, offset, length);
a plain segment list is converted once. Nothing is built per segment up front: each frame's pieces
are cut from the table when the frame is sent or received.

Threads: one accept thread per transport; each accepted socket gets a thread that does the
hello and then reads frames; each connected socket gets a reader thread. Readers scatter DATA
payloads straight into the destination memory with ``recvmsg_into`` (at most ``_RECV_MAX`` bytes
and ``_IOV_MAX`` views per call) or, for handles without a mapping, receive into a per-thread
staging buffer and write it out in one batch per handle (``write_raw``: cross-memory attach,
``IOV_MAX`` pieces per system call; else ``write_from``). Senders split the stream into frames of
``chunk_size`` bytes (or ``_FRAME_PIECES`` pieces, whichever ends first), stripe frame *k* over
socket *(base + k) % w* (``w`` = the stripe width, one worker thread per stripe, the caller being
one of them; ``base`` rotates per transfer, so concurrent transfers use every connection) and
write each frame with one ``socket.sendmsg([header, view, view, ...])`` under that socket's lock
(first come, first served), so concurrent transfers interleave at frame granularity. Pieces of
handles without a view are read into the worker's staging buffer first (``read_raw`` batches),
outside the lock. ``TcpChannel.try_send`` sends a small transfer as one frame from the calling
thread (the event loop) when a connection is idle, or declines without a side effect.

Memory safety: a reader touches a receipt's destination only between ``_begin_io`` and
``_end_io``; once a receipt failed or was cancelled, ``wait``/``cancel`` return only after every
reader left it, so the caller may reuse the memory at once.
"""

from __future__ import annotations

import bisect
import collections
import functools
import hmac
import itertools
import logging
import os
import secrets
import socket
import struct
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from datadist.status import LLMStatusCode, code_2_status

from ..admission import Admission, AdmissionLimits, Ticket
from ..core.errors import DataDistError
from ..core.types import TransferId
from ..memory import addr as memaddr
from ..memory.base import Segment
from ..memory.segments import SegmentTable, byte_view, cut
from .base import CONTROL_CALL, CONTROL_REPLY, Channel

__all__ = ["TcpTransport", "TcpChannel", "TcpReceipt", "PROTOCOL_VERSION"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
HELLO = struct.Struct("<4sBBHH")
HELLO_MAGIC = b"DDHL"
ACK = b"\x01"
MAX_TOKEN = 64
MAX_STREAMS = 64

HEADER = struct.Struct("<4sBxxxQQQ")
FRAME_MAGIC = b"DDFR"
KIND_DATA, KIND_ABORT, KIND_PING = 1, 2, 3
KIND_CALL, KIND_REPLY = CONTROL_CALL, CONTROL_REPLY
MAX_FRAME = 1 << 30          # a DATA frame longer than this is a protocol error
MAX_CONTROL = 16 << 20       # a CALL/REPLY payload longer than this is a protocol error (2**20 block ids fit)
_CONTROL_BACKLOG = 256       # control frames kept for a channel whose handler is not set yet
_U64 = (1 << 64) - 1

_POLL = 0.2                  # reader wake-up interval (notices close / cancel)
_QUIESCE = 1.0               # how long wait()/cancel() wait for a reader to leave the memory
_DISCARD = 256 << 10         # discard buffer of a reader thread
_STAGING = 4 << 20           # receive staging buffer for handles without a view
_RECV_MAX = 1 << 20          # bytes asked of one receive call (see _Conn._recv_mapped)
_IOV_MAX = 1024              # buffers per sendmsg/recvmsg_into call (Linux IOV_MAX)
_SPARES = 8                  # send staging buffers kept for reuse ...
_SPARE_BYTES = 16 << 20      # ... of at most this size
_JOIN = 2.0                  # bound on joining threads at stop()
_ABORT_TIMEOUT = 0.5
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_INLINE_MAX = 256 << 10      # try_send: the largest transfer sent from the caller's thread
_FEW = 4                     # up to this many staged pieces: per-piece read_into/write_from, no batch
_FRAME_PIECES = _IOV_MAX     # at most this many pieces per DATA frame (see _frames)
_INLINE_FINISH = 0.05        # try_send: how long a frame cut short by a full socket may take to finish
_WAITALL = socket.MSG_WAITALL


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


class TcpReceipt:
    """Where the bytes of one incoming transfer go, and how far they got."""

    def __init__(self, transport: "TcpTransport", transfer_id: TransferId, table: SegmentTable,
                 channel: "TcpChannel | None") -> None:
        self._transport = transport
        self._tid = transfer_id
        self._table = table.nonempty()
        # one writable byte view per destination handle (None: no mapping, bytes go through staging);
        # dropped once the receipt is over and no reader is in
        self._views: list[memoryview | None] = [byte_view(h, writable=True) for h in self._table.handles]
        self._mapped = np.array([v is not None for v in self._views], bool)
        self._raw = [hasattr(h, "write_raw") for h in self._table.handles]
        self._expected = self._table.nbytes
        self._received = 0
        self._lo: list[int] = []       # claimed stream ranges [lo, hi), sorted, disjoint, merged
        self._hi: list[int] = []
        self._channels: set[TcpChannel] = {channel} if channel is not None else set()
        self._bound = channel          # given: only frames of this channel may fill the receipt
        self._cond = threading.Condition(threading.Lock())
        self._active = 0               # readers writing into the destination right now
        self._state = _DONE if self._expected == 0 else _PENDING
        self._error: DataDistError | None = None

    @property
    def transfer_id(self) -> TransferId:
        return self._tid

    @property
    def expected(self) -> int:
        return self._expected

    @property
    def received(self) -> int:
        return self._received

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def wait(self, deadline: float) -> None:
        with self._cond:
            while self._state == _PENDING:  # ends at completion, failure or the deadline
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._state == _DONE:
                return
            if self._state == _PENDING:
                self._set_failed(LLMStatusCode.LLM_TIMEOUT,
                                 f"transfer {self._tid}: {self._received} of {self._expected} bytes arrived "
                                 f"before the deadline")
            self._quiesce()
            assert self._error is not None
            error = self._error
        raise DataDistError(error.code, error.message)

    def cancel(self) -> None:
        with self._cond:
            if self._state == _PENDING:
                self._set_failed(LLMStatusCode.LLM_FAILED, f"transfer {self._tid} was cancelled")
            self._quiesce()

    # -- used by readers and the transport --

    def _set_failed(self, code: LLMStatusCode, message: str) -> None:
        """Under ``_cond``."""
        self._state = _FAILED
        self._error = DataDistError(code, message)
        self._cond.notify_all()
        self._transport._forget(self._tid)
        if self._active == 0:
            self._drop_views()

    def _drop_views(self) -> None:
        """Under ``_cond``, once over and no reader is in: let go of the destination's memory views."""
        views, self._views = self._views, []
        for view in views:
            if view is not None:
                try:
                    view.release()
                except BufferError:
                    pass

    def _quiesce(self) -> None:
        """Under ``_cond``: let readers leave the destination memory before the caller reuses it."""
        limit = time.monotonic() + _QUIESCE
        while self._active > 0:  # readers hold _active for at most one recv (<= _POLL) or one copy
            remaining = limit - time.monotonic()
            if remaining <= 0:
                log.warning("transfer %s: a reader is still writing into the destination after %.1fs",
                            self._tid, _QUIESCE)
                return
            self._cond.wait(remaining)

    def _fail(self, code: LLMStatusCode, message: str, channel: "TcpChannel | None" = None) -> bool:
        with self._cond:
            if self._state != _PENDING or (channel is not None and channel not in self._channels):
                return False
            self._set_failed(code, message)
            return True

    def _claim(self, offset: int, length: int, channel: "TcpChannel") -> str | None:
        """Reserve ``[offset, offset+length)``; ``None`` if fine, ``""`` if the receipt is gone, else why not."""
        end = offset + length
        with self._cond:
            if self._state != _PENDING or (self._bound is not None and channel is not self._bound):
                return ""  # gone, or another link's frame naming this transfer id: discarded like unknown ids
            if length <= 0 or end > self._expected:
                return (f"transfer {self._tid}: frame [{offset}, {end}) is outside the expected "
                        f"{self._expected} bytes")
            i = bisect.bisect_right(self._lo, offset)
            if (i > 0 and self._hi[i - 1] > offset) or (i < len(self._lo) and self._lo[i] < end):
                return f"transfer {self._tid}: frame [{offset}, {end}) overlaps bytes already received"
            if i > 0 and self._hi[i - 1] == offset:
                self._hi[i - 1] = end
                if i < len(self._lo) and self._lo[i] == end:
                    self._hi[i - 1] = self._hi[i]
                    del self._lo[i], self._hi[i]
            elif i < len(self._lo) and self._lo[i] == end:
                self._lo[i] = offset
            else:
                self._lo.insert(i, offset)
                self._hi.insert(i, end)
            self._channels.add(channel)
            return None

    def _begin_io(self) -> bool:
        with self._cond:
            if self._state != _PENDING:
                return False
            self._active += 1
            return True

    def _end_io(self) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0 and self._state != _PENDING:
                self._drop_views()
                self._cond.notify_all()

    def _landed(self, n: int) -> None:
        with self._cond:
            if self._state != _PENDING:
                return
            self._received += n
            if self._received == self._expected:
                self._state = _DONE
                self._cond.notify_all()
                self._transport._forget(self._tid)
                if self._active == 0:
                    self._drop_views()


# ---- connections and channels ----------------------------------------------------------------

class _FairLock:
    """A lock with a timeout that is handed to waiters in arrival order.

    ``threading.Lock`` lets the releasing thread take it straight back, so a sender streaming a
    huge transfer could starve a small one on the same socket; with this lock they alternate per chunk.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locked = False
        self._waiters: collections.deque[threading.Event] = collections.deque()

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._locked:
                self._locked = True
                return True
            turn = threading.Event()
            self._waiters.append(turn)
        turn.wait(max(0.0, timeout))
        with self._mutex:
            if turn.is_set():  # handed over (possibly just as we timed out): ours now
                return True
            self._waiters.remove(turn)
            return False

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().set()  # stays locked: ownership passes to the next waiter
            else:
                self._locked = False


class _Conn:
    """One socket of a channel: its reader and its send lock."""

    def __init__(self, channel: "TcpChannel", sock: socket.socket, index: int, peer: str) -> None:
        self.channel = channel
        self.index = index
        self.peer = peer
        self.sock = sock
        # blocking mode with kernel timeouts: one system call per recv/send (no poll first);
        # receives wake every _POLL to notice a close, sends get the remaining time before each call
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(_POLL))
        self.lock = _FairLock()           # held per frame by senders, handed over first come first served
        self.closed = False
        self.bytes_sent = self.frames_sent = 0          # under lock
        self.bytes_received = self.frames_received = 0  # reader thread only
        self.bytes_discarded = 0

    def stats(self) -> dict[str, int]:
        return {"bytes_sent": self.bytes_sent, "frames_sent": self.frames_sent,
                "bytes_received": self.bytes_received, "frames_received": self.frames_received,
                "bytes_discarded": self.bytes_discarded}

    def shutdown(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv (EOF) and send (EPIPE)
        except OSError:
            pass

    def send_ack(self, deadline: float) -> None:
        """Accepting side: the one-byte answer to a good hello."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(deadline - time.monotonic()))
        self.sock.sendall(ACK)

    # -- sending (caller holds nothing; takes self.lock per frame) --

    def send_frame(self, bufs: list[memoryview], deadline: float) -> int:
        """Write ``bufs`` (header first) as one frame; return payload bytes. Raises ``_SendError``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self.lock.acquire(timeout=remaining):
            raise _SendError(LLMStatusCode.LLM_TIMEOUT, "deadline passed while waiting for a data connection",
                             unusable=False)
        try:
            return self._write(bufs, deadline)
        finally:
            self.lock.release()

    def send_chunk(self, tid: int, offset: int, length: int, plan: "_SendPlan", staging: memoryview | None,
                   deadline: float) -> None:
        """One DATA frame: stream bytes ``[offset, offset + length)`` of ``plan``. Pieces of handles without
        a view are first read into ``staging`` (the worker's own buffer, so a slow source never holds the
        socket): in one batch per handle (``read_raw``) or per piece (``read_into``); then the socket is taken."""
        bufs = [memoryview(HEADER.pack(FRAME_MAGIC, KIND_DATA, tid, offset, length))]
        plan.gather(offset, length, staging, bufs)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self.lock.acquire(timeout=remaining):
            raise _SendError(LLMStatusCode.LLM_TIMEOUT, "deadline passed while waiting for a data connection",
                             unusable=False)
        try:
            self._write(bufs, deadline)
            self.frames_sent += 1
            self.bytes_sent += length
        finally:
            self.lock.release()

    def write_nowait(self, bufs: list[memoryview], finish_by: float) -> bool:
        """Under ``self.lock``: one non-blocking ``sendmsg`` of the frame ``bufs``; False if the socket took
        nothing. A partial write is finished with blocking sends bounded by ``finish_by``."""
        if self.closed:
            raise _SendError(LLMStatusCode.LLM_LINK_FAILED, "data connection is closed", unusable=True)
        try:
            sent = self.sock.sendmsg(bufs, [], _SEND_FLAGS | _DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise _SendError(LLMStatusCode.LLM_LINK_FAILED, f"send failed: {exc}", unusable=True) from None
        total = sum(len(b) for b in bufs)
        if sent < total:  # the socket filled up mid-frame: the rest must follow, briefly
            rest = memoryview(b"".join(bytes(b) for b in bufs))[sent:]
            self._write([rest], finish_by, partial=True)
        return True

    def _write(self, bufs: list[memoryview], deadline: float, partial: bool = False) -> int:
        """Under ``self.lock``: ``sendmsg`` until every buffer is out; partial sends advance the list."""
        if self.closed:
            raise _SendError(LLMStatusCode.LLM_LINK_FAILED, "data connection is closed", unusable=True)
        payload = sum(len(b) for b in bufs) - HEADER.size
        written = 0
        i = 0
        bufs = [b for b in bufs if len(b)]
        while i < len(bufs):  # each pass writes >= 1 byte or raises
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _SendError(LLMStatusCode.LLM_TIMEOUT, "deadline passed in the middle of a frame",
                                 unusable=written > 0 or partial)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(remaining))
                sent = self.sock.sendmsg(bufs[i:i + _IOV_MAX], [], _SEND_FLAGS)
            except BlockingIOError:  # SO_SNDTIMEO expired before a byte went out
                raise _SendError(LLMStatusCode.LLM_TIMEOUT, "the peer did not take the bytes before the deadline",
                                 unusable=written > 0 or partial) from None
            except OSError as exc:
                raise _SendError(LLMStatusCode.LLM_LINK_FAILED, f"send failed: {exc}", unusable=True) from None
            written += sent
            while sent > 0:  # drop what went out
                head = len(bufs[i])
                if sent >= head:
                    sent -= head
                    i += 1
                else:
                    bufs[i] = bufs[i][sent:]
                    sent = 0
        return payload

    # -- receiving (reader thread) --

    def run(self, transport: "TcpTransport") -> None:
        header = bytearray(HEADER.size)
        hv = memoryview(header)
        reason = ""
        clean = False
        try:
            while True:  # one frame per pass; ends when the connection closes
                if not self._read_header(hv):
                    reason, clean = "the peer closed the connection", True
                    break
                magic, kind, tid, offset, length = HEADER.unpack(header)
                if magic != FRAME_MAGIC:
                    raise _ProtocolError(f"bad frame magic {magic!r}")
                if kind == KIND_DATA:
                    if length > MAX_FRAME:
                        raise _ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
                    self._on_data(transport, tid, offset, length)
                elif kind == KIND_ABORT:
                    receipt = transport._receipts.get(tid)
                    if receipt is not None:
                        code = _decode_code(length)
                        if code == LLMStatusCode.LLM_SUCCESS:
                            code = LLMStatusCode.LLM_FAILED
                        receipt._fail(code, f"transfer {tid} aborted by the sender ({code.name})")
                elif kind == KIND_PING:
                    if length or offset:
                        raise _ProtocolError("PING with a payload")
                elif kind in (KIND_CALL, KIND_REPLY):
                    if length > MAX_CONTROL or tid or offset:
                        raise _ProtocolError(f"malformed control frame ({length} bytes)")
                    payload = bytearray(length)
                    pv, got = memoryview(payload), 0
                    while got < length:  # each pass reads >= 1 byte or polls (ends with the connection)
                        got += self._recv_once(pv[got:])
                    self.bytes_received += length
                    self.channel._on_control(kind, bytes(payload))
                else:
                    raise _ProtocolError(f"unknown frame kind {kind}")
                self.frames_received += 1
        except _Closed:
            reason = ""
        except _ProtocolError as exc:
            reason = f"protocol error: {exc}"
        except OSError as exc:
            reason = f"connection lost: {exc}"
        except Exception as exc:  # noqa: BLE001 - a reader must always report and clean up
            log.exception("data connection %s#%d: reader failed", self.peer, self.index)
            reason = f"reader failed: {exc!r}"
        finally:
            self.shutdown()
            self.channel._conn_lost(self, reason, clean)
            if self.lock.acquire(timeout=_JOIN):  # a sender holding it fails at once after shutdown
                self.sock.close()
                self.lock.release()
            else:
                log.warning("data connection %s#%d: a sender still holds the socket; leaving it to the GC",
                            self.peer, self.index)

    def _recv_once(self, mv: memoryview) -> int:
        """One ``recv_into``: bytes read, 0 on a quiet poll interval; EOF raises."""
        try:
            n = self.sock.recv_into(mv, 0, _WAITALL)
        except BlockingIOError:  # SO_RCVTIMEO: a quiet poll interval
            if self.closed:
                raise _Closed() from None
            return 0
        if n == 0:
            if self.closed:
                raise _Closed()
            raise ConnectionResetError("the peer closed the connection in the middle of a frame")
        return n

    def _read_header(self, hv: memoryview) -> bool:
        got = 0
        while got < len(hv):  # bounded by the connection's life; every pass polls at most _POLL
            try:
                n = self.sock.recv_into(hv[got:], 0, _WAITALL)
            except BlockingIOError:
                if self.closed:
                    raise _Closed() from None
                continue
            if n == 0:
                if self.closed:
                    raise _Closed()
                if got == 0:
                    return False
                raise ConnectionResetError("the peer closed the connection in the middle of a frame header")
            got += n
        return True

    def _discard(self, n: int) -> None:
        buf = self.channel._transport._discard_buffer()
        while n > 0:  # each pass reads >= 1 byte or polls (ends with the connection)
            got = self._recv_once(buf[:min(n, len(buf))])
            n -= got
            self.bytes_received += got
            self.bytes_discarded += got

    def _recvmsg_once(self, bufs: list[memoryview]) -> int:
        """One scatter ``recvmsg_into`` (at most ``_IOV_MAX`` buffers): bytes read, 0 on a quiet poll interval."""
        try:
            n = self.sock.recvmsg_into(bufs, 0, _WAITALL)[0]
        except BlockingIOError:  # SO_RCVTIMEO: a quiet poll interval
            if self.closed:
                raise _Closed() from None
            return 0
        if n == 0:
            if self.closed:
                raise _Closed()
            raise ConnectionResetError("the peer closed the connection in the middle of a frame")
        return n

    def _on_data(self, transport: "TcpTransport", tid: int, offset: int, length: int) -> None:
        receipt = transport._receipts.get(tid)
        if receipt is None:
            self._discard(length)
            return
        why = receipt._claim(offset, length, self.channel)
        if why == "":
            self._discard(length)
            return
        if why is not None:
            receipt._fail(LLMStatusCode.LLM_PARAM_INVALID, why)
            raise _ProtocolError(why)
        which, offs, lens = receipt._table.cut(offset, offset + length)
        mapped = receipt._mapped[which]
        done = 0
        try:
            if mapped.all():
                done = self._recv_mapped(receipt, which, offs, lens)
            elif not mapped.any():
                done = self._recv_staged(transport, receipt, tid, which, offs, lens)
            else:  # runs of mapped and unmapped pieces, in stream order
                edges = [0, *(np.flatnonzero(mapped[1:] != mapped[:-1]) + 1).tolist(), len(mapped)]
                for a, b in zip(edges[:-1], edges[1:], strict=True):
                    want = int(lens[a:b].sum())
                    if mapped[a]:
                        got = self._recv_mapped(receipt, which[a:b], offs[a:b], lens[a:b])
                    else:
                        got = self._recv_staged(transport, receipt, tid, which[a:b], offs[a:b], lens[a:b])
                    done += got
                    if got < want:
                        break
        except (OSError, _Closed):
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED,
                          f"transfer {tid}: data connection from {self.peer} lost in the middle of a frame")
            raise
        if done < length:  # the receipt ended (failed, cancelled) while its bytes were arriving
            self._discard(length - done)
            return
        receipt._landed(length)

    def _recv_mapped(self, receipt: TcpReceipt, which: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> int:
        """Scatter-receive pieces straight into mapped destination memory, ``_IOV_MAX`` buffers per call.

        The destination is touched only between ``_begin_io`` and ``_end_io``, so a receipt that failed
        or was cancelled is never written once ``wait()``/``cancel()`` returned. Returns the bytes read
        (fewer than asked when the receipt ended)."""
        starts = offs.tolist()
        ends = (offs + lens).tolist()
        hs = which.tolist()
        one = hs[0] if hs[0] == hs[-1] and (len(hs) < 3 or not (which != hs[0]).any()) else -1
        count = len(starts)
        # pieces i..j of at most _RECV_MAX bytes per call: small receives keep the copy out of the
        # socket cache-warm and let the sender refill the socket while this thread copies
        cum = (np.cumsum(lens) - lens).tolist()
        i = 0
        head = 0       # bytes of piece i already received
        done = 0
        while i < count:  # each pass reads >= 1 byte, polls, or ends with the receipt
            if not receipt._begin_io():
                return done
            try:
                views = receipt._views
                limit = cum[i] + head + _RECV_MAX
                j = min(count, i + _IOV_MAX, bisect.bisect_left(cum, limit, i + 1))
                if one >= 0:
                    v = views[one]
                    bufs = [v[a:b] for a, b in zip(starts[i:j], ends[i:j], strict=True)]  # type: ignore[index]
                else:
                    bufs = [views[h][a:b] for h, a, b in zip(hs[i:j], starts[i:j], ends[i:j], strict=True)]
                if head:
                    bufs[0] = bufs[0][head:]
                over = cum[j - 1] + ends[j - 1] - starts[j - 1] - limit   # the last piece past the limit
                if over > 0:
                    bufs[-1] = bufs[-1][:len(bufs[-1]) - over]
                got = self._recvmsg_once(bufs)
            finally:
                bufs = []
                receipt._end_io()
            done += got
            self.bytes_received += got
            while got:  # advance over what arrived
                rest = ends[i] - starts[i] - head
                if got >= rest:
                    got -= rest
                    i += 1
                    head = 0
                else:
                    head += got
                    got = 0
        return done

    def _recv_staged(self, transport: "TcpTransport", receipt: TcpReceipt, tid: int, which: np.ndarray,
                     offs: np.ndarray, lens: np.ndarray) -> int:
        """Pieces of handles without a mapping: receive a staging buffer full, then write it out in one
        batch per handle (``write_raw``: one system call per ``IOV_MAX`` pieces) or per piece
        (``write_from``). Returns the bytes read (fewer than asked when the receipt ended or failed)."""
        staging, base = transport._staging_buffer()
        ends = np.cumsum(lens)
        pos = ends - lens
        total = int(ends[-1])
        done = 0
        for lo in range(0, total, len(staging)):  # one staging buffer per pass
            hi = min(lo + len(staging), total)
            filled = 0
            while filled < hi - lo:
                got = self._recv_once(staging[filled:min(hi - lo, filled + _RECV_MAX)])
                filled += got
                self.bytes_received += got
            i0, i1, k, (o, p) = cut(ends, lens, lo, hi, offs, pos)
            if not receipt._begin_io():
                return done + hi - lo   # read off the wire, dropped
            failure: Exception | None = None
            try:
                _write_out(receipt, which[i0:i1], o, base + (p - lo), k, staging, base)
            except Exception as exc:  # noqa: BLE001 - the destination failed, not the wire
                failure = exc
            finally:
                receipt._end_io()
            done += hi - lo
            if failure is not None:
                code = failure.code if isinstance(failure, DataDistError) else LLMStatusCode.LLM_FAILED
                receipt._fail(code, f"transfer {tid}: writing into the destination failed: {failure}")
                return done
        return done


def _by_handle(which: np.ndarray, among: np.ndarray | None = None) -> list[tuple[int, Any]]:
    """``(handle index, selector)`` for each distinct handle of the pieces (``among``: only those pieces)."""
    if among is None:
        first = int(which[0])
        if int(which[-1]) == first and (len(which) < 3 or bool((which == first).all())):
            return [(first, slice(None))]       # the common case: one handle (one tensor) per window
        return [(h, which == h) for h in np.unique(which).tolist()]
    return [(h, among & (which == h)) for h in np.unique(which[among]).tolist()]


def _write_out(receipt: TcpReceipt, which: np.ndarray, offs: np.ndarray, local: np.ndarray, lens: np.ndarray,
               staging: memoryview, base: int) -> None:
    """Under ``_begin_io``: staged pieces into their (unmapped) destination handles, one batch per handle."""
    handles = receipt._table.handles
    if len(which) <= _FEW:  # a few pieces: one write_from each beats building a batch
        for h, off, loc, n in zip(which.tolist(), offs.tolist(), local.tolist(), lens.tolist(), strict=True):
            handles[h].write_from(off, staging[loc - base:loc - base + n])
        return
    for h, sel in _by_handle(which):
        handle = handles[h]
        if receipt._raw[h]:
            handle.write_raw(np.stack((offs[sel], local[sel], lens[sel]), axis=1))
            continue
        for off, loc, n in zip(offs[sel].tolist(), local[sel].tolist(), lens[sel].tolist(), strict=True):
            handle.write_from(off, staging[loc - base:loc - base + n])


class TcpChannel:
    """The connections made with one token; carries frames both ways."""

    def __init__(self, transport: "TcpTransport", token: bytes, peer: str, outbound: bool) -> None:
        self._transport = transport
        self._token = token
        self._peer = peer
        self._outbound = outbound
        self._conns: list[_Conn] = []
        self._lock = threading.Lock()
        self._broken = False
        self._closed = False
        self._reason = ""
        self._rr = itertools.count()
        self._control: ControlHandler | None = None
        self._backlog: list[tuple[int, bytes]] = []   # control frames before a handler was set

    def __repr__(self) -> str:
        return (f"TcpChannel(peer={self._peer!r}, {'out' if self._outbound else 'in'}, streams={self.streams}, "
                f"broken={self.broken})")

    @property
    def token(self) -> bytes:
        return self._token

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def streams(self) -> int:
        with self._lock:
            return sum(1 for c in self._conns if not c.closed)

    @property
    def broken(self) -> bool:
        return self._broken or self._closed

    @property
    def reason(self) -> str:
        return self._reason

    def stats(self) -> dict[str, object]:
        with self._lock:
            per = [c.stats() for c in self._conns]
        total: dict[str, object] = {k: sum(p[k] for p in per) for k in
                                    ("bytes_sent", "frames_sent", "bytes_received", "frames_received",
                                     "bytes_discarded")}
        total["connections"] = per
        return total

    def _attach(self, sock: socket.socket, index: int, peer: str) -> _Conn | None:
        with self._lock:
            if self._broken or self._closed:
                return None
            conn = _Conn(self, sock, index, peer)
            self._conns.append(conn)
            return conn

    def _live(self) -> list[_Conn]:
        with self._lock:
            if self._broken or self._closed:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                    f"data channel to {self._peer} is {'closed' if self._closed else 'broken'}"
                                    f"{': ' + self._reason if self._reason else ''}")
            conns = [c for c in self._conns if not c.closed]
        if not conns:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"data channel to {self._peer} has no connection")
        return conns

    # -- sending --

    def send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> None:
        table = _table(segments)
        conns = self._live()
        if table.nbytes == 0:
            return
        plan = _SendPlan(table)
        total = plan.total
        size = self._transport.chunk_size
        chunks = _frames(plan.table, size)
        n = len(conns)
        base = next(self._rr)
        workers = min(n, len(chunks), self._transport.stripe)
        shares = [chunks[w::workers] for w in range(workers)]  # chunk k goes to worker k % workers
        errors: list[_SendError] = []
        stop = threading.Event()
        transport = self._transport

        def work(conn: _Conn, share: list[tuple[int, int]]) -> None:
            staging: memoryview | None = None
            try:
                for offset, length in share:  # in order, one chunk per frame
                    if stop.is_set():
                        return
                    if staging is None and not plan.all_mapped:
                        staging = transport._take_staging(size)
                    try:
                        conn.send_chunk(transfer_id, offset, length, plan, staging, deadline)
                    except _SendError as exc:
                        if exc.unusable:
                            conn.shutdown()
                        errors.append(exc)
                        stop.set()
                        return
                    except Exception as exc:  # noqa: BLE001 - e.g. a handle's read_into failed
                        code = exc.code if isinstance(exc, DataDistError) else LLMStatusCode.LLM_FAILED
                        errors.append(_SendError(code, f"reading the source failed: {exc}", unusable=False))
                        stop.set()
                        return
            finally:
                if staging is not None:
                    transport._give_staging(staging)

        threads = [threading.Thread(target=work, args=(conns[(base + w) % n], shares[w]), daemon=True,
                                    name=f"datadist-tcp-send:{self._peer}#{(base + w) % n}")
                   for w in range(1, workers)]
        for t in threads:
            t.start()
        try:
            work(conns[base % n], shares[0])
            for t in threads:  # workers stop by the deadline: their socket timeouts come from it
                t.join(max(0.0, deadline - time.monotonic()) + _JOIN)
        finally:
            plan.release()
        if any(t.is_alive() for t in threads):
            errors.append(_SendError(LLMStatusCode.LLM_TIMEOUT, "a sender thread did not finish", unusable=True))
        if not errors:
            return
        first = errors[0]
        if any(e.unusable for e in errors):
            self._break(f"sending transfer {transfer_id} failed: {first.message}")
        else:
            self.abort(transfer_id, first.code)
        raise DataDistError(first.code, f"sending transfer {transfer_id} ({total} bytes) to {self._peer}: "
                                        f"{first.message}")

    def try_send(self, transfer_id: TransferId, segments: Sequence[Segment], deadline: float) -> bool:
        """Send a small transfer at once from the calling thread, or return False without a side effect.

        For the event loop: a transfer of at most ``_INLINE_MAX`` bytes goes out as one frame on an idle
        connection with a non-blocking ``sendmsg`` (unmapped pieces read into a staging buffer first); no
        executor hop, no thread switch. ``False`` (nothing sent) when it is larger, every connection is
        busy, or the socket would block. A frame cut short by a full socket is finished within
        ``_INLINE_FINISH`` seconds or its connection is closed (a peer that stopped reading), and the
        send raises, as ``send`` does."""
        table = _table(segments)
        if table.nbytes > _INLINE_MAX:
            return False
        conns = self._live()
        if table.nbytes == 0:
            return True
        plan = _SendPlan(table)
        staging = None if plan.all_mapped else self._transport._take_staging(plan.total)
        try:
            bufs = [memoryview(HEADER.pack(FRAME_MAGIC, KIND_DATA, transfer_id, 0, plan.total))]
            try:
                plan.gather(0, plan.total, staging, bufs)
            except Exception as exc:  # noqa: BLE001 - e.g. the source process is gone
                code = exc.code if isinstance(exc, DataDistError) else LLMStatusCode.LLM_FAILED
                self.abort(transfer_id, code)
                raise DataDistError(code, f"sending transfer {transfer_id} to {self._peer}: reading the source "
                                          f"failed: {exc}") from None
            n = len(conns)
            base = next(self._rr)
            for k in range(n):  # the first idle connection, starting where striping would
                conn = conns[(base + k) % n]
                if not conn.lock.acquire(timeout=0):
                    continue
                try:
                    if not conn.write_nowait(bufs, min(deadline, time.monotonic() + _INLINE_FINISH)):
                        continue
                    conn.frames_sent += 1
                    conn.bytes_sent += plan.total
                    return True
                except _SendError as exc:
                    if exc.unusable:
                        conn.shutdown()
                        self._break(f"sending transfer {transfer_id} failed: {exc.message}")
                    raise DataDistError(exc.code, f"sending transfer {transfer_id} ({plan.total} bytes) to "
                                                  f"{self._peer}: {exc.message}") from None
                finally:
                    conn.lock.release()
            return False
        finally:
            bufs = []
            plan.release()
            if staging is not None:
                self._transport._give_staging(staging)

    def abort(self, transfer_id: TransferId, code: LLMStatusCode) -> None:
        """Best effort, bounded by ``_ABORT_TIMEOUT``: one ABORT frame on the first free connection."""
        try:
            conns = self._live()
        except DataDistError:
            return
        header = memoryview(HEADER.pack(FRAME_MAGIC, KIND_ABORT, transfer_id, 0, _encode_code(code)))
        limit = time.monotonic() + _ABORT_TIMEOUT
        # first any idle connection, then wait (bounded, in all) for the first one
        for conn, until in [(c, time.monotonic() + 1e-3) for c in conns] + [(conns[0], limit)]:
            try:
                conn.send_frame([header], min(until, limit))
                return
            except _SendError as exc:
                if exc.unusable:
                    conn.shutdown()
                    self._break(f"sending ABORT failed: {exc.message}")
                    return
        log.warning("data channel to %s: could not send ABORT for transfer %s in time", self._peer, transfer_id)

    # -- control frames (transport.base.CallChannel) --

    def on_control(self, handler: "ControlHandler") -> None:
        """``handler(kind, payload)`` gets every CALL/REPLY frame, in a reader thread (keep it short);
        frames that came before are handed over now."""
        with self._lock:
            self._control = handler
            backlog, self._backlog = self._backlog, []
        for kind, payload in backlog:
            handler(kind, payload)

    def _on_control(self, kind: int, payload: bytes) -> None:
        with self._lock:
            handler = self._control
            if handler is None:
                if len(self._backlog) >= _CONTROL_BACKLOG:
                    raise _ProtocolError(f"more than {_CONTROL_BACKLOG} control frames before the link was ready")
                self._backlog.append((kind, payload))
                return
        handler(kind, payload)

    def try_control(self, kind: int, payload: bytes, deadline: float) -> bool:
        """One control frame from the calling thread (the event loop) on an idle connection, without
        blocking; False (nothing sent) when every connection is busy or would block."""
        return self._control_frame(kind, payload, deadline, wait=False)

    def send_control(self, kind: int, payload: bytes, deadline: float) -> None:
        """One control frame, waiting (until ``deadline``) for a connection when all are busy."""
        self._control_frame(kind, payload, deadline, wait=True)

    def _control_frame(self, kind: int, payload: bytes, deadline: float, wait: bool) -> bool:
        if kind not in (KIND_CALL, KIND_REPLY) or len(payload) > MAX_CONTROL:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"not a control frame: kind {kind}, "
                                                                 f"{len(payload)} bytes")
        conns = self._live()
        bufs = [memoryview(HEADER.pack(FRAME_MAGIC, kind, 0, 0, len(payload))), memoryview(payload)]
        base = next(self._rr)
        order = [conns[(base + k) % len(conns)] for k in range(len(conns))]
        for conn in order if not wait else order[:1]:
            if not wait and not conn.lock.acquire(timeout=0):
                continue
            try:
                if wait:
                    conn.send_frame(bufs, deadline)
                elif not conn.write_nowait(bufs, min(deadline, time.monotonic() + _INLINE_FINISH)):
                    continue
                conn.frames_sent += 1
                return True
            except _SendError as exc:
                if exc.unusable:
                    conn.shutdown()
                    self._break(f"sending a control frame failed: {exc.message}")
                raise DataDistError(exc.code, f"control frame to {self._peer}: {exc.message}") from None
            finally:
                if not wait:
                    conn.lock.release()
        return False

    def ping(self, deadline: float) -> None:
        """Send a PING on every connection (raises ``DataDistError`` when the channel is unusable)."""
        header = memoryview(HEADER.pack(FRAME_MAGIC, KIND_PING, 0, 0, 0))
        for conn in self._live():
            try:
                conn.send_frame([header], deadline)
            except _SendError as exc:
                if exc.unusable:
                    conn.shutdown()
                    self._break(f"PING failed: {exc.message}")
                raise DataDistError(exc.code, f"ping to {self._peer}: {exc.message}") from None

    # -- life cycle --

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._reason = self._reason or "closed locally"
            conns = list(self._conns)
        for conn in conns:
            conn.shutdown()
        self._transport._channel_down(self, f"data channel to {self._peer} was closed")
        self._transport._retire(self)

    def _break(self, reason: str, clean: bool = False) -> None:
        with self._lock:
            if self._broken or self._closed:
                return
            self._broken = True
            self._reason = reason
            conns = list(self._conns)
        log.log(logging.INFO if clean else logging.WARNING, "data channel %s %s %s: %s",
                "to" if self._outbound else "from", self._peer, "closed by the peer" if clean else "broken", reason)
        for conn in conns:
            conn.shutdown()
        self._transport._channel_down(self, f"data channel {'to' if self._outbound else 'from'} {self._peer} "
                                            f"broke: {reason}")

    def _conn_lost(self, conn: _Conn, reason: str, clean: bool) -> None:
        if self._closed or self._transport._stopping or not reason:
            return
        self._break(f"connection #{conn.index}: {reason}", clean)


def _frames(table: SegmentTable, chunk_size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each frame: ``chunk_size`` bytes, or fewer when ``_FRAME_PIECES`` pieces end
    first (tiny blocks: one ``sendmsg`` per frame, and no per-frame list or array of more than that many)."""
    total = table.nbytes
    if len(table) <= _FRAME_PIECES:
        return [(offset, min(chunk_size, total - offset)) for offset in range(0, total, chunk_size)]
    piece_cuts = table.ends[_FRAME_PIECES - 1::_FRAME_PIECES]
    cuts = np.union1d(np.arange(chunk_size, total, chunk_size, dtype=np.int64), piece_cuts[piece_cuts < total])
    starts = np.concatenate((np.zeros(1, np.int64), cuts))
    lengths = np.diff(np.concatenate((starts, np.array([total], np.int64))))
    return list(zip(starts.tolist(), lengths.tolist(), strict=True))


class _SendPlan:
    """The source of one send: its segment table, one readable view per handle (``None``: no mapping)."""

    def __init__(self, table: SegmentTable) -> None:
        self.table = table.nonempty()
        self.total = self.table.nbytes
        self.views: list[memoryview | None] = [byte_view(h, writable=False) for h in self.table.handles]
        self.mapped_l = [v is not None for v in self.views]
        self.mapped = np.array(self.mapped_l, bool)
        self.all_mapped = all(self.mapped_l)
        self.raw = [hasattr(h, "read_raw") for h in self.table.handles]

    def gather(self, offset: int, length: int, staging: memoryview | None, bufs: list[memoryview]) -> None:
        """Append the buffers holding stream bytes ``[offset, offset + length)`` to ``bufs``: views of mapped
        memory, and for the rest ``staging`` (filled here; piece k sits at its stream position - offset)."""
        which, offs, lens = self.table.cut(offset, offset + length)
        views = self.views
        if self.all_mapped:
            hs = which.tolist()
            if hs[0] == hs[-1] and (len(hs) < 3 or not (which != hs[0]).any()):
                v = views[hs[0]]
                bufs += [v[a:b] for a, b in zip(offs.tolist(), (offs + lens).tolist(), strict=True)]
            else:
                bufs += [views[h][a:b] for h, a, b in zip(hs, offs.tolist(), (offs + lens).tolist(), strict=True)]
            return
        if staging is None or len(staging) < length:
            raise _SendError(LLMStatusCode.LLM_FAILED, "internal: staging buffer too small", unusable=False)
        if len(lens) <= _FEW:  # a few pieces: one read_into each beats building a batch
            handles, mapped_l = self.table.handles, self.mapped_l
            pos, run = 0, -1
            for h, a, n in zip(which.tolist(), offs.tolist(), lens.tolist(), strict=True):
                if mapped_l[h]:
                    if run >= 0:
                        bufs.append(staging[run:pos])
                        run = -1
                    bufs.append(views[h][a:a + n])
                else:
                    handles[h].read_into(a, staging[pos:pos + n])
                    if run < 0:
                        run = pos
                pos += n
            if run >= 0:
                bufs.append(staging[run:pos])
            return
        mapped = self.mapped[which]
        local = np.cumsum(lens) - lens           # where each piece sits in the staging buffer
        base = memaddr.buffer_address(staging)[0]
        handles = self.table.handles
        unmapped = ~mapped
        for h, sel in _by_handle(which, unmapped):
            if self.raw[h]:
                handles[h].read_raw(np.stack((offs[sel], base + local[sel], lens[sel]), axis=1))
                continue
            for off, loc, n in zip(offs[sel].tolist(), local[sel].tolist(), lens[sel].tolist(), strict=True):
                handles[h].read_into(off, staging[loc:loc + n])
        if not mapped.any():
            bufs.append(staging[:length])
            return
        run = -1  # start (in staging) of the current run of staged pieces
        pieces = zip(which.tolist(), offs.tolist(), lens.tolist(), local.tolist(), mapped.tolist(), strict=True)
        for h, a, n, loc, m in pieces:
            if m:
                if run >= 0:
                    bufs.append(staging[run:loc])
                    run = -1
                bufs.append(views[h][a:a + n])
            elif run < 0:
                run = loc
        if run >= 0:
            bufs.append(staging[run:length])

    def release(self) -> None:
        self.views = []


# ---- the transport ---------------------------------------------------------------------------

class TcpTransport:
    """TCP data plane of one engine: a listener for inbound channels, ``connect`` for outbound ones."""

    name = "tcp"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, chunk_size: int = 4 << 20,
                 connect_timeout: float = 5.0, nodelay: bool = True, sndbuf: int | None = None,
                 rcvbuf: int | None = None, stripe: int = 0, admission: AdmissionLimits | None = None) -> None:
        if chunk_size <= 0 or chunk_size > MAX_FRAME:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"chunk_size must be in (0, {MAX_FRAME}]")
        if stripe < 0:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "stripe must be >= 0 (0: from the CPU count)")
        if connect_timeout <= 0:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "connect_timeout must be > 0")
        self.host = host
        self.port = port
        self.chunk_size = chunk_size
        self.connect_timeout = connect_timeout
        self.nodelay = nodelay
        self.sndbuf = sndbuf
        self.rcvbuf = rcvbuf
        self.stripe = stripe or _auto_stripe()
        self.admission_limits = admission or AdmissionLimits()
        self._admission: Admission | None = None      # made at start(): caps on who holds the listener
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._allowed: set[bytes] = set()
        self._control_handlers: dict[bytes, ControlHandler] = {}   # token -> handler of its inbound channel
        self._inbound: dict[bytes, TcpChannel] = {}
        self._outbound: list[TcpChannel] = []
        self._receipts: dict[int, TcpReceipt] = {}
        self._ids = itertools.count(secrets.randbits(32) + 1)
        self._threads: set[threading.Thread] = set()
        self._hellos: set[socket.socket] = set()
        self._retired = {"bytes_sent": 0, "frames_sent": 0, "bytes_received": 0, "frames_received": 0,
                         "bytes_discarded": 0}
        self._local = threading.local()
        self._spare: list[memoryview] = []     # send staging buffers to reuse
        self._started = False
        self._stopping = False

    def __repr__(self) -> str:
        return f"TcpTransport({self.endpoint if self._started else 'not started'})"

    @property
    def endpoint(self) -> str:
        if not self._started:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "tcp transport is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    # -- life cycle --

    def start(self) -> None:
        if self._started:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.rcvbuf:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            listener.bind((self.host, self.port))
            listener.listen(128)
            listener.settimeout(_POLL)
        except OSError as exc:
            listener.close()
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"cannot listen for data connections on {self.host}:{self.port}: {exc}") from None
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._started = True
        self._admission = Admission(f"tcp data plane {self.endpoint}", self.admission_limits, log)
        self._spawn(self._accept_loop, f"datadist-tcp-accept:{self.port}")
        log.debug("tcp data plane listening on %s", self.endpoint)

    def stop(self) -> None:
        with self._lock:
            if self._stopping or not self._started:
                self._stopping = True
                return
            self._stopping = True
            channels = list(self._inbound.values()) + list(self._outbound)
            hellos = list(self._hellos)
        for sock in hellos:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for ch in channels:
            ch.close()
        with self._lock:
            receipts = list(self._receipts.values())
        for receipt in receipts:
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED, "the data plane was stopped")
        limit = time.monotonic() + _JOIN
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, limit - time.monotonic()))
        if self._listener is not None:
            self._listener.close()
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log.warning("tcp data plane %s: threads still running after stop: %s", self.endpoint, alive)

    # -- tokens and channels --

    def allow(self, token: bytes) -> None:
        _check_token(token)
        with self._lock:
            self._allowed.add(bytes(token))

    def admission_stats(self) -> dict[str, int]:
        """The books of the listener's admission (``admission.Admitting``)."""
        if self._admission is None:
            return {}
        return self._admission.stats()

    def on_control(self, token: bytes, handler: ControlHandler) -> None:
        """The control handler of the inbound channel ``token`` makes (set before its first frame)."""
        with self._lock:
            self._control_handlers[bytes(token)] = handler
            channel = self._inbound.get(bytes(token))
        if channel is not None:
            channel.on_control(handler)

    def revoke(self, token: bytes) -> None:
        with self._lock:
            self._allowed.discard(token)
            self._control_handlers.pop(token, None)
            channel = self._inbound.get(token)
        if channel is not None:
            channel.close()  # leaves the table via _retire, its counters kept in the totals

    def channel(self, token: bytes) -> TcpChannel | None:
        with self._lock:
            return self._inbound.get(token)

    def connect(self, endpoint: str, token: bytes, streams: int, deadline: float) -> TcpChannel:
        _check_token(token)
        if not 1 <= streams <= MAX_STREAMS:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID,
                                f"streams must be in [1, {MAX_STREAMS}], got {streams}")
        if not self._started or self._stopping:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "tcp transport is not running")
        host, port = _parse_endpoint(endpoint)
        socks: list[socket.socket] = []
        try:
            for index in range(streams):
                socks.append(self._open(endpoint, host, port, token, index, streams, deadline))
        except BaseException:
            for s in socks:
                s.close()
            raise
        channel = TcpChannel(self, bytes(token), endpoint, outbound=True)
        with self._lock:
            self._outbound.append(channel)
        for index, sock in enumerate(socks):
            conn = channel._attach(sock, index, endpoint)
            assert conn is not None
            self._spawn(conn.run, f"datadist-tcp-read:{endpoint}#{index}", self)
        return channel

    def _open(self, endpoint: str, host: str, port: int, token: bytes, index: int, count: int,
              deadline: float) -> socket.socket:
        now = time.monotonic()
        if now >= deadline:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"deadline passed before connecting to {endpoint}")
        limit = min(deadline, now + self.connect_timeout)
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((host, port), timeout=limit - now)
            _configure(sock, self.nodelay, self.sndbuf, self.rcvbuf)
            sock.settimeout(max(1e-3, limit - time.monotonic()))
            sock.sendall(HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, len(token), index, count) + bytes(token))
            ack = _recv_exact(sock, 1, limit)
        except TimeoutError:
            if sock is not None:
                sock.close()
            if time.monotonic() >= deadline:
                raise DataDistError(LLMStatusCode.LLM_TIMEOUT,
                                    f"data connection {index} to {endpoint} not established by the deadline") from None
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"data connection {index} to {endpoint} not established within "
                                f"{self.connect_timeout}s") from None
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"cannot open data connection {index} to {endpoint}: {exc}") from None
        if ack != ACK:
            sock.close()
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"data connection {index} to {endpoint} was refused during the handshake "
                                f"(token not accepted, or the peer is not a datadist data plane)")
        return sock

    # -- receiving --

    def expect(self, segments: Sequence[Segment], channel: Channel | None = None) -> TcpReceipt:
        """Register where an incoming transfer goes. ``channel``: the channel the bytes will come over;
        when it breaks the receipt fails at once instead of at its deadline."""
        table = _table(segments)
        if channel is not None and (not isinstance(channel, TcpChannel) or channel._transport is not self):
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "the channel belongs to another transport")
        tid = TransferId(next(self._ids) & _U64)
        receipt = TcpReceipt(self, tid, table, channel)
        if receipt.done:
            return receipt
        with self._lock:
            if self._stopping:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "the data plane was stopped")
            self._receipts[tid] = receipt
        if channel is not None and channel.broken:
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED, f"data channel to {channel.peer} is already broken")
        return receipt

    def stats(self) -> dict[str, int]:
        with self._lock:
            channels = list(self._inbound.values()) + list(self._outbound)
            totals = dict(self._retired)
            pending = len(self._receipts)
        for ch in channels:
            s = ch.stats()
            for k in totals:
                totals[k] += s[k]  # type: ignore[operator]
        totals["frames"] = totals["frames_sent"] + totals["frames_received"]
        totals["channels"] = len(channels)
        totals["connections"] = sum(ch.streams for ch in channels)
        totals["pending_receipts"] = pending
        return totals

    # -- internals --

    def _forget(self, tid: int) -> None:
        with self._lock:
            self._receipts.pop(tid, None)

    def _channel_down(self, channel: TcpChannel, message: str) -> None:
        with self._lock:
            receipts = list(self._receipts.values())
        for receipt in receipts:
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED, message, channel=channel)

    def _retire(self, channel: TcpChannel) -> None:
        """A closed channel leaves the tables; its counters stay in the totals."""
        with self._lock:
            if channel in self._outbound:
                self._outbound.remove(channel)
            elif self._inbound.get(channel.token) is channel:
                del self._inbound[channel.token]
            else:
                return
            s = channel.stats()
            for k in self._retired:
                self._retired[k] += s[k]  # type: ignore[operator]

    def _discard_buffer(self) -> memoryview:
        buf = getattr(self._local, "discard", None)
        if buf is None:
            buf = self._local.discard = memoryview(bytearray(_DISCARD))
        return buf

    def _staging_buffer(self) -> tuple[memoryview, int]:
        """This reader thread's receive staging buffer and its address."""
        buf = getattr(self._local, "staging", None)
        if buf is None:
            view = memoryview(bytearray(_STAGING))
            buf = self._local.staging = (view, memaddr.buffer_address(view)[0])
        return buf

    def _take_staging(self, n: int) -> memoryview:
        """A send staging buffer of at least ``n`` bytes (reused across sends; ``_give_staging`` it back)."""
        with self._lock:
            for i, buf in enumerate(self._spare):
                if len(buf) >= n:
                    return self._spare.pop(i)
        return memoryview(bytearray(max(n, min(self.chunk_size, _SPARE_BYTES))))

    def _give_staging(self, buf: memoryview) -> None:
        with self._lock:
            if len(self._spare) < _SPARES and len(buf) <= _SPARE_BYTES:
                self._spare.append(buf)

    def _spawn(self, target, name: str, *args: object) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping:  # ends at stop(); each pass waits at most _POLL
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stopping:
                    break
                self._refuse("-", f"accept failed: {exc}")   # EMFILE and the like: rate-limited
                time.sleep(_POLL)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            assert self._admission is not None
            self._admission.expire()   # the deadline of a silent hello is its own recv timeout; this is the sweep
            ticket = None if self._stopping else self._admission.admit(addr[0], functools.partial(_shut, sock))
            if ticket is None:
                sock.close()
                continue
            with self._lock:
                self._hellos.add(sock)
            self._spawn(self._serve, f"datadist-tcp-read:{peer}", sock, peer, ticket)

    def _serve(self, sock: socket.socket, peer: str, ticket: Ticket) -> None:
        """Hello, then this thread becomes the connection's reader."""
        assert self._admission is not None
        conn: _Conn | None = None
        try:
            conn = self._hello(sock, peer, ticket)
        except Exception:  # noqa: BLE001
            log.exception("tcp data plane %s: handshake with %s failed", self.endpoint, peer)
        finally:
            with self._lock:
                self._hellos.discard(sock)
        try:
            if conn is None:
                sock.close()
                return
            conn.run(self)
        finally:
            self._admission.release(ticket)

    def _refuse(self, peer: str, why: str) -> None:
        """A rate-limited warning naming the remote address (never the token); quiet while stopping."""
        if not self._stopping and self._admission is not None:
            self._admission.refusals(f"{peer}: {why}")

    def _hello(self, sock: socket.socket, peer: str, ticket: Ticket) -> _Conn | None:
        """Check the hello (by the ticket's pre-auth deadline); on success register the socket with its
        channel and acknowledge it."""
        assert self._admission is not None
        deadline = min(ticket.deadline, time.monotonic() + self.connect_timeout)
        try:
            _configure(sock, self.nodelay, self.sndbuf, self.rcvbuf)
            head = _recv_exact(sock, HELLO.size, deadline)
            if head is None:
                self._refuse(peer, "closed before the hello")
                return None
            magic, version, tlen, index, count = HELLO.unpack(head)
            if magic != HELLO_MAGIC:
                self._refuse(peer, "not a datadist hello")
                return None
            if version != PROTOCOL_VERSION:
                self._refuse(peer, f"protocol version {version}, want {PROTOCOL_VERSION}")
                return None
            if not 1 <= tlen <= MAX_TOKEN or not index < count <= MAX_STREAMS:
                self._refuse(peer, "malformed hello")
                return None
            token = _recv_exact(sock, tlen, deadline)
        except TimeoutError:
            self._admission.timed_out(ticket)
            self._refuse(peer, f"no hello within {min(self.connect_timeout, self.admission_limits.preauth_seconds):g}s")
            return None
        except OSError as exc:
            self._refuse(peer, str(exc))
            return None
        if token is None:
            self._refuse(peer, "closed during the hello")
            return None
        with self._lock:
            allowed = list(self._allowed)
        match = None
        for candidate in allowed:  # compare with every allowed token, in constant time each
            if hmac.compare_digest(candidate, token):
                match = candidate
        if match is None:
            self._refuse(peer, "token not accepted")
            return None
        self._admission.authenticate(ticket)
        if not ticket.authenticated:   # closed to make room just now
            return None
        with self._lock:
            if self._stopping or match not in self._allowed:
                return None
            channel = self._inbound.get(match)
            if channel is None:
                channel = self._inbound[match] = TcpChannel(self, match, peer, outbound=False)
                channel._control = self._control_handlers.get(match)   # before its first frame is read
        conn = channel._attach(sock, index, peer)
        if conn is None:
            self._refuse(peer, "the channel of its token is already broken")
            return None
        try:
            conn.send_ack(deadline)
        except OSError as exc:
            conn.shutdown()
            channel._break(f"acknowledging connection #{index} from {peer} failed: {exc}")
        return conn


ControlHandler = Callable[[int, bytes], None]


def _shut(sock: socket.socket) -> None:
    """How admission ends a pre-auth connection: wake its reader (it then closes the socket)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _auto_stripe() -> int:
    """Connections one transfer is striped over, by default: one per two usable CPUs, at most 4.

    Each stripe is a sender thread here and a reader thread at the peer, copying in parallel; that
    pays where there are cores to run them. On a 2-CPU node it only adds thread switches and GIL
    hand-offs (measured on loopback: 1 stripe ~2.7 GiB/s, 4 stripes ~1.5 GiB/s, see
    docs/performance.md). Concurrent transfers still spread over all the channel's connections.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 2))


def _check_token(token: bytes) -> None:
    if not isinstance(token, (bytes, bytearray)) or not 1 <= len(token) <= MAX_TOKEN:
        raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"a data-plane token is 1..{MAX_TOKEN} bytes")
