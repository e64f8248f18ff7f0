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
  - ``PING``: no payload; ignored (keeps the door open for liveness probes).

  A malformed header closes that connection and marks its channel broken.

Threads: one accept thread per transport; each accepted socket gets a thread that does the
hello and then reads frames; each connected socket gets a reader thread. Readers
``recv_into`` DATA payloads straight into the destination memory (``memoryview`` of the
handle) or, for handles without a mapping, through a per-thread staging buffer and
``write_from``. Senders split the stream into ``chunk_size`` chunks, stripe chunk *k* over
socket *(base + k) % n* (one worker thread per socket, the caller being one of them; ``base``
rotates per transfer) and write each chunk with one ``socket.sendmsg([header, view, view, ...])``
under that socket's lock (first come, first served), so concurrent transfers interleave at chunk
granularity. Pieces of handles without a view are read into the worker's staging buffer first,
outside the lock.

Sockets stay in blocking mode (one system call per ``recv_into``/``sendmsg``, no poll first)
with kernel timeouts per direction: ``SO_RCVTIMEO`` wakes the reader every ``_POLL`` seconds so
it notices a close or a cancelled receipt; ``SO_SNDTIMEO`` is set from the remaining time
before every ``sendmsg``, so no send blocks past its deadline. Payloads are read with
``MSG_WAITALL`` (a whole piece per call when the bytes are flowing).

