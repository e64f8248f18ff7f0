"""Local attacks on a shared daemon (security issue, items 1-7), each refused next to the legitimate use.

A worker is whoever holds an attach connection: the daemon learned its uid/pid from the kernel and
gave it a capability. These tests play two workers (two attach connections) against one real daemon
on real sockets; ``test_two_users`` plays them as two real throwaway users against a daemon that
runs as a third user with no capability, the way ``deploy/datadistd.service`` runs it (root only).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import socket
import stat
import subprocess
import sys
import tempfile

import grpc
import numpy as np
import pytest

from datadist import fastframe
from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2, common_pb2, datadist_pb2, datadist_pb2_grpc
from llm_datadist._attach import AttachClient
from llm_datadist.status import LLMException
from tests.daemonproc import DaemonProcess

pytestmark = pytest.mark.integration

PAGE = mmap.PAGESIZE
DESC = common_pb2.CacheDesc(num_tensors=1, shape=[4, 1024], data_type=4, placement=common_pb2.PLACEMENT_HOST)
OPTIONS = {"llm.EnableCacheManager": "1", "llm.MemPoolConfig": '{"memory_size": 1048576}',
           "llm.HostMemPoolConfig": '{"memory_size": 1048576}'}


class Worker:
    """One attach connection (one kernel-verified session) and a DataDist stub carrying its capability."""

    def __init__(self, d: DaemonProcess, capability: bytes | None = None) -> None:
        self.attach = AttachClient(d.target)
        cap = self.attach.capability if capability is None else capability
        self.metadata = (("datadist-capability", cap.hex()),) if cap else ()
        self.channel = grpc.insecure_channel(d.target)
        self.stub = datadist_pb2_grpc.DataDistStub(self.channel)

    def __call__(self, method: str, request):  # noqa: ANN001, ANN204
        return getattr(self.stub, method)(request, timeout=10, metadata=self.metadata)

    def init(self, cluster: int) -> int:
        return self("Init", datadist_pb2.InitRequest(cluster_id=cluster, role=common_pb2.ROLE_DECODER,
                                                     options=OPTIONS)).engine_id

    def hand_over(self, arr: np.ndarray) -> int:
        """Register-ready memory: the array re-backed and sent as descriptors, as llm_datadist does."""
        from llm_datadist import _memory

        shared = _memory.share(arr.ctypes.data, arr.nbytes)
        try:
            return self.attach.import_memory(shared.fds, shared.pieces, shared.offset, shared.length, "test")
        finally:
            shared.close()

    def register(self, engine_id: int, memory_id: int):  # noqa: ANN201
        return self("RegisterCache", datadist_pb2.RegisterCacheRequest(
            engine_id=engine_id, desc=DESC, is_blocks=True,
            tensors=[datadist_pb2.WorkerMemory(attached=datadist_pb2.AttachedMemory(memory_id=memory_id))]))

    def close(self) -> None:
        self.channel.close()
        self.attach.close()


def attach_ask(s: socket.socket, payload: bytes, fds: list[int]) -> attach_pb2.AttachReply:
    """One raw attach datagram (``payload``, with ``fds`` over SCM_RIGHTS) on ``s`` and its reply; descriptors the
    reply carries are closed."""
    socket.send_fds(s, [payload], fds)
    data, got, _, _ = socket.recv_fds(s, 1 << 16, 4)
    for fd in got:
        os.close(fd)
    reply = attach_pb2.AttachReply()
    reply.ParseFromString(data)
    return reply


def protocol_2_transfer(rid: int, push: bool, msg: datadist_pb2.TransferRequest) -> bytes:
    """An ``AttachRequest`` as a protocol-2 client sent a pull (field 6) or push (field 7): fields attach.proto now
    reserves, so written by hand."""
    body = msg.SerializeToString()
    assert len(body) < 128    # one varint byte of length
    return attach_pb2.AttachRequest(request_id=rid).SerializeToString() + bytes([(7 if push else 6) << 3 | 2,
                                                                                 len(body)]) + body


def code_of(err: grpc.RpcError) -> int:
    return int(dict(err.trailing_metadata())["datadist-status-code"])


def refused(fn, code: LLMStatusCode = LLMStatusCode.LLM_ENGINE_FINALIZED) -> str:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as info:
        fn()
    assert code_of(info.value) == code, info.value.details()
    return info.value.details()


def engine_calls(engine_id: int) -> list[tuple[str, object]]:
    """Every engine-scoped unary DataDist call, aimed at ``engine_id``."""
    ref = datadist_pb2.CacheRef(engine_id=engine_id, cache_id=1)
    return [
        ("Finalize", datadist_pb2.EngineRef(engine_id=engine_id)),
        ("AllocateCache", datadist_pb2.AllocateCacheRequest(engine_id=engine_id, desc=DESC, is_blocks=True)),
        ("RegisterCache", datadist_pb2.RegisterCacheRequest(engine_id=engine_id, desc=DESC, is_blocks=True)),
        ("DeallocateCache", ref), ("UnregisterCache", ref),
        ("RemoveCacheKey", datadist_pb2.RemoveCacheKeyRequest(engine_id=engine_id)),
        ("CopyCache", datadist_pb2.CopyCacheRequest(engine_id=engine_id, dst_cache_id=1, src_cache_id=1)),
        ("CopyBlocks", datadist_pb2.CopyBlocksRequest(engine_id=engine_id, cache_id=1)),
        ("SwapBlocks", datadist_pb2.SwapBlocksRequest(engine_id=engine_id)),
        ("LinkClusters", datadist_pb2.LinkClustersRequest(engine_id=engine_id)),
        ("UnlinkClusters", datadist_pb2.UnlinkClustersRequest(engine_id=engine_id)),
        ("SwitchRole", datadist_pb2.SwitchRoleRequest(engine_id=engine_id, role=common_pb2.ROLE_PROMPT)),
        ("Link", datadist_pb2.CommLinkRequest(engine_id=engine_id, comm_name="x")),
        ("Unlink", datadist_pb2.CommRef(engine_id=engine_id, comm_id=1)),
        ("QueryRegisterMemStatus", datadist_pb2.CommRef(engine_id=engine_id, comm_id=1)),
        ("Pull", datadist_pb2.TransferRequest(engine_id=engine_id, local_cache_id=1)),
        ("Push", datadist_pb2.TransferRequest(engine_id=engine_id, local_cache_id=1)),
        ("SetWorkerAddrs", datadist_pb2.WorkerAddrsRequest(engine_id=engine_id, cache_id=1)),
        ("CheckLinkStatus", datadist_pb2.LinkStatusRequest(engine_id=engine_id, remote_cluster_id=1)),
        ("GetStatus", datadist_pb2.StatusRequest(engine_id=engine_id)),
        ("ListLinks", datadist_pb2.StatusRequest(engine_id=engine_id)),
        ("ListCaches", datadist_pb2.StatusRequest(engine_id=engine_id)),
    ]


# ---- 1. a worker reaches only its own engines and its own memory --------------------------------

def test_1_no_worker_acts_on_another_workers_engine(daemon):
    victim, intruder = Worker(daemon), Worker(daemon)
    blind, forged = Worker(daemon, capability=b""), Worker(daemon, capability=secrets.token_bytes(32))
    try:
        engine = victim.init(1)
        arr = np.arange(4 * 1024, dtype=np.uint16)
        victim.register(engine, victim.hand_over(arr))
        own = intruder.init(2)
        for who in (intruder, blind, forged):
            for method, request in engine_calls(engine):
                refused(lambda who=who, method=method, request=request: who(method, request))
            # the node view a worker gets holds its own engines only
            status = who("GetStatus", datadist_pb2.StatusRequest())
            assert [e.engine_id for e in status.engines] == ([own] if who is intruder else [])
            caches = who("ListCaches", datadist_pb2.StatusRequest())
            assert all(g.engine_id != engine for g in caches.engines)
            assert all(link.engine_id != engine for link in who("ListLinks", datadist_pb2.StatusRequest()).links)
        # the victim is untouched and works: its engine, its cache, a local copy through the daemon
        status = victim("GetStatus", datadist_pb2.StatusRequest())
        (mine,) = status.engines
        assert mine.engine_id == engine and mine.caches == 1
        assert (mine.pid, mine.uid) == (os.getpid(), os.getuid())      # what the kernel said, not the caller
        victim("CopyBlocks", datadist_pb2.CopyBlocksRequest(engine_id=engine, cache_id=1, copies=[
            datadist_pb2.BlockCopy(src_block=0, dst_blocks=[3])]))
        blocks = arr.view(np.uint8)[:4096].reshape(4, 1024)        # DESC: 4 blocks of 1024 uint8
        assert np.array_equal(blocks[3], blocks[0]) and not np.array_equal(blocks[2], blocks[0])
        # the admin socket (0600: root and the daemon's user) sees both
        with grpc.insecure_channel(daemon.admin_target) as ch:
            every = datadist_pb2_grpc.DataDistStub(ch).GetStatus(datadist_pb2.StatusRequest(), timeout=10)
        assert sorted(e.engine_id for e in every.engines) == sorted([engine, own])
        assert stat.S_IMODE(os.stat(daemon.socket + ".admin").st_mode) == 0o600
    finally:
        for w in (victim, intruder, blind, forged):
            w.close()


def test_1_memory_and_pools_go_only_to_their_worker(daemon):
    victim, intruder = Worker(daemon), Worker(daemon)
    try:
        engine = victim.init(1)
        cache = victim("AllocateCache", datadist_pb2.AllocateCacheRequest(engine_id=engine, desc=DESC, is_blocks=True))
        pool = cache.tensors[0].pool
        assert pool and not cache.tensors[0].path            # a pool id, no path anyone could open
        with pytest.raises(LLMException) as info:
            intruder.attach.export_pool(engine, pool, "test")
        assert info.value.status_code == LLMStatusCode.LLM_ENGINE_FINALIZED
        fd, size, _, _ = victim.attach.export_pool(engine, pool, "test")     # the owner gets it, sealed
        try:
            assert size == 1 << 20 and fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
            with pytest.raises(OSError):
                os.ftruncate(fd, 0)                                      # and cannot shrink it under the daemon
        finally:
            os.close(fd)
        assert not [n for n in os.listdir("/dev/shm") if n.startswith("datadist-")
                    and n.split("-")[1] == str(daemon.proc.pid)]
        # memory handed over by one worker is not usable by another
        arr = np.zeros(4 * 1024, np.uint16)
        memory_id = victim.hand_over(arr)
        own = intruder.init(2)
        assert "not handed over by this worker" in refused(lambda: intruder.register(own, memory_id),
                                                           LLMStatusCode.LLM_PARAM_INVALID)
        assert victim.register(engine, memory_id).cache_id == 2
    finally:
        victim.close()
        intruder.close()


def test_1_a_closed_attach_connection_ends_the_lease(daemon):
    w = Worker(daemon)
    engine = w.init(1)
    w.attach.close()                                    # the worker died: its engine goes
    with grpc.insecure_channel(daemon.admin_target) as ch:
        stub = datadist_pb2_grpc.DataDistStub(ch)
        for _ in range(100):
            if not stub.GetStatus(datadist_pb2.StatusRequest(), timeout=10).engines:
                break
            import time

            time.sleep(0.05)
        assert not stub.GetStatus(datadist_pb2.StatusRequest(), timeout=10).engines
    refused(lambda: w("GetStatus", datadist_pb2.StatusRequest(engine_id=engine)))
    w.channel.close()


# ---- 2, 3. no pid proof, no ptrace: a pid a caller names reaches nothing -------------------------

def test_2_3_a_named_pid_reaches_no_memory(daemon):
    w = Worker(daemon)
    try:
        engine = w.init(1)
        assert w("GetStatus", datadist_pb2.StatusRequest()).engines[0].pid == os.getpid()  # the claimed pid is ignored
        refused(lambda: w("ProvePid", datadist_pb2.ProvePidRequest(engine_id=engine, address=4096)),
                LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        buf = np.zeros(4 * 1024, np.uint16)
        for pid in (daemon.proc.pid, os.getpid(), 1):
            mem = datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=pid, address=buf.ctypes.data,
                                                                               length=buf.nbytes))
            msg = refused(lambda m=mem: w("RegisterCache", datadist_pb2.RegisterCacheRequest(
                engine_id=engine, desc=DESC, is_blocks=True, tensors=[m])), LLMStatusCode.LLM_PARAM_INVALID)
            assert "embedded" in msg
    finally:
        w.close()


def test_3_the_daemon_code_has_no_way_into_another_process():
    """Nothing in the daemon can attach to a process: no ptrace, no process_vm_readv/writev, no /proc/<pid>/mem."""
    import datadistd

    root = os.path.dirname(datadistd.__file__)
    hits = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name)).read()
                hits += [f"{name}: {w}" for w in ("process_vm_", "PTRACE", "/mem\"", "map_files") if w in text]
    assert hits == []


# ---- 4. the daemon never opens a path a worker names --------------------------------------------

def test_4_paths_are_refused(daemon, tmp_path):
    secret = tmp_path / "daemon-only"
    secret.write_bytes(b"s" * 4096)
    w = Worker(daemon)
    try:
        engine = w.init(1)
        for path in (str(secret), "/dev/shm/anything", f"/proc/{daemon.proc.pid}/fd/0"):
            mem = datadist_pb2.WorkerMemory(shared_file=datadist_pb2.SharedFileMemory(path=path, length=4096))
            msg = refused(lambda m=mem: w("RegisterCache", datadist_pb2.RegisterCacheRequest(
                engine_id=engine, desc=DESC, is_blocks=True, tensors=[m])), LLMStatusCode.LLM_PARAM_INVALID)
            assert "never opens a path" in msg
    finally:
        w.close()


# ---- 5. a shrunk file cannot kill the daemon ----------------------------------------------------

def test_5_truncating_registered_memory_cannot_kill_the_daemon(daemon):
    w = Worker(daemon)
    path = tempfile.mktemp(dir="/dev/shm", prefix="datadist-sec-")
    try:
        engine = w.init(1)
        with open(path, "wb") as f:
            f.write(b"\x01" * 8192)
        fd = os.open(path, os.O_RDWR)
        try:
            memory_id = w.attach.import_memory([fd], [(0, 8192)], 0, 8192, "test")
        finally:
            os.close(fd)
        w.register(engine, memory_id)
        os.truncate(path, 0)                                  # shrink it under the daemon
        copy = datadist_pb2.CopyBlocksRequest(engine_id=engine, cache_id=1, copies=[
            datadist_pb2.BlockCopy(src_block=0, dst_blocks=[1])])
        for _ in range(5):
            assert "shrank" in refused(lambda: w("CopyBlocks", copy), LLMStatusCode.LLM_PARAM_INVALID)
        assert daemon.proc.poll() is None                     # alive, and still serving this worker
        assert w("GetStatus", datadist_pb2.StatusRequest()).engines[0].caches == 1
        # a memfd sealed against shrinking is mapped (zero copy) and cannot be shrunk at all
        arr = np.zeros(4 * 1024, np.uint16)
        assert w.register(engine, w.hand_over(arr)).cache_id == 2
    finally:
        w.close()
        os.unlink(path)


# ---- 6. bounds --------------------------------------------------------------------------------------

def test_6_lengths_that_wrap_are_refused(daemon):
    w = Worker(daemon)
    try:
        engine = w.init(1)
        fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, PAGE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        try:
            for pieces, offset, length in (([(0, PAGE)], 2**64 - 1, 2), ([(0, PAGE)], 16, 2**64 - 1),
                                           ([(2**64 - PAGE, PAGE)], 0, 1), ([(0, 2**64 - 1)], 0, 1)):
                with pytest.raises(LLMException) as info:
                    w.attach.import_memory([fd], pieces, offset, length, "test")
                assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID
        finally:
            os.close(fd)
        mem = datadist_pb2.WorkerMemory(process=datadist_pb2.ProcessMemory(pid=os.getpid(), address=4096,
                                                                           length=2**64 - 1))
        refused(lambda: w("RegisterCache", datadist_pb2.RegisterCacheRequest(
            engine_id=engine, desc=DESC, is_blocks=True, tensors=[mem])), LLMStatusCode.LLM_PARAM_INVALID)
        assert w.register(engine, w.hand_over(np.zeros(4 * 1024, np.uint16))).cache_id == 1
    finally:
        w.close()


def test_6_attach_messages_are_bounded(daemon):
    """Oversized or malformed datagrams, too many descriptors, descriptors where none belong: refused, and the
    connection still serves the next honest request."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(daemon.socket + ".attach")

    def ask(payload: bytes, fds: list[int] = ()) -> attach_pb2.AttachReply:  # noqa: B006
        return attach_ask(s, payload, list(fds))

    try:
        before = ask(attach_pb2.AttachRequest(export_pool=attach_pb2.ExportPool(engine_id=1)).SerializeToString())
        assert before.status == LLMStatusCode.LLM_PARAM_INVALID and "hello" in before.message
        hello = ask(attach_pb2.AttachRequest(hello=attach_pb2.AttachHello()).SerializeToString())
        assert hello.status == 0 and len(hello.welcome.capability) == 32 and hello.welcome.pid == os.getpid()
        assert ask(b"\xfe" * 100).status == LLMStatusCode.LLM_PARAM_INVALID   # (0xff starts a binary frame)
        assert ask(b"\x00" * (70 << 10)).status == LLMStatusCode.LLM_PARAM_INVALID      # over 64 KiB
        r, w = os.pipe()
        try:
            many = ask(attach_pb2.AttachRequest(hello=attach_pb2.AttachHello()).SerializeToString(), [r] * 20)
            assert many.status == LLMStatusCode.LLM_PARAM_INVALID
            stray = ask(attach_pb2.AttachRequest(hello=attach_pb2.AttachHello()).SerializeToString(), [r])
            assert stray.status == LLMStatusCode.LLM_PARAM_INVALID and "carries no descriptors" in stray.message
            pipe = ask(attach_pb2.AttachRequest(import_memory=attach_pb2.ImportMemory(
                pieces=[attach_pb2.FdPiece(length=10)], length=10)).SerializeToString(), [r])
            assert pipe.status == LLMStatusCode.LLM_PARAM_INVALID and "regular file" in pipe.message
        finally:
            os.close(r)
            os.close(w)
        assert ask(attach_pb2.AttachRequest(hello=attach_pb2.AttachHello()).SerializeToString()).status == 0
    finally:
        s.close()
    assert daemon.proc.poll() is None


