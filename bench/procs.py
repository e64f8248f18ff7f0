"""Processes of a benchmark run: real ``datadistd`` daemons and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket (its pools in a private directory)
and waits until its health check says SERVING (``tests.daemonproc``, shared with the
tests and the demo). ``Worker`` is a spawned process that runs the functions of ``bench.ops`` on
request, so a scenario drives a prompt worker and decoder workers step by step, each with its own
``LLMDataDist``, exactly as real worker processes would; the timed loops run inside the worker, so
the pipe to the bench process is never on a clock.
"""

from __future__ import annotations

from pathlib import Path

from tests.daemonproc import DaemonProcess, free_port
from tests.workerproc import WorkerError, WorkerProcess

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


class Worker(WorkerProcess):
    """A worker process; ``w.call("op", ...)`` runs ``bench.ops.op(state, ...)`` in it (600 s by default) and
    ``bench.ops.shutdown`` finalizes its ``LLMDataDist`` when it is closed."""

    def __init__(self, daemon: Daemon | None = None, env: dict[str, str] | None = None) -> None:
        env = dict(env or {})
        if daemon is not None:
            env["DATADIST_DAEMON"] = daemon.target
        super().__init__("bench.ops", env, path=str(ROOT), timeout=600.0, on_exit="shutdown")