Memory safety: a reader touches a receipt's destination only between ``_begin_io`` and
``_end_io``; once a receipt failed or was cancelled, ``wait``/``cancel`` return only after every
reader left it, so the caller may reuse the memory at once.
"""

from __future__ import annotations

import bisect
import collections
import hmac
import itertools
import logging
import secrets
import socket
import struct
import threading
import time
from typing import Iterator, Sequence

from datadist.status import LLMStatusCode, code_2_status

from ..core.errors import DataDistError
from ..core.types import TransferId
from ..memory.base import MemoryHandle, Segment

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
MAX_FRAME = 1 << 30          # a DATA frame longer than this is a protocol error
_U64 = (1 << 64) - 1

_POLL = 0.2                  # reader wake-up interval (notices close / cancel)
_QUIESCE = 1.0               # how long wait()/cancel() wait for a reader to leave the memory
_DISCARD = 256 << 10         # discard buffer of a reader thread
_STAGING = 1 << 20           # receive staging buffer for handles without a view
_IOV_MAX = 1024              # buffers per sendmsg call (Linux IOV_MAX)
_MAX_PENDING_HELLOS = 64     # unauthenticated connections in flight
_JOIN = 2.0                  # bound on joining threads at stop()
_ABORT_TIMEOUT = 0.5
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
_WAITALL = socket.MSG_WAITALL


def _timeval(seconds: float) -> bytes:
    """``struct timeval`` for SO_RCVTIMEO/SO_SNDTIMEO; at least 1 ms (zero would mean 'forever')."""
    seconds = max(seconds, 1e-3)
    return struct.pack("@ll", int(seconds), int((seconds % 1) * 1e6))


def _byte_view(handle: MemoryHandle, writable: bool) -> memoryview | None:
    view = handle.view()
    if view is None:
        return None
    if not view.contiguous:
        return None
    if writable and view.readonly:
        return None
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _check_segments(segments: Sequence[Segment]) -> int:
    total = 0
    for i, seg in enumerate(segments):
        if seg.offset < 0 or seg.length < 0 or seg.offset + seg.length > seg.handle.size:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID,
                                f"segment {i} [{seg.offset}, {seg.offset + seg.length}) lies outside its memory "
                                f"of {seg.handle.size} bytes")
        total += seg.length
    return total


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

    def __init__(self, transport: "TcpTransport", transfer_id: TransferId, segments: Sequence[Segment],
                 channel: "TcpChannel | None") -> None:
        self._transport = transport
        self._tid = transfer_id
        self._segments = [s for s in segments if s.length > 0]
        views: dict[int, memoryview | None] = {}
        self._views: list[memoryview | None] = []   # dropped once the receipt is over and no reader is in
        self._starts: list[int] = []
        pos = 0
        for seg in self._segments:
            if id(seg.handle) not in views:
                views[id(seg.handle)] = _byte_view(seg.handle, writable=True)
            view = views[id(seg.handle)]
            self._views.append(None if view is None else view[seg.offset:seg.offset + seg.length])
            self._starts.append(pos)
            pos += seg.length
        self._mapped = [v is not None for v in self._views]
        views.clear()
        self._expected = pos
        self._received = 0
        self._lo: list[int] = []       # claimed stream ranges [lo, hi), sorted, disjoint, merged
        self._hi: list[int] = []
        self._channels: set[TcpChannel] = {channel} if channel is not None else set()
        self._cond = threading.Condition(threading.Lock())
        self._active = 0               # readers writing into the destination right now
        self._state = _DONE if pos == 0 else _PENDING
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
            if self._state != _PENDING:
                return ""
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

    def _pieces(self, offset: int, length: int) -> Iterator[tuple[int, int, int]]:
        """``(segment index, offset in segment, bytes)`` covering stream ``[offset, offset+length)``."""
        i = bisect.bisect_right(self._starts, offset) - 1
        pos, end = offset, offset + length
        while pos < end:  # advances by >= 1 byte per pass (segments are non-empty)
            seg_off = pos - self._starts[i]
            n = min(self._segments[i].length - seg_off, end - pos)
            yield i, seg_off, n
            pos += n
            i += 1

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

    def send_chunk(self, tid: int, offset: int, length: int,
                   pieces: list[tuple[Segment, memoryview | None, int, int]], staging: memoryview | None,
                   deadline: float) -> None:
        """One DATA frame. Pieces of handles without a view are first read into ``staging`` (the
        worker's own buffer, so a slow source never holds the socket); then the socket is taken."""
        bufs = [memoryview(HEADER.pack(FRAME_MAGIC, KIND_DATA, tid, offset, length))]
        staged = 0
        for seg, view, seg_off, n in pieces:
            if view is not None:
                bufs.append(view[seg.offset + seg_off:seg.offset + seg_off + n])
                continue
            if staging is None or len(staging) < staged + n:
                raise _SendError(LLMStatusCode.LLM_FAILED, "internal: staging buffer too small", unusable=False)
            dst = staging[staged:staged + n]
            seg.handle.read_into(seg.offset + seg_off, dst)
            bufs.append(dst)
            staged += n
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

    def _write(self, bufs: list[memoryview], deadline: float) -> int:
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
                                 unusable=written > 0)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(remaining))
                sent = self.sock.sendmsg(bufs[i:i + _IOV_MAX], [], _SEND_FLAGS)
            except BlockingIOError:  # SO_SNDTIMEO expired before a byte went out
                raise _SendError(LLMStatusCode.LLM_TIMEOUT, "the peer did not take the bytes before the deadline",
                                 unusable=written > 0) from None
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
        left = length
        try:
            for idx, seg_off, n in receipt._pieces(offset, length):
                if receipt._mapped[idx]:
                    done = 0
                    while done < n:  # each pass reads >= 1 byte or polls
                        # the destination is touched only between _begin_io and _end_io, so a receipt
                        # that failed or was cancelled is never written once wait()/cancel() returned
                        if not receipt._begin_io():
                            self._discard(left)
                            return
                        try:
                            got = self._recv_once(receipt._views[idx][seg_off + done:seg_off + n])
                        finally:
                            receipt._end_io()
                        done += got
                        left -= got
                        self.bytes_received += got
                else:
                    seg = receipt._segments[idx]
                    staging = transport._staging_buffer()
                    done = 0
                    while done < n:  # one staging buffer at a time
                        m = min(n - done, len(staging))
                        filled = 0
                        while filled < m:
                            got = self._recv_once(staging[filled:m])
                            filled += got
                            self.bytes_received += got
                        if not receipt._begin_io():
                            self._discard(left - m)
                            return
                        failure: Exception | None = None
                        try:
                            seg.handle.write_from(seg.offset + seg_off + done, staging[:m])
                        except Exception as exc:  # noqa: BLE001 - the destination failed, not the wire
                            failure = exc
                        finally:
                            receipt._end_io()
                        if failure is not None:
                            code = failure.code if isinstance(failure, DataDistError) else LLMStatusCode.LLM_FAILED
                            receipt._fail(code, f"transfer {tid}: writing into the destination failed: {failure}")
                            self._discard(left - m)
                            return
                        done += m
                        left -= m
        except (OSError, _Closed):
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED,
                          f"transfer {tid}: data connection from {self.peer} lost in the middle of a frame")
            raise
        receipt._landed(length)


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
        total = _check_segments(segments)
        conns = self._live()
        if total == 0:
            return
        chunks = _plan(segments, self._transport.chunk_size)
        n = len(conns)
        base = next(self._rr)
        workers = min(n, len(chunks))
        shares: list[list[tuple[int, int, list]]] = [[] for _ in range(workers)]  # type: ignore[type-arg]
        for k, chunk in enumerate(chunks):
            shares[k % workers].append(chunk)
        errors: list[_SendError] = []
        stop = threading.Event()

        def work(conn: _Conn, share: list) -> None:  # type: ignore[type-arg]
            staging: memoryview | None = None
            for offset, length, pieces in share:  # in order, one chunk per frame
                if stop.is_set():
                    return
                need = sum(size for _, view, _, size in pieces if view is None)
                if need and (staging is None or len(staging) < need):
                    staging = memoryview(bytearray(need))
                try:
                    conn.send_chunk(transfer_id, offset, length, pieces, staging, deadline)
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

        threads = [threading.Thread(target=work, args=(conns[(base + w) % n], shares[w]), daemon=True,
                                    name=f"datadist-tcp-send:{self._peer}#{(base + w) % n}")
                   for w in range(1, workers)]
        for t in threads:
            t.start()
        work(conns[base % n], shares[0])
        for t in threads:  # workers stop by the deadline: their socket timeouts come from it
            t.join(max(0.0, deadline - time.monotonic()) + _JOIN)
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


