"""Connections before they prove anything: admission for the listeners strangers can reach.

An engine that serves peers has two such listeners: the gRPC Peer service (``api/grpc/front.py``) and
the data plane (``transport/tcp.py``). Anyone who can route to them can connect; only a holder of
the cluster secret can *authenticate* (a good handshake on the
Peer service; a good hello token on the data plane). Until then a connection is **pre-auth**, and:

* it lives at most ``preauth_seconds``; then it is closed;
* a source address holds at most ``per_source`` pre-auth connections, and the listener at most
  ``preauth_total``. A new connection over either cap is let in and the *oldest* pre-auth
  connection of its source (per-source cap) or of the source holding most (total cap) is closed.
  So strangers holding silent or idle connections cannot keep a legitimate peer out: its handshake
  takes milliseconds, and to starve it an attacker must open connections faster than that,
  continuously (the SSH ``MaxStartups`` problem, answered by eviction instead of refusal);
* the listener holds at most ``max_connections`` in all (authenticated ones included); past that
  new connections are refused, which bounds its file descriptors (only secret holders get there).

A source that proved the secret on this listener lately (a connection of it authenticated within
``proven_seconds``: a live or recent link) is a **proven** source, and the caps meant for strangers would
throttle a legitimate node: a decode node of 16 engines linking at start-up to the 16 engines of a prompt host
makes 16 handshakes at once on each prompt engine's Peer listener, then 16 x ``[transport] streams`` data
connections on its data plane, all from one address; a decoder that links, pulls and unlinks in a loop asks
~20 challenges a second. So a proven source may hold up to ``proven_per_source`` pre-auth connections (by
default the listener's whole ``preauth_total``), asks challenges from a bucket of its own
(``proven_challenges_per_second``, burst twice that), and is the last one evicted when the total cap needs a
victim. A node's first burst, before any of its connections authenticated, still meets the stranger caps: the
linking side retries what they refuse (``links/setup.py``), and the first handshake through proves the source.
Whoever shares a proven address (a NAT, a shared host) shares its budget: still bounded, and still without
the secret nothing but challenges.

Sources are counted by ``source_key``: an IPv4 address, or the /64 of an IPv6 address (one host
commonly owns a whole /64, so per-address counting would give it unlimited sources). Each source has a
token bucket of admissions (``SourceRate``): it does not refuse anything by itself, but when the total
cap makes a victim necessary and several sources hold the most, the one that connected most recently
(the emptiest bucket: the churner) loses, not a peer that opened one connection. Challenges
(``Peer/Challenge``) are rate-limited too, per connection (``challenges_per_connection`` on a pre-auth
one) and per source (a bucket of ``challenges_per_second``): ``allow_challenge``. A pre-auth connection's
first challenge is served outside its source's bucket: a linking daemon asks one per connection, and a stranger
flooding from its address (a shared host, a NAT) would otherwise keep that bucket empty for it; what a
connection costs stays bounded by the pre-auth caps above (a new connection over them closes an older one).

Refusals and evictions are logged through ``RefusalLog``: the first at once, then one summary line
per interval with the count -- a flood of strangers costs the log a line every few seconds.

Pure Python, thread-safe (the data plane admits from its accept thread, the gRPC front from the event
loop); the clock is injectable. Eviction and expiry call the ``close`` callback a connection was
admitted with, outside the lock, in the caller's thread.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

__all__ = ["AdmissionLimits", "Admission", "Ticket", "RefusalLog", "Admitting", "SourceRate", "source_key"]


def source_key(address: str) -> str:
    """Who a connection counts as: the IPv4 address, or the /64 of an IPv6 one (an IPv4-mapped one as IPv4)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class SourceRate:
    """A token bucket per source: ``burst`` tokens, refilled at ``rate`` per second; at most ``max_sources``
    remembered (the least recently seen forgotten first, so memory stays bounded). Thread-safe."""

    def __init__(self, rate: float, burst: float, max_sources: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.max_sources = max_sources
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()   # source -> [tokens, when]

    def _bucket(self, source: str, now: float) -> list[float]:
        b = self._buckets.get(source)
        if b is None:
            if len(self._buckets) >= self.max_sources:
                self._buckets.popitem(last=False)
            b = self._buckets[source] = [self.burst, now]
        else:
            self._buckets.move_to_end(source)
            b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
            b[1] = now
        return b

    def take(self, source: str) -> bool:
        """Spend a token of ``source``; False (nothing spent) when it has none."""
        with self._lock:
            b = self._bucket(source, self._clock())
            if b[0] < 1:
                return False
            b[0] -= 1
            return True

    def tokens(self, source: str) -> float:
        with self._lock:
            return self._bucket(source, self._clock())[0]


@runtime_checkable
class Admitting(Protocol):
    """A listener with admission (the peer front, the tcp data plane): its books, for metrics and status."""

    def admission_stats(self) -> dict[str, int]:
        """``Admission.stats()``: preauth, authenticated, sources, evicted, expired, refused."""


@dataclass(frozen=True)
class AdmissionLimits:
    """The caps of one listener (``[peer]`` in the config sets them for every engine)."""

    preauth_seconds: float = 10.0
    per_source: int = 8
    preauth_total: int = 64
    max_connections: int = 1024
    #: connections a source opens per second before it counts as churning (victim choice only); burst twice that
    connections_per_second: float = 20.0
    #: Peer/Challenge calls one pre-auth connection may make (a link needs one)
    challenges_per_connection: int = 4
    #: Peer/Challenge calls per second per source; burst twice that
    challenges_per_second: float = 10.0
    #: how long a source counts as proven after one of its connections authenticated (see the module doc)
    proven_seconds: float = 600.0
    #: pre-auth connections a proven source may hold (at most preauth_total): a start-up burst of 16 links, each
    #: with 4 data connections, is 64
    proven_per_source: int = 64
    #: Peer/Challenge calls per second of a proven source; burst twice that (256 links in a second from one
    #: decode node, 16 per listener; a link loop at ~20 links/s)
    proven_challenges_per_second: float = 128.0

    def __post_init__(self) -> None:
        if not self.preauth_seconds > 0:
            raise ValueError("preauth_seconds must be > 0")
        if not 1 <= self.per_source <= self.preauth_total <= self.max_connections:
            raise ValueError("need 1 <= per_source <= preauth_total <= max_connections")


class RefusalLog:
    """Log a refusal at once, then at most one line per ``every`` seconds summing up what came meanwhile."""

    def __init__(self, logger: logging.Logger, what: str, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.what = what
        self.every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._quiet = 0          # refusals not logged yet
        self._last = ""
        self._logged_at = -float("inf")
        self.total = 0

    def __call__(self, why: str) -> None:
        now = self._clock()
        with self._lock:
            self.total += 1
            self._quiet += 1
            self._last = why
            if now - self._logged_at < self.every:
                return
            count, self._quiet, self._logged_at = self._quiet, 0, now
        if count == 1:
            self.logger.warning("%s: %s", self.what, why)
        else:
            self.logger.warning("%s: %d refusals in the last %.0f s; the last: %s", self.what, count, self.every, why)


class Ticket:
    """One admitted connection. ``close`` is how admission ends it (eviction, pre-auth deadline)."""

    __slots__ = ("source", "deadline", "authenticated", "closed", "challenges", "_close")

    def __init__(self, source: str, deadline: float, close: Callable[[], None]) -> None:
        self.source = source            # source_key of the address
        self.deadline = deadline
        self.authenticated = False
        self.closed = False
        self.challenges = 0             # Peer/Challenge calls made on this connection
        self._close = close

    def __repr__(self) -> str:
        state = "closed" if self.closed else "authenticated" if self.authenticated else "pre-auth"
        return f"Ticket({self.source}, {state})"


class Admission:
    """The caps of one listener, over the connections it admitted (see the module doc)."""

    def __init__(self, name: str, limits: AdmissionLimits | None = None, logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.limits = limits or AdmissionLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._preauth: OrderedDict[Ticket, None] = OrderedDict()     # oldest first
        self._by_source: dict[str, OrderedDict[Ticket, None]] = {}
        self._authenticated = 0
        self.refusals = RefusalLog(logger or logging.getLogger(__name__), f"{name}: connection refused or closed",
                                   clock=clock)
        self.evicted = 0
        self.expired = 0
        self.refused = 0
        lim = self.limits
        self._connect_rate = SourceRate(lim.connections_per_second, 2 * lim.connections_per_second, clock=clock)
        self._challenge_rate = SourceRate(lim.challenges_per_second, 2 * lim.challenges_per_second, clock=clock)
        self._proven_rate = SourceRate(lim.proven_challenges_per_second, 2 * lim.proven_challenges_per_second,
                                       clock=clock)
        self._proven: OrderedDict[str, float] = OrderedDict()   # source -> until when it counts as proven
        self.max_proven = 4096                                  # sources remembered (the least recent forgotten)

    def proven(self, source: str) -> bool:
        """``source`` (a ``source_key``) authenticated on this listener within ``proven_seconds``."""
        with self._lock:
            return self._is_proven(source, self._clock())

    def _is_proven(self, source: str, now: float) -> bool:   # lock held
        until = self._proven.get(source)
        if until is None:
            return False
        if until <= now:
            del self._proven[source]
            return False
        return True

    def admit(self, source: str, close: Callable[[], None]) -> Ticket | None:
        """A new connection from ``source``: its ticket, or None (over ``max_connections``: close it).

        May close older pre-auth connections (their ``close``) to make room -- see the module doc."""
        lim = self.limits
        source = source_key(source)
        self._connect_rate.take(source)
        victims: list[Ticket] = []
        with self._lock:
            now = self._clock()
            if len(self._preauth) + self._authenticated >= lim.max_connections:
                self.refused += 1
                ticket = None
            else:
                mine = self._by_source.get(source)
                cap = (min(lim.proven_per_source, lim.preauth_total) if self._is_proven(source, now)
                       else lim.per_source)
                if mine is not None and len(mine) >= cap:
                    victims.append(next(iter(mine)))
                elif len(self._preauth) >= lim.preauth_total:
                    # a stranger before a proven source; then the source holding most; among equals, the one
                    # that connected most lately (the churner)
                    heaviest = max(self._by_source.items(),
                                   key=lambda kv: (not self._is_proven(kv[0], now), len(kv[1]),
                                                   -self._connect_rate.tokens(kv[0])))[1]
                    victims.append(next(iter(heaviest)))
                for victim in victims:
                    self._forget(victim)
                    self.evicted += 1
                ticket = Ticket(source, now + lim.preauth_seconds, close)
                self._preauth[ticket] = None
                self._by_source.setdefault(source, OrderedDict())[ticket] = None
        if ticket is None:
            self.refusals(f"{source}: the listener holds {lim.max_connections} connections")
        for victim in victims:
            self.refusals(f"{victim.source}: closed an unauthenticated connection to make room (at most "
                          f"{lim.per_source} per source, {lim.proven_per_source} per proven source, "
                          f"{lim.preauth_total} in all)")
            victim._close()
        return ticket

    def allow_challenge(self, ticket: Ticket) -> bool:
        """May this connection ask for another challenge (per pre-auth connection, and per source per second:
        a proven source from a bucket of its own)? A pre-auth connection's first is served outside the source's
        bucket: a flood from the address drains that, and a linking peer asks one per connection."""
        with self._lock:
            if not ticket.authenticated:
                if ticket.challenges >= self.limits.challenges_per_connection:
                    return False
                ticket.challenges += 1
                if ticket.challenges == 1:
                    return True
            proven = self._is_proven(ticket.source, self._clock())
        return (self._proven_rate if proven else self._challenge_rate).take(ticket.source)

    def authenticate(self, ticket: Ticket) -> None:
        """The connection proved the secret: no deadline, no longer counted against the pre-auth caps; its
        source counts as proven for ``proven_seconds``."""
        with self._lock:
            if ticket.closed or ticket.authenticated:
                return
            self._forget(ticket)
            ticket.closed = False
            ticket.authenticated = True
            self._authenticated += 1
            self._proven[ticket.source] = self._clock() + self.limits.proven_seconds
            self._proven.move_to_end(ticket.source)
            if len(self._proven) > self.max_proven:
                self._proven.popitem(last=False)

    def release(self, ticket: Ticket) -> None:
        """The connection is gone (closed by either side)."""
        with self._lock:
            if ticket.closed:
                return
            if ticket.authenticated:
                self._authenticated -= 1
                ticket.closed = True
            else:
                self._forget(ticket)

    def timed_out(self, ticket: Ticket) -> None:
        """The listener closed a pre-auth connection at its deadline itself (a receive timeout): count it."""
        with self._lock:
            if ticket.closed or ticket.authenticated:
                return
            self._forget(ticket)
            self.expired += 1

    def next_deadline(self) -> float | None:
        """When the oldest pre-auth connection's deadline falls (``expire`` then closes it), or None when there is
        none: tickets are admitted in order with one ``preauth_seconds`` each, so the oldest is the first due."""
        with self._lock:
            for ticket in self._preauth:
                return ticket.deadline
        return None

    def expire(self) -> int:
        """Close every pre-auth connection past its deadline; how many."""
        now = self._clock()
        victims = []
        with self._lock:
            for ticket in self._preauth:   # oldest first: stop at the first one still in time
                if ticket.deadline > now:
                    break
                victims.append(ticket)
            for ticket in victims:
                self._forget(ticket)
            self.expired += len(victims)
        for ticket in victims:
            self.refusals(f"{ticket.source}: closed a connection that did not authenticate within "
                          f"{self.limits.preauth_seconds:g} s")
            ticket._close()
        return len(victims)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"preauth": len(self._preauth), "authenticated": self._authenticated,
                    "sources": len(self._by_source), "evicted": self.evicted, "expired": self.expired,
                    "refused": self.refused}

    def _forget(self, ticket: Ticket) -> None:
        """Drop a pre-auth ticket from the books (lock held); it counts as closed from here on."""
        self._preauth.pop(ticket, None)
        mine = self._by_source.get(ticket.source)
        if mine is not None:
            mine.pop(ticket, None)
            if not mine:
                del self._by_source[ticket.source]
        ticket.closed = True
