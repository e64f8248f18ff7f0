"""Connections before they prove anything: admission for the listeners strangers can reach.

An engine that serves peers has two such listeners: the gRPC Peer service (``rpc/front.py``) and
the data plane (``transport/tcp.py``). Anyone who can route to them can connect; only a holder of
the cluster secret can *authenticate* (a good handshake, or a request naming a live session, on the
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

Refusals and evictions are logged through ``RefusalLog``: the first at once, then one summary line
per interval with the count -- a flood of strangers costs the log a line every few seconds.

Pure Python, thread-safe (the data plane admits from its accept thread, the gRPC front from the event
loop); the clock is injectable. Eviction and expiry call the ``close`` callback a connection was
admitted with, outside the lock, in the caller's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

__all__ = ["AdmissionLimits", "Admission", "Ticket", "RefusalLog", "Admitting"]


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

    __slots__ = ("source", "deadline", "authenticated", "closed", "_close")

    def __init__(self, source: str, deadline: float, close: Callable[[], None]) -> None:
        self.source = source
        self.deadline = deadline
        self.authenticated = False
        self.closed = False
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

    def admit(self, source: str, close: Callable[[], None]) -> Ticket | None:
        """A new connection from ``source``: its ticket, or None (over ``max_connections``: close it).

        May close older pre-auth connections (their ``close``) to make room -- see the module doc."""
        lim = self.limits
        victims: list[Ticket] = []
        with self._lock:
            if len(self._preauth) + self._authenticated >= lim.max_connections:
                self.refused += 1
                ticket = None
            else:
                mine = self._by_source.get(source)
                if mine is not None and len(mine) >= lim.per_source:
                    victims.append(next(iter(mine)))
                elif len(self._preauth) >= lim.preauth_total:
                    heaviest = max(self._by_source.values(), key=len)
                    victims.append(next(iter(heaviest)))
                for victim in victims:
                    self._forget(victim)
                    self.evicted += 1
                ticket = Ticket(source, self._clock() + lim.preauth_seconds, close)
                self._preauth[ticket] = None
                self._by_source.setdefault(source, OrderedDict())[ticket] = None
        if ticket is None:
            self.refusals(f"{source}: the listener holds {lim.max_connections} connections")
        for victim in victims:
            self.refusals(f"{victim.source}: closed an unauthenticated connection to make room "
                          f"(at most {lim.per_source} per source, {lim.preauth_total} in all)")
            victim._close()
        return ticket

    def authenticate(self, ticket: Ticket) -> None:
        """The connection proved the secret: no deadline, no longer counted against the pre-auth caps."""
        with self._lock:
            if ticket.closed or ticket.authenticated:
                return
            self._forget(ticket)
            ticket.closed = False
            ticket.authenticated = True
            self._authenticated += 1

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