def _plan(segments: Sequence[Segment], chunk_size: int) -> list[tuple[int, int, list]]:  # type: ignore[type-arg]
    """Split the concatenated stream into ``(offset, length, pieces)`` chunks of ``chunk_size`` bytes."""
    views: dict[int, memoryview | None] = {}
    chunks: list[tuple[int, int, list]] = []  # type: ignore[type-arg]
    cur: list[tuple[Segment, memoryview | None, int, int]] = []
    cur_len = 0
    offset = 0
    for seg in segments:
        if seg.length == 0:
            continue
        if id(seg.handle) not in views:
            views[id(seg.handle)] = _byte_view(seg.handle, writable=False)
        view = views[id(seg.handle)]
        pos = 0
        while pos < seg.length:  # advances by >= 1 byte
            n = min(seg.length - pos, chunk_size - cur_len)
            cur.append((seg, view, pos, n))
            cur_len += n
            pos += n
            if cur_len == chunk_size:
                chunks.append((offset, cur_len, cur))
                offset += cur_len
                cur, cur_len = [], 0
    if cur:
        chunks.append((offset, cur_len, cur))
    return chunks


# ---- the transport ---------------------------------------------------------------------------

class TcpTransport:
    """TCP data plane of one engine: a listener for inbound channels, ``connect`` for outbound ones."""

    name = "tcp"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, chunk_size: int = 4 << 20,
                 connect_timeout: float = 5.0, nodelay: bool = True, sndbuf: int | None = None,
                 rcvbuf: int | None = None) -> None:
        if chunk_size <= 0 or chunk_size > MAX_FRAME:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"chunk_size must be in (0, {MAX_FRAME}]")
        if connect_timeout <= 0:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "connect_timeout must be > 0")
        self.host = host
        self.port = port
        self.chunk_size = chunk_size
        self.connect_timeout = connect_timeout
        self.nodelay = nodelay
        self.sndbuf = sndbuf
        self.rcvbuf = rcvbuf
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._allowed: set[bytes] = set()
        self._inbound: dict[bytes, TcpChannel] = {}
        self._outbound: list[TcpChannel] = []
        self._receipts: dict[int, TcpReceipt] = {}
        self._ids = itertools.count(secrets.randbits(32) + 1)
        self._threads: set[threading.Thread] = set()
        self._hellos: set[socket.socket] = set()
        self._retired = {"bytes_sent": 0, "frames_sent": 0, "bytes_received": 0, "frames_received": 0,
                         "bytes_discarded": 0}
        self._local = threading.local()
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

    def revoke(self, token: bytes) -> None:
        with self._lock:
            self._allowed.discard(token)
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

    def expect(self, segments: Sequence[Segment], channel: TcpChannel | None = None) -> TcpReceipt:
        """Register where an incoming transfer goes. ``channel`` (extension): the channel the bytes
        will come over; when it breaks the receipt fails at once instead of at its deadline."""
        _check_segments(segments)
        if channel is not None and channel._transport is not self:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "the channel belongs to another transport")
        tid = TransferId(next(self._ids) & _U64)
        receipt = TcpReceipt(self, tid, segments, channel)
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

    def _staging_buffer(self) -> memoryview:
        buf = getattr(self._local, "staging", None)
        if buf is None:
            buf = self._local.staging = memoryview(bytearray(_STAGING))
        return buf

    def _spawn(self, target, name: str, *args: object) -> None:  # type: ignore[no-untyped-def]
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
                log.warning("tcp data plane %s: accept failed: %s", self.endpoint, exc)
                time.sleep(_POLL)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            with self._lock:
                busy = len(self._hellos) >= _MAX_PENDING_HELLOS or self._stopping
                if not busy:
                    self._hellos.add(sock)
            if busy:
                log.warning("tcp data plane %s: refused connection from %s: too many pending handshakes",
                            self.endpoint, peer)
                sock.close()
                continue
            self._spawn(self._serve, f"datadist-tcp-read:{peer}", sock, peer)

    def _serve(self, sock: socket.socket, peer: str) -> None:
        """Hello, then this thread becomes the connection's reader."""
        conn: _Conn | None = None
        try:
            conn = self._hello(sock, peer)
        except Exception:  # noqa: BLE001
            log.exception("tcp data plane %s: handshake with %s failed", self.endpoint, peer)
        finally:
            with self._lock:
                self._hellos.discard(sock)
        if conn is None:
            sock.close()
            return
        conn.run(self)

    def _refuse(self, peer: str, why: str) -> None:
        """One warning line naming the remote address (never the token); quiet while stopping."""
        if not self._stopping:
            log.warning("tcp data plane %s: refused connection from %s: %s", self.endpoint, peer, why)

    def _hello(self, sock: socket.socket, peer: str) -> _Conn | None:
        """Check the hello; on success register the socket with its channel and acknowledge it."""
        deadline = time.monotonic() + self.connect_timeout
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
            self._refuse(peer, f"no hello within {self.connect_timeout:.1f}s")
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
        with self._lock:
            if self._stopping or match not in self._allowed:
                return None
            channel = self._inbound.get(match)
            if channel is None:
                channel = self._inbound[match] = TcpChannel(self, match, peer, outbound=False)
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


def _check_token(token: bytes) -> None:
    if not isinstance(token, (bytes, bytearray)) or not 1 <= len(token) <= MAX_TOKEN:
        raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"a data-plane token is 1..{MAX_TOKEN} bytes")
