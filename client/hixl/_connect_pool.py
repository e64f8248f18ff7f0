"""Private: ``ConnectAsync`` / ``DisconnectAsync``'s pool, as HIXL's ``ConnectPoolExecutor``
(hicann/hixl src/hixl/engine/connect_pool_executor.cc, hixl_impl.cc).

A bounded queue of tasks (``task_queue_capacity``, default 128: ``RESOURCE_EXHAUSTED`` when full; ``FAILED`` once shut
down) served by ``thread_num`` worker threads (default 2), at most one task per remote engine at a time, in submission
order otherwise. Each remote engine has a status: CONNECT_PENDING / DISCONNECT_PENDING when submitted, CONNECTING /
DISCONNECTING when a worker takes it, then CONNECTED or CONNECT_FAILED (a connect; ALREADY_CONNECTED counts as
connected) or none (NOT_CONNECT: a disconnect, whatever its result). A status the user's later call made pending is
not overwritten by an older task's progress (HIXL's SetStatus rule).

Threads: the worker threads run the tasks (``connect`` / ``disconnect`` of the engine, which may block up to the
timeout); they start with the first task. Every field is guarded by the one condition's lock.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Deque, Dict, List, Set, Tuple

from datadist.hixl import ALREADY_CONNECTED, FAILED, RESOURCE_EXHAUSTED, SUCCESS

__all__ = ["ConnectPool", "NOT_CONNECT", "CONNECT_PENDING", "CONNECTING", "CONNECTED", "CONNECT_FAILED",
           "DISCONNECT_PENDING", "DISCONNECTING"]

# hixl_types.h AsyncConnectStatus
NOT_CONNECT, CONNECT_PENDING, CONNECTING, CONNECTED, CONNECT_FAILED, DISCONNECT_PENDING, DISCONNECTING = range(7)

#: (is_connect, remote engine, timeout in ms)
_Task = Tuple[bool, str, int]


class ConnectPool:
    """The pool of one engine: ``connect(remote, timeout_ms)`` / ``disconnect(remote, timeout_ms)`` return a status."""

    def __init__(self, threads: int, capacity: int, connect: Callable[[str, int], int],
                 disconnect: Callable[[str, int], int]) -> None:
        self._threads = threads
        self._capacity = capacity
        self._connect = connect
        self._disconnect = disconnect
        self._cond = threading.Condition()
        self._tasks: Deque[_Task] = deque()
        self._doing: Set[str] = set()
        self._statuses: Dict[str, int] = {}
        self._workers: List[threading.Thread] = []
        self._running = True

    def submit(self, remote: str, timeout_ms: int, is_connect: bool) -> int:
        """Queue a connect (or disconnect) of ``remote``: SUCCESS, RESOURCE_EXHAUSTED (the queue is full) or FAILED
        (the pool is shut down)."""
        with self._cond:
            if not self._running:
                return FAILED
            if len(self._tasks) >= self._capacity:
                return RESOURCE_EXHAUSTED
            self._set(remote, CONNECT_PENDING if is_connect else DISCONNECT_PENDING)
            self._tasks.append((is_connect, remote, timeout_ms))
            if len(self._workers) < self._threads:
                worker = threading.Thread(target=self._work, name=f"hixl-connect-{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                worker.start()
            self._cond.notify()
        return SUCCESS

    def status(self, remote: str) -> int:
        """The status of ``remote`` (NOT_CONNECT when it has none)."""
        with self._cond:
            return self._statuses.get(remote, NOT_CONNECT)

    def statuses(self) -> Dict[str, int]:
        """Every remote engine's status that is not NOT_CONNECT."""
        with self._cond:
            return dict(self._statuses)

    def shutdown(self) -> None:
        """Stop taking tasks, drop the queued ones and wait for the running ones."""
        with self._cond:
            self._running = False
            self._tasks.clear()
            self._cond.notify_all()
            workers, self._workers = self._workers, []
        for worker in workers:
            if worker is not threading.current_thread():
                worker.join()

    def _set(self, remote: str, status: int) -> None:
        """HIXL's SetStatus (lock held): a task's progress never overwrites the pending state of a later call."""
        current = self._statuses.get(remote)
        if status in (CONNECTING, CONNECTED, CONNECT_FAILED) and current == DISCONNECT_PENDING:
            return
        if status in (DISCONNECTING, NOT_CONNECT) and current == CONNECT_PENDING:
            return
        if status == NOT_CONNECT:
            self._statuses.pop(remote, None)
        else:
            self._statuses[remote] = status

    def _next(self) -> _Task | None:
        """The first queued task whose remote has none running (lock held)."""
        for task in self._tasks:
            if task[1] not in self._doing:
                self._tasks.remove(task)
                return task
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                task = self._next() if self._running else None
                while self._running and task is None:
                    self._cond.wait()
                    task = self._next() if self._running else None
                if task is None:
                    return
                is_connect, remote, timeout_ms = task
                self._doing.add(remote)
                self._set(remote, CONNECTING if is_connect else DISCONNECTING)
            try:
                if is_connect:
                    ret = self._connect(remote, timeout_ms)
                    result = CONNECTED if ret in (SUCCESS, ALREADY_CONNECTED) else CONNECT_FAILED
                else:
                    self._disconnect(remote, timeout_ms)
                    result = NOT_CONNECT
            except Exception:   # noqa: BLE001 - a bug of ours: the connect failed, the pool goes on
                result = CONNECT_FAILED if is_connect else NOT_CONNECT
            with self._cond:
                self._set(remote, result)
                self._doing.discard(remote)
                self._cond.notify_all()
