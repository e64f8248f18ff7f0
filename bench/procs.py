"""Processes of a benchmark run: real ``datadistd`` daemons and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket (its pools in a private directory)
and waits until its health check says SERVING. ``Worker`` is a spawned process that runs the
functions of ``bench.ops`` on request, so a scenario drives a prompt worker and decoder workers
step by step, each with its own ``LLMDataDist``, exactly as real worker processes would; the
timed loops run inside the worker, so the pipe to the bench process is never on a clock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["Daemon", "Worker", "WorkerError", "free_port"]

ROOT = Path(__file__).resolve().parents[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the bench process dies, so no daemon outlives a crashed run."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Daemon:
    """One ``datadistd`` process; ``args`` are extra command-line flags, ``env`` extra variables."""

    def __init__(self, name: str, env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"datadist-bench-{name}-")
        self.socket = os.path.join(self.dir, "datadistd.sock")
        self.target = f"unix://{self.socket}"
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.env = {**os.environ, "DATADISTD_MEMORY_SHM_DIR": self.dir, "DATADISTD_DAEMON_LOG_LEVEL": "WARNING",
                    **(env or {})}
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0, attempts: int = 2) -> "Daemon":
        """Start and wait for SERVING; a daemon that dies while starting (a busy machine can refuse it
        a thread) is tried once more before giving up."""
        for attempt in range(attempts):  # bounded retries
            try:
                return self._start(timeout)
            except (RuntimeError, TimeoutError):
                if self.proc is not None and self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait(5)
                if self._log is not None:
                    self._log.close()
                    self._log = None
                if attempt + 1 == attempts:
                    shutil.rmtree(self.dir, ignore_errors=True)
                    raise
        return self

    def _start(self, timeout: float) -> "Daemon":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "datadistd", "--socket", self.socket, *self.args],
                                     env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # polls every 50 ms until SERVING, exit or the deadline
            if self.proc.poll() is not None:
                raise RuntimeError(f"datadistd {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket) and self._serving():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"datadistd {self.name} not serving after {timeout}s:\n{self.log()}")

    def _serving(self) -> bool:
        try:
            with grpc.insecure_channel(self.target) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                return resp.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.dir, ignore_errors=True)


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
