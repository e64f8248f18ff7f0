"""One gate per engine: the jobs running in worker threads on its memory, and a bounded wait until none
does (before the memory is freed).

Every blocking job of an engine -- a local copy (``engine.py``), a send, a receipt wait or a transport
stop of its links (``links/``) -- runs through ``Gate.run`` on the daemon's one executor
(``Node.executor``, injected), so finalize has one place to wait: ``Gate.drained``.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from typing import Any, Callable, TypeVar

__all__ = ["Gate"]

_T = TypeVar("_T")


class Gate:
    def __init__(self) -> None:
        self.busy = 0
        self._idle: asyncio.Event | None = None

    async def run(self, executor: Executor | None, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in ``executor``, counted while it runs."""
        self.busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))
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
