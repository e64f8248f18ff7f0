"""Reading a worker's attach connection on the process's TCP reactor threads, not on the event loop.

Each connection is registered with the reactor (``transport.tcp.reactor``: one epoll, a small pool of threads,
one-shot registration), so a connection adds no thread (a local user may open thousands) and a worker's datagram
wakes one pool thread, not the loop. That thread's turn (``ConnReading._turn``) reads what the worker queued and
starts a small ``pull_blocks`` or ``push_blocks`` by ``BlocksCacheKey`` right there (``_fast``, the same checks as
ever, then ``links.fast.FastTransfers.start``); the data reader thread that reads the owner's reply answers the
worker (``ended_here``). Anything else -- hello, memory, continuation frames, a general transfer, a fast one whose
pull view the loop must republish first, the connection's end -- is handed to the loop (``call_soon_threadsafe``),
and the connection is not read again until the loop has handled it (``_handed``, then ``_rearm``): so the loop sees
a connection's messages in order and exactly as before, and a fast frame never overtakes a message sent before it.

State under ``AttachConn.lock`` (a turn, the reader threads that end fast transfers, the loop): ``in_flight``;
``armed`` (in the epoll: one event, one turn); ``turning`` (a turn runs); ``paused`` (back-pressure: with
``MAX_TRANSFERS_IN_FLIGHT`` transfers in flight a turn ends without re-arming, and the transfer that ends next
re-arms it, ``Reactor.rearm``, from whichever thread ends it); ``dropped`` (the loop's ``_drop``: a socket out of
the epoll is closed there; one in it is shut down, and the turn of its last event closes it -- the reactor's rule,
so no thread holds an event of a descriptor number that a new connection may reuse). The rest of a
connection (``greeted``, ``partial``, ``skip``) is the loop's: a turn runs only while the loop holds nothing of
the connection, reads it, and clears ``skip`` after a fast start as the loop would.

A turn reads one datagram when nothing else of the connection is in flight (the one-at-a-time pull: no ``EAGAIN``
probe), else up to ``_DRAIN`` until the socket has none (a pipelining worker).

Replies go out from whichever thread ends a transfer (``_answer``). A reply the socket does not take at once (the
worker reads slower than its transfers end: a caller thread descheduled, a burst of hundreds in flight) waits in
the connection's ``outbox`` and the loop sends it when the socket drains (``_flush``); a transfer stays counted
in flight until its reply is sent, so a worker that stops reading holds at most ``MAX_TRANSFERS_IN_FLIGHT``
replies here while back-pressure stops reading its requests -- it is never dropped for reading slowly. Its
session ends when it closes the connection (the socket then errs: ``_flush`` drops it).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import socket
import struct
import threading

from datadist.fastframe import KEY_BLOCKS, KIND_BLOCKS, MAGIC, MAX_DATAGRAM, PULL, PUSH, REPLY, REQUEST, Partial

from ..guard.quota import Charge
from ..memory.base import MAX_PIECES
from ..memory.handover import discard
from ..node.node import Node
from ..node.sessions import WorkerSession
from ..transport.tcp.reactor import Reactor

__all__ = ["AttachConn", "ConnReading", "MAX_TRANSFERS_IN_FLIGHT", "FAST_PULL_BLOCKS", "fds_of"]

log = logging.getLogger("datadistd.api.attach")

#: transfers one connection may have in flight (more wait in the worker's socket buffer)
MAX_TRANSFERS_IN_FLIGHT = 256
#: the most block numbers a fast pull or push names (its bytes are bounded too: ``ownercalls.INLINE_READ_MAX``)
FAST_PULL_BLOCKS = 64
#: datagrams one turn reads at most (the connection goes back to the epoll in between: others get their turn)
_DRAIN = 64
#: a pull or push frame's flags the fast path takes (timeout_ms only: no layer range, offset, exclusive or continuation)
_FAST_FLAGS = 4
TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)   # an int: ``&`` on IntFlag members costs an enum call
#: room for the descriptors one message may carry (``recvmsg``'s ancillary buffer)
_ANCILLARY = socket.CMSG_LEN(MAX_PIECES * 4)
#: a datagram a turn hands the loop: bytes, ancillary data, flags, and whether the loop tries the fast path first
_Datagram = tuple[bytes, list[tuple[int, int, bytes]], int, bool]


def fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of a message's ancillary data (what ``socket.recv_fds`` returns)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4]))
    return fds


class AttachConn:
    __slots__ = ("sock", "fd", "session", "greeted", "tasks", "in_flight", "partial", "assembly", "deadline", "skip",
                 "lock", "armed", "turning", "paused", "dropped", "outbox", "writing")

    def __init__(self, sock: socket.socket, session: WorkerSession) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.session = session
        self.greeted = False
        self.tasks: set[asyncio.Task[None]] = set()     # pushes in flight (cancelled when the connection goes)
        self.partial: Partial | None = None             # the transfer whose continuation frames are coming
        self.assembly: Charge | None = None             # ... its numbers booked to the uid (``assembly_bytes``)
        self.deadline: asyncio.TimerHandle | None = None    # ... and when it is refused if they stop
        self.skip: int | None = None    # request id of a transfer refused mid-assembly: its later frames are dropped
        # under ``lock`` (the module doc): a turn, the reader threads that end fast transfers, the loop
        self.lock = threading.Lock()
        self.in_flight = 0                              # transfers started and not yet answered
        self.armed = True                               # in the epoll, waiting to be readable (``_watch``)
        self.turning = False                            # a reactor thread reads the connection
        self.paused = False                             # reading stopped by back-pressure
        self.dropped = False                            # ``_drop``: the socket closed, or shut down for a turn to close
        # replies the socket did not take yet (a worker reading slower than its transfers end), sent in order by the
        # loop as the socket drains (``_flush``); a transfer's reply stays counted in ``in_flight`` until sent
        self.outbox: collections.deque[tuple[bytes, bool]] = collections.deque()
        self.writing = False                            # the loop waits for the socket to take the outbox


class ConnReading:
    """How ``AttachServer`` reads its connections (the module doc); it provides what is declared here."""

    node: Node
    fast_pulls: bool
    _loop: asyncio.AbstractEventLoop | None
    _reactor: Reactor

    def _general(self, conn: AttachConn, data: bytes, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        """A datagram the fast path did not take (the loop)."""
        raise NotImplementedError

    def _drop(self, conn: AttachConn, finalize: bool = True) -> None:
        raise NotImplementedError

    def ended(self, token: tuple[AttachConn, int, str], status: int, nbytes: int, transport: str,
              message: str) -> None:
        """A fast transfer ended on the loop (``links.fast.FastReply``)."""
        raise NotImplementedError

    def _watch(self, conn: AttachConn) -> None:
        """Read ``conn`` on the reactor from now on (its first turn as soon as it is readable)."""
        self._reactor.add(conn.fd, functools.partial(self._turn, conn))

    def _turn(self, conn: AttachConn) -> bool:
        """A reactor thread's turn of ``conn``; it re-arms the connection itself (under ``conn.lock``), so it returns
        False: the reactor touches the socket no more after it."""
        with conn.lock:
            if conn.turning:    # never, but for a reactor's stale event: the turn that runs re-arms
                return False
            conn.armed = False  # one-shot: the event that woke this turn was the only one
            if conn.dropped:    # shut down by ``_release``: closed here, by the turn of its last event
                self._close(conn)
                return False
            conn.turning = True
        item: _Datagram | None = None   # a datagram for the loop
        gone = False                    # the connection failed: the loop drops it
        try:
            sock, fast = conn.sock, self.fast_pulls
            for _ in range(_DRAIN):
                try:
                    data, ancillary, flags, _ = sock.recvmsg(MAX_DATAGRAM, _ANCILLARY)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    gone = True
                    break
                started = fast and not ancillary and self._fast(conn, data, flags, False)
                if not started:   # None: the loop must start it (a stale view)
                    item = (data, ancillary, flags, started is None)   # the connection's end too (an empty datagram)
                    break
                in_flight = conn.in_flight
                if in_flight <= 1 or in_flight >= MAX_TRANSFERS_IN_FLIGHT:   # alone: most likely nothing queued
                    break
        except Exception:  # noqa: BLE001 - a bug of ours: the connection is dropped, the log has the trace
            log.exception("attach connection of pid %s: reading failed", conn.session.cred.pid)
            gone = True
        with conn.lock:
            conn.turning = False
            if conn.dropped:
                self._close(conn)
                if item is not None:
                    discard(fds_of(item[1]))
                return False
            if item is None and not gone:
                # re-armed here, under the lock, not by the reactor once it is given: a ``_drop`` in between then
                # closes a socket no thread touches again
                if conn.in_flight < MAX_TRANSFERS_IN_FLIGHT:
                    conn.armed = True
                    self._reactor.rearm(conn.fd)
                else:
                    conn.paused = True   # back-pressure: the transfer that ends next re-arms it
                return False
        loop = self._loop
        assert loop is not None
        try:
            loop.call_soon_threadsafe(self._handed, conn, item)
        except RuntimeError:   # the loop is closed: the daemon is stopping
            if item is not None:
                discard(fds_of(item[1]))
        return False

    def _fast(self, conn: AttachConn, data: bytes, flags: int, on_loop: bool) -> bool | None:
        """``data`` started as a fast transfer (``FastTransfers.start``): a pull or push frame of one of the session's
        engines by ``BlocksCacheKey``, whole tensors, at most ``FAST_PULL_BLOCKS`` blocks, on a greeted connection
        assembling nothing. False: not such a frame, or the fast path declined it (the general path answers it);
        None: the loop must run it (off the loop only)."""
        if (len(data) > REQUEST.size and data[0] == MAGIC and (data[1] == PULL or data[1] == PUSH)
                and not flags & TRUNCATED and conn.partial is None and conn.greeted):
            (_, _, kind, key_kind, fl, rid, engine_id, cache_id, cluster, model_id, b, c, _, _, _, _, _, _, _,
             timeout_ms, _, _, nr, nl) = REQUEST.unpack_from(data)
            slot = self.node.engines.get(engine_id)
            session = conn.session
            if (kind == KIND_BLOCKS and key_kind == KEY_BLOCKS and not fl & ~_FAST_FLAGS and not b and not c
                    and nr == nl and nr <= FAST_PULL_BLOCKS and len(data) == REQUEST.size + 16 * nr
                    and slot is not None and slot.session is session and not session.closed):
                local = struct.unpack_from(f"<{nl}Q", data, REQUEST.size + 8 * nr)
                push = data[1] == PUSH
                with conn.lock:   # its reply may come before ``fast_transfer`` returns
                    conn.in_flight += 1
                started = slot.links.fast_transfer(push, cluster, model_id, cache_id, data, REQUEST.size, local,
                                                   timeout_ms if fl else 0, self,
                                                   (conn, rid, "Push" if push else "Pull"), on_loop)
                if started:
                    if conn.skip is not None:   # a non-continuation frame: a refused transfer's rest is over
                        conn.skip = None
                    return True
                with conn.lock:   # not paused: a turn runs, or the loop holds the connection
                    conn.in_flight -= 1
                return started
        return False

    def _handed(self, conn: AttachConn, item: _Datagram | None) -> None:
        """A datagram a turn could not take (None: the connection failed), on the loop; then the connection is read
        again (``_rearm``)."""
        if conn.dropped:
            if item is not None:
                discard(fds_of(item[1]))
            return
        if item is None:
            self._drop(conn)
            return
        data, ancillary, flags, fast = item
        try:
            if not fast or not self._fast(conn, data, flags, True):
                self._general(conn, data, ancillary, flags)
        finally:   # a bug of ours (the loop logs it) leaves the connection read, as a failed callback did
            self._rearm(conn)

    def _rearm(self, conn: AttachConn) -> None:
        """The loop handled what a turn handed it: the reactor reads ``conn`` again (not at back-pressure)."""
        with conn.lock:
            if conn.dropped or conn.session.closed:
                return
            if conn.in_flight >= MAX_TRANSFERS_IN_FLIGHT:
                conn.paused = True
                return
            conn.armed = True
            self._reactor.rearm(conn.fd)

    def _close(self, conn: AttachConn) -> None:
        """Under ``conn.lock``, no turn running and no event of it outstanding (the reactor's rule: closed by the
        turn of its last event, or while it is not in the epoll): the reactor forgets the socket and it closes."""
        if conn.sock.fileno() >= 0:
            self._reactor.remove(conn.fd)
            conn.sock.close()

    def _release(self, conn: AttachConn) -> bool:
        """The loop lets ``conn`` go (``_drop``; False: gone already). Out of the epoll (paused, or a datagram at
        the loop) it is closed here; in it, it is shut down -- the worker sees its end at once -- and the turn its
        shutdown wakes closes it; a turn that runs closes it as it ends."""
        with conn.lock:
            if conn.dropped:
                return False
            conn.dropped = True
            if conn.writing:   # no writer of a socket that closes (``_wait_writable`` sees ``dropped``)
                conn.writing = False
                assert self._loop is not None
                self._loop.remove_writer(conn.fd)
            if conn.turning:
                pass
            elif conn.armed:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            else:
                self._close(conn)
        return True

    def _resume(self, conn: AttachConn) -> None:
        """Under ``conn.lock``, a transfer of ``conn`` answered (any thread: ``in_flight`` one fewer) while
        back-pressure held its reading (``paused``; checked by the caller: no call per reply, bench scenario 12):
        reading resumes."""
        if not conn.dropped:
            conn.paused = False
            conn.armed = True
            self._reactor.rearm(conn.fd)

    def _answer(self, conn: AttachConn, data: bytes, transfer: bool) -> None:
        """Send the reply datagram ``data`` to ``conn``'s worker, from any thread (``transfer``: a transfer's reply,
        counted in flight until it is sent). At once when the socket takes it and no earlier reply waits; else it
        waits in the outbox for the loop (``_flush``). A socket that failed is dropped by the loop."""
        gone = False
        with conn.lock:
            if conn.dropped:
                return
            if not conn.outbox:
                try:
                    conn.sock.send(data)
                except BlockingIOError:   # full: the worker reads slower than its transfers end
                    pass
                except OSError:           # gone (EPIPE, ECONNRESET): its turn sees the end too
                    gone = True
                else:
                    if transfer:   # one fewer in flight; reading resumes if back-pressure held it
                        conn.in_flight -= 1
                        if conn.paused:
                            self._resume(conn)
                    return
            if not gone:
                conn.outbox.append((data, transfer))
                if conn.writing:
                    return
                conn.writing = True
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._drop if gone else self._wait_writable, conn)
        except RuntimeError:   # the loop is closed: the daemon is stopping
            pass

    def _wait_writable(self, conn: AttachConn) -> None:
        """The loop: send ``conn``'s outbox as its socket drains."""
        assert self._loop is not None
        with conn.lock:
            if conn.dropped or not conn.writing:
                conn.writing = False
                return
        self._loop.add_writer(conn.fd, self._flush, conn)

    def _flush(self, conn: AttachConn) -> None:
        """The loop, ``conn``'s socket writable (or failed): the outbox's replies in order, until it would block."""
        assert self._loop is not None
        gone = False
        with conn.lock:
            while conn.outbox and not conn.dropped:
                data, transfer = conn.outbox[0]
                try:
                    conn.sock.send(data)
                except BlockingIOError:
                    return                # still full: the writer stays
                except OSError:
                    gone = True
                    break
                conn.outbox.popleft()
                if transfer:
                    conn.in_flight -= 1
                    if conn.paused:
                        self._resume(conn)
            conn.writing = False
        self._loop.remove_writer(conn.fd)
        if gone:
            self._drop(conn)

    # ---- a fast transfer's end (``links.fast.FastReply``) --------------------------------------

    def ended_here(self, token: tuple[AttachConn, int, str], nbytes: int, transport: str) -> None:
        """A fast pull or push succeeded, on the data reader thread that read the owner's reply: the worker
        answered from here (``_answer``: a datagram is sent whole or not at all; the outbox when the socket is
        full)."""
        conn, rid, _ = token
        self._answer(conn, REPLY.pack(MAGIC, rid, 0, nbytes, transport.encode()[:16]), True)
