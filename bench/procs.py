"""Processes of a benchmark run: real ``datadistd`` daemons and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket (its pools in a private directory)
and waits until its health check says SERVING (``tests.daemonproc``, shared with the
tests and the demo). ``Worker`` is a spawned process that runs the functions of ``bench.ops`` on
request, so a scenario drives a prompt worker and decoder workers step by step, each with its own
``LLMDataDist``, exactly as real worker processes would; the timed loops run inside the worker, so
the pipe to the bench process is never on a clock.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.daemonproc import DaemonProcess, free_port
from tests.workerproc import WorkerError, WorkerProcess

__all__ = ["Daemon", "Worker", "WorkerError", "Pinned", "TICKS", "cpu_between", "cpu_seconds", "free_port",
           "main_thread_cpu_seconds", "thread_cpu"]

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


#: clock ticks per second of /proc/<pid>/stat
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> list[float]:
    """CPU seconds (user + system, every thread) each process in ``pids`` has used so far, from
    ``/proc/<pid>/stat``: the kernel counts in clock ticks (``1 / SC_CLK_TCK``, 10 ms here), so a delta
    is exact to a tick; loops measured with it run long enough for that to be small."""
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # the name in () may hold spaces
        out.append((int(fields[11]) + int(fields[12])) / TICKS)
    return out


def main_thread_cpu_seconds(pids: list[int]) -> list[float]:
    """CPU seconds each process's main thread has run, from ``/proc/<pid>/schedstat`` (nanoseconds): exact,
    for single-threaded processes (the baselines') whose loops are too short for ``cpu_seconds``' ticks."""
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/schedstat") as f:
            out.append(int(f.read().split()[0]) / 1e9)
    return out


def thread_cpu(pid: int) -> dict[int, int]:
    """Nanoseconds each live thread of ``pid`` has run (``/proc/<pid>/task/<tid>/schedstat``: exact, where
    ``cpu_seconds`` counts 10 ms ticks); ``cpu_between`` turns two of these into the CPU used between them."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):   # the thread ended meanwhile
            continue
    return out


def cpu_between(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds run between two ``thread_cpu`` snapshots by the threads alive at the second (a thread that
    ended between them is left out: an idle window's threads live on)."""
    return sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e9


class Pinned:
    """``with Pinned(pids, cpu):`` every thread of every process in ``pids`` runs on ``cpu`` alone (threads started
    inside inherit it); on leaving, every thread of them runs where this process may run. The pinned pass of an
    unpinned run (scenario 3): the same processes, pinned after the fact, as ``--pin`` pins a whole run."""

    def __init__(self, pids: list[int], cpu: int) -> None:
        self.pids, self.cpu = pids, cpu
        self.everywhere = os.sched_getaffinity(0)

    def _set(self, cpus: set[int]) -> None:
        for pid in self.pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    os.sched_setaffinity(int(tid), cpus)
                except ProcessLookupError:   # a thread that just ended
                    pass

    def __enter__(self) -> "Pinned":
        self._set({self.cpu})
        return self

    def __exit__(self, *exc: object) -> None:
        self._set(self.everywhere)
