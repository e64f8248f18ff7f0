"""A hostile fake datadistd: what a worker's client must survive from whatever listens on its daemon's socket.

``python -m tests.hostile_daemon --socket S --mode MODE --report R`` serves the DataDist gRPC service on ``S`` and
the attach protocol (``datadist/v1/attach.proto``) on ``S.attach``, well enough for a client's ``init`` and
``allocate``, and misbehaves by ``MODE``:

* ``honest``: a sealed pool and tensors as the description makes them (the control: a client takes it);
* ``unsealed``: the pool's memfd is not sealed, and the fake shrinks it to nothing once the worker said where it
  mapped the tensors (``SetWorkerAddrs``): a worker that mapped it faults (SIGBUS) at its next touch;
* ``past_end``: a tensor whose offset and length run past the pool's end;
* ``short``: the last tensor ends at the pool's end but is one page where the description makes more: a worker that
  trusts it hands the daemon the memory beside the pool (the cache's blocks twin, C++) or writes past the pool.
* ``protocol_3``: an honest fake whose welcome says attach protocol 3 (a daemon that takes no continuation frames):
  a client must fail its ``init`` there, not send its transfers another way;
* ``--attach-to A``: no attach socket of its own but a symlink to a real daemon's ``A``: the worker's memory would go
  to the real daemon, its gRPC calls (and the capability they carry) to the fake;

Every request it gets is a line of JSON in ``R`` (``{"event": ..., ...}``): ``hello``, ``export_pool``,
``import_memory`` (with how many descriptors and bytes came), ``grpc`` (the method). It prints ``READY`` when both
sockets listen and runs until SIGTERM (``start``/``stop`` run it from a test, ``events`` reads the report). It
creates the socket's directory (mode 0755) when missing -- as another user squatting a victim's default
``/tmp/datadist-<uid>/`` would.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import Any, Callable, List

import grpc

from datadist.dtypes import ITEMSIZE, DataType
from datadist.v1 import attach_pb2, common_pb2, datadist_pb2, datadist_pb2_grpc

MODES = ("honest", "unsealed", "past_end", "short", "protocol_3")
PAGE = 4096
_UCRED = struct.Struct("3i")


class Report:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self._lock = threading.Lock()

    def __call__(self, event: str, **kw: Any) -> None:
        with self._lock:
            self._file.write(json.dumps({"event": event, **kw}) + "\n")


class Pool:
    """The one pool: a memfd of ``size`` bytes, sealed against size changes unless the mode says otherwise."""

    def __init__(self, size: int, sealed: bool) -> None:
        self.size = size
        self.fd = os.memfd_create("hostile-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        if sealed:
            import fcntl

            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)


class Servicer(datadist_pb2_grpc.DataDistServicer):
    def __init__(self, mode: str, pool: Pool, report: Report) -> None:
        self.mode, self.pool, self.report = mode, pool, report
        self.next_cache = 1

    def _seen(self, name: str, context: grpc.ServicerContext) -> None:  # noqa: ARG002 - one signature
        self.report("grpc", method=name)

    def Init(self, request, context):  # noqa: ANN001, ANN201, N802 - the generated servicer's names
        self._seen("Init", context)
        return datadist_pb2.InitResponse(engine_id=1, daemon_version="hostile")

    def Finalize(self, request, context):  # noqa: ANN001, ANN201, N802
        self._seen("Finalize", context)
        return common_pb2.Empty()

    def AllocateCache(self, request, context):  # noqa: ANN001, ANN201, N802
        self._seen("AllocateCache", context)
        size = _tensor_bytes(request.desc)
        info = datadist_pb2.CacheInfo(cache_id=self.next_cache, desc=request.desc, is_blocks=request.is_blocks)
        self.next_cache += 1
        n = request.desc.num_tensors
        for i in range(n):
            offset, length = i * size, size
            last = i == n - 1
            if last and self.mode == "past_end":
                offset = self.pool.size - size // 2
            elif last and self.mode == "short":
                offset, length = self.pool.size - PAGE, PAGE
            info.tensors.add(pool="hostile-pool", file_offset=offset, length=length)
        return info

    def SetWorkerAddrs(self, request, context):  # noqa: ANN001, ANN201, N802
        self._seen("SetWorkerAddrs", context)
        if self.mode == "unsealed":
            os.ftruncate(self.pool.fd, 0)      # the worker mapped it: pull the pages from under it
            self.report("shrunk")
        return common_pb2.Empty()

    def RegisterCache(self, request, context):  # noqa: ANN001, ANN201, N802
        self._seen("RegisterCache", context)
        info = datadist_pb2.CacheInfo(cache_id=self.next_cache, desc=request.desc, is_blocks=request.is_blocks)
        self.next_cache += 1
        return info

    def _empty(name: str) -> Callable[..., Any]:  # noqa: N805 - a factory used in the class body
        def call(self, request, context):  # noqa: ANN001, ANN202
            self._seen(name, context)
            return common_pb2.Empty()
        return call

    DeallocateCache = _empty("DeallocateCache")
    UnregisterCache = _empty("UnregisterCache")


def _tensor_bytes(desc: common_pb2.CacheDesc) -> int:
    n = ITEMSIZE[DataType(desc.data_type)]
    for d in desc.shape:
        n *= d
    return n


def serve_attach(path: str, mode: str, pool: Pool, report: Report) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(16)

    def one(conn: socket.socket) -> None:
        pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        memory_id = 0
        with conn:
            while True:
                try:
                    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 16)
                except OSError:
                    return
                if not data:
                    return
                req = attach_pb2.AttachRequest()
                try:
                    req.ParseFromString(data)
                except Exception:  # noqa: BLE001 - a transfer frame: not answered
                    report("frame", size=len(data))
                    continue
                reply = attach_pb2.AttachReply(request_id=req.request_id)
                send: List[int] = []
                kind = req.WhichOneof("msg")
                if kind == "hello":
                    report("hello", uid=uid)
                    reply.welcome.CopyFrom(attach_pb2.Welcome(
                        capability=os.urandom(32), uid=uid, gid=gid, pid=pid, daemon_version="hostile",
                        protocol_version=3 if mode == "protocol_3" else 4, memory_backend="host"))
                elif kind == "export_pool":
                    report("export_pool", pool=req.export_pool.pool)
                    reply.pool.size = pool.size
                    send = [pool.fd]
                elif kind == "import_memory":
                    got = sum(os.fstat(fd).st_size for fd in fds)
                    report("import_memory", fds=len(fds), bytes=int(req.import_memory.length), file_bytes=got)
                    memory_id += 1
                    reply.imported.memory_id = memory_id
                else:
                    report(kind or "unknown")
                for fd in fds:
                    os.close(fd)
                socket.send_fds(conn, [reply.SerializeToString()], send)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def argv(socket_path: str, mode: str, report: str, *more: str) -> List[str]:
    """The fake's arguments after its script's path (``more``: e.g. ``--attach-to``)."""
    return ["--socket", socket_path, "--mode", mode, "--report", report, *more]


def wait_ready(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until the fake started as ``proc`` (stdout a pipe) says READY; RuntimeError with its output when it exits
    first or ``timeout`` passes."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            proc.kill()
            raise RuntimeError(f"the hostile daemon did not start within {timeout:g} s")
        line = proc.stdout.readline()
        if line.strip() == b"READY":
            return
        if not line:
            raise RuntimeError(f"the hostile daemon exited at start ({proc.wait(10)})")


def start(socket_path: str, mode: str, report: str) -> subprocess.Popen[bytes]:
    """The fake as a process of this user, serving once this returns; ``stop`` it."""
    proc = subprocess.Popen([sys.executable, __file__, *argv(socket_path, mode, report)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    wait_ready(proc)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def events(report: str) -> List[dict]:
    """What the fake was sent (the report's lines), [] when nothing."""
    try:
        with open(report) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--mode", choices=MODES, default="honest")
    parser.add_argument("--report", required=True)
    parser.add_argument("--pool-size", type=int, default=1 << 20)
    parser.add_argument("--attach-to", help="no attach socket of its own: S.attach is a symlink to this one (a real "
                        "daemon's), and the fake gets only the worker's gRPC calls")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.socket)), mode=0o755, exist_ok=True)
    report = Report(args.report)
    pool = Pool(args.pool_size, sealed=args.mode != "unsealed")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    datadist_pb2_grpc.add_DataDistServicer_to_server(Servicer(args.mode, pool, report), server)
    server.add_insecure_port(f"unix:{args.socket}")
    server.start()
    os.chmod(args.socket, 0o666)
    if args.attach_to:
        os.symlink(args.attach_to, args.socket + ".attach")
        listener = None
    else:
        listener = serve_attach(args.socket + ".attach", args.mode, pool, report)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("READY", flush=True)
    stop.wait()
    if listener is not None:
        listener.close()
    server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
