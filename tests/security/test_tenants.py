"""A hostile tenant of the shared daemon (issue 27, local attacks), each refused next to the legitimate use.

Numbers are the issue's attacks: 1 a lingering socket handed over, 3 a sealed hugetlb memfd, 4 one uid
exhausting address space and mappings. One real daemon, real attach connections.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import time

import numpy as np
import pytest

from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2, datadist_pb2
from llm_datadist.status import LLMException
from tests.daemonproc import DaemonProcess
from tests.harness import free_port

from .test_local import Worker, attach_ask, refused
from .test_users import users  # noqa: F401 - users: the throwaway-users fixture
from .users import as_user, ids

pytestmark = pytest.mark.integration

MiB = 1 << 20


def _ask(s: socket.socket, request: attach_pb2.AttachRequest, fds: list[int]) -> attach_pb2.AttachReply:
    return attach_ask(s, request.SerializeToString(), fds)


def _lingering_socket() -> tuple[socket.socket, socket.socket, socket.socket]:
    """A TCP socket with unsent data, a peer that never reads and ``SO_LINGER`` of an hour: its last close blocks."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    client = socket.create_connection(listener.getsockname(), timeout=10)
    peer, _ = listener.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 3600))
    client.setblocking(False)
    for _ in range(100_000):   # fill the send buffer and the peer's receive buffer
        try:
            client.send(b"x" * 65536)
        except BlockingIOError:
            break
    return listener, client, peer


# ---- 1. a handed-over descriptor cannot block the daemon ----------------------------------------------

def test_1_a_lingering_socket_handed_over_blocks_nobody(daemon):
    other = Worker(daemon)     # another tenant, already at work
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)           # a blocked daemon would not answer within this
    s.connect(daemon.socket + ".attach")
    listener, client, peer = _lingering_socket()
    try:
        engine = other.init(1)
        assert _ask(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello()), []).status == 0
        fd = client.detach()   # the daemon's copy becomes the last one once ours is closed
        request = attach_pb2.AttachRequest(import_memory=attach_pb2.ImportMemory(
            pieces=[attach_pb2.FdPiece(length=4096)], length=4096))
        socket.send_fds(s, [request.SerializeToString()], [fd])
        os.close(fd)
        data, _, _, _ = socket.recv_fds(s, 1 << 16, 4)
        reply = attach_pb2.AttachReply()
        reply.ParseFromString(data)
        assert reply.status == LLMStatusCode.LLM_PARAM_INVALID and "regular file" in reply.message
        # the loop is free: the other tenant is served, and so is this connection
        assert other("GetStatus", datadist_pb2.StatusRequest()).engines[0].engine_id == engine
        assert other.register(engine, other.hand_over(np.zeros(4 * 1024, np.uint16))).cache_id == 1
        assert _ask(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello()), []).status == 0
    finally:
        s.close()
        other.close()
        peer.close()
        listener.close()
    assert daemon.proc.poll() is None


# ---- 3. memory whose pages can vanish under a seal is refused -----------------------------------------

def test_3_a_sealed_hugetlb_memfd_is_refused(daemon):
    w = Worker(daemon)
    try:
        engine = w.init(1)
        fd = os.memfd_create("huge", os.MFD_HUGETLB | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, 2 * MiB)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            with pytest.raises(LLMException) as info:
                w.attach.import_memory([fd], [(0, 2 * MiB)], 0, 2 * MiB, "test")
            assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID and "hugetlbfs" in str(info.value)
        finally:
            os.close(fd)
        # a file that is not shared memory is refused too; a sealed memfd is mapped as before
        with open(__file__, "rb+") as f, pytest.raises(LLMException) as info:
            w.attach.import_memory([f.fileno()], [(0, 4096)], 0, 4096, "test")
        assert "not shared memory" in str(info.value)
        assert w.register(engine, w.hand_over(np.zeros(4 * 1024, np.uint16))).cache_id == 1
    finally:
        w.close()
    assert daemon.proc.poll() is None


# ---- 4. one uid cannot take every tenant's address space, mappings or engines ------------------------

