"""Shared helpers of the reliability tests: daemon probes, a test-controlled peer, network namespaces.

Nothing here changes product behaviour. ``PeerAgent`` plays a peer daemon that knows the shared
secret (by default what a daemon of this user with no secret configured proves: the per-user one, which the
test daemons, started with this environment, read too): it handshakes with an engine's listener,
opens the authenticated data channel with the derived token and then sends hand-made owner calls
(``ownerwire`` CALL frames on that channel, well-formed or not), so a test can check what the owner does with
hostile or out-of-range requests.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import grpc
import numpy as np

from datadist.v1 import datadist_pb2, datadist_pb2_grpc, peer_pb2, peer_pb2_grpc
from llm_datadist import _memory
from llm_datadist._attach import AttachClient
from tests.harness import fd_targets

STATUS_KEY = "datadist-status-code"
DEV_SECRET = b"datadist-development-secret"


def unconfigured_secret() -> bytes:
    """The secret a daemon of this user proves when none is configured (``datadistd.ops.peersecret``)."""
    from datadistd.ops.config import PeerSection
    from datadistd.ops.peersecret import peer_secret

    return peer_secret(PeerSection()).value

IS_ROOT = os.geteuid() == 0
HAVE_NETNS = IS_ROOT and shutil.which("ip") is not None and shutil.which("tc") is not None


# ---- daemon probes --------------------------------------------------------------------------------

def attachment(daemon: Any) -> AttachClient:
    """This test process as a worker of ``daemon``: one attach connection per daemon, kept while it runs."""
    att = getattr(daemon, "_test_attachment", None)
    if att is None:
        att = daemon._test_attachment = AttachClient(daemon.target)
    return att


class _Capability(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the worker's capability to every call, as llm_datadist does."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def _with(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), *self.metadata])

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._with(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._with(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # noqa: ANN001, ANN201
        return continuation(self._with(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # noqa: ANN001, ANN201
        return continuation(self._with(details), requests)


def with_capability(daemon: Any, channel: grpc.Channel) -> grpc.Channel:
    """``channel`` (to the worker socket) carrying this test process's capability on every call."""
    return grpc.intercept_channel(channel, _Capability(attachment(daemon).metadata))


@contextlib.contextmanager
def stub(daemon: Any) -> Iterator[datadist_pb2_grpc.DataDistStub]:
    """The worker socket, as this test process's worker session (its engines only)."""
    with grpc.insecure_channel(daemon.target) as ch:
        yield datadist_pb2_grpc.DataDistStub(with_capability(daemon, ch))


@contextlib.contextmanager
def admin_stub(daemon: Any) -> Iterator[datadist_pb2_grpc.DataDistStub]:
    """The admin socket: every engine of the daemon."""
    with grpc.insecure_channel(daemon.admin_target) as ch:
        yield datadist_pb2_grpc.DataDistStub(ch)


def hand_over(daemon: Any, address: int, length: int) -> datadist_pb2.WorkerMemory:
    """Memory of this process handed to the daemon as descriptors (as llm_datadist registers it)."""
    shared = _memory.share(address, length)
    try:
        memory_id = attachment(daemon).import_memory(shared.fds, shared.pieces, shared.offset, shared.length, "test")
    finally:
        shared.close()
    return datadist_pb2.WorkerMemory(attached=datadist_pb2.AttachedMemory(memory_id=memory_id))


def map_tensors(daemon: Any, engine_id: int, info: datadist_pb2.CacheInfo) -> list[np.ndarray]:
    """The tensors of a daemon-owned cache, mapped into this process (as a worker maps them)."""
    out = []
    for t in info.tensors:
        fd, size, _, _ = attachment(daemon).export_pool(engine_id, t.pool, "test")
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        out.append(np.frombuffer(mm, np.uint8)[t.file_offset:t.file_offset + t.length])
    return out


def status(daemon: Any) -> datadist_pb2.DaemonStatus:
    with admin_stub(daemon) as s:
        return s.GetStatus(datadist_pb2.StatusRequest(), timeout=10)


def links(daemon: Any) -> list:
    with admin_stub(daemon) as s:
        return list(s.ListLinks(datadist_pb2.StatusRequest(), timeout=10).links)


def caches(daemon: Any) -> list:
    with admin_stub(daemon) as s:
        return [(g.cluster_id, c.cache_id) for g in s.ListCaches(datadist_pb2.StatusRequest(), timeout=10).engines
                for c in g.caches]


def pool_used(daemon: Any) -> int:
    return sum(p.used for e in status(daemon).engines for p in e.pools)


def code_of(err: grpc.RpcError) -> int | None:
    for key, value in err.trailing_metadata() or ():
        if key == STATUS_KEY:
            return int(value)
    return None


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed (bounded); returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return bool(value)
        time.sleep(interval)


