"""The attach connection's binary pull/push frames (protocol 4) against a real daemon: a pull and a push of 20,000
blocks (continuation frames) move the exact bytes, and what a worker can send wrong -- a truncated frame, a frame
naming another worker's engine, a block count past the datagram cap, a frame before hello, descriptors riding
along, continuation frames of no transfer, interleaved, overflowing, past the block cap or never finished, protocol
2's protobuf transfers -- gets LLM_PARAM_INVALID or the gRPC path's codes (with the request id) or, for a frame too
short to name one, the connection dropped; the daemon serves on."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile

import grpc
import numpy as np
import pytest

import llm_datadist as ld
from datadist import fastframe as ff
from datadist.status import LLMStatusCode
from datadist.v1 import attach_pb2, datadist_pb2
from datadistd.api.attach import MAX_TRANSFER_BLOCKS, AttachServer
from datadistd.api.orders import MAX_LIST
from datadistd.core.types import Role
from datadistd.node.node import Node
from datadistd.ops.config import Config
from llm_datadist._attach import AttachClient
from llm_datadist._cache_ops import CacheOps
from llm_datadist.status import LLMException
from tests.daemonproc import free_port

from .test_local import Worker, attach_ask, protocol_2_transfer

pytestmark = pytest.mark.integration


def raw_attach(daemon, hello: bool = True) -> socket.socket:  # noqa: ANN001
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(daemon.socket + ".attach")
    if hello:
        assert attach_ask(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
            protocol_version=4)).SerializeToString(), []).welcome.protocol_version == 4
    return s


def owning_attach(daemon) -> tuple[socket.socket, int, Worker]:  # noqa: ANN001
    """A raw attach connection and an engine of its session (made over gRPC with its capability)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(daemon.socket + ".attach")
    welcome = attach_ask(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
        protocol_version=4)).SerializeToString(), []).welcome
    grpc_side = Worker(daemon, capability=welcome.capability)
    return s, grpc_side.init(1), grpc_side


def ask(s: socket.socket, payload: bytes, fds: list[int] = ()) -> ff.FrameReply:  # noqa: B006
    socket.send_fds(s, [payload], list(fds))
    return ff.decode_reply(s.recv(1 << 16))


def frame(engine: int, remote: tuple[int, ...] = (0,), local: tuple[int, ...] = (0,),
          op: int = ff.PULL) -> ff.TransferFrame:
    return ff.TransferFrame(op, engine, ff.KIND_BLOCKS, ff.KEY_BLOCKS, (9, 0, 0, 0), 1, remote, local)


N = 20_000   # blocks of 64 bytes: 20,000 + 20,000 block numbers are five attach datagrams
PROMPT = f"""
N = {N}
import sys, numpy as np, llm_datadist as ld
cfg = ld.LLMConfig(); cfg.device_id = 0; cfg.enable_cache_manager = True; cfg.enable_remote_cache_accessible = True
cfg.listen_ip_info = f"127.0.0.1:{{sys.argv[1]}}"
dd = ld.LLMDataDist(ld.LLMRole.PROMPT, 1)
dd.init(cfg.generate_options())
kv = (np.arange(N) % 251 + 1).astype(np.uint8).repeat(64).reshape(N, 64)
kv[:, 1:] = np.arange(1, 64, dtype=np.uint8)     # every byte of a block counts
dd.cache_manager.register_blocks_cache(ld.CacheDesc(1, [N, 64], ld.DataType.DT_UINT8), [kv.ctypes.data],
                                       ld.BlocksCacheKey(1, 0))
print("ready", flush=True)
sys.stdin.readline()
dd.finalize()
"""


