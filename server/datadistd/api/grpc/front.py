"""The public face of a Peer listener: admission (``datadistd.guard.admission``) in front of gRPC.

gRPC's Python server has no hook on accepted connections: it cannot cap them per source, close one
that has not authenticated in time, or say how many it holds (an idle stranger's connection lived
~2 minutes, and 4,000 of them exhausted the daemon's descriptors). So the Peer service's gRPC server
listens on a private loopback port, and this front owns the public address:

* it accepts a TCP connection, asks ``Admission`` (caps per source and in total, a pre-auth
  deadline, eviction of the oldest pre-auth connection; refusals logged at a bounded rate), opens a
  connection to the private port and relays bytes both ways, with back-pressure either way;
* the Peer servicer tells the front when a connection *authenticated* (a good Handshake) through
  ``authenticate(context.peer())``: the private server sees the
  relay's own loopback port, which maps back to the public connection;
* a request that did not come through the front (someone on this host dialling the private port)
  is refused by the servicer (``admitted`` is False), so the caps cannot be walked around.

Cost: one loopback hop each way, on the event loop (measured in docs/performance.md). TLS, when
configured, passes through untouched and terminates in the private gRPC server.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from ...core.errors import DataDistError, StatusCode
from ...guard.admission import Admission, AdmissionLimits, Ticket
from ...links.wire.peering import RETRY_LATER

__all__ = ["PeerFront"]

log = logging.getLogger(__name__)

_HIGH_WATER = 4 << 20      # bytes buffered towards one side before the other side's reading pauses


class _Relay:
    """One public connection and its private twin."""

    __slots__ = ("front", "ticket", "outer", "inner", "inner_port", "_early")

    def __init__(self, front: "PeerFront", outer: asyncio.Transport) -> None:
        self.front = front
        self.outer = outer
        self.inner: asyncio.Transport | None = None
        self.inner_port = 0
        self.ticket: Ticket | None = None
        self._early: list[bytes] = []

    def close(self) -> None:
        for t in (self.outer, self.inner):
            if t is not None and not t.is_closing():
                t.abort()


class _Outer(asyncio.Protocol):
    def __init__(self, front: "PeerFront") -> None:
        self.front = front
        self.relay: _Relay | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        relay = self.relay = _Relay(self.front, transport)
        peer = transport.get_extra_info("peername") or ("?", 0)
        relay.ticket = self.front.admission.admit(str(peer[0]), relay.close)
        if relay.ticket is None:
            transport.abort()
            return
        self.front._admitted.set()      # a pre-auth deadline to keep: the sweeper wakes for it
        transport.set_write_buffer_limits(_HIGH_WATER)
        transport.pause_reading()       # until the private side is connected
        self.front._pending.add(asyncio.get_running_loop().create_task(self.front._connect_inner(relay)))

    def data_received(self, data: bytes) -> None:
        relay = self.relay
        if relay is None:
            return
        if relay.inner is None:
            relay._early.append(data)
        else:
            relay.inner.write(data)

    def eof_received(self) -> bool:
        if self.relay is not None:
            self.relay.close()
        return False

    def pause_writing(self) -> None:      # the stranger/peer reads slowly: stop reading the private side
        if self.relay is not None and self.relay.inner is not None:
            self.relay.inner.pause_reading()

    def resume_writing(self) -> None:
        if self.relay is not None and self.relay.inner is not None:
            self.relay.inner.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        relay = self.relay
        if relay is None:
            return
        relay.close()
        self.front._forget(relay)


class _Inner(asyncio.Protocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.outer.write(data)

    def eof_received(self) -> bool:
        self.relay.close()
        return False

    def pause_writing(self) -> None:
        self.relay.outer.pause_reading()

    def resume_writing(self) -> None:
        self.relay.outer.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()


class PeerFront:
    """Owns a Peer listener's public address; relays admitted connections to ``inner_port`` on loopback."""

    def __init__(self, inner_port: int, limits: AdmissionLimits | None = None, name: str = "peer listener") -> None:
        self.inner_port = inner_port
        self.admission = Admission(name, limits, log)
        self._by_port: dict[int, _Relay] = {}      # the relay's private-side local port -> relay
        self._pending: set[asyncio.Task] = set()
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None
        self._admitted = asyncio.Event()   # set when a connection is admitted (the sweeper may be asleep)
        self.sweeps = 0                    # the sweeper's rounds (tests: none while no connection waits)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; returns the bound port."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = await loop.create_server(lambda: _Outer(self), host.strip("[]"), port, family=family,
                                                reuse_address=True, backlog=128)
        self._sweeper = loop.create_task(self._sweep())
        self.admission.refusals.what = f"peer listener {host}:{self.port}: connection refused or closed"
        return self.port

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    def admitted(self, grpc_peer: str) -> bool:
        """The private server's ``context.peer()`` is a connection this front relays."""
        return self._relay(grpc_peer) is not None

    def authenticate(self, grpc_peer: str) -> None:
        """The connection proved the secret: lift its pre-auth deadline and caps."""
        relay = self._relay(grpc_peer)
        if relay is not None and relay.ticket is not None:
            self.admission.authenticate(relay.ticket)

    def source_of(self, grpc_peer: str) -> str:
        """The source (``admission.source_key``) of the connection a call came on; "" when unknown."""
        relay = self._relay(grpc_peer)
        return relay.ticket.source if relay is not None and relay.ticket is not None else ""

    def admit_challenge(self, grpc_peer: str) -> Ticket | None:
        """The connection a ``Peer/Challenge`` came on (its ticket: the challenge is its own, ``ChallengeStore``), or
        ``LLM_LINK_FAILED`` when it or its source asked for too many (``Admission.allow_challenge``)."""
        relay = self._relay(grpc_peer)
        if relay is None or relay.ticket is None:
            return None
        if not self.admission.allow_challenge(relay.ticket):
            self.admission.refusals(f"{relay.ticket.source}: too many challenges")
            raise DataDistError(StatusCode.LLM_LINK_FAILED,
                                f"too many challenges from this connection or address; {RETRY_LATER}")
        return relay.ticket

    def stats(self) -> dict[str, int]:
        return {**self.admission.stats(), "relays": len(self._by_port)}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._pending):
            task.cancel()
        for relay in list(self._by_port.values()):
            relay.close()
        if self._server is not None:
            await self._server.wait_closed()

    # ---- internals ------------------------------------------------------------------------------

    def _relay(self, grpc_peer: str) -> _Relay | None:
        host, _, port = grpc_peer.rpartition(":")   # "ipv4:127.0.0.1:41234"
        if not host.startswith("ipv4:127.0.0.1") or not port.isdigit():
            return None
        return self._by_port.get(int(port))

    async def _connect_inner(self, relay: _Relay) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _Inner(relay), "127.0.0.1", self.inner_port), timeout=5.0)
        except (OSError, asyncio.TimeoutError) as exc:
            self.admission.refusals(f"cannot reach the private Peer server: {exc}")
            relay.close()
            return
        finally:
            self._pending.discard(asyncio.current_task())  # type: ignore[arg-type]
        assert isinstance(transport, asyncio.Transport)
        if relay.outer.is_closing():   # the public side went (or was evicted) meanwhile
            transport.abort()
            return
        transport.set_write_buffer_limits(_HIGH_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        relay.inner = transport
        relay.inner_port = int(transport.get_extra_info("sockname")[1])
        self._by_port[relay.inner_port] = relay
        for data in relay._early:
            transport.write(data)
        relay._early.clear()
        relay.outer.resume_reading()

    def _forget(self, relay: _Relay) -> None:
        if relay.ticket is not None:
            self.admission.release(relay.ticket)
        if self._by_port.get(relay.inner_port) is relay:
            del self._by_port[relay.inner_port]

    async def _sweep(self) -> None:
        """Close the pre-auth connections past their deadline, at that deadline: asleep until the oldest one's
        (``Admission.next_deadline``), or, with none waiting, until a connection is admitted -- nothing periodic."""
        while True:
            due = self.admission.next_deadline()
            if due is None:
                self._admitted.clear()
                await self._admitted.wait()
                continue
            await asyncio.sleep(max(0.0, due - time.monotonic()) + 0.001)
            self.sweeps += 1
            self.admission.expire()
