"""Test harness: real ``datadistd`` processes and remote-controlled worker processes.

``Daemon`` starts ``python -m datadistd`` on a private socket and waits for health SERVING
(``datadistd.tools.daemonproc``, shared with the bench and the demo).
``Worker`` is a spawned process that runs functions of ``tests.worker_ops`` on request, so a
test can drive a prompt worker and a decoder worker step by step, each with its own
``LLMDataDist`` singleton, exactly as two real worker processes would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from datadistd.tools.daemonproc import DaemonProcess, free_port

__all__ = ["ROOT", "Daemon", "Worker", "WorkerError", "free_port"]

ROOT = Path(__file__).resolve().parents[1]


class Daemon(DaemonProcess):
    """A test daemon (``ip netns exec`` in ``netns`` if given); its directory outlives ``stop``, so it can restart."""

    def __init__(self, name: str = "d", env: dict[str, str] | None = None, args: list[str] | None = None,
                 shm_dir: str | None = None, netns: str | None = None) -> None:
        super().__init__(name, env, args or (), shm_dir=shm_dir, keep_dir=True, dir_prefix="datadist-test-",
                         command=["ip", "netns", "exec", netns] if netns else ())


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
