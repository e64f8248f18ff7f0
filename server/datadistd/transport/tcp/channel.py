"""``TcpChannel``: the connections of one link, sending (striped frames, try_send, control frames)."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Protocol, Sequence

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...core.types import TransferId
from ...memory.base import Segment
from ...memory.segments import byte_view
from ..base import CONTROL_DOWN, EarlyFrames
from .conn import DataConn
from .control import ControlSends
from .loopsend import LoopFinish
from .staging import Buffers, SendPlan, frame_cuts
from .wire import (
    _ABORT_TIMEOUT,
    _INLINE_FINISH,
    _INLINE_MAX,
    _IOV_MAX,
    _JOIN,
    _SEND_NOWAIT,
    FRAME_MAGIC,
    HEADER,
    KIND_ABORT,
    KIND_DATA,
    ControlHandler,
    _encode_code,
    _ProtocolError,
    _SendError,
    _table,
    drop_sent,
)

if TYPE_CHECKING:
    from .reactor import Reactor
    from .receipt import TcpReceipt

log = logging.getLogger("datadistd.transport.tcp")


class ChannelOwner(Protocol):
    """What a channel needs of the transport that made it (``TcpTransport``), declared here so that this
    module names nothing above it."""

    chunk_size: int
    stripe: int
    _stopping: bool
    _buffers: Buffers
    _receipts: dict[int, TcpReceipt]
    _reactor: Reactor

    def _channel_down(self, channel: TcpChannel, message: str) -> None:
        """Fail the receipts bound to ``channel``."""

    def _retire(self, channel: TcpChannel) -> None:
        """``channel`` leaves the transport's tables; its counters stay in the totals."""


