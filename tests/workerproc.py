"""A worker process driven over a pipe: one way for the tests and the bench to play real worker processes.

``WorkerProcess("tests.worker_ops", env)`` spawns a fresh interpreter (``multiprocessing`` "spawn":
nothing of the parent's state, no ``LLMDataDist`` singleton, no gRPC channel, is inherited), sets
``env``, imports the module and serves requests: ``w.call("op", *args)`` runs
``module.op(state, *args)`` in it, with one ``state`` dict kept across calls, and returns the result
or raises ``WorkerError`` carrying the exception's type name, message, status code (an
``LLMException``'s) and traceback. ``send`` / ``result`` split a call so several workers work at
once. Every wait has a timeout; ``close`` ends the process within a bounded time, by force if it
must, after running the module's ``on_exit`` function when one is named.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["WorkerError", "WorkerProcess"]


class WorkerError(Exception):
    """An operation raised in the worker: ``kind`` (exception type name), ``message``, ``status_code``
    (``int`` of an ``LLMException``'s status, else None) and ``tb`` (the worker-side traceback)."""

    def __init__(self, kind: str, message: str, status_code: int | None, tb: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.tb = tb


def _serve(conn: Connection, module: str, env: dict[str, str], path: str | None, on_exit: str | None) -> None:
    """The worker's main loop: one request per pass, until the pipe closes or ``None`` arrives."""
    os.environ.update(env)
    if path is not None:
        sys.path.insert(0, path)
    ops = importlib.import_module(module)
    state: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        name, args, kwargs = msg
        try:
            conn.send(("ok", getattr(ops, name)(state, *args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - shipped to the caller
            code = getattr(exc, "status_code", None)
            conn.send(("err", (type(exc).__name__, str(exc), int(code) if code is not None else None,
                               traceback.format_exc())))
    if on_exit is not None:
        getattr(ops, on_exit)(state)


class WorkerProcess:
    """A spawned process running functions of ``module`` on request (see the module docstring).

    ``path`` goes first on the worker's ``sys.path`` (where ``module`` lives); ``timeout`` is the
    default wait of ``call`` / ``result`` in seconds; ``on_exit`` names a ``module`` function run
    with the state when the worker is closed.
    """

    def __init__(self, module: str, env: Mapping[str, str] | None = None, *, path: str | None = None,
                 timeout: float = 60.0, on_exit: str | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.timeout = timeout
        self._sent = ""                                   # the operation ``result`` waits for
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, module, dict(env or {}), path, on_exit), daemon=True)
        self.proc.start()
        child.close()

    def send(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start ``name(state, *args, **kwargs)`` without waiting; collect it with ``result``."""
        self._sent = name
        self.conn.send((name, args, kwargs))

    def result(self, timeout: float | None = None) -> Any:
        """The answer of the operation sent last: TimeoutError after ``timeout`` (default: the worker's)."""
        wait = self.timeout if timeout is None else timeout
        if not self.conn.poll(wait):
            raise TimeoutError(f"worker op {self._sent} did not answer in {wait}s")
        status, payload = self.conn.recv()
        if status == "err":
            raise WorkerError(*payload)
        return payload

    def call(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """Run ``name(state, *args, **kwargs)`` in the worker and return its result."""
        self.send(name, *args, **kwargs)
        return self.result(timeout)

    def close(self, timeout: float = 15.0) -> None:
        """Ask the worker to end, wait ``timeout`` seconds, then kill it."""
        if self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()

    def kill(self) -> None:
        """End the worker at once (SIGKILL)."""
        self.proc.kill()
        self.proc.join(5)
