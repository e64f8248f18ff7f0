"""The attach connections are read by the process's TCP reactor threads (``api/attach.py``), not the event loop:
a small pull or push is served while the loop is blocked; a worker that floods fast pulls gets each answered once,
one that closes mid-transfer leaves nothing behind; back-pressure holds at ``MAX_TRANSFERS_IN_FLIGHT``; many
of connections add no thread. Real daemons on real sockets: the decoder's daemon of the first test runs in this
process (its app on a loop in a thread of the test), so the test can block that loop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from datadist import fastframe as ff
from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2, common_pb2, datadist_pb2
from datadistd.api.attach import MAX_TRANSFERS_IN_FLIGHT
from datadistd.node.sessions import MAX_SESSIONS_PER_UID
from datadistd.ops.config import load_config
from datadistd.process.app import DaemonApp
from tests.harness import fd_targets, free_port, metrics_address, series_sum

from .test_local import Worker, attach_ask

pytestmark = pytest.mark.integration

P, D = 1, 2
BLOCKS, ROW = 48, 1024           # the prompt's cache: 48 blocks of 1 KiB (one uint8 tensor)
DESC = common_pb2.CacheDesc(num_tensors=1, shape=[BLOCKS, ROW], data_type=4, placement=common_pb2.PLACEMENT_HOST)
OPTIONS = {"llm.EnableCacheManager": "1", "llm.MemPoolConfig": '{"memory_size": 1048576}',
           "llm.HostMemPoolConfig": '{"memory_size": 1048576}', "llm.SyncKvCacheWaitTime": "30000"}


class InProcessDaemon:
    """A datadistd app on an event loop in a thread of this process (as embedded mode runs one): ``block`` holds
    that loop until ``release``."""

    def __init__(self, tmp: str) -> None:
        sock_dir = tempfile.mkdtemp(dir=tmp)
        os.chmod(sock_dir, 0o700)
        config = load_config(env={}, overrides={"daemon.socket": os.path.join(sock_dir, "d.sock"),
                                                "daemon.socket_mode": 0o600})
        self.app = DaemonApp(config)
        self.loop = asyncio.new_event_loop()
        started: Future[None] = Future()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self.app.start())
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                started.set_exception(exc)
                return
            started.set_result(None)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="test-daemon-loop", daemon=True)
        self.thread.start()
        started.result(timeout=30)
        self.gate = threading.Event()

    @property
    def target(self) -> str:
        return self.app.target

    def block(self) -> None:
        """The loop runs a callback that waits for ``release`` (at most a minute): nothing else runs on it."""
        holding = threading.Event()

        def hold() -> None:
            holding.set()
            self.gate.wait(60)

        self.gate.clear()
        self.loop.call_soon_threadsafe(hold)
        assert holding.wait(10)

    def release(self) -> None:
        self.gate.set()

    def stop(self) -> None:
        self.release()
        asyncio.run_coroutine_threadsafe(self.app.stop(grace=1.0), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _prompt(daemon_factory, worker_factory):  # noqa: ANN001, ANN202
    """A prompt daemon and worker serving "kv" (blocks filled) at BlocksCacheKey(P, 0); its port."""
    dp = daemon_factory("p")
    port = free_port()
    prompt = worker_factory(dp)
    prompt.call("init", "PROMPT", P, listen=f"127.0.0.1:{port}", remote_cache_accessible=True, mem_pool=8 << 20)
    prompt.call("allocate", "kv", 1, (BLOCKS, ROW), dtype="uint8", blocks=True, model_id=0)
    prompt.call("fill", "kv", 1)
    return dp, prompt, port


def test_small_pulls_and_pushes_are_served_while_the_event_loop_is_blocked(daemon_factory, worker_factory, tmp_path):
    """With the decoder daemon's event loop blocked, a warm 1-block pull and push still complete: the reactor
    thread that reads the attach frame starts them, the reader thread that reads the owner's reply answers."""
    _, prompt, port = _prompt(daemon_factory, worker_factory)
    dd = InProcessDaemon(str(tmp_path))
    try:
        decoder = worker_factory(DATADIST_DAEMON=dd.target)
        decoder.call("init", "DECODER", D, sync_kv_timeout=30000, mem_pool=8 << 20, remote_cache_accessible=True)
        decoder.call("allocate", "kv", 1, (BLOCKS, ROW), dtype="uint8", blocks=True)
        decoder.call("zero", "kv")
        assert decoder.call("link", P, "127.0.0.1", port) == (0, [0])
        decoder.call("pull_blocks", P, "kv", [0], [0])      # warm: the pull view published on the loop
        want = prompt.call("rows", "kv")
        dd.block()
        try:
            decoder.call("pull_blocks", P, "kv", [3], [5], timeout=40)
            decoder.call("push_blocks", P, "kv", [5], [7], timeout=40)
            served_blocked = not dd.gate.is_set()
        finally:
            dd.release()
        assert served_blocked, "the transfers waited for the event loop"
        got = decoder.call("rows", "kv")
        assert np.array_equal(got[0][5], want[0][3]) and np.array_equal(got[0][0], want[0][0])
        assert np.array_equal(prompt.call("rows", "kv")[0][7], want[0][3])
        assert dd.app.attach is not None
        conns = list(dd.app.attach._conns.values())   # the decoder worker's, open
        assert conns
    finally:
        dd.stop()
    # the daemon's stop shut the connections down; the reactor turn each one's end wakes closed its socket
    assert _until(lambda: all(c.sock.fileno() < 0 for c in conns)), "a connection stayed open after the stop"