def test_pulls_and_pushes_of_20000_blocks_go_as_frames_and_move_the_exact_bytes(daemon, monkeypatch):
    """Two engines of one daemon (a same-daemon link): this process's decoder pulls and pushes on the attach
    connection, never the gRPC call -- three blocks in one frame, 20,000 in a first frame and continuation frames --
    and every byte lands where it was asked to."""
    sent: list[tuple[ff.TransferFrame, int]] = []
    real = AttachClient.transfer

    def spy(self, f, func, timeout):  # noqa: ANN001, ANN202
        assert self.protocol == 4
        sent.append((f, len(ff.encode_frames(1, f))))
        return real(self, f, func, timeout)

    real_call = CacheOps._call

    def no_grpc_transfer(self, method, *args):  # noqa: ANN001, ANN002, ANN202
        assert method not in ("Pull", "Push"), "a transfer went as a gRPC call"
        return real_call(self, method, *args)
    monkeypatch.setattr(AttachClient, "transfer", spy)
    monkeypatch.setattr(CacheOps, "_call", no_grpc_transfer)
    monkeypatch.setenv("DATADIST_DAEMON", daemon.target)
    monkeypatch.delenv("DATADIST_LOCAL_TRANSFERS", raising=False)
    port = free_port()
    prompt = subprocess.Popen([sys.executable, "-c", PROMPT, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "DATADIST_DAEMON": daemon.target})
    dd = None
    try:
        assert prompt.stdout is not None and prompt.stdout.readline().strip() == "ready"
        cfg = ld.LLMConfig()
        cfg.device_id = 0
        cfg.enable_cache_manager = True
        cfg.enable_remote_cache_accessible = True
        dd = ld.LLMDataDist(ld.LLMRole.DECODER, 2)
        dd.init(cfg.generate_options())
        kv = np.zeros((2 * N, 64), np.uint8)
        cache = dd.cache_manager.register_blocks_cache(ld.CacheDesc(1, [2 * N, 64], ld.DataType.DT_UINT8),
                                                       [kv.ctypes.data], ld.BlocksCacheKey(2, 0))
        info = ld.LLMClusterInfo()
        info.remote_cluster_id = 1
        info.append_local_ip_info("127.0.0.1", 0)
        info.append_remote_ip_info("127.0.0.1", port)
        code, _ = dd.link_clusters([info], 5000)
        assert int(code) == 0
        prompt_kv = (np.arange(N) % 251 + 1).astype(np.uint8).repeat(64).reshape(N, 64)
        prompt_kv[:, 1:] = np.arange(1, 64, dtype=np.uint8)
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(1, 0), cache, [5, 0, 7], [1, 6, 2])
        expected = np.zeros((2 * N, 64), np.uint8)
        expected[[1, 6, 2]] = prompt_kv[[5, 0, 7]]
        assert (kv == expected).all()
        assert [(f.op, f.remote_blocks, f.local_blocks, n) for f, n in sent] == [(ff.PULL, (5, 0, 7), (1, 6, 2), 1)]

        src = list(range(N - 1, -1, -1))                     # every prompt block, reversed, into [N, 2N)
        dst = list(range(N, 2 * N))
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(1, 0), cache, src, dst)
        expected[N:] = prompt_kv[::-1]
        assert (kv == expected).all()
        assert (sent[-1][0].op, len(sent[-1][0].remote_blocks), sent[-1][1]) == (ff.PULL, N, 5)

        kv[:N] = np.random.default_rng(7).integers(0, 256, (N, 64), np.uint8)     # pushed over the prompt's blocks
        order = np.random.default_rng(8).permutation(N)
        dd.cache_manager.push_blocks(ld.BlocksCacheKey(1, 0), cache, list(range(N)), [int(b) for b in order])
        assert (sent[-1][0].op, len(sent[-1][0].local_blocks), sent[-1][1]) == (ff.PUSH, N, 5)
        pushed = kv[:N].copy()
        dd.cache_manager.pull_blocks(ld.BlocksCacheKey(1, 0), cache, [int(b) for b in order], dst)
        assert (kv[N:] == pushed).all()       # prompt block order[i] holds what decoder block i held
        assert len(sent) == 4
    finally:
        if dd is not None:
            dd.finalize()
        prompt.communicate("\n", timeout=30)


