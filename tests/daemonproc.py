"""A ``datadistd`` child process, started and waited on until it serves: one way for the demo, bench and tests.

``DaemonProcess`` gives a daemon a private directory (socket, log and, unless told otherwise, its
shared-memory pools), runs ``python -m datadistd --socket ...`` in it, waits with a deadline until
the gRPC health check says SERVING, and stops it. ``free_port`` hands out free TCP ports.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from datadistd.process.cli import PARENT_PID_ENV

__all__ = ["DaemonProcess", "free_port", "port_pool", "xdist_share"]

_Self = TypeVar("_Self", bound="DaemonProcess")
_HANDED_OUT: set[int] = set()
_PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_rng = random.Random()


def _ephemeral_range(path: str = _PORT_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (``bind(0)`` and outgoing connections draw from it)."""
    try:
        low, high = (int(v) for v in Path(path).read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def port_pool(ephemeral: tuple[int, int], share: tuple[int, int] = (0, 1)) -> list[int]:
    """Ports ``free_port`` draws from: 10000-65535 outside the ``ephemeral`` range (inclusive bounds), and of
    those the ``share`` ``(index, count)``: the ports ``p`` with ``p % count == index``."""
    low, high = ephemeral
    index, count = share
    return [p for p in range(10000, 65536) if not low <= p <= high and p % count == index]


def xdist_share(env: Mapping[str, str]) -> tuple[int, int]:
    """This test process's ``(index, count)`` among pytest-xdist's workers (``gw<index>`` of
    ``PYTEST_XDIST_WORKER_COUNT``; ``(0, 1)`` outside xdist): parallel workers draw ports from disjoint shares, so
    one never hands out a port the other handed out and has not bound yet."""
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0):
        return 0, 1
    return int(worker[2:]) % int(count), int(count)


@functools.cache
def _pool() -> list[int]:
    return port_pool(_ephemeral_range(), xdist_share(os.environ))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, not handed out before by this process (bounded retries).

    The port lies outside the kernel's ephemeral range: a port that ``bind(0)`` picked and released
    can be given by the kernel to any other ``bind(0)`` or outgoing connection before its user binds
    it (a daemon's data-plane listener took a worker's listen port that way under a 32-worker soak);
    ports outside that range are never assigned by the kernel, only by whoever names them.
    """
    pool = _pool()
    for _ in range(100):
        if pool:
            port = _rng.choice(pool)
            if port in _HANDED_OUT:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
        else:  # the whole range is ephemeral: the kernel's choice is all there is
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port in _HANDED_OUT:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no fresh free port after 100 tries")


#: set in a daemon's environment by ``die_with_parent``: the daemon asks the kernel for SIGTERM when its
#: parent dies (``datadistd.process.cli``). Done by the daemon after exec, not by a ``preexec_fn`` between fork and
#: exec: code there can deadlock on a lock another thread of the parent held at fork (a bench run hung
#: for 9 minutes in ``Popen`` that way, its child never reaching exec).


class DaemonProcess:
    """One ``datadistd`` on a private socket; ``args`` are extra command-line flags, ``env`` extra variables.

    ``command`` runs before the interpreter (``["ip", "netns", "exec", ns]``), ``shm_dir`` replaces
    the private directory as the pool directory, ``die_with_parent`` ends the daemon with this
    process, and ``keep_dir`` keeps the private directory after ``stop`` (so the daemon can start again).
    """

    def __init__(self, name: str = "d", env: Mapping[str, str] | None = None, args: Sequence[str] = (), *,
                 shm_dir: str | None = None, command: Sequence[str] = (), die_with_parent: bool = False,
                 keep_dir: bool = False, dir_prefix: str = "datadist-") -> None:
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"{dir_prefix}{name}-")
        self.socket = os.path.join(self.dir, "datadistd.sock")
        self.target = f"unix://{self.socket}"
        #: the whole-node view (every engine): the admin socket, mode 0600 (this test process is the daemon's user)
        self.admin_target = f"unix://{self.socket}.admin"
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.shm_dir = shm_dir or self.dir
        self.env = {**os.environ, "DATADISTD_MEMORY_SHM_DIR": self.shm_dir, **(env or {})}
        self.args = list(args)
        self.command = list(command)
        self.proc: subprocess.Popen[bytes] | None = None
        self._die_with_parent = die_with_parent
        self._keep_dir = keep_dir
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self: _Self, timeout: float = 20.0, attempts: int = 1) -> _Self:
        """Start and wait for SERVING: RuntimeError if the daemon exits, TimeoutError after ``timeout``
        seconds, both with the log tail. A failed daemon is killed and, up to ``attempts`` times in all,
        started again (a busy machine can refuse it a thread); after the last failure its directory
        is removed (the error has the log tail)."""
        for attempt in range(1, attempts + 1):  # bounded retries
            try:
                return self._start(timeout)
            except (RuntimeError, TimeoutError):
                if attempt == attempts:
                    self.discard(signal.SIGKILL, 5.0)
                    raise
                self._end(signal.SIGKILL, 5.0)
        raise ValueError(f"attempts must be at least 1, not {attempts}")

    @classmethod
    def start_all(cls, daemons: Sequence[_Self], timeout: float = 20.0) -> list[_Self]:
        """Start several daemons at once (their start-ups overlap) and wait until each serves, ``timeout``
        seconds for all. If one fails, all are killed and their directories removed (as ``start`` does
        after its last attempt), and its RuntimeError or TimeoutError is raised with its log tail."""
        deadline = time.monotonic() + timeout
        try:
            for d in daemons:
                d._spawn()
            for d in daemons:
                d._await_serving(deadline, timeout)
        except (RuntimeError, TimeoutError):
            for d in daemons:
                if d.proc is not None:
                    d.discard(signal.SIGKILL, 5.0)
            raise
        return list(daemons)

    def _start(self: _Self, timeout: float) -> _Self:
        self._spawn()
        self._await_serving(time.monotonic() + timeout, timeout)
        return self

    def _spawn(self) -> None:
        self._log = open(self.log_path, "ab")
        env = {**self.env, PARENT_PID_ENV: str(os.getpid())} if self._die_with_parent else self.env
        self.proc = subprocess.Popen([*self.command, sys.executable, "-m", "datadistd", "--socket", self.socket,
                                      *self.args], env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def _await_serving(self, deadline: float, timeout: float) -> None:
        """Poll until SERVING; ``timeout`` (the whole wait ``deadline`` ends) is what the error names."""
        assert self.proc is not None
        while time.monotonic() < deadline:  # polls every 50 ms until SERVING, exit or the deadline
            if self.proc.poll() is not None:
                raise RuntimeError(f"datadistd {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket) and self.serving():
                return
            time.sleep(0.05)
        raise TimeoutError(f"datadistd {self.name} not serving after {timeout}s:\n{self.log()}")

    def serving(self) -> bool:
        """Whether the health check answers SERVING now."""
        try:
            with grpc.insecure_channel(self.target) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                return resp.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def log(self) -> str:
        """The tail of the daemon's log ("" when there is none)."""
        try:
            return Path(self.log_path).read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Send ``sig`` and wait ``timeout`` seconds, then SIGKILL; the exit status (None if never started).
        Removes the private directory unless ``keep_dir``."""
        if not self._keep_dir:
            return self.discard(sig, timeout)
        return self._end(sig, timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def discard(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """``stop`` and remove the private directory whatever ``keep_dir`` says (the end of its use)."""
        returncode = self._end(sig, timeout)
        shutil.rmtree(self.dir, ignore_errors=True)
        return returncode

    def _end(self, sig: int, timeout: float) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if self.proc is None else self.proc.returncode
