"""Processes of a benchmark run: real ``datadistd`` daemons and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket (its pools in a private directory)
and waits until its health check says SERVING (``datadistd.tools.daemonproc``, shared with the
tests and the demo). ``Worker`` is a spawned process that runs the functions of ``bench.ops`` on
request, so a scenario drives a prompt worker and decoder workers step by step, each with its own
``LLMDataDist``, exactly as real worker processes would; the timed loops run inside the worker, so
the pipe to the bench process is never on a clock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from datadistd.tools.daemonproc import DaemonProcess, free_port

__all__ = ["Daemon", "Worker", "WorkerError", "free_port"]

ROOT = Path(__file__).resolve().parents[1]


class Daemon(DaemonProcess):
    """A bench daemon: logs at WARNING, dies with the bench process, and its directory goes with ``stop``."""

    def __init__(self, name: str, env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        super().__init__(name, {"DATADISTD_DAEMON_LOG_LEVEL": "WARNING", **(env or {})}, args or (),
                         die_with_parent=True, dir_prefix="datadist-bench-")

    def start(self, timeout: float = 30.0, attempts: int = 2) -> Daemon:
        """Start and wait for SERVING; a daemon that dies while starting is tried once more by default."""
        return super().start(timeout, attempts)


def _worker_main(conn: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import importlib

    ops = importlib.import_module("bench.ops")
    state: dict[str, Any] = {}
    while True:  # one request per pass; ends when the bench closes the pipe or sends None
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        name, args, kwargs = msg
        try:
            conn.send(("ok", getattr(ops, name)(state, *args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - shipped to the bench
            conn.send(("err", (type(exc).__name__, str(exc), traceback.format_exc())))
    ops.shutdown(state)


class WorkerError(Exception):
    def __init__(self, kind: str, message: str, tb: str) -> None:
        super().__init__(f"{kind}: {message}\n{tb}")
        self.kind = kind


class Worker:
    """A worker process; ``w.call("op", ...)`` runs ``bench.ops.op(state, ...)`` in it and returns the result."""

    def __init__(self, daemon: Daemon | None = None, env: dict[str, str] | None = None) -> None:
        env = dict(env or {})
        if daemon is not None:
            env["DATADIST_DAEMON"] = daemon.target
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, env), daemon=True)
        self.proc.start()
        child.close()

    def send(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start an op without waiting (several workers run at once); collect it with ``result``."""
        self.conn.send((name, args, kwargs))

    def result(self, timeout: float = 600.0) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"worker did not answer in {timeout}s")
        status, payload = self.conn.recv()
        if status == "err":
            raise WorkerError(*payload)
        return payload

    def call(self, name: str, *args: Any, timeout: float = 600.0, **kwargs: Any) -> Any:
        self.send(name, *args, **kwargs)
        return self.result(timeout)

    def close(self, timeout: float = 15.0) -> None:
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
