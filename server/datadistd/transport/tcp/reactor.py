"""``Reactor``: the reader threads of every TCP socket the daemon reads off its event loop -- a small pool, each thread
with its own epoll and its own share of the sockets.

Two kinds of registration:

* **A data connection** (``add_stream``, or ``switch`` from a hello's turn) belongs to one thread for its life: it is
  registered edge-triggered (``EPOLLET``) in that thread's epoll -- the shard, picked round robin -- and its *turn*
  reads it until the socket is drained (``DataConn.turn``). Nothing re-arms it: the kernel reports it again when its
  next bytes come, so a frame costs one ``epoll_wait`` and the turn's receive calls, no ``epoll_ctl``. A turn that
  stops with bytes left (``_TURN_FRAMES``: the others' go) returns True and the thread has the kernel report it
  again (one ``modify``, which re-checks readiness: at the back of the ready list). No other thread ever reads the
  socket, so its frames are read, and handed to its channel's control handler, in order and on that thread.
* **One-shot** (``add``, ``rearm``, ``remove``: the attach connections of ``api.attach``, and a newcomer's
  hello): ``EPOLLONESHOT`` in the first thread's epoll; a readable socket runs its turn once, and is not reported
  again until the turn returns True (re-armed here) or someone calls ``rearm`` (the epoll's own ``modify`` with the
  mask bound: no Python frame per re-arm -- a small pull re-arms its attach socket once: bench scenario 12). So a
  one-shot socket's turns never overlap, and a paused one (back-pressure) wakes nobody.

With more than one thread the first reads the one-shot sockets only and the others share the data connections, so
a worker's request never waits behind a data frame's payload. A turn may block briefly (a handler, a frame's payload
still on its way): the sockets of the other threads are served meanwhile; those of its own thread wait.

Threads: ``size`` of them (bounded by the CPU count, not by the connections: ``_pool_size``), made with the
reactor -- when the daemon's first transport is made -- so a link adds none. An idle thread sleeps in ``epoll_wait``
without a timeout: an idle connection wakes nobody. A thread touches only the turns of its own epoll (its table,
written by whoever registers a socket, read by it alone) and the counter ``wakeups``. The pool lives as long as the
process (daemon threads; nothing to stop): the connections of every transport of the daemon share it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import select
import threading
from typing import Callable

log = logging.getLogger("datadistd.transport.tcp")

#: what a turn returns. One-shot: True to be woken again at the next bytes, False when it re-arms itself, paused, or
#: the socket is done. A data connection's: True when it stopped with bytes left (run it again), False when it read
#: the socket dry or the connection ended (it then left the reactor itself, ``remove``)
Turn = Callable[[], bool]

_ONESHOT = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT
_EDGE = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
#: the peer's end (or an error) reported with the bytes: a data connection's turn that read the socket "dry" by a short
#: receive runs once more, so it meets the end -- the end that came with the last bytes makes no edge of its own
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
_EVENTS = 32   # events one epoll_wait takes (all of its own thread's sockets)
#: thread names of the pool (tests and the bench find them by it)
THREAD_PREFIX = "datadist-tcp-read"


def _pool_size() -> int:
    """Reader threads at most: two per usable CPU, at least 4 (a handler may block briefly), at most 32."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(4, min(32, 2 * cpus))


class _Shard:
    """One thread's epoll and the turns of the sockets registered in it, with each one's event mask."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.turns: dict[int, tuple[Turn, int]] = {}   # written under ``Reactor._lock``; dict reads are atomic


class Reactor:
    """The reader threads, an epoll each; see the module doc."""

    def __init__(self, size: int = 0) -> None:
        self.size = size or _pool_size()
        self._shards = [_Shard() for _ in range(self.size)]
        self._lock = threading.Lock()
        self._home: dict[int, _Shard] = {}      # fd -> the shard it is registered in
        # data connections: every thread but the first (which reads the one-shot sockets), round robin
        self._next = itertools.cycle(self._shards[1:] or self._shards)
        self.wakeups = 0          # turns run (each one a socket reported readable, or run again)
        #: ``rearm(fd)``: wake a turn of the one-shot ``fd`` again at its next bytes (at once if some wait) -- for a
        #: socket whose last turn returned False without ``remove``, reading paused, not done -- from any thread, never
        #: while a turn of it runs (``api.attach``'s back-pressure and its messages handed to the event loop)
        self.rearm: Callable[[int], None] = functools.partial(self._shards[0].epoll.modify, eventmask=_ONESHOT)
        for n, shard in enumerate(self._shards):
            threading.Thread(target=self._run, args=(shard,), name=f"{THREAD_PREFIX}#{n + 1}", daemon=True).start()

    def add(self, fd: int, turn: Turn) -> None:
        """Read the one-shot ``fd`` with ``turn`` whenever it is readable (first as soon as it is)."""
        self._register(self._shards[0], fd, turn, _ONESHOT)

    def add_stream(self, fd: int, turn: Turn) -> None:
        """Read the data connection ``fd`` with ``turn`` on its own thread, edge-triggered, for its life."""
        self._register(next(self._next), fd, turn, _EDGE)

    def switch(self, fd: int, turn: Turn) -> None:
        """From the turn of the one-shot ``fd`` (a hello that became a data connection), which then returns False:
        ``fd`` is a data connection read by ``turn`` from now on (``add_stream``), on its own thread -- which may run
        it before this returns, so the caller touches the socket no more."""
        with self._lock:
            shard = self._home.pop(fd)
            shard.turns.pop(fd, None)
        shard.epoll.unregister(fd)
        self.add_stream(fd, turn)

    def remove(self, fd: int) -> None:
        """From a turn of ``fd`` (its last), or while it has no event outstanding, before its socket is closed:
        forget it."""
        with self._lock:
            shard = self._home.pop(fd, None)
            if shard is None:
                return
            shard.turns.pop(fd, None)
        try:
            shard.epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    def _register(self, shard: _Shard, fd: int, turn: Turn, mask: int) -> None:
        with self._lock:
            self._home[fd] = shard
            shard.turns[fd] = (turn, mask)
        shard.epoll.register(fd, mask)

    def _run(self, shard: _Shard) -> None:
        poll, modify, turns = shard.epoll.poll, shard.epoll.modify, shard.turns
        while True:  # for the life of the process; each pass runs the turns of one epoll_wait
            try:
                events = poll(-1, _EVENTS)
            except InterruptedError:
                continue
            for fd, ev in events:
                self.wakeups += 1
                entry = turns.get(fd)
                if entry is None:
                    continue
                try:
                    again = entry[0]()
                    if not again and ev & _HANGUP and entry[1] == _EDGE and fd in turns:
                        again = entry[0]()   # the end came with the last bytes: read on to it (no edge will come)
                except Exception:  # noqa: BLE001 - a turn cleans up after itself; this keeps the thread alive
                    log.exception("tcp reader: a connection's turn failed")
                    again = False
                if again:   # one-shot: re-armed; edge: bytes left, reported again behind the others ready
                    try:
                        modify(fd, entry[1])
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
