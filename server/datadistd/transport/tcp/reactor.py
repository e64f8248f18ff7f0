"""``Reactor``: the reader threads of every TCP data connection of the process -- one epoll, a small pool.

A connection is registered once (``add``) with its *turn*: what a pool thread runs when the socket is readable.
Registration is one-shot (``EPOLLONESHOT``): a readable connection wakes exactly one thread, which reads it --
a frame in progress to its end, then every frame already waiting (``DataConn.turn``) -- while no other thread
can pick it; the turn then says whether the socket goes back to the epoll (re-armed) or is done (unregistered,
by the turn, before its socket is closed). So a connection's frames are read, and handed to its channel's
control handler, in order and on the thread that read them, and a handler may block briefly: the other
connections are served by the other threads meanwhile.

Threads: ``size`` of them (bounded by the CPU count, not by the connections: ``_pool_size``), made with the
reactor -- when the daemon's first transport is made -- so a link adds none. An idle thread sleeps in
``epoll_wait`` without a timeout: an idle connection wakes nobody. The pool lives as long as the process (daemon
threads; nothing to stop): the connections of every transport of the daemon share it.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import threading
from typing import Callable

log = logging.getLogger("datadistd.transport.tcp")

#: what a turn returns: True to be woken again at the next bytes, False when the connection is done
Turn = Callable[[], bool]

_MASK = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT
#: thread names of the pool (tests and the bench find them by it)
THREAD_PREFIX = "datadist-tcp-read"


def _pool_size() -> int:
    """Reader threads at most: two per usable CPU, at least 4 (a handler may block briefly), at most 32."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(4, min(32, 2 * cpus))


class Reactor:
    """One epoll and the threads that wait in it; see the module doc."""

    def __init__(self, size: int = 0) -> None:
        self.size = size or _pool_size()
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._turns: dict[int, Turn] = {}
        self.wakeups = 0          # turns run (each one a thread woken for a readable connection)
        #: ``rearm(fd)``: wake a turn of ``fd`` again at its next bytes (at once if some wait) -- for a connection
        #: whose last turn returned False without ``remove``, reading paused, not done -- from any thread, never while
        #: a turn of it runs (the attach socket's back-pressure and its messages handed to the event loop:
        #: ``api.attachread``). The epoll's own ``modify`` with the mask bound: no Python frame per re-arm (a small
        #: pull re-arms its attach socket once: bench scenario 12)
        self.rearm: Callable[[int], None] = functools.partial(self._epoll.modify, eventmask=_MASK)
        for n in range(self.size):
            threading.Thread(target=self._run, name=f"{THREAD_PREFIX}#{n + 1}", daemon=True).start()

    def add(self, fd: int, turn: Turn) -> None:
        """Read ``fd`` with ``turn`` whenever it is readable (first as soon as it is)."""
        with self._lock:
            self._turns[fd] = turn
        self._epoll.register(fd, _MASK)

    def switch(self, fd: int, turn: Turn) -> None:
        """From a turn of ``fd``: the next turns run ``turn`` (a hello that became a connection); the caller's
        turn returns True to re-arm."""
        with self._lock:
            self._turns[fd] = turn

    def remove(self, fd: int) -> None:
        """From a turn of ``fd`` (its last), before its socket is closed: forget it."""
        with self._lock:
            self._turns.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    def _run(self) -> None:
        poll, modify, turns = self._epoll.poll, self._epoll.modify, self._turns   # dict reads: atomic, no lock
        while True:  # for the life of the process; each pass runs one turn
            try:
                events = poll(-1, 1)
            except InterruptedError:
                continue
            for fd, _ in events:
                self.wakeups += 1
                turn = turns.get(fd)
                if turn is None:
                    continue
                try:
                    again = turn()
                except Exception:  # noqa: BLE001 - a turn cleans up after itself; this keeps the thread alive
                    log.exception("tcp reader: a connection's turn failed")
                    again = False
                if again:
                    try:
                        modify(fd, _MASK)
                    except (OSError, ValueError):   # removed meanwhile
                        pass


_reactor: Reactor | None = None
_reactor_lock = threading.Lock()


def reactor() -> Reactor:
    """The process's reactor, made on first use."""
    global _reactor
    with _reactor_lock:
        if _reactor is None:
            _reactor = Reactor()
        return _reactor
