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
  started by ``api.transfers.start_transfer`` (the one entry the gRPC Pull/Push share). Replies go out
  in completion order, matched by request id, so a worker may have many in flight (at most
  ``MAX_TRANSFERS_IN_FLIGHT``: then the connection is not read until one ends). A small ``pull_blocks`` or
  ``push_blocks`` by ``BlocksCacheKey`` skips the order: its ints go to ``links.fast.FastTransfers.start`` from the
  reactor thread that read the frame, and the data reader thread that reads the owner's reply answers the worker
  (``ended_here``; ``ended`` on the loop for anything else); ``fast_pulls=False`` sends every transfer the general
  way.

The connection is the lease: when it closes, the session's engines are finalized and its
imported memory is closed. Connections are read by the process's TCP reactor threads (``api.attachread``: no
thread per connection, the event loop off a small pull's path); everything but a fast transfer's start and end is
handed to the daemon's event loop, in order, and handled there (this module); accepting runs on the loop. Each
message is one datagram of at most ``MAX_MESSAGE`` bytes with at most ``MAX_PIECES`` descriptors, so a caller cannot
make the daemon buffer more.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct

from datadist.fastframe import (
    MAGIC,
    MAX_DATAGRAM,
    PUSH,
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
from ..guard.admission import RefusalLog
from ..guard.sockfiles import OwnedSocket
from ..memory.base import MAX_PIECES
from ..memory.handover import discard
from ..node.node import Node
from ..node.sessions import PeerCred
from ..state.metrics import DaemonMetrics, count_error
from ..transport.tcp.reactor import Reactor, reactor
from .attachmsgs import PROTOCOL_VERSION, handle
from .attachread import FAST_PULL_BLOCKS, MAX_TRANSFERS_IN_FLIGHT, TRUNCATED, AttachConn, ConnReading, fds_of
from .orders import MAX_LIST, order_from_frame
from .transfers import start_transfer

__all__ = ["AttachServer", "attach_path", "PROTOCOL_VERSION", "MAX_MESSAGE", "MAX_TRANSFER_BLOCKS",
           "ASSEMBLY_DEADLINE_S", "read_peer_cred", "FAST_PULL_BLOCKS", "MAX_TRANSFERS_IN_FLIGHT"]

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


class AttachServer(ConnReading):
    def __init__(self, node: Node, path: str, mode: int = 0o660, metrics: DaemonMetrics | None = None,
                 assembly_deadline_s: float = ASSEMBLY_DEADLINE_S, fast_pulls: bool = True,
                 reader: Reactor | None = None) -> None:
        """``reader``: the reactor whose threads read the connections (default: the process's, ``reactor()``)."""
        self.node = node
        self._reactor = reader if reader is not None else reactor()
        #: a small pull_blocks or push_blocks goes ``FastTransfers.start`` first (False: every transfer takes the
        #: general path)
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
        for task in conn.tasks:
            task.cancel()
        self._conns.pop(conn.fd, None)
        session = conn.session
        self.node.sessions.close(session)
        if finalize and session.engines:
            self._loop.create_task(self.node.end_session(session))

    def _general(self, conn: AttachConn, data: bytes, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        """A datagram of ``conn`` the fast path did not take, on the loop (``attachread``): a frame, a continuation
        frame, a protobuf message, or the connection's end."""
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

    # ---- a fast transfer's end on the loop (``links.fast.FastReply``; ``ended_here``: ``attachread``) ----------

    def ended(self, token: tuple[AttachConn, int, str], status: int, nbytes: int, transport: str,
              message: str) -> None:
        """A fast pull or push ended on the event loop (a failure: counted as ``start_transfer`` counts one)."""
        conn, rid, method = token
        if status:
            count_error(self.metrics, method, StatusCode(status))
        self._answer(conn, encode_reply(rid, status, nbytes, transport, message), True)

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

        task = start_transfer(self.node, conn.session, frame.engine_id, lambda: order_from_frame(frame),
                              push=frame.op == PUSH, done=done, metrics=self.metrics)
        if task is not None and not task.done():
            conn.tasks.add(task)
            task.add_done_callback(conn.tasks.discard)   # cancelled (the connection went): no answer, forgotten
