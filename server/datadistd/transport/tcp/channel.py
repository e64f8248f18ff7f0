"""``TcpChannel``: the connections of one link, sending (striped frames, try_send, control frames)."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Callable, NoReturn, Protocol, Sequence

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...core.types import TransferId
from ...memory.base import Segment
from ...memory.segments import byte_view
from ..base import CONTROL_DOWN, EarlyFrames
from .conn import DataConn
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
    KIND_CONTROL,
    KIND_DATA,
    MAX_CONTROL,
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


class _Stripes:
    """One striped send (``TcpChannel.send``): what every stripe worker needs, and how the first failure stops the
    others. ``work`` runs on the calling thread and on each sender thread; ``errors`` is appended to by any of them."""

    def __init__(self, transfer_id: TransferId, plan: SendPlan, deadline: float, size: int, buffers: Buffers) -> None:
        self.transfer_id = transfer_id
        self.plan = plan
        self.deadline = deadline
        self.size = size              # the frame size: a worker's staging buffer for handles without a mapping
        self.buffers = buffers
        self.errors: list[_SendError] = []
        self.stop = threading.Event()

    def failed(self, error: _SendError) -> None:
        self.errors.append(error)
        self.stop.set()

    def work(self, conn: DataConn, share: list[tuple[int, int]]) -> None:
        """One stripe worker: its ``share`` of the frames, in order, one chunk per frame on ``conn``."""
        plan = self.plan
        staging: memoryview | None = None
        try:
            for offset, length in share:
                if self.stop.is_set():
                    return
                if staging is None and not plan.all_mapped:
                    staging = self.buffers.take(self.size)
                try:
                    conn.send_chunk(self.transfer_id, offset, length, plan, staging, self.deadline)
                except _SendError as exc:
                    if exc.unusable:
                        conn.shutdown()
                    self.failed(exc)
                    return
                except Exception as exc:  # noqa: BLE001 - e.g. a handle's read_into failed
                    code = exc.code if isinstance(exc, DataDistError) else LLMStatusCode.LLM_FAILED
                    self.failed(_SendError(code, f"reading the source failed: {exc}", unusable=False))
                    return
        finally:
            if staging is not None:
                self.buffers.give(staging)

    def join(self, helpers: list[Future[None]]) -> None:
        """The sender threads' shares end by the deadline (their socket timeouts come from it)."""
        for fut in helpers:
            try:
                fut.result(max(0.0, self.deadline - time.monotonic()) + _JOIN)
            except FutureTimeout:
                self.failed(_SendError(LLMStatusCode.LLM_TIMEOUT, "a sender thread did not finish", unusable=True))
            except CancelledError:   # the channel went down before this share started
                self.failed(_SendError(LLMStatusCode.LLM_LINK_FAILED, "the data channel closed", unusable=False))