# ---- a worker speaking the frames itself -------------------------------------------------------------------------


class RawSession:
    """An attach connection of this test (hello by hand) whose engine -- inited, given a cache and linked over gRPC
    with the connection's capability -- it pulls into with raw frames."""

    def __init__(self, daemon: Any, port: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(30)
        self.sock.connect(daemon.socket + ".attach")
        welcome = attach_ask(self.sock, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
            protocol_version=4)).SerializeToString(), []).welcome
        self.grpc = Worker(daemon, capability=welcome.capability)
        self.engine = self.grpc("Init", datadist_pb2.InitRequest(cluster_id=D, role=common_pb2.ROLE_DECODER,
                                                                 options=OPTIONS)).engine_id
        self.cache = self.grpc("AllocateCache", datadist_pb2.AllocateCacheRequest(
            engine_id=self.engine, desc=DESC, is_blocks=True)).cache_id
        linked = self.grpc("LinkClusters", datadist_pb2.LinkClustersRequest(
            engine_id=self.engine, timeout_ms=5000, clusters=[datadist_pb2.ClusterLink(
                remote_cluster_id=P, local_ip_info=[datadist_pb2.IpPort(ip="127.0.0.1")],
                remote_ip_info=[datadist_pb2.IpPort(ip="127.0.0.1", port=port)])]))
        assert (linked.status, list(linked.statuses)) == (0, [0]), linked

    def pull(self, rid: int, src: int, dst: int) -> bytes:
        return ff.encode_request(rid, ff.TransferFrame(ff.PULL, self.engine, ff.KIND_BLOCKS, ff.KEY_BLOCKS,
                                                       (P, 0, 0, 0), self.cache, (src,), (dst,), timeout_ms=30000))

    def replies(self, n: int) -> list[ff.FrameReply]:
        return [ff.decode_reply(self.sock.recv(1 << 16)) for _ in range(n)]

    def close(self) -> None:
        self.sock.close()
        self.grpc.close()


def _until(what, deadline: float = 30.0):  # noqa: ANN001, ANN202
    end = time.monotonic() + deadline
    while True:
        got = what()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.02)


def _sockets(pid: int) -> int:
    return sum(1 for target in fd_targets(pid) if target.startswith("socket:"))


def _each_answered_once(session: RawSession, n: int, step: int, read_after_s: float = 0.0) -> None:
    """``n`` fast pulls pipelined on ``session`` from a thread (pull ``rid`` into block ``rid * step``), their
    replies read (from ``read_after_s`` on): every pull answered exactly once, with success."""
    sender = threading.Thread(target=lambda: [session.sock.send(session.pull(rid, rid % BLOCKS, (rid * step) % BLOCKS))
                                              for rid in range(1, n + 1)])
    sender.start()
    time.sleep(read_after_s)
    got = session.replies(n)
    sender.join(30)
    assert not sender.is_alive()
    assert sorted(r.request_id for r in got) == list(range(1, n + 1))
    assert {r.status for r in got} == {0}
    session.sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        session.sock.recv(1 << 16)          # nothing answered twice


def test_a_flood_of_fast_pulls_is_answered_once_each_and_a_close_mid_transfer_leaves_nothing(daemon_factory,
                                                                                              worker_factory):
    """A worker queues 2,000 fast pulls while reading its replies: every one is answered exactly once, in whatever
    order they end. Another queues 2,000 without reading and closes its connection (or is dropped first, its
    replies filling its buffer, the daemon stops reading it): the daemon drops the session (its socket closed),
    nothing stays in flight, and it serves on."""
    _, _, port = _prompt(daemon_factory, worker_factory)
    dd = daemon_factory("d", args=["--metrics", "127.0.0.1:0"])
    metrics = metrics_address(dd)
    n = 2000
    flood = RawSession(dd, port)
    try:
        _each_answered_once(flood, n, 7)
    finally:
        flood.close()
    baseline = _until(lambda: _sockets(dd.proc.pid) if not series_sum(
        metrics, "datadist_transfers_in_flight", 'op="pull"') else 0)
    quitter = RawSession(dd, port)
    quitter.sock.settimeout(2)
    try:
        for rid in range(1, n + 1):
            quitter.sock.send(quitter.pull(rid, rid % BLOCKS, rid % BLOCKS))
    except TimeoutError:   # it never reads its replies: the daemon stops reading its requests (back-pressure)
        pass
    quitter.close()
    assert _until(lambda: series_sum(metrics, "datadist_transfers_in_flight", 'op="pull"') == 0)
    assert _until(lambda: _sockets(dd.proc.pid) <= baseline), "the closed connection's socket stayed open"
    assert dd.proc.poll() is None
    again = RawSession(dd, port)
    try:
        again.sock.send(again.pull(7, 3, 4))
        assert [(r.request_id, r.status) for r in again.replies(1)] == [(7, 0)]
    finally:
        again.close()


