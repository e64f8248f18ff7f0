"""``TcpListener``: the data plane's listening socket -- accept, admission, the hello of each connection.

Each accepted socket is admitted (``admission.Admission``: caps per address and in all before
authentication) and must send the hello (magic, version, token, stream index) by its pre-auth deadline; the
process's reader threads (``reactor``) read it as its bytes come -- no thread of its own, so a stranger holds
none -- and the accept loop closes it at its deadline. Nothing of the accept loop is periodic: its thread sleeps
in ``accept`` until a newcomer or the next such deadline, and ``stop_accepting`` wakes it. A good token makes it a
connection of its token's inbound channel (the transport's table, ``ListenerOwner``), read from then on by one
thread of the same pool (``Reactor.switch``).
Refusals are rate-limited warnings naming the remote address, never the token.
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
from .reactor import reactor
from .wire import (
    _DONTWAIT,
    _POLL,
    HELLO,
    HELLO_MAGIC,
    MAX_STREAMS,
    MAX_TOKEN,
    PROTOCOL_VERSION,
    _configure,
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
        self._hellos: dict[socket.socket, _Hello] = {}     # pre-auth sockets, read by the reactor
        self._reactor = reactor()

    def bind(self) -> int:
        """Bind and listen; returns the port."""
        self._listener = self._bind()
        self.port = self._listener.getsockname()[1]
        return self.port

    def start(self) -> None:
        """Admit connections (after ``bind``, once the transport's endpoint is known)."""
        self._admission = Admission(f"tcp data plane {self._owner.endpoint}", self.admission_limits, log)
        self._owner._spawn(self._accept_loop, f"datadist-tcp-accept:{self.port}")

    def stop_accepting(self) -> None:
        """Wake the accept loop, which may be blocked in ``accept`` with no deadline to keep (stopping: it ends)."""
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RD)   # Linux: a blocked accept returns EINVAL
            except OSError:
                pass

    def shut_hellos(self) -> None:
        """End every hello still being read (stopping)."""
        with self._lock:
            hellos = list(self._hellos)
        for sock in hellos:
            _shut(sock)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def _release(self, ticket: Ticket) -> None:
        """A connection of this listener ended, in its hello or after it: its admission ticket goes back."""
        if self._admission is not None:
            self._admission.release(ticket)

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
                return listener
            except OSError as exc:
                listener.close()
                if self.ports and exc.errno == errno.EADDRINUSE:
                    continue
                where = f"{self.host}:{port}" if port else f"{self.host} (at a port the kernel picks)"
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                    f"cannot listen for data connections on {where}: {exc}") from None
        assert self.ports is not None
        raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                            f"cannot listen for data connections on {self.host}: every port of [transport] data_ports "
                            f"{self.ports[0]}-{self.ports[1]} is in use (one per engine listening on this address)")

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._owner._stopping:  # ends at stop() (``stop_accepting`` wakes it)
            # nothing periodic: a pass waits for a newcomer, or for the next hello's deadline when one is due
            self._listener.settimeout(self._expire())
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
            ticket = None if self._owner._stopping else self._admission.admit(addr[0], functools.partial(_shut, sock))
            if ticket is None:
                sock.close()
                continue
            hello = _Hello(self, sock, peer, ticket, min(ticket.deadline, time.monotonic() + self.connect_timeout))
            with self._lock:
                self._hellos[sock] = hello
            try:
                _configure(sock, self.nodelay, self.sndbuf, self.rcvbuf)
                self._reactor.add(sock.fileno(), hello.turn)
            except OSError as exc:
                self._refuse(peer, str(exc))
                hello.close()

    def _expire(self) -> float | None:
        """Every pass of the accept loop: close the hellos past their deadline (their reader then finds the end)
        -- the admission's, and this listener's ``connect_timeout``; how long the next pass may wait in ``accept``
        (None: no hello is due, so wait for a newcomer alone). Only this loop admits, so no deadline can come
        sooner than the one it computes here."""
        assert self._admission is not None
        now = time.monotonic()
        due: float | None = None
        with self._lock:
            late = []
            for hello in self._hellos.values():
                if hello.late:
                    continue
                if hello.deadline <= now:
                    hello.late = True
                    late.append(hello)
                elif due is None or hello.deadline < due:
                    due = hello.deadline
        for hello in late:
            self._admission.timed_out(hello.ticket)
            _shut(hello.sock)
        self._admission.expire()
        oldest = self._admission.next_deadline()
        if oldest is not None and (due is None or oldest < due):
            due = oldest
        return None if due is None else max(0.001, due - time.monotonic())

    def _refuse(self, peer: str, why: str) -> None:
        """A rate-limited warning naming the remote address (never the token); quiet while stopping."""
        if not self._owner._stopping and self._admission is not None:
            self._admission.refusals(f"{peer}: {why}")

    def _admit(self, hello: _Hello, index: int, count: int, token: bytes) -> DataConn | None:
        """A complete hello with a well-formed ``token``: on a match, register the socket with its channel and
        acknowledge it (the connection is then read by its own turns)."""
        assert self._admission is not None
        match = self._owner._match(token)
        if match is None:
            self._refuse(hello.peer, "token not accepted")
            return None
        self._admission.authenticate(hello.ticket)
        if not hello.ticket.authenticated:   # closed to make room just now
            return None
        channel = self._owner._inbound_channel(match, hello.peer)
        if channel is None:
            return None
        conn = channel._attach(hello.sock, index, hello.peer)
        if conn is None:
            self._refuse(hello.peer, "the channel of its token is already broken")
            return None
        try:
            conn.send_ack(hello.deadline)
        except OSError as exc:
            conn.shutdown()
            channel._break(f"acknowledging connection #{index} from {hello.peer} failed: {exc}")
        return conn


