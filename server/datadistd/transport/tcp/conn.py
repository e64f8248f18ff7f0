"""``DataConn``: one socket of a channel -- its send lock, and its reader: the reactor turn (frames off the socket, each
checked and handed on: control frames to the channel's handler, DATA frames scattered into their destination) and the
bytes it read ahead of the frame it is at, served first to whoever reads the stream next."""

from __future__ import annotations

import bisect
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...memory.segments import cut
from ..base import Channel, ControlRefused
from .lock import FairLock
from .staging import Buffers, SendPlan, write_out
from .wire import (
    _DONTWAIT,
    _IOV_MAX,
    _JOIN,
    _POLL,
    _READ_AHEAD,
    _RECV_MAX,
    _SEND_FLAGS,
    _SEND_NOWAIT,
    _STALL,
    _TURN_FRAMES,
    _WAITALL,
    ACK,
    FRAME_MAGIC,
    HEADER,
    KIND_ABORT,
    KIND_CONTROL,
    KIND_DATA,
    KIND_PING,
    MAX_CONTROL,
    MAX_FRAME,
    ControlHandler,
    _Closed,
    _decode_code,
    _ProtocolError,
    _SendError,
    _timeval,
    drop_sent,
)

if TYPE_CHECKING:
    from .reactor import Reactor
    from .receipt import TcpReceipt

log = logging.getLogger("datadistd.transport.tcp")


class _Ahead(threading.local):
    """A reader thread's read-ahead buffer, lent to the turn it runs: a turn ends with less than a header read ahead,
    which its connection keeps (``_left``), so a buffer per reactor thread does, not one per connection."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(_READ_AHEAD))


_AHEAD = _Ahead()


class _Eof(Exception):
    """The peer closed the connection between frames (a clean end)."""


class ConnOwner(Channel, Protocol):
    """What a connection reports to the channel it belongs to (``TcpChannel``), declared here so that this
    module names nothing above it."""

    def _on_control(self, kind: int, payload: bytes) -> None:
        """A control frame arrived (raises ``_ProtocolError`` to drop the connection)."""

    def _conn_lost(self, conn: DataConn, reason: str, clean: bool) -> None:
        """The connection's reader ended (``reason`` empty: closed here)."""