def test_a_frame_before_hello_is_refused_with_its_request_id(daemon):
    s = raw_attach(daemon, hello=False)
    try:
        reply = ask(s, ff.encode_request(41, frame(1)))
        assert (reply.request_id, reply.status) == (41, LLMStatusCode.LLM_PARAM_INVALID) and "hello" in reply.message
    finally:
        s.close()


def test_a_frame_naming_another_workers_engine_gets_what_the_grpc_call_gets(daemon):
    """The one entry of both ways in: the same refusal, word for word."""
    victim, intruder = Worker(daemon), Worker(daemon)
    try:
        engine = victim.init(1)
        for op in (ff.PULL, ff.PUSH):
            with pytest.raises(LLMException) as info:
                intruder.attach.transfer(frame(engine, op=op), "pull_blocks", 10)
            assert info.value.status_code == LLMStatusCode.LLM_ENGINE_FINALIZED
            msg = datadist_pb2.TransferRequest(engine_id=engine, kind=datadist_pb2.TRANSFER_BLOCKS,
                                               local_cache_id=1, remote_blocks=[0], local_blocks=[0])
            with pytest.raises(grpc.RpcError) as rpc:
                intruder("Push" if op == ff.PUSH else "Pull", msg)
            assert dict(rpc.value.trailing_metadata())["datadist-status-code"] == str(
                int(LLMStatusCode.LLM_ENGINE_FINALIZED))
            assert rpc.value.details() in str(info.value)
    finally:
        victim.close()
        intruder.close()


def test_protocol_2_transfers_and_older_hellos_are_refused(daemon):
    """Attach protocol 2's protobuf pull and push are gone (attach.proto reserves their fields): such a message is
    an unknown one, and a hello announcing a protocol below 4 is refused; the connection serves on."""
    victim = Worker(daemon)
    try:
        engine = victim.init(1)
        msg = datadist_pb2.TransferRequest(engine_id=engine, kind=datadist_pb2.TRANSFER_BLOCKS, local_cache_id=1,
                                           remote_blocks=[0], local_blocks=[0])
        s = raw_attach(daemon)
        try:
            for push in (False, True):
                old = attach_ask(s, protocol_2_transfer(8, push, msg), [])
                assert (old.request_id, old.status) == (8, LLMStatusCode.LLM_PARAM_INVALID)
                assert "unknown attach message" in old.message and "binary frames" in old.message
            assert ask(s, ff.encode_request(9, frame(engine))).status == LLMStatusCode.LLM_ENGINE_FINALIZED
        finally:
            s.close()
        for announced in (1, 2, 3):
            s = raw_attach(daemon, hello=False)
            try:
                reply = attach_ask(s, attach_pb2.AttachRequest(request_id=3, hello=attach_pb2.AttachHello(
                    protocol_version=announced)).SerializeToString(), [])
                assert (reply.request_id, reply.status) == (3, LLMStatusCode.LLM_PARAM_INVALID)
                assert f"attach protocol {announced} is not served" in reply.message
                assert not reply.HasField("welcome")
            finally:
                s.close()
        assert victim.attach.protocol == 4 and daemon.proc.poll() is None
    finally:
        victim.close()


#: what a transfer of an engine of the caller's own that has no cache 1 is answered: it got past the owner's check
NO_CACHE = "local cache 1 does not exist"


def _first_and_rest(rid: int, engine: int, n: int = 9000, op: int = ff.PULL) -> list[bytes]:
    out = ff.encode_frames(rid, frame(engine, tuple(range(n)), tuple(range(n)), op))
    assert len(out) >= 3
    return out


