"""``TcpTransport``: tokens, outbound connects, the tables of channels and receipts (its listener: ``listener.py``)."""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
import socket
import threading
import time
from typing import Sequence

from datadist.status import LLMStatusCode

from ...core.errors import DataDistError
from ...core.types import TransferId
from ...guard.admission import AdmissionLimits
from ...memory.base import Segment
from ..base import Channel
from .channel import TcpChannel
from .listener import TcpListener
from .reactor import reactor
from .receipt import TcpReceipt
from .staging import Buffers
from .wire import (
    _JOIN,
    _U64,
    ACK,
    HELLO,
    HELLO_MAGIC,
    MAX_FRAME,
    MAX_STREAMS,
    MAX_TOKEN,
    PROTOCOL_VERSION,
    ControlHandler,
    _configure,
    _parse_endpoint,
    _recv_exact,
    _table,
)

log = logging.getLogger("datadistd.transport.tcp")


class TcpTransport:
    """TCP data plane of one engine: a listener for inbound channels, ``connect`` for outbound ones."""

    name = "tcp"
    label = "tcp"
    inline_small_reads = True   # the reply and the bytes share the link's sockets: one frame instead of two

    def __init__(self, host: str = "127.0.0.1", port: int = 0, chunk_size: int = 4 << 20,
                 connect_timeout: float = 5.0, nodelay: bool = True, sndbuf: int | None = None,
                 rcvbuf: int | None = None, stripe: int = 0, admission: AdmissionLimits | None = None,
                 ports: tuple[int, int] | None = None) -> None:
        if chunk_size <= 0 or chunk_size > MAX_FRAME:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"chunk_size must be in (0, {MAX_FRAME}]")
        if stripe < 0:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "stripe must be >= 0 (0: from the CPU count)")
        if connect_timeout <= 0:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "connect_timeout must be > 0")
        self.host = host
        self.port = port
        #: ``[transport] data_ports``: the listener binds the first free port of this inclusive range instead of
        #: ``port`` (a firewall then needs only these open)
        self.ports = ports
        self.chunk_size = chunk_size
        self.connect_timeout = connect_timeout
        self.nodelay = nodelay
        self.sndbuf = sndbuf
        self.rcvbuf = rcvbuf
        self.stripe = stripe or _auto_stripe()
        self.admission_limits = admission or AdmissionLimits()
        self._listener: TcpListener | None = None     # made at start()
        self._lock = threading.Lock()
        self._allowed: set[bytes] = set()
        self._control_handlers: dict[bytes, ControlHandler] = {}   # token -> handler of its inbound channel
        self._inbound: dict[bytes, TcpChannel] = {}
        self._outbound: list[TcpChannel] = []
        self._receipts: dict[int, TcpReceipt] = {}
        self._ids = itertools.count(secrets.randbits(32) + 1)
        self._threads: set[threading.Thread] = set()
        self._retired = {"bytes_sent": 0, "frames_sent": 0, "bytes_received": 0, "frames_received": 0,
                         "bytes_discarded": 0}
        self._buffers = Buffers(chunk_size)     # staging buffers of senders and readers
        self._reactor = reactor()               # the process's reader threads, shared by every transport
        self._started = False
        self._stopping = False

    def __repr__(self) -> str:
        return f"TcpTransport({self.endpoint if self._started else 'not started'})"

    @property
    def endpoint(self) -> str:
        if not self._started:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "tcp transport is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    # -- life cycle --

    def start(self) -> None:
        if self._started:
            return
        listener = TcpListener(self, self._lock, self.host, self.port, self.ports, self.connect_timeout, self.nodelay,
                               self.sndbuf, self.rcvbuf, self.admission_limits)
        self.port = listener.bind()
        self._listener = listener
        self._started = True
        listener.start()
        log.debug("tcp data plane listening on %s", self.endpoint)

    def stop(self) -> None:
        with self._lock:
            if self._stopping or not self._started:
                self._stopping = True
                return
            self._stopping = True
            channels = list(self._inbound.values()) + list(self._outbound)
        if self._listener is not None:
            self._listener.stop_accepting()
            self._listener.shut_hellos()
        for ch in channels:
            ch.close()
        conns = [c for ch in channels for c in ch._conns]
        with self._lock:
            receipts = list(self._receipts.values())
        for receipt in receipts:
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED, "the data plane was stopped")
        limit = time.monotonic() + _JOIN
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, limit - time.monotonic()))
        for conn in conns:   # their readers saw the end (the reactor's threads run on)
            conn.ended.wait(max(0.0, limit - time.monotonic()))
        if self._listener is not None:
            self._listener.close()
        alive = [t.name for t in threads if t.is_alive()]
        reading = sum(1 for c in conns if not c.ended.is_set())
        if alive or reading:
            log.warning("tcp data plane %s: still running after stop: threads %s, %d connection readers",
                        self.endpoint, alive, reading)

    # -- tokens and channels --

    def allow(self, token: bytes) -> None:
        _check_token(token)
        with self._lock:
            self._allowed.add(bytes(token))

    def admission_stats(self) -> dict[str, int]:
        """The books of the listener's admission (``admission.Admitting``)."""
        if self._listener is None:
            return {}
        return self._listener.admission_stats()

    def on_control(self, token: bytes, handler: ControlHandler) -> None:
        """The control handler of the inbound channel ``token`` makes (set before its first frame)."""
        with self._lock:
            self._control_handlers[bytes(token)] = handler
            channel = self._inbound.get(bytes(token))
        if channel is not None:
            channel.on_control(handler)

    def revoke(self, token: bytes) -> None:
        with self._lock:
            self._allowed.discard(token)
            self._control_handlers.pop(token, None)
            channel = self._inbound.get(token)
        if channel is not None:
            channel.close()  # leaves the table via _retire, its counters kept in the totals

    def channel(self, token: bytes) -> TcpChannel | None:
        with self._lock:
            return self._inbound.get(token)

    def connect(self, endpoint: str, token: bytes, streams: int, deadline: float) -> TcpChannel:
        _check_token(token)
        if not 1 <= streams <= MAX_STREAMS:
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID,
                                f"streams must be in [1, {MAX_STREAMS}], got {streams}")
        if not self._started or self._stopping:
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "tcp transport is not running")
        host, port = _parse_endpoint(endpoint)
        socks: list[socket.socket] = []
        try:
            for index in range(streams):
                socks.append(self._open(endpoint, host, port, token, index, streams, deadline))
        except BaseException:
            for s in socks:
                s.close()
            raise
        channel = TcpChannel(self, bytes(token), endpoint, outbound=True)
        with self._lock:
            self._outbound.append(channel)
        for index, sock in enumerate(socks):
            conn = channel._attach(sock, index, endpoint)
            assert conn is not None
            self._reactor.add_stream(sock.fileno(), conn.turn)
        return channel

    def _open(self, endpoint: str, host: str, port: int, token: bytes, index: int, count: int,
              deadline: float) -> socket.socket:
        now = time.monotonic()
        if now >= deadline:
            raise DataDistError(LLMStatusCode.LLM_TIMEOUT, f"deadline passed before connecting to {endpoint}")
        limit = min(deadline, now + self.connect_timeout)
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((host, port), timeout=limit - now)
            _configure(sock, self.nodelay, self.sndbuf, self.rcvbuf)
            sock.settimeout(max(1e-3, limit - time.monotonic()))
            sock.sendall(HELLO.pack(HELLO_MAGIC, PROTOCOL_VERSION, len(token), index, count) + bytes(token))
            ack = _recv_exact(sock, 1, limit)
        except TimeoutError:
            if sock is not None:
                sock.close()
            if time.monotonic() >= deadline:
                raise DataDistError(LLMStatusCode.LLM_TIMEOUT,
                                    f"data connection {index} to {endpoint} not established by the deadline; "
                                    f"{_unreached(endpoint)}") from None
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"data connection {index} to {endpoint} not established within "
                                f"{self.connect_timeout}s; {_unreached(endpoint)}") from None
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"cannot open data connection {index} to {endpoint}: {exc}; "
                                f"{_unreached(endpoint)}") from None
        if ack != ACK:
            sock.close()
            raise DataDistError(LLMStatusCode.LLM_LINK_FAILED,
                                f"data connection {index} to {endpoint} was refused during the handshake "
                                f"(token not accepted, or the peer is not a datadist data plane)")
        return sock

    # -- receiving --

    def expect(self, segments: Sequence[Segment], channel: Channel | None = None) -> TcpReceipt:
        """Register where an incoming transfer goes. ``channel``: the channel the bytes will come over;
        when it breaks the receipt fails at once instead of at its deadline."""
        table = _table(segments)
        if channel is not None and (not isinstance(channel, TcpChannel) or channel._transport is not self):
            raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, "the channel belongs to another transport")
        tid = TransferId(next(self._ids) & _U64)
        receipt = TcpReceipt(self._forget, tid, table, channel)
        if receipt.done:
            return receipt
        with self._lock:
            if self._stopping:
                raise DataDistError(LLMStatusCode.LLM_LINK_FAILED, "the data plane was stopped")
            self._receipts[tid] = receipt
        if channel is not None and channel.broken:
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED, f"data channel to {channel.peer} is already broken")
        return receipt

    def stats(self) -> dict[str, int]:
        with self._lock:
            channels = list(self._inbound.values()) + list(self._outbound)
            totals = dict(self._retired)
            pending = len(self._receipts)
        for ch in channels:
            s = ch.stats()
            for k in totals:
                totals[k] += s[k]  # type: ignore[operator]
        totals["frames"] = totals["frames_sent"] + totals["frames_received"]
        totals["channels"] = len(channels)
        totals["connections"] = sum(ch.streams for ch in channels)
        totals["pending_receipts"] = pending
        return totals

    # -- internals --

    def _forget(self, tid: int) -> None:
        with self._lock:
            self._receipts.pop(tid, None)

    def _channel_down(self, channel: TcpChannel, message: str) -> None:
        with self._lock:
            receipts = list(self._receipts.values())
        for receipt in receipts:
            receipt._fail(LLMStatusCode.LLM_LINK_FAILED, message, channel=channel)

    def _retire(self, channel: TcpChannel) -> None:
        """A closed channel leaves the tables; its counters stay in the totals."""
        with self._lock:
            if channel in self._outbound:
                self._outbound.remove(channel)
            elif self._inbound.get(channel.token) is channel:
                del self._inbound[channel.token]
            else:
                return
            s = channel.stats()
            for k in self._retired:
                self._retired[k] += s[k]  # type: ignore[operator]

    def _spawn(self, target, name: str, *args: object) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _match(self, token: bytes) -> bytes | None:
        """``ListenerOwner``: the allowed token equal to ``token``, compared with every one in constant time."""
        with self._lock:
            allowed = list(self._allowed)
        match = None
        for candidate in allowed:  # compare with every allowed token, in constant time each
            if hmac.compare_digest(candidate, token):
                match = candidate
        return match

    def _inbound_channel(self, token: bytes, peer: str) -> TcpChannel | None:
        """``ListenerOwner``: the inbound channel of ``token``, made with its handler on its first connection."""
        with self._lock:
            if self._stopping or token not in self._allowed:
                return None
            channel = self._inbound.get(token)
            if channel is None:
                channel = self._inbound[token] = TcpChannel(self, token, peer, outbound=False)
                handler = self._control_handlers.get(token)
                if handler is not None:   # before its first frame is read
                    channel.on_control(handler)
            return channel


def _unreached(endpoint: str) -> str:
    """What a data connection the peer's listener never answered most likely met, and the fix."""
    return (f"is a firewall dropping TCP to {endpoint.partition('://')[2]}? The serving node's data plane listens "
            f"on its [transport] data_ports (unset: a port the kernel picks, which no firewall rule can name); set "
            f"them and open them to this node (docs/operations.md \"Ports\")")


def _auto_stripe() -> int:
    """Connections one transfer is striped over, by default: one per two usable CPUs, at most 4.

    Each stripe is a sender thread here and a reader thread at the peer, copying in parallel; that
    pays where there are cores to run them. On a 2-CPU node it only adds thread switches and GIL
    hand-offs (measured on loopback: 1 stripe ~2.7 GiB/s, 4 stripes ~1.5 GiB/s, see
    docs/performance.md). Concurrent transfers still spread over all the channel's connections.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 2))


def _check_token(token: bytes) -> None:
    if not isinstance(token, (bytes, bytearray)) or not 1 <= len(token) <= MAX_TOKEN:
        raise DataDistError(LLMStatusCode.LLM_PARAM_INVALID, f"a data-plane token is 1..{MAX_TOKEN} bytes")
