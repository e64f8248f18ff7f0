"""Baselines measured in the same run as datadist: what the machine and Python can do without it.

* ``raw_stream`` - one TCP connection on loopback between two fresh Python processes, no
  framing: the sender ``sendmsg``es the request (gathered from its blocks, ``IOV_MAX`` views per
  call), the receiver reads either the whole request as one contiguous message
  (``recv_into(..., MSG_WAITALL)`` of ``RECV_SIZE`` bytes at a time, the fastest size here) or one
  ``recv_into`` per block into its own shuffled block table. Timed by the receiver from "go" to the
  last byte.
* ``RequestReply`` - the floor of a small transfer: one loopback TCP connection (``TCP_NODELAY``)
  between two fresh Python processes, a 16-byte request answered by a 4 KiB reply, timed per
  round trip by the asking process (the shape of a 1-block pull, without anything in between);
  ``pipelined`` keeps many requests in flight on that connection (a request sent for every reply
  received), the floor of many small pulls at once.
* ``iperf3`` - ``iperf3 -c 127.0.0.1 -n <bytes>`` against a one-off server, when installed.
* ``BareNixl`` - NIXL driven directly, as an application that uses it well would: two fresh processes,
  one agent each (UCX, the same UCX_TLS / UCX_NET_DEVICES as the daemons), both buffers registered
  once, descriptor lists of every block prepared once (``prep_xfer_dlist``), one prepped WRITE of
  the request's shuffled blocks by index with a notification; timed from the post to the target
  seeing the notification (the moment the bytes are known to have landed).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import socket
import subprocess
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from .procs import free_port

__all__ = ["RawStream", "raw_stream", "RequestReply", "BareNixl", "iperf3", "iperf3_available", "RECV_SIZE"]

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


def _nixl_agent(name: str, env: dict[str, str]) -> tuple[Any, Any]:
    import os
    os.environ.update(env)
    from datadistd.transport.nixl.ucx import load_api
    api = load_api()
    # as the daemons run it: NIXL's progress thread off (it spins a core per agent), progress made by the calls
    return api, api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))


def _nap(checks: int) -> None:
    """The daemons' polling discipline: spin 200 checks, then sleep a little more each time (0.2 ms at most)."""
    if checks > 200:
        time.sleep(min(0.0002, 1e-6 * (checks - 200)))


def _nixl_buffer(size: int, memfd: bool, fill: int) -> Any:
    """The buffer of a bare NIXL side: numpy's own (anonymous; numpy asks for huge pages) or, like the
    daemon's pools, a shared memfd mapping (4 KiB pages unless the host enables shmem huge pages)."""
    if not memfd:
        return np.full(size, fill, np.uint8)
    import mmap
    import os
    fd = os.memfd_create("bare-nixl")
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)   # as the pools do
    buf = np.frombuffer(mm, np.uint8)
    buf[:] = fill
    return buf


def _nixl_target(conn: Any, total: int, block: int, env: dict[str, str], memfd: bool, read: bool = False) -> None:
    size, _ = _blocks(total, block, True, seed=2)
    buf = _nixl_buffer(size, memfd, 0)
    _, agent = _nixl_agent("bare-target", env)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    if read:                    # the initiator reads: progress, as an owner daemon's does, while a request runs
        active, checks = False, 0
        while True:
            if conn.poll(0 if active else 0.005):
                command = conn.recv()
                if not command:
                    return
                active, checks = command == "go", 0
                continue
            agent.get_new_notifs()
            if active:
                checks += 1
                _nap(min(checks, 400))
    idle = 0
    while True:                 # progress (the initiator's connection, then the bytes) while no request runs
        if conn.poll(0.005 if idle > 20 else 0):
            if not conn.recv():
                return
            break
        agent.get_new_notifs()
        idle += 1
    while True:                 # one request per command: wait for its notification, say when it came
        checks = 0
        while True:
            notes = agent.get_new_notifs()
            if notes.get("bare-initiator") or notes.get(b"bare-initiator"):
                break
            checks += 1
            _nap(checks)
        conn.send(time.perf_counter())
        while not conn.poll(0.005):
            agent.get_new_notifs()
        if not conn.recv():
            return


