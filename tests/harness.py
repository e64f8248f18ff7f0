"""Test harness: real ``datadistd`` processes and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket and waits for health SERVING.
``Worker`` is a spawned process that runs functions of ``tests.worker_ops`` on request, so a
test can drive a prompt worker and a decoder worker step by step, each with its own
``LLMDataDist`` singleton, exactly as two real worker processes would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
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

ROOT = Path(__file__).resolve().parents[1]


_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and not handed out before by this process (bounded retries)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh free port after 100 tries")


class Daemon:
    def __init__(self, name: str = "d", env: dict[str, str] | None = None, args: list[str] | None = None,
                 shm_dir: str | None = None, netns: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"datadist-test-{name}-")
        self.socket = os.path.join(self.dir, "datadistd.sock")
        self.target = f"unix://{self.socket}"
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.shm_dir = shm_dir or self.dir
        self.env = {**os.environ, "DATADISTD_MEMORY_SHM_DIR": self.shm_dir, **(env or {})}
        self.args = args or []
        self.prefix = ["ip", "netns", "exec", netns] if netns else []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> "Daemon":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "datadistd", "--socket", self.socket,
                                      *self.args],
                                     env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"datadistd exited with {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket) and self.serving():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"datadistd not serving after {timeout}s:\n{self.log()}")

    def serving(self) -> bool:
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

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def _worker_main(conn: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import importlib

    ops = importlib.import_module("tests.worker_ops")
    state: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        name, args, kwargs = msg
        try:
            result = getattr(ops, name)(state, *args, **kwargs)
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - shipped to the test
            code = getattr(exc, "status_code", None)
            conn.send(("err", (type(exc).__name__, str(exc), int(code) if code is not None else None,
                               traceback.format_exc())))


class WorkerError(Exception):
    def __init__(self, kind: str, message: str, status_code: int | None, tb: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.tb = tb


class Worker:
    """A worker process; ``w.call("op", ...)`` runs ``tests.worker_ops.op(state, ...)`` in it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, env or {}), daemon=True)
        self.proc.start()

    def call(self, name: str, *args: Any, timeout: float = 60.0, **kwargs: Any) -> Any:
        self.conn.send((name, args, kwargs))
        if not self.conn.poll(timeout):
            raise TimeoutError(f"worker op {name} did not answer in {timeout}s")
        status, payload = self.conn.recv()
        if status == "err":
            raise WorkerError(*payload)
        return payload

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

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
