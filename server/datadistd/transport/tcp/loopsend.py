"""``LoopFinish``: the rest of a DATA frame that a non-blocking ``sendmsg`` from the event loop took only in part
(``TcpChannel.try_send_soon``), finished from the same loop as the socket drains -- no thread, and the loop never
blocks on it.

It holds the connection's send lock until the frame is out (other senders wait for that connection as for any
frame), writes only from the event loop (``add_writer``), and ends exactly once: every byte out; the deadline
passed (``LLM_TIMEOUT``); the socket failed (``LLM_LINK_FAILED``); or the waiter was cancelled. A frame cut short
leaves its connection unusable, so each failure shuts it and breaks the channel, as a blocking send's does. Once
``wait`` returned or raised -- cancelled too -- the source is never read again: the caller may unpin it.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from .conn import DataConn
from .wire import _IOV_MAX, _SEND_NOWAIT, drop_sent

__all__ = ["LoopFinish"]


class LoopFinish:
    """The rest (``bufs``: what the socket has not taken yet) of a frame on ``conn``, whose lock the caller holds
    and hands over here; ``broke(reason)`` breaks the channel. Started at once; ``wait`` for its end."""

    def __init__(self, conn: DataConn, bufs: list[memoryview], payload: int, deadline: float,
                 broke: Callable[[str], None], what: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._conn = conn
        self._bufs = bufs
        self._payload = payload
        self._broke = broke
        self._what = what
        self._fd = conn.sock.fileno()
        self._over = False
        self.done: asyncio.Future[None] = self._loop.create_future()
        try:
            self._loop.add_writer(self._fd, self._more)
        except BaseException:
            self._bufs = []
            conn.lock.release()
            raise
        self._timer = self._loop.call_at(deadline, self._end, DataDistError(
            LLMStatusCode.LLM_TIMEOUT, f"{what}: the deadline passed in the middle of a frame"))

    async def wait(self) -> None:
        """Until the frame is out; raises its failure. Cancelled, the frame is given up (its connection with it)
        before this raises, so nothing reads the source afterwards."""
        try:
            await self.done
        except asyncio.CancelledError:
            self._end(DataDistError(LLMStatusCode.LLM_FAILED, f"{self._what}: cancelled in the middle of a frame"))
            raise

    def _more(self) -> None:
        """The socket is writable: as much of the rest as it takes now."""
        if self._over:
            return
        bufs = self._bufs
        try:
            sent = self._conn.sock.sendmsg(bufs[:_IOV_MAX], [], _SEND_NOWAIT)
        except BlockingIOError:
            return
        except OSError as exc:
            self._end(DataDistError(LLMStatusCode.LLM_LINK_FAILED, f"{self._what}: send failed: {exc}"))
            return
        drop_sent(bufs, sent)
        if not bufs:
            self._end(None)

    def _end(self, failure: DataDistError | None) -> None:
        """Exactly once: stop writing, give the connection back (a frame cut short: shut, the channel broken), and
        settle ``done``."""
        if self._over:
            return
        self._over = True
        self._bufs = []
        self._timer.cancel()
        self._loop.remove_writer(self._fd)
        conn = self._conn
        if failure is None:
            conn.frames_sent += 1
            conn.bytes_sent += self._payload
        else:
            conn.shutdown()
        conn.lock.release()
        if failure is not None:
            self._broke(f"{self._what} failed: {failure.message}")
        if not self.done.done():
            if failure is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(failure)