def _nixl_initiator(conn: Any, total: int, block: int, env: dict[str, str], prepped: bool, memfd: bool,
                    read: bool = False) -> None:
    size, src_off = _blocks(total, block, True, seed=1)
    _, dst_off = _blocks(total, block, True, seed=2)
    buf = _nixl_buffer(size, memfd, 1)
    _, agent = _nixl_agent("bare-initiator", env)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    metadata, remote_base = conn.recv()
    peer = agent.add_remote_agent(metadata)
    slots = np.arange(size // block, dtype=np.uint64) * block
    zeros = np.zeros(len(slots), dtype=np.uint64)
    lengths = np.full(len(slots), block, dtype=np.uint64)
    local = agent.prep_xfer_dlist("", np.column_stack([buf.ctypes.data + slots, lengths, zeros]), "DRAM")
    remote = agent.prep_xfer_dlist(peer, np.column_stack([remote_base + slots, lengths, zeros]), "DRAM")
    src_idx, dst_idx = (src_off // block).astype(np.int32), (dst_off // block).astype(np.int32)
    conn.send("ready")
    while conn.recv():
        t0 = time.perf_counter()
        if read:        # this side's blocks dst_idx <- the target's blocks src_idx
            handle = agent.make_prepped_xfer("READ", local, dst_idx, remote, src_idx, b"")
        elif prepped:
            handle = agent.make_prepped_xfer("WRITE", local, src_idx, remote, dst_idx, b"bare")
        else:   # descriptor lists made per request, as datadist does (its blocks change per request)
            rows = np.column_stack([lengths[:len(src_idx)], zeros[:len(src_idx)]])
            handle = agent.initialize_xfer(
                "WRITE", agent.get_xfer_descs(np.column_stack([buf.ctypes.data + src_off.astype(np.uint64), rows]),
                                              "DRAM"),
                agent.get_xfer_descs(np.column_stack([remote_base + dst_off.astype(np.uint64), rows]), "DRAM"),
                peer, b"bare")
        state = agent.transfer(handle)
        checks = 0
        while state == "PROC":
            checks += 1
            _nap(checks)
            state = agent.check_xfer_state(handle)
        t1 = time.perf_counter()
        handle.release()
        conn.send((t0, state, t1))


class BareNixl:
    """Two processes, one NIXL agent each, moving a request's shuffled blocks by one prepped WRITE (``read``: one
    prepped READ of the target's blocks by the initiator, timed from the post to its DONE, where the bytes land)."""

    def __init__(self, total: int, block: int, env: dict[str, str], prepped: bool = True, memfd: bool = False,
                 read: bool = False) -> None:
        ctx = mp.get_context("spawn")
        self.read = read
        self.tconn, tchild = ctx.Pipe()
        self.iconn, ichild = ctx.Pipe()
        self.target = ctx.Process(target=_nixl_target, args=(tchild, total, block, env, memfd, read), daemon=True)
        self.initiator = ctx.Process(target=_nixl_initiator, args=(ichild, total, block, env, prepped, memfd, read),
                                     daemon=True)
        self.target.start()
        self.initiator.start()
        if not self.tconn.poll(60):
            raise TimeoutError("bare NIXL target did not start")
        self.iconn.send(self.tconn.recv())
        if not self.iconn.poll(60) or self.iconn.recv() != "ready":
            raise TimeoutError("bare NIXL initiator did not start")

    def once(self, timeout: float = 120.0) -> float:
        if self.read:                # the target only makes progress (UCX over TCP needs it); the READ ends at DONE
            self.tconn.send("go")
            self.iconn.send(True)
            if not self.iconn.poll(timeout):
                raise TimeoutError("bare NIXL READ did not finish")
            t0, state, t1 = self.iconn.recv()
            self.tconn.send("idle")
            if state != "DONE":
                raise RuntimeError(f"bare NIXL READ ended in state {state}")
            return t1 - t0
        self.tconn.send(True)
        self.iconn.send(True)
        if not self.iconn.poll(timeout) or not self.tconn.poll(timeout):
            raise TimeoutError("bare NIXL request did not finish")
        t0, state, _ = self.iconn.recv()
        landed = self.tconn.recv()
        if state != "DONE":
            raise RuntimeError(f"bare NIXL WRITE ended in state {state}")
        return landed - t0

    def close(self) -> None:
        _stop(self.tconn, False, (self.target,))
        _stop(self.iconn, False, (self.initiator,))


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
    """The timing half of ``RequestReply``: ``conn`` sends a call count, gets back seconds per round trip; or
    ``(calls, depth)``, gets back (wall seconds, seconds per round trip) of ``calls`` round trips kept
    ``depth`` deep on the connection (a request sent for every reply received)."""
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        conn.send(ls.getsockname()[1])
        sock, _ = ls.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ask = bytes(request)
    buf = bytearray(reply)
    mv = memoryview(buf)

    def answer() -> None:
        got = 0
        while got < reply:
            n = sock.recv_into(mv[got:], reply - got)
            if n == 0:
                raise ConnectionError("the answering process went away")
            got += n

    with sock:
        while True:
            cmd = conn.recv()
            if not cmd:
                return
            if isinstance(cmd, tuple):
                conn.send(_pipelined(sock, ask, answer, *cmd))
                continue
            out = []
            for _ in range(cmd):
                t0 = time.perf_counter()
                sock.sendall(ask)
                answer()
                out.append(time.perf_counter() - t0)
            conn.send(out)


def _pipelined(sock: socket.socket, ask: bytes, answer: Callable[[], None], calls: int,
               depth: int) -> tuple[float, list[float]]:
    """``calls`` round trips with ``depth`` in flight on ``sock``: (wall seconds, seconds per round trip)."""
    sent: deque[float] = deque()
    out = []
    t_start = time.perf_counter()
    for _ in range(min(depth, calls)):
        sent.append(time.perf_counter())
        sock.sendall(ask)
    while len(out) < calls:
        answer()
        out.append(time.perf_counter() - sent.popleft())
        if len(out) + len(sent) < calls:
            sent.append(time.perf_counter())
            sock.sendall(ask)
    return time.perf_counter() - t_start, out


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
        return self._ask(calls, timeout)

    def pipelined(self, calls: int, depth: int, timeout: float = 120.0) -> tuple[float, list[float]]:
        """``calls`` round trips kept ``depth`` deep on the one connection: (wall seconds, seconds per round trip)."""
        return self._ask((calls, depth), timeout)

    def _ask(self, cmd: Any, timeout: float) -> Any:
        self.conn.send(cmd)
        if not self.conn.poll(timeout):
            raise TimeoutError("request/reply baseline did not answer")
        return self.conn.recv()

    @property
    def pids(self) -> list[int]:
        """The asking and the answering process."""
        return [self.asker.pid, self.answerer.pid]

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
