"""``FairLock``: a data connection's send lock, handed to waiters in arrival order."""

from __future__ import annotations

import collections
import threading


class FairLock:
    """A lock with a timeout that is handed to waiters in arrival order.

    ``threading.Lock`` lets the releasing thread take it straight back, so a sender streaming a
    huge transfer could starve a small one on the same socket; with this lock they alternate per chunk.

    Its state is public for the flat send paths (``TcpChannel.try_control``), which take and give it inline -- C calls
    only -- in the uncontended case: under ``mutex``, it is free when ``locked`` is False (then set it); giving it
    back hands it to the first of ``waiters`` if there is one (``release``), else clears ``locked``.
    """

    __slots__ = ("mutex", "locked", "waiters")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.locked = False
        self.waiters: collections.deque[threading.Event] = collections.deque()

    def acquire(self, timeout: float) -> bool:
        with self.mutex:
            if not self.locked:
                self.locked = True
                return True
            turn = threading.Event()
            self.waiters.append(turn)
        turn.wait(max(0.0, timeout))
        with self.mutex:
            if turn.is_set():  # handed over (possibly just as we timed out): ours now
                return True
            self.waiters.remove(turn)
            return False

    def release(self) -> None:
        with self.mutex:
            if self.waiters:
                self.waiters.popleft().set()  # stays locked: ownership passes to the next waiter
            else:
                self.locked = False
