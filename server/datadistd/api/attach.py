"""The attach socket: kernel-verified worker identity and memory by file descriptor.

A unix ``SOCK_SEQPACKET`` socket beside the gRPC worker socket (``<worker socket>.attach``, same
mode). gRPC's Python server can neither read a unix peer's credentials nor carry descriptors,
so this small protocol does the two things only the kernel can vouch for (``attach.proto``):

* on accept, ``SO_PEERCRED`` gives the caller's pid/uid/gid (``SO_PEERPIDFD`` a pidfd where the
  kernel has it); the first message (``hello``) is answered with a fresh capability bound to this
  connection, which every DataDist call then carries as metadata;
* ``import_memory`` takes memory as descriptors (``SCM_RIGHTS``) and answers a memory id the
  worker names in ``RegisterCache``/``SwapBlocks``; ``export_pool`` hands the worker the memfd of a
  pool of one of *its own* engines;
* pulls and pushes of one of the session's engines without a gRPC call, the local hot path: binary
  frames (``datadist.fastframe``: a fixed layout decoded straight into a ``TransferOrder``, answered
  with a fixed-layout reply; block lists past one datagram in continuation frames, assembled here
  within bounds: ``MAX_TRANSFER_BLOCKS``, one transfer at a time per connection, ``ASSEMBLY_DEADLINE_S``, the
  numbers booked to the uid's quota and the engine's owner checked at the first frame),
  started on the engine's one transfer path (``LinkManager.transfer``) as an order by
  ``api.transfers.start_transfer`` (the entry the gRPC Pull/Push share). Replies go out in completion order,
  matched by request id, from whichever thread ends the transfer, so a worker may have many in flight (at most
  ``MAX_TRANSFERS_IN_FLIGHT``: then the connection is not read until one ends). A small ``pull_blocks`` or
  ``push_blocks`` by ``BlocksCacheKey`` skips the order: its ints go to the same path from the reactor thread that
  read the frame (the quick shape, ``links.transfer``), and the data reader thread that reads the owner's reply
  answers the worker (``ended``); ``fast_pulls=False`` sends every transfer as an order.

The connection is the lease: when it closes, the session's engines are finalized and its
imported memory is closed. Connections are read by the process's TCP reactor threads (below, "Reading the
connections": no thread per connection, the event loop off a small pull's path); everything but a quick transfer's
start and end is handed to the daemon's event loop, in order, and handled there; accepting runs on the loop. Each
message is one datagram of at most ``MAX_MESSAGE`` bytes with at most ``MAX_PIECES`` descriptors, so a caller cannot
make the daemon buffer more.

Reading the connections
-----------------------

Reading a worker's attach connection on the process's TCP reactor threads, not on the event loop.

Each connection is registered with the reactor (``transport.tcp.reactor``: one epoll, a small pool of threads,
one-shot registration), so a connection adds no thread (a local user may open thousands) and a worker's datagram
wakes one pool thread, not the loop. That thread's turn (``AttachServer._turn``) reads what the worker queued and
starts a small ``pull_blocks`` or ``push_blocks`` by ``BlocksCacheKey`` right there (``_fast``: the engine's one
transfer path, ``LinkManager.transfer``, in its quick shape); the data reader thread that reads the owner's reply
answers the worker (``ended``). Anything else -- hello, memory, continuation frames, any other transfer, a quick
one the path declined off the loop, the connection's end -- is handed to the loop (``call_soon_threadsafe``),
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
import errno
import functools
import logging
import os
import socket
import struct
import threading

from datadist.fastframe import (
    KEY_BLOCKS,
    KIND_BLOCKS,
    KIND_EXTENTS,
    MAGIC,
    MAX_DATAGRAM,
    PULL,
    PUSH,
    REPLY,
    REQUEST,
    FrameError,
    Partial,
    TransferFrame,
    decode_request,
    encode_reply,
    is_continuation,
    request_id_of,
)
from datadist.v1 import attach_pb2

from ..core.errors import DataDistError, StatusCode, require
from ..engine.extents import FEW
from ..guard.admission import RefusalLog
from ..guard.quota import Charge
from ..guard.sockfiles import OwnedSocket
from ..links.transfer import QUICK_BLOCKS
from ..memory.base import MAX_PIECES
from ..memory.handover import discard
from ..node.node import EngineSlot, Node
from ..node.sessions import PeerCred, WorkerSession
from ..ops.metrics import DaemonMetrics, count_error
from ..transport.tcp.reactor import Reactor, reactor
from .attachmsgs import PROTOCOL_VERSION, handle
from .orders import MAX_LIST, order_from_frame
from .transfers import start_transfer

__all__ = ["AttachServer", "attach_path", "PROTOCOL_VERSION", "MAX_MESSAGE", "MAX_TRANSFER_BLOCKS",
           "ASSEMBLY_DEADLINE_S", "read_peer_cred", "FAST_PULL_BLOCKS", "MAX_TRANSFERS_IN_FLIGHT", "AttachConn",
           "fds_of"]

log = logging.getLogger(__name__)

#: block numbers one transfer's frames may announce: each list at most ``MAX_LIST`` (what ``order_from_frame`` and
#: the gRPC Pull/Push accept), so at most 16 MiB assembled per connection, and per uid what its
#: ``[quota] assembly_bytes_per_uid`` allows (booked at the first frame)
MAX_TRANSFER_BLOCKS = 2 * MAX_LIST
#: a transfer's continuation frames come back to back: its last one is in within this of its first (the clock
#: stands while back-pressure keeps the daemon from reading), or the transfer is refused and its memory freed
ASSEMBLY_DEADLINE_S = 10.0
MAX_MESSAGE = MAX_DATAGRAM
_MAGIC_BYTE = bytes([MAGIC])
_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)   # Linux >= 6.5
_LOG_EVERY_S = 10.0
_CONTINUE_BYTE = 3


#: transfers one connection may have in flight (more wait in the worker's socket buffer)
MAX_TRANSFERS_IN_FLIGHT = 256
#: the most block numbers a fast pull or push names (its bytes are bounded too: ``ownercalls.INLINE_READ_MAX``)
FAST_PULL_BLOCKS = QUICK_BLOCKS
#: datagrams one turn reads at most (the connection goes back to the epoll in between: others get their turn)
_DRAIN = 64
#: a pull or push frame's flags the fast path takes (timeout_ms only: no layer range, offset, exclusive or continuation)
_FAST_FLAGS = 4
TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)   # an int: ``&`` on IntFlag members costs an enum call
#: room for the descriptors one message may carry (``recvmsg``'s ancillary buffer)
_ANCILLARY = socket.CMSG_LEN(MAX_PIECES * 4)
#: a datagram a turn hands the loop: bytes, ancillary data, flags
_Datagram = tuple[bytes, list[tuple[int, int, bytes]], int]


def fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of a message's ancillary data (what ``socket.recv_fds`` returns)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4]))
    return fds


class AttachConn:
    __slots__ = ("sock", "fd", "session", "greeted", "in_flight", "partial", "assembly", "deadline", "skip",
                 "lock", "armed", "turning", "paused", "dropped", "outbox", "writing")

    def __init__(self, sock: socket.socket, session: WorkerSession) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.session = session
        self.greeted = False
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


def attach_path(worker_socket: str) -> str:
    """Where the attach socket of the daemon serving ``worker_socket`` lives."""
    return worker_socket + ".attach"


def read_peer_cred(sock: socket.socket) -> PeerCred:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return PeerCred(pid, uid, gid)


def _peer_pidfd(sock: socket.socket) -> int | None:
    try:
        return struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD, 4))[0]
    except OSError:  # older kernel: the connection itself still ties the session to the process
        return None


class AttachServer:
    def __init__(self, node: Node, path: str, mode: int = 0o660, metrics: DaemonMetrics | None = None,
                 assembly_deadline_s: float = ASSEMBLY_DEADLINE_S, fast_pulls: bool = True,
                 reader: Reactor | None = None) -> None:
        """``reader``: the reactor whose threads read the connections (default: the process's, ``reactor()``)."""
        self.node = node
        self._reactor = reader if reader is not None else reactor()
        #: a small pull_blocks or push_blocks starts in the quick shape from the reactor thread that read it (False:
        #: every transfer is started as an order, on the loop)
        self.fast_pulls = fast_pulls
        self.assembly_deadline_s = assembly_deadline_s
        self.path = path
        self.mode = mode
        self.metrics = metrics
        self._sock: socket.socket | None = None
        self._owned: OwnedSocket | None = None
        self._conns: dict[int, AttachConn] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refusals = RefusalLog(log, "attach socket: connection refused", _LOG_EVERY_S)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.path)  # the caller claimed the path (sockfiles.claim): a file there fails the bind
            self._owned = OwnedSocket.bound(self.path)
            os.chmod(self.path, self.mode)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._accept)

    async def stop(self) -> None:
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for conn in list(self._conns.values()):
            self._drop(conn, finalize=False)
        if self._owned is not None:
            self._owned.remove()
            self._owned = None

    # ---- connections ---------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._sock is not None and self._loop is not None
        for _ in range(64):  # bounded per wake-up; the reader fires again while more are queued
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: refuse quietly, say so in the log at a bounded rate
                self._refuse(f"accept failed: {os.strerror(exc.errno or 0)}")
                return
            sock.setblocking(False)
            try:
                cred = read_peer_cred(sock)
                session = self.node.sessions.open(cred, _peer_pidfd(sock))
            except (OSError, DataDistError) as exc:
                self._refuse(str(exc))
                sock.close()
                continue
            conn = AttachConn(sock, session)
            self._conns[conn.fd] = conn
            self._watch(conn)
            log.debug("worker attached: pid %s uid %s gid %s (session %s)", cred.pid, cred.uid, cred.gid,
                      session.session_id)

    def _refuse(self, why: str) -> None:
        self._refusals(why)

    def _drop(self, conn: AttachConn, finalize: bool = True) -> None:
        assert self._loop is not None
        if not self._release(conn):   # closed here, or by the reactor thread reading it as its turn ends
            return
        self._end_assembly(conn)
        self._conns.pop(conn.fd, None)
        session = conn.session
        self.node.sessions.close(session)
        if finalize and session.engines:
            self._loop.create_task(self.node.end_session(session))

    def _general(self, conn: AttachConn, data: bytes, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        """A datagram of ``conn`` the quick shape did not take, on the loop (the module doc, "Reading the
        connections"): a frame, a continuation frame, a protobuf message, or the connection's end."""
        fds = fds_of(ancillary) if ancillary else []
        if not data and not fds:
            self._drop(conn)  # the worker closed the connection (or died)
            return
        frame = data[:1] == _MAGIC_BYTE
        continuation = frame and len(data) >= 2 and data[1] == _CONTINUE_BYTE
        if conn.partial is not None and not continuation:
            self._refuse_assembly(conn, "another message came between the frames of one transfer")
            if conn.session.closed:
                discard(fds)
                return
        elif conn.skip is not None and not continuation:
            conn.skip = None
        if frame:
            self._on_frame(conn, data, fds, flags)
        else:
            self._on_message(conn, data, fds, flags)

    # ---- a quick-shape transfer's end (``links.transfer.Ends``) -----------------------------------------------

    def ended(self, token: tuple[AttachConn, int, str], status: int, nbytes: int, transport: str,
              message: str) -> None:
        """A quick-shape pull or push ended, on any thread: the worker answered (a failure counted as
        ``start_transfer`` counts one)."""
        conn, rid, method = token
        if status:
            count_error(self.metrics, method, StatusCode(status))
            self._answer(conn, encode_reply(rid, status, nbytes, transport, message), True)
            return
        self._answer(conn, REPLY.pack(MAGIC, rid, 0, nbytes, transport.encode()[:16]), True)

    def _on_frame(self, conn: AttachConn, data: bytes, fds: list[int], flags: int) -> None:
        """A binary pull/push, or a continuation frame: decoded straight into a ``TransferOrder``, no protobuf."""
        try:
            require(not flags & TRUNCATED, f"an attach message is at most {MAX_DATAGRAM} bytes with at most "
                                            f"{MAX_PIECES} descriptors")
            require(not fds, "a transfer carries no descriptors")
            if is_continuation(data):
                self._on_continuation(conn, data)
                return
            rid, got = decode_request(data)
        except FrameError as exc:
            if exc.request_id is None:   # names no request to answer: the sender is not speaking the protocol
                self._refuse(f"pid {conn.session.cred.pid} dropped: {exc}")
                self._drop(conn)
                return
            self._send(conn, encode_reply(exc.request_id, int(StatusCode.LLM_PARAM_INVALID), message=str(exc)))
            return
        except DataDistError as exc:
            rid = request_id_of(data)
            partial = conn.partial
            if partial is not None:      # a continuation frame that cannot be one: the transfer is refused
                self._refuse_assembly(conn, exc.message)
            if rid is None:
                self._drop(conn)
            elif partial is None or rid != partial.request_id:
                self._send(conn, encode_reply(rid, int(exc.code), message=exc.message))
            return
        finally:
            discard(fds)
        if not conn.greeted:
            conn.skip = rid
            self._send(conn, encode_reply(rid, int(StatusCode.LLM_PARAM_INVALID),
                                          message="the first attach message must be hello"))
            return
        if isinstance(got, Partial):
            self._assemble(conn, got)
        else:
            self._transfer(conn, rid, got)

    # ---- transfers in continuation frames ------------------------------------------------------

    def _assemble(self, conn: AttachConn, partial: Partial) -> None:
        """The first frame of a transfer whose block numbers continue: bounded, its engine's owner checked (the
        refusal ``start_transfer`` gives a whole frame) and its numbers booked to the caller's uid
        (``[quota] assembly_bytes_per_uid``) before any continuation is taken; a refusal is answered now and the
        rest of the transfer's frames are dropped."""
        assert self._loop is not None
        n_local = partial.total - partial.n_remote
        try:
            require(partial.n_remote <= MAX_LIST and n_local <= MAX_LIST,
                    f"a transfer of {partial.n_remote} remote and {n_local} local blocks: at most {MAX_LIST} each per "
                    "call")
            self.node.owned_slot(conn.session, partial.head.engine_id)
            charge = self.node.quota.take(conn.session.cred.uid, assembly_bytes=8 * partial.total)
        except DataDistError as exc:
            conn.skip = partial.request_id
            count_error(self.metrics, "Push" if partial.head.op == PUSH else "Pull", exc.code)
            self._send(conn, encode_reply(partial.request_id, int(exc.code), message=exc.message))
            return
        conn.partial = partial
        conn.assembly = charge
        conn.deadline = self._loop.call_later(self.assembly_deadline_s, self._assembly_late, conn, partial)

    def _on_continuation(self, conn: AttachConn, data: bytes) -> None:
        rid = request_id_of(data)
        if rid is None:
            raise FrameError(f"a continuation frame is at least 16 bytes, got {len(data)}")
        partial = conn.partial
        if partial is None:
            if rid != conn.skip:
                raise FrameError("a continuation frame of no transfer being assembled on this connection", rid)
            return                   # the rest of a transfer refused already (answered once)
        try:
            partial.add(data)
        except FrameError as exc:
            self._refuse_assembly(conn, str(exc))
            if rid != partial.request_id:
                raise
            return
        if not partial.missing:
            self._end_assembly(conn)
            self._transfer(conn, partial.request_id, partial.frame())

    def _assembly_late(self, conn: AttachConn, partial: Partial) -> None:
        if conn.partial is not partial:
            return
        assert self._loop is not None
        if conn.paused:              # the daemon is not reading: not the worker's delay
            conn.deadline = self._loop.call_later(self.assembly_deadline_s, self._assembly_late, conn, partial)
            return
        self._refuse_assembly(conn, f"the continuation frames of the transfer did not all come within "
                                    f"{self.assembly_deadline_s:g} s ({partial.missing} of {partial.total} block "
                                    "numbers missing)")

    def _refuse_assembly(self, conn: AttachConn, why: str) -> None:
        """The transfer being assembled is answered LLM_PARAM_INVALID; the rest of its frames are dropped."""
        partial = conn.partial
        assert partial is not None
        self._end_assembly(conn)
        conn.skip = partial.request_id
        self._send(conn, encode_reply(partial.request_id, int(StatusCode.LLM_PARAM_INVALID), message=why))

    def _end_assembly(self, conn: AttachConn) -> None:
        """No transfer being assembled any more (whole, refused, or the connection went): its booking given back."""
        conn.partial = None
        if conn.assembly is not None:
            conn.assembly.release()
            conn.assembly = None
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None

    def _on_message(self, conn: AttachConn, data: bytes, fds: list[int], flags: int) -> None:
        """A protobuf ``AttachRequest``: hello, memory, pools (``attachmsgs.handle``)."""
        request = attach_pb2.AttachRequest()
        try:
            require(not flags & TRUNCATED,
                    f"an attach message is at most {MAX_DATAGRAM} bytes with at most {MAX_PIECES} descriptors")
            try:
                request.ParseFromString(data)
            except Exception:  # noqa: BLE001 - any malformed message gets the same answer
                raise DataDistError(StatusCode.LLM_PARAM_INVALID, "malformed attach message") from None
            reply, out_fd = handle(self.node, conn, request, fds)
            fds = []  # handed on: the handlers own (and close) them
        except DataDistError as exc:
            reply, out_fd = attach_pb2.AttachReply(status=int(exc.code), message=exc.message), None
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the worker gets an answer, the log the trace
            log.exception("attach message from pid %s failed", conn.session.cred.pid)
            reply, out_fd = attach_pb2.AttachReply(status=int(StatusCode.LLM_FAILED), message=str(exc)), None
        finally:
            discard(fds)     # never closed on the loop: a handed-over socket with SO_LINGER would block it
        reply.request_id = request.request_id
        self._reply(conn, reply, out_fd)

    def _reply(self, conn: AttachConn, reply: attach_pb2.AttachReply, out_fd: int | None = None) -> None:
        self._send(conn, reply.SerializeToString(), out_fd)

    def _send(self, conn: AttachConn, data: bytes, out_fd: int | None = None) -> None:
        """A reply that ends no transfer (the loop): through the outbox like any (``_answer``); one carrying a
        descriptor is sent at once -- its caller waits for it alone -- and a socket that cannot take it is dropped."""
        if conn.session.closed:
            return
        if out_fd is None:
            self._answer(conn, data, False)
            return
        try:
            socket.send_fds(conn.sock, [data], [out_fd])
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EPIPE, errno.ECONNRESET):
                log.warning("attach reply to pid %s failed: %s", conn.session.cred.pid, os.strerror(exc.errno or 0))
            self._drop(conn)

    # ---- transfers -----------------------------------------------------------------------------

    def _transfer(self, conn: AttachConn, rid: int, frame: TransferFrame) -> None:
        """One pull or push of ``conn`` (``start_transfer``), answered with a reply frame when it ended (nothing when
        the connection went first)."""
        with conn.lock:
            conn.in_flight += 1

        def done(status: int, nbytes: int, transport: str, why: str) -> None:
            self._answer(conn, encode_reply(rid, status, nbytes, transport, why), True)

        start_transfer(self.node, conn.session, frame.engine_id, lambda: order_from_frame(frame),
                       push=frame.op == PUSH, done=done, metrics=self.metrics,
                       method="TransferExtents" if frame.kind == KIND_EXTENTS else "")

    # ---- reading the connections on the reactor (the module doc: "Reading the connections") -------------

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
                if not (fast and not ancillary and self._fast(conn, data, flags, False)):
                    item = (data, ancillary, flags)   # the connection's end too (an empty datagram)
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

    def _fast(self, conn: AttachConn, data: bytes, flags: int, on_loop: bool) -> bool:
        """``data`` started in the quick shape (``LinkManager.transfer``): a pull or push frame of one of the
        session's engines by ``BlocksCacheKey``, whole tensors, at most ``FAST_PULL_BLOCKS`` blocks, on a greeted
        connection assembling nothing. False, nothing done: not such a frame, or the path declined it -- the loop
        starts it as an order, which gives its answer."""
        if (len(data) > REQUEST.size and data[0] == MAGIC and (data[1] == PULL or data[1] == PUSH)
                and not flags & TRUNCATED and conn.partial is None and conn.greeted):
            (_, _, kind, key_kind, fl, rid, engine_id, cache_id, cluster, model_id, b, c, _, _, _, _, _, _, _,
             timeout_ms, _, _, nr, nl) = REQUEST.unpack_from(data)
            slot = self.node.engines.get(engine_id)
            session = conn.session
            if (kind == KIND_EXTENTS and data[1] == PULL and not key_kind and not fl & ~_FAST_FLAGS and not model_id
                    and not b and not c and not cache_id and not nl and nr <= 3 * FEW
                    and len(data) == REQUEST.size + 8 * nr and slot is not None and slot.session is session
                    and not session.closed):
                return self._fast_extents(conn, slot, rid, cluster, timeout_ms if fl else 0,
                                          struct.unpack_from(f"<{nr}Q", data, REQUEST.size), on_loop)
            if (kind == KIND_BLOCKS and key_kind == KEY_BLOCKS and not fl & ~_FAST_FLAGS and not b and not c
                    and nr == nl and nr <= FAST_PULL_BLOCKS and len(data) == REQUEST.size + 16 * nr
                    and slot is not None and slot.session is session and not session.closed):
                end = REQUEST.size + 8 * nr
                push = data[1] == PUSH
                with conn.lock:   # its reply may come before ``transfer`` returns
                    conn.in_flight += 1
                if slot.links.transfer(push, cluster, cache_id, timeout_ms if fl else 0, self,
                                       (conn, rid, "Push" if push else "Pull"), model_id=model_id,
                                       remote=data[REQUEST.size:end], local=struct.unpack_from(f"<{nl}Q", data, end),
                                       on_loop=on_loop):
                    if conn.skip is not None:   # a non-continuation frame: a refused transfer's rest is over
                        conn.skip = None
                    return True
                with conn.lock:   # not paused: a turn runs, or the loop holds the connection
                    conn.in_flight -= 1
        return False

    def _fast_extents(self, conn: AttachConn, slot: EngineSlot, rid: int, cluster: int, timeout_ms: int,
                      numbers: tuple[int, ...], on_loop: bool) -> bool:
        """A small READ of HIXL's extents started in the quick shape (``Transfers._quick_extents``), as ``_fast``
        starts a small pull; False, nothing done, when the path declined it."""
        with conn.lock:
            conn.in_flight += 1
        if slot.links.transfer(False, cluster, -1, timeout_ms, self, (conn, rid, "TransferExtents"), extents=numbers,
                               on_loop=on_loop):
            if conn.skip is not None:
                conn.skip = None
            return True
        with conn.lock:
            conn.in_flight -= 1
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
        data, ancillary, flags = item
        try:
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