class TcpChannel(ControlSends):
    """The connections made with one token; carries frames both ways."""

    def __init__(self, transport: ChannelOwner, token: bytes, peer: str, outbound: bool) -> None:
        self._transport = transport
        self._token = token
        self._peer = peer
        self._outbound = outbound
        self._conns: list[DataConn] = []
        self._lock = threading.Lock()
        self._broken = False
        self._closed = False
        self._reason = ""
        self._rr = itertools.count()
        self._early = EarlyFrames()   # control frames: to the handler, or kept until one is set
        self._pool: ThreadPoolExecutor | None = None   # stripe senders while a striped send runs (``_senders``)
        self._striping = 0     # striped sends holding ``_pool``
        self._ended = 0        # connections whose reader ended (``_conn_lost``)
        self._told = False     # the handler heard the channel went down (``_tell_down``)
        self._handler: ControlHandler | None = None   # bound into each connection once the backlog is handed over

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

    def _attach(self, sock: socket.socket, index: int, peer: str) -> DataConn | None:
        with self._lock:
            if self._broken or self._closed:
                return None
            conn = DataConn(self, sock, index, peer, self._transport._receipts, self._transport._buffers,
                            self._transport._reactor)
            conn.handler = self._handler
            self._conns.append(conn)
            return conn

    def _live(self) -> list[DataConn]:
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
        plan = SendPlan(table)
        total = plan.total
        size = self._transport.chunk_size
        chunks = frame_cuts(plan.table, size)
        n = len(conns)
        base = next(self._rr)
        workers = min(n, len(chunks), self._transport.stripe)
        shares = [chunks[w::workers] for w in range(workers)]  # chunk k goes to worker k % workers
        errors: list[_SendError] = []
        stop = threading.Event()
        buffers = self._transport._buffers

        def work(conn: DataConn, share: list[tuple[int, int]]) -> None:
            staging: memoryview | None = None
            try:
                for offset, length in share:  # in order, one chunk per frame
                    if stop.is_set():
                        return
                    if staging is None and not plan.all_mapped:
                        staging = buffers.take(size)
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
                    buffers.give(staging)

        helpers: list[Future[None]] = []
        pool: ThreadPoolExecutor | None = None
        try:
            pool = self._senders() if workers > 1 else None
            for w in range(1, workers):
                assert pool is not None
                helpers.append(pool.submit(work, conns[(base + w) % n], shares[w]))
        except RuntimeError:   # the channel closed meanwhile: its sender pool takes no more work
            stop.set()
            errors.append(_SendError(LLMStatusCode.LLM_LINK_FAILED, "the data channel closed", unusable=False))
        try:
            work(conns[base % n], shares[0])
            for fut in helpers:  # workers stop by the deadline: their socket timeouts come from it
                try:
                    fut.result(max(0.0, deadline - time.monotonic()) + _JOIN)
                except FutureTimeout:
                    errors.append(_SendError(LLMStatusCode.LLM_TIMEOUT, "a sender thread did not finish",
                                             unusable=True))
                    stop.set()
                except CancelledError:   # the channel went down before this share started
                    errors.append(_SendError(LLMStatusCode.LLM_LINK_FAILED, "the data channel closed",
                                             unusable=False))
                    stop.set()
        finally:
            plan.release()
            if pool is not None:
                self._senders_done(pool)
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
        connection with a non-blocking ``sendmsg`` (unmapped segments read into a staging buffer first); no
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
        plan = SendPlan(table)
        staging = None if plan.all_mapped else self._transport._buffers.take(plan.total)
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
                self._transport._buffers.give(staging)

    def try_send_soon(self, transfer_id: TransferId, segments: Sequence[Segment],
                      deadline: float) -> bool | LoopFinish:
        """From the event loop, a transfer of one frame (at most ``chunk_size`` bytes) of mapped memory: one
        non-blocking ``sendmsg`` on an idle connection -- no executor hop, no thread switch. True: it went out whole;
        False, no side effect: declined (more than one frame, a handle without a mapping, every connection busy or
        its socket full) -- ``send`` it from a thread; a ``LoopFinish`` when the socket took only part: the rest
        goes from the event loop as the socket drains (``LoopFinish.wait``), the loop never blocks on it. Up to
        ``_INLINE_MAX`` bytes this is ``try_send``."""
        table = _table(segments)
        if table.nbytes <= _INLINE_MAX:
            return self.try_send(transfer_id, segments, deadline)
        if table.nbytes > self._transport.chunk_size:
            return False
        table = table.nonempty()
        if len(table.offsets) >= _IOV_MAX:   # its header and buffers would pass one sendmsg's iovec limit
            return False
        conns = self._live()
        views = [byte_view(h, writable=False) for h in table.handles]
        try:
            if any(v is None for v in views):
                return False
            total = table.nbytes
            bufs = [memoryview(HEADER.pack(FRAME_MAGIC, KIND_DATA, transfer_id, 0, total))]
            starts = table.offsets.tolist()
            ends = (table.offsets + table.lengths).tolist()
            if len(views) == 1:   # the whole table, views of its memory (no cut, no plan: one frame)
                v = views[0]
                bufs += [v[a:b] for a, b in zip(starts, ends, strict=True)]  # type: ignore[index]
            else:
                bufs += [views[h][a:b] for h, a, b in zip(table.which.tolist(), starts, ends,
                                                          strict=True)]
            n = len(conns)
            base = next(self._rr)
            for k in range(n):  # the first idle connection whose socket takes a byte, from where striping would
                conn = conns[(base + k) % n]
                if not conn.lock.acquire(timeout=0):
                    continue
                try:
                    sent = -1 if conn.closed else conn.sock.sendmsg(bufs, [], _SEND_NOWAIT)
                except BlockingIOError:
                    sent = -1
                except OSError as exc:
                    conn.shutdown()
                    conn.lock.release()
                    self._break(f"sending transfer {transfer_id} failed: send failed: {exc}")
                    raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"sending transfer {transfer_id} ({total} "
                                                                       f"bytes) to {self._peer}: {exc}") from None
                if sent < 0:
                    conn.lock.release()
                    continue
                if sent == HEADER.size + total:
                    conn.frames_sent += 1
                    conn.bytes_sent += total
                    conn.lock.release()
                    return True
                drop_sent(bufs, sent)   # the rest: this list is LoopFinish's from here (``bufs`` is rebound below)
                return LoopFinish(conn, bufs, total, deadline, self._break,
                                  f"sending transfer {transfer_id} ({total} bytes) to {self._peer}")
            return False
        finally:
            bufs = []
            views = []

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

    # -- control frames (transport.base.Channel) --

    def on_control(self, handler: "ControlHandler") -> None:
        """``handler(kind, payload)`` gets every control frame (CALL/REPLY/TRANSPORT), in a reader thread
        (keep it short); frames that came before are handed over now. From then on each connection's reader hands
        its control frames to ``handler`` itself (``DataConn.handler``), the backlog being empty for good."""
        self._early.set_handler(handler)
        with self._lock:
            self._handler = handler
            for conn in self._conns:
                conn.handler = handler
        self._tell_down()   # it went down before

    def _on_control(self, kind: int, payload: bytes) -> None:
        if not self._early.deliver(kind, payload):
            raise _ProtocolError(f"more than {self._early.limit} control frames before the link was ready")

    # -- life cycle --

    def _senders(self) -> ThreadPoolExecutor:
        """The channel's stripe sender threads (at most ``4 x (stripe - 1)``) for one striped send, which gives them
        back with ``_senders_done``: they are made for the striped sends in flight and leave when the last ends
        (an idle channel keeps none), or with the channel."""
        with self._lock:
            if self._broken or self._closed:
                raise RuntimeError("channel is down")
            if self._pool is None:
                width = max(1, 4 * (self._transport.stripe - 1))
                self._pool = ThreadPoolExecutor(width, thread_name_prefix=f"datadist-tcp-send:{self._peer}")
            self._striping += 1
            return self._pool

    def _senders_done(self, pool: ThreadPoolExecutor) -> None:
        """A striped send that took ``pool`` ended; the last one in flight lets its threads go."""
        with self._lock:
            self._striping -= 1
            if self._striping or self._pool is not pool:
                return
            self._pool = None
        pool.shutdown(wait=False)   # every share ended (joined by ``send``): the threads leave now

    def _stop_senders(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)   # running sends fail fast: their sockets are shut

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._reason = self._reason or "closed locally"
            conns = list(self._conns)
        for conn in conns:
            conn.shutdown()
        self._stop_senders()
        self._transport._channel_down(self, f"data channel to {self._peer} was closed")
        self._transport._retire(self)
        self._tell_down()

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
        self._stop_senders()
        self._transport._channel_down(self, f"data channel {'to' if self._outbound else 'from'} {self._peer} "
                                            f"broke: {reason}")

    def _conn_lost(self, conn: DataConn, reason: str, clean: bool) -> None:
        with self._lock:
            self._ended += 1
        if not (self._closed or self._transport._stopping or not reason):
            self._break(f"connection #{conn.index}: {reason}", clean)
        self._tell_down()

    def _tell_down(self) -> None:
        """The control handler hears, once, that the channel went down (``base.CONTROL_DOWN``): the link fails the
        calls pending on it then, not at its next heartbeat. Once it is down (broken or closed), has a handler and
        every connection's reader ended -- the last of them, ``on_control`` or ``close`` tells it -- so every frame
        read off any connection was handed over before (a reply and the end of the connection beside it may come
        on two connections, read by two threads: the reply first)."""
        with self._lock:
            if (self._told or self._early.handler is None or not (self._broken or self._closed)
                    or self._ended < len(self._conns)):
                return
            self._told = True
            handler = self._early.handler
        try:
            assert handler is not None
            handler(CONTROL_DOWN, self._reason.encode())
        except Exception:  # noqa: BLE001 - the channel is down whatever the handler does
            log.exception("data channel %s %s: the control handler failed on the channel's end",
                          "to" if self._outbound else "from", self._peer)