class DataConn:
    """One socket of a channel: its send lock, and its reader (``turn``), run by one reactor thread for the
    connection's life.

    Receive calls: a header is read with what follows it -- up to ``_READ_AHEAD`` bytes once control frames come in a
    row (a small frame whole in one call), else the header alone -- and a control frame's payload with the next
    header, never more. What was read ahead waits in ``_rv[_at:_upto]`` and is served first (``_carried``). So a DATA
    frame's payload lands in its destination straight from the socket, but for what a read-ahead took of it: at most
    ``_READ_AHEAD`` bytes, only right behind control frames in a row (a stream of DATA frames, or of DATA frames each
    followed by a REPLY, is never read ahead). A receive that came back short of what it asked drained the socket:
    once the frames read are handed on the turn ends, with no probe failing with EAGAIN (an exception); bytes that come
    after that receive make the kernel report the socket again (edge-triggered)."""

    def __init__(self, channel: ConnOwner, sock: socket.socket, index: int, peer: str,
                 receipts: dict[int, TcpReceipt], buffers: Buffers, reactor: Reactor) -> None:
        self.channel = channel
        self._receipts = receipts         # the transport's pending receipts by transfer id (read without a lock)
        self._buffers = buffers
        self.index = index
        self.peer = peer
        self.sock = sock
        # blocking mode with kernel timeouts: one system call per recv/send (no poll first). The connection waits
        # for a frame in the reactor's epoll (an idle link wakes nobody; ``shutdown`` makes it readable: EOF);
        # inside a frame each receive wakes every _POLL, so a cancelled receipt's memory is left within that and a
        # stalled peer is noticed (``_received``); sends get the remaining time before each call
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(_POLL))
        self._reactor = reactor
        # what the reader read ahead of the frame it is at (reading thread only; ``turn``): in a turn
        # ``_rv[_at:_upto]``, the next frames' bytes -- a header, a control frame's payload, the start of a DATA
        # frame's -- served before the socket's; between turns ``_left[:_upto]``, the start of a header
        self._left = bytearray(HEADER.size)
        self._rv = memoryview(self._left)
        self._at = self._upto = 0
        self._controls = 0                # control frames read in a row (2 or more: read ahead ``_READ_AHEAD``)
        self._quiet_since = 0.0           # inside a frame: when the last receive that got nothing began
        self.ended = threading.Event()    # the reading is over and the socket closed (``_end``)
        self.ended_hook: Callable[[], None] | None = None   # then called (an accepted one: its admission ticket)
        self.lock = FairLock()           # held per frame by senders, handed over first come first served
        # the channel's control handler once the link is ready (``TcpChannel.on_control``): a control frame whose
        # payload is there goes from ``turn`` straight to it; before that, through the channel's early-frames backlog
        self.handler: ControlHandler | None = None
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

    def send_chunk(self, tid: int, offset: int, length: int, plan: SendPlan, staging: memoryview | None,
                   deadline: float) -> None:
        """One DATA frame: stream bytes ``[offset, offset + length)`` of ``plan``. Segments of handles without
        a view are first read into ``staging`` (the worker's own buffer, so a slow source never holds the
        socket): in one batch per handle (``read_raw``) or per segment (``read_into``); then the socket is taken."""
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
            sent = self.sock.sendmsg(bufs, [], _SEND_NOWAIT)
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
        bufs = [b for b in bufs if len(b)]
        while bufs:  # each pass writes >= 1 byte or raises
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _SendError(LLMStatusCode.LLM_TIMEOUT, "deadline passed in the middle of a frame",
                                 unusable=written > 0 or partial)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(remaining))
                sent = self.sock.sendmsg(bufs[:_IOV_MAX], [], _SEND_FLAGS)
            except BlockingIOError:  # SO_SNDTIMEO expired before a byte went out
                raise _SendError(LLMStatusCode.LLM_TIMEOUT, "the peer did not take the bytes before the deadline",
                                 unusable=written > 0 or partial) from None
            except OSError as exc:
                raise _SendError(LLMStatusCode.LLM_LINK_FAILED, f"send failed: {exc}", unusable=True) from None
            written += sent
            drop_sent(bufs, sent)
        return payload

    # -- receiving (its reactor thread, one turn at a time) --

    def turn(self) -> bool:
        """The socket is readable (its reactor thread, edge-triggered): read every frame that is there -- a frame once
        begun to its end, at most ``_TURN_FRAMES`` of them unless more are read ahead already -- and hand each on
        (receive calls: the class doc). False: the socket is drained (the kernel reports its next bytes) or the
        connection ended (cleaned up here); True: it stopped with bytes left, the others' go (run it again). It never
        ends with a whole header read ahead (no edge would come for it)."""
        rv = self._rv = _AHEAD.view
        if self._upto:   # the start of a header, read by the last turn
            rv[:self._upto] = self._left[:self._upto]
        unpack, sock, size = HEADER.unpack_from, self.sock, HEADER.size
        frames, drained = 0, False
        try:
            while True:  # one frame per pass; a header cut short waits for the next turn
                at, end = self._at, self._upto
                if end - at < size:
                    if drained or frames >= _TURN_FRAMES:
                        if end:
                            self._keep(at, end)
                        return not drained
                    if at:                  # what there is of the header to the front (at >= size > end - at)
                        end, at = self._to_front(at, end), 0
                    ask = (_READ_AHEAD if self._controls > 1 else size) - end
                    try:
                        n = sock.recv_into(rv[end:end + ask], ask, _DONTWAIT)
                    except BlockingIOError:
                        n = -1
                    if n < size - end:      # nothing, the end, or less than a header: the turn ends
                        return self._short(end, n)
                    end += n
                    self._upto, drained = end, n < ask
                magic, kind, tid, offset, length = unpack(rv, at)
                at, frames = at + size, frames + 1
                if ((handler := self.handler) is None or kind not in KIND_CONTROL or magic != FRAME_MAGIC or tid
                        or offset or length > MAX_CONTROL):
                    self._frame(at, end, magic, kind, tid, offset, length)
                    continue
                self._quiet_since = 0.0   # the common control frame, flat (C calls and the handler)
                if end - at >= length:    # read ahead whole
                    payload = bytes(rv[at:at + length])
                    at += length
                    self._at, self._upto = (0, 0) if at == end else (at, end)
                    self._controls += 1
                else:   # the rest, and the next header while the turn goes on (a small frame: ``_READ_AHEAD``)
                    head, rest, small = bytes(rv[at:end]), length - (end - at), length + size <= _READ_AHEAD
                    want = rest + size if small and frames < _TURN_FRAMES else rest
                    self._at, self._upto, self._controls = 0, 0, (self._controls + 1 if small else 0)
                    try:
                        data = sock.recv(want, _DONTWAIT)
                    except BlockingIOError:
                        data = b""
                    n = len(data)
                    drained = 0 < n < want   # b"": EOF, which the next header's receive sees again
                    if n > rest:          # the next header, or its start
                        rv[:n - rest] = data[rest:]
                        self._upto, data = n - rest, data[:rest]
                    elif n < rest:        # the rest is still on its way: wait for it as any frame does
                        data, drained = self._control_rest(rest, data), False
                    payload = head + data if head else data
                self.bytes_received += length
                self.frames_received += 1
                handler(kind, payload)
        except Exception as exc:  # noqa: BLE001 - a reader must always report and clean up
            reason, clean = self._why(exc)
        self._end(reason, clean)
        return False

    def _to_front(self, at: int, end: int) -> int:
        """The start of a header, ``_rv[at:end]``, moved to the front of the read-ahead buffer; where it ends now."""
        end -= at
        self._rv[:end] = self._rv[at:at + end]
        self._at, self._upto = 0, end
        return end

    def _short(self, end: int, n: int) -> bool:
        """The receive of a header (``_rv[:end]`` read already) got less than the rest of one: ``n`` bytes (a header
        cut short: kept for the next turn), nothing (-1: a stale edge), or the end (0). False: the turn ends;
        raises when the connection ended (``_Eof`` for the peer's close between frames)."""
        if n > 0:
            return self._keep(0, end + n)
        if self.closed:
            raise _Closed()
        if n < 0:
            return self._keep(0, end)
        if end:
            raise ConnectionResetError("the peer closed the connection in the middle of a frame header")
        raise _Eof()

    def _why(self, exc: Exception) -> tuple[str, bool]:
        """Why the reading of this connection ended, from what ended it ("": closed here), and whether the peer
        closed it cleanly (between frames)."""
        if isinstance(exc, (_Closed, _Eof)):
            return ("the peer closed the connection", True) if isinstance(exc, _Eof) else ("", False)
        if isinstance(exc, (_ProtocolError, ControlRefused)):
            return f"protocol error: {exc}", False
        if isinstance(exc, OSError):
            return f"connection lost: {exc}", False
        log.exception("data connection %s#%d: reader failed", self.peer, self.index)
        return f"reader failed: {exc!r}", False

    def _keep(self, at: int, end: int) -> bool:
        """The turn ends with ``_rv[at:end]`` read ahead, less than a header: the connection keeps it. False (the
        turn's answer: drained)."""
        self._left[:end - at] = self._rv[at:end]
        self._at, self._upto = 0, end - at
        return False

    def _frame(self, at: int, end: int, magic: bytes, kind: int, tid: int, offset: int, length: int) -> None:
        """The frame of the header that ends at ``_rv[at]`` (``_rv[at:end]``: what was read ahead of it, served
        first), but for the common control frame (``turn``): read its payload and hand it on."""
        self._at, self._upto = (0, 0) if at == end else (at, end)
        self._controls = 0
        if magic != FRAME_MAGIC:
            raise _ProtocolError(f"bad frame magic {magic!r}")
        self._quiet_since = 0.0
        if kind == KIND_DATA:
            if length > MAX_FRAME:
                raise _ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
            self._on_data(tid, offset, length)
        elif kind == KIND_ABORT:
            receipt = self._receipts.get(tid)
            if receipt is not None:
                code = _decode_code(length)
                if code == LLMStatusCode.LLM_SUCCESS:
                    code = LLMStatusCode.LLM_FAILED
                receipt._fail(code, f"transfer {tid} aborted by the sender ({code.name})")
        elif kind == KIND_PING:
            if length or offset:
                raise _ProtocolError("PING with a payload")
        elif kind in KIND_CONTROL:
            if length > MAX_CONTROL or tid or offset:
                raise _ProtocolError(f"malformed control frame ({length} bytes)")
            payload = self._control_rest(length, b"")
            self.bytes_received += length
            self.channel._on_control(kind, payload)
        else:
            raise _ProtocolError(f"unknown frame kind {kind}")
        self.frames_received += 1

    def _control_rest(self, length: int, head: bytes) -> bytes:
        """A control frame's payload of ``length`` bytes whose first ``head`` were read already: the rest, read under
        the stall deadline (``_recv_once``)."""
        payload = bytearray(length)
        got = len(head)
        payload[:got] = head
        pv = memoryview(payload)
        while got < length:  # each pass reads >= 1 byte or polls (ends with the connection, or a stall)
            got += self._recv_once(pv[got:])
        return bytes(payload)

    def _carried(self, bufs: list[memoryview]) -> int:
        """Bytes the reader read ahead (``turn``) that come next in the stream: into ``bufs``, in order; how many."""
        at, end = self._at, self._upto
        for b in bufs:
            k = min(len(b), end - at)
            b[:k] = self._rv[at:at + k]
            at += k
            if at == end:
                break
        got = at - self._at
        self._at, self._upto = (0, 0) if at == end else (at, end)
        self._quiet_since = 0.0
        return got


    def _end(self, reason: str, clean: bool) -> None:
        """The connection's reading is over: tell the channel, leave the reactor, close the socket."""
        self.shutdown()
        try:
            self.channel._conn_lost(self, reason, clean)
        finally:
            self._reactor.remove(self.sock.fileno())
            if self.lock.acquire(timeout=_JOIN):  # a sender holding it fails at once after shutdown
                self.sock.close()
                self.lock.release()
            else:
                log.warning("data connection %s#%d: a sender still holds the socket; leaving it to the GC",
                            self.peer, self.index)
            self.ended.set()
            if self.ended_hook is not None:
                self.ended_hook()

    def _received(self, n: int | None) -> int:
        """What one receive call inside a frame returned: its bytes; 0 for a quiet poll interval (``None``:
        ``SO_RCVTIMEO`` expired); raises on EOF (``_Closed`` when we closed it ourselves) and when the peer
        sent nothing of the frame for ``_STALL`` seconds (a reactor thread is not held by a stalled peer)."""
        if n is None or n == 0:
            if self.closed:
                raise _Closed()
            if n is None:
                now = time.monotonic()
                if not self._quiet_since:
                    self._quiet_since = now
                elif now - self._quiet_since > _STALL:
                    raise ConnectionResetError(f"the peer sent nothing of a frame for {_STALL:g}s")
                return 0
            raise ConnectionResetError("the peer closed the connection in the middle of a frame")
        self._quiet_since = 0.0
        return n

    def _recv_once(self, mv: memoryview) -> int:
        """One ``recv_into``: bytes read, 0 on a quiet poll interval; EOF raises."""
        if self._upto:   # bytes read ahead come first
            return self._carried([mv])
        try:
            n: int | None = self.sock.recv_into(mv, 0, _WAITALL)
        except BlockingIOError:
            n = None
        return self._received(n)

    def _discard(self, n: int) -> None:
        buf = self._buffers.discard()
        while n > 0:  # each pass reads >= 1 byte or polls (ends with the connection)
            got = self._recv_once(buf[:min(n, len(buf))])
            n -= got
            self.bytes_received += got
            self.bytes_discarded += got

    def _recvmsg_once(self, bufs: list[memoryview]) -> int:
        """One scatter ``recvmsg_into`` (at most ``_IOV_MAX`` buffers): bytes read, 0 on a quiet poll interval."""
        if self._upto:   # bytes read ahead come first
            return self._carried(bufs)
        try:
            n: int | None = self.sock.recvmsg_into(bufs, 0, _WAITALL)[0]
        except BlockingIOError:
            n = None
        return self._received(n)

    def _on_data(self, tid: int, offset: int, length: int) -> None:
        receipt = self._receipts.get(tid)
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
                done = self._recv_staged(receipt, tid, which, offs, lens)
            else:  # runs of mapped and unmapped segments, in stream order
                edges = [0, *(np.flatnonzero(mapped[1:] != mapped[:-1]) + 1).tolist(), len(mapped)]
                for a, b in zip(edges[:-1], edges[1:], strict=True):
                    want = int(lens[a:b].sum())
                    if mapped[a]:
                        got = self._recv_mapped(receipt, which[a:b], offs[a:b], lens[a:b])
                    else:
                        got = self._recv_staged(receipt, tid, which[a:b], offs[a:b], lens[a:b])
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
        """Scatter-receive segments straight into mapped destination memory, ``_IOV_MAX`` buffers per call.

        The destination is touched only between ``_begin_io`` and ``_end_io``, so a receipt that failed
        or was cancelled is never written once ``wait()``/``cancel()`` returned. Returns the bytes read
        (fewer than asked when the receipt ended)."""
        starts = offs.tolist()
        ends = (offs + lens).tolist()
        hs = which.tolist()
        one = hs[0] if hs[0] == hs[-1] and (len(hs) < 3 or not (which != hs[0]).any()) else -1
        count = len(starts)
        # each receive below holds the receipt's memory: at most _POLL (SO_RCVTIMEO)
        # segments i..j of at most _RECV_MAX bytes per call: small receives keep the copy out of the
        # socket cache-warm and let the sender refill the socket while this thread copies
        cum = (np.cumsum(lens) - lens).tolist()
        i = 0
        head = 0       # bytes of segment i already received
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
                over = cum[j - 1] + ends[j - 1] - starts[j - 1] - limit   # the last segment past the limit
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

    def _recv_staged(self, receipt: TcpReceipt, tid: int, which: np.ndarray, offs: np.ndarray,
                     lens: np.ndarray) -> int:
        """Segments of handles without a mapping: receive a staging buffer full, then write it out in one
        batch per handle (``write_raw``: one system call per ``IOV_MAX`` segments) or per segment
        (``write_from``). Returns the bytes read (fewer than asked when the receipt ended or failed)."""
        staging, base = self._buffers.staging()
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
                write_out(receipt._table.handles, receipt._raw, which[i0:i1], o, base + (p - lo), k, staging, base)
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