def _nothing_waiting(s: socket.socket) -> bool:
    """No reply queued (every refusal is answered in the turn that reads its frame, so before a later reply)."""
    timeout = s.gettimeout()
    s.setblocking(False)
    try:
        s.recv(1 << 16)
    except BlockingIOError:
        return True
    finally:
        s.settimeout(timeout)
    return False


def test_continuation_frames_out_of_place_are_refused_and_the_connection_serves_on(daemon):
    """A continuation of no transfer, another request's continuation while one is assembled, a message between
    one transfer's frames, more numbers than announced: LLM_PARAM_INVALID with the request id, once per transfer
    (the rest of a refused transfer's frames are dropped unanswered); then a whole transfer still assembles. The
    engine is the connection's own (another's is refused at the first frame: ``test_attach_assembly.py``)."""
    s, engine, grpc_side = owning_attach(daemon)
    try:
        try:
            first, second, *rest = _first_and_rest(5, engine)
            # a continuation of no transfer
            reply = ask(s, second)
            assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_PARAM_INVALID)
            assert "no transfer being assembled" in reply.message
            # another request's continuation while 5 is assembled: both refused, 5's later frames dropped
            s.send(first)
            other = _first_and_rest(6, engine)[1]
            replies = {r.request_id: r for r in (ask(s, other), ff.decode_reply(s.recv(1 << 16)))}
            assert {k: r.status for k, r in replies.items()} == {5: LLMStatusCode.LLM_PARAM_INVALID,
                                                                 6: LLMStatusCode.LLM_PARAM_INVALID}
            for more in (second, *rest):
                s.send(more)
            # a whole frame between one transfer's frames: the transfer refused, the frame served
            s.send(_first_and_rest(7, engine)[0])
            replies = {r.request_id: r for r in (ask(s, ff.encode_request(8, frame(engine))),
                                                 ff.decode_reply(s.recv(1 << 16)))}
            assert replies[7].status == LLMStatusCode.LLM_PARAM_INVALID and "between" in replies[7].message
            assert replies[8].message == NO_CACHE           # served: past the owner, to the cache
            # more numbers than the first frame announced
            first9, *rest9 = _first_and_rest(9, engine)
            s.send(first9)
            for more in rest9[:-1]:
                s.send(more)
            overflow = rest9[-1] + (1).to_bytes(8, "little")
            reply = ask(s, overflow)
            assert (reply.request_id, reply.status) == (9, LLMStatusCode.LLM_PARAM_INVALID)
            assert "more than" in reply.message
            # a whole transfer in continuation frames still assembles: its one answer is the transfer's own
            *head, last = _first_and_rest(10, engine)
            for more in head:
                s.send(more)
            reply = ask(s, last)
            assert (reply.request_id, reply.message) == (10, NO_CACHE)
            assert _nothing_waiting(s)
        finally:
            s.close()
        assert daemon.proc.poll() is None
    finally:
        grpc_side.close()


def test_a_transfer_past_the_block_cap_is_refused_at_its_first_frame(daemon):
    """More than ``MAX_LIST`` remote or local blocks (what the gRPC Pull/Push accept): refused before a
    continuation is taken, answered once; the daemon never holds more than ``MAX_TRANSFER_BLOCKS`` numbers."""
    assert MAX_TRANSFER_BLOCKS == 2 * MAX_LIST
    victim = Worker(daemon)
    try:
        engine = victim.init(1)
        s = raw_attach(daemon)
        try:
            for nr, nl in ((MAX_LIST + 1, 1), (1, MAX_LIST + 1), (2**32 - 1, 2**32 - 1)):
                first = bytearray(_first_and_rest(11, engine)[0])
                first[136:144] = nr.to_bytes(4, "little") + nl.to_bytes(4, "little")
                reply = ask(s, bytes(first))
                assert (reply.request_id, reply.status) == (11, LLMStatusCode.LLM_PARAM_INVALID)
                assert f"at most {MAX_LIST}" in reply.message
                s.send(_first_and_rest(11, engine)[1])           # its continuation: dropped, not answered
            reply = ask(s, ff.encode_request(12, frame(engine)))
            assert reply.request_id == 12 and _nothing_waiting(s)
        finally:
            s.close()
    finally:
        victim.close()


