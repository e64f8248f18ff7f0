"""``FrameReader``: the reading half of a data connection (``conn.DataConn``) -- its reactor turn: frames off the
socket, each checked and handed on (control frames to the channel's handler, DATA frames to ``_on_data``), and the
bytes it read ahead of the frame it is at, served first to whoever reads the stream next."""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Protocol

from datadist.status import LLMStatusCode

from ..base import ControlRefused
from .wire import (
    _DONTWAIT,
    _READ_AHEAD,
    _TURN_FRAMES,
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
)

if TYPE_CHECKING:
    from .receipt import TcpReceipt

log = logging.getLogger("datadistd.transport.tcp")


class _Ahead(threading.local):
    """A reader thread's read-ahead buffer, lent to the turn it runs: a turn ends with less than a header read ahead,
    which its connection keeps (``_left``), so a buffer per reactor thread does, not one per connection."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(_READ_AHEAD))


_AHEAD = _Ahead()


class FrameSink(Protocol):
    """Where a reader's control frames go before the link is ready (the channel's early-frames backlog)."""

    def _on_control(self, kind: int, payload: bytes) -> None:
        """A control frame arrived (raises ``_ProtocolError`` to drop the connection)."""


class FrameReader:
    """The reader of ``DataConn`` (which provides what is declared here and sets the state in its ``__init__``)."""

    channel: FrameSink
    sock: socket.socket
    peer: str
    index: int
    closed: bool
    handler: ControlHandler | None
    _receipts: dict[int, TcpReceipt]
    _rv: memoryview                       # in a turn, its thread's read-ahead buffer (``_AHEAD``) ...
    _at: int                              # ... whose bytes ``[_at, _upto)`` come next in the stream
    _upto: int
    _left: bytearray                      # between turns: ``_left[:_upto]``, the start of a header (``_at`` 0)
    _controls: int                        # control frames read in a row (2 or more: headers are read ahead)
    _quiet_since: float
    bytes_received: int
    frames_received: int

    def _on_data(self, tid: int, offset: int, length: int) -> None:
        raise NotImplementedError

    def _recv_once(self, mv: memoryview) -> int:
        raise NotImplementedError

    def _end(self, reason: str, clean: bool) -> None:
        raise NotImplementedError

    def turn(self) -> bool:
        """The socket is readable (``reactor.Reactor``): read every frame that is there -- a frame once begun to its
        end, at most ``_TURN_FRAMES`` of them unless more are read ahead already -- and hand each on. True: wake me
        at the next bytes; False: the connection ended (cleaned up here).

        Receive calls: a header is read with what follows it -- up to ``_READ_AHEAD`` bytes once control frames come
        in a row (a small frame whole in one call), else the header alone -- and a control frame's payload with the
        next header, never more. What was read ahead waits in ``_rv[_at:_upto]`` and is served first
        (``_carried``). So a DATA frame's payload lands in its destination straight from the socket, but for what a
        read-ahead took of it: at most ``_READ_AHEAD`` bytes, only right behind control frames in a row (a stream of
        DATA frames, or of DATA frames each followed by a REPLY, is never read ahead). A receive that came back short
        of what it asked drained the socket: once the frames read are handed on the turn ends, with no probe failing
        with EAGAIN (an exception); the one-shot re-arm wakes a thread at the next bytes. A turn never ends with a
        whole header read ahead (no wake-up would come for it)."""
        reason, clean = "", False
        rv = self._rv = _AHEAD.view
        if self._upto:   # the start of a header, read by the last turn
            rv[:self._upto] = self._left[:self._upto]
        unpack = HEADER.unpack_from
        sock = self.sock
        size = HEADER.size
        frames = 0
        drained = False
        try:
            while True:  # one frame per pass; a header cut short waits for the next turn
                at, end = self._at, self._upto
                if end - at < size:
                    if drained or frames >= _TURN_FRAMES:
                        if end:
                            self._keep(at, end)
                        return True
                    if at:                  # what there is of the header to the front (at >= size > end - at)
                        end -= at
                        rv[:end] = rv[at:at + end]
                        at = self._at = 0
                        self._upto = end
                    ask = (_READ_AHEAD if self._controls > 1 else size) - end
                    try:
                        n = sock.recv_into(rv[end:end + ask], ask, _DONTWAIT)
                    except BlockingIOError:
                        if self.closed:
                            raise _Closed() from None
                        self._keep(0, end)
                        return True
                    if n == 0:
                        if self.closed:
                            raise _Closed()
                        if end == 0:
                            reason, clean = "the peer closed the connection", True
                            break
                        raise ConnectionResetError("the peer closed the connection in the middle of a frame header")
                    end += n
                    self._upto = end
                    drained = n < ask
                    if end < size:
                        self._keep(0, end)
                        return True
                magic, kind, tid, offset, length = unpack(rv, at)
                at += size
                frames += 1
                handler = self.handler
                if (handler is not None and kind in KIND_CONTROL and magic == FRAME_MAGIC and not tid and not offset
                        and length <= MAX_CONTROL):
                    # the common control frame, flat (C calls and the handler)
                    self._quiet_since = 0.0
                    if end - at >= length:    # read ahead whole
                        payload = bytes(rv[at:at + length])
                        at += length
                        self._at, self._upto = (0, 0) if at == end else (at, end)
                        self._controls += 1
                    else:
                        # the rest of its payload, and the next header while the turn goes on -- but for a frame too
                        # long for the read-ahead: no copy of it (to cut the next header off), no read-ahead next
                        head = bytes(rv[at:end])
                        self._at = self._upto = 0
                        rest = length - len(head)
                        small = length + size <= _READ_AHEAD
                        want = rest + size if small and frames < _TURN_FRAMES else rest
                        self._controls = self._controls + 1 if small else 0
                        try:
                            data = sock.recv(want, _DONTWAIT)
                            drained = 0 < len(data) < want   # b"": EOF, which the next header's receive sees again
                        except BlockingIOError:
                            data, drained = b"", False
                        n = len(data)
                        if n > rest:          # the next header, or its start
                            rv[:n - rest] = data[rest:]
                            self._upto = n - rest
                            data = data[:rest]
                        elif n < rest:        # the rest is still on its way: wait for it as any frame does
                            data = self._control_rest(rest, data)
                            drained = False
                        payload = head + data if head else data
                    self.bytes_received += length
                    self.frames_received += 1
                    handler(kind, payload)
                else:
                    self._at, self._upto = (0, 0) if at == end else (at, end)
                    self._controls = 0
                    self._frame(magic, kind, tid, offset, length)
        except _Closed:
            reason = ""
        except (_ProtocolError, ControlRefused) as exc:
            reason = f"protocol error: {exc}"
        except OSError as exc:
            reason = f"connection lost: {exc}"
        except Exception as exc:  # noqa: BLE001 - a reader must always report and clean up
            log.exception("data connection %s#%d: reader failed", self.peer, self.index)
            reason = f"reader failed: {exc!r}"
        self._end(reason, clean)
        return False

    def _keep(self, at: int, end: int) -> None:
        """The turn ends with ``_rv[at:end]`` read ahead, less than a header: the connection keeps it."""
        self._left[:end - at] = self._rv[at:end]
        self._at, self._upto = 0, end - at

    def _frame(self, magic: bytes, kind: int, tid: int, offset: int, length: int) -> None:
        """The frame of this header: read its payload and hand it on."""
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