@pytest.fixture
def small_quota():
    d = DaemonProcess("quota", env={"DATADISTD_QUOTA_IMPORTED_MAPPINGS_PER_UID": "6",
                                    "DATADISTD_QUOTA_IMPORTED_BYTES_PER_UID": str(64 << 30),
                                    "DATADISTD_QUOTA_ENGINES_PER_UID": "2"})
    d.start()
    yield d
    d.stop()
    d.discard()


def _sparse_sealed(size: int) -> int:
    fd = os.memfd_create("sparse", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def test_4_one_uid_is_held_to_its_quota(small_quota):
    w = Worker(small_quota)
    try:
        engine = w.init(1)
        w.init(2)
        assert "engines_per_uid" in refused(lambda: w.init(3), LLMStatusCode.LLM_OUT_OF_MEMORY)   # a third engine
        # 128 TiB of sparse sealed memfds: refused past the byte quota, before anything is mapped
        fd = _sparse_sealed(32 << 30)
        try:
            ids = [w.attach.import_memory([fd], [(0, 32 << 30)], 0, 32 << 30, "test") for _ in range(2)]
            with pytest.raises(LLMException) as info:
                w.attach.import_memory([fd], [(0, 32 << 30)], 0, 32 << 30, "test")
            assert info.value.status_code == LLMStatusCode.LLM_OUT_OF_MEMORY
            assert "imported_bytes_per_uid" in str(info.value)
            w.attach.release_memory(ids)
        finally:
            os.close(fd)
        # one-page pieces: refused past the mapping quota
        fd = _sparse_sealed(1 << 20)
        try:
            ids = [w.attach.import_memory([fd] * 3, [(0, 4096)] * 3, 0, 4096, "test") for _ in range(2)]
            with pytest.raises(LLMException) as info:
                w.attach.import_memory([fd], [(0, 4096)], 0, 4096, "test")
            assert "imported_mappings_per_uid" in str(info.value)
            w.attach.release_memory(ids[:1])
        finally:
            os.close(fd)
        # what was given back is available again, and registering still works
        assert w.register(engine, w.hand_over(np.zeros(4 * 1024, np.uint16))).cache_id == 1
    finally:
        w.close()
    assert small_quota.proc.poll() is None


# ---- 5. the default embedded mode is not open to other local users ------------------------------------

EMBEDDED = """
import json, sys, numpy as np, llm_datadist as ld
role, port = sys.argv[1], int(sys.argv[2])
cfg = ld.LLMConfig(); cfg.device_id = 0; cfg.enable_cache_manager = True; cfg.enable_remote_cache_accessible = True
if role == "prompt":
    cfg.listen_ip_info = f"127.0.0.1:{port}"
dd = ld.LLMDataDist(ld.LLMRole.PROMPT if role == "prompt" else ld.LLMRole.DECODER, 1 if role == "prompt" else 2)
dd.init(cfg.generate_options())
kv = [np.full((4, 1024), 7 if role == "prompt" else 0, np.uint8)]
cache = dd.cache_manager.register_blocks_cache(ld.CacheDesc(1, [4, 1024], ld.DataType.DT_UINT8),
                                               [kv[0].ctypes.data], ld.BlocksCacheKey(1, 0))
if role == "prompt":
    print("ready", flush=True)
    sys.stdin.readline()
else:
    info = ld.LLMClusterInfo(); info.remote_cluster_id = 1
    info.append_local_ip_info("127.0.0.1", 0); info.append_remote_ip_info("127.0.0.1", port)
    code, codes = dd.link_clusters([info], 5000)
    out = {"link": int(code), "codes": [int(c) for c in codes]}
    if int(code) == 0:
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(1, 0), cache, [0, 1], [0, 1])
        out["pulled"] = bool((kv[0][:2] == 7).all())
    print(json.dumps(out), flush=True)
dd.finalize()
"""


@pytest.mark.usefixtures("users")
def test_5_embedded_workers_link_within_one_user_only():
    """Two real throwaway users (root only; skipped with the reason otherwise), no secret configured anywhere."""
    base = tempfile.mkdtemp(prefix="datadist-embedded-users-")
    os.chmod(base, 0o711)
    runtime = {}
    for name in ("ddtest-alice", "ddtest-bob"):
        d = os.path.join(base, name)
        os.mkdir(d, 0o700)
        os.chown(d, *ids(name))
        runtime[name] = {"XDG_RUNTIME_DIR": d}
    port = free_port()
    prompt = as_user("ddtest-alice", ["-c", EMBEDDED, "prompt", str(port)], env=runtime["ddtest-alice"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert prompt.stdout.readline().strip() == "ready", prompt.stderr.read()[-2000:]

        def decoder(user: str) -> dict:
            p = as_user(user, ["-c", EMBEDDED, "decoder", str(port)], env=runtime[user], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            return json.loads(out.strip().splitlines()[-1])

        assert decoder("ddtest-alice") == {"link": 0, "codes": [0], "pulled": True}     # the same user links
        bob = decoder("ddtest-bob")                                                      # another user does not
        assert bob["link"] != 0 and "pulled" not in bob, bob
        secret = os.path.join(base, "ddtest-alice", "datadist", "peer.secret")
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600 and os.stat(secret).st_uid == ids("ddtest-alice")[0]
    finally:
        prompt.stdin.close()
        prompt.wait(60)
        shutil.rmtree(base, ignore_errors=True)


# ---- 7. the metrics endpoint is bounded -------------------------------------------------------------

def _scrape(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""     # a non-blocking socket
    except BlockingIOError:
        return False
    except OSError:           # reset
        return True


def test_7_metrics_connections_are_capped_and_deadlined():
    from tests.daemonproc import free_port

    port = free_port()
    d = DaemonProcess("metrics", env={"DATADISTD_METRICS_LISTEN": str(port)})   # a bare port: loopback
    d.start()
    slow: list[socket.socket] = []
    try:
        assert f"metrics on http://127.0.0.1:{port}/metrics" in d.log()
        assert b"200 OK" in _scrape(port)
        for _ in range(64):      # each sends a request line, then a header line now and then, never the end
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            s.setblocking(False)
            slow.append(s)
        open_ = list(slow)
        for _ in range(300):     # bounded: up to ~30 s, a header line every 0.1 s to those still open
            open_ = [s for s in open_ if not _closed_by_server(s)]
            if not open_:
                break
            for s in open_:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            time.sleep(0.1)
        assert not open_, f"{len(open_)} of 64 slow connections still held"
        for s in slow:
            s.close()
        # a request line over 64 KiB: closed, and no traceback in the log
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            try:
                s.sendall(b"GET /" + b"a" * (70 << 10))
                s.recv(1)
            except OSError:
                pass
        body = _scrape(port)
        assert b"200 OK" in body and b"datadist" in body
        assert "Traceback" not in open(d.log_path).read()
    finally:
        for s in slow:
            s.close()
        d.stop()
        d.discard()


# ---- 6. the capability is what the docs say it is: a bearer token scoped to the attach connection -----

def test_6_the_capability_is_a_bearer_token_that_dies_with_its_attach_connection(daemon):
    """Documented, not refused (docs/security.md, attach.proto): gRPC's Python server cannot see a unix
    caller's uid, so whoever holds the capability acts as its worker -- only while that worker's attach
    connection lives. This pins both halves, so the docs and the code cannot drift apart."""
    owner = Worker(daemon)
    engine = owner.init(1)
    thief = Worker(daemon, capability=owner.attach.capability)    # another connection presenting it
    try:
        assert [e.engine_id for e in thief("GetStatus", datadist_pb2.StatusRequest()).engines] == [engine]
        owner.attach.close()                                       # the lease ends
        for _ in range(200):                                       # bounded: the session closes on the loop
            try:
                thief("GetStatus", datadist_pb2.StatusRequest(engine_id=engine))
            except Exception:  # noqa: BLE001 - refused, as below
                break
            time.sleep(0.05)
        refused(lambda: thief("GetStatus", datadist_pb2.StatusRequest(engine_id=engine)))
        assert not thief("GetStatus", datadist_pb2.StatusRequest()).engines
    finally:
        thief.close()
        owner.channel.close()
