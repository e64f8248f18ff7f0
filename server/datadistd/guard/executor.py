"""The daemon's worker threads, shared fairly between principals, and one gate per engine.

``Threads``: the daemon's one executor (``Node.threads``). Every blocking job runs on it for a *principal*:
``uid N`` (the local work of a worker running as uid N: its copies, pulls, pushes, link setup) or ``peer A``
(the owner calls of the daemon at source address A, ``admission.source_key``, over any of its links). A
principal holds at most ``share`` threads at once; its further jobs wait for a turn on the event loop, holding
no thread, in the order they came. So one principal at its share -- a peer's owner calls that hang, a
tenant's engines all copying -- leaves the other threads to everybody else (no single shared pool
of threads that one principal can fill). Teardown that frees the others (a channel close, a transport stop,
receipts cancelled) runs unmetered: it must never wait behind the jobs it ends.

``Gate``: the jobs running in worker threads on one engine's memory, and a bounded wait until none does
(before the memory is freed). Every blocking job of an engine -- a local copy (``engine/engine.py``), a send, a
receipt wait or a transport stop of its links (``links/``) -- runs through ``Gate.run``, so finalize has one
place to wait: ``Gate.drained``.

Event-loop state only: ``Threads.run`` and ``Gate`` are called on the daemon's loop (docs/daemon.md,
"Concurrency").
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

__all__ = ["Gate", "Lane", "Threads", "UNMETERED", "EXECUTOR_THREADS"]

_T = TypeVar("_T")

#: threads of the daemon's one executor (``Node.threads``): every blocking job, of every engine and link
EXECUTOR_THREADS = 128

#: the principal of teardown jobs (close, stop, cancel): no share, they end the jobs others wait behind
UNMETERED = ""


class _Share:
    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        self.waiting: list[asyncio.Future[None]] = []


class Threads:
    """``workers`` threads; each principal runs at most ``share`` jobs at once (0: no share, one pool)."""

    def __init__(self, workers: int, share: int) -> None:
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="datadist-io")
        self.workers = workers
        self.share = min(share, workers) if share > 0 else 0
        self._shares: dict[str, _Share] = {}   # principals with a job running or waiting (forgotten when idle)

    def held(self, principal: str) -> tuple[int, int]:
        """Jobs of ``principal`` running and waiting for a turn (status, tests)."""
        entry = self._shares.get(principal)
        return (entry.running, len(entry.waiting)) if entry is not None else (0, 0)

    async def run(self, principal: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on a worker thread, once ``principal`` has fewer than ``share`` jobs running."""
        loop = asyncio.get_running_loop()
        if not self.share or principal == UNMETERED:
            return await loop.run_in_executor(self.executor, functools.partial(fn, *args))
        entry = self._shares.get(principal)
        if entry is None:
            entry = self._shares[principal] = _Share()
        if entry.running < self.share and not entry.waiting:
            entry.running += 1
        else:
            turn: asyncio.Future[None] = loop.create_future()
            entry.waiting.append(turn)
            try:
                await turn              # handed over by a job of this principal that ended (``_done``)
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._done(principal, entry)    # handed a turn just as it was cancelled: pass it on
                else:
                    entry.waiting.remove(turn)
                    self._forget_if_idle(principal, entry)
                raise
        try:
            return await loop.run_in_executor(self.executor, functools.partial(fn, *args))
        finally:
            self._done(principal, entry)

    def _done(self, principal: str, entry: _Share) -> None:
        """A job of ``principal`` ended: its thread slot goes to its longest-waiting job, else it is freed."""
        while entry.waiting:
            turn = entry.waiting.pop(0)
            if not turn.done():
                turn.set_result(None)
                return
        entry.running -= 1
        self._forget_if_idle(principal, entry)

    def _forget_if_idle(self, principal: str, entry: _Share) -> None:
        if entry.running == 0 and not entry.waiting and self._shares.get(principal) is entry:
            del self._shares[principal]

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Lane:
    """The jobs of one principal on the daemon's threads (an engine's own work runs on its worker's lane)."""

    threads: Threads
    principal: str

    def of(self, principal: str) -> "Lane":
        """The lane of another principal on the same threads (a peer's owner calls, teardown)."""
        return Lane(self.threads, principal)

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await self.threads.run(self.principal, fn, *args)


class Gate:
    def __init__(self) -> None:
        self.busy = 0
        self._idle: asyncio.Event | None = None

    async def run(self, lane: Lane, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on ``lane``, counted while it runs or waits for its turn."""
        self.busy += 1
        try:
            return await lane.run(fn, *args)
        finally:
            self.busy -= 1
            if self.busy == 0 and self._idle is not None:
                self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """Wait until no job runs, at most ``timeout`` seconds; whether that happened."""
        if self.busy == 0:
            return True
        if self._idle is None or self._idle.is_set():
            self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