def test_a_transfer_whose_frames_stop_is_refused_at_its_deadline_and_freed(tmp_path):
    """In process, with a short assembly deadline: a first frame and nothing more is answered LLM_PARAM_INVALID
    when the deadline passes, and the connection holds no partial transfer any more."""
    async def main() -> None:
        node = Node(Config())
        path = os.path.join(tempfile.mkdtemp(dir=tmp_path), "d.attach")
        server = AttachServer(node, path, assembly_deadline_s=0.05)
        await server.start()
        loop = asyncio.get_running_loop()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.setblocking(False)
        try:
            await loop.sock_connect(s, path)
            await loop.sock_sendall(s, attach_pb2.AttachRequest(hello=attach_pb2.AttachHello(
                protocol_version=4)).SerializeToString())
            assert attach_pb2.AttachReply.FromString(await loop.sock_recv(s, 1 << 16)).welcome.capability
            (conn,) = server._conns.values()
            engine = int((await node.init_engine(1, Role.DECODER, {}, conn.session)).engine.engine_id)
            first, second, _ = _first_and_rest(13, engine)
            await loop.sock_sendall(s, first)
            reply = ff.decode_reply(await asyncio.wait_for(loop.sock_recv(s, 1 << 16), 30))
            assert (reply.request_id, reply.status) == (13, LLMStatusCode.LLM_PARAM_INVALID)
            assert "did not all come within" in reply.message
            assert conn.partial is None and conn.deadline is None
            await loop.sock_sendall(s, second)          # the rest of the refused transfer: dropped
            await loop.sock_sendall(s, ff.encode_request(14, frame(engine)))
            reply = ff.decode_reply(await asyncio.wait_for(loop.sock_recv(s, 1 << 16), 30))
            assert (reply.request_id, reply.message) == (14, NO_CACHE)
        finally:
            s.close()
            await server.stop()
            await node.close()

    asyncio.run(main())


def test_malformed_frames_are_answered_or_dropped_and_the_daemon_serves_on(daemon):
    victim = Worker(daemon)
    try:
        engine = victim.init(1)
        s = raw_attach(daemon)
        try:
            good = ff.encode_request(5, frame(engine))
            for bad in (good[:-1], good[:20], good + b"\0" * 8):                   # truncated, padded
                reply = ask(s, bad)
                assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_PARAM_INVALID), reply
            claims = bytearray(good)                                             # a count past any datagram
            claims[136:140] = (2**32 - 1).to_bytes(4, "little")
            reply = ask(s, bytes(claims))
            assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_PARAM_INVALID)
            huge = ff.encode_request(6, frame(engine, tuple(range(9000)), tuple(range(9000))))
            assert len(huge) > ff.MAX_DATAGRAM
            reply = ask(s, huge)                                                 # cut by the kernel at the cap
            assert (reply.request_id, reply.status) == (6, LLMStatusCode.LLM_PARAM_INVALID)
            assert "at most" in reply.message
            r, w = os.pipe()
            try:
                reply = ask(s, good, [r])
                assert reply.status == LLMStatusCode.LLM_PARAM_INVALID and "no descriptors" in reply.message
            finally:
                os.close(r)
                os.close(w)
            reply = ask(s, good)          # the connection still serves: past decoding, to the ownership check
            assert (reply.request_id, reply.status) == (5, LLMStatusCode.LLM_ENGINE_FINALIZED)
            s.send(b"\xff" * 10)          # too short to name a request: dropped
            assert s.recv(1 << 16) == b""
        finally:
            s.close()
        assert victim.attach.protocol == 4 and daemon.proc.poll() is None
    finally:
        victim.close()