# ---- 7. the socket directory --------------------------------------------------------------------

def _start_fails(socket_path: str) -> str:
    done = subprocess.run([sys.executable, "-m", "datadistd", "--socket", socket_path], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "DATADISTD_DAEMON_LOG_LEVEL": "INFO"})
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    return done.stderr


def test_7_a_socket_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "open"
    shared.mkdir()
    os.chmod(shared, 0o777)
    err = _start_fails(str(shared / "datadistd.sock"))
    assert "not safe" in err and str(shared) in err and not os.path.exists(shared / "datadistd.sock")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory owned by another user")
def test_7_a_socket_directory_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    err = _start_fails(str(theirs / "datadistd.sock"))
    assert "owned by uid 65534" in err


def test_7_default_socket_without_runtime_dir_is_checked(tmp_path):
    """Without RUNTIME_DIRECTORY/XDG_RUNTIME_DIR a non-root daemon uses /tmp/datadist-<uid>; the same check
    applies to it (here: the parent of a directory we control)."""
    from datadistd.ops.config import default_socket_path, secure_socket_dir

    env = {k: v for k, v in os.environ.items() if k not in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR")}
    old = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        path = default_socket_path()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert path.endswith("datadistd.sock")
    ok = tmp_path / "private" / "d.sock"
    assert secure_socket_dir(str(ok)) == ok.parent and stat.S_IMODE(os.stat(ok.parent).st_mode) & 0o022 == 0


# ---- the attach socket's transfers (the local hot path) obey the same ownership --------------------

def test_attach_transfers_reach_only_the_callers_engines(daemon):
    victim, intruder = Worker(daemon), Worker(daemon)
    try:
        engine = victim.init(1)
        intruder.init(2)
        request = datadist_pb2.TransferRequest(engine_id=engine, kind=datadist_pb2.TRANSFER_BLOCKS, local_cache_id=1,
                                               remote_blocks=[0], local_blocks=[0])
        for op in (fastframe.PULL, fastframe.PUSH):
            frame = fastframe.TransferFrame(op, engine, fastframe.KIND_BLOCKS, fastframe.KEY_BLOCKS, (9, 0, 0, 0), 1,
                                            (0,), (0,))
            with pytest.raises(LLMException) as info:
                intruder.attach.transfer(frame, "pull_blocks", 10)
            assert info.value.status_code == LLMStatusCode.LLM_ENGINE_FINALIZED
            # the owner gets past the ownership check to the transfer's own validation
            with pytest.raises(LLMException) as info:
                victim.attach.transfer(frame, "pull_blocks", 10)
            assert info.value.status_code == LLMStatusCode.LLM_PARAM_INVALID, info.value
            assert "local cache 1 does not exist" in str(info.value)
        # a (protocol-2) transfer sent before hello is refused like any other message
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(10)
        s.connect(daemon.socket + ".attach")
        socket.send_fds(s, [protocol_2_transfer(1, False, request)], [])
        reply = attach_pb2.AttachReply()
        reply.ParseFromString(s.recv(1 << 16))
        assert reply.status == LLMStatusCode.LLM_PARAM_INVALID and "hello" in reply.message
        s.close()
    finally:
        victim.close()
        intruder.close()