def _hex_addr(text: str) -> str:
    """An address field of /proc/net/tcp{,6} (``0100007F:1F90``) -> printable ip."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # tcp6: four little-endian 32-bit words
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket in LISTEN state that process ``pid`` holds open."""
    inodes = {t[8:-1] for t in fd_targets(pid) if t.startswith("socket:[")}
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state != "0A" or inode not in inodes:
                        continue
                    addr, port = local.split(":")
                    ip = _hex_addr(addr)
                    found.add((ip.removeprefix("::ffff:") if "." in ip else ip, int(port, 16)))  # v4-mapped
        except FileNotFoundError:
            continue
    return found


# ---- memory the test process owns -----------------------------------------------------------------

class Buffer:
    """A numpy byte buffer of this process as a daemon ``MemoryHandle`` (for a test-side data plane)."""

    def __init__(self, nbytes: int) -> None:
        self.array = np.zeros(nbytes, np.uint8)
        self.size = nbytes
        self._view = memoryview(self.array).cast("B")

    def view(self) -> memoryview:
        return self._view

    def read_into(self, offset: int, dst: memoryview) -> None:
        out = memoryview(dst).cast("B")
        out[:] = self._view[offset:offset + len(out)]

    def write_from(self, offset: int, src: Any) -> None:
        data = memoryview(src).cast("B")
        self._view[offset:offset + len(data)] = data

    def close(self) -> None:
        pass

    @property
    def address(self) -> int:
        return self.array.ctypes.data


# ---- a peer under the test's control ---------------------------------------------------------------