class TcpChannel:
    """The connections made with one token; carries frames both ways: DATA frames striped over them (``send``) or
    one from the calling thread (``try_send``, ``try_send_soon``), control frames (``try_control`` and kin)."""

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
        """Send ``segments`` as transfer ``transfer_id``, striped: frame *k* on connection *(base + k) % n* by stripe
        worker *k % w* -- the calling thread one of them, the channel's sender threads the others (``_senders``).
        Raises ``DataDistError`` (after an ABORT, or with the channel broken when a connection became unusable)."""
        table = _table(segments)
        conns = self._live()
        if table.nbytes == 0:
            return
        plan = SendPlan(table)
        chunks = frame_cuts(plan.table, self._transport.chunk_size)
        n = len(conns)
        base = next(self._rr)
        workers = min(n, len(chunks), self._transport.stripe)
        shares = [chunks[w::workers] for w in range(workers)]  # chunk k goes to worker k % workers
        job = _Stripes(transfer_id, plan, deadline, self._transport.chunk_size, self._transport._buffers)
        pool: ThreadPoolExecutor | None = None
        helpers: list[Future[None]] = []
        try:
            pool = self._senders() if workers > 1 else None
            for w in range(1, workers):
                assert pool is not None
                helpers.append(pool.submit(job.work, conns[(base + w) % n], shares[w]))
        except RuntimeError:   # the channel closed meanwhile: its sender pool takes no more work
            job.failed(_SendError(LLMStatusCode.LLM_LINK_FAILED, "the data channel closed", unusable=False))
        try:
            job.work(conns[base % n], shares[0])
            job.join(helpers)
        finally:
            plan.release()
            if pool is not None:
                self._senders_done(pool)
        if job.errors:
            self._send_failed(transfer_id, plan.total, job.errors)

    def _send_failed(self, transfer_id: TransferId, total: int, errors: list[_SendError]) -> None:
        """A striped send failed: the channel breaks (a connection became unusable) or the peer hears an ABORT; the
        first failure raises."""
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
                    self._soon_failed(conn, transfer_id, total, exc)
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

    def _soon_failed(self, conn: DataConn, transfer_id: TransferId, total: int, exc: OSError) -> NoReturn:
        """``try_send_soon``'s ``sendmsg`` on ``conn`` (its lock held) failed: the connection is closed, the lock
        given back, the channel broken; raises."""
        conn.shutdown()
        conn.lock.release()
        self._break(f"sending transfer {transfer_id} failed: send failed: {exc}")
        raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"sending transfer {transfer_id} ({total} bytes) to "
                                                           f"{self._peer}: {exc}") from None

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

    def try_control(self, kind: int, payload: bytes, deadline: float) -> bool:
        """One control frame from the calling thread (the event loop) on an idle connection, without
        blocking; False (nothing sent) when every connection is busy or would block.

        The common case -- one connection, idle, the socket takes the whole frame -- runs flat here (C calls only:
        the connection's lock taken and given inline, one ``sendmsg``); the rest (several connections, a busy or
        closed one, a failed or partial send) is ``_control_frame``'s, with the same outcomes."""
        conns = self._conns          # appended under the lock, never reordered: a snapshot
        n = len(payload)
        if len(conns) == 1 and not (self._broken or self._closed) and kind in KIND_CONTROL and n <= MAX_CONTROL:
            conn = conns[0]
            lock = conn.lock
            with lock.mutex:         # FairLock.acquire(timeout=0), inline
                idle = not lock.locked and not conn.closed
                if idle:
                    lock.locked = True
            if idle:
                try:
                    try:
                        sent = conn.sock.sendmsg((HEADER.pack(FRAME_MAGIC, kind, 0, 0, n), payload), (), _SEND_NOWAIT)
                    except OSError:   # would block or failed, nothing sent: the general path says which
                        sent = -1
                    if sent == HEADER.size + n:
                        conn.frames_sent += 1
                        return True
                    if sent > 0:      # the socket filled up mid-frame: the rest must follow, briefly
                        self._control_finish(conn, memoryview(
                            HEADER.pack(FRAME_MAGIC, kind, 0, 0, len(payload)) + bytes(payload))[sent:], deadline)
                        conn.frames_sent += 1
                        return True
                finally:
                    with lock.mutex:  # FairLock.release, inline
                        if lock.waiters:
                            lock.waiters.popleft().set()
                        else:
                            lock.locked = False
        return self._control_frame(kind, payload, deadline, wait=False)

    def _control_finish(self, conn: DataConn, rest: memoryview, deadline: float) -> None:
        """Under ``conn.lock``: finish a control frame the socket took only in part (``rest``: what it did not take),
        within ``_INLINE_FINISH`` (else the connection is closed, the channel broken and this raises), as
        ``DataConn.write_nowait`` does."""
        try:
            conn._write([rest], min(deadline, time.monotonic() + _INLINE_FINISH), partial=True)
        except _SendError as exc:
            conn.shutdown()
            self._break(f"sending a control frame failed: {exc.message}")
            raise DataDistError(exc.code, f"control frame to {self._peer}: {exc.message}") from None

    def try_control_parts(self, kind: int, parts: list, unlock: Callable[[], None] | None = None) -> bool:
        """One control frame whose payload is ``parts`` (bytes-like: views of mapped memory, say) from the calling
        thread: the frame's header and the parts in one non-blocking ``sendmsg`` on an idle connection, no copy.
        False, nothing sent, when the channel is down or every connection is busy or would block.

        ``parts`` is consumed (emptied) and ``unlock`` called exactly once, as soon as the parts are no longer read:
        after the ``sendmsg``, or -- a frame the full socket took only in part -- once its rest is copied, before
        that rest is finished by blocking sends within ``_INLINE_FINISH`` (else the connection is closed and this
        raises, as ``try_control``). So a caller whose parts view memory it may read only under a lock passes that
        lock's release: the memory is never read after it, and the lock is never held while a peer stalls."""
        try:
            n = sum(map(len, parts))
            if kind not in KIND_CONTROL or n > MAX_CONTROL:
                raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"not a control frame: kind {kind}, {n} bytes")
            conns = self._conns          # appended under the lock, never reordered: a snapshot
            count = len(conns)
            if self._broken or self._closed or not count:
                return False
            base = next(self._rr)
            parts.insert(0, HEADER.pack(FRAME_MAGIC, kind, 0, 0, n))
            for k in range(count):
                conn = conns[(base + k) % count]
                lock = conn.lock
                with lock.mutex:         # FairLock.acquire(timeout=0), inline (C calls only)
                    idle = not lock.locked and not conn.closed
                    if idle:
                        lock.locked = True
                if not idle:
                    continue
                try:
                    try:
                        sent = conn.sock.sendmsg(parts, [], _SEND_NOWAIT)
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        conn.shutdown()
                        self._break(f"sending a control frame failed: {exc}")
                        raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                            f"control frame to {self._peer}: send failed: {exc}") from None
                    if sent < HEADER.size + n:   # the socket filled up mid-frame: the rest must follow, briefly
                        rest = memoryview(b"".join(parts))[sent:]
                        parts.clear()
                        release, unlock = unlock, None
                        if release is not None:
                            release()
                        self._control_finish(conn, rest, time.monotonic() + _INLINE_FINISH)
                    conn.frames_sent += 1
                    return True
                finally:
                    with lock.mutex:     # FairLock.release, inline
                        if lock.waiters:
                            lock.waiters.popleft().set()
                        else:
                            lock.locked = False
            return False
        finally:
            parts.clear()
            if unlock is not None:
                unlock()

    def send_control(self, kind: int, payload: bytes, deadline: float) -> None:
        """One control frame, waiting (until ``deadline``) for a connection when all are busy."""
        self._control_frame(kind, payload, deadline, wait=True)

    def try_control_first(self, kind: int, payload: bytes, deadline: float, grace: float = 0.0) -> bool:
        """``try_control`` on the channel's first connection only: frames sent this way (and by
        ``send_control_first``) arrive, and are handed over by one reader thread, in the order they were sent.
        ``grace``: how long to wait for the connection while another thread's frame holds it (not for its socket)."""
        return self._control_frame(kind, payload, deadline, wait=False, first=True, grace=grace)

    def send_control_first(self, kind: int, payload: bytes, deadline: float) -> None:
        """``send_control`` on the channel's first connection only (see ``try_control_first``)."""
        self._control_frame(kind, payload, deadline, wait=True, first=True)

    def _control_frame(self, kind: int, payload: bytes, deadline: float, wait: bool, first: bool = False,
                       grace: float = 0.0) -> bool:
        if kind not in KIND_CONTROL or len(payload) > MAX_CONTROL:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"not a control frame: kind {kind}, "
                                                                 f"{len(payload)} bytes")
        conns = self._live()
        bufs = [memoryview(HEADER.pack(FRAME_MAGIC, kind, 0, 0, len(payload))), memoryview(payload)]
        base = 0 if first else next(self._rr)
        order = [conns[(base + k) % len(conns)] for k in range(1 if first else len(conns))]
        for conn in order if not wait else order[:1]:
            if not wait and not conn.lock.acquire(timeout=grace):
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