class _Hello:
    """A newcomer's hello, read by the reactor's threads as its bytes come (never a thread of its own: a
    stranger that sends nothing, or a byte at a time, holds no thread); the accept loop closes it at its
    deadline. Complete and good, the socket becomes a ``DataConn`` of its token's channel."""

    def __init__(self, listener: TcpListener, sock: socket.socket, peer: str, ticket: Ticket, deadline: float) -> None:
        self.listener = listener
        self.sock = sock
        self.peer = peer
        self.ticket = ticket
        self.deadline = deadline
        self.late = False              # closed by the accept loop at its deadline
        self._got = bytearray()
        self._want = HELLO.size        # bytes of the hello: its head, then the token too

    def turn(self) -> bool:
        """Read what arrived of the hello; True: wait for more; False: done (failed, or a connection now, read by its
        own turns)."""
        listener = self.listener
        try:
            chunk = self.sock.recv(self._want - len(self._got), _DONTWAIT)
        except BlockingIOError:
            return True
        except OSError as exc:
            listener._refuse(self.peer, str(exc))
            self.close()
            return False
        if not chunk:
            if self.late:
                limit = min(listener.connect_timeout, listener.admission_limits.preauth_seconds)
                listener._refuse(self.peer, f"no hello within {limit:g}s")
            else:
                listener._refuse(self.peer, "closed before the hello" if not self._got else "closed during the hello")
            self.close()
            return False
        self._got += chunk
        if len(self._got) < self._want:
            return True
        magic, version, tlen, index, count = HELLO.unpack_from(self._got)
        if self._want == HELLO.size:   # the head is in: check it, then read the token
            why = ("not a datadist hello" if magic != HELLO_MAGIC else
                   f"protocol version {version}, want {PROTOCOL_VERSION}" if version != PROTOCOL_VERSION else
                   "malformed hello" if not 1 <= tlen <= MAX_TOKEN or not index < count <= MAX_STREAMS else "")
            if why:
                listener._refuse(self.peer, why)
                self.close()
                return False
            self._want += tlen
            return True
        conn: DataConn | None = None
        try:
            conn = listener._admit(self, index, count, bytes(self._got[HELLO.size:]))
        except Exception:  # noqa: BLE001
            log.exception("tcp data plane %s: handshake with %s failed", listener._owner.endpoint, self.peer)
        if conn is None:
            self.close()
            return False
        with listener._lock:
            listener._hellos.pop(self.sock, None)
        conn.ended_hook = functools.partial(listener._release, self.ticket)
        listener._reactor.switch(self.sock.fileno(), conn.turn)   # its own reactor thread may read it at once
        return False

    def close(self) -> None:
        """The hello failed: out of the books, the reactor and the admission; the socket closed."""
        listener = self.listener
        with listener._lock:
            listener._hellos.pop(self.sock, None)
        listener._reactor.remove(self.sock.fileno())
        self.sock.close()
        listener._release(self.ticket)


def _shut(sock: socket.socket) -> None:
    """How admission ends a pre-auth connection: wake its reader (it then closes the socket)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