class CallFailed(Exception):
    """An owner call a ``PeerAgent`` made was answered with a failure (``status``: the ``LLMStatusCode``; 0 when
    no answer came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass
class PeerAgent:
    """A fake linking daemon: handshake with the right secret, data channel with the derived token."""

    address: str
    client_cluster: int
    server_cluster: int
    secret: bytes = field(default_factory=unconfigured_secret)
    link_nonce: bytes = b""
    endpoint: str = ""
    token: bytes = b""
    channel: Any = None
    transport: Any = None
    _grpc: Any = field(default=None, repr=False)
    peer: Any = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _pinger: threading.Thread | None = field(default=None, repr=False)
    _replies: dict[int, Any] = field(default_factory=dict, repr=False)
    _answered: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    control_bytes: int = 0      # payload bytes of control frames received (the channel's other bytes are data)

    def __post_init__(self) -> None:
        self._grpc = grpc.insecure_channel(self.address)
        self.peer = peer_pb2_grpc.PeerStub(self._grpc)

    def challenge(self) -> bytes:
        """A fresh challenge from the serving engine (what a linking daemon asks for first)."""
        from datadistd.links.wire.peering import PROTOCOL_VERSION

        request = peer_pb2.ChallengeRequest(protocol_version=PROTOCOL_VERSION, client_cluster_id=self.client_cluster,
                                            server_cluster_id=self.server_cluster)
        # a connection of its own, as a linking daemon asks (admission grants few challenges per pre-auth
        # connection); a local subchannel pool, or gRPC would share one connection among the channels
        with grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            return peer_pb2_grpc.PeerStub(ch).Challenge(request, timeout=10).challenge

    def offer(self, challenge: bytes | None = None, **override: Any) -> peer_pb2.HandshakeRequest:
        """A signed offer over ``challenge`` (default: a fresh one from the server); ``override`` fields after."""
        from datadistd.api.grpc.convert import offer_to_pb
        from datadistd.links.wire.peering import make_offer

        fresh = self.challenge() if challenge is None else challenge
        msg = offer_to_pb(make_offer(self.secret, self.client_cluster, self.server_cluster, fresh, "reliability-test"))
        for key, value in override.items():
            setattr(msg, key, value)
        return msg

    def handshake(self, connect: bool = True, streams: int = 2) -> "PeerAgent":
        from datadistd.links.wire.peering import data_token
        from datadistd.transport.tcp import TcpTransport

        answer = self.peer.Handshake(self.offer(), timeout=10)
        self.link_nonce, self.endpoint = answer.link_nonce, answer.data_endpoint
        self.token = data_token(self.secret, self.link_nonce)
        if connect:
            self.transport = TcpTransport(host="127.0.0.1", port=0, connect_timeout=5.0)
            self.transport.start()
            self.channel = self.transport.connect(self.endpoint, self.token, streams, time.monotonic() + 10)
            self.channel.on_control(self._on_control)
            self._stop.clear()
            self._pinger = threading.Thread(target=self._heartbeat, daemon=True, name="peer-agent-heartbeat")
            self._pinger.start()
        return self

    def _heartbeat(self) -> None:
        """Ping like a linking daemon does, so the owner keeps the link (bounded by ``close``)."""
        from datadistd.links.wire.ownercalls import PingCmd

        while not self._stop.wait(0.5):
            try:
                self.call(PingCmd(0), timeout=5)
            except Exception:  # noqa: BLE001 - no answer, or the channel broke: the test sees it elsewhere
                pass

    def _on_control(self, kind: int, payload: bytes) -> None:
        """A reader thread's control frame: replies are matched to calls; the daemon's own calls (an unlink at
        its finalize, a ping) are answered with success."""
        from datadistd.transport.base import CONTROL_CALL, CONTROL_REPLY

        with self._answered:
            self.control_bytes += len(payload)
        from datadistd.links.wire import ownerwire
        from datadistd.links.wire.ownercalls import OwnerReply

        if kind == CONTROL_REPLY:
            reply = ownerwire.decode_reply(payload)
            with self._answered:
                self._replies[reply.command_id] = reply
                self._answered.notify_all()
        elif kind == CONTROL_CALL:
            answer = OwnerReply(ownerwire.decode_call(payload).command_id)
            self.channel.try_control(CONTROL_REPLY, ownerwire.encode_reply(answer), time.monotonic() + 1)

    def call(self, cmd: Any, timeout: float = 10) -> Any:
        """One owner call (an ``ownercalls`` record; its ``command_id`` is replaced by a fresh one) as a CALL frame;
        its ``OwnerReply``, or ``CallFailed`` with the status the owner answered."""
        from datadistd.links.wire import ownerwire

        return self.call_raw(ownerwire.encode_call(cmd), timeout)

    def call_raw(self, frame: bytes, timeout: float = 10) -> Any:
        """``frame``: the bytes of a CALL frame, well-formed or not; its command id (bytes 8 to 16, the same in
        every call's layout) is overwritten with a fresh one. A frame too short to carry one gets no answer:
        ``CallFailed`` with status 0 at ``timeout``."""
        from datadistd.links.wire import ownerwire
        from datadistd.transport.base import CONTROL_CALL

        command_id = next(self._ids)
        at = ownerwire.HEAD.size - 8
        if len(frame) >= ownerwire.HEAD.size:
            frame = frame[:at] + command_id.to_bytes(8, "little") + frame[at + 8:]
        deadline = time.monotonic() + timeout
        self.channel.send_control(CONTROL_CALL, frame, deadline)
        with self._answered:
            if not self._answered.wait_for(lambda: command_id in self._replies, max(0.0, deadline - time.monotonic())):
                raise CallFailed(0, f"no answer to call {command_id} within {timeout}s")
            reply = self._replies.pop(command_id)
        if reply.status:
            raise CallFailed(reply.status, reply.message)
        return reply

    def expect(self, buf: Buffer, nbytes: int | None = None) -> Any:
        from datadistd.memory.base import Segment

        return self.transport.expect([Segment(buf, 0, buf.size if nbytes is None else nbytes)], channel=self.channel)

    def send(self, transfer_id: int, buf: Buffer, nbytes: int) -> None:
        from datadistd.memory.base import Segment

        self.channel.send(transfer_id, [Segment(buf, 0, nbytes)], time.monotonic() + 10)

    def close(self) -> None:
        self._stop.set()
        if self._pinger is not None:
            self._pinger.join(10)
            self._pinger = None
        if self.transport is not None:
            self.transport.stop()
            self.transport = None
        self._grpc.close()


def blocks_key(cluster: int, model_id: int = 0) -> Any:
    from datadist.v1 import common_pb2

    return common_pb2.AnyKey(blocks_key=common_pb2.BlocksCacheKey(cluster_id=cluster, model_id=model_id))


# ---- network namespaces -----------------------------------------------------------------------------

def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=15)


class Hosts:
    """Namespaces ``a`` (prompt node) and ``b`` (decode node) joined by a rate-limited veth pair.

    Addresses are 10.232.x.0/24, private to the two namespaces; everything is removed by ``remove``.
    """

    def __init__(self, rate: str = "200mbit") -> None:
        tag = uuid.uuid4().hex[:6]
        self.a, self.b = f"rla-{tag}", f"rlb-{tag}"
        self.va, self.vb = f"ra{tag}", f"rb{tag}"
        subnet = int(tag, 16) % 250 + 1
        self.ip_a, self.ip_b = f"10.232.{subnet}.1", f"10.232.{subnet}.2"
        try:
            _sh("ip", "netns", "add", self.a)
            _sh("ip", "netns", "add", self.b)
            _sh("ip", "link", "add", self.va, "type", "veth", "peer", "name", self.vb)
            _sh("ip", "link", "set", self.va, "netns", self.a)
            _sh("ip", "link", "set", self.vb, "netns", self.b)
            for ns, dev, ip in ((self.a, self.va, self.ip_a), (self.b, self.vb, self.ip_b)):
                _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                _sh("ip", "-n", ns, "link", "set", dev, "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "256kb", "latency", "100ms")
        except BaseException:
            self.remove()
            raise

    def cut(self) -> None:
        _sh("ip", "-n", self.a, "link", "set", self.va, "down")

    def mend(self) -> None:
        _sh("ip", "-n", self.a, "link", "set", self.va, "up")
        _sh("ip", "-n", self.a, "neigh", "flush", "dev", self.va)
        _sh("ip", "-n", self.b, "neigh", "flush", "dev", self.vb)

    def remove(self) -> None:
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)


_ = ctypes
