"""``TcpListener``: the data plane's listening socket -- accept, admission, the hello of each connection.

Each accepted socket is admitted (``admission.Admission``: caps per address and in all before
authentication), gets its own thread, and must send the hello (magic, version, token, stream index) by
its pre-auth deadline; a good token makes it a connection of its token's inbound channel (the
transport's table, ``ListenerOwner``) and that thread becomes its reader. Refusals are rate-limited
warnings naming the remote address, never the token.
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import threading
import time
from typing import Any, Callable, Protocol

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...guard.admission import Admission, AdmissionLimits, Ticket
from .channel import TcpChannel
from .conn import DataConn
from .wire import (
    _POLL,
    HELLO,
    HELLO_MAGIC,
    MAX_STREAMS,
    MAX_TOKEN,
    PROTOCOL_VERSION,
    _configure,
    _recv_exact,
)

log = logging.getLogger("datadistd.transport.tcp")


class ListenerOwner(Protocol):
    """What the listener needs of its transport (``TcpTransport``), declared here so that this module names
    nothing above it."""

    _stopping: bool

    @property
    def endpoint(self) -> str: ...

    def _spawn(self, target: Callable[..., Any], name: str, *args: object) -> None:
        """Run ``target(*args)`` in a thread the transport joins at ``stop``."""

    def _match(self, token: bytes) -> bytes | None:
        """The allowed token equal to ``token`` (compared in constant time), or ``None``."""

    def _inbound_channel(self, token: bytes, peer: str) -> TcpChannel | None:
        """The inbound channel of an allowed ``token`` (made on its first connection); ``None`` once the
        token was revoked or the transport is stopping."""


class TcpListener:
    """The listening socket of one ``TcpTransport`` and the threads that read each newcomer's hello."""

    def __init__(self, owner: ListenerOwner, lock: threading.Lock, host: str, port: int,
                 ports: tuple[int, int] | None, connect_timeout: float, nodelay: bool, sndbuf: int | None,
                 rcvbuf: int | None, admission: AdmissionLimits) -> None:
        self._owner = owner
        self._lock = lock                  # the transport's: guards the hello sockets with its tables
        self.host = host
        self.port = port
        self.ports = ports
        self.connect_timeout = connect_timeout
        self.nodelay = nodelay
        self.sndbuf = sndbuf
        self.rcvbuf = rcvbuf
        self.admission_limits = admission
        self._admission: Admission | None = None      # made at start(): caps on who holds the listener
        self._listener: socket.socket | None = None
        self._hellos: set[socket.socket] = set()

    def bind(self) -> int:
        """Bind and listen; returns the port."""
        self._listener = self._bind()
        self.port = self._listener.getsockname()[1]
        return self.port

    def start(self) -> None:
        """Admit connections (after ``bind``, once the transport's endpoint is known)."""
        self._admission = Admission(f"tcp data plane {self._owner.endpoint}", self.admission_limits, log)
        self._owner._spawn(self._accept_loop, f"datadist-tcp-accept:{self.port}")

    def shut_hellos(self) -> None:
        """Wake every thread still reading a hello (stopping)."""
        with self._lock:
            hellos = list(self._hellos)
        for sock in hellos:
            _shut(sock)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def admission_stats(self) -> dict[str, int]:
        """The books of the listener's admission (``admission.Admitting``)."""
        if self._admission is None:
            return {}
        return self._admission.stats()

    def _bind(self) -> socket.socket:
        """The data-plane listener on ``host``: at ``port``, or the first free port of ``ports``."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        candidates = range(self.ports[0], self.ports[1] + 1) if self.ports else (self.port,)
        for port in candidates:   # bounded: at most the range's size
            listener = socket.socket(family, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.rcvbuf:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
                listener.bind((self.host, port))
                listener.listen(128)
                listener.settimeout(_POLL)
                return listener
            except OSError as exc:
                listener.close()
                if self.ports and exc.errno == errno.EADDRINUSE:
                    continue
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                    f"cannot listen for data connections on {self.host}:{port}: {exc}") from None
        assert self.ports is not None
        raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                            f"cannot listen for data connections on {self.host}: every port of [transport] data_ports "
                            f"{self.ports[0]}-{self.ports[1]} is in use (one per engine listening on this address)")

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._owner._stopping:  # ends at stop(); each pass waits at most _POLL
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._owner._stopping:
                    break
                self._refuse("-", f"accept failed: {exc}")   # EMFILE and the like: rate-limited
                time.sleep(_POLL)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            assert self._admission is not None
            self._admission.expire()   # the deadline of a silent hello is its own recv timeout; this is the sweep
            ticket = None if self._owner._stopping else self._admission.admit(addr[0], functools.partial(_shut, sock))
            if ticket is None:
                sock.close()
                continue
            with self._lock:
                self._hellos.add(sock)
            self._owner._spawn(self._serve, f"datadist-tcp-read:{peer}", sock, peer, ticket)

    def _serve(self, sock: socket.socket, peer: str, ticket: Ticket) -> None:
        """Hello, then this thread becomes the connection's reader."""
        assert self._admission is not None
        conn: DataConn | None = None
        try:
            conn = self._hello(sock, peer, ticket)
        except Exception:  # noqa: BLE001
            log.exception("tcp data plane %s: handshake with %s failed", self._owner.endpoint, peer)
        finally:
            with self._lock:
                self._hellos.discard(sock)
        try:
            if conn is None:
                sock.close()
                return
            conn.run()
        finally:
            self._admission.release(ticket)

    def _refuse(self, peer: str, why: str) -> None:
        """A rate-limited warning naming the remote address (never the token); quiet while stopping."""
        if not self._owner._stopping and self._admission is not None:
            self._admission.refusals(f"{peer}: {why}")

    def _hello(self, sock: socket.socket, peer: str, ticket: Ticket) -> DataConn | None:
        """Check the hello (by the ticket's pre-auth deadline); on success register the socket with its
        channel and acknowledge it."""
        assert self._admission is not None
        deadline = min(ticket.deadline, time.monotonic() + self.connect_timeout)
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
            self._admission.timed_out(ticket)
            self._refuse(peer, f"no hello within {min(self.connect_timeout, self.admission_limits.preauth_seconds):g}s")
            return None
        except OSError as exc:
            self._refuse(peer, str(exc))
            return None
        if token is None:
            self._refuse(peer, "closed during the hello")
            return None
        match = self._owner._match(token)
        if match is None:
            self._refuse(peer, "token not accepted")
            return None
        self._admission.authenticate(ticket)
        if not ticket.authenticated:   # closed to make room just now
            return None
        channel = self._owner._inbound_channel(match, peer)
        if channel is None:
            return None
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


def _shut(sock: socket.socket) -> None:
    """How admission ends a pre-auth connection: wake its reader (it then closes the socket)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