def test_a_worker_that_reads_its_replies_late_gets_every_one(daemon_factory, worker_factory):
    """A worker pipelines 2,000 fast pulls and reads no reply for a while: the replies its socket cannot take wait
    in the daemon (counted in flight, so it stops reading requests at ``MAX_TRANSFERS_IN_FLIGHT``) -- the worker is
    not dropped for reading slowly; once it reads, every pull is answered exactly once."""
    _, _, port = _prompt(daemon_factory, worker_factory)
    dd = daemon_factory("d")
    n = 2000
    late = RawSession(dd, port)
    try:
        # read late: the replies so far fill the socket; the daemon holds the rest
        _each_answered_once(late, n, 3, read_after_s=1.5)
    finally:
        late.close()
    assert dd.proc.poll() is None


def test_back_pressure_stops_reading_at_the_in_flight_cap_and_resumes(daemon_factory, worker_factory):
    """With the owner stopped (SIGSTOP), a worker's fast pulls stay in flight: the daemon takes
    ``MAX_TRANSFERS_IN_FLIGHT`` of them and reads no more; once the owner runs again every pull is answered once."""
    dp, _, port = _prompt(daemon_factory, worker_factory)
    dd = daemon_factory("d", args=["--metrics", "127.0.0.1:0"])
    metrics = metrics_address(dd)
    n = MAX_TRANSFERS_IN_FLIGHT + 64
    raw = RawSession(dd, port)
    try:
        in_flight = lambda: series_sum(metrics, "datadist_transfers_in_flight", 'op="pull"')  # noqa: E731
        os.kill(dp.proc.pid, signal.SIGSTOP)
        try:
            sender = threading.Thread(target=lambda: [raw.sock.send(raw.pull(rid, rid % BLOCKS, rid % BLOCKS))
                                                      for rid in range(1, n + 1)])
            sender.start()
            assert _until(lambda: in_flight() >= MAX_TRANSFERS_IN_FLIGHT)
            time.sleep(0.3)                   # room for a reader that ignores the cap to read on
            assert in_flight() == MAX_TRANSFERS_IN_FLIGHT
        finally:
            os.kill(dp.proc.pid, signal.SIGCONT)
        got = raw.replies(n)
        sender.join(30)
        assert sorted(r.request_id for r in got) == list(range(1, n + 1))
        assert {r.status for r in got} == {0}
        assert _until(lambda: in_flight() == 0)
    finally:
        raw.close()


def test_many_connections_add_no_thread(daemon_factory):
    """As many attach connections as one uid may hold (``MAX_SESSIONS_PER_UID``, each greeted): the daemon's thread
    count does not move -- the reactor's pool reads them all."""
    dd = daemon_factory("d")
    first = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    first.settimeout(30)
    first.connect(dd.socket + ".attach")
    hello = attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(protocol_version=4)).SerializeToString()
    assert attach_ask(first, hello, []).welcome.capability
    threads = len(os.listdir(f"/proc/{dd.proc.pid}/task"))
    conns = [first]
    try:
        for _ in range(MAX_SESSIONS_PER_UID - 1):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(dd.socket + ".attach")    # blocking: waits for room in the listen backlog
            s.settimeout(30)
            s.send(hello)
            conns.append(s)
        for s in conns[1:]:
            reply = attach_pb2.AttachReply.FromString(s.recv(1 << 16))
            assert reply.welcome.capability and reply.status == LLMStatusCode.LLM_SUCCESS
        assert len(os.listdir(f"/proc/{dd.proc.pid}/task")) == threads
    finally:
        for s in conns:
            s.close()
    assert dd.proc.poll() is None


def test_the_loop_hands_back_what_it_read_in_order(daemon_factory):
    """Messages the loop must handle (a hello, a frame before it, protobuf calls) and fast-path candidates queued
    behind them on one connection are answered in the order sent: the reactor reads nothing more of a connection
    while the loop holds one of its messages."""
    dd = daemon_factory("d")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(30)
    s.connect(dd.socket + ".attach")
    try:
        pull = ff.TransferFrame(ff.PULL, 5, ff.KIND_BLOCKS, ff.KEY_BLOCKS, (P, 0, 0, 0), 1, (0,), (0,))
        s.send(ff.encode_request(1, pull))                                   # before hello: refused
        s.send(attach_pb2.AttachRequest(request_id=2, hello=attach_pb2.AttachHello(
            protocol_version=4)).SerializeToString())
        s.send(ff.encode_request(3, pull))                                   # after it: not its engine
        first = ff.decode_reply(s.recv(1 << 16))
        assert (first.request_id, first.status) == (1, LLMStatusCode.LLM_PARAM_INVALID) and "hello" in first.message
        assert attach_pb2.AttachReply.FromString(s.recv(1 << 16)).request_id == 2
        third = ff.decode_reply(s.recv(1 << 16))
        assert (third.request_id, third.status) == (3, LLMStatusCode.LLM_ENGINE_FINALIZED)
    finally:
        s.close()
