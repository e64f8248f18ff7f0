"""``ControlSends``: how a ``TcpChannel`` sends control frames (CALL/REPLY/TRANSPORT) -- flat in the common case
(one connection, idle: its lock taken and given inline, one ``sendmsg``), ``_control_frame`` for the rest."""

from __future__ import annotations

import itertools
import time
from typing import Callable

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from .conn import DataConn
from .wire import (
    _INLINE_FINISH,
    _SEND_NOWAIT,
    FRAME_MAGIC,
    HEADER,
    KIND_CONTROL,
    MAX_CONTROL,
    _SendError,
)


class ControlSends:
    """The control-frame sends of ``TcpChannel`` (which provides what is declared here)."""

    _conns: list[DataConn]
    _broken: bool
    _closed: bool
    _peer: str
    _rr: itertools.count[int]

    def _live(self) -> list[DataConn]:
        raise NotImplementedError

    def _break(self, reason: str, clean: bool = False) -> None:
        raise NotImplementedError

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
