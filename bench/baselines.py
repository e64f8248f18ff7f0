"""Baselines measured in the same run as datadist: what the machine and Python can do without it.

* ``raw_stream`` - one TCP connection on loopback between two fresh Python processes, no
  framing: the sender ``sendmsg``es the request (gathered from its blocks, ``IOV_MAX`` views per
  call), the receiver reads either the whole request as one contiguous message
  (``recv_into(..., MSG_WAITALL)`` of ``RECV_SIZE`` bytes at a time, the fastest size here) or one
  ``recv_into`` per block into its own shuffled block table. Timed by the receiver from "go" to the
  last byte.
* ``RequestReply`` - the floor of a small transfer: one loopback TCP connection (``TCP_NODELAY``)
  between two fresh Python processes, a 16-byte request answered by a 4 KiB reply, timed per
  round trip by the asking process (the shape of a 1-block pull, without anything in between).
* ``iperf3`` - ``iperf3 -c 127.0.0.1 -n <bytes>`` against a one-off server, when installed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import socket
import subprocess
import time
from typing import Any

import numpy as np

from .procs import free_port

__all__ = ["RawStream", "raw_stream", "RequestReply", "iperf3", "iperf3_available", "RECV_SIZE"]

_IOV_MAX = 1024
#: receive size of the contiguous baseline: 256 KiB receives beat both smaller and larger ones on
#: loopback here (fewer calls vs. a copy that stays in cache while the sender refills the socket)
RECV_SIZE = 256 << 10


def _blocks(total: int, block: int, shuffled: bool, seed: int) -> tuple[int, np.ndarray]:
    """(buffer size, byte offsets of the request's blocks in list order) for a buffer of 2x the request."""
    n = total // block
    slots = 2 * n
    order = np.random.default_rng(seed).permutation(slots)[:n] if shuffled else np.arange(n)
    return slots * block, order.astype(np.int64) * block


def _sender(port: int, total: int, block: int, shuffled: bool, ready: Any) -> None:
    size, offsets = _blocks(total, block, shuffled, seed=1)
    buf = np.ones(size, np.uint8)
    mv = memoryview(buf)
    views = [mv[o:o + block] for o in offsets.tolist()]
    ready.set()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while s.recv(1) == b"g":  # one request per "go"; ends when the receiver closes
            i = 0
            while i < len(views):  # gathered writes, IOV_MAX views per call; partial sends resume
                batch = views[i:i + _IOV_MAX]
                sent = s.sendmsg(batch)
                k = 0
                while k < len(batch) and sent >= len(batch[k]):
                    sent -= len(batch[k])
                    k += 1
                if k < len(batch) and sent:
                    s.sendall(batch[k][sent:])
                    k += 1
                i += k


def _receiver(conn: Any, total: int, block: int, per_block: bool, shuffled: bool) -> None:
    size, offsets = _blocks(total, block, shuffled, seed=2)
    buf = np.zeros(size, np.uint8)
    buf.fill(1)
    mv = memoryview(buf)
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        conn.send(ls.getsockname()[1])
        sock, _ = ls.accept()
    waitall = socket.MSG_WAITALL
    if per_block:
        views = [mv[o:o + block] for o in offsets.tolist()]
    else:  # the whole message, read in the receive size this kernel likes best (see the module doc)
        views = [mv[i:min(i + RECV_SIZE, total)] for i in range(0, total, RECV_SIZE)]
    with sock:
        while conn.recv():  # one timed request per command; ends on a false command
            t0 = time.perf_counter()
            sock.sendall(b"g")
            for v in views:
                n = len(v)
                got = sock.recv_into(v, n, waitall)
                while got < n:  # MSG_WAITALL may still return short (signals); finish the piece
                    k = sock.recv_into(v[got:], n - got, waitall)
                    if k == 0:
                        raise ConnectionError("sender closed early")
                    got += k
            conn.send(time.perf_counter() - t0)


def _stop(conn: Any, stop: object, procs: tuple[Any, ...]) -> None:
    """Tell a baseline's processes to end (``stop`` on the pipe), then join them, killing what hangs (bounded)."""
    try:
        conn.send(stop)
    except OSError:
        pass
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(5)
    conn.close()


class RawStream:
    """A sender and a receiver process on one loopback TCP connection; ``once()`` times one request.

    Kept open so a scenario can alternate baseline and datadist repetitions (noise hits both alike).
    """

    def __init__(self, total: int, block: int, per_block: bool, shuffled: bool = True) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        ready = ctx.Event()
        self.recv = ctx.Process(target=_receiver, args=(child, total, block, per_block, shuffled), daemon=True)
        self.recv.start()
        if not self.conn.poll(60):
            raise TimeoutError("raw stream receiver did not start")
        port = self.conn.recv()
        self.send = ctx.Process(target=_sender, args=(port, total, block, shuffled, ready), daemon=True)
        self.send.start()
        ready.wait(60)

    def once(self, timeout: float = 120.0) -> float:
        self.conn.send(True)
        if not self.conn.poll(timeout):
            raise TimeoutError("raw stream request did not finish")
        return self.conn.recv()

    def close(self) -> None:
        _stop(self.conn, False, (self.recv, self.send))

    def __enter__(self) -> "RawStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answerer(port: int, request: int, reply: int) -> None:
    """The serving half of ``RequestReply``: answers every ``request``-byte message with ``reply`` bytes."""
    answer = bytes(reply)
    buf = bytearray(request)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            got = 0
            while got < request:
                n = s.recv_into(memoryview(buf)[got:], request - got)
                if n == 0:
                    return
                got += n
            s.sendall(answer)


def _asker(conn: Any, request: int, reply: int) -> None:
    """The timing half of ``RequestReply``: ``conn`` sends a call count, gets back seconds per round trip."""
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        conn.send(ls.getsockname()[1])
        sock, _ = ls.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ask = bytes(request)
    buf = bytearray(reply)
    mv = memoryview(buf)
    with sock:
        while True:
            calls = conn.recv()
            if not calls:
                return
            out = []
            for _ in range(calls):
                t0 = time.perf_counter()
                sock.sendall(ask)
                got = 0
                while got < reply:
                    n = sock.recv_into(mv[got:], reply - got)
                    if n == 0:
                        raise ConnectionError("the answering process went away")
                    got += n
                out.append(time.perf_counter() - t0)
            conn.send(out)


class RequestReply:
    """Two processes, one loopback connection; ``loop(calls)`` returns seconds per request/reply round trip."""

    def __init__(self, request: int = 16, reply: int = 4096) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.asker = ctx.Process(target=_asker, args=(child, request, reply), daemon=True)
        self.asker.start()
        if not self.conn.poll(60):
            raise TimeoutError("request/reply baseline did not start")
        port = self.conn.recv()
        self.answerer = ctx.Process(target=_answerer, args=(port, request, reply), daemon=True)
        self.answerer.start()

    def loop(self, calls: int, timeout: float = 120.0) -> list[float]:
        self.conn.send(calls)
        if not self.conn.poll(timeout):
            raise TimeoutError("request/reply baseline did not answer")
        return self.conn.recv()

    def close(self) -> None:
        _stop(self.conn, 0, (self.asker, self.answerer))


def raw_stream(total: int, block: int, per_block: bool, reps: int, shuffled: bool = True) -> list[float]:
    """Seconds per ``total``-byte request over one loopback TCP connection (see the module doc)."""
    with RawStream(total, block, per_block, shuffled) as rs:
        rs.once()  # warm-up
        return [rs.once() for _ in range(reps)]


def iperf3_available() -> bool:
    return shutil.which("iperf3") is not None


def iperf3(total: int, reps: int) -> list[float] | None:
    """Seconds per ``total`` bytes of ``iperf3`` on loopback (one stream), or ``None`` without iperf3."""
    exe = shutil.which("iperf3")
    if exe is None:
        return None
    out = []
    for _ in range(reps):
        port = free_port()
        server = subprocess.Popen([exe, "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            bps = None
            for _attempt in range(50):  # the server needs a moment to listen
                res = subprocess.run([exe, "-c", "127.0.0.1", "-p", str(port), "-n", str(total), "-J"],
                                     capture_output=True, text=True, timeout=120)
                try:
                    end = json.loads(res.stdout).get("end", {})
                    bps = (end.get("sum_received") or end.get("sum") or {}).get("bits_per_second")
                except ValueError:
                    bps = None
                if res.returncode == 0 and bps:
                    break
                time.sleep(0.05)
            if not bps:
                return None
            out.append(total * 8 / bps)
        finally:
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
    return out
